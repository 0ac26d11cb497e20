"""The NPCs in play: one actor per active NPC, the speaker limit, and the game's tool calls.

The cast is the dialogue layer's one entry point for a gateway: `deliver` routes a client
message to its NPC's mailbox without waiting, `ack` resolves a pending tool call, and
everything the NPCs say goes out through the `Outbox` the gateway provides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from mythic._errors import MythicError
from mythic.archetypes import REGISTRY_FILE, ChainRouter, RegistryError, open_registry
from mythic.config import MythicSettings
from mythic.contracts import (
    Ack,
    ClientMessage,
    Cutoff,
    Error,
    IntentRequest,
    PlayerUtterance,
    SceneUpdate,
    ToolCall,
)
from mythic.dialogue._actor import NPCActor
from mythic.dialogue._events import (
    AskIntent,
    Hold,
    Overheard,
    PlayerLine,
    PlayerPaused,
    PrepareLine,
    Reply,
    SceneChange,
    SessionGone,
    StopTurn,
)
from mythic.dialogue._mailbox import MailboxClosedError, MailboxFullError
from mythic.dialogue._moves import LineClassifier
from mythic.dialogue._naturalness import world_words
from mythic.dialogue._stage import DialogueStats, Outbox, ReplySink, Stage, ToolOutcome
from mythic.dialogue._tools import npc_tools
from mythic.engine import (
    ChatMessage,
    Engine,
    GenerationRequest,
    Priority,
    ResidentAdapters,
    Sampling,
)
from mythic.knowledge import Knowledge, TokenCounter, World, approx_tokens, shared_embedder
from mythic.memory import Memory, NPCInfo
from mythic.route import Router

log = logging.getLogger(__name__)

_ANSWERED = 4096
_REGISTRY_TIMEOUT_S = 10.0
"""Longest wait for the archetype registry at start (a Redis that does not answer)."""


class UnknownNPCError(MythicError):
    """The message names an NPC the world does not have."""


class UnknownCallError(MythicError):
    """An `Ack` names a call_id this session has no pending `ToolCall` for."""


@dataclass(slots=True)
class _PendingCall:
    session_id: str
    answer: asyncio.Future[Ack]


class Cast:
    """Owns the actors of the active NPCs: starts one on its NPC's first message, cancels and
    awaits all of them on `aclose`, and restarts one that crashes.

    Raises:
        ToolArgumentError: a persona card lists a tool that does not exist.
    """

    def __init__(
        self,
        world: World,
        router: Router,
        settings: MythicSettings,
        outbox: Outbox,
        *,
        replies: ReplySink | None = None,
        memory: Memory | None = None,
        knowledge: Knowledge | None = None,
        chains: ChainRouter | None = None,
    ) -> None:
        self.check_world(world)  # an unknown tool name fails here, at start
        self._calls: dict[str, _PendingCall] = {}
        self._answered: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        self._classifier: LineClassifier | None = None
        self._classifier_lock = threading.Lock()
        self._no_classifier = settings.dialogue.decider != "classifier"
        self.stage = Stage(
            world,
            frozenset(),  # `_world_changed` reads the world's words
            router,
            settings,
            outbox,
            self.call_tool,
            self.classifier,
            memory=memory,
            knowledge=knowledge,
            chains=chains,
            replies=replies,
        )
        """What the actors share: the cast hands it to each one it starts."""
        if memory is not None:
            memory.writer = self._write_summary
        self._world_changed(world)
        self.actors: dict[str, NPCActor] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def world(self) -> World:
        """The world in play: the last one loaded or reloaded."""
        return self.stage.world

    @property
    def settings(self) -> MythicSettings:
        return self.stage.settings

    @property
    def stats(self) -> DialogueStats:
        return self.stage.stats

    @property
    def knowledge(self) -> Knowledge | None:
        """Persona, lore and packing; None: the whole persona card, no lore."""
        return self.stage.knowledge

    @property
    def memory(self) -> Memory | None:
        return self.stage.memory

    @property
    def speakers(self) -> asyncio.Semaphore:
        """The NPCs that may speak at once (`dialogue.max_concurrent_speakers`)."""
        return self.stage.speakers

    @property
    def replies(self) -> ReplySink | None:
        """Where each reply's phrases go for speech (set by the server's voice layer)."""
        return self.stage.replies

    @replies.setter
    def replies(self, replies: ReplySink | None) -> None:
        self.stage.replies = replies

    def classifier(self) -> LineClassifier | None:
        """The player-line classifier (`dialogue.decider`), built at first use on retrieval's
        sentence embedder (its examples embedded: about a second of CPU, so call it from a
        worker thread); None: the dialogue model decides (`decider: model`, or no embedder)."""
        with self._classifier_lock:
            if self._classifier is None and not self._no_classifier:
                knowledge = self.stage.knowledge
                embedder = knowledge.embedder if knowledge is not None else None
                try:
                    if embedder is None:
                        embedder = shared_embedder()
                    self._classifier = LineClassifier(embedder)
                except MythicError as exc:
                    log.warning("no line classifier (%s): the dialogue model decides", exc)
                    self._no_classifier = True
            return self._classifier

    # -- routing ------------------------------------------------------------------------------

    def actor(self, npc_id: str) -> NPCActor:
        """The actor of `npc_id`, started on first use.

        Raises:
            UnknownNPCError: the world has no such NPC.
        """
        actor = self.actors.get(npc_id)
        if actor is not None:
            return actor
        if self._closed:
            raise MythicError("the server is shutting down")
        try:
            actor = NPCActor(self.stage, npc_id)
        except KeyError as exc:
            raise UnknownNPCError(str(exc.args[0])) from None
        self.actors[npc_id] = actor
        self._tasks[npc_id] = asyncio.create_task(self._supervise(actor), name=f"npc {npc_id}")
        return actor

    def prepare(
        self, session_id: str, npc_id: str, text: str, *, player_id: str | None = None
    ) -> None:
        """The player is speaking to `npc_id`; `text` is what they said so far (a partial
        transcript; empty as they begin). The NPC prepares its answer's prompt meanwhile
        (`dialogue.prefill_while_speaking`): with too few words for lore
        (`dialogue.prepare_min_words`), only a new session's persona and memory; a hint,
        dropped when the NPC is busy.

        Raises:
            UnknownNPCError: the world has no such NPC.
        """
        actor = self.actor(npc_id)
        with contextlib.suppress(MailboxFullError, MailboxClosedError):
            actor.deliver(PrepareLine(session_id, text, player_id))

    def paused(self, session_id: str, npc_id: str) -> None:
        """The player speaking to `npc_id` paused (the voice layer's endpointing): lore being
        prepared for their line stops, so the final transcript and the reply get the cores.

        Raises:
            UnknownNPCError: the world has no such NPC.
        """
        with contextlib.suppress(MailboxClosedError):
            self.actor(npc_id).deliver(PlayerPaused(session_id))

    def deliver(
        self,
        session_id: str,
        message: ClientMessage,
        *,
        tools: bool = True,
        player_id: str | None = None,
        spoken: bool = False,
        hold: Hold | None = None,
        heard: str | None = None,
    ) -> None:
        """Route a client message to its NPC without waiting. `player_id`: whom the session
        belongs to, so the NPC remembers them; `spoken`: a line the player said aloud (its
        reply is spoken, and capped at `dialogue.spoken_max_sentences`); `hold`: a
        `PlayerUtterance` answered preemptively, its reply held until `hold.release()` (see
        `Hold`; `discard` drops it); `heard`: with a `Cutoff`, the words of the reply the
        player heard (the history keeps those alone).

        Raises:
            UnknownNPCError: the message names an NPC the world does not have.
            UnknownCallError: an `Ack` for no pending call of this session.
            MailboxFullError: the NPC has too many lines or intent requests waiting.
        """
        now = time.perf_counter()
        match message:
            case PlayerUtterance():
                self.actor(message.npc_id).deliver(
                    PlayerLine(
                        session_id,
                        message.turn_id,
                        message.text,
                        now,
                        tools,
                        player_id,
                        spoken,
                        hold,
                    )
                )
            case Cutoff():
                self.actor(message.npc_id).deliver(
                    StopTurn(session_id, message.turn_id, message.reason, heard)
                )
            case SceneUpdate():
                if message.date is not None:  # refused here, with its field, not in the actor
                    self.world.card.calendar.minutes(message.date, message.time)
                self.actor(message.npc_id).deliver(SceneChange(message))
            case IntentRequest():
                self.actor(message.npc_id).deliver(AskIntent(session_id, message))
            case Ack():
                self.ack(session_id, message)
            case _:
                raise MythicError(f"{message.type} is not routed to NPCs")

    def say_to(
        self,
        session_id: str,
        npc_id: str,
        turn_id: str,
        text: str,
        *,
        speaker: str | None = None,
        player_id: str | None = None,
        tools: bool = True,
        priority: Priority = Priority.SPEAKING,
    ) -> asyncio.Future[Reply]:
        """A line to `npc_id` (a scene's): from the player, or from another NPC named
        `speaker`. Returns what the NPC answers, set when its turn ends however it ends.
        `priority`: the reply's engine class (`PlayerLine.priority`: below `SPEAKING`, an
        ambient line).

        Raises:
            UnknownNPCError: the world has no such NPC.
            MailboxFullError: the NPC has too many lines waiting.
        """
        reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        line = PlayerLine(
            session_id,
            turn_id,
            text,
            time.perf_counter(),
            tools,
            player_id,
            speaker=speaker,
            reply=reply,
            priority=priority,
        )
        self.actor(npc_id).deliver(line)
        return reply

    def overhear(
        self, session_id: str, npc_id: str, lines: tuple[str, ...], *, player_id: str | None
    ) -> None:
        """`npc_id` heard `lines` (`Name: words`) said near it, not to it: its history (and
        memory of the player) keeps them.

        Raises:
            UnknownNPCError: the world has no such NPC.
        """
        with contextlib.suppress(MailboxClosedError):
            self.actor(npc_id).deliver(Overheard(session_id, lines, player_id))

    def stop(self, session_id: str, npc_id: str, turn_id: str, reason: str = "barge_in") -> None:
        """Stop `npc_id`'s turn `turn_id` of the session, if it is still running or waiting
        (its line gets its final delta, `cutoff`)."""
        actor = self.actors.get(npc_id)
        if actor is not None:
            with contextlib.suppress(MailboxClosedError):
                actor.deliver(StopTurn(session_id, turn_id, reason))

    def discard(self, session_id: str, npc_id: str, turn_id: str, hold: Hold) -> None:
        """Drop a preemptive reply (`deliver(..., hold=hold)`) the player's final line did not
        confirm: it stops, and nothing of it is sent or kept; the session's other lines stay."""
        hold.discard()
        with contextlib.suppress(MythicError):
            self.actor(npc_id).deliver(StopTurn(session_id, turn_id, "discarded"))

    def session_gone(self, session_id: str, *, forget: bool) -> None:
        """A session disconnected (`forget=False`: it may resume) or ended: its turns stop."""
        for actor in self.actors.values():
            actor.deliver(SessionGone(session_id, forget))
        for call in self._calls.values():
            if call.session_id == session_id and not call.answer.done():
                call.answer.cancel()

    def _world_changed(self, world: World) -> None:
        self.stage.world = world
        self.stage.world_words = world_words(world.texts())
        if self.stage.memory is not None:
            self.stage.memory.npcs = {
                npc_id: NPCInfo(p.name.split(",")[0], f"a {p.archetype} in {world.name}")
                for npc_id, p in world.npcs.items()
            }
            self.stage.memory.game_ago = world.card.calendar.ago
            self.stage.memory.factions = {
                npc_id: p.faction for npc_id, p in world.npcs.items() if p.faction is not None
            }

    @staticmethod
    def check_world(world: World) -> None:
        """Refuse a world the cast cannot play.

        Raises:
            ToolArgumentError: a persona card lists a tool that does not exist.
        """
        for npc_id, persona in world.npcs.items():
            npc_tools(npc_id, persona.tools)

    def reload_world(self) -> None:
        """Take the world `knowledge` has reloaded (after `check_world`): new lines see the new
        cards and lore (each actor rereads its persona at its next turn)."""
        if self.knowledge is not None:
            self._world_changed(self.knowledge.world)

    async def _write_summary(
        self, system: str, user: str, schema: dict[str, Any], max_tokens: int
    ) -> str:
        """Memory's summarizer: one constrained request on the bronze tier."""
        request = GenerationRequest(
            npc_id="_memory",
            session_id="summary",
            messages=[ChatMessage("system", system), ChatMessage("user", user)],
            priority=Priority.BRONZE,
            json_schema=schema,
            sampling=Sampling(max_tokens=max_tokens, temperature=0.0),
        )
        done = await self.stage.router.complete(request, "summary")
        return done.text

    # -- tool calls ---------------------------------------------------------------------------

    async def call_tool(
        self,
        session_id: str,
        npc_id: str,
        turn_id: str,
        name: str,
        args: dict[str, Any],
        *,
        needs_approval: bool = False,
    ) -> ToolOutcome:
        """Send a `ToolCall` and wait for its `Ack`, sending it again (same call_id) with a
        doubling wait when unanswered; a timeout is reported to the client as `TOOL_TIMEOUT`.
        `needs_approval`: the game approves (or refuses) a tool Mythic then runs itself."""
        dialogue, send, stats = self.settings.dialogue, self.stage.send, self.stats
        call_id = f"c-{uuid.uuid4().hex[:16]}"
        answer: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = _PendingCall(session_id, answer)
        call = ToolCall(
            name=name,
            args=args,
            npc_id=npc_id,
            turn_id=turn_id,
            call_id=call_id,
            needs_approval=needs_approval,
        )
        try:
            wait = dialogue.tool_timeout_s
            for attempt in range(dialogue.tool_retries + 1):
                if attempt:
                    stats.tool_calls["retried"] += 1
                send(session_id, call)
                try:
                    async with asyncio.timeout(wait):
                        ack = await asyncio.shield(answer)
                except TimeoutError:
                    wait *= 2
                    continue
                status = "ok" if ack.status == "duplicate" else ack.status
                stats.tool_calls[status] += 1
                return ToolOutcome(status, ack.result, ack.message)
            stats.tool_calls["timeout"] += 1
            send(
                session_id,
                Error(
                    code="TOOL_TIMEOUT",
                    message=f"{name} was not acknowledged after {dialogue.tool_retries + 1} tries",
                    turn_id=turn_id,
                    call_id=call_id,
                    retryable=False,
                ),
            )
            return ToolOutcome("timeout", message="the game did not answer")
        finally:
            del self._calls[call_id]
            self._answered[call_id] = None
            while len(self._answered) > _ANSWERED:
                self._answered.popitem(last=False)

    def ack(self, session_id: str, ack: Ack) -> None:
        """The game's answer to a tool call. A second Ack of the same call is ignored.

        Raises:
            UnknownCallError: no call with this id was sent to this session.
        """
        if ack.ack_of != "ToolCall" or ack.call_id is None:
            return  # acknowledgements of other messages need no action
        pending = self._calls.get(ack.call_id)
        if pending is None or pending.session_id != session_id:
            if ack.call_id in self._answered and pending is None:
                return  # a duplicate or late Ack: the call is settled
            raise UnknownCallError(f"no pending ToolCall with call_id {ack.call_id!r}")
        if not pending.answer.done():
            pending.answer.set_result(ack)

    # -- lifecycle ----------------------------------------------------------------------------

    async def _supervise(self, actor: NPCActor) -> None:
        """Run an actor; if it crashes (a bug), log it and start a fresh loop on the same state,
        so one NPC's failure never takes the server or another NPC down."""
        while True:
            try:
                await actor.run()
                return
            except Exception:  # top-level handler of the actor task
                log.exception("NPC %s crashed; restarting its actor", actor.npc_id)
                self.stats.actor_restarts += 1
                actor.reset_after_crash()

    async def aclose(self) -> None:
        """Stop every actor: cancel, and wait until each has cancelled its turns."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def __aenter__(self) -> Cast:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def token_counter(engine: Engine | None) -> TokenCounter:
    """Tokens of a text in the engine's model: the budgets of context packing (the lore's).
    None (no embedded model): the knowledge's estimate from characters."""
    if engine is None:
        return approx_tokens
    backend = engine.backend

    def count(text: str) -> int:
        return len(backend.tokenize(text, add_special=False, parse_special=False)) if text else 0

    return count


def open_chains(settings: MythicSettings, world: World, router: Router) -> ChainRouter | None:
    """The archetype chain router of `settings.archetypes.registry` (default: the world's
    `archetypes.yaml`, when there is one), with resident adapters on each embedded engine under
    `engine.adapter_budget_mb`; None when there is no registry. Reads nothing yet
    (`read_chains`)."""
    where = settings.archetypes.registry
    if where is None:
        default = world.path / REGISTRY_FILE
        if not default.is_file():
            return None
        where = str(default)
    budget = settings.engine.adapter_budget_mb * 1024 * 1024
    engines = {id(e): e for e in router.engines().values()}
    residents = [ResidentAdapters.for_engine(e, budget) for e in engines.values()]
    return ChainRouter(open_registry(where), residents)


async def read_chains(chains: ChainRouter) -> None:
    """Read the registry once at start; unreadable, the base model serves until a reread."""
    try:
        async with asyncio.timeout(_REGISTRY_TIMEOUT_S):
            await chains.refresh()
        log.info("archetype chains from %s: %s", chains.registry.where, sorted(chains.chains))
    except (RegistryError, TimeoutError) as exc:
        log.error(
            "archetype registry %s unreadable; the base model serves: %s",
            chains.registry.where,
            exc,
        )
