"""One NPC's actor: an asyncio task with a priority mailbox and the dialogue state machine.

A player line becomes a turn: the reply streams from the dialogue engine (silver) while a
gold request on the intent engine classifies the line and picks at most one game tool. Reply
deltas go to the session as they come and through the phrase buffer for speech; a tool call
goes out after the reply, waits for the game's `Ack`, and its result is voiced in a short
follow-up. A new line from the same session, or a `Cutoff`, barges in: the turn stops within
one engine step and what was said stays in the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
import zlib
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from mythic._errors import MythicError
from mythic.archetypes import AdapterTask
from mythic.contracts import (
    Cutoff,
    Error,
    IntentRequest,
    IntentUpdate,
    LLMStreamDelta,
    NPCState,
    SceneObject,
)
from mythic.dialogue._conversation import chat_sampling
from mythic.dialogue._events import (
    AskIntent,
    Event,
    PlayerLine,
    PrepareLine,
    SceneChange,
    SessionGone,
    StopTurn,
    TurnDone,
)
from mythic.dialogue._mailbox import Lane, Mailbox, MailboxClosedError
from mythic.dialogue._moves import Classified, zone_named
from mythic.dialogue._naturalness import (
    REMINDED,
    Finding,
    LineFilter,
    asks,
    deflection,
    greeting_lead,
    greets,
    name_forms,
    opening,
    reminder,
    secrets_of,
    sentences,
)
from mythic.dialogue._phrases import PhraseBuffer, sentences_end
from mythic.dialogue._states import DialogueState, DialogueStateMachine
from mythic.dialogue._tools import (
    INTENTS,
    TOOLS_BY_INTENT,
    ToolArgumentError,
    decision_schema,
    describe_tools,
    npc_tools,
    validate_call,
)
from mythic.engine import (
    ChatMessage,
    ContextOverflowError,
    EngineError,
    GenerationRequest,
    Priority,
    RequestError,
    Sampling,
    UnknownAdapterError,
)
from mythic.knowledge import (
    ANSWER_NOTE,
    HEADERS,
    MORE_LORE,
    PROMPT_RULES,
    Packed,
    Query,
    SceneState,
    answer_line,
    intent_prompt,
    intent_schema,
    introduction,
    lore_beyond,
    persona_prompt,
)
from mythic.knowledge import SceneObject as KnownObject
from mythic.memory import Fact, Memory
from mythic.route import EndpointRejectedError, RoutedStream, canned_line

if TYPE_CHECKING:
    from mythic.dialogue._cast import Cast, ToolOutcome

log = logging.getLogger(__name__)

_CHARS_PER_TOKEN = 4
"""An English text's characters per token, about, for budgets the actor cannot tokenize."""
_LINE_TOKENS = 64
"""Room a prepared prompt keeps for the player's line (and the chat template around it)."""

Finish = Literal["stop", "length", "tool_call", "cutoff", "error"]
MAX_BARK_WORDS = 8


@dataclass(slots=True)
class Scene:
    """What the NPC perceives, from the game's `SceneUpdate`s."""

    zone: str | None = None
    time: str | None = None
    objects: tuple[SceneObject, ...] = ()

    def describe(self) -> str | None:
        parts = []
        if self.zone:
            parts.append(f"zone {self.zone}")
        if self.time:
            parts.append(f"time {self.time}")
        if self.objects:
            near = ", ".join(f"{o.id} ({o.dist:g} away)" for o in self.objects[:12])
            parts.append(f"nearby: {near}")
        return "Scene now: " + "; ".join(parts) if parts else None

    def state(self) -> SceneState:
        return SceneState(
            self.zone, self.time, tuple(KnownObject(o.id, o.dist) for o in self.objects)
        )


@dataclass(slots=True)
class Decision:
    """What the intent engine chose for a turn."""

    intent: str
    tool: tuple[str, dict[str, Any]] | None


@dataclass(slots=True, frozen=True)
class _Told:
    """A turn's context: the `## Lore` and `## Scene` sections, and the message carrying them
    (None when both are empty); then `more`, the `## More Lore` messages a prepared prompt was
    extended with by later partial transcripts (`lore` has their lines too)."""

    lore: str | None
    scene: str | None
    message: ChatMessage | None
    more: tuple[ChatMessage, ...] = ()
    focus: str | None = field(default=None, compare=False)
    """The lore line that best answers a question (`answer_line`); told after the line, not
    part of the context a prepared prompt is compared with."""

    @property
    def messages(self) -> list[ChatMessage]:
        head = [self.message] if self.message is not None else []
        return [*head, *self.more]

    @property
    def more_chars(self) -> int:
        return sum(len(m.content) for m in self.more)

    def head(self, max_chars: int, *, at_least_one: bool = True, in_order: bool = False) -> _Told:
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
        return _told_of(lore, self.scene)

    def extended(self, more: str) -> _Told:
        """This context and a `## More Lore` message after it (the prompt's KV extends)."""
        lore = f"{self.lore}\n{more}" if self.lore else more
        return _Told(lore, self.scene, self.message, (*self.more, ChatMessage("system", more)))


def _stopped_cut(prepared: _Told | None, stopped: _Told, max_chars: int) -> _Told | None:
    """What a spoken line tells when the player stopped during the warm-up's part `stopped`:
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


def _focus_of(told: _Told) -> tuple[ChatMessage, ...]:
    """The system message after the player's line that tells the lore line answering it."""
    return (ChatMessage("system", f"{ANSWER_NOTE} {told.focus}"),) if told.focus else ()


def _told_of(lore: str | None, scene: str | None, focus: str | None = None) -> _Told:
    joined = "\n\n".join(s for s in (lore, scene) if s)
    return _Told(lore, scene, ChatMessage("system", joined) if joined else None, focus=focus)


@dataclass(slots=True)
class _Turn:
    line: PlayerLine
    task: asyncio.Task[None]
    stop_reason: str | None = None


@dataclass(slots=True)
class TurnRecord:
    """What a finished turn did, for `GET /v1/npcs/{id}` and the tests."""

    session_id: str
    turn_id: str
    text: str
    finish: Finish
    intent: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    first_phrase_tokens: int | None = None
    """Tokens the model had generated when the reply's first phrase went to speech, counting
    those of tries the line filter caught."""
    caught: list[str] = field(default_factory=list)
    """What the line filter caught in this turn's tries (`Finding.kind`s), in order."""


class NPCActor:
    """The actor of one NPC: its mailbox, dialogue state, scene, and one history per session."""

    def __init__(self, cast: Cast, npc_id: str) -> None:
        self.cast = cast
        self.npc_id = npc_id
        self._generation = -1
        self._know_persona()
        self.mailbox: Mailbox[Event] = Mailbox(cast.settings.dialogue.mailbox_size)
        self.machine = DialogueStateMachine(self._state_changed)
        self.scene = Scene(zone=self.persona.zone)
        self.histories: dict[str, list[ChatMessage]] = {}
        self.last_intent: IntentUpdate | None = None
        self.last_context: ChatMessage | None = None
        """The last turn's `## Lore` / `## Scene` message (for `GET /v1/npcs/{id}`)."""
        self.last_turn: TurnRecord | None = None
        self._turn: _Turn | None = None
        self._held: deque[PlayerLine] = deque()
        self._intents: dict[str, str] = {}
        """Per session, the last intent decided: it steers the next line's retrieval when no
        line classifier gives the line's own."""
        self._last_move: tuple[str, Classified] | None = None
        self._players: dict[str, str] = {}
        """Per session, the player it belongs to (sessions that name one)."""
        self._memory_told: dict[str, ChatMessage | None] = {}
        """Per session, the `## Recent Memory` message its prompts carry: built once, at the
        session's first line, so every later prompt extends the previous one."""
        self._intent_task: asyncio.Task[None] | None = None
        self._next_intent: AskIntent | None = None
        self._warm_task: asyncio.Task[None] | None = None
        self._warming: str | None = None
        """The session whose prompt the warm-up is evaluating now."""
        self._next_warm: PrepareLine | None = None
        self._lore_step: _Told | None = None
        """The context whose part of a prepared prompt's lore the warm-up is evaluating now
        (`_prepare_part`)."""
        self._window_start: dict[str, tuple[ChatMessage, bool]] = {}
        """Per session, the message its prompt window begins with (`_window`), or, flagged
        True, the message it follows (when an overflow dropped every exchange)."""
        self.settled = 0
        """Windows checked (and moved where the next line would overflow) after a reply."""
        self._prepared: dict[str, _Told] = {}
        """Per session, the context whose prompt the engine last prepared (`PrepareLine`)."""
        self._headed: set[str] = set()
        """Sessions whose prompt head (persona and memory) was evaluated before their first
        line (`_prepare_head`)."""
        self.warm_ups = 0
        """Prompts prepared ahead of a line (`PrepareLine`) that reached the engine."""
        self._session_of_state: str | None = None
        self._turn_of_state: str | None = None

    def _know_persona(self) -> None:
        """(Re)read the persona card and its packed `## Persona` section: at start, and after
        the world was reloaded.

        Raises:
            KeyError: the world has no such NPC (any more).
        """
        cast, knowledge = self.cast, self.cast.knowledge
        self.persona = cast.world.npc(self.npc_id)
        self.tools = npc_tools(self.npc_id, self.persona.tools)
        self.short_name = self.persona.name.split(",")[0]
        world, persona = cast.world, self.persona
        self.name_forms = name_forms(persona.name, persona.backstory)
        public = [world.card.description, persona.style, *persona.rules]
        public += [f"{zone.name}: {zone.description}" for zone in world.card.zones.values()]
        public += [npc.name for npc in world.npcs.values()]
        public += persona.catchphrases  # its own words: said on every greeting
        self.secrets = secrets_of(persona.taboos, public)
        """Each taboo's giveaway words: the line filter keeps them from the replies."""
        self.instructions = [persona.style, *persona.rules, *persona.taboos, *PROMPT_RULES]
        self.plain = [
            introduction(world, persona),
            ANSWER_NOTE,
            *(reminder(kind, self.short_name) for kind in REMINDED),
        ]
        """What the prompt calls the NPC ("a ghoul of Ravenmoor") and what a try generated
        again is told (`reminder`): never said by the NPC."""
        section = knowledge.persona(self.npc_id) if knowledge is not None else None
        full = knowledge is None
        prompt = persona_prompt(cast.world, self.persona, section, full=full)
        self.system = ChatMessage("system", prompt)
        self.known = cast.world_words
        """The words of the NPC's world. Not its prompt's: "You know nothing of computers"
        tells the NPC what it doesn't know, and "I know nothing of computers" said back names
        the real world all the same (the scorecard's in-character check fails it)."""
        self._generation = knowledge.generation if knowledge is not None else 0

    @property
    def state(self) -> DialogueState:
        return self.machine.state

    @property
    def busy_session(self) -> str | None:
        """The session whose turn is running, if any."""
        return self._turn.line.session_id if self._turn else None

    def remembered(self) -> dict[str, dict[str, str | None]]:
        """Per session with a player: who, and the `## Recent Memory` section its prompts
        carry (None when the NPC remembered nothing of them)."""
        return {
            session: {
                "player_id": player,
                "section": (told.content if (told := self._memory_told.get(session)) else None),
            }
            for session, player in self._players.items()
        }

    def deliver(self, event: Event) -> None:
        """Put an event in the mailbox, in its lane.

        Raises:
            MailboxFullError: too many lines or intent requests are waiting.
            MailboxClosedError: the actor has stopped.
        """
        lane = (
            Lane.SPEECH
            if isinstance(event, PlayerLine)
            else Lane.DATA
            if isinstance(event, AskIntent | PrepareLine)
            else Lane.SYSTEM
        )
        self.mailbox.put(event, lane)

    def reset_after_crash(self) -> None:
        """After a bug crashed the loop (its tasks are gone): back to idle, history kept."""
        self.machine = DialogueStateMachine(self._state_changed)
        self._turn = None
        self._intent_task = self._next_intent = None
        self._warm_task = self._next_warm = None
        self._session_of_state = self._turn_of_state = None

    # -- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the mailbox until cancelled; every turn and intent task is owned here."""
        async with asyncio.TaskGroup() as tasks:
            try:
                while True:
                    event = await self.mailbox.get()
                    await self._handle(event, tasks)
            except MailboxClosedError:
                pass
            finally:
                # Cancel and await our children before the group exits.
                await self._stop_turn("cancelled", announce=False)
                for task in (self._intent_task, self._warm_task):
                    if task is not None:
                        task.cancel()

    async def _handle(self, event: Event, tasks: asyncio.TaskGroup) -> None:
        match event:
            case PlayerLine():
                if self._turn is None:
                    self._start_turn(event, tasks)
                elif self._turn.line.session_id == event.session_id:
                    # The player spoke over the NPC: barge-in, then answer the new line.
                    await self._stop_turn("barge_in", announce=True)
                    self._start_turn(event, tasks)
                else:
                    self._held.append(event)
            case StopTurn():
                turn = self._turn
                if (
                    turn is not None
                    and turn.line.session_id == event.session_id
                    and event.turn_id in (None, turn.line.turn_id)
                ):
                    self.mailbox.drop()
                    self._held = deque(h for h in self._held if h.session_id != event.session_id)
                    await self._stop_turn(event.reason, announce=False)
                    self._next_held(tasks)
                elif event.reason == "barge_in" and event.turn_id is not None:
                    # The reply was all written but still being spoken when the player cut in.
                    self._mark_interrupted(event.session_id, event.turn_id)
            case SceneChange(update=update):
                if update.zone is not None:
                    self.scene.zone = update.zone
                if update.time is not None:
                    self.scene.time = update.time
                if update.objects is not None:
                    self.scene.objects = update.objects
            case PrepareLine():
                if self._turn is not None or not self.cast.settings.dialogue.prefill_while_speaking:
                    return  # the engine is answering already: a warm-up would only slow it
                if self._warm_task is None or self._warm_task.done():
                    self._warm_task = tasks.create_task(
                        self._warm(event), name=f"warm {self.npc_id}/{event.session_id}"
                    )
                else:
                    self._next_warm = event  # the newest words win
            case AskIntent():
                if self._intent_task is None or self._intent_task.done():
                    self._intent_task = tasks.create_task(self._serve_intent(event))
                else:
                    self._next_intent = event  # the newest request wins
            case SessionGone(session_id=session_id, forget=forget):
                self._held = deque(h for h in self._held if h.session_id != session_id)
                if self._turn is not None and self._turn.line.session_id == session_id:
                    await self._stop_turn("cancelled", announce=False)
                    self._next_held(tasks)
                if forget:
                    self.histories.pop(session_id, None)
                    self._prepared.pop(session_id, None)
                    self._headed.discard(session_id)
                    self._window_start.pop(session_id, None)
                    self._intents.pop(session_id, None)
                    self._memory_told.pop(session_id, None)
                    player = self._players.pop(session_id, None)
                    if player is not None and self.cast.memory is not None:
                        self.cast.memory.summarize(self.npc_id, player, session_id)
            case TurnDone():
                if self._turn is not None and self._turn.task.done():
                    self._turn = None
                self._next_held(tasks)
                self._settle_after(tasks)

    def _start_turn(self, line: PlayerLine, tasks: asyncio.TaskGroup) -> None:
        task = tasks.create_task(self._run_turn(line), name=f"turn {self.npc_id}/{line.turn_id}")
        self._turn = _Turn(line, task)
        task.add_done_callback(lambda _: self._turn_done())

    def _turn_done(self) -> None:
        with contextlib.suppress(MailboxClosedError):
            self.mailbox.put(TurnDone(), Lane.SYSTEM)

    def _next_held(self, tasks: asyncio.TaskGroup) -> None:
        if self._turn is None and self._held:
            self._start_turn(self._held.popleft(), tasks)

    def _mark_interrupted(self, session_id: str, turn_id: str) -> None:
        last = self.last_turn
        history = self.histories.get(session_id)
        if (
            last is None
            or (last.session_id, last.turn_id) != (session_id, turn_id)
            or last.finish == "cutoff"
            or not history
            or history[-1].role != "assistant"
            or history[-1].content.endswith(INTERRUPTED_NOTE)
        ):
            return
        history[-1] = ChatMessage("assistant", f"{history[-1].content} {INTERRUPTED_NOTE}")
        self.last_turn = dataclasses.replace(last, finish="cutoff")
        self.cast.stats.barge_ins += 1

    async def _stop_turn(self, reason: str, *, announce: bool) -> None:
        """Stop the running turn and wait until it has cleaned up (its engine request is
        cancelled by then). `announce`: also tell the client to stop playing it (`Cutoff`)."""
        turn, self._turn = self._turn, None
        if turn is None or turn.task.done():
            return
        turn.stop_reason = reason
        if announce:
            self.cast.send(
                turn.line.session_id,
                Cutoff(
                    npc_id=self.npc_id,
                    session_id=turn.line.session_id,
                    turn_id=turn.line.turn_id,
                    reason="barge_in" if reason == "barge_in" else "cancelled",
                ),
            )
        turn.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await turn.task
        self.cast.stats.barge_ins += 1

    # -- state events -------------------------------------------------------------------------

    def _state_changed(self, state: DialogueState) -> None:
        if self._session_of_state is None:
            return
        self.cast.send(
            self._session_of_state,
            NPCState(
                npc_id=self.npc_id,
                state=state.value,
                session_id=self._session_of_state,
                turn_id=self._turn_of_state,
            ),
        )

    # -- a turn -------------------------------------------------------------------------------

    async def _run_turn(self, line: PlayerLine) -> None:
        cast, session = self.cast, line.session_id
        self._session_of_state, self._turn_of_state = session, line.turn_id
        self.machine.to(DialogueState.LISTENING)
        history = self.histories.setdefault(session, [])
        out = _TurnOutput(self, line)
        memory = cast.memory if line.player_id is not None else None
        if cast.knowledge is not None and cast.knowledge.generation != self._generation:
            with contextlib.suppress(KeyError):  # an NPC removed from the world keeps its card
                self._know_persona()
        user = ChatMessage("user", line.text)
        decision_task: asyncio.Task[Decision | None] | None = None
        speaking = False
        try:
            self.machine.to(DialogueState.THINKING)
            if memory is not None and line.player_id is not None:
                await self._recall(memory, session, line.player_id)
            spoken = line.spoken and cast.settings.dialogue.prefill_while_speaking
            out.told, out.focus = await self._told(session, line.text, spoken=spoken)

            async def retell() -> list[ChatMessage]:
                again = await self._context(session, line.text)
                out.told = self._telling((self._spoken_cut(again) if spoken else again).messages)
                return [*out.told, user, *out.focus]

            decide = cast.settings.dialogue.decide
            reply = self._checked_reply(out, history, user, retell)
            async with contextlib.aclosing(reply):
                async for text in reply:
                    if not speaking:
                        await cast.speakers.acquire()
                        speaking = True
                        self.machine.to(DialogueState.SPEAKING)
                    out.say(text)
                    if decide and decision_task is None and out.phrases:
                        # The decision shares the engine with the reply and is needed only
                        # when the reply ends: it starts once the first phrase has gone to
                        # speech, so it delays neither the first token nor the first audio
                        # (the next phrase is decoded while that one is spoken).
                        decision_task = asyncio.create_task(self._decide(line))
                    if out.capped:  # a spoken reply's last sentence: stop the model
                        out.reason = "stop"
                        cast.stats.capped += 1
                        break
            out.flush_phrases()  # the reply's last words are spoken while the decision ends
            if speaking:  # the decision and a tool's round trip are not speech: free the slot
                cast.speakers.release()
                speaking = False
            if decide and decision_task is None:
                decision_task = asyncio.create_task(self._decide(line))
            decision = await decision_task if decision_task else None
            decision_task = None
            if decision is not None:
                out.intent = decision.intent
                self._intents[session] = decision.intent
                self._push_intent(session, decision.intent)
            if decision is not None and decision.tool is not None and line.tools:
                await self._call_tool(out, history, user, decision.tool)
        except asyncio.CancelledError:
            out.reason = "cutoff"
            self.machine.to(DialogueState.BARGE_IN)
            raise
        except (RequestError, EngineError) as exc:
            out.reason = "error"
            cast.send(session, _error(exc, turn_id=line.turn_id))
        finally:
            if decision_task is not None:
                decision_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, MythicError):
                    await decision_task
            out.close()
            said = out.text().strip()
            if memory is not None and line.player_id is not None:
                memory.record_turn(self.npc_id, line.player_id, session, "player", line.text)
                if said:
                    memory.record_turn(self.npc_id, line.player_id, session, "npc", said)
            # After a barge-in the next turn knows: the model sees where it was stopped.
            kept = f"{said} {INTERRUPTED_NOTE}" if out.reason == "cutoff" and said else said
            if out.history_open:
                history.append(ChatMessage("assistant", kept or "..."))
            elif said:  # the context told stays with its exchange: it is not told again
                history += [*out.told, user, ChatMessage("assistant", kept)]
            # Keep twice the exchanges a prompt uses; the oldest whole exchanges go first.
            starts = _exchange_starts(history)
            keep = 2 * cast.settings.chat.history_turns
            if len(starts) > keep:
                del history[: starts[-keep] if keep else len(history)]
            self.last_turn = TurnRecord(
                session,
                line.turn_id,
                said,
                out.reason,
                out.intent,
                out.tool_calls,
                out.first_phrase_tokens,
                out.caught,
            )
            cast.stats.turn_finished(out.reason)
            if speaking:
                cast.speakers.release()
            self.machine.to(DialogueState.IDLE)
            self._session_of_state = self._turn_of_state = None

    async def _recall(self, memory: Memory, session: str, player_id: str) -> None:
        """At a session's first line: warm -> hot (a bounded wait), then the session's memory
        section from hot, kept for all its prompts."""
        self._players[session] = player_id
        if session not in self._memory_told:
            await memory.prefetch(self.npc_id, player_id)
            told = memory.context(self.npc_id, player_id, session_id=session)
            if told and self.cast.knowledge is not None:
                told = self.cast.knowledge.fit_memory(self.npc_id, told)
            self._memory_told[session] = ChatMessage("system", told) if told else None

    def _settle_after(self, tasks: asyncio.TaskGroup) -> None:
        """Once a reply is done and nothing else is running, `_settle` its session."""
        last = self.last_turn
        if (
            self._turn is not None
            or last is None
            or last.finish not in ("stop", "length")
            or not self.cast.settings.dialogue.prefill_while_speaking
            or (self._warm_task is not None and not self._warm_task.done())
        ):
            return
        self._warm_task = tasks.create_task(
            self._warm(None, settle=last.session_id), name=f"settle {self.npc_id}"
        )

    async def _warm(self, prep: PrepareLine | None, *, settle: str | None = None) -> None:
        """`_settle` the session `settle`, then prepare the prompts of `PrepareLine`s, the
        newest waiting one after each, until none is waiting or a turn starts. A failure only
        costs the warm-up: the turn does it all."""
        work: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if settle is not None:
            work.append((settle, partial(self._settle, settle)))
        elif prep is not None:
            work.append((prep.session_id, partial(self._prepare, prep)))
        while work and self._turn is None:
            session, run = work.pop()
            self._warming = session
            try:
                await run()
            except (RequestError, EngineError, ContextOverflowError) as exc:
                log.debug("%s: no warm-up for %s: %s", self.npc_id, session, exc)
            except MythicError as exc:  # no endpoint, knowledge trouble: the turn will tell
                log.info("%s: no warm-up for %s: %s", self.npc_id, session, exc)
            finally:
                self._warming = None
            waiting, self._next_warm = self._next_warm, None
            if waiting is not None:
                work.append((waiting.session_id, partial(self._prepare, waiting)))

    async def _settle(self, session: str) -> None:
        """Right after a reply (the player listens, the engine is idle): when the session's
        next line would overflow the model's context, with a reply and room for the lore it
        may tell, move the prompt window now and evaluate it, rather than when the player has
        spoken. A window that fits costs one token: its prompt is cached whole."""
        history = self.histories.get(session)
        if not history:
            return
        settings = self.cast.settings
        room = settings.chat.max_tokens + _LINE_TOKENS + self._more_lore_tokens()
        if self.cast.knowledge is not None and self.cast.retrieval:
            room += settings.knowledge.lore_tokens
        stream = await self._open_fitted(
            session, history, (), Sampling(max_tokens=1, temperature=0.0), "dialogue", room=room
        )
        async with stream:
            await stream.collect()
        self.settled += 1

    async def _prepare(self, prep: PrepareLine) -> None:
        """Evaluate the prompt a line to `prep.session_id` would get, up to the line: persona,
        the session's memory, its history and the context retrieved for `prep.text`. Only
        the KV is wanted (the engine keeps it per session, and the turn's prompt extends this
        one); the token generated is dropped. The lore goes in parts of
        `prepare_step_tokens`, most relevant first, one request each, until all of it is in,
        a turn starts or newer words wait; `_prepared` holds the parts finished. Prepared
        already: nothing is evaluated.
        """
        session = prep.session_id
        settings = self.cast.settings
        memory = self.cast.memory
        if memory is not None and prep.player_id is not None:
            await self._recall(memory, session, prep.player_id)
        if len(prep.text.split()) < settings.dialogue.prepare_min_words:
            # "Is the", or the player has only begun: too few words to retrieve lore for. A
            # session's first line still has its persona and memory ahead of it (hundreds of
            # tokens that no line of this session has evaluated yet): evaluate those now.
            if not self.histories.get(session) and session not in self._headed:
                await self._prepare_head(session)
            return
        told = await self._context(session, prep.text)
        if self._turn is not None:
            return  # the line came while the lore was retrieved: it waits for no more
        step = _CHARS_PER_TOKEN * settings.dialogue.prepare_step_tokens or None
        prepared = self._prepared.get(session)
        if prepared is None or prepared.scene != told.scene:
            # The first part: the scene and the most relevant lore.
            prepared = await self._prepare_part(session, told.head(step) if step else told)
            if prepared is None:
                return
        # Later parts: the lines `told` has beyond those prepared (a partial with more words
        # retrieves other lines too; the line's prepared lore grows by `more_lore_tokens` at
        # most beyond the lore budget).
        limit = _CHARS_PER_TOKEN * (settings.knowledge.lore_tokens + self._more_lore_tokens())
        while self._turn is None and self._next_warm is None:
            room = limit - len(prepared.lore or "")
            if room <= 0:
                return
            more = lore_beyond(
                prepared.lore, told.lore, max_chars=min(step or room, room), at_least_one=True
            )
            if more is None or len(more) > room:
                return  # nothing new (that fits): what is prepared holds
            prepared = await self._prepare_part(session, prepared.extended(more))
            if prepared is None:
                return

    async def _prepare_part(self, session: str, told: _Told) -> _Told | None:
        """Evaluate the session's prompt up to the line with context `told` (one engine
        request); `_prepared` then holds what was evaluated. None when the prompt window had
        to move (the context is then told again, whole, by the next partial or the turn)."""
        history = self.histories.get(session, [])
        # Room for the reply, the line and its more lore: a prompt that fits now but not with
        # them would make the turn drop exchanges and evaluate everything again.
        room = self.cast.settings.chat.max_tokens + _LINE_TOKENS + self._more_lore_tokens()
        moved = False

        async def retell() -> list[ChatMessage]:
            nonlocal moved
            moved = True  # the lore known from the exchanges dropped is no longer told
            self._prepared.pop(session, None)  # nor are parts prepared for the old window
            return []

        self._lore_step = told
        try:
            stream = await self._open_fitted(
                session,
                history,
                told.messages,
                Sampling(max_tokens=1, temperature=0.0),
                "dialogue",
                retell=retell,
                room=room,
                # Stopped for the line, this part's last step still finishes: the line's
                # prompt begins as this one does (`_stopped_cut`) and finds it cached.
                finish_step_on_cancel=True,
            )
            async with stream:  # the KV is what was wanted; the token generated is dropped
                await stream.collect()
        finally:
            self._lore_step = None
        # No await from here on: a turn cancelling this step finds `_prepared` as evaluated.
        self.warm_ups += 1
        self.cast.stats.warm_ups += 1
        if moved:
            self._prepared.pop(session, None)
            return None
        self._prepared[session] = told
        return told

    async def _prepare_head(self, session: str) -> None:
        """Evaluate the head of a new session's prompt (persona and memory, no conversation
        yet): a line's prompt starts with it, so its turn or its warm-up finds it cached."""
        room = self.cast.settings.chat.max_tokens + _LINE_TOKENS + self._more_lore_tokens()
        if self.cast.knowledge is not None and self.cast.retrieval:
            room += self.cast.settings.knowledge.lore_tokens
        stream = await self._open_fitted(
            session, [], (), Sampling(max_tokens=1, temperature=0.0), "dialogue", room=room
        )
        async with stream:  # the KV is what was wanted; the token generated is dropped
            await stream.collect()
        self._headed.add(session)
        self.warm_ups += 1
        self.cast.stats.warm_ups += 1

    async def _told(
        self, session: str, text: str, *, spoken: bool = False
    ) -> tuple[list[ChatMessage], tuple[ChatMessage, ...]]:
        """The context messages of a turn answering `text` (`_context`), or, when the prompt
        was prepared while the player spoke (`PrepareLine`) with the same scene, the prepared
        context (already evaluated) plus a `## More Lore` message with what `text` retrieves
        beyond it, cut to `more_lore_tokens`. A `spoken` line with nothing prepared has its
        lore cut so too (`_spoken_cut`): its first token waits for no more lore than that
        (`spoken`: said aloud, with `prefill_while_speaking` on).

        A warm-up of this session still running a part of the prepared lore is stopped (the
        engine keeps the KV it evaluated; the parts finished are `_prepared`), and a spoken
        line then tells the parts finished and the first lines of the part stopped, cut to
        `more_lore_tokens` (`_stopped_cut`): its prompt begins as that part's did, so what the
        part evaluated before it was stopped is cached for the line. One moving the
        prompt window or evaluating its head is waited for: this turn's prompt starts with
        what it evaluates. Waiting warm-ups are dropped; one of another session is left to
        finish. Cancelling the turn does not cancel the warm-up.
        """
        told = await self._context(session, text)
        self._next_warm = None
        task = self._warm_task
        stopped: _Told | None = None
        if task is not None and not task.done() and self._warming == session:
            if self._lore_step is not None:
                stopped = self._lore_step
                task.cancel()
            await asyncio.wait({task})
        prepared = self._prepared.pop(session, None)  # the reply moves the session's KV on
        messages, how = told.messages, "unprepared"
        budget = _CHARS_PER_TOKEN * self._more_lore_tokens()
        if (
            spoken
            and stopped is not None
            and stopped.scene == told.scene  # a scene changed since is told as it is now
            and (cut := _stopped_cut(prepared, stopped, budget))
        ):
            # The part stopped had its first tokens evaluated: a cut that begins as it does
            # (its first lines, in its order) finds them cached. Lore retrieved for the final
            # transcript instead would differ from the partial's right after the header.
            messages, how = cut.messages, f"a stopped part's first {len(cut.lore or '')} chars"
            if prepared is not None:
                how = f"prepared, and {how}"
        elif prepared is not None and prepared == told:
            # The prepared messages themselves: the prompt window may be anchored on them.
            messages, how = prepared.messages, "prepared"
        elif prepared is not None and prepared.scene == told.scene:
            more = lore_beyond(prepared.lore, told.lore, max_chars=budget)
            messages = [*prepared.messages, *([ChatMessage("system", more)] if more else [])]
            how = f"prepared, {len(more or '')} characters of lore more"
        else:
            if prepared is not None:
                how = "prepared with another scene: not used"
            cut = self._spoken_cut(told) if spoken else told
            if cut is not told:
                messages = cut.messages
                how += f", lore cut to {self._more_lore_tokens()} tokens"
        log.debug("%s/%s: the line's context is %s", self.npc_id, session, how)
        return self._telling(messages), _focus_of(told)

    def _spoken_cut(self, told: _Told) -> _Told:
        """`told` with its lore cut to `more_lore_tokens` (the most relevant lines): what a
        spoken line evaluates after the player stops, when nothing was prepared."""
        budget = _CHARS_PER_TOKEN * self._more_lore_tokens()
        if not told.lore or len(told.lore) <= budget:
            return told
        return told.head(budget, at_least_one=False)

    def _telling(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """`messages`, the context a line tells, kept whole in `last_context` too."""
        self.last_context = (
            ChatMessage("system", "\n\n".join(m.content for m in messages)) if messages else None
        )
        return messages

    async def _context(self, session_id: str, text: str) -> _Told:
        """What this turn's prompt tells beyond what the session's conversation told already:
        the `## Lore` retrieved for `text` (with the line's own intent by the cast's line
        classifier, else the session's last intent, and the scene) less the lines told in
        earlier exchanges still in the prompt (a `## More Lore` section then), and the
        `## Scene` when it changed. One message just before the line; it stays in the
        history with the exchange, so a fact is told (and evaluated) once per conversation,
        not at every line. Classifying and retrieval run in one worker thread."""
        known_lore, known_scene = self._known(session_id)
        knowledge = self.cast.knowledge
        if knowledge is None or not self.cast.retrieval or self.npc_id not in knowledge.world.npcs:
            # No knowledge (or none on the dialogue tier), or an NPC a reload removed while
            # it still talks: the scene only.
            scene = self.scene.describe()
            return _told_of(None, scene if scene != known_scene else None)
        told = self._memory_told.get(session_id)
        state = self.scene.state()

        def retrieve() -> Packed:
            move = self._classified(text)
            intent = move.intent if move is not None else self._intents.get(session_id)
            return knowledge.context(
                self.npc_id,
                Query(text, intent),
                memory=told.content if told else None,
                scene=state,
            )

        packed = await asyncio.to_thread(retrieve)
        lore = lore_beyond(known_lore, packed.lore) if known_lore else packed.lore
        # A question, not a greeting ("Good evening. Who are you?" shares "evening" with
        # half the lore): the line that answers it is told again after it (`answer_line`).
        answer = self.cast.settings.dialogue.answer_line and asks(text) and not greets(text)
        focus = answer_line(packed.lore, text) if answer else None
        return _told_of(lore, packed.scene if packed.scene != known_scene else None, focus)

    def _known(self, session_id: str) -> tuple[str | None, str | None]:
        """The lore lines and the last scene told in the session's prompt window (the
        exchanges its next prompt keeps)."""
        history = self.histories.get(session_id, [])
        starts = self._window(session_id, history)
        lore: list[str] = []
        scene = None
        for message in history[starts[0] if starts else len(history) :]:
            if message.role != "system":
                continue
            for section in message.content.split("\n\n"):
                if section.startswith((HEADERS["lore"], MORE_LORE)):
                    lore += section.splitlines()[1:]
                elif section.startswith((HEADERS["scene"], "Scene now:")):
                    scene = section
        return ("\n".join(lore) if lore else None), scene

    def _reply_messages(
        self, session_id: str, history: list[ChatMessage], *tail: ChatMessage
    ) -> list[ChatMessage]:
        """Persona, the session's memory section, the exchanges of the prompt window
        (`_window`), then `tail`."""
        starts = self._window(session_id, history)
        remembered = self._memory_told.get(session_id)
        head = [self.system, remembered] if remembered is not None else [self.system]
        return [*head, *history[starts[0] if starts else len(history) :], *tail]

    def _drop_exchanges(self, session_id: str, history: list[ChatMessage], drop: int) -> None:
        """Move the start of the session's prompt window past its `drop` oldest exchanges
        (all of them: it starts with the next exchange), for this prompt and the later ones."""
        starts = self._window(session_id, history)
        if drop < len(starts):
            self._window_start[session_id] = (history[starts[drop]], False)
        elif history:
            self._window_start[session_id] = (history[-1], True)

    def _window(self, session_id: str, history: list[ChatMessage]) -> list[int]:
        """Where the exchanges of the session's prompt window begin in `history`.

        The window keeps its first exchange from one prompt to the next, so the engine's
        cache of the prompt holds; once it has more than `chat.history_turns` exchanges it
        jumps to the newest half of them. The conversation is then evaluated again once per
        half window, not at every line (as a window sliding by one exchange would have it).
        """
        keep = self.cast.settings.chat.history_turns
        if not keep:
            return []
        first = 0
        if (anchor := self._window_start.get(session_id)) is not None:
            message, after = anchor
            at = next((i for i, m in enumerate(history) if m is message), None)
            first = 0 if at is None else at + after
        starts = [i for i in _exchange_starts(history) if i >= first]
        if len(starts) > keep:
            starts = starts[-max(1, keep // 2) :]
        if starts:
            self._window_start[session_id] = (history[starts[0]], False)
        return starts

    async def _checked_reply(
        self,
        out: _TurnOutput,
        history: list[ChatMessage],
        user: ChatMessage,
        retell: Callable[[], Awaitable[Sequence[ChatMessage]]],
    ) -> AsyncGenerator[str, None]:
        """Stream the reply to `user` through the line filter (`dialogue.line_filter`): each
        clause leaves once checked. A reply caught is generated again, sampled, with a
        reminder of what went wrong after the player's line (not kept in the history), up to
        `dialogue.regenerate_tries` times, then the NPC refuses in a short line. One caught
        after a whole sentence left ends there; one caught mid-sentence is generated again
        from the words already said (they are the new try's start), so the player never
        hears half a sentence ("I'm sorry,"). A greeting's reply begins with a catchphrase
        (`_lead`), checked with the model's first words and sent with them."""
        dialogue = self.cast.settings.dialogue
        lead = self._lead(out.line, history)
        if not dialogue.line_filter:
            reply = self._generate(
                out, history, *out.told, user, *out.focus, retell=retell, lead=lead
            )
            async with contextlib.aclosing(reply):
                async for text in reply:
                    yield lead + text  # the lead leaves with the model's first words
                    lead = ""
            return
        sampling = chat_sampling(self.cast.settings.chat)
        extra: tuple[ChatMessage, ...] = ()
        finding: Finding | None = None
        given = ""  # what the player has been sent of this reply

        def fresh(released: str) -> str:
            """What the filter has released that was not sent yet (the try began with it)."""
            if released.startswith(given):
                return released[len(given) :]
            return released[len(given.rstrip()) :]

        for attempt in range(dialogue.regenerate_tries + 1):
            check = self._line_filter(history, user.content)
            out.reason = "stop"

            async def again(note: tuple[ChatMessage, ...] = extra) -> list[ChatMessage]:
                return [*(await retell()), *note]

            reply = self._generate(
                out,
                history,
                *out.told,
                user,
                *out.focus,
                *extra,
                retell=again,
                sampling=sampling,
                lead=lead,
            )
            # The lead is checked with the model's first words and leaves with them: a try
            # caught right after it is generated again rather than cut to "Sugar,".
            held = lead
            finding = None
            async with contextlib.aclosing(reply):
                async for text in reply:
                    _, finding = check.push(held + text)
                    held = ""
                    if len(check.released.rstrip()) > len(lead) and fresh(check.released):
                        yield fresh(check.released)
                        given = check.released
                    if finding is not None:
                        break
            if finding is None and held:  # the model said nothing after the lead
                _, finding = check.push(held)
            if finding is None:
                _, finding = check.finish()
            if finding is None:
                if fresh(check.released):
                    yield fresh(check.released)
                return
            self.cast.stats.caught[finding.kind] += 1
            out.caught.append(finding.kind)
            ended = re.search(r"[.!?…][\"')\]]*\s*$", given) is not None
            log.info(
                "%s: reply caught on try %d (%s: %r)%s",
                self.npc_id,
                attempt + 1,
                finding.kind,
                finding.detail,
                ", ended there" if ended else (", going on from what was said" if given else ""),
            )
            if ended:
                out.reason = "stop"
                return
            if given:
                lead = given.rstrip()
            extra = (ChatMessage("system", reminder(finding.kind, self.short_name)),)
            sampling = dataclasses.replace(
                sampling,
                temperature=max(sampling.temperature, 0.8),
                seed=zlib.crc32(f"{user.content}\0{attempt}".encode()),
                # A repeat comes back at any temperature (the conversation so far leads the
                # model into it): the next try pays a steeper price for every repeated token.
                dry_multiplier=(
                    max(4.0, sampling.dry_multiplier)
                    if finding.kind == "repeat"
                    else sampling.dry_multiplier
                ),
            )
        assert finding is not None
        out.reason = "stop"
        # Every try caught: the NPC refuses, in words not yet said in this conversation:
        # finishing the sentence whose first clause went out ("I am Marla," "and there it
        # ends."), else breaking off what it had begun to say.
        said = [s for text in (*_said(history), given) for s in sentences(text)]
        going_on = re.search(r"[,;:\u2014\u2013]\s*$", given) is not None
        refusal = deflection(finding.kind, out.line.turn_id, said, going_on=going_on)
        if going_on:
            yield ("" if given.endswith(" ") else " ") + refusal
        else:
            yield ("— " if given else "") + refusal

    def _line_filter(self, history: list[ChatMessage], line: str) -> LineFilter:
        """The checks of one reply in a conversation whose messages so far are `history`."""
        said = _said(history)
        heard = [m.content for m in history if m.role == "user"]
        return LineFilter(
            forms=self.name_forms,
            secrets=self.secrets,
            heard=" ".join([*heard, line]),
            earlier=[s for text in said for s in sentences(text)],
            openings=[opening(text) for text in said],
            instructions=self.instructions,
            plain=self.plain,
            own=self.persona.catchphrases,
            asked=line,
            known=self.known,
            hold_words=self.cast.settings.dialogue.first_phrase_words,
        )

    def _lead(self, line: PlayerLine, history: list[ChatMessage]) -> str:
        """How the reply to `line` begins: a catchphrase not yet said when the line greets
        (`dialogue.greet_with_catchphrase`), else "" (the model begins it)."""
        catchphrases = self.persona.catchphrases
        if not (self.cast.settings.dialogue.greet_with_catchphrase and catchphrases):
            return ""
        if not greets(line.text) or not self.cast.router.can_continue("dialogue"):
            return ""  # a remote endpoint without continue_final_message: the model begins
        said = _said(history)
        return greeting_lead(catchphrases, said, f"{line.session_id}\0{len(said)}")

    async def _generate(
        self,
        out: _TurnOutput,
        history: list[ChatMessage],
        *tail: ChatMessage,
        retell: Callable[[], Awaitable[Sequence[ChatMessage]]] | None = None,
        sampling: Sampling | None = None,
        lead: str = "",
    ) -> AsyncGenerator[str, None]:
        """Stream a reply to `tail`, dropping the oldest exchanges while the prompt overflows
        the context (`_open_fitted`); the engine's finish reason lands in `out.reason`.
        `sampling`: the chat settings' when None; `lead`: the reply's start, which the model
        continues (not streamed here).

        Raises:
            ContextOverflowError: even the persona and `tail` alone do not fit.
        """
        stream = await self._open_fitted(
            out.line.session_id,
            history,
            tail,
            sampling or chat_sampling(self.cast.settings.chat),
            "tool_dialogue" if out.tool_calls else "dialogue",
            canned=self.canned(out.line.turn_id),
            retell=retell,
            lead=lead,
        )
        async with stream:
            async for delta in stream:
                if delta.text:
                    out.model_tokens += 1
                    yield delta.text
                if delta.finish_reason == "length":
                    out.reason = "length"
                if delta.prompt_tokens:
                    self.cast.stats.reply_prompt_tokens += delta.prompt_tokens
                    self.cast.stats.reply_cached_tokens += delta.cached_tokens

    async def _open_fitted(
        self,
        session_id: str,
        history: list[ChatMessage],
        tail: Sequence[ChatMessage],
        sampling: Sampling,
        kind: str,
        *,
        canned: str | None = None,
        retell: Callable[[], Awaitable[Sequence[ChatMessage]]] | None = None,
        room: int = 0,
        finish_step_on_cancel: bool = False,
        lead: str = "",
    ) -> RoutedStream:
        """Open a reply to `tail` with as much of the session's conversation as the model's
        context holds. While the prompt overflows, the window's start jumps to the newest half
        of the exchanges that fit beside `tail`: the new start then holds for the lines after,
        each extending the prompt the engine has cached. (Dropping one exchange at a time
        would move the start at every line once the context is full, and every line would
        evaluate the whole conversation again.) `room`: context to leave free beyond the
        reply's tokens (`GenerationRequest.room_tokens`); `finish_step_on_cancel` is the
        request's (a warm-up's, stopped for the line). After a jump, `retell` gives the
        tail again: the lore and scene a line tells depend on what the window still holds.
        An overflow is found before anything is evaluated, so a jump costs no model time.

        Raises:
            ContextOverflowError: even the persona and `tail` alone do not fit.
        """
        start = self._window_start.get(session_id)
        while True:
            request = GenerationRequest(
                npc_id=self.npc_id,
                session_id=session_id,
                messages=self._reply_messages(session_id, history, *tail),
                priority=Priority.SILVER,
                sampling=sampling,
                room_tokens=room,
                finish_step_on_cancel=finish_step_on_cancel,
                continue_text=lead,
            )
            try:
                return await self._open(request, kind, AdapterTask.DIALOGUE_STYLE, canned=canned)
            except ContextOverflowError:
                held = len(self._window(session_id, history))
                if not held:
                    # Dropping the exchanges did not help: the window keeps them for prompts
                    # that fit (a settle's room can exceed what even the persona leaves).
                    if start is None:
                        self._window_start.pop(session_id, None)
                    else:
                        self._window_start[session_id] = start
                    raise ContextOverflowError(
                        "the persona and this line do not fit the model's context; say less"
                    ) from None
                # Keep the newest half of the exchanges that fit beside this line (one fewer
                # than were held, at most): 3 fit, 1 kept; 2 fit, none kept.
                self._drop_exchanges(session_id, history, held - (held - 1) // 2)
                if retell is not None:
                    tail = await retell()

    def _more_lore_tokens(self) -> int:
        return self.cast.settings.dialogue.more_lore_tokens

    async def _open(
        self, request: GenerationRequest, kind: str, task: AdapterTask, *, canned: str | None
    ) -> RoutedStream:
        """Route `request` with its archetype's adapter for `task` (none when the registry has
        none for the serving model, or it is not loaded yet). An endpoint that refuses the
        adapter (unloaded since it was chosen, or a remote server without it) gets the request
        again without it: the base model answers rather than nobody."""
        archetype = self.persona.archetype
        request.adapters = self.cast.adapters_for(request, kind, task, archetype)
        try:
            return await self.cast.router.open(request, kind, archetype=archetype, canned=canned)
        except (UnknownAdapterError, EndpointRejectedError) as exc:
            if not request.adapters or self.cast.chains is None:
                raise
            log.info(
                "%s: adapters %s refused (%s); the base model answers",
                self.npc_id,
                sorted(request.adapters),
                exc,
            )
            self.cast.chains.note_refused(archetype, task)
            request.adapters = {}
            return await self.cast.router.open(request, kind, archetype=archetype, canned=canned)

    def canned(self, key: str) -> str:
        """The NPC's line when no model can answer: one of the card's `fallback_lines`, else
        a line in its archetype's voice."""
        lines = self.persona.fallback_lines
        if lines:
            return lines[zlib.crc32(key.encode()) % len(lines)]
        return canned_line(self.persona.archetype, key)

    # -- decisions: intent and tool -----------------------------------------------------------

    def _intent_prompt(self, tools: list[str]) -> str:
        places = self._places()
        lines = [
            f"You decide what {self.short_name}, a {self.persona.archetype} in the video game "
            f"world {self.cast.world.name}, does when the player speaks.",
            "Intents: chitchat (small talk), trade (buying, selling, prices), quest (tasks, "
            "jobs), hint (help, secrets), combat (threats, fighting), navigation (the way "
            "somewhere, where something is), admin (the game itself).",
        ]
        if tools:
            lines += [
                f"Actions {self.short_name} can take in the game:",
                describe_tools(tools),
                "Places: " + ", ".join(places) + ".",
                "Take an action only when the player asks for it (set_waypoint or set_marker "
                "when they ask the way, open_dialog or give_item to trade); otherwise null.",
            ]
        scene = self.scene.describe()
        if scene:
            lines.append(scene)
        lines.append('Answer with JSON: {"intent": ..., "action": null or {"name", "args"}}.')
        return "\n".join(lines)

    def _places(self) -> list[str]:
        return list(self.cast.world.card.zones) or ["here"]

    def _targets(self) -> list[str]:
        ids = ["player", *(o.id for o in self.scene.objects if o.id != "player")]
        return ids[:32]

    def decision_request(self, session_id: str, text: str, *, tools: bool) -> GenerationRequest:
        """The gold request that decides `text`'s intent and tool (`tools`: the NPC's tools
        offered); its system message is the same for every line of a scene, so a warm-up
        (`Gateway.warmup`) can have it evaluated before the player's first line."""
        offered = self.tools if tools else []
        schema = decision_schema(offered, places=self._places(), targets=self._targets())
        return GenerationRequest(
            npc_id=self.npc_id,
            session_id=f"{session_id}/decide",
            messages=[
                ChatMessage("system", self._intent_prompt(offered)),
                ChatMessage("user", text),
            ],
            priority=Priority.GOLD,
            json_schema=schema,
            sampling=Sampling(
                max_tokens=self.cast.settings.dialogue.decision_max_tokens, temperature=0.0
            ),
        )

    def _classified(self, text: str) -> Classified | None:
        """The move of `text` by the cast's line classifier; None without one (`decider:
        model`). The last line's move is kept: the turn's lore and its decision classify the
        line once. Blocking (17 ms on 2 cores; a second or so when it builds the classifier):
        call it in a worker thread."""
        classifier = self.cast.classifier()
        if classifier is None:
            return None
        last = self._last_move
        if last is not None and last[0] == text:
            return last[1]
        move = classifier.classify(text)
        self._last_move = (text, move)
        return move

    async def _decide(self, line: PlayerLine) -> Decision | None:
        """The intent of the line and at most one tool call: by the cast's line classifier
        (`dialogue.decider`), else by a gold constrained request on the model.

        Only the line itself is judged: with the previous exchange in the prompt, the 0.5B
        model repeated the last tool on "thank you". A refused or failed decision is logged
        and counts as none: the reply goes on.
        """
        move = await asyncio.to_thread(self._classified, line.text)
        if move is not None:
            tool = await self._move_tool(line, move.move) if move.acts and line.tools else None
            self.cast.stats.intents[move.intent] += 1
            return Decision(move.intent, tool)
        tools = self.tools if line.tools else []
        request = self.decision_request(line.session_id, line.text, tools=line.tools)
        try:
            done = await self.cast.router.complete(
                request, "tool_decision", archetype=self.persona.archetype
            )
            data = json.loads(done.text)
        except (RequestError, EngineError, ValueError) as exc:
            log.warning("decision for %s failed: %s", self.npc_id, exc)
            self.cast.stats.decision_failures += 1
            return None
        intent = data.get("intent") if isinstance(data, dict) else None
        if intent not in INTENTS:
            self.cast.stats.decision_failures += 1
            return None
        action = data.get("action")
        tool = None
        if isinstance(action, dict):
            try:
                name = str(action.get("name"))
                allowed = [t for t in TOOLS_BY_INTENT[intent] if t in tools]
                tool = (name, validate_call(name, action.get("args"), allowed))
            except ToolArgumentError as exc:
                log.warning("%s chose an invalid tool call: %s", self.npc_id, exc)
                self.cast.stats.tool_calls["invalid"] += 1
        self.cast.stats.intents[intent] += 1
        return Decision(intent, tool)

    async def _move_tool(self, line: PlayerLine, move: str) -> tuple[str, dict[str, Any]] | None:
        """The game tool a classified acting `move` calls, among the NPC's tools: the way to
        the zone the line names, by its name or a title of its lore (a waypoint, else a
        marker); a purchase opens the trade window,
        else gives the item the model reads from the line; work opens the quest window; a
        threat turns the NPC to face the player (else a glare). None: no tool fits."""
        has = set(self.tools).__contains__
        call: tuple[str, dict[str, Any]] | None = None
        match move:
            case "way":
                world = self.cast.world
                zones = {z: zone.name for z, zone in world.card.zones.items()}
                titles = [(d.zone, d.title) for d in world.lore if d.zone in zones]
                place = await asyncio.to_thread(zone_named, line.text, zones, titles)
                if place is not None and has("set_waypoint"):
                    call = ("set_waypoint", {"target": place})
                elif place is not None and has("set_marker"):
                    call = ("set_marker", {"location": place})
            case "buy" if has("open_dialog"):
                call = ("open_dialog", {"dialog": "trade"})
            case "buy" if has("give_item"):
                return await self._item_asked(line)
            case "work" if has("open_dialog"):
                call = ("open_dialog", {"dialog": "quest"})
            case "threat" if has("set_focus"):
                call = ("set_focus", {"target": "player"})
            case "threat" if has("play_emote"):
                call = ("play_emote", {"emote": "glare"})
        if call is None:
            return None
        try:
            return (call[0], validate_call(call[0], call[1]))
        except ToolArgumentError as exc:  # a zone id no tool accepts
            log.warning("%s cannot call %s: %s", self.npc_id, call[0], exc)
            return None

    async def _item_asked(self, line: PlayerLine) -> tuple[str, dict[str, Any]] | None:
        """`give_item` with the item and quantity the model reads from the player's line (a
        constrained gold request); None when it fails."""
        schema = decision_schema(["give_item"], places=self._places(), targets=self._targets())
        trade = next(b for b in schema["anyOf"] if b["properties"]["intent"]["const"] == "trade")
        request = GenerationRequest(
            npc_id=self.npc_id,
            session_id=f"{line.session_id}/decide",
            messages=[
                ChatMessage(
                    "system",
                    f"The player buys from {self.short_name}. Write the item they ask for, "
                    'in their words, and how many: {"intent": "trade", "action": {"name": '
                    '"give_item", "args": {"item": ..., "quantity": ...}}}.',
                ),
                ChatMessage("user", line.text),
            ],
            priority=Priority.GOLD,
            json_schema=trade,
            sampling=Sampling(
                max_tokens=self.cast.settings.dialogue.decision_max_tokens, temperature=0.0
            ),
        )
        try:
            done = await self.cast.router.complete(
                request, "tool_decision", archetype=self.persona.archetype
            )
            action = json.loads(done.text)["action"]
            return ("give_item", validate_call("give_item", action["args"], ["give_item"]))
        except (
            RequestError,
            EngineError,
            ToolArgumentError,
            ValueError,
            LookupError,
            TypeError,
        ) as exc:
            log.warning("%s could not read the item asked for: %s", self.npc_id, exc)
            self.cast.stats.decision_failures += 1
            return None

    def _push_intent(self, session_id: str, intent: str) -> None:
        update = IntentUpdate(npc_id=self.npc_id, intent=intent, target="player")  # type: ignore[arg-type]
        self.last_intent = update
        self.cast.send(session_id, update)

    async def _call_tool(
        self,
        out: _TurnOutput,
        history: list[ChatMessage],
        user: ChatMessage,
        tool: tuple[str, dict[str, Any]],
    ) -> None:
        """Send the call, wait for the game's Ack, then voice the result in a follow-up."""
        name, args = tool
        out.end_segment("tool_call")
        self.machine.to(DialogueState.THINKING)
        outcome = await self.cast.call_tool(
            out.line.session_id, self.npc_id, out.line.turn_id, name, args
        )
        out.tool_calls.append({"name": name, "args": args, "status": outcome.status})
        said = out.text().strip()
        note = _tool_note(name, args, outcome)
        self._remember_tool(out.line, name, args, outcome, note)
        # The follow-up joins the history as the NPC's next words (in the turn's `finally`).
        exchange = [
            *out.told,
            user,
            ChatMessage("assistant", said or "..."),
            ChatMessage("system", note),
        ]
        history += exchange
        out.restart()
        async with self.cast.speakers:  # the follow-up is speech again: one of the slots
            self.machine.to(DialogueState.SPEAKING)
            if self.cast.settings.dialogue.tool_voice == "template":
                line = self._voice_template(name, args, outcome)
                if line:
                    out.say(line)
                return
            history_before = history[: -len(exchange)]
            async for text in self._generate(out, history_before, *exchange, VOICE_RESULT):
                out.say(text)

    def _remember_tool(
        self,
        line: PlayerLine,
        name: str,
        args: dict[str, Any],
        outcome: ToolOutcome,
        note: str,
    ) -> None:
        """Archive a tool call; a gift the game confirmed becomes a salient fact."""
        memory = self.cast.memory
        if memory is None or line.player_id is None:
            return
        fact = None
        if name == "give_item" and outcome.status == "ok":
            fact = Fact(f"{self.short_name} gave the player {args.get('item')}", 6, "gift")
        memory.record_event(
            self.npc_id,
            line.player_id,
            line.session_id,
            note,
            data={"tool": name, "args": args, "status": outcome.status},
            fact=fact,
        )

    def _place(self, place_id: object) -> str:
        zone = self.cast.world.card.zones.get(str(place_id))
        return zone.name if zone is not None else str(place_id).replace("_", " ")

    def _voice_template(self, name: str, args: dict[str, Any], outcome: ToolOutcome) -> str:
        """What the NPC says about a tool call it made, without asking the model."""
        if outcome.status != "ok":
            return "Hm. That did not work."
        match name:
            case "set_waypoint":
                return f"There: follow the mark to {self._place(args.get('target'))}."
            case "set_marker":
                return f"I've marked {self._place(args.get('location'))} on your map."
            case "give_item":
                return f"Here, take this: {args.get('item')}."
            case "open_dialog":
                return "Here, have a look."
            case _:
                return ""

    # -- intents for the game's controllers ---------------------------------------------------

    async def _serve_intent(self, ask: AskIntent) -> None:
        while True:
            try:
                update = await self._intent(ask.request)
                self.last_intent = update
                self.cast.send(ask.session_id, update)
            except (RequestError, EngineError) as exc:
                self.cast.send(ask.session_id, _error(exc, turn_id=None))
            except (ValueError, KeyError) as exc:
                # A decision cut at max_tokens is not whole JSON: say so, keep serving.
                log.warning("intent for %s did not parse: %s", self.npc_id, exc)
                self.cast.send(
                    ask.session_id,
                    Error(code="intent_failed", message="the intent did not complete; retry"),
                )
            if self._next_intent is None:
                return
            ask, self._next_intent = self._next_intent, None

    async def _intent(self, ask: IntentRequest) -> IntentUpdate:
        schema = intent_schema(self._targets(), with_bark=ask.with_bark)
        history = next(iter(self.histories.values()), [])
        prompt = intent_prompt(
            self.persona,
            self.scene.describe(),
            context=ask.context,
            last_line=history[-2].content if history else None,
            with_bark=ask.with_bark,
        )
        request = GenerationRequest(
            npc_id=self.npc_id,
            session_id="intent",
            messages=[ChatMessage("system", prompt), ChatMessage("user", "Decide.")],
            priority=Priority.GOLD,
            json_schema=schema,
            sampling=Sampling(
                max_tokens=self.cast.settings.dialogue.decision_max_tokens, temperature=0.0
            ),
        )
        canned: dict[str, Any] = {"intent": "chitchat", "target": None, "urgency": 0}
        if ask.with_bark:
            canned["bark"] = self.canned(ask.request_id)
        stream = await self._open(
            request,
            "bark" if ask.with_bark else "intent",
            AdapterTask.ACTION_POLICY,
            canned=json.dumps(canned),
        )
        async with stream:
            done = await stream.collect()
        data = json.loads(done.text)
        bark = data.get("bark")
        if isinstance(bark, str):
            bark = " ".join(bark.split()[:MAX_BARK_WORDS]).strip() or None
        target = data.get("target")
        self.cast.stats.intents[data["intent"]] += 1
        return IntentUpdate(
            npc_id=self.npc_id,
            intent=data["intent"],
            target=target if isinstance(target, str) else None,
            urgency=int(data["urgency"]) / 9,
            bark=bark,
            request_id=ask.request_id,
        )


class _TurnOutput:
    """The deltas of one turn on the wire: numbered without gaps, phrase-buffered for speech,
    ended by exactly one final delta per segment."""

    def __init__(self, actor: NPCActor, line: PlayerLine) -> None:
        self.actor = actor
        self.line = line
        self.seq = 0
        self.reason: Finish = "stop"
        self.intent: str | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self.history_open = False
        self.told: list[ChatMessage] = []
        """The turn's context message (lore, scene), sent just before the line."""
        self.focus: tuple[ChatMessage, ...] = ()
        """The line answering the player's question, told after it (`_focus_of`); never kept
        in the history."""
        """The exchange and tool note are in the history; only the follow-up is missing."""
        self._pieces: list[str] = []
        self._segment_open = False
        self._closed = False
        dialogue = actor.cast.settings.dialogue
        self._phrases = PhraseBuffer(
            min_s=dialogue.phrase_min_s,
            max_s=dialogue.phrase_max_s,
            first_words=dialogue.first_phrase_words,
        )
        self._max_sentences = dialogue.spoken_max_sentences if line.spoken else 0
        self.phrases = 0
        """Phrases of the reply given to the cast (`Cast.phrase`: speech synthesis, where
        the session has voice) so far."""
        self.capped = False
        """The reply has said its `spoken_max_sentences`: the turn stops generating."""
        self.model_tokens = 0
        """Text deltas the model has streamed for this turn (every try)."""
        self.first_phrase_tokens: int | None = None
        self.caught: list[str] = []

    def text(self) -> str:
        return "".join(self._pieces)

    def _delta(self, text: str, *, final: bool = False, reason: Finish | None = None) -> None:
        cast = self.actor.cast
        if self.seq == 0 and not final:
            cast.stats.first_token(time.perf_counter() - self.line.received_at)
        cast.send(
            self.line.session_id,
            LLMStreamDelta(
                npc_id=self.actor.npc_id,
                session_id=self.line.session_id,
                turn_id=self.line.turn_id,
                seq=self.seq,
                delta=text,
                final=final,
                finish_reason=reason,
            ),
        )
        self.seq += 1

    def say(self, text: str) -> None:
        if self._max_sentences:
            said = "".join(self._pieces)
            end = sentences_end(said + text, self._max_sentences)
            if end is not None:
                self.capped = True
                text = text[: max(end - len(said), 0)]
                if not text:
                    return
        self._segment_open = True
        self._pieces.append(text)
        self._delta(text)
        for phrase in self._phrases.push(text, time.perf_counter()):
            self._phrase(phrase)

    def _phrase(self, text: str) -> None:
        if not self.phrases:
            self.first_phrase_tokens = self.model_tokens
        self.phrases += 1
        self.actor.cast.phrase(self.line.session_id, self.actor.npc_id, self.line.turn_id, text)

    def flush_phrases(self) -> None:
        """Send the words the phrase buffer holds to speech (the reply has ended)."""
        rest = self._phrases.flush()
        if rest:
            self._phrase(rest)

    def end_segment(self, reason: Finish) -> None:
        self.flush_phrases()
        self._delta("", final=True, reason=reason)
        self._segment_open = False

    def restart(self) -> None:
        """A follow-up segment of the same turn starts (after a tool call)."""
        self._pieces = []
        self._segment_open = True
        self.history_open = True
        self.reason = "stop"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._segment_open or self.seq == 0 or self.reason in ("cutoff", "error"):
                self.end_segment(self.reason)
            self.actor.cast.reply_done(
                self.line.session_id, self.actor.npc_id, self.line.turn_id, self.reason
            )


def _said(history: Sequence[ChatMessage]) -> list[str]:
    """The NPC's replies in `history`, without the note an interrupted one carries."""
    return [m.content.removesuffix(INTERRUPTED_NOTE) for m in history if m.role == "assistant"]


def _exchange_starts(history: list[ChatMessage]) -> list[int]:
    """Where each exchange of a history begins: at 0 and after every NPC reply."""
    starts = [0, *(i + 1 for i, m in enumerate(history) if m.role == "assistant")]
    return [i for i in starts if i < len(history)]


def _tool_note(name: str, args: dict[str, Any], outcome: ToolOutcome) -> str:
    """The game's answer as a fact for the history: no instructions in it, which the model
    would read back on a later turn."""
    described = json.dumps(args, ensure_ascii=False)
    result = json.dumps(outcome.result, ensure_ascii=False) if outcome.result else ""
    why = f" ({outcome.message})" if outcome.message else ""
    return (
        f"Game event: {name} {described} -> {outcome.status}{why}{' ' + result if result else ''}"
    )


INTERRUPTED_NOTE = "[interrupted by the player]"
"""Appended to a reply the player cut off, in the history the next turn is prompted with."""

VOICE_RESULT = ChatMessage(
    "system", "Tell the player, in one short sentence and in character, what you just did."
)
"""Asked after a tool's result when the model voices it (`dialogue.tool_voice: model`)."""


def _error(exc: MythicError, *, turn_id: str | None) -> Error:
    code = type(exc).__name__.removesuffix("Error") or "EngineError"
    return Error(
        code=code[:64],
        message=exc.message[:500],
        turn_id=turn_id,
        retryable=exc.retryable,
    )
