"""One conversation of an NPC with a game session: its history and what its prompts carry.

Everything an actor keeps per session is one `Session`, dropped whole when the session ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mythic.dialogue._context import LineContext
from mythic.engine import ChatMessage
from mythic.knowledge import HEADERS, MORE_LORE

INTERRUPTED_NOTE = "[interrupted by the player]"
"""Appended to a reply the player cut off, in the history the next turn is prompted with."""

HEARD = "## Heard nearby"
"""The header of the lines said in the NPC's hearing (a scene's other speakers)."""


@dataclass(slots=True)
class Session:
    """What an NPC keeps of one session."""

    history: list[ChatMessage] = field(default_factory=list)
    """The exchanges so far: each one's context message, the player's line, the reply."""
    spoken_to: bool = False
    """A line of this session has reached the NPC (its history is then shown)."""
    player: str | None = None
    """The player the session belongs to (sessions that name one)."""
    recalled: bool = False
    """The session's memory section was built (at its first line or its prefill)."""
    memory: ChatMessage | None = None
    """The `## Recent Memory` message its prompts carry: built once, at the session's first
    line, so every later prompt extends the previous one."""
    intent: str | None = None
    """The last intent decided: it steers the next line's retrieval when no line classifier
    gives the line's own."""
    window_anchor: tuple[ChatMessage, bool] | None = None
    """The message its prompt window begins with (`window`), or, flagged True, the message it
    follows (when an overflow dropped every exchange)."""
    prepared: LineContext | None = None
    """The context whose prompt the engine last prepared (`PrepareLine`)."""
    head_prepared: bool = False
    """The prompt head (persona and memory) was evaluated before the first line."""

    def window(self, keep: int) -> list[int]:
        """Where the exchanges of the prompt window begin in the history.

        The window keeps its first exchange from one prompt to the next, so the engine's
        cache of the prompt holds; once it has more than `keep` (`chat.history_turns`)
        exchanges it jumps to the newest half of them. The conversation is then evaluated
        again once per half window, not at every line (as a window sliding by one exchange
        would have it).
        """
        if not keep:
            return []
        history = self.history
        first = 0
        if self.window_anchor is not None:
            message, after = self.window_anchor
            at = next((i for i, m in enumerate(history) if m is message), None)
            first = 0 if at is None else at + after
        starts = [i for i in exchange_starts(history) if i >= first]
        if len(starts) > keep:
            starts = starts[-max(1, keep // 2) :]
        if starts:
            self.window_anchor = (history[starts[0]], False)
        return starts

    def windowed(self, keep: int) -> list[ChatMessage]:
        """The exchanges of the prompt window (`window`)."""
        starts = self.window(keep)
        return self.history[starts[0] if starts else len(self.history) :]

    def drop_exchanges(self, keep: int, drop: int) -> None:
        """Move the start of the prompt window past its `drop` oldest exchanges (all of them:
        it starts with the next exchange), for this prompt and the later ones."""
        starts = self.window(keep)
        if drop < len(starts):
            self.window_anchor = (self.history[starts[drop]], False)
        elif self.history:
            self.window_anchor = (self.history[-1], True)

    def known(self, keep: int) -> tuple[str | None, str | None]:
        """The lore lines and the last scene told in the prompt window (the exchanges its
        next prompt keeps)."""
        lore: list[str] = []
        scene = None
        for message in self.windowed(keep):
            if message.role != "system":
                continue
            for section in message.content.split("\n\n"):
                if section.startswith((HEADERS["lore"], MORE_LORE)):
                    lore += section.splitlines()[1:]
                elif section.startswith((HEADERS["scene"], "Scene now:")):
                    scene = section
        return ("\n".join(lore) if lore else None), scene

    def overhear(self, lines: Sequence[str], keep: int) -> None:
        """Lines said in the NPC's hearing since its last reply: one `## Heard nearby`
        message at the end of the history (the newest `keep` lines), before its next line."""
        if not lines:
            return
        heard: list[str] = []
        last = self.history[-1] if self.history else None
        if last is not None and last.role == "system" and last.content.startswith(HEARD):
            heard = last.content.splitlines()[1:]
            self.history.pop()
        heard = [*heard, *(" ".join(line.split()) for line in lines)][-keep:]
        self.history.append(ChatMessage("system", "\n".join([HEARD, *heard])))
        self.spoken_to = True

    def trim(self, keep: int) -> None:
        """Keep twice the exchanges a prompt uses (`keep`); the oldest whole exchanges go
        first."""
        starts = exchange_starts(self.history)
        if len(starts) > 2 * keep:
            del self.history[: starts[-2 * keep] if keep else len(self.history)]


def heard_lines(history: Sequence[ChatMessage]) -> list[str]:
    """The words of the lines the NPC heard in a scene (`## Heard nearby`), without their
    speakers' names."""
    out = []
    for message in history:
        if message.role == "system" and message.content.startswith(HEARD):
            for line in message.content.splitlines()[1:]:
                out.append(line.split(": ", 1)[-1])
    return out


def replies_in(history: Sequence[ChatMessage]) -> list[str]:
    """The NPC's replies in `history`, without the note an interrupted one carries."""
    return [m.content.removesuffix(INTERRUPTED_NOTE) for m in history if m.role == "assistant"]


def exchange_starts(history: list[ChatMessage]) -> list[int]:
    """Where each exchange of a history begins: at 0 and after every NPC reply."""
    starts = [0, *(i + 1 for i, m in enumerate(history) if m.role == "assistant")]
    return [i for i in starts if i < len(history)]
