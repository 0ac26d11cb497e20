"""Prefill while the player speaks: an NPC evaluates the prompt of its next reply ahead of the
line (persona, memory, history and the lore the partial transcript retrieves), and moves a
conversation's prompt window right after a reply rather than when the player has spoken."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from mythic._errors import MythicError
from mythic.dialogue._character import Character
from mythic.dialogue._context import LineContext, stopped_cut
from mythic.dialogue._events import PrepareLine
from mythic.dialogue._session import Session
from mythic.dialogue._stage import Stage
from mythic.dialogue._window import PromptWindow
from mythic.engine import ChatMessage, ContextOverflowError, EngineError, RequestError
from mythic.knowledge import CHARS_PER_TOKEN, lore_beyond

log = logging.getLogger(__name__)


class Prefill:
    """One NPC's prefill: at most one task at a time, the newest partial transcript waiting."""

    def __init__(
        self,
        stage: Stage,
        character: Character,
        window: PromptWindow,
        sessions: dict[str, Session],
        turn_running: Callable[[], bool],
    ) -> None:
        self.stage = stage
        self.character = character
        self.window = window
        self.sessions = sessions
        self._turn_running = turn_running
        self.task: asyncio.Task[None] | None = None
        self.session: str | None = None
        """The session whose prompt the prefill is evaluating now."""
        self.waiting: PrepareLine | None = None
        """The newest partial transcript waiting for the running prefill to end."""
        self.part: LineContext | None = None
        """The context whose part of a prepared prompt's lore is being evaluated now
        (`_prepare_part`)."""
        self.stopped: tuple[str, LineContext] | None = None
        """A part stopped at the player's pause (`pause`): its session and context, for the
        line's prompt to begin as it did."""
        self.warm_ups = 0
        """Prompts prepared ahead of a line (`PrepareLine`) that reached the engine."""
        self.settled = 0
        """Windows checked (and moved where the next line would overflow) after a reply."""

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def reset(self) -> None:
        """After a crash of the actor's loop (its tasks are gone)."""
        self.task = self.waiting = None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def hint(self, prep: PrepareLine, tasks: asyncio.TaskGroup) -> None:
        """The player is speaking: prepare the prompt for what they said so far, or, while
        a prefill runs, after it (the newest words win)."""
        if self._turn_running() or not self.stage.settings.dialogue.prefill_while_speaking:
            return  # the engine is answering already: a prefill would only slow it
        self.stopped = None  # the player spoke on after a pause: preparing goes on
        if not self.running:
            name = f"prefill {self.character.npc_id}/{prep.session_id}"
            self.task = tasks.create_task(self._run(prep), name=name)
        else:
            self.waiting = prep

    def pause(self, session_id: str) -> None:
        """The player of `session_id` paused, most likely at the end of their line: a part of
        lore being evaluated for them is stopped (its last step finishes and stays cached, as
        when the line comes) and waiting hints dropped, so that the cores go to the final
        transcript and the reply rather than to more lore. The line's prompt begins as the
        stopped part's did (`line_context`); a partial after the pause starts preparing
        again."""
        task = self.task
        self.waiting = None
        if task is None or task.done() or self.session != session_id or self.part is None:
            return
        self.stopped = (session_id, self.part)
        task.cancel()

    def settle_after(self, session_id: str, tasks: asyncio.TaskGroup) -> None:
        """A reply of `session_id` is done and nothing else runs: `_settle` the session."""
        if not self.stage.settings.dialogue.prefill_while_speaking or self.running:
            return
        name = f"settle {self.character.npc_id}"
        self.task = tasks.create_task(self._run(None, settle=session_id), name=name)

    async def _run(self, prep: PrepareLine | None, *, settle: str | None = None) -> None:
        """`_settle` the session `settle`, then prepare the prompts of `PrepareLine`s, the
        newest waiting one after each, until none is waiting or a turn starts. A failure only
        costs the prefill: the turn does it all."""
        work: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if settle is not None:
            work.append((settle, partial(self._settle, settle)))
        elif prep is not None:
            work.append((prep.session_id, partial(self.prepare, prep)))
        npc_id = self.character.npc_id
        while work and not self._turn_running():
            session, run = work.pop()
            self.session = session
            try:
                await run()
            except (RequestError, EngineError, ContextOverflowError) as exc:
                log.debug("%s: no prefill for %s: %s", npc_id, session, exc)
            except MythicError as exc:  # no endpoint, knowledge trouble: the turn will tell
                log.info("%s: no prefill for %s: %s", npc_id, session, exc)
            finally:
                self.session = None
            waiting, self.waiting = self.waiting, None
            if waiting is not None:
                work.append((waiting.session_id, partial(self.prepare, waiting)))

    async def _settle(self, session_id: str) -> None:
        """Right after a reply (the player listens, the engine is idle): when the session's
        next line would overflow the model's context, with a reply and room for the lore it
        may tell, move the prompt window now and evaluate it, rather than when the player has
        spoken. A window that fits costs one token: its prompt is cached whole."""
        session = self.sessions.get(session_id)
        if session is None or not session.history:
            return
        await self.window.fill(session_id, room=self.window.room(lore=True))
        self.settled += 1

    async def prepare(self, prep: PrepareLine) -> None:
        """Evaluate the prompt a line to `prep.session_id` would get, up to the line: persona,
        the session's memory, its history and the context retrieved for `prep.text`. Only
        the KV is wanted (the engine keeps it per session, and the turn's prompt extends this
        one); the token generated is dropped. The lore goes in parts of
        `prepare_step_tokens`, most relevant first, one request each, until all of it is in,
        a turn starts or newer words wait; the session's `prepared` holds the parts finished.
        Prepared already: nothing is evaluated.
        """
        session_id = prep.session_id
        settings = self.stage.settings
        if self.stage.memory is not None and prep.player_id is not None:
            await self.window.recall(session_id, prep.player_id)
        session = self.sessions.setdefault(session_id, Session())
        if len(prep.text.split()) < settings.dialogue.prepare_min_words:
            # "Is the", or the player has only begun: too few words to retrieve lore for. A
            # session's first line still has its persona and memory ahead of it (hundreds of
            # tokens that no line of this session has evaluated yet): evaluate those now.
            if not session.history and not session.head_prepared:
                await self._prepare_head(session_id)
            return
        context = await self.window.context(session_id, prep.text)
        if self._turn_running():
            return  # the line came while the lore was retrieved: it waits for no more
        step = CHARS_PER_TOKEN * settings.dialogue.prepare_step_tokens or None
        prepared = session.prepared
        if prepared is None or prepared.scene != context.scene:
            # The first part: the scene and the most relevant lore.
            prepared = await self._prepare_part(session_id, context.head(step) if step else context)
            if prepared is None:
                return
        # Later parts: the lines `context` has beyond those prepared (a partial with more
        # words retrieves other lines too; the line's prepared lore grows by
        # `more_lore_tokens` at most beyond the lore budget).
        limit = CHARS_PER_TOKEN * settings.knowledge.lore_tokens + self.window.more_lore_chars
        while not self._turn_running() and self.waiting is None:
            room = limit - len(prepared.lore or "")
            if room <= 0:
                return
            more = lore_beyond(
                prepared.lore, context.lore, max_chars=min(step or room, room), at_least_one=True
            )
            if more is None or len(more) > room:
                return  # nothing new (that fits): what is prepared holds
            prepared = await self._prepare_part(session_id, prepared.extended(more))
            if prepared is None:
                return

    async def _prepare_part(self, session_id: str, context: LineContext) -> LineContext | None:
        """Evaluate the session's prompt up to the line with `context` (one engine request);
        the session's `prepared` then holds what was evaluated. None when the prompt window
        had to move (the context is then told again, whole, by the next partial or the
        turn)."""
        session = self.sessions.setdefault(session_id, Session())
        moved = False

        async def tail_again() -> list[ChatMessage]:
            nonlocal moved
            moved = True  # the lore known from the exchanges dropped is no longer told
            session.prepared = None  # nor are parts prepared for the old window
            return []

        self.part = context
        try:
            # Room for the reply, the line and its more lore: a prompt that fits now but not
            # with them would make the turn drop exchanges and evaluate everything again.
            await self.window.fill(
                session_id,
                context.messages,
                room=self.window.room(lore=False),
                tail_again=tail_again,
                # Stopped for the line, this part's last step still finishes: the line's
                # prompt begins as this one does (`stopped_cut`) and finds it cached. Short
                # steps: the line waits for that one alone.
                finish_step_on_cancel=True,
                step_tokens=self.stage.settings.dialogue.prepare_batch_tokens,
            )
        finally:
            self.part = None
        # No await from here on: a turn cancelling this step finds `prepared` as evaluated.
        self.warm_ups += 1
        self.stage.stats.warm_ups += 1
        if moved:
            session.prepared = None
            return None
        session.prepared = context
        return context

    async def _prepare_head(self, session_id: str) -> None:
        """Evaluate the head of a new session's prompt (persona and memory, no conversation
        yet): a line's prompt starts with it, so its turn or its prefill finds it cached."""
        await self.window.fill(session_id, room=self.window.room(lore=True))
        self.sessions.setdefault(session_id, Session()).head_prepared = True
        self.warm_ups += 1
        self.stage.stats.warm_ups += 1

    async def line_context(
        self, session_id: str, text: str, *, spoken: bool = False
    ) -> tuple[list[ChatMessage], LineContext]:
        """The context messages of a turn answering `text` (`PromptWindow.context`), or,
        when the prompt was prepared while the player spoke (`PrepareLine`) with the same
        scene, the prepared context (already evaluated) plus a `## More Lore` message with
        what `text` retrieves beyond it, cut to `more_lore_tokens`. A `spoken` line with
        nothing prepared has its lore cut so too (`spoken_cut`): its first token waits for no
        more lore than that (`spoken`: said aloud, with `prefill_while_speaking` on). Also
        the context retrieved for `text` itself (its answer line).

        A prefill of this session still running a part of the prepared lore is stopped (the
        engine keeps the KV it evaluated; the parts finished are `prepared`), and a spoken
        line then tells the parts finished and the first lines of the part stopped, cut to
        `more_lore_tokens` (`stopped_cut`): its prompt begins as that part's did, so what the
        part evaluated before it was stopped is cached for the line. One moving the
        prompt window or evaluating its head is waited for: this turn's prompt starts with
        what it evaluates. Waiting prefills are dropped; one of another session is left to
        finish. Cancelling the turn does not cancel the prefill.
        """
        window = self.window
        context = await window.context(session_id, text)
        self.waiting = None
        task = self.task
        stopped: LineContext | None = None
        if self.stopped is not None and self.stopped[0] == session_id:
            stopped = self.stopped[1]  # stopped at the player's pause
        self.stopped = None
        if task is not None and not task.done() and self.session == session_id:
            if self.part is not None:
                stopped = self.part
                task.cancel()
            await asyncio.wait({task})
        session = self.sessions.setdefault(session_id, Session())
        prepared, session.prepared = session.prepared, None  # the reply moves the KV on
        messages, how = context.messages, "unprepared"
        budget = window.more_lore_chars
        if (
            spoken
            and stopped is not None
            and stopped.scene == context.scene  # a scene changed since is told as it is now
            and (cut := stopped_cut(prepared, stopped, budget))
        ):
            # The part stopped had its first tokens evaluated: a cut that begins as it does
            # (its first lines, in its order) finds them cached. Lore retrieved for the final
            # transcript instead would differ from the partial's right after the header.
            messages, how = cut.messages, f"a stopped part's first {len(cut.lore or '')} chars"
            if prepared is not None:
                how = f"prepared, and {how}"
        elif prepared is not None and prepared == context:
            # The prepared messages themselves: the prompt window may be anchored on them.
            messages, how = prepared.messages, "prepared"
        elif prepared is not None and prepared.scene == context.scene:
            more = lore_beyond(prepared.lore, context.lore, max_chars=budget)
            messages = [*prepared.messages, *([ChatMessage("system", more)] if more else [])]
            how = f"prepared, {len(more or '')} characters of lore more"
        else:
            if prepared is not None:
                how = "prepared with another scene: not used"
            cut = window.spoken_cut(context) if spoken else context
            if cut is not context:
                messages = cut.messages
                how += f", lore cut to {self.stage.settings.dialogue.more_lore_tokens} tokens"
        log.debug("%s/%s: the line's context is %s", self.character.npc_id, session_id, how)
        return window.record_context(messages), context
