"""One NPC's actor: an asyncio task with a priority mailbox and the dialogue state machine.

The actor serves its mailbox and dispatches: a player line becomes a turn (`Turns`), a
partial transcript a prefill (`Prefill`), an intent request a gold request (`Intents`). A new
line from the same session, or a `Cutoff`, barges in: the turn stops within one engine step
and what was said stays in the history. Everything outside the actor it reaches through the
`Stage` its cast gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from mythic.contracts import Cutoff, IntentUpdate, NPCState
from mythic.dialogue._character import Character, Scene
from mythic.dialogue._decision import Decider
from mythic.dialogue._events import (
    AskIntent,
    Event,
    Overheard,
    PlayerLine,
    PlayerPaused,
    PrepareLine,
    SceneChange,
    SessionGone,
    StopTurn,
    TurnDone,
)
from mythic.dialogue._intents import Intents
from mythic.dialogue._mailbox import Lane, Mailbox, MailboxClosedError
from mythic.dialogue._prefill import Prefill
from mythic.dialogue._session import Session
from mythic.dialogue._stage import Stage
from mythic.dialogue._states import DialogueState, DialogueStateMachine
from mythic.dialogue._turn import TurnRecord, Turns
from mythic.dialogue._window import PromptWindow
from mythic.engine import ChatMessage, GenerationRequest
from mythic.knowledge import Persona
from mythic.observability import playing


@dataclass(slots=True)
class _Running:
    """The turn the actor is playing."""

    line: PlayerLine
    task: asyncio.Task[None] = field(init=False)
    started: bool = False
    """The turn's coroutine has begun (a task cancelled before its first step never runs)."""


class NPCActor:
    """The actor of one NPC: its mailbox, dialogue state, scene, and one `Session` per game
    session.

    Raises:
        KeyError: the world has no such NPC.
    """

    def __init__(self, stage: Stage, npc_id: str) -> None:
        self.stage = stage
        self.npc_id = npc_id
        self.character = Character(stage, npc_id)
        self.mailbox: Mailbox[Event] = Mailbox(stage.settings.dialogue.mailbox_size)
        self.machine = DialogueStateMachine(self._state_changed)
        self.sessions: dict[str, Session] = {}
        self.window = PromptWindow(stage, self.character, self.sessions)
        self.prefill = Prefill(
            stage, self.character, self.window, self.sessions, lambda: self._turn is not None
        )
        self.decider = Decider(stage, self.character)
        self.intents = Intents(stage, self.character, self._last_player_line)
        self.turns = Turns(
            stage,
            self.character,
            self.sessions,
            self.window,
            self.prefill,
            self.decider,
            self.intents,
            self.machine_to,
        )
        self._turn: _Running | None = None
        self._held: deque[PlayerLine] = deque()
        self._state_of: tuple[str, str] | None = None
        """The session and turn the state machine's changes are reported to."""
        self._heard: list[Overheard] = []
        """Lines heard while a turn of their session ran: kept after the turn's exchange."""

    # -- what the server shows of the NPC ---------------------------------------------------

    @property
    def state(self) -> DialogueState:
        return self.machine.state

    @property
    def persona(self) -> Persona:
        return self.character.persona

    @property
    def system(self) -> ChatMessage:
        """The persona prompt every reply's prompt begins with."""
        return self.character.system

    @property
    def tools(self) -> list[str]:
        return self.character.tools

    @property
    def known(self) -> frozenset[str]:
        return self.character.known

    @property
    def scene(self) -> Scene:
        return self.character.scene

    @property
    def busy_session(self) -> str | None:
        """The session whose turn is running, if any."""
        return self._turn.line.session_id if self._turn else None

    @property
    def histories(self) -> dict[str, list[ChatMessage]]:
        """Per session spoken to, its history."""
        return {sid: s.history for sid, s in self.sessions.items() if s.spoken_to}

    @property
    def last_turn(self) -> TurnRecord | None:
        return self.turns.last

    @property
    def last_intent(self) -> IntentUpdate | None:
        return self.intents.last

    @property
    def last_context(self) -> ChatMessage | None:
        """The last turn's `## Lore` / `## Scene` message."""
        return self.window.last_context

    @property
    def warm_ups(self) -> int:
        """Prompts prepared ahead of a line (`PrepareLine`) that reached the engine."""
        return self.prefill.warm_ups

    @property
    def settled(self) -> int:
        """Windows checked (and moved where the next line would overflow) after a reply."""
        return self.prefill.settled

    def remembered(self) -> dict[str, dict[str, str | None]]:
        """Per session with a player: who, and the `## Recent Memory` section its prompts
        carry (None when the NPC remembered nothing of them)."""
        return {
            session_id: {
                "player_id": session.player,
                "section": session.memory.content if session.memory else None,
            }
            for session_id, session in self.sessions.items()
            if session.player is not None
        }

    def decision_request(self, session_id: str, text: str, *, tools: bool) -> GenerationRequest:
        """The gold request that decides `text`'s intent and tool (`Decider.request`)."""
        return self.decider.request(session_id, text, tools=tools)

    def _last_player_line(self) -> str | None:
        """The last line of the NPC's first conversation, for an intent's prompt."""
        history = next(iter(self.histories.values()), [])
        return history[-2].content if history else None

    # -- the mailbox --------------------------------------------------------------------------

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
        self.intents.reset()
        self.prefill.reset()
        self._state_of = None

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
                self.intents.cancel()
                self.prefill.cancel()

    async def _handle(self, event: Event, tasks: asyncio.TaskGroup) -> None:
        match event:
            case PlayerLine():
                if self._turn is None:
                    self._start_turn(event, tasks)
                elif self._turn.line.session_id == event.session_id:
                    # The player spoke over the NPC: barge-in, then answer the new line.
                    await self._stop_turn("barge_in", announce=True)
                    self._start_turn(event, tasks)
                elif event.priority < self._turn.line.priority:
                    # A player's line to an NPC talking ambiently (with the others of a
                    # scene): it breaks off and turns to the player.
                    await self._stop_turn("cancelled", announce=True)
                    self._start_turn(event, tasks)
                else:
                    self._hold(event)
            case StopTurn():
                turn = self._turn
                if event.reason == "discarded":
                    # A preemptive reply not confirmed: it alone stops, unannounced (nothing
                    # of it left the server); the line that replaces it may be waiting.
                    if turn is not None and turn.line.turn_id == event.turn_id:
                        await self._stop_turn("discarded", announce=False)
                        self._next_held(tasks)
                elif (
                    turn is not None
                    and turn.line.session_id == event.session_id
                    and event.turn_id in (None, turn.line.turn_id)
                ):
                    # The player's lines waiting behind the turn go with it (each is told it
                    # was cut off); other sessions' lines and every intent request stay.
                    ours = event.session_id
                    waiting = self.mailbox.drop(
                        Lane.SPEECH,
                        where=lambda e: isinstance(e, PlayerLine) and e.session_id == ours,
                    )
                    waiting += [h for h in self._held if h.session_id == ours]
                    self._held = deque(h for h in self._held if h.session_id != ours)
                    for line in waiting:
                        if isinstance(line, PlayerLine):
                            self.turns.unanswered(line)
                    if event.heard is not None:
                        self.turns.heard[turn.line.turn_id] = event.heard
                    await self._stop_turn(event.reason, announce=False)
                    self._next_held(tasks)
                elif event.turn_id is not None and self._drop_waiting(
                    event.session_id, event.turn_id
                ):
                    pass  # the line had not started: it is answered `cutoff`, never played
                elif event.reason == "barge_in" and event.turn_id is not None:
                    # The reply was all written but still being spoken when the player cut in.
                    self.turns.mark_interrupted(event.session_id, event.turn_id, event.heard)
            case SceneChange(update=update):
                scene = self.character.scene
                if update.zone is not None:
                    scene.zone = update.zone
                if update.time is not None:
                    scene.time = update.time
                if update.date is not None:
                    scene.date = update.date
                if update.objects is not None:
                    scene.objects = update.objects
                if update.date is not None or update.time is not None:
                    scene.date_with(self.stage.world.card.calendar)
                    if self.stage.memory is not None and scene.game_time is not None:
                        self.stage.memory.set_game_time(self.npc_id, scene.game_time)
            case PrepareLine():
                self.prefill.hint(event, tasks)
            case PlayerPaused(session_id=session_id):
                self.prefill.pause(session_id)
            case AskIntent():
                self.intents.ask(event, tasks)
            case Overheard():
                if self._turn is not None and self._turn.line.session_id == event.session_id:
                    self._heard.append(event)
                else:
                    self._overhear(event)
            case SessionGone(session_id=session_id, forget=forget):
                for line in self._held:
                    if line.session_id == session_id:
                        line.settle("", "cancelled")
                self._held = deque(h for h in self._held if h.session_id != session_id)
                self._heard = [h for h in self._heard if h.session_id != session_id]
                if self._turn is not None and self._turn.line.session_id == session_id:
                    await self._stop_turn("cancelled", announce=False)
                    self._next_held(tasks)
                if forget:
                    session = self.sessions.pop(session_id, None)
                    memory = self.stage.memory
                    if session is not None and session.player is not None and memory is not None:
                        memory.summarize(self.npc_id, session.player, session_id)
            case TurnDone():
                if self._turn is not None and self._turn.task.done():
                    self._turn = None
                self._flush_heard()
                self._next_held(tasks)
                last = self.turns.last
                if (
                    self._turn is None
                    and last is not None
                    and last.finish in ("stop", "length")
                    and not last.ambient  # the settle would run as a player's prompt
                ):
                    self.prefill.settle_after(last.session_id, tasks)

    def _hold(self, line: PlayerLine) -> None:
        """Keep `line` until the running turn ends: behind the lines held of its class and
        the more urgent ones, before the less urgent (players' lines before ambient ones)."""
        at = len(self._held)
        while at and self._held[at - 1].priority > line.priority:
            at -= 1
        self._held.insert(at, line)

    def _drop_waiting(self, session_id: str, turn_id: str) -> bool:
        """Drop the line of `turn_id` if it waits (in the mailbox, or behind another
        session's turn): it gets its final delta, `cutoff`. Whether there was one."""

        def ours(event: Event) -> bool:
            return isinstance(event, PlayerLine) and (event.session_id, event.turn_id) == (
                session_id,
                turn_id,
            )

        waiting = self.mailbox.drop(Lane.SPEECH, where=ours)
        waiting += [h for h in self._held if ours(h)]
        self._held = deque(h for h in self._held if not ours(h))
        for line in waiting:
            if isinstance(line, PlayerLine):
                self.turns.unanswered(line)
        return bool(waiting)

    def _overhear(self, heard: Overheard) -> None:
        """Keep lines said in the NPC's hearing in the session's history (and its memory of
        the session's player)."""
        session = self.sessions.setdefault(heard.session_id, Session())
        session.overhear(heard.lines, self.stage.settings.scenes.heard_lines)
        memory = self.stage.memory
        if heard.player_id is not None and memory is not None:
            session.player = session.player or heard.player_id
            for line in heard.lines:
                memory.record_event(
                    self.npc_id, heard.player_id, heard.session_id, f"Heard nearby: {line}"
                )

    def _flush_heard(self, session_id: str | None = None) -> None:
        """Keep the lines heard during turns that have ended (of `session_id`: that session's,
        before its next line starts)."""
        running = self._turn.line.session_id if self._turn is not None else None
        later: list[Overheard] = []
        for heard in self._heard:
            if heard.session_id == session_id or (
                session_id is None and heard.session_id != running
            ):
                self._overhear(heard)
            else:
                later.append(heard)
        self._heard = later

    def _start_turn(self, line: PlayerLine, tasks: asyncio.TaskGroup) -> None:
        self._flush_heard(line.session_id)
        running = _Running(line)
        running.task = tasks.create_task(
            self._play(running), name=f"turn {self.npc_id}/{line.turn_id}"
        )
        self._turn = running
        running.task.add_done_callback(lambda _: self._turn_done())

    async def _play(self, running: _Running) -> None:
        line = running.line
        running.started = True
        self._state_of = (line.session_id, line.turn_id)
        try:
            # The turn's `actor` hop: the hops of what the turn runs (retrieval, the engine's
            # requests) are its children.
            with playing(
                line.session_id,
                self.npc_id,
                line.turn_id,
                priority=line.priority.name.lower(),
                spoken=line.spoken,
            ) as actor:
                await self.turns.run(line)
                record = self.turns.last
                if actor is not None and record is not None and record.turn_id == line.turn_id:
                    actor.set(
                        finish_reason=record.finish,
                        intent=record.intent,
                        caught=len(record.caught),
                        tool_calls=len(record.tool_calls),
                    )
        finally:
            self._state_of = None

    def _turn_done(self) -> None:
        with contextlib.suppress(MailboxClosedError):
            self.mailbox.put(TurnDone(), Lane.SYSTEM)

    def _next_held(self, tasks: asyncio.TaskGroup) -> None:
        if self._turn is None and self._held:
            self._start_turn(self._held.popleft(), tasks)

    async def _stop_turn(self, reason: str, *, announce: bool) -> None:
        """Stop the running turn and wait until it has cleaned up (its engine request is
        cancelled by then). `announce`: also tell the client to stop playing it (`Cutoff`)."""
        turn, self._turn = self._turn, None
        if turn is None or turn.task.done():
            return
        if announce:
            self.stage.send(
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
        if reason == "discarded":
            return
        if not turn.started:
            # Stopped before its first step (the next line came at once): the turn never ran,
            # so it never sent its final delta; the line still gets one.
            self.turns.unanswered(turn.line)
        self.stage.stats.barge_ins += 1

    # -- state events -------------------------------------------------------------------------

    def machine_to(self, state: DialogueState) -> None:
        """Move the dialogue state machine (a turn's steps)."""
        self.machine.to(state)

    def _state_changed(self, state: DialogueState) -> None:
        if self._state_of is None:
            return
        running = self._turn
        if running is not None and running.line.hold is not None and running.line.hold.held:
            return  # a preemptive reply shows nothing until it is confirmed
        session_id, turn_id = self._state_of
        self.stage.send(
            session_id,
            NPCState(npc_id=self.npc_id, state=state.value, session_id=session_id, turn_id=turn_id),
        )
