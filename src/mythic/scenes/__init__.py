"""Scenes: group conversations of several NPCs and players in earshot, a speaker selector,
NPCs answering each other, NPCs talking among themselves (ambient lines, below every
player's), and histories that keep only what each NPC heard.

`Scenes` sits on a `Cast`: the server routes the `Scene*` messages to it; each reply is an
ordinary turn of its NPC, streamed as `LLMStreamDelta`s.
"""

from mythic.scenes._address import address_forms, addressed
from mythic.scenes._errors import (
    AlreadyInSceneError,
    NotInSceneError,
    SceneEndedError,
    SceneError,
    SceneExistsError,
    SceneFullError,
    SceneLimitError,
    TooFewNPCsError,
    UnknownSceneError,
    UnknownSceneNPCError,
)
from mythic.scenes._scene import Scene, SceneRecord
from mythic.scenes._scenes import PLAYER, Scenes

__all__ = [
    "PLAYER",
    "AlreadyInSceneError",
    "NotInSceneError",
    "Scene",
    "SceneEndedError",
    "SceneError",
    "SceneExistsError",
    "SceneFullError",
    "SceneLimitError",
    "SceneRecord",
    "Scenes",
    "TooFewNPCsError",
    "UnknownSceneError",
    "UnknownSceneNPCError",
    "address_forms",
    "addressed",
]
