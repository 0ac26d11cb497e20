"""What an NPC actor's mailbox carries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mythic.contracts import IntentRequest, SceneUpdate
from mythic.engine import Priority


class Hold:
    """The gate of a preemptive reply: a line started before the player had surely finished
    (from the transcript at a pause). The reply is generated at once, but nothing of it leaves
    the server (deltas, speech, the turn's end, tool calls) until `release()`: the player's
    final line is the same. `discard()`: it is not; the turn is stopped and leaves no trace
    (no history, no memory, no delta)."""

    def __init__(self) -> None:
        self.state: Literal["held", "released", "discarded"] = "held"
        self._event = asyncio.Event()
        self._on_release: list[Callable[[], None]] = []

    @property
    def held(self) -> bool:
        return self.state == "held"

    @property
    def discarded(self) -> bool:
        return self.state == "discarded"

    def on_release(self, callback: Callable[[], None]) -> None:
        """Call `callback` at `release()` (at once if released already)."""
        if self.state == "released":
            callback()
        elif self.state == "held":
            self._on_release.append(callback)

    def release(self) -> None:
        if self.state != "held":
            return
        self.state = "released"
        self._event.set()
        callbacks, self._on_release = self._on_release, []
        for callback in callbacks:
            callback()

    def discard(self) -> None:
        if self.state == "held":
            self.state = "discarded"
            self._on_release.clear()
            self._event.set()

    async def wait(self) -> bool:
        """Until released (True) or discarded (False)."""
        await self._event.wait()
        return self.state == "released"


AMBIENT_NOTE = (
    "is talking with you now, not a traveller: answer them as yourself, in one or two short "
    "sentences of your own, and add something new (news, an opinion, a question for them)."
)
"""Told before another character's line in an ambient exchange, after who says it
(`ambient_note`)."""


def ambient_note(speaker: str) -> str:
    """The system message before an ambient line: who says it, and how to answer. The line
    itself is the user message, as a player's would be: shown as a script ("Name: line",
    "Name says to you: ..."), the small models go on writing the script, everyone's lines;
    told after it, they read the note back."""
    return f"{speaker} {AMBIENT_NOTE}"


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
    hold: Hold | None = None
    """A preemptive reply's gate: its output waits for `Hold.release` (see `Hold`)."""
    speaker: str | None = None
    """Who said the line when not the player: another NPC of a scene, by name (the prompt
    shows `Name: line`, an ambient line's prompt names them after it; memory keeps it as
    something heard, not the player's words)."""
    reply: asyncio.Future[Reply] | None = None
    """Set when the turn ends (whatever ends it): what the NPC said and why it stopped (a
    scene waits on it before the next speaker)."""
    priority: Priority = Priority.SPEAKING
    """The engine class of the reply: `SPEAKING` for a player's line; a scene's ambient line
    (NPCs talking among themselves) is `SILVER` or `BRONZE`: it takes no speaker slot and no
    gold decision, and a more urgent line to the NPC stops it."""

    @property
    def ambient(self) -> bool:
        """Whether the line is one of NPCs talking among themselves, below the players'."""
        return self.priority > Priority.SPEAKING

    @property
    def said(self) -> str:
        """The line as the NPC's prompt shows it."""
        if self.ambient:
            return self.text  # who said it is told after it (`ambient_note`)
        return f"{self.speaker}: {self.text}" if self.speaker else self.text

    def settle(self, said: str, reason: str) -> None:
        """The turn answering this line is over: `reply` learns what was said."""
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(Reply(said, reason))


@dataclass(slots=True, frozen=True)
class Reply:
    """What an NPC said to a line (`PlayerLine.reply`), and its finish reason (`stop`,
    `length`, `tool_call`, `cutoff`, `error`, `cancelled`)."""

    text: str
    reason: str


@dataclass(slots=True, frozen=True)
class Overheard:
    """Lines said in the NPC's hearing, not to it (SYSTEM lane: what was heard is never
    dropped): a scene's other speakers. The session's history keeps them, so the NPC's next
    prompt (and its memory of the player) knows them; an NPC never told them does not."""

    session_id: str
    lines: tuple[str, ...]
    """Each as `Name: words`, in the order said."""
    player_id: str | None = None
    """The player of the session, whose memory with this NPC records them."""


@dataclass(slots=True, frozen=True)
class PrepareLine:
    """The player is still speaking; `text` is what they said so far (DATA lane: a newer one
    supersedes). The NPC prepares the prompt of its answer, so the reply's first token does
    not wait for memory, lore retrieval and the KV of everything before the line."""

    session_id: str
    text: str
    player_id: str | None = None


@dataclass(slots=True, frozen=True)
class PlayerPaused:
    """The player paused, likely at the end of their line (SYSTEM lane): preparing stops, so
    the final transcript and the reply get the cores (`Prefill.pause`)."""

    session_id: str


@dataclass(slots=True, frozen=True)
class StopTurn:
    """Stop the NPC's turn (SYSTEM lane): the player interrupted, or the game called it off."""

    session_id: str
    turn_id: str | None
    """The turn to stop; None stops whatever turn of the session is running."""
    reason: str = "barge_in"
    """`barge_in`, `cancelled`, ...; `discarded`: a preemptive reply the player's final line
    did not confirm (it stops alone: the session's waiting lines stay)."""
    heard: str | None = None
    """The words of the reply the player heard before it stopped (the voice layer knows,
    from what the client played); the history keeps those alone. None: all it wrote."""


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


Event = (
    PlayerLine
    | PrepareLine
    | PlayerPaused
    | StopTurn
    | SceneChange
    | AskIntent
    | SessionGone
    | Overheard
    | TurnDone
)
