"""`scenes`: group conversations of several NPCs and players in earshot."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mythic.config._section import Section


class SceneSettings(Section):
    """Scenes: who is in one, who answers a line, how long NPCs may talk among themselves."""

    max_scenes: int = Field(default=256, ge=1, le=100_000)
    """Scenes open at once on the server; a `SceneStart` beyond is refused (`scene_limit`)."""
    max_members: int = Field(default=8, ge=2, le=16)
    """NPCs in one scene; a start or join beyond is refused (`scene_full`)."""
    max_exchanges: int = Field(default=1, ge=0, le=8)
    """After a reply, how many more times NPCs may answer each other (an NPC the reply names)
    before the scene waits for a player; a `SceneStart` may ask for fewer or more, up to 8."""
    selector: Literal["model", "first"] = "model"
    """Who answers a line that names no NPC and has no `to`: `model`, a gold request on the
    dialogue model constrained to the scene's NPCs (or nobody); `first`, the NPC who last
    spoke with the player (else the first to join), without a model call."""
    selector_timeout_s: float = Field(default=2.0, gt=0, le=30)
    """Longest wait for the selector's decision; past it, the NPC who last spoke answers."""
    heard_lines: int = Field(default=12, ge=1, le=64)
    """Lines a member heard since its last reply that its next prompt tells (the newest)."""
