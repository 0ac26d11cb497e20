"""The gateway: the FastAPI app that puts a world's NPCs on WebSocket and HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, HTTPException, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from mythic._errors import MythicError
from mythic.archetypes import REGISTRY_FILE, ChainRouter, RegistryError, open_registry
from mythic.config import MythicSettings
from mythic.contracts import MAX_TEXT_CHARS, LLMStreamDelta, PlayerUtterance, ServerMessage
from mythic.dialogue import (
    Cast,
    MailboxFullError,
    ReplySink,
    ToolArgumentError,
    TurnRecord,
    UnknownNPCError,
)
from mythic.engine import (
    ChatMessage,
    Engine,
    EngineError,
    GenerationRequest,
    Priority,
    RequestError,
    ResidentAdapters,
    Sampling,
)
from mythic.jobs import (
    Artifact,
    ArtifactFollower,
    Job,
    JobError,
    JobQueue,
    JobStoreError,
    JobWorker,
    check_world_refs,
    validate_job,
)
from mythic.knowledge import Knowledge, World, WorldLoadError, approx_tokens
from mythic.memory import CardError, Memory, MemoryStoreError
from mythic.route import Router, local_router
from mythic.server._sessions import Session, Sessions

if TYPE_CHECKING:
    from mythic.server._provision import Provisioner
    from mythic.server._socket import Connection
    from mythic.server._voice import VoiceHub

log = logging.getLogger(__name__)

_REGISTRY_TIMEOUT_S = 10.0
"""Longest wait for the archetype registry at start (a Redis that does not answer)."""


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


JobStatusName = Literal["queued", "running", "done", "dead"]


class JobRequest(BaseModel):
    """`POST /v1/jobs`: a bronze job."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, max_length=32)
    """`lore`, `quest` or `summary`."""
    payload: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    """Idempotency key: submitting it again returns the job already queued."""


class WarmupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    npcs: list[str] = Field(default_factory=list, max_length=256)
    """NPCs whose persona prompts to evaluate now, so their first turns start from cache."""


class Gateway:
    """What the app's routes share: settings, the world, the router, the cast, the sessions."""

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
    ) -> None:
        """Requests go through `router` (tiers, endpoints, fallback); without one, every tier
        runs on `engine`, gold on `intent_engine` when given. `jobs`: the bronze job queue
        (the app runs `jobs.workers` workers and applies artifacts to the knowledge; None: no
        jobs). `replies` receives each reply phrase by phrase (default: the voice layer, when
        `speech.enabled`). `memory`: the NPCs remember players across sessions (the app starts
        and closes it). `knowledge`: persona, lore and packing (None: built here from
        `settings.knowledge`, counting tokens with the dialogue model's tokenizer). `chains`:
        the archetype adapters NPCs are served with (None: built here from
        `settings.archetypes`, on the embedded engines; the app reads the registry at start,
        rereads it every `archetypes.refresh_s` and closes it).

        Raises:
            MissingExtraError: the retrieval mode needs the rag extra, which is missing.
        """
        self.settings = settings
        if router is None:
            if engine is None:
                raise ValueError("give an engine or a router")
            router = local_router(settings, engine, intent_engine)
        self.router = router
        self.engine = engine or router.engine_for("dialogue")
        """The dialogue tier's embedded engine (None when dialogue is remote only)."""
        if knowledge is None:
            count = token_counter(self.engine) if self.engine is not None else approx_tokens
            knowledge = Knowledge(world, settings.knowledge, count=count)
        self.knowledge = knowledge
        self.jobs = jobs
        self.workers: list[JobWorker] = []
        self.follower = (
            ArtifactFollower(jobs, knowledge, poll_s=settings.jobs.poll_s) if jobs else None
        )
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
        self.cast = Cast(
            world,
            router,
            settings,
            self.send,
            replies=replies,
            memory=memory,
            knowledge=knowledge,
            chains=self.chains,
        )
        self.voice: VoiceHub | None = None
        """Speech in and out for voice sessions; None when `speech.enabled` is false."""
        if settings.speech.enabled:
            from mythic.server._voice import VoiceHub

            self.voice = VoiceHub(settings, self.send, self.cast)
            if replies is None:
                self.cast.replies = self.voice
        self.ready = False
        self.warmed: list[str] = []
        """NPCs whose prompts were warmed (`warm_npcs`), in order."""
        self.started = time.monotonic()
        self._connections: dict[str, Connection] = {}
        self._voice_tasks: set[asyncio.Task[None]] = set()

    @property
    def world(self) -> World:
        """The world in play: the last one loaded or reloaded."""
        return self.cast.world

    async def reload_world(self) -> dict[str, Any]:
        """Reload the world from its folder (in a worker thread) and put it in play.

        Raises:
            WorldLoadError: the world's cards are broken now; the old world stays in play.
            ToolArgumentError: a card names a tool that does not exist; likewise.
        """
        report = await asyncio.to_thread(self.knowledge.reload, check=self.cast.check_world)
        self.cast.reload_world()
        return _report(self.knowledge, report)

    async def watch_world(self) -> None:
        """Reload the world when its files change, until cancelled."""
        await self.knowledge.watch(
            lambda _report: self.cast.reload_world(), check=self.cast.check_world
        )

    def start_jobs(self, tasks: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Start the artifact follower and `jobs.workers` bronze workers."""
        if self.jobs is None or self.follower is None:
            return []
        follower = self.follower
        started = [tasks.create_task(follower.run(), name="mythic-artifacts")]

        def done(_job: Job, _artifact: Artifact) -> None:
            follower.wake()

        for i in range(self.settings.jobs.workers):
            worker = JobWorker(
                self.jobs,
                self.router,
                lambda: self.world,
                self.settings.jobs,
                name=f"server-{i}",
                on_done=done,
            )
            self.workers.append(worker)
            started.append(tasks.create_task(worker.run(), name=f"mythic-worker-{i}"))
        return started

    async def submit_job(self, kind: str, payload: object, job_id: str | None) -> dict[str, Any]:
        """Queue a bronze job (idempotent by `job_id`) and wake a worker.

        Raises:
            JobError: unknown kind, invalid payload, or an NPC or zone the world lacks.
            JobStoreError: the queue cannot be reached.
        """
        assert self.jobs is not None
        data = validate_job(kind, payload)
        check_world_refs(data, self.world)
        job, created = await self.jobs.submit(kind, data, job_id=job_id)
        for worker in self.workers:
            worker.wake()
        return {**self.job_status(job, None), "created": created}

    def job_status(self, job: Job, artifact: Artifact | None) -> dict[str, Any]:
        applied = self.follower is not None and job.job_id in self.follower.applied
        return {
            **job.to_dict(),
            "artifact": artifact.to_dict() if artifact else None,
            "applied": applied,
        }

    def send(self, session_id: str, message: ServerMessage) -> None:
        if (
            self.voice is not None
            and isinstance(message, LLMStreamDelta)
            and message.seq == 0
            and not message.final
        ):
            self.voice.first_delta(session_id, message.turn_id)
        self.sessions.send(session_id, message)

    def _voice_gone(self, session_id: str, *, forget: bool) -> None:
        if self.voice is not None:
            task = asyncio.get_running_loop().create_task(
                self.voice.session_gone(session_id, forget=forget)
            )
            self._voice_tasks.add(task)
            task.add_done_callback(self._voice_tasks.discard)

    def attach(self, session: Session, connection: Connection) -> None:
        """`connection` now serves `session`; a connection that held it before is closed."""
        from mythic.server._socket import TAKEN_OVER, TRY_AGAIN_LATER

        old = self._connections.get(session.id)
        if old is not None and old is not connection:
            old.session = None
            old.kick(TAKEN_OVER)
        self._connections[session.id] = connection
        session.connected = True
        session.detached_at = None
        session.overflowed = False
        session.on_overflow = lambda: connection.kick(TRY_AGAIN_LATER)

    def detach(self, session: Session, connection: Connection) -> None:
        """The connection closed; the session waits `resume_ttl_s` for a resume."""
        if self._connections.get(session.id) is connection:
            del self._connections[session.id]
            session.connected = False
            session.on_overflow = None
            session.detached_at = time.monotonic()
            self.cast.session_gone(session.id, forget=False)
            self._voice_gone(session.id, forget=False)

    def end_session(self, session: Session) -> None:
        self._connections.pop(session.id, None)
        self.sessions.remove(session.id)
        self.cast.session_gone(session.id, forget=True)
        self._voice_gone(session.id, forget=True)

    async def reap(self) -> None:
        """Forget sessions whose resume window has passed, until cancelled."""
        interval = max(0.05, min(self.settings.server.resume_ttl_s / 4, 5.0))
        while True:
            await asyncio.sleep(interval)
            for session in self.sessions.expired():
                self.cast.session_gone(session.id, forget=True)
                self._voice_gone(session.id, forget=True)

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
                sampling=Sampling(max_tokens=1, temperature=0.0),
            )
            async with engine.submit(request) as stream:
                await stream.collect()
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
        once = Sampling(max_tokens=1, temperature=0.0)
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
                sampling=once,
                keep_session=False,
            )
            async with self.engine.submit(request) as stream:
                await stream.collect()
            if decide_on_model:
                decision = actor.decision_request("_warmup", "...", tools=True)
                decision.priority, decision.sampling = priority, once
                decision.keep_session = False
                try:
                    await self.router.complete(
                        decision, "tool_decision", archetype=actor.persona.archetype
                    )
                except (RequestError, EngineError) as exc:
                    log.warning("warm-up of %s's decision failed: %s", npc_id, exc)
            if npc_id not in self.warmed:
                self.warmed.append(npc_id)

    async def say(self, npc_id: str, body: SayRequest) -> SayReply:
        """One HTTP turn: the line goes through the NPC's actor like a WebSocket one, without
        tools (HTTP cannot acknowledge them)."""
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
        try:
            line = PlayerUtterance(
                npc_id=npc_id, session_id=session.id, turn_id=turn_id, text=body.text
            )
            self.cast.deliver(session.id, line, tools=False, player_id=session.player_id)
            async with asyncio.timeout(120):
                finish = await done
        finally:
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
        )

    def npc_status(self, npc_id: str) -> dict[str, Any]:
        persona = self.world.npc(npc_id)
        actor = self.cast.actors.get(npc_id)
        status: dict[str, Any] = {
            "npc_id": npc_id,
            "name": persona.name,
            "archetype": persona.archetype,
            "zone": persona.zone,
            "active": actor is not None,
            "state": actor.state.value if actor else "idle",
        }
        if actor is not None:
            status |= {
                "busy_session": actor.busy_session,
                "sessions": sorted(actor.histories),
                "history_messages": {k: len(v) for k, v in actor.histories.items()},
                "scene": {
                    "zone": actor.scene.zone,
                    "time": actor.scene.time,
                    "objects": [o.model_dump() for o in actor.scene.objects],
                },
                "memory": actor.remembered(),
                "context": actor.last_context.content if actor.last_context else None,
                "last_intent": actor.last_intent.model_dump() if actor.last_intent else None,
                "last_turn": (
                    {
                        "session_id": actor.last_turn.session_id,
                        "turn_id": actor.last_turn.turn_id,
                        "finish_reason": actor.last_turn.finish,
                        "intent": actor.last_turn.intent,
                        "tool_calls": actor.last_turn.tool_calls,
                        "caught": actor.last_turn.caught,
                    }
                    if actor.last_turn
                    else None
                ),
            }
        return status


def open_chains(settings: MythicSettings, world: World, router: Router) -> ChainRouter | None:
    """The archetype chain router of `settings.archetypes.registry` (default: the world's
    `archetypes.yaml`, when there is one), with resident adapters on each embedded engine under
    `engine.adapter_budget_mb`; None when there is no registry. Reads nothing yet."""
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


async def _read_chains(chains: ChainRouter) -> None:
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


def token_counter(engine: Engine) -> Callable[[str], int]:
    """Tokens of a text in the engine's model: the budgets of context packing."""
    backend = engine.backend

    def count(text: str) -> int:
        return len(backend.tokenize(text, add_special=False, parse_special=False)) if text else 0

    return count


def _report(knowledge: Knowledge, report: Any) -> dict[str, Any]:
    return {
        "world": knowledge.world.name,
        "generation": knowledge.generation,
        "chunks": report.chunks,
        "shards_changed": report.shards_changed,
        "embedded": report.embedded,
        "skipped": report.skipped,
        "seconds": round(report.seconds, 3),
    }


async def _start_voice(voice: VoiceHub) -> None:
    """Load the speech models in their worker processes; voice sessions wait for it."""
    try:
        await voice.start()
    except MythicError as exc:
        log.error("speech did not start: %s", exc)


async def _warm(gateway: Gateway) -> None:
    try:
        seconds = await gateway.warmup([])
        log.info("warmed up in %.2f s", seconds)
    except (MythicError, TimeoutError):
        log.exception("warm-up failed; /readyz stays 503 until POST /v1/warmup succeeds")
        return
    # Then, in the background of a ready server, the first NPCs' prompts (server.warm_npcs),
    # behind every player's request.
    npcs = sorted(gateway.world.npcs)[: gateway.settings.server.warm_npcs]
    if not npcs:
        return
    started = time.perf_counter()
    try:
        await gateway.warm_npcs(npcs, Priority.BRONZE)
    except (MythicError, TimeoutError) as exc:
        log.warning("warming the NPCs' prompts stopped: %s", exc)
        return
    log.info("warmed %d NPCs' prompts in %.2f s", len(npcs), time.perf_counter() - started)


def create_app(gateway: Gateway, *, warm: bool = True) -> FastAPI:
    """The FastAPI app of `gateway`. With `warm`, the engines are warmed at startup and
    `/readyz` turns 200 when that is done."""
    from mythic.server._metrics import render_metrics
    from mythic.server._socket import Connection

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if gateway.memory is not None:
            await gateway.memory.start()
        gateway.router.start()
        try:
            if gateway.chains is not None:
                await _read_chains(gateway.chains)
            async with asyncio.TaskGroup() as tasks:
                jobs = gateway.start_jobs(tasks)
                reaper = tasks.create_task(gateway.reap())
                warming = tasks.create_task(_warm(gateway)) if warm else None
                voice = gateway.voice
                hearing = tasks.create_task(_start_voice(voice)) if voice is not None else None
                watcher = (
                    tasks.create_task(gateway.watch_world())
                    if gateway.settings.knowledge.watch
                    else None
                )
                refresh_s = gateway.settings.archetypes.refresh_s
                following = (
                    tasks.create_task(gateway.chains.follow(refresh_s))
                    if gateway.chains is not None and refresh_s > 0
                    else None
                )
                provisioning = (
                    tasks.create_task(gateway.provisioner.run())
                    if gateway.provisioner is not None
                    else None
                )
                try:
                    yield
                finally:
                    for task in jobs:
                        task.cancel()
                    reaper.cancel()
                    if watcher is not None:
                        watcher.cancel()
                    if warming is not None:
                        warming.cancel()
                    if hearing is not None:
                        hearing.cancel()
                    if following is not None:
                        following.cancel()
                    if provisioning is not None:
                        provisioning.cancel()
                    await gateway.cast.aclose()
                    if voice is not None:
                        await voice.aclose()
        finally:
            if gateway.chains is not None:
                await gateway.chains.aclose()
            if gateway.jobs is not None:
                await gateway.jobs.aclose()
            await gateway.router.aclose()
            if gateway.memory is not None:
                await gateway.memory.aclose()

    app = FastAPI(
        title="Mythic",
        summary="NPCs that talk, remember and act: the v1 protocol over WebSocket and HTTP.",
        lifespan=lifespan,
    )
    app.state.gateway = gateway

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """The process is up."""
        return {"status": "ok", "uptime_s": round(time.monotonic() - gateway.started, 1)}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """200 once the model is loaded and warmed (and the speech models, when speech is
        on), 503 before."""
        engine = gateway.engine
        voice = gateway.voice
        ready = gateway.ready and (voice is None or voice.ready)
        body = {
            "ready": ready,
            "model": engine.backend.name if engine is not None else None,
            "tiers": {name: tier.endpoints for name, tier in gateway.router.route.tiers.items()},
            "speech": None if voice is None else {"ready": voice.ready, **voice.tts.engines},
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.post("/v1/warmup")
    async def warmup(body: WarmupRequest | None = None) -> dict[str, Any]:
        """Warm the engines, and the persona prompts of `npcs`."""
        npcs = body.npcs if body else []
        for npc_id in npcs:
            _known(npc_id)
        seconds = await gateway.warmup(npcs)
        return {"ready": True, "seconds": round(seconds, 3), "npcs": npcs}

    @app.get("/v1/npcs")
    async def npcs() -> dict[str, Any]:
        """Every NPC of the world, with its dialogue state."""
        return {"npcs": [gateway.npc_status(npc_id) for npc_id in sorted(gateway.world.npcs)]}

    def _known(npc_id: str) -> None:
        if npc_id not in gateway.world.npcs:
            raise HTTPException(404, f"no NPC {npc_id!r} in world {gateway.world.name!r}")

    @app.get("/v1/npcs/{npc_id}")
    async def npc(npc_id: str) -> dict[str, Any]:
        """One NPC's state: dialogue state, sessions, scene, last intent and turn."""
        _known(npc_id)
        return gateway.npc_status(npc_id)

    @app.post("/v1/npcs/{npc_id}/say")
    async def say(npc_id: str, body: SayRequest) -> SayReply:
        """Say one line to an NPC and get the whole reply (no streaming, no tools)."""
        _known(npc_id)
        try:
            return await gateway.say(npc_id, body)
        except UnknownNPCError as exc:
            raise HTTPException(404, exc.message) from None
        except MailboxFullError as exc:
            raise HTTPException(429, exc.message) from None
        except TimeoutError:
            raise HTTPException(504, "the NPC did not finish its reply in 120 s") from None

    @app.post("/v1/world/reload")
    async def world_reload() -> dict[str, Any]:
        """Reload the world's cards and lore from disk; the next turn of every NPC uses them.
        Broken cards: 422 with every problem, and the old world stays in play. Lore files
        that cannot be used are listed in `skipped` and left out."""
        try:
            return await gateway.reload_world()
        except WorldLoadError as exc:
            problems = [str(p) for p in exc.problems]
            raise HTTPException(422, {"message": exc.message, "problems": problems}) from None
        except ToolArgumentError as exc:
            raise HTTPException(422, {"message": exc.message, "problems": [exc.message]}) from None

    @app.get("/v1/world")
    async def world_status() -> dict[str, Any]:
        """The world in play: its NPCs, zones, indexed chunks and skipped lore files."""
        knowledge = gateway.knowledge
        return {
            "name": gateway.world.name,
            "path": str(gateway.world.path),
            "npcs": sorted(gateway.world.npcs),
            "zones": sorted(gateway.world.card.zones),
            "lore_documents": len(gateway.world.lore),
            "chunks": knowledge.chunks,
            "generation": knowledge.generation,
            "retrieval": knowledge.settings.retrieval,
            "skipped": [str(p) for p in gateway.world.skipped],
            "last_reload_error": knowledge.stats.last_reload_error,
        }

    def _memory() -> Memory:
        if gateway.memory is None:
            raise HTTPException(404, "memory is off on this server (memory.enabled: false)")
        return gateway.memory

    @app.get("/v1/memory/{player_id}")
    async def memory_show(player_id: str) -> dict[str, Any]:
        """Everything the NPCs remember of a player, per tier (hot, warm, cold)."""
        try:
            return await _memory().show(player_id)
        except MemoryStoreError as exc:
            raise HTTPException(503, exc.message) from None

    @app.delete("/v1/memory/{player_id}")
    async def memory_forget(player_id: str) -> dict[str, Any]:
        """Delete everything about a player in every tier."""
        try:
            return {"player_id": player_id, "deleted": await _memory().forget(player_id)}
        except MemoryStoreError as exc:
            raise HTTPException(503, exc.message) from None

    @app.put("/v1/npcs/{npc_id}/memory/{player_id}/cards/{name}")
    async def memory_card(
        npc_id: str, player_id: str, name: str, card: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace the relationship or quest card an NPC keeps of a player (≤ 2 KB: the
        oldest list entries are trimmed to fit; malformed cards get 422)."""
        _known(npc_id)
        try:
            stored = _memory().set_card(npc_id, player_id, card, name=name)
        except CardError as exc:
            raise HTTPException(422, exc.message) from None
        return {"npc_id": npc_id, "player_id": player_id, "name": name, **stored.model_dump()}

    def _jobs() -> JobQueue:
        if gateway.jobs is None:
            raise HTTPException(404, "bronze jobs are off on this server")
        return gateway.jobs

    @app.post("/v1/jobs", status_code=202)
    async def jobs_submit(body: JobRequest) -> dict[str, Any]:
        """Queue a bronze job: `lore` (worldbuilding), `quest` (storyteller) or `summary`.
        The same `job_id` again returns the job already queued."""
        _jobs()
        try:
            return await gateway.submit_job(body.kind, body.payload, body.job_id)
        except JobError as exc:
            raise HTTPException(422, exc.message) from None
        except JobStoreError as exc:
            raise HTTPException(503, exc.message) from None

    @app.get("/v1/jobs")
    async def jobs_list(status: JobStatusName | None = None, limit: int = 100) -> dict[str, Any]:
        """Jobs, newest first; `status=dead` is the dead-letter list."""
        try:
            found = await _jobs().list(status, limit=max(1, min(limit, 1000)))
        except JobStoreError as exc:
            raise HTTPException(503, exc.message) from None
        return {"jobs": [gateway.job_status(job, None) for job in found]}

    @app.get("/v1/jobs/{job_id}")
    async def jobs_show(job_id: str) -> dict[str, Any]:
        """One job, its artifact, and whether the NPCs know it yet (`applied`)."""
        try:
            found = await _jobs().get(job_id)
        except JobStoreError as exc:
            raise HTTPException(503, exc.message) from None
        if found is None:
            raise HTTPException(404, f"no job {job_id!r}")
        return gateway.job_status(*found)

    @app.get("/v1/usage")
    async def usage() -> dict[str, Any]:
        """Requests, tokens and model time per tier and per NPC since the server started."""
        return gateway.router.usage.summary()

    @app.get("/v1/route")
    async def route() -> dict[str, Any]:
        """Tiers and endpoints: health, breaker state, requests in flight."""
        router = gateway.router
        return {
            "tiers": {name: tier.model_dump() for name, tier in router.route.tiers.items()},
            "endpoints": {
                name: {
                    "kind": state.endpoint.kind,
                    "model": state.endpoint.settings.model,
                    "url": state.endpoint.settings.url,
                    "healthy": state.endpoint.healthy,
                    "breaker": state.breaker.state.value,
                    "outstanding": state.endpoint.outstanding,
                    "requests": state.requests,
                    "failures": state.failures,
                }
                for name, state in router.states.items()
            },
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        """Prometheus text exposition."""
        text, content_type = render_metrics(gateway)
        return PlainTextResponse(text, media_type=content_type)

    @app.websocket("/v1/ws")
    async def websocket(ws: WebSocket) -> None:
        """The v1 protocol: SessionStart first, then any client message for any NPC."""
        await ws.accept()
        await Connection(gateway, ws).serve()

    return app
