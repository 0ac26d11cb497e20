"""The gateway: a world's NPCs, their sessions and the server's background work, apart from
the web framework (`create_app` puts a gateway on HTTP and WebSocket; nothing here imports
it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from mythic._errors import MythicError
from mythic._heap import trim
from mythic.archetypes import REGISTRY_FILE, ChainRouter
from mythic.config import MythicSettings, ObservabilitySettings
from mythic.contracts import MAX_TEXT_CHARS, LLMStreamDelta, PlayerUtterance, ServerMessage
from mythic.dialogue import (
    KV_FILL,
    Cast,
    ReplySink,
    TurnRecord,
    fill_kv,
    open_chains,
    read_chains,
    token_counter,
)
from mythic.engine import (
    ChatMessage,
    Engine,
    EngineError,
    GenerationRequest,
    Priority,
    RequestError,
)
from mythic.jobs import JobQueue
from mythic.knowledge import Knowledge, World
from mythic.memory import Memory
from mythic.observability import Traces
from mythic.route import Router, local_router
from mythic.scenes import Scenes
from mythic.server._jobs import JobBoard
from mythic.server._sessions import Session, Sessions

if TYPE_CHECKING:
    from mythic.mcp import McpClient
    from mythic.server._provision import Provisioner
    from mythic.voice import VoiceHub

log = logging.getLogger(__name__)

_SAY_TIMEOUT_S = 120.0


@dataclass(slots=True)
class GatewayMetrics:
    """Counters of the gateway itself, exported at /metrics."""

    connections: int = 0
    open_connections: int = 0
    frames_in: int = 0
    messages_in: Counter[str] = field(default_factory=Counter)
    messages_out: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    """Errors sent to clients, by code."""


class SayRequest(BaseModel):
    """`POST /v1/npcs/{id}/say`: one player line, answered in full."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=r"\S")
    """What the player says."""
    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    """Continue this HTTP conversation (its history); leave out for a fresh one."""
    player_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    """The player speaking: the NPC remembers them across conversations."""


class SayReply(BaseModel):
    npc_id: str
    session_id: str
    turn_id: str
    text: str
    finish_reason: str
    intent: str | None
    caught: list[str] = Field(default_factory=list)
    """What the line filter caught in the turn's tries, in order ("assistant", "echo",
    "taboo", "repeat", "narration"): each one was generated again. Empty: the first try
    went out as it was."""
    safety: list[str] = Field(default_factory=list)
    """The turn's content-policy violations as `where:category` (`player:injection`,
    `reply:hate`): each replaced by the NPC's deflection or refused. Empty: nothing blocked."""


class ReplyTimeoutError(MythicError):
    """An NPC did not finish its reply to an HTTP line in time."""

    retryable = True


class Link(Protocol):
    """What serves a session to its client (a WebSocket connection)."""

    def taken_over(self) -> None:
        """Another connection resumed the session: close this one."""

    def too_slow(self) -> None:
        """The session's outbox overflowed: close the connection, keep the session."""


class ReplyObserver(Protocol):
    """Told when a reply's first token goes out to a session (the voice layer dates its
    turns' first model token by it)."""

    def first_token(self, session_id: str, npc_id: str, turn_id: str) -> None: ...


class Gateway:
    """A world's NPCs served to game clients: the router, the cast, the sessions, the bronze
    jobs and the voice layer, and (`run`) every background task they need."""

    def __init__(
        self,
        settings: MythicSettings,
        world: World,
        engine: Engine | None = None,
        intent_engine: Engine | None = None,
        *,
        router: Router | None = None,
        jobs: JobQueue | None = None,
        replies: ReplySink | None = None,
        memory: Memory | None = None,
        knowledge: Knowledge | None = None,
        chains: ChainRouter | None = None,
        mcp: McpClient | None = None,
        traces: Traces | None = None,
    ) -> None:
        """Requests go through `router` (tiers, endpoints, fallback); without one, every tier
        runs on `engine`, gold on `intent_engine` when given. `jobs`: the bronze job queue
        (`run` runs `jobs.workers` workers and applies artifacts to the knowledge; None: no
        jobs). `replies` receives each reply phrase by phrase (default: the voice layer, when
        `speech.enabled`); each reply's first token goes to `observers`. `memory`: the NPCs
        remember players across sessions (`run` starts and closes it). `knowledge`: persona,
        lore and packing (None: built here from `settings.knowledge`, counting tokens with the
        dialogue model's tokenizer). `chains`: the archetype adapters NPCs are served with
        (None: built here from `settings.archetypes`, on the embedded engines; `run` reads
        the registry at start, rereads it every `archetypes.refresh_s` and closes it).
        `mcp`: the MCP servers whose tools NPCs call (None: built from `mcp.servers` when
        it lists any; `run` keeps them connected).
        `traces`: where each turn's trace goes (None: built here from
        `settings.observability`; `run` makes them current and closes them).

        Raises:
            MissingExtraError: the retrieval mode needs the rag extra, which is missing.
        """
        self.settings = settings
        self.traces = traces if traces is not None else open_traces(settings.observability)
        """Each turn's trace: the last ones kept (`traces.recent`), exported when configured."""
        if router is None:
            if engine is None:
                raise ValueError("give an engine or a router")
            router = local_router(settings, engine, intent_engine)
        self.router = router
        self.engine = engine or router.engine_for("dialogue")
        """The dialogue tier's embedded engine (None when dialogue is remote only)."""
        if knowledge is None:
            knowledge = Knowledge(world, settings.knowledge, count=token_counter(self.engine))
        self.knowledge = knowledge
        self.jobs = (
            JobBoard(jobs, router, knowledge, lambda: self.world, settings.jobs) if jobs else None
        )
        """The bronze jobs; None: no queue."""
        self.metrics = GatewayMetrics()
        server = settings.server
        self.sessions = Sessions(
            max_sessions=server.max_sessions,
            resume_ttl_s=server.resume_ttl_s,
            outbox_size=server.outbox_size,
        )
        self.memory = memory
        self.chains = chains if chains is not None else open_chains(settings, world, router)
        """Which archetype adapters each NPC request applies; None: no registry, the base
        model serves every NPC."""
        self.provisioner: Provisioner | None = None
        """Trains missing adapters on first use (`archetypes.provision: first_use`)."""
        if self.chains is not None and settings.archetypes.provision == "first_use":
            from mythic.server._provision import Provisioner

            self.provisioner = Provisioner(
                self.chains,
                world.path,
                settings.archetypes.registry or str(world.path / REGISTRY_FILE),
                steps=settings.archetypes.provision_steps,
            )
        self.observers: list[ReplyObserver] = []
        """Told when each reply's first token goes out."""
        self.replies = replies
        """Where each reply's phrases go, for speech (the gateway is the cast's `ReplySink`
        and passes them on)."""
        self.cast = Cast(
            world,
            router,
            settings,
            self._send,
            replies=self,
            memory=memory,
            knowledge=knowledge,
            chains=self.chains,
        )
        if mcp is None and settings.mcp.servers:
            from mythic.mcp import McpClient

            mcp = McpClient(settings.mcp)
        self.mcp = mcp
        """The MCP servers whose tools NPCs may call; None: game tools only."""
        self.cast.stage.external = mcp
        self.scenes = Scenes(self.cast, self._send, settings.scenes)
        """Group conversations: who is in each scene, who answers, who heard what."""
        self.voice: VoiceHub | None = None
        """Speech in and out for voice sessions; None when `speech.enabled` is false."""
        if settings.speech.enabled:
            from mythic.voice import VoiceHub

            self.voice = VoiceHub(settings, self.sessions.send, self.cast)
            self.observers.append(self.voice)
            if replies is None:
                self.replies = self.voice
        self.ready = False
        self.warmed: list[str] = []
        """NPCs whose prompts were warmed (`warm_npcs`), in order."""
        self.started = time.monotonic()
        self._links: dict[str, Link] = {}
        self._tasks: asyncio.TaskGroup | None = None
        """The task group of `run`, while it runs and is not shutting down."""

    @property
    def world(self) -> World:
        """The world in play: the last one loaded or reloaded."""
        return self.cast.world

    # -- running ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def run(self, *, warm: bool = True) -> AsyncIterator[None]:
        """Open the gateway's stores and start its background work; on exit, cancel and await
        every task, then close what was opened. With `warm`, the engines are warmed first
        thing and `ready` turns true when that is done.

        The background work: the session reaper, the warm-up, the speech models' start, the
        world watcher (`knowledge.watch`), the registry's rereads, provisioning, the bronze
        workers and their artifact follower, the MCP servers' connections.
        """
        async with contextlib.AsyncExitStack() as opened:
            # Closed last, in a worker thread: its exporters may wait for a collector.
            opened.push_async_callback(asyncio.to_thread, self.traces.close)
            opened.enter_context(self.traces.serving())
            if self.memory is not None:
                await self.memory.start()
                opened.push_async_callback(self.memory.aclose)
            self.router.start()
            opened.push_async_callback(self.router.aclose)
            if self.jobs is not None:
                opened.push_async_callback(self.jobs.queue.aclose)
            if self.chains is not None:
                opened.push_async_callback(self.chains.aclose)
                await read_chains(self.chains)
            async with asyncio.TaskGroup() as tasks:
                background = self._start(tasks, warm=warm)
                self._tasks = tasks
                try:
                    yield
                finally:
                    # Sessions that end from here on are closed by `voice.aclose`.
                    self._tasks = None
                    for task in background:
                        task.cancel()
                    await self.scenes.aclose()
                    await self.cast.aclose()
                    if self.voice is not None:
                        await self.voice.aclose()

    def _start(self, tasks: asyncio.TaskGroup, *, warm: bool) -> list[asyncio.Task[None]]:
        start = tasks.create_task
        started = [start(self._reap(), name="mythic-reaper")]
        if self.settings.server.heap_trim_s > 0:
            started.append(start(self._trim_heap(), name="mythic-heap"))
        if warm:
            started.append(start(self._warm_at_start(), name="mythic-warm-up"))
        if self.voice is not None:
            started.append(start(_start_voice(self.voice), name="mythic-speech"))
        if self.settings.knowledge.watch:
            started.append(start(self._watch_world(), name="mythic-world-watch"))
        refresh_s = self.settings.archetypes.refresh_s
        if self.chains is not None and refresh_s > 0:
            started.append(start(self.chains.follow(refresh_s), name="mythic-registry"))
        if self.provisioner is not None:
            started.append(start(self.provisioner.run(), name="mythic-provision"))
        if self.mcp is not None:
            started.append(start(self.mcp.run(), name="mythic-mcp"))
        if self.jobs is not None:
            started += self.jobs.start(tasks)
        return started

    async def _reap(self) -> None:
        """Forget sessions whose resume window has passed, until cancelled."""
        interval = max(0.05, min(self.settings.server.resume_ttl_s / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            for session in self.sessions.expired():
                self.scenes.session_gone(session.id, forget=True)
                self.cast.session_gone(session.id, forget=True)
                self._voice_gone(session.id, forget=True)

    async def _trim_heap(self) -> None:
        """Give freed heap memory back to the system every `server.heap_trim_s`, until
        cancelled (in a thread: a trim walks the whole heap)."""
        while True:
            await asyncio.sleep(self.settings.server.heap_trim_s)
            await asyncio.to_thread(trim)

    async def _warm_at_start(self) -> None:
        try:
            seconds = await self.warmup([])
            log.info("warmed up in %.2f s", seconds)
        except (MythicError, TimeoutError):
            log.exception("warm-up failed; /readyz stays 503 until POST /v1/warmup succeeds")
            return
        # Then, in the background of a ready server, the first NPCs' prompts (server.warm_npcs),
        # behind every player's request.
        npcs = sorted(self.world.npcs)[: self.settings.server.warm_npcs]
        if not npcs:
            return
        started = time.perf_counter()
        try:
            await self.warm_npcs(npcs, Priority.BRONZE)
        except (MythicError, TimeoutError) as exc:
            log.warning("warming the NPCs' prompts stopped: %s", exc)
            return
        log.info("warmed %d NPCs' prompts in %.2f s", len(npcs), time.perf_counter() - started)

    # -- the world ----------------------------------------------------------------------------

    async def reload_world(self) -> dict[str, Any]:
        """Reload the world from its folder (in a worker thread) and put it in play.

        Raises:
            WorldLoadError: the world's cards are broken now; the old world stays in play.
            ToolArgumentError: a card names a tool that does not exist; likewise.
        """
        report = await asyncio.to_thread(self.knowledge.reload, check=self.cast.check_world)
        self.cast.reload_world()
        return {
            "world": self.knowledge.world.name,
            "generation": self.knowledge.generation,
            "chunks": report.chunks,
            "shards_changed": report.shards_changed,
            "embedded": report.embedded,
            "skipped": report.skipped,
            "seconds": round(report.seconds, 3),
        }

    async def _watch_world(self) -> None:
        """Reload the world when its files change, until cancelled."""
        await self.knowledge.watch(
            lambda _report: self.cast.reload_world(), check=self.cast.check_world
        )

    # -- sessions -----------------------------------------------------------------------------

    def _send(self, session_id: str, message: ServerMessage) -> None:
        """The cast's outbox: every NPC message to a session goes out here."""
        if (
            isinstance(message, LLMStreamDelta)
            and message.final
            and message.finish_reason != "tool_call"
        ):
            # The reply is over: so is its turn's `gateway` hop.
            self.traces.end(
                session_id, message.npc_id, message.turn_id, finish_reason=message.finish_reason
            )
        self.sessions.send(session_id, message)

    # -- the cast's ReplySink -----------------------------------------------------------------

    def first_token(self, session_id: str, npc_id: str, turn_id: str) -> None:
        """A reply's first token is about to go out: the observers are told."""
        for observer in self.observers:
            observer.first_token(session_id, npc_id, turn_id)

    def phrase(self, session_id: str, npc_id: str, turn_id: str, text: str) -> None:
        if self.replies is not None:
            self.replies.phrase(session_id, npc_id, turn_id, text)

    def reply_done(self, session_id: str, npc_id: str, turn_id: str, reason: str) -> None:
        if self.replies is not None:
            self.replies.reply_done(session_id, npc_id, turn_id, reason)

    def _voice_gone(self, session_id: str, *, forget: bool) -> None:
        if self.voice is not None and self._tasks is not None:
            self._tasks.create_task(self.voice.session_gone(session_id, forget=forget))

    def attach(self, session: Session, link: Link) -> None:
        """`link` now serves `session`; a link that held it before is closed."""
        old = self._links.get(session.id)
        if old is not None and old is not link:
            old.taken_over()
        self._links[session.id] = link
        session.connected = True
        session.detached_at = None
        session.overflowed = False
        session.on_overflow = link.too_slow

    def detach(self, session: Session, link: Link) -> None:
        """The link closed; the session waits `resume_ttl_s` for a resume."""
        if self._links.get(session.id) is link:
            del self._links[session.id]
            session.connected = False
            session.on_overflow = None
            session.detached_at = time.monotonic()
            self.scenes.session_gone(session.id, forget=False)
            self.cast.session_gone(session.id, forget=False)
            self._voice_gone(session.id, forget=False)

    def end_session(self, session: Session) -> None:
        self._links.pop(session.id, None)
        self.sessions.remove(session.id)
        self.scenes.session_gone(session.id, forget=True)
        self.cast.session_gone(session.id, forget=True)
        self._voice_gone(session.id, forget=True)

    # -- warming ------------------------------------------------------------------------------

    async def warmup(self, npcs: list[str]) -> float:
        """Run every engine once (and warm the listed NPCs' prompts: `warm_npcs`); seconds."""
        start = time.perf_counter()
        engines = {id(e): e for e in self.router.engines().values()}
        for engine in engines.values():
            request = GenerationRequest(
                npc_id="_warmup",
                session_id="_warmup",
                messages=[ChatMessage("system", "Say hi."), ChatMessage("user", "Hi")],
                priority=Priority.SILVER,
                sampling=KV_FILL,
            )
            await fill_kv(engine.submit(request))
        await self.warm_npcs(npcs)
        self.ready = True
        return time.perf_counter() - start

    async def warm_npcs(self, npcs: list[str], priority: Priority = Priority.SILVER) -> None:
        """Evaluate each NPC's persona prompt and, where the model decides lines
        (`dialogue.decider`), its decision prompt (its tools and the scene, on the engine that
        decides), kept as shared prefixes: a session's first line starts from them instead of
        ~300 cold tokens each. Else the line classifier is built."""
        if self.engine is None:
            return
        # The line classifier's examples are embedded once, here rather than at a first line.
        decide_on_model = self.settings.dialogue.decide and (
            await asyncio.to_thread(self.cast.classifier) is None
        )
        for npc_id in npcs:
            actor = self.cast.actor(npc_id)
            request = GenerationRequest(
                npc_id=npc_id,
                session_id="_warmup",
                messages=[actor.system, ChatMessage("user", "...")],
                priority=priority,
                sampling=KV_FILL,
                keep_session=False,
            )
            await fill_kv(self.engine.submit(request))
            if decide_on_model:
                decision = actor.decision_request("_warmup", "...", tools=True)
                decision.priority, decision.sampling = priority, KV_FILL
                decision.keep_session = False
                try:
                    await fill_kv(
                        await self.router.open(
                            decision, "tool_decision", archetype=actor.persona.archetype
                        )
                    )
                except (RequestError, EngineError) as exc:
                    log.warning("warm-up of %s's decision failed: %s", npc_id, exc)
            if npc_id not in self.warmed:
                self.warmed.append(npc_id)

    # -- HTTP turns ---------------------------------------------------------------------------

    async def say(self, npc_id: str, body: SayRequest) -> SayReply:
        """One HTTP turn: the line goes through the NPC's actor like a WebSocket one, without
        tools (HTTP cannot acknowledge them).

        Raises:
            UnknownNPCError: no such NPC.
            MailboxFullError: the NPC has too many lines waiting.
            ReplyTimeoutError: the reply did not finish in 120 s.
        """
        actor = self.cast.actor(npc_id)
        session_id = f"http.{body.session_id}" if body.session_id else None
        session = self.sessions.get(session_id) if session_id else None
        if session is None:
            # A named HTTP conversation keeps its id, and so its history, across calls.
            session = self.sessions.open(body.player_id, prefix="http", session_id=session_id)
        turn_id = f"h-{time.monotonic_ns()}"
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        pieces: list[str] = []

        def listen(message: ServerMessage) -> None:
            if isinstance(message, LLMStreamDelta) and message.turn_id == turn_id:
                pieces.append(message.delta)
                if message.final and message.finish_reason != "tool_call" and not done.done():
                    done.set_result(message.finish_reason or "stop")

        session.listeners.append(listen)
        session.detached_at = None  # not reaped while a line is in flight, however long
        self.traces.begin(session.id, npc_id, turn_id, source="http", text_chars=len(body.text))
        failed: str | None = "refused"
        try:
            line = PlayerUtterance(
                npc_id=npc_id, session_id=session.id, turn_id=turn_id, text=body.text
            )
            self.cast.deliver(session.id, line, tools=False, player_id=session.player_id)
            async with asyncio.timeout(_SAY_TIMEOUT_S):
                finish = await done
            failed = None
        except TimeoutError:
            failed = "timed out"
            raise ReplyTimeoutError(
                f"the NPC did not finish its reply in {_SAY_TIMEOUT_S:.0f} s"
            ) from None
        finally:
            self.traces.end(session.id, npc_id, turn_id, error=failed)
            session.listeners.remove(listen)
            session.detached_at = time.monotonic()
            if body.session_id is None:
                self.sessions.remove(session.id)
                self.cast.session_gone(session.id, forget=True)
        record: TurnRecord | None = actor.last_turn
        ours = record is not None and record.turn_id == turn_id
        intent = record.intent if record is not None and ours else None
        return SayReply(
            npc_id=npc_id,
            session_id=body.session_id or session.id,
            turn_id=turn_id,
            text="".join(pieces).strip(),
            finish_reason=finish,
            intent=intent,
            caught=list(record.caught) if record is not None and ours else [],
            safety=list(record.safety) if record is not None and ours else [],
        )


def open_traces(settings: ObservabilitySettings) -> Traces:
    """A server's traces as `settings` say: the last `recent_turns` kept, exported over
    OTLP/HTTP when an endpoint is configured (or named by the standard variables)."""
    return Traces(
        url=settings.traces_url(),
        headers=settings.otlp_headers or None,
        timeout_s=settings.otlp_timeout_s,
        service_name=settings.service_name,
        keep=settings.recent_turns,
    )


async def _start_voice(voice: VoiceHub) -> None:
    """Load the speech models in their worker processes; voice sessions wait for it."""
    try:
        await voice.start()
    except MythicError as exc:
        log.error("speech did not start: %s", exc)
