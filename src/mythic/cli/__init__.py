"""The `mythic` command line: each command group lives in its own module; this one assembles
them, in the order `mythic --help` lists them."""

from __future__ import annotations

import typer

from mythic.cli._archetypes import archetypes_app
from mythic.cli._chat import chat
from mythic.cli._config import config_app
from mythic.cli._distill_command import distill
from mythic.cli._eval_command import eval_app
from mythic.cli._jobs import jobs_app
from mythic.cli._mcp import mcp_app
from mythic.cli._memory import db_app, memory_app
from mythic.cli._models import models_app
from mythic.cli._plan import plan_command
from mythic.cli._schema import schema_app
from mythic.cli._serve import serve, usage
from mythic.cli._sim_command import sim
from mythic.cli._train_command import train_app
from mythic.cli._voice import voice_app
from mythic.cli._world import world_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="mythic",
    help="Mythic: AI-driven game NPCs that talk, remember and act in real time.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(models_app, name="models")
app.add_typer(config_app, name="config")
app.add_typer(world_app, name="world")
app.add_typer(schema_app, name="schema")
app.add_typer(db_app, name="db")
app.add_typer(memory_app, name="memory")
app.add_typer(eval_app, name="eval")
app.add_typer(jobs_app, name="jobs")
app.add_typer(voice_app, name="voice")
app.add_typer(train_app, name="train")
app.add_typer(archetypes_app, name="archetypes")
app.add_typer(mcp_app, name="mcp")
app.command("plan")(plan_command)
app.command()(distill)
app.command()(usage)
app.command()(serve)
app.command()(chat)
app.command()(sim)


def main() -> None:
    """Entry point of the `mythic` console script."""
    app()
