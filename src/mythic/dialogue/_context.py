"""A line's context: the `## Lore` and `## Scene` a turn's prompt tells just before the
player's line, and how a context prepared in parts is cut and extended."""

from __future__ import annotations

from dataclasses import dataclass, field

from mythic.engine import ChatMessage
from mythic.knowledge import ANSWER_NOTE, HEADERS, MORE_LORE, lore_beyond


@dataclass(slots=True, frozen=True)
class LineContext:
    """A turn's context: the `## Lore` and `## Scene` sections, and the message carrying them
    (None when both are empty); then `more`, the `## More Lore` messages a prepared prompt was
    extended with by later partial transcripts (`lore` has their lines too)."""

    lore: str | None
    scene: str | None
    message: ChatMessage | None
    more: tuple[ChatMessage, ...] = ()
    answer: str | None = field(default=None, compare=False)
    """The lore line that best answers a question (`answer_line`); told after the line, not
    part of the context a prepared prompt is compared with."""

    @property
    def messages(self) -> list[ChatMessage]:
        head = [self.message] if self.message is not None else []
        return [*head, *self.more]

    def head(
        self, max_chars: int, *, at_least_one: bool = True, in_order: bool = False
    ) -> LineContext:
        """This context with only the first lines of its lore that fit in `max_chars` (one at
        least, with `at_least_one`), most relevant first: the first part of a context told
        in parts, or a context cut short (`in_order`: up to the first line that does not
        fit, so that its prompt begins as this context's; `lore_beyond`)."""
        if not self.lore:
            return self
        first = self.lore.splitlines()[0]
        header = first if first in (HEADERS["lore"], MORE_LORE) else HEADERS["lore"]
        lore = lore_beyond(
            None,
            self.lore,
            max_chars=max_chars,
            header=header,
            at_least_one=at_least_one,
            in_order=in_order,
        )
        return context_of(lore, self.scene)

    def extended(self, more: str) -> LineContext:
        """This context and a `## More Lore` message after it (the prompt's KV extends)."""
        lore = f"{self.lore}\n{more}" if self.lore else more
        return LineContext(
            lore, self.scene, self.message, (*self.more, ChatMessage("system", more))
        )

    def answer_note(self) -> tuple[ChatMessage, ...]:
        """The system message after the player's line that tells the lore line answering
        it (none without one)."""
        return (ChatMessage("system", f"{ANSWER_NOTE} {self.answer}"),) if self.answer else ()


def context_of(lore: str | None, scene: str | None, answer: str | None = None) -> LineContext:
    """The context telling `lore` and `scene` (either may be None)."""
    joined = "\n\n".join(s for s in (lore, scene) if s)
    return LineContext(
        lore, scene, ChatMessage("system", joined) if joined else None, answer=answer
    )


def stopped_cut(
    prepared: LineContext | None, stopped: LineContext, max_chars: int
) -> LineContext | None:
    """What a spoken line tells when the player stopped during the prefill's part `stopped`:
    the parts `prepared` (finished, evaluated), then the first lines of `stopped`'s new lore,
    at most `max_chars` of them. None when `stopped` does not extend `prepared` (another
    scene, or a first part told again), or, with nothing prepared, when not even its first
    line fits."""
    if prepared is None:
        if stopped.more or not stopped.lore:
            return None
        cut = stopped.head(max_chars, at_least_one=False, in_order=True)
        return cut if cut.lore else None
    n = len(prepared.more)
    if (
        stopped.message != prepared.message
        or stopped.more[:n] != prepared.more
        or len(stopped.more) != n + 1
    ):
        return None
    more = lore_beyond(None, stopped.more[n].content, max_chars=max_chars, in_order=True)
    if not more:
        return prepared
    return prepared.extended(more)
