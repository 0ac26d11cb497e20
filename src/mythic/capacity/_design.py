"""Design documents 002 and 003's worked examples rerun with their own assumptions, next to
the numbers computed here, each difference with its reason (`mythic plan --design`).

A review of old documents, not part of the planner's API. In short, the design: puts a 70B
model at 4 bits in 21 GB (it is about 40 GB); gives a 7B at 4 bits 14 GB (about 5 GB; 14 GB is
its f16 size); sizes a rank-16 adapter on a 7B at 200 MB (27 MB in f16); adds 35 such adapters
up to 1.4 GB (its own figures make 7 GB); leaves no memory for the KV cache; runs all 7 task
adapters for every action; gives every NPC the same 0.125 Hz; has 500 NPCs per server where its
own rates allow 57; and states 1 and 5 servers for 100 and 1,000 NPCs where its own formula
gives 2 and 18. Its 175 A10G servers for 10,000 NPCs lands near the corrected count (185) only
because errors cancel: 7x too many inferences against too low a rate for the NPCs near the
player. The work is mostly prefill, so compute-rich GPUs need far fewer servers (16 H100s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mythic.capacity._memory import (
    DEVICES,
    GB,
    LORA_TARGETS,
    PlanError,
    _count,
    device_preset,
    kv_bytes_per_token,
    lora_bytes,
    memory_budget,
    model_preset,
    weight_bytes,
)
from mythic.capacity._scale import (
    ACTIVATION_TIERS,
    ActivationTier,
    ScalePlan,
    ServerThroughput,
    corrected_throughput,
    scale,
    uniform_tier,
)

# -- the design's worked examples ---------------------------------------------------------------

DESIGN_ACTION_HZ = 0.125
"""Design 002: "1 action per 8 seconds" for every NPC."""
DESIGN_TASKS_PER_ACTION = 7
"""Design 002: "models_per_action = 7" (one inference per task adapter)."""
DESIGN_SERVER_INFERENCES_PER_S = 50.0
"""Design 002: "g5.2xlarge with batching: ~50 inferences/sec" (batch 50, one batch a second)."""
DESIGN_STATED_SERVERS = {100: 1, 1000: 5, 10000: 175}
"""Design 002's cost section: g5.2xlarge servers for 100, 1,000 and 10,000 NPCs."""
DESIGN_BATCH = 50
DESIGN_MAX_NPCS_PER_SERVER = 500
"""Design 002's code: "max_concurrent_npcs: 500" per g5.2xlarge."""


@dataclass(frozen=True, slots=True)
class DesignCorrection:
    """One of the design's numbers next to the computed one, and why they differ."""

    claim: str
    design: str
    computed: str
    reason: str


@dataclass(frozen=True, slots=True)
class ScaleExample:
    """One of the design's scaling examples: what it states, its formula, the corrected plan."""

    npcs: int
    design_stated_servers: int
    design: ScalePlan
    corrected: ScalePlan
    reason: str


@dataclass(frozen=True, slots=True)
class DesignReview:
    """The design's worked examples rerun: its claims (memory, rates) and scaling examples."""

    model: str
    quant: str
    device: str
    claims: tuple[DesignCorrection, ...]
    scaling: tuple[ScaleExample, ...]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB"


def _gb(n: float) -> str:
    return f"{n / GB:,.1f} GB"


def _decisions_per_s(server: ServerThroughput) -> float:
    gold = ACTIVATION_TIERS[0]
    assert server.prefill_tokens_per_s is not None
    assert server.decode_tokens_per_s is not None
    return 1 / (
        gold.prompt_tokens / server.prefill_tokens_per_s
        + gold.output_tokens / server.decode_tokens_per_s
    )


def _npcs_per_server(
    server: ServerThroughput, tiers: Sequence[ActivationTier] = ACTIVATION_TIERS
) -> float:
    # The load of many NPCs, divided out: how many one server carries, time or KV permitting.
    n = 100_000
    plan = scale(n, tiers, server=server)
    assert server.prefill_tokens_per_s is not None
    assert server.decode_tokens_per_s is not None
    time = (
        plan.prefill_tokens_per_s / server.prefill_tokens_per_s
        + plan.decode_tokens_per_s / server.decode_tokens_per_s
    )
    kv = plan.resident_kv_bytes / server.kv_capacity_bytes if server.kv_capacity_bytes else 0
    return n / max(time, kv)


def design_throughput() -> ServerThroughput:
    """The design's server: 50 inferences/s, KV not counted."""
    return ServerThroughput(inferences_per_s=DESIGN_SERVER_INFERENCES_PER_S, source="design")


def design_examples(
    model: str = "llama-3.1-8b",
    quant: str = "q4_k_m",
    device: str = "a10g",
    npcs: Sequence[int] = (100, 1000, 10000),
) -> DesignReview:
    """Design 002/003's worked numbers with their own assumptions, next to computed ones.

    The corrected side serves `model` at `quant` on `device` (by default the 8B at q4_k_m on
    the design's A10G), one inference per action, design 003's activation tiers
    (`ACTIVATION_TIERS`), and counts the KV cache.
    """
    for n in npcs:
        _count("npcs", n)
    big, small = "llama-3.1-70b", "llama-3.1-8b"
    a10g = device_preset("a10g")
    big_q4 = {q: weight_bytes(big, q) for q in ("q4_0", "nf4", "q4_k_m")}
    small_q4 = weight_bytes(small, "q4_k_m")
    qwen7_q4 = weight_bytes("qwen2.5-7b", "q4_k_m")
    small_f16 = weight_bytes(small, "f16")
    ad_small = lora_bytes(small, 16)
    ad_small_f32 = lora_bytes(small, 16, dtype="f32")
    ad_small_all = lora_bytes(small, 16, LORA_TARGETS)
    ad_big = lora_bytes(big, 16)
    ad_big_f32 = lora_bytes(big, 16, dtype="f32")
    big_params, small_params = model_preset(big).params, model_preset(small).params
    kv_small = kv_bytes_per_token(small)
    kv_big = kv_bytes_per_token(big)
    big_total = memory_budget(big, "q4_0", "a10g", adapters=35)
    small_total = memory_budget(small, "q4_k_m", "a10g", adapters=35)
    design_sum_70b = 21 + 0.2 * 5 * 7 + 1.6
    corrected = corrected_throughput(model, quant, device)
    assert corrected.prefill_tokens_per_s is not None  # a roofline is in tokens
    assert corrected.decode_tokens_per_s is not None
    reference = corrected_throughput(small, "q4_k_m", "a10g")
    design_per_server = DESIGN_SERVER_INFERENCES_PER_S / (
        DESIGN_ACTION_HZ * DESIGN_TASKS_PER_ACTION
    )
    fixed_per_server = _npcs_per_server(corrected)
    by_device: dict[str, int] = {}
    for name in DEVICES:
        try:
            server = corrected_throughput(model, quant, name)
        except PlanError:
            continue  # the base does not fit this device
        by_device[name] = scale(10_000, ACTIVATION_TIERS, server=server).servers
    claims = (
        DesignCorrection(
            "70B base at 4 bits (002)",
            "21 GB",
            f"{_gb(big_q4['q4_0'])} q4_0, {_gb(big_q4['nf4'])} nf4, {_gb(big_q4['q4_k_m'])} q4_k_m",
            "70.6 B params x 4.5 bits / 8 (4-bit values plus block scales; nf4 keeps the "
            f"embeddings in f16); 21 GB would be {21 * GB * 8 / big_params:.1f} bits per "
            "weight. It does not fit a 24 GB A10G at all.",
        ),
        DesignCorrection(
            "7B base at 4 bits (003)",
            "~14 GB",
            f"{_gb(small_q4)} (llama-3.1-8b q4_k_m), {_gb(qwen7_q4)} (qwen2.5-7b)",
            f"14-16 GB is the f16 size ({_gb(small_f16)} for the 8B); 4-5 bits per weight is "
            "under a third of it.",
        ),
        DesignCorrection(
            "one rank-16 LoRA adapter, q/k/v/o (002, 003)",
            "~200 MB",
            f"{_mb(ad_small)} on the 8B in f16 ({_mb(ad_small_f32)} f32, "
            f"{_mb(ad_small_all)} on all 7 projections); {_mb(ad_big)} on the 70B "
            f"({_mb(ad_big_f32)} f32)",
            "rank x sum over targeted matrices of (in + out) x layers x bytes; k and v are "
            "narrow (8 KV heads), so an adapter is far smaller than 200 MB on a 7-8B.",
        ),
        DesignCorrection(
            "35 adapters: 5 archetypes x 7 tasks",
            "1.4 GB (002); 7 GB (003)",
            f"{_gb(35 * ad_small)} on the 8B, {_gb(35 * ad_big)} on the 70B (f16)",
            "002's 1.4 GB is one archetype's 7 x 200 MB; its own 0.2 x 5 x 7 in the code is "
            "7 GB, as 003 says.",
        ),
        DesignCorrection(
            "g5.2xlarge total (002): 70B + adapters + engine",
            "21 + 1.4 + 1.6 = 24 GB, fits",
            f"{_gb(big_total.used_bytes)} with overheads and headroom, of "
            f"{_gb(a10g.memory_bytes)}: does not fit",
            f"its own numbers add to {design_sum_70b:.1f} GB; a 70B needs two 24 GB GPUs "
            "for the weights alone, or an 80 GB one.",
        ),
        DesignCorrection(
            "KV cache (002, 003)",
            "not counted (1.6 GB engine overhead)",
            f"{kv_small // 1024} KiB/token on the 8B, {kv_big // 1024} KiB on the 70B; a batch "
            f"of {DESIGN_BATCH} at 4,096 tokens: {_gb(DESIGN_BATCH * 4096 * kv_small)} and "
            f"{_gb(DESIGN_BATCH * 4096 * kv_big)}",
            f"with the 8B and 35 adapters an A10G has {_gb(small_total.free_bytes)} left: "
            f"{small_total.max_sequences} sequences of 4,096 tokens, not {DESIGN_BATCH}.",
        ),
        DesignCorrection(
            "inferences per NPC action (002)",
            f"{DESIGN_TASKS_PER_ACTION} (one per task adapter)",
            "1",
            "an action is one decision by one task adapter (action_policy), or one pass with "
            "the archetype's adapters stacked on the sequence; running all 7 in turn is 7x "
            "the work and the 100-200 ms chain latency the design itself warns about.",
        ),
        DesignCorrection(
            "update rate (002)",
            f"{DESIGN_ACTION_HZ} Hz for every NPC",
            "gold 2 Hz, silver 1 Hz, bronze 0.05 Hz (15/35/50 %)",
            "003's activation tiers: NPCs near the player refresh their intent at 1-2 Hz, "
            "ambient ones only bark now and then.",
        ),
        DesignCorrection(
            f"server throughput, {device} (002)",
            f"{DESIGN_SERVER_INFERENCES_PER_S:g} inferences/s (batch 50, 1 batch/s)",
            f"{corrected.prefill_tokens_per_s:,.0f} prefill + "
            f"{corrected.decode_tokens_per_s:,.0f} decode tokens/s ({model} {quant}): "
            f"{_decisions_per_s(corrected):,.0f} gold decisions/s",
            f"the 8B at q4_k_m on an A10G makes {_decisions_per_s(reference):,.0f} gold "
            "decisions/s, so 50/s is the right order for it; the 70B the design names costs "
            f"{big_params / small_params:.1f}x the FLOPs per token (and does not fit). A "
            "decision's cost is its new prompt tokens (prefill, compute-bound) plus a few "
            "decoded ones (bandwidth-bound). Roofline estimates: measure them.",
        ),
        DesignCorrection(
            "NPCs per g5.2xlarge (002 code)",
            f"{DESIGN_MAX_NPCS_PER_SERVER} concurrent at {DESIGN_SERVER_INFERENCES_PER_S:g} "
            "inferences/s",
            f"{design_per_server:.0f} by its own rates; {fixed_per_server:.0f} with tiers "
            f"({model} {quant} on {device})",
            f"{DESIGN_MAX_NPCS_PER_SERVER} NPCs x {DESIGN_ACTION_HZ} Hz x "
            f"{DESIGN_TASKS_PER_ACTION} = "
            f"{DESIGN_MAX_NPCS_PER_SERVER * DESIGN_ACTION_HZ * DESIGN_TASKS_PER_ACTION:g} "
            f"inferences/s, {DESIGN_MAX_NPCS_PER_SERVER * DESIGN_ACTION_HZ * 7 / 50:.1f}x what "
            "the same server is said to serve.",
        ),
        DesignCorrection(
            "servers for 10,000 NPCs by device",
            "175 g5.2xlarge (the only device considered)",
            ", ".join(f"{name} {count}" for name, count in by_device.items()),
            f"with {model} {quant}, one inference per action and tiers; a decision is mostly "
            "prefill, which is compute-bound, so GPUs with more tensor throughput need far "
            "fewer servers.",
        ),
    )
    examples = []
    for n in npcs:
        design = scale(
            n,
            uniform_tier(DESIGN_ACTION_HZ),
            server=design_throughput(),
            tasks_per_action=DESIGN_TASKS_PER_ACTION,
        )
        fixed = scale(n, ACTIVATION_TIERS, server=corrected)
        stated = DESIGN_STATED_SERVERS.get(n)
        if stated is None:
            said = f"the design gives no figure for {n:,} NPCs"
            stated = design.servers
        elif stated == design.servers:
            said = f"the design's {stated} matches its formula"
        else:
            said = (
                f"the design states {stated} but its own formula gives "
                f"{design.inferences_per_s:,.1f} / {DESIGN_SERVER_INFERENCES_PER_S:g} = "
                f"{design.servers}"
            )
        prefill_time = fixed.prefill_tokens_per_s / corrected.prefill_tokens_per_s
        decode_time = fixed.decode_tokens_per_s / corrected.decode_tokens_per_s
        prefill_share = prefill_time / (prefill_time + decode_time or 1)
        bound = (
            "resident KV"
            if fixed.servers_for_memory > fixed.servers_for_throughput
            else f"server time, {prefill_share:.0%} of it prefill"
        )
        examples.append(
            ScaleExample(
                npcs=n,
                design_stated_servers=stated,
                design=design,
                corrected=fixed,
                reason=(
                    f"{said}. Corrected: {fixed.inferences_per_s:,.0f} inferences/s "
                    f"(1 per action, tiered) instead of {design.inferences_per_s:,.0f}; "
                    f"{fixed.servers} servers, bound by {bound} "
                    f"({fixed.servers_for_throughput} for throughput, "
                    f"{fixed.servers_for_memory} for {_gb(fixed.resident_kv_bytes)} of KV)."
                ),
            )
        )
    return DesignReview(model, quant.lower(), device, claims, tuple(examples))
