"""`mythic distill`, declared apart from its work (`_distill.py`) so that starting `mythic` does
not import the dialogue stack."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mythic.cli._console import guard, load_config
from mythic.cli._options import ConfigOption, OutOption, StepsOption, WorldOption


def distill(
    world: WorldOption,
    teacher: Annotated[
        str,
        typer.Option(
            "--teacher", help="The teacher: a packaged model name or a GGUF path (the strongest)."
        ),
    ] = "qwen2.5-coder-1.5b-instruct",
    gate_world: Annotated[
        Path | None,
        typer.Option(
            "--gate-world",
            help="World the adapters are gated on (default: --world); another world shows "
            "that they generalise.",
        ),
    ] = None,
    archetype: Annotated[
        list[str] | None,
        typer.Option("--archetype", "-a", help="Only these archetypes (repeatable)."),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="At most N teacher lines per check and NPC."),
    ] = None,
    gate_limit: Annotated[
        int | None,
        typer.Option("--gate-limit", min=1, help="At most N gate probes per check and NPC."),
    ] = None,
    steps: StepsOption = 40,
    min_examples: Annotated[
        int,
        typer.Option(
            "--min-examples", min=2, help="Fewest kept replies an archetype is trained on."
        ),
    ] = 8,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            help="Register the adapters that pass in this YAML file or redis:// URL "
            "(default: none, the verdicts only).",
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--adapters", help="Adapters folder (default: beside the model cache)."),
    ] = None,
    out_file: OutOption = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Sampling and training seed.")] = 0,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=64, help="NPCs served at once.")
    ] = 2,
    config: ConfigOption = None,
) -> None:
    """Distil a teacher model into the dialogue model's archetype adapters: the teacher
    answers as each NPC through a real server, the scorecard's checks keep the good lines,
    a `dialogue_style` adapter per archetype is trained on them, gated on the scorecard
    against the model without it, and registered when it passes. Exit status 1 when none
    passes."""
    from mythic.cli._distill import run_distill

    settings = load_config(config)
    report = guard(
        lambda: run_distill(
            settings,
            world,
            teacher=teacher,
            gate_world=gate_world,
            archetypes=[a.strip() for item in archetype or [] for a in item.split(",")],
            limit=limit,
            gate_limit=gate_limit,
            steps=steps,
            min_examples=min_examples,
            registry=registry,
            out_dir=out_dir,
            out_file=out_file,
            seed=seed,
            parallel=parallel,
        )
    )
    if not any(v["passed"] for v in report["verdicts"]):
        raise typer.Exit(1)
