"""`mythic world check`: validate a world folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mythic.cli._console import guard, out

world_app = typer.Typer(help="Check world folders.")


@world_app.command("check")
def world_check(path: Annotated[Path, typer.Argument(help="World folder.")]) -> None:
    """Validate a world folder: every card, every lore document."""
    from mythic.knowledge import load_world

    world = guard(lambda: load_world(path))
    out.print(
        f"{world.name}: {len(world.npcs)} NPCs, {len(world.card.zones)} zones, "
        f"{len(world.lore)} lore documents: OK"
    )
