"""`mythic plan`: memory per server, archetype chain placement and server counts for N NPCs.

The help texts name the presets by hand so that `mythic --help` imports nothing of
`mythic.capacity`; tests/unit/test_plan.py checks they list every preset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from mythic._errors import MythicError
from mythic.cli._console import guard, out

if TYPE_CHECKING:
    from mythic.capacity import MemoryBudget, Placement, ScalePlan
    from mythic.capacity._design import DesignReview

MODEL_HELP = (
    "Base model: smollm2-135m, qwen2.5-0.5b, qwen2.5-3b, qwen2.5-7b, llama-3.1-8b, llama-3.1-70b."
)
QUANT_HELP = "Weight quantisation: f16, bf16, q8_0, q6_k, q5_k_m, q4_k_m, q4_1, q4_0, nf4."
DEVICE_HELP = "Server type: a10g, l4, a100-40, a100-80, h100, h200, cpu (32 GiB RAM) or cpu-<GiB>."
KV_HELP = "KV cache element format: f32, f16, bf16, fp8, q8_0, q4_0."
TARGETS_HELP = "Projections each adapter adapts: q_proj, k_proj, v_proj, o_proj, gate_proj, "
TARGETS_HELP += "up_proj, down_proj (comma list)."
ARCHETYPES = "vampire,werewolf,zombie,ghoul,lich"
DEFAULT_NPCS = (100, 1000, 10000)


@dataclass(frozen=True, slots=True)
class _Plan:
    memory: MemoryBudget
    placement: Placement
    scaling: tuple[ScalePlan, ...]


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _split(value: str, option: str) -> list[str]:
    items = [part.strip() for part in value.split(",") if part.strip()]
    if not items:
        raise MythicError(f"{option} needs at least one name")
    return items


def _npcs(values: list[str] | None) -> list[int]:
    if not values:
        return list(DEFAULT_NPCS)
    counts = []
    for value in values:
        for part in _split(value, "--npcs"):
            text = part.lower().replace("_", "")
            factor = 1000 if text.endswith("k") else 1
            try:
                count = int(text.removesuffix("k")) * factor
            except ValueError:
                raise MythicError(
                    f"--npcs takes whole numbers (100, 1000, 10k), got {part!r}"
                ) from None
            if count < 0:
                raise MythicError(f"--npcs must not be negative, got {part!r}")
            counts.append(count)
    return counts


def _build(
    model: str,
    quant: str,
    device: str,
    archetypes: list[str],
    adapters_per_archetype: int,
    rank: int,
    targets: list[str],
    context: int,
    active_sequences: int,
    kv_dtype: str,
    npcs: list[int],
) -> _Plan:
    from mythic.capacity import (
        ACTIVATION_TIERS,
        ChainFootprint,
        PlanError,
        corrected_throughput,
        lora_bytes,
        memory_budget,
        pack_chains,
        scale,
    )

    if adapters_per_archetype < 0 or active_sequences < 0:
        raise PlanError("--adapters-per-archetype and --active-sequences must not be negative")
    common: dict[str, Any] = {"rank": rank, "targets": targets, "kv_dtype": kv_dtype}
    budget = memory_budget(
        model,
        quant,
        device,
        adapters=len(archetypes) * adapters_per_archetype,
        sequences=len(archetypes) * active_sequences,
        context=context,
        **common,
    )
    per_chain = adapters_per_archetype * lora_bytes(model, rank, targets)
    chains = [ChainFootprint(name, per_chain, active_sequences) for name in archetypes]
    base = memory_budget(model, quant, device, context=context, **common)
    placement = pack_chains(chains, base)
    server = corrected_throughput(
        model,
        quant,
        device,
        archetypes=len(archetypes),
        adapters_per_archetype=adapters_per_archetype,
        **common,
    )
    scaling = tuple(scale(n, ACTIVATION_TIERS, server=server) for n in npcs)
    return _Plan(budget, placement, scaling)


def _print_plan(plan: _Plan, archetypes: list[str], per_archetype: int, targets: list[str]) -> None:
    from mythic.capacity import ACTIVATION_TIERS, device_preset

    b = plan.memory
    dev = device_preset(b.device)
    out.print(
        f"{b.model} at {b.quant} on {dev.label}: {len(archetypes)} archetypes x {per_archetype} "
        f"adapters (LoRA on {', '.join(targets)}, {b.adapter_bytes / 1e6:,.1f} MB each), "
        f"{b.sequences // max(len(archetypes), 1)} active sequences per archetype at "
        f"{b.context:,} tokens"
    )
    memory = Table(
        title="Memory of one server hosting every chain", title_justify="left", box=box.SIMPLE_HEAD
    )
    memory.add_column("part")
    memory.add_column("size", justify="right")
    memory.add_column("how")
    memory.add_row("base weights", _gb(b.weights_bytes), b.quant)
    memory.add_row(
        "adapters", _gb(b.adapters_bytes), f"{b.adapters} x {b.adapter_bytes / 1e6:,.1f} MB"
    )
    memory.add_row(
        "KV cache",
        _gb(b.kv_bytes),
        f"{b.sequences} x {b.context:,} tokens x {b.kv_token_bytes / 1024:g} KiB",
    )
    memory.add_row("compute buffers", _gb(b.compute_bytes), "one 512-token batch")
    memory.add_row(
        "runtime", _gb(b.runtime_bytes), "process" if b.device.startswith("cpu") else "CUDA context"
    )
    memory.add_row("headroom", _gb(b.reserved_bytes), f"{dev.reserved_fraction:.0%} kept free")
    memory.add_row("total", _gb(b.used_bytes), f"of {_gb(b.capacity_bytes)}")
    verdict = "fits" if b.fits else "does not fit on one server (see placement)"
    memory.add_row(
        "free", _gb(b.free_bytes), f"{verdict}; room for {b.max_sequences} sequences in all"
    )
    out.print(memory)

    p = plan.placement
    placed = Table(
        title=f"Placement: first-fit decreasing, {_gb(p.capacity_bytes)} per server for chains",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    placed.add_column("server", justify="right")
    placed.add_column("archetypes")
    placed.add_column("chains use", justify="right")
    placed.add_column("free", justify="right")
    for load in p.servers:
        placed.add_row(
            str(load.index), ", ".join(load.archetypes), _gb(load.used_bytes), _gb(load.free_bytes)
        )
    out.print(placed)

    rows = [
        (
            f"{s.npcs:,}",
            "/".join(str(t.npcs) for t in s.tiers),
            f"{s.inferences_per_s:,.0f}",
            f"{s.prefill_tokens_per_s:,.0f}",
            f"{s.decode_tokens_per_s:,.0f}",
            f"{s.resident_kv_bytes / 1e9:,.1f} GB",
            f"{s.servers:,} ({s.servers_for_throughput:,}/{s.servers_for_memory:,})",
        )
        for s in plan.scaling
    ]
    headers = (
        "NPCs",
        "gold/silver\n/bronze",
        "inf/s",
        "prefill\ntok/s",
        "decode\ntok/s",
        "resident\nKV",
        "servers\n(time/KV)",
    )
    scaled = Table(
        title="Scaling: one inference (inf) per action, tiered NPCs",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for header in headers:
        scaled.add_column(header, justify="right", overflow="fold")
    for row in rows:
        scaled.add_row(*row)
    out.print(scaled)
    tiers = "; ".join(
        f"{t.name} {t.share:.0%} at {t.update_hz:g} Hz, {t.prompt_tokens}+{t.output_tokens} "
        f"tokens, {t.resident_tokens} resident"
        for t in ACTIVATION_TIERS
    )
    out.print(f"tiers: {tiers}")
    if plan.scaling:
        server = plan.scaling[0].throughput
        out.print(
            f"per server: {server.prefill_tokens_per_s or 0:,.0f} prefill + "
            f"{server.decode_tokens_per_s or 0:,.0f} decode tokens/s ({server.source}; "
            "an upper bound, measure with bench/)"
        )


def _print_design(review: DesignReview) -> None:
    out.print("Design 002/003: the worked numbers against the computed ones")
    for c in review.claims:
        out.print(f"\n{c.claim}")
        out.print(f"  design:   {c.design}")
        out.print(f"  computed: {c.computed}")
        out.print(f"  why:      {c.reason}")
    table = Table(
        title=(
            f"\nScaling: design (0.125 Hz x 7 inferences, 50/s per server) vs corrected "
            f"({review.model} {review.quant} on {review.device})"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for header in ("NPCs", "design says", "formula: inf/s", "servers"):
        table.add_column(header, justify="right")
    for header in ("corrected: inf/s", "servers"):
        table.add_column(header, justify="right")
    for ex in review.scaling:
        table.add_row(
            f"{ex.npcs:,}",
            str(ex.design_stated_servers),
            f"{ex.design.inferences_per_s:,.1f}",
            str(ex.design.servers),
            f"{ex.corrected.inferences_per_s:,.1f}",
            str(ex.corrected.servers),
        )
    out.print(table)
    for ex in review.scaling:
        out.print(f"{ex.npcs:,} NPCs: {ex.reason}")


def plan_command(
    model: Annotated[str, typer.Option("--model", help=MODEL_HELP)] = "llama-3.1-8b",
    quant: Annotated[str, typer.Option("--quant", help=QUANT_HELP)] = "q4_k_m",
    device: Annotated[str, typer.Option("--device", help=DEVICE_HELP)] = "a10g",
    adapters_per_archetype: Annotated[
        int,
        typer.Option("--adapters-per-archetype", help="LoRA adapters per archetype (tasks)."),
    ] = 7,
    rank: Annotated[int, typer.Option("--rank", help="LoRA rank of each adapter.")] = 16,
    targets: Annotated[
        str, typer.Option("--targets", help=TARGETS_HELP)
    ] = "q_proj,k_proj,v_proj,o_proj",
    archetypes: Annotated[
        str, typer.Option("--archetypes", help="Archetype chains to place (comma list).")
    ] = ARCHETYPES,
    npcs: Annotated[
        list[str] | None,
        typer.Option(
            "--npcs",
            help="Concurrent NPCs to size for; repeat or comma list (default: 100,1000,10k).",
        ),
    ] = None,
    context: Annotated[
        int, typer.Option("--context", help="KV tokens per active sequence (memory, placement).")
    ] = 4096,
    active_sequences: Annotated[
        int,
        typer.Option(
            "--active-sequences", help="Sequences per archetype with resident KV (placement)."
        ),
    ] = 8,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help=KV_HELP)] = "f16",
    design: Annotated[
        bool,
        typer.Option(
            "--design",
            help="The design's worked examples against corrected ones (with --model, --quant, "
            "--device and --npcs; the design's 5 archetypes x 7 rank-16 adapters).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Size servers for archetype chains: memory, placement, and servers for N NPCs."""
    from mythic.capacity._design import design_examples

    names = guard(lambda: _split(archetypes, "--archetypes"))
    modules = guard(lambda: _split(targets, "--targets"))
    counts = guard(lambda: _npcs(npcs))
    if design:
        review = guard(lambda: design_examples(model, quant, device, counts))
        if as_json:
            out.print(json.dumps(asdict(review), indent=2))
        else:
            _print_design(review)
        return
    plan = guard(
        lambda: _build(
            model,
            quant,
            device,
            names,
            adapters_per_archetype,
            rank,
            modules,
            context,
            active_sequences,
            kv_dtype,
            counts,
        )
    )
    if as_json:
        out.print(json.dumps(asdict(plan), indent=2))
        return
    _print_plan(plan, names, adapters_per_archetype, modules)
