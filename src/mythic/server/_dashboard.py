"""`/dashboard`: a page to watch a running world (NPCs, sessions, tiers, latency percentiles,
recent turns with their traces), and `GET /v1/dashboard`, the JSON it polls.

The page's files (`dashboard/`) are read once, when this module is imported: a request never
waits on the disk. The JSON is built from what the gateway already holds in memory; nothing
here awaits the network, a disk or a database.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from mythic.observability import percentile
from mythic.route import BreakerState
from mythic.server._app import Gateway

if TYPE_CHECKING:
    from mythic.engine import Engine

_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css", ".js": "text/javascript"}


def _page_files() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("mythic.server") / "dashboard"
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


PAGE_FILES = _page_files()
"""The page's files by name: their bytes and content type."""

# The page loads only what Mythic serves: no inline script, no other origin.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
_SNIPPET_CHARS = 160
_MAX_TURNS = 200


@dataclass(slots=True)
class SeenTurn:
    """A finished turn the dashboard saw as an NPC's last turn."""

    npc_id: str
    session_id: str
    turn_id: str
    text: str
    finish: str
    intent: str | None
    caught: list[str]
    safety: list[str]
    """What the guardrails blocked in it (`TurnRecord.safety`)."""
    seen: float
    """Unix seconds when the dashboard first saw it."""


class TurnLog:
    """The turns the dashboard has seen, newest last, at most `limit`: each time the JSON is
    built, every NPC's last turn is added (a turn stays listed after the NPC's next one)."""

    def __init__(self, limit: int = _MAX_TURNS) -> None:
        self.limit = limit
        self.turns: OrderedDict[str, SeenTurn] = OrderedDict()

    def observe(self, gateway: Gateway) -> None:
        """Add each NPC's last turn, if it is new."""
        now = time.time()
        for npc_id, actor in sorted(gateway.cast.actors.items()):
            record = actor.last_turn
            if record is None or record.turn_id in self.turns:
                continue
            self.turns[record.turn_id] = SeenTurn(
                npc_id=npc_id,
                session_id=record.session_id,
                turn_id=record.turn_id,
                text=record.text,
                finish=str(record.finish),
                intent=record.intent,
                caught=list(record.caught),
                safety=list(record.safety),
                seen=now,
            )
            while len(self.turns) > self.limit:
                self.turns.popitem(last=False)


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _turn_log(request: Request) -> TurnLog:
    log: TurnLog | None = getattr(request.app.state, "dashboard_turns", None)
    if log is None:
        log = request.app.state.dashboard_turns = TurnLog()
    return log


Served = Annotated[Gateway, Depends(_gateway)]
Seen = Annotated[TurnLog, Depends(_turn_log)]

dashboard_routes = APIRouter()


def _file(name: str) -> Response:
    found = PAGE_FILES.get(name)
    if found is None:
        raise HTTPException(404, f"no dashboard file {name!r}")
    body, media_type = found
    return Response(body, media_type=media_type, headers=_HEADERS)


@dashboard_routes.get("/dashboard", include_in_schema=False)
async def dashboard_page() -> Response:
    """The dashboard page."""
    return _file("index.html")


@dashboard_routes.get("/dashboard/{name}", include_in_schema=False)
async def dashboard_file(name: str) -> Response:
    """One of the page's scripts or style sheets."""
    return _file(name)


@dashboard_routes.get("/v1/dashboard")
async def dashboard_data(
    gateway: Served, seen: Seen, turns: Annotated[int, Query(ge=1, le=_MAX_TURNS)] = 20
) -> dict[str, Any]:
    """What the dashboard shows: the world's NPCs, sessions, tiers, engines, latency
    percentiles and the last `turns` turns, newest first, with their traces."""
    seen.observe(gateway)
    return snapshot(gateway, seen, turns)


def _ms(samples: list[float]) -> dict[str, Any]:
    """p50/p95 in milliseconds of samples in seconds, and their count."""
    p50, p95 = percentile(samples, 0.5), percentile(samples, 0.95)
    return {
        "p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "p95_ms": None if p95 is None else round(p95 * 1000, 1),
        "samples": len(samples),
    }


def _latency(gateway: Gateway) -> dict[str, dict[str, Any]]:
    latency = {
        "first_token": _ms(list(gateway.cast.stats.first_tokens)),
        "retrieval": _ms(list(gateway.knowledge.stats.seconds)),
    }
    if gateway.voice is not None:
        traces = list(gateway.voice.stats.traces)
        latency["voice_first_token"] = _ms([t["first_token"] for t in traces if "first_token" in t])
        latency["first_audio"] = _ms([t["first_audio"] for t in traces if "first_audio" in t])
    else:
        latency["first_audio"] = _ms([])
    if gateway.memory is not None:
        latency["memory_prefetch"] = _ms(list(gateway.memory.stats.prefetch_seconds))
    return latency


def _npcs(gateway: Gateway) -> list[dict[str, Any]]:
    served: dict[str, set[str]] = {}
    for tier, npc, _kind in gateway.router.usage.rows:
        served.setdefault(npc, set()).add(tier)
    npcs = []
    for npc_id in sorted(gateway.world.npcs):
        persona = gateway.world.npc(npc_id)
        actor = gateway.cast.actors.get(npc_id)
        npcs.append(
            {
                "npc_id": npc_id,
                "name": persona.name,
                "archetype": persona.archetype,
                "zone": persona.zone,
                "active": actor is not None,
                "state": actor.state.value if actor is not None else "idle",
                "sessions": len(actor.histories) if actor is not None else 0,
                "tiers": sorted(served.get(npc_id, ())),
            }
        )
    return npcs


def _sessions(gateway: Gateway) -> list[dict[str, Any]]:
    talking: dict[str, list[str]] = {}
    for npc_id, actor in sorted(gateway.cast.actors.items()):
        for session_id in actor.histories:
            talking.setdefault(session_id, []).append(npc_id)
    listed = []
    for session_id, npcs in sorted(talking.items()):
        session = gateway.sessions.get(session_id)
        if session is None:  # a warm-up's, or one that has ended
            continue
        listed.append(
            {
                "session_id": session_id,
                "player_id": session.player_id,
                "connected": session.connected,
                "npcs": npcs,
            }
        )
    return listed


def _tiers(gateway: Gateway) -> list[dict[str, Any]]:
    router = gateway.router
    requests: dict[str, int] = {}
    for (tier_name, _npc, _kind), row in router.usage.rows.items():
        requests[tier_name] = requests.get(tier_name, 0) + row.requests
    tiers = []
    for name, tier in sorted(router.route.tiers.items()):
        endpoints = []
        for endpoint in tier.endpoints:
            state = router.states.get(endpoint)
            if state is None:
                continue
            endpoints.append(
                {
                    "name": endpoint,
                    "healthy": state.endpoint.healthy,
                    "breaker": state.breaker.state.value,
                    "outstanding": state.endpoint.outstanding,
                    "failures": state.failures,
                }
            )
        tiers.append({"name": name, "requests": requests.get(name, 0), "endpoints": endpoints})
    return tiers


def _engines(gateway: Gateway) -> list[dict[str, Any]]:
    """Each embedded engine once, named by the endpoints it serves (one engine may serve
    several)."""
    named: list[tuple[list[str], Engine]] = []
    for name, engine in sorted(gateway.router.engines().items()):
        shared = next((names for names, e in named if e is engine), None)
        if shared is None:
            named.append(([name], engine))
        else:
            shared.append(name)
    engines = []
    for names, engine in named:
        em = engine.metrics()
        engines.append(
            {
                "name": ", ".join(names),
                "running": em.running,
                "waiting": em.waiting,
                "tokens_per_s": round(em.tokens_per_s, 1),
                "generated_tokens": em.generated_tokens,
                "kv_used": round(em.kv_cells_reserved / em.kv_capacity, 3)
                if em.kv_capacity
                else None,
            }
        )
    return engines


def _recent(gateway: Gateway, seen: TurnLog, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` turns: those traced and those seen as an NPC's last turn (with its
    line and finish), joined by turn id."""
    rows: dict[str, dict[str, Any]] = {}
    for turn in seen.turns.values():
        rows[turn.turn_id] = {
            "npc_id": turn.npc_id,
            "session_id": turn.session_id,
            "turn_id": turn.turn_id,
            "text": turn.text[:_SNIPPET_CHARS],
            "finish": turn.finish,
            "intent": turn.intent,
            "caught": turn.caught,
            "safety": turn.safety,
            "at": round(turn.seen, 3),
            "trace": None,
        }
    for trace in gateway.traces.recent(limit):
        row = rows.setdefault(
            trace.turn_id,
            {
                "npc_id": trace.npc_id,
                "session_id": trace.session_id,
                "turn_id": trace.turn_id,
                "text": None,
                "finish": None,
                "intent": None,
                "caught": [],
                "safety": [],
            },
        )
        row["at"] = round(trace.started, 3)
        row["trace"] = {
            "trace_id": trace.trace_id,
            "spans": [{"name": n, "ms": round(ms, 1)} for n, ms in trace.spans],
        }
    newest = sorted(rows.values(), key=lambda r: r["at"], reverse=True)
    return newest[:limit]


def snapshot(gateway: Gateway, seen: TurnLog, turns: int = 20) -> dict[str, Any]:
    """The dashboard's JSON (`GET /v1/dashboard`)."""
    stats = gateway.cast.stats
    breakers_open = sum(
        1 for s in gateway.router.states.values() if s.breaker.state is not BreakerState.CLOSED
    )
    memory: dict[str, Any] | None = None
    if gateway.memory is not None:
        memory = {
            "warm_up": bool(getattr(gateway.memory.warm, "up", True)),
            "archive_down": gateway.memory.archiver.down,
            "archive_pending": gateway.memory.archiver.pending,
        }
    return {
        "world": gateway.world.name,
        "ready": gateway.ready,
        "uptime_s": round(time.monotonic() - gateway.started, 1),
        "traces_exported": gateway.traces.url is not None,
        "totals": {
            "turns": sum(stats.turns.values()),
            "turns_by_finish": dict(sorted(stats.turns.items())),
            "sessions": len(gateway.sessions),
            "connections": gateway.metrics.open_connections,
            "npc_actors": len(gateway.cast.actors),
            "errors": sum(gateway.metrics.errors.values()),
            "tool_calls": sum(stats.tool_calls.values()),
            "caught": sum(stats.caught.values()),
            "safety_violations": sum(stats.safety.values()),
            "breakers_open": breakers_open,
            "scenes": len(gateway.scenes.scenes),
        },
        "latency": _latency(gateway),
        "npcs": _npcs(gateway),
        "sessions": _sessions(gateway),
        "tiers": _tiers(gateway),
        "engines": _engines(gateway),
        "memory": memory,
        "turns": _recent(gateway, seen, turns),
    }
