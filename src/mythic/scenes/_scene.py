"""One scene: its members, what was said in it and in whose hearing."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

_LOG = 256
"""Lines a scene keeps of what was said (and who heard each)."""


@dataclass(slots=True, frozen=True)
class SceneRecord:
    """A line said in a scene: who said it (an NPC's id, or `player`), to which turn, and who
    was in earshot (the NPCs and sessions in the scene then)."""

    speaker: str
    turn_id: str
    text: str
    heard_by: frozenset[str]
    """The NPCs in the scene when it was said, the speaker among them."""
    sessions: frozenset[str]


@dataclass(slots=True)
class Scene:
    """A conversation of NPCs and players in earshot of each other."""

    id: str
    owner: str
    """The session that opened it."""
    npcs: list[str]
    sessions: list[str]
    """The sessions of its players, in the order they joined."""
    max_exchanges: int
    player_of: dict[str, str | None] = field(default_factory=dict)
    """Per session, its player's id (their memory with each NPC records what was heard)."""
    log: deque[SceneRecord] = field(default_factory=lambda: deque(maxlen=_LOG))
    last_speaker: dict[str, str] = field(default_factory=dict)
    """Per session, the NPC who last answered its player (who answers an unaddressed line
    when the selector cannot decide)."""
    chain: asyncio.Task[None] | None = None
    """The replies to the last line being played, one speaker after another."""
    speaking: tuple[str, str, str] | None = None
    """The NPC answering now: (npc, session, turn)."""

    def record(self, speaker: str, turn_id: str, text: str) -> SceneRecord:
        record = SceneRecord(speaker, turn_id, text, frozenset(self.npcs), frozenset(self.sessions))
        self.log.append(record)
        return record
