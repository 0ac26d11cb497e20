"""Servers needed for N concurrent NPCs, per activation tier or one rate for every NPC.

`scale()` turns update rates into inferences/s, prefill and decode tokens/s and resident KV,
then into servers. Throughputs from `roofline()` are upper-bound estimates from a device's
published bandwidth and tensor throughput; measure a real server (bench/) and pass its numbers
to `scale()` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mythic.capacity._memory import (
    ATTENTION_TARGETS,
    MemoryBudget,
    PlanError,
    _count,
    _rate,
    device_preset,
    memory_budget,
    model_preset,
)

# -- scaling ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActivationTier:
    """NPCs that update at one rate with one shape of request."""

    name: str
    share: float
    """Fraction of all NPCs in this tier; a mix's shares sum to 1."""
    update_hz: float
    """Decisions (actions) per second per NPC."""
    prompt_tokens: int = 0
    """New prompt tokens per inference (not already in a cached prefix)."""
    output_tokens: int = 0
    """Generated tokens per inference."""
    resident_tokens: int = 0
    """KV tokens kept resident per NPC between updates (0: rebuilt each time)."""


def uniform_tier(
    update_hz: float, *, prompt_tokens: int = 0, output_tokens: int = 0, resident_tokens: int = 0
) -> tuple[ActivationTier, ...]:
    """One tier holding every NPC: the same update rate for all (the design's model)."""
    return (ActivationTier("all", 1.0, update_hz, prompt_tokens, output_tokens, resident_tokens),)


ACTIVATION_TIERS: tuple[ActivationTier, ...] = (
    # Design 003's activation tiers for a 500-1,000 NPC region: gold 80-200, silver 200-400,
    # bronze 300-600 (midpoints 140/300/450, about 15/35/50 %). Gold and silver refresh their
    # intent at 1-2 Hz (the controller's intent cache), a grammar-constrained 1-8 token
    # decision after a game-state delta appended to a cached persona prefix; bronze barks now
    # and then (every 20 s) from a compact seed without resident KV.
    ActivationTier("gold", 0.15, 2.0, prompt_tokens=48, output_tokens=8, resident_tokens=2048),
    ActivationTier("silver", 0.35, 1.0, prompt_tokens=48, output_tokens=8, resident_tokens=1024),
    ActivationTier("bronze", 0.50, 0.05, prompt_tokens=256, output_tokens=16),
)
"""The tier mix the corrected examples use."""


@dataclass(frozen=True, slots=True)
class ServerThroughput:
    """What one server sustains: whole inferences/s, or prefill and decode tokens/s.

    Token rates win when both are given; `kv_capacity_bytes` (None: KV not counted, as in the
    design) bounds the NPCs whose KV stays resident.
    """

    inferences_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    kv_capacity_bytes: int | None = None
    kv_token_bytes: int = 0
    source: str = ""
    """Where the numbers come from: "design", "roofline ...", "measured ..."."""

    def __post_init__(self) -> None:
        tokens = (self.prefill_tokens_per_s, self.decode_tokens_per_s)
        if self.inferences_per_s is None and None in tokens:
            raise PlanError(
                "a server's throughput needs inferences_per_s, or both prefill_tokens_per_s "
                "and decode_tokens_per_s"
            )
        for name in ("inferences_per_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
            value = getattr(self, name)
            if value is not None:
                _rate(name, value)
        if self.kv_capacity_bytes is not None:
            _count("kv_capacity_bytes", self.kv_capacity_bytes, 1)
        _count("kv_token_bytes", self.kv_token_bytes)

    @property
    def by_tokens(self) -> bool:
        return self.prefill_tokens_per_s is not None and self.decode_tokens_per_s is not None


@dataclass(frozen=True, slots=True)
class TierLoad:
    """One tier's share of the load."""

    name: str
    npcs: int
    inferences_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    resident_kv_bytes: int


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """The load of N concurrent NPCs and the servers it needs."""

    npcs: int
    tasks_per_action: int
    tiers: tuple[TierLoad, ...]
    actions_per_s: float
    inferences_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    resident_kv_bytes: int
    servers_for_throughput: int
    servers_for_memory: int
    servers: int
    """The larger of the two, at least 1 when there are NPCs."""
    throughput: ServerThroughput


def _split(npcs: int, tiers: Sequence[ActivationTier]) -> list[int]:
    # Largest remainder: the tier counts add up to exactly `npcs`.
    raw = [npcs * t.share for t in tiers]
    counts = [math.floor(r) for r in raw]
    by_remainder = sorted(range(len(tiers)), key=lambda i: (counts[i] - raw[i], i))
    for i in by_remainder[: npcs - sum(counts)]:
        counts[i] += 1
    return counts


def _ceil(x: float) -> int:
    # 8750 / 50 must stay 175 despite float noise.
    return math.ceil(x - 1e-9)


def scale(
    npcs: int,
    tiers: Sequence[ActivationTier],
    *,
    server: ServerThroughput,
    tasks_per_action: int = 1,
) -> ScalePlan:
    """Inferences/s, tokens/s, resident KV and servers for `npcs` concurrent NPCs.

    Args:
        npcs: concurrent NPCs.
        tiers: the activation tiers (`ACTIVATION_TIERS`) or one rate for all (`uniform_tier()`).
        server: what one server sustains.
        tasks_per_action: inferences per action: the design runs all 7 task adapters for each
            action (7); one decision needs one (1).

    Raises:
        PlanError: negative counts or rates, shares not summing to 1, token throughput for
            tiers without token counts, a resident sequence bigger than a server's KV room.
    """
    _count("npcs", npcs)
    _count("tasks_per_action", tasks_per_action, 1)
    if not tiers:
        raise PlanError("at least one tier is needed")
    names = [t.name for t in tiers]
    if len(set(names)) != len(names):
        raise PlanError(f"tier names must be unique: {', '.join(names)}")
    for t in tiers:
        _rate(f"tier {t.name} share", t.share, allow_zero=True)
        _rate(f"tier {t.name} update_hz", t.update_hz, allow_zero=True)
        for field in ("prompt_tokens", "output_tokens", "resident_tokens"):
            _count(f"tier {t.name} {field}", getattr(t, field))
    total_share = sum(t.share for t in tiers)
    if abs(total_share - 1.0) > 1e-6:
        raise PlanError(f"tier shares must sum to 1, they sum to {total_share:g}")
    if server.by_tokens and not any(t.prompt_tokens + t.output_tokens for t in tiers):
        raise PlanError(
            "the server's throughput is in tokens but the tiers give no prompt or output "
            "tokens per inference; give tokens or an inferences_per_s throughput"
        )
    loads = []
    for t, count in zip(tiers, _split(npcs, tiers), strict=True):
        inferences = count * t.update_hz * tasks_per_action
        resident = count * t.resident_tokens * server.kv_token_bytes
        if (
            server.kv_capacity_bytes is not None
            and t.resident_tokens * server.kv_token_bytes > server.kv_capacity_bytes
        ):
            raise PlanError(
                f"tier {t.name}: one NPC's {t.resident_tokens} resident tokens do not fit a "
                "server's KV room"
            )
        loads.append(
            TierLoad(
                t.name,
                count,
                inferences,
                inferences * t.prompt_tokens,
                inferences * t.output_tokens,
                resident,
            )
        )
    inferences = sum(x.inferences_per_s for x in loads)
    prefill = sum(x.prefill_tokens_per_s for x in loads)
    decode = sum(x.decode_tokens_per_s for x in loads)
    resident = sum(x.resident_kv_bytes for x in loads)
    if server.prefill_tokens_per_s is not None and server.decode_tokens_per_s is not None:
        load = prefill / server.prefill_tokens_per_s + decode / server.decode_tokens_per_s
    else:
        assert server.inferences_per_s is not None  # checked in ServerThroughput.__post_init__
        load = inferences / server.inferences_per_s
    for_throughput = _ceil(load)
    for_memory = _ceil(resident / server.kv_capacity_bytes) if server.kv_capacity_bytes else 0
    return ScalePlan(
        npcs=npcs,
        tasks_per_action=tasks_per_action,
        tiers=tuple(loads),
        actions_per_s=inferences / tasks_per_action,
        inferences_per_s=inferences,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
        resident_kv_bytes=resident,
        servers_for_throughput=for_throughput,
        servers_for_memory=for_memory,
        servers=max(for_throughput, for_memory, 1 if npcs else 0),
        throughput=server,
    )


BANDWIDTH_EFFICIENCY = 0.7
"""Share of peak bandwidth a decode step achieves (llama.cpp and vLLM reach 0.6-0.8)."""
COMPUTE_EFFICIENCY = 0.6
"""Share of peak tensor throughput a prefill achieves with quantised weights."""


def roofline(budget: MemoryBudget, *, context: int, max_batch: int = 256) -> ServerThroughput:
    """Estimated prefill and decode tokens/s of one server, from its device's peaks.

    Decode reads every weight and each sequence's KV once per step, so a step of a batch of B
    sequences takes max(bytes read / bandwidth, B x flops per token / tensor throughput);
    prefill is compute-bound. B is what fits in the server's free memory at `context` tokens,
    up to `max_batch`. These are upper bounds: use measured numbers (bench/) when you have them.

    Raises:
        PlanError: not one sequence of `context` tokens fits next to the weights.
    """
    _count("context", context, 1)
    _count("max_batch", max_batch, 1)
    shape, dev = model_preset(budget.model), device_preset(budget.device)
    kv_room = budget.free_bytes + budget.kv_bytes
    per_sequence = context * budget.kv_token_bytes
    batch = min(max_batch, kv_room // per_sequence) if kv_room > 0 else 0
    if batch < 1:
        raise PlanError(
            f"no room for one {context}-token sequence on {budget.device} next to "
            f"{budget.model} at {budget.quant}"
        )
    q = shape.heads * shape.head_dim
    flops_per_token = 2 * shape.params + 4 * shape.layers * context * q
    flops = dev.tflops * 1e12 * COMPUTE_EFFICIENCY
    bandwidth = dev.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY
    step = max(
        (budget.weights_bytes + batch * per_sequence) / bandwidth,
        batch * flops_per_token / flops,
    )
    return ServerThroughput(
        prefill_tokens_per_s=flops / flops_per_token,
        decode_tokens_per_s=batch / step,
        kv_capacity_bytes=kv_room,
        kv_token_bytes=budget.kv_token_bytes,
        source=f"roofline estimate, {dev.name}, decode batch {batch} at {context} tokens",
    )


def mean_context(tiers: Sequence[ActivationTier]) -> int:
    """Context length of the average decoding sequence of a tier mix (weighted by tokens out)."""
    weights = [t.share * t.update_hz * max(t.output_tokens, 1) for t in tiers]
    if not sum(weights):
        return 1
    tokens = [t.resident_tokens + t.prompt_tokens + t.output_tokens for t in tiers]
    return max(1, round(sum(w * n for w, n in zip(weights, tokens, strict=True)) / sum(weights)))


def corrected_throughput(
    model: str = "llama-3.1-8b",
    quant: str = "q4_k_m",
    device: str = "a10g",
    *,
    archetypes: int = 5,
    adapters_per_archetype: int = 7,
    rank: int = 16,
    targets: Sequence[str] = ATTENTION_TARGETS,
    tiers: Sequence[ActivationTier] = ACTIVATION_TIERS,
    kv_dtype: str = "f16",
) -> ServerThroughput:
    """The roofline throughput of a server hosting every archetype's adapters."""
    _count("archetypes", archetypes)
    _count("adapters_per_archetype", adapters_per_archetype)
    budget = memory_budget(
        model,
        quant,
        device,
        adapters=archetypes * adapters_per_archetype,
        rank=rank,
        targets=targets,
        kv_dtype=kv_dtype,
    )
    return roofline(budget, context=mean_context(tiers))
