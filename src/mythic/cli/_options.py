"""Options that several commands take, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="YAML settings file (default: MYTHIC_CONFIG, ./mythic.yaml)."
    ),
]

WorldOption = Annotated[Path, typer.Option("--world", "-w", help="World folder.")]

OutOption = Annotated[Path | None, typer.Option("--out", help="Write the results as JSON.")]

VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show every reply, not only failures.")
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]

BaseModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Base model: a packaged name or a GGUF path (default: the model the task serves on).",
    ),
]

StepsOption = Annotated[
    int, typer.Option("--steps", min=1, max=100_000, help="Optimiser steps (per task).")
]

RankOption = Annotated[int, typer.Option("--rank", min=1, max=64, help="LoRA rank.")]

BatchOption = Annotated[int, typer.Option("--batch", min=1, max=512, help="Examples per step.")]

LearningRateOption = Annotated[
    float, typer.Option("--lr", min=1e-7, max=1.0, help="Peak learning rate.")
]
