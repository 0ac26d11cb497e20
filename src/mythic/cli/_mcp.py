"""`mythic mcp serve lore|game-state|storyteller|utilities`: Mythic as an MCP server, over
stdio (what an MCP client launches) or streamable HTTP (`--http PORT`)."""

from __future__ import annotations

import contextlib
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mythic._errors import MythicError
from mythic.cli._console import err, guard, load_config
from mythic.cli._options import ConfigOption

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from mythic.config import MythicSettings

mcp_app = typer.Typer(help="Mythic as MCP servers: lore, game-state, storyteller, utilities.")


class ServerName(StrEnum):
    """The MCP servers Mythic ships."""

    LORE = "lore"
    GAME_STATE = "game-state"
    STORYTELLER = "storyteller"
    UTILITIES = "utilities"


def _world_path(world: Path | None, settings: MythicSettings, *, needed: bool) -> Path | None:
    path = world or settings.world.path
    if path is None and needed:
        raise MythicError(
            "the lore server needs a world", fix="pass --world PATH (or set world.path)"
        )
    return path


def build(
    name: ServerName, settings: MythicSettings, *, world: Path | None, server_url: str | None
) -> MCPServer[Any]:
    """The MCP server `name`, ready to run.

    Raises:
        WorldLoadError: the world folder is broken.
        MissingExtraError: the mcp extra (or the rag extra, for lore) is missing.
    """
    from mythic._extras import require

    require("mcp.server.mcpserver", package="mcp", extra="mcp")
    from mythic.knowledge import load_world
    from mythic.mcp.servers import (
        game_state_server,
        lore_server,
        storyteller_server,
        utilities_server,
    )

    url = server_url or f"http://127.0.0.1:{settings.server.port}"
    if name is ServerName.LORE:
        path = _world_path(world, settings, needed=True)
        assert path is not None
        return lore_server(load_world(path), settings)
    if name is ServerName.UTILITIES:
        path = _world_path(world, settings, needed=False)
        return utilities_server(load_world(path) if path is not None else None)
    if name is ServerName.GAME_STATE:
        return game_state_server(url)
    return storyteller_server(url)


@mcp_app.command("serve")
def mcp_serve(
    name: Annotated[ServerName, typer.Argument(help="Which server.")],
    world: Annotated[
        Path | None,
        typer.Option("--world", "-w", help="World folder (lore; utilities: its calendar)."),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            "-s",
            help="A running Mythic server's HTTP address, for game-state and storyteller "
            "(default: http://127.0.0.1:<server.port>).",
        ),
    ] = None,
    http: Annotated[
        int | None,
        typer.Option(
            "--http", min=0, max=65535, help="Serve streamable HTTP on this port (at /mcp)."
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (--http).")] = (
        "127.0.0.1"
    ),
    config: ConfigOption = None,
) -> None:
    """Run one MCP server over stdio (the default: an MCP client launches this command) or
    streamable HTTP (`--http PORT`)."""
    settings = load_config(config)
    # Over stdio, standard output is the protocol: whatever loading prints goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        mcp_server = guard(lambda: build(name, settings, world=world, server_url=server))
    if http is None:
        mcp_server.run("stdio")
        return
    err.print(f"MCP server {name.value} on http://{host}:{http}/mcp")
    with contextlib.suppress(KeyboardInterrupt):
        mcp_server.run("streamable-http", host=host, port=http)
