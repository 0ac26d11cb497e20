"""`mythic db migrate` and `mythic memory show|forget|compact`: what NPCs remember of players."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from mythic.cli._console import call_server, guard, load_config, out
from mythic.cli._options import ConfigOption

db_app = typer.Typer(help="The memory archive's database: migrations.")

memory_app = typer.Typer(help="What NPCs remember of players: show, forget, compact.")

PlayerOption = Annotated[str, typer.Option("--player", help="The player's id.")]

ServerUrlOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="A running server's base URL (http://host:port): goes through it, so its "
        "in-process hot tier is included. Default: the configured stores directly.",
    ),
]


def _with_memory(config: Path | None, work: Callable[[Any], Any]) -> Any:
    """Run `work(memory)` on the configured stores (warm and cold; hot is empty here)."""
    import asyncio

    from mythic.memory import Memory

    settings = load_config(config)

    async def run() -> Any:
        memory = Memory(settings.memory)
        try:
            return await work(memory)
        finally:
            await memory.aclose()

    return guard(lambda: asyncio.run(run()))


@db_app.command("migrate")
def db_migrate(config: ConfigOption = None) -> None:
    """Create or upgrade the memory archive's tables (memory.cold_url: PostgreSQL or SQLite)."""

    async def work(memory: Any) -> None:
        applied = await memory.cold.migrate()
        where = memory.settings.cold_url or f"sqlite {memory.cold.path}"
        if applied:
            for migration in applied:
                out.print(f"applied {migration.version:04d}_{migration.name}")
        out.print(f"{where}: schema is up to date")

    _with_memory(config, work)


@memory_app.command("show")
def memory_show(
    player: PlayerOption,
    server: ServerUrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigOption = None,
) -> None:
    """Everything stored about a player, tier by tier."""
    if server:
        data = call_server("GET", f"{server.rstrip('/')}/v1/memory/{player}")
    else:

        async def work(memory: Any) -> Any:
            await memory.cold.migrate() if memory.settings.auto_migrate else None
            return await memory.show(player)

        data = _with_memory(config, work)
    if as_json:
        out.print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    out.print(f"player {player}")
    for tier in ("hot", "warm"):
        npcs = data.get(tier, {})
        out.print(f"  {tier}: {len(npcs)} NPCs")
        for npc, held in sorted(npcs.items()):
            out.print(
                f"    {npc}: {len(held['turns'])} turns, {len(held['summaries'])} summaries, "
                f"{len(held['facts'])} facts"
            )
            for summary in held["summaries"][-2:]:
                out.print(f"      summary: {summary['text']}")
            for fact in held["facts"][:5]:
                out.print(f"      fact ({fact['importance']}): {fact['text']}")
    out.print(f"  cold: {data['cold']['events']} events archived")


@memory_app.command("forget")
def memory_forget(
    player: PlayerOption,
    server: ServerUrlOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    config: ConfigOption = None,
) -> None:
    """Delete everything about a player in every tier (cannot be undone)."""
    if not yes and not typer.confirm(f"Delete everything remembered about {player}?"):
        raise typer.Exit(1)
    if server:
        deleted = call_server("DELETE", f"{server.rstrip('/')}/v1/memory/{player}")["deleted"]
    else:

        async def work(memory: Any) -> Any:
            await memory.cold.migrate() if memory.settings.auto_migrate else None
            return await memory.forget(player)

        deleted = _with_memory(config, work)
    out.print(
        f"forgot {player}: {deleted['hot']} hot entries, {deleted['warm']} warm NPC entries, "
        f"{deleted['cold']} archived events"
    )


@memory_app.command("compact")
def memory_compact(
    older_than_days: Annotated[
        float, typer.Option("--older-than-days", min=0, help="Only snapshots older than this.")
    ] = 30.0,
    config: ConfigOption = None,
) -> None:
    """Drop superseded card, fact and emotion snapshots from the archive (turns, events and
    summaries are kept forever)."""

    async def work(memory: Any) -> int:
        return int(await memory.compact(older_than_days=older_than_days))

    out.print(f"compacted: {_with_memory(config, work)} superseded snapshots removed")
