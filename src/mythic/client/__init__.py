"""The Python client of a Mythic server: async, typed, reconnecting. Needs the `client` extra.

Imports only `mythic.contracts`, so a game can vendor it without the server.
"""

from mythic.client._client import (
    ClientError,
    ConnectionLostError,
    MythicClient,
    ToolHandler,
    ToolResult,
    Turn,
    TurnEvent,
    VoiceTurn,
)
from mythic.client._scene import Scene, SceneEvent, SceneReply, SceneTalk

__all__ = [
    "ClientError",
    "ConnectionLostError",
    "MythicClient",
    "Scene",
    "SceneEvent",
    "SceneReply",
    "SceneTalk",
    "ToolHandler",
    "ToolResult",
    "Turn",
    "TurnEvent",
    "VoiceTurn",
]
