"""What a scene refuses: each error carries the wire `Error` code the server sends."""

from __future__ import annotations

from typing import ClassVar

from mythic._errors import MythicError


class SceneError(MythicError):
    """A scene message the server refuses; `code` is the wire `Error` code. The scene and its
    members are unharmed."""

    code: ClassVar[str] = "scene_refused"

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.field = field
        """The message's field the error is about (`npc_id`, `to`), for the wire error's ref."""


class UnknownSceneError(SceneError):
    """No open scene has this id."""

    code = "unknown_scene"


class SceneEndedError(SceneError):
    """The scene has ended: nothing joins it or speaks in it again."""

    code = "scene_ended"


class SceneExistsError(SceneError):
    """A scene with this id is open already."""

    code = "scene_exists"


class SceneFullError(SceneError):
    """More NPCs than `scenes.max_members`."""

    code = "scene_full"


class SceneLimitError(SceneError):
    """As many scenes as `scenes.max_scenes` are open."""

    code = "scene_limit"
    retryable = True


class AlreadyInSceneError(SceneError):
    """The NPC, or the session's player, is in the scene already."""

    code = "already_in_scene"


class NotInSceneError(SceneError):
    """The sender, or the NPC named, is not in the scene."""

    code = "not_in_scene"


class UnknownSceneNPCError(SceneError):
    """The world has no NPC of this id."""

    code = "unknown_npc"


class TooFewNPCsError(SceneError):
    """NPCs talking among themselves (`SceneAmbient`) need two in the scene."""

    code = "too_few_npcs"
