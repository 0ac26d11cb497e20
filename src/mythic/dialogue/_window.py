"""The prompt of an NPC's reply: persona, the session's memory, the exchanges of its prompt
window, and the context a line tells (lore retrieved for it, the scene), fitted to the model's
context."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from mythic.archetypes import AdapterTask
from mythic.dialogue._character import Character
from mythic.dialogue._context import LineContext, context_of
from mythic.dialogue._naturalness import asks, greets
from mythic.dialogue._session import Session
from mythic.dialogue._stage import Stage
from mythic.engine import ChatMessage, ContextOverflowError, GenerationRequest, Priority, Sampling
from mythic.knowledge import CHARS_PER_TOKEN, Packed, Query, answer_line, lore_beyond
from mythic.observability import traced
from mythic.route import RoutedStream

LINE_TOKENS = 64
"""Room a prepared prompt keeps for the player's line (and the chat template around it)."""

KV_FILL = Sampling(max_tokens=1, temperature=0.0)
"""The sampling of a request made only to fill the KV cache: one greedy token, dropped."""

TailAgain = Callable[[], Awaitable[Sequence[ChatMessage]]]
"""Gives a prompt's tail again after its window moved (what a line tells depends on it)."""


class _Stream(Protocol):
    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def collect(self) -> Any: ...


async def fill_kv(stream: _Stream) -> None:
    """Run a request opened only for the KV cache its prompt leaves behind (sampled with
    `KV_FILL`): wait until the prompt is evaluated and drop the token generated.

    Args:
        stream: the opened request: `Engine.submit(...)` or `Router.open(...)`'s stream.
    """
    async with stream:
        await stream.collect()


class PromptWindow:
    """Builds and opens the prompts of one NPC's replies, per session."""

    def __init__(self, stage: Stage, character: Character, sessions: dict[str, Session]) -> None:
        self.stage = stage
        self.character = character
        self.sessions = sessions
        self.last_context: ChatMessage | None = None
        """The last turn's `## Lore` / `## Scene` message (for `GET /v1/npcs/{id}`)."""

    @property
    def more_lore_chars(self) -> int:
        """`dialogue.more_lore_tokens` in characters: lore a line adds to a prepared prompt."""
        return CHARS_PER_TOKEN * self.stage.settings.dialogue.more_lore_tokens

    def room(self, *, lore: bool) -> int:
        """Context to leave free beyond a prompt that ends before the player's line: the
        reply, the line and the lore it may add (`lore`: and a whole line's lore budget, when
        the dialogue tier retrieves lore)."""
        settings = self.stage.settings
        room = settings.chat.max_tokens + LINE_TOKENS + settings.dialogue.more_lore_tokens
        if lore and self.stage.knowledge is not None and self.stage.retrieval:
            room += settings.knowledge.lore_tokens
        return room

    def starts(self, session_id: str) -> list[int]:
        """Where the exchanges of the session's prompt window begin in its history."""
        session = self.sessions.get(session_id) or Session()
        return session.window(self.stage.settings.chat.history_turns)

    async def recall(self, session_id: str, player_id: str) -> None:
        """At a session's first line (or its prefill): warm -> hot memory (a bounded wait),
        then the session's memory section from hot, kept for all its prompts."""
        memory, knowledge = self.stage.memory, self.stage.knowledge
        if memory is None:
            return
        session = self.sessions.setdefault(session_id, Session())
        session.player = player_id
        if not session.recalled:
            npc_id = self.character.npc_id
            await memory.prefetch(npc_id, player_id)
            section = memory.context(npc_id, player_id, session_id=session_id)
            if section and knowledge is not None:
                section = knowledge.fit_memory(npc_id, section)
            session.memory = ChatMessage("system", section) if section else None
            session.recalled = True

    def record_context(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """`messages`, the context a line tells, kept whole in `last_context` too."""
        self.last_context = (
            ChatMessage("system", "\n\n".join(m.content for m in messages)) if messages else None
        )
        return messages

    def spoken_cut(self, context: LineContext) -> LineContext:
        """`context` with its lore cut to `more_lore_tokens` (the most relevant lines): what a
        spoken line evaluates after the player stops, when nothing was prepared."""
        budget = self.more_lore_chars
        if not context.lore or len(context.lore) <= budget:
            return context
        return context.head(budget, at_least_one=False)

    async def context(self, session_id: str, text: str) -> LineContext:
        """What this turn's prompt tells beyond what the session's conversation told already:
        the `## Lore` retrieved for `text` (with the line's own intent by the cast's line
        classifier, else the session's last intent, and the scene) less the lines told in
        earlier exchanges still in the prompt (a `## More Lore` section then), and the
        `## Scene` when it changed. One message just before the line; it stays in the
        history with the exchange, so a fact is told (and evaluated) once per conversation,
        not at every line. Classifying and retrieval run in one worker thread."""
        stage, character = self.stage, self.character
        session = self.sessions.get(session_id) or Session()
        known_lore, known_scene = session.known(stage.settings.chat.history_turns)
        knowledge = stage.knowledge
        npc_id = character.npc_id
        if knowledge is None or not stage.retrieval or npc_id not in knowledge.world.npcs:
            # No knowledge (or none on the dialogue tier), or an NPC a reload removed while
            # it still talks: the scene only.
            scene = character.scene.describe()
            return context_of(None, scene if scene != known_scene else None)
        memory = session.memory
        state = character.scene.state()

        def retrieve() -> Packed:
            move = character.classified(text)
            intent = move.intent if move is not None else session.intent
            return knowledge.context(
                npc_id,
                Query(text, intent),
                memory=memory.content if memory else None,
                scene=state,
            )

        with traced("retrieval", query_chars=len(text)) as retrieval:
            packed = await asyncio.to_thread(retrieve)
            if retrieval is not None:
                retrieval.set(hits=len(packed.hits), lore_tokens=packed.tokens.get("lore", 0))
        lore = lore_beyond(known_lore, packed.lore) if known_lore else packed.lore
        # A question, not a greeting ("Good evening. Who are you?" shares "evening" with
        # half the lore): the line that answers it is told again after it (`answer_line`).
        answer = stage.settings.dialogue.answer_line and asks(text) and not greets(text)
        focus = answer_line(packed.lore, text) if answer else None
        return context_of(lore, packed.scene if packed.scene != known_scene else None, focus)

    def _prompt(self, session: Session, tail: Sequence[ChatMessage]) -> list[ChatMessage]:
        """Persona, the session's memory section, the exchanges of its prompt window, then
        `tail`."""
        system = self.character.system
        head = [system, session.memory] if session.memory is not None else [system]
        return [*head, *session.windowed(self.stage.settings.chat.history_turns), *tail]

    async def open(
        self,
        session_id: str,
        tail: Sequence[ChatMessage],
        sampling: Sampling,
        kind: str,
        *,
        history: list[ChatMessage] | None = None,
        canned: str | None = None,
        tail_again: TailAgain | None = None,
        room: int = 0,
        finish_step_on_cancel: bool = False,
        step_tokens: int | None = None,
        lead: str = "",
        priority: Priority = Priority.SPEAKING,
    ) -> RoutedStream:
        """Open a reply to `tail` with as much of the session's conversation as the model's
        context holds. While the prompt overflows, the window's start jumps to the newest half
        of the exchanges that fit beside `tail`: the new start then holds for the lines after,
        each extending the prompt the engine has cached. (Dropping one exchange at a time
        would move the start at every line once the context is full, and every line would
        evaluate the whole conversation again.) `history`: the conversation before `tail`
        when not the session's whole history (a tool's follow-up); `room`: context to leave
        free beyond the reply's tokens (`GenerationRequest.room_tokens`);
        `finish_step_on_cancel` and `step_tokens` are the request's (a prefill's, stopped for
        the line, in short steps); `priority` its class (a player's line: `SPEAKING`). After a
        jump, `tail_again` gives the tail again: the lore and scene a line tells depend on what
        the window still holds. An overflow is found before anything is evaluated, so a jump
        costs no model time.

        Raises:
            ContextOverflowError: even the persona and `tail` alone do not fit.
        """
        session = own = self.sessions.setdefault(session_id, Session())
        if history is not None and history is not own.history:
            session = Session(history, memory=own.memory, window_anchor=own.window_anchor)
        keep = self.stage.settings.chat.history_turns
        start = session.window_anchor
        try:
            while True:
                request = GenerationRequest(
                    npc_id=self.character.npc_id,
                    session_id=session_id,
                    messages=self._prompt(session, tail),
                    priority=priority,
                    sampling=sampling,
                    room_tokens=room,
                    finish_step_on_cancel=finish_step_on_cancel,
                    step_tokens=step_tokens,
                    continue_text=lead,
                )
                try:
                    return await self.character.open(
                        request, kind, AdapterTask.DIALOGUE_STYLE, canned=canned
                    )
                except ContextOverflowError:
                    held = len(session.window(keep))
                    if not held:
                        # Dropping the exchanges did not help: the window keeps them for
                        # prompts that fit (a settle's room can exceed what even the persona
                        # leaves).
                        session.window_anchor = start
                        raise ContextOverflowError(
                            "the persona and this line do not fit the model's context; say less"
                        ) from None
                    # Keep the newest half of the exchanges that fit beside this line (one
                    # fewer than were held, at most): 3 fit, 1 kept; 2 fit, none kept.
                    session.drop_exchanges(keep, held - (held - 1) // 2)
                    if tail_again is not None:
                        tail = await tail_again()
        finally:
            own.window_anchor = session.window_anchor

    async def fill(
        self,
        session_id: str,
        tail: Sequence[ChatMessage] = (),
        *,
        room: int,
        tail_again: TailAgain | None = None,
        finish_step_on_cancel: bool = False,
        step_tokens: int | None = None,
    ) -> None:
        """Evaluate the session's prompt up to `tail` only for the KV cache it leaves
        (`fill_kv`), fitted like a reply's (`open`)."""
        stream = await self.open(
            session_id,
            tail,
            KV_FILL,
            "dialogue",
            tail_again=tail_again,
            room=room,
            finish_step_on_cancel=finish_step_on_cancel,
            step_tokens=step_tokens,
        )
        await fill_kv(stream)
