"""Mythic as MCP servers, for any MCP client (a designer's assistant, an editor tool):

- `lore`: search a world's lore, read its persona cards and what an NPC remembers of a
  player; read-only.
- `game-state`: read-only snapshots of a running Mythic server's world, NPCs and scenes;
  `propose_event` queues an event for the game to arbitrate and applies nothing.
- `storyteller`: submit and read a running server's bronze jobs.
- `utilities`: the wall clock and the world's game calendar, fresh ids, the content filter.

Every tool has a typed input schema; a bad argument, an unknown NPC or a server that cannot be
reached is an `isError` result (`ToolRefusedError`), never the end of the MCP server. Results are
capped at `MAX_RESULT_CHARS` of JSON. `mythic mcp serve NAME` runs one over stdio or
streamable HTTP. Needs the `mcp` extra (`pip install 'mythic[mcp]'`).
"""

from mythic.mcp.servers._common import (
    MAX_RESULT_CHARS,
    MythicAPI,
    ServerUnreachableError,
    ToolRefusedError,
    capped,
)
from mythic.mcp.servers._game_state import game_state_server
from mythic.mcp.servers._lore import lore_server
from mythic.mcp.servers._storyteller import storyteller_server
from mythic.mcp.servers._utilities import ulid, utilities_server

SERVER_NAMES = ("lore", "game-state", "storyteller", "utilities")
"""The servers `mythic mcp serve` runs."""

__all__ = [
    "MAX_RESULT_CHARS",
    "SERVER_NAMES",
    "MythicAPI",
    "ServerUnreachableError",
    "ToolRefusedError",
    "capped",
    "game_state_server",
    "lore_server",
    "storyteller_server",
    "ulid",
    "utilities_server",
]
