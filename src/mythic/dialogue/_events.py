"""What an NPC actor's mailbox carries."""

from __future__ import annotations

from dataclasses import dataclass

from mythic.contracts import IntentRequest, SceneUpdate


@dataclass(slots=True, frozen=True)
class PlayerLine:
    """The player said something to the NPC (SPEECH lane)."""

    session_id: str
    turn_id: str
    text: str
    received_at: float
    """`time.perf_counter()` when the line arrived, for time to first token."""
    tools: bool = True
    """Whether the NPC may call game tools this turn (not over plain HTTP, which cannot Ack)."""
    player_id: str | None = None
    """The player the session belongs to: the NPC remembers them across sessions."""
    spoken: bool = False
    """The player said it aloud (voice): the reply is spoken too, and ends after
    `dialogue.spoken_max_sentences` sentences; its lore is what was prepared while the
    player spoke and `dialogue.more_lore_tokens` more (`dialogue.prefill_while_speaking`)."""


@dataclass(slots=True, frozen=True)
class PrepareLine:
    """The player is still speaking; `text` is what they said so far (DATA lane: a newer one
    supersedes). The NPC prepares the prompt of its answer, so the reply's first token does
    not wait for memory, lore retrieval and the KV of everything before the line."""

    session_id: str
    text: str
    player_id: str | None = None


@dataclass(slots=True, frozen=True)
class StopTurn:
    """Stop the NPC's turn (SYSTEM lane): the player interrupted, or the game called it off."""

    session_id: str
    turn_id: str | None
    """The turn to stop; None stops whatever turn of the session is running."""
    reason: str = "barge_in"


@dataclass(slots=True, frozen=True)
class SceneChange:
    """What the NPC perceives changed (SYSTEM lane: state is never dropped)."""

    update: SceneUpdate


@dataclass(slots=True, frozen=True)
class AskIntent:
    """The game wants a fresh intent (DATA lane: a newer request supersedes)."""

    session_id: str
    request: IntentRequest


@dataclass(slots=True, frozen=True)
class SessionGone:
    """A session disconnected or ended (SYSTEM lane): its turns stop; `forget` drops its
    history too."""

    session_id: str
    forget: bool


@dataclass(slots=True, frozen=True)
class TurnDone:
    """The running turn ended (SYSTEM lane, sent by the actor to itself)."""


Event = PlayerLine | PrepareLine | StopTurn | SceneChange | AskIntent | SessionGone | TurnDone
