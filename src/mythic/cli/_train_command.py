"""`mythic train adapter`: the command; its work is in `_train.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mythic.cli._console import guard, load_config
from mythic.cli._options import (
    BaseModelOption,
    BatchOption,
    ConfigOption,
    LearningRateOption,
    RankOption,
    StepsOption,
)

train_app = typer.Typer(help="Archetype adapters: curate, train (LoRA on CPU), export to GGUF.")

TaskOption = Annotated[
    str, typer.Option("--task", "-t", help="Adapter task: dialogue_style or action_policy.")
]


@train_app.command("adapter")
def train_adapter(
    archetype: Annotated[str, typer.Argument(help="Archetype, e.g. vampire or zombie.")],
    world: Annotated[Path, typer.Option("--world", "-w", help="World folder.")] = Path(
        "examples/worlds/ravenmoor"
    ),
    task: TaskOption = "dialogue_style",
    model: BaseModelOption = None,
    steps: StepsOption = 40,
    rank: RankOption = 16,
    batch_size: BatchOption = 4,
    learning_rate: LearningRateOption = 2e-3,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=16, max=8192, help="Longest example in tokens.")
    ] = 768,
    extra: Annotated[
        Path | None,
        typer.Option("--extra", help="More dialogue examples: JSON lines {npc, question, reply}."),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Adapters folder (default: beside the model cache)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Data and training seed.")] = 0,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="CPU threads (default: all but one).")
    ] = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            "-r",
            help="Register the adapter here: a YAML file or redis:// URL "
            "(default: <world>/archetypes.yaml).",
        ),
    ] = None,
    register: Annotated[
        bool, typer.Option("--register/--no-register", help="Record it in the registry.")
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Curate data from the world, train a LoRA adapter on CPU (loss bar), score it on
    held-out examples against the base, and write it as PEFT and GGUF with a manifest."""
    from mythic.cli._train import run_train
    from mythic.training import TrainSettings

    settings = load_config(config)
    train_settings = TrainSettings(
        rank=rank,
        alpha=2.0 * rank,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_tokens=max_tokens,
        seed=seed,
        threads=threads,
    )
    where = (registry or str(world / "archetypes.yaml")) if register else None
    guard(
        lambda: run_train(
            settings, world, archetype, task, model, train_settings, extra, out_dir, where
        )
    )
