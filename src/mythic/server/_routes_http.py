"""The HTTP API of a gateway: health, NPCs, one-line turns, the world, memory, bronze jobs,
usage, tiers and metrics. Errors the gateway raises become HTTP answers through one table."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from mythic._errors import MythicError
from mythic.dialogue import MailboxFullError, ToolArgumentError, UnknownNPCError
from mythic.jobs import JobError, JobStoreError
from mythic.knowledge import WorldLoadError
from mythic.memory import CardError, Memory, MemoryStoreError
from mythic.server._app import Gateway, ReplyTimeoutError, SayReply, SayRequest
from mythic.server._jobs import JobBoard
from mythic.server._metrics import render_metrics

HTTP_STATUS: dict[type[MythicError], int] = {
    UnknownNPCError: 404,
    WorldLoadError: 422,
    ToolArgumentError: 422,
    CardError: 422,
    JobError: 422,
    MailboxFullError: 429,
    MemoryStoreError: 503,
    JobStoreError: 503,
    ReplyTimeoutError: 504,
}
"""The HTTP status of each error a route may raise (a subclass answers as its base)."""


async def refuse(_request: Request, exc: Exception) -> JSONResponse:
    """The app's handler of the errors in `HTTP_STATUS`: `{"detail": ...}` with the status.
    A world the server refuses lists its problems."""
    assert isinstance(exc, MythicError)
    status = next(HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS)
    detail: str | dict[str, Any] = exc.message
    if isinstance(exc, WorldLoadError):
        detail = {"message": exc.message, "problems": [str(p) for p in exc.problems]}
    elif isinstance(exc, ToolArgumentError):
        detail = {"message": exc.message, "problems": [exc.message]}
    return JSONResponse({"detail": detail}, status_code=status)


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


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


Served = Annotated[Gateway, Depends(_gateway)]

routes = APIRouter()


def _known(gateway: Gateway, npc_id: str) -> None:
    if npc_id not in gateway.world.npcs:
        raise HTTPException(404, f"no NPC {npc_id!r} in world {gateway.world.name!r}")


def _memory(gateway: Gateway) -> Memory:
    if gateway.memory is None:
        raise HTTPException(404, "memory is off on this server (memory.enabled: false)")
    return gateway.memory


def _jobs(gateway: Gateway) -> JobBoard:
    if gateway.jobs is None:
        raise HTTPException(404, "bronze jobs are off on this server")
    return gateway.jobs


@routes.get("/healthz")
async def healthz(gateway: Served) -> dict[str, Any]:
    """The process is up."""
    return {"status": "ok", "uptime_s": round(time.monotonic() - gateway.started, 1)}


@routes.get("/readyz")
async def readyz(gateway: Served) -> JSONResponse:
    """200 once the model is loaded and warmed (and the speech models, when speech is on),
    503 before."""
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


@routes.post("/v1/warmup")
async def warmup(gateway: Served, body: WarmupRequest | None = None) -> dict[str, Any]:
    """Warm the engines, and the persona prompts of `npcs`."""
    npcs = body.npcs if body else []
    for npc_id in npcs:
        _known(gateway, npc_id)
    seconds = await gateway.warmup(npcs)
    return {"ready": True, "seconds": round(seconds, 3), "npcs": npcs}


@routes.get("/v1/npcs")
async def npcs(gateway: Served) -> dict[str, Any]:
    """Every NPC of the world, with its dialogue state."""
    return {"npcs": [npc_status(gateway, npc_id) for npc_id in sorted(gateway.world.npcs)]}


@routes.get("/v1/npcs/{npc_id}")
async def npc(gateway: Served, npc_id: str) -> dict[str, Any]:
    """One NPC's state: dialogue state, sessions, scene, last intent and turn."""
    _known(gateway, npc_id)
    return npc_status(gateway, npc_id)


@routes.post("/v1/npcs/{npc_id}/say")
async def say(gateway: Served, npc_id: str, body: SayRequest) -> SayReply:
    """Say one line to an NPC and get the whole reply (no streaming, no tools)."""
    _known(gateway, npc_id)
    return await gateway.say(npc_id, body)


@routes.post("/v1/world/reload")
async def world_reload(gateway: Served) -> dict[str, Any]:
    """Reload the world's cards and lore from disk; the next turn of every NPC uses them.
    Broken cards: 422 with every problem, and the old world stays in play. Lore files that
    cannot be used are listed in `skipped` and left out."""
    return await gateway.reload_world()


@routes.get("/v1/world")
async def world_status(gateway: Served) -> dict[str, Any]:
    """The world in play: its NPCs, zones, indexed chunks and skipped lore files."""
    knowledge = gateway.knowledge
    world = gateway.world
    return {
        "name": world.name,
        "path": str(world.path),
        "npcs": sorted(world.npcs),
        "zones": sorted(world.card.zones),
        "lore_documents": len(world.lore),
        "chunks": knowledge.chunks,
        "generation": knowledge.generation,
        "retrieval": knowledge.settings.retrieval,
        "skipped": [str(p) for p in world.skipped],
        "last_reload_error": knowledge.stats.last_reload_error,
    }


@routes.get("/v1/memory/{player_id}")
async def memory_show(gateway: Served, player_id: str) -> dict[str, Any]:
    """Everything the NPCs remember of a player, per tier (hot, warm, cold)."""
    return await _memory(gateway).show(player_id)


@routes.delete("/v1/memory/{player_id}")
async def memory_forget(gateway: Served, player_id: str) -> dict[str, Any]:
    """Delete everything about a player in every tier."""
    return {"player_id": player_id, "deleted": await _memory(gateway).forget(player_id)}


@routes.put("/v1/npcs/{npc_id}/memory/{player_id}/cards/{name}")
async def memory_card(
    gateway: Served, npc_id: str, player_id: str, name: str, card: dict[str, Any]
) -> dict[str, Any]:
    """Replace the relationship or quest card an NPC keeps of a player (≤ 2 KB: the oldest
    list entries are trimmed to fit; malformed cards get 422)."""
    _known(gateway, npc_id)
    stored = _memory(gateway).set_card(npc_id, player_id, card, name=name)
    return {"npc_id": npc_id, "player_id": player_id, "name": name, **stored.model_dump()}


@routes.post("/v1/jobs", status_code=202)
async def jobs_submit(gateway: Served, body: JobRequest) -> dict[str, Any]:
    """Queue a bronze job: `lore` (worldbuilding), `quest` (storyteller) or `summary`. The
    same `job_id` again returns the job already queued."""
    return await _jobs(gateway).submit(body.kind, body.payload, body.job_id)


@routes.get("/v1/jobs")
async def jobs_list(
    gateway: Served, status: JobStatusName | None = None, limit: int = 100
) -> dict[str, Any]:
    """Jobs, newest first; `status=dead` is the dead-letter list."""
    jobs = _jobs(gateway)
    found = await jobs.queue.list(status, limit=max(1, min(limit, 1000)))
    return {"jobs": [jobs.status(job, None) for job in found]}


@routes.get("/v1/jobs/{job_id}")
async def jobs_show(gateway: Served, job_id: str) -> dict[str, Any]:
    """One job, its artifact, and whether the NPCs know it yet (`applied`)."""
    jobs = _jobs(gateway)
    found = await jobs.queue.get(job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return jobs.status(*found)


@routes.get("/v1/usage")
async def usage(gateway: Served) -> dict[str, Any]:
    """Requests, tokens and model time per tier and per NPC since the server started."""
    return gateway.router.usage.summary()


@routes.get("/v1/route")
async def route(gateway: Served) -> dict[str, Any]:
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


@routes.get("/metrics")
async def metrics(gateway: Served) -> PlainTextResponse:
    """Prometheus text exposition."""
    text, content_type = render_metrics(gateway)
    return PlainTextResponse(text, media_type=content_type)


def npc_status(gateway: Gateway, npc_id: str) -> dict[str, Any]:
    """An NPC as the API shows it: its card's name, archetype and zone, and, while its actor
    runs, its dialogue state, sessions, scene, memory, context and last intent and turn."""
    persona = gateway.world.npc(npc_id)
    actor = gateway.cast.actors.get(npc_id)
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
                "date": actor.scene.date,
                "said_date": actor.scene.said_date,
                "game_time": actor.scene.game_time,
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
                    "safety": actor.last_turn.safety,
                }
                if actor.last_turn
                else None
            ),
        }
    return status
