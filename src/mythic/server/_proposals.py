"""What the `game-state` MCP server reads and writes beyond the core HTTP API: snapshots of
the open group scenes (`GET /v1/scenes`), and events proposed from outside the game (its
`propose_event`), never applied by Mythic, only queued for the game to read and arbitrate.

The proposal queue is bounded and in memory: a proposal is a suggestion, not state. The game
polls `GET /v1/proposals?after=N` with the last id it has seen and decides what happens; when
it falls behind by more than the queue holds, the oldest proposals are dropped and counted.
Bronze jobs are not the place for them: a job is work for a model, and its artifact is applied
to the world's lore; a proposal is a decision the game alone makes.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mythic.scenes import Scene
from mythic.server._app import Gateway

MAX_PROPOSALS = 256
"""Proposals kept for the game to read."""

MAX_DATA_BYTES = 4096


class EventProposal(BaseModel):
    """`POST /v1/proposals`: an event someone proposes the game make happen."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")
    """What sort of event, in the game's words: `spawn`, `quest.offer`, `weather`, ..."""
    description: str = Field(min_length=1, max_length=2000)
    """What should happen, for the game (or its designer) to judge."""
    npc_id: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    """The NPC it concerns, if one: it must be one of the world's."""
    data: dict[str, Any] = Field(default_factory=dict)
    """The game's own fields for the event (at most 4 KB of JSON)."""
    source: str = Field(default="mcp", min_length=1, max_length=64)
    """Who proposes it (an MCP client's name)."""

    @field_validator("data")
    @classmethod
    def _small(cls, data: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(data)) > MAX_DATA_BYTES:
            raise ValueError(f"data is over {MAX_DATA_BYTES} bytes of JSON")
        return data


@dataclass(slots=True)
class ProposalQueue:
    """The bounded queue of proposals, oldest first; ids count up from 1."""

    capacity: int = MAX_PROPOSALS
    items: deque[dict[str, Any]] = field(default_factory=deque)
    last_id: int = 0
    dropped: int = 0

    def add(self, proposal: EventProposal) -> dict[str, Any]:
        """Queue `proposal`; the oldest goes when the queue is full."""
        self.last_id += 1
        item = {
            "proposal_id": self.last_id,
            "received_at": time.time(),
            "status": "proposed",
            **proposal.model_dump(),
        }
        if len(self.items) >= self.capacity:
            self.items.popleft()
            self.dropped += 1
        self.items.append(item)
        return item

    def since(self, after: int, limit: int) -> list[dict[str, Any]]:
        """Proposals with an id above `after`, oldest first, at most `limit`."""
        return [p for p in self.items if p["proposal_id"] > after][:limit]


proposal_routes = APIRouter()


def _queue(request: Request) -> ProposalQueue:
    queue: ProposalQueue = request.app.state.proposals
    return queue


@proposal_routes.post("/v1/proposals", status_code=202)
async def propose(request: Request, body: EventProposal) -> dict[str, Any]:
    """Queue an event for the game to arbitrate; nothing in the world changes."""
    gateway: Gateway = request.app.state.gateway
    if body.npc_id is not None and body.npc_id not in gateway.world.npcs:
        raise HTTPException(404, f"no NPC {body.npc_id!r} in world {gateway.world.name!r}")
    return _queue(request).add(body)


@proposal_routes.get("/v1/proposals")
async def proposals(
    request: Request,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PROPOSALS)] = 100,
) -> dict[str, Any]:
    """Proposals after the id `after`, oldest first: what the game has not read yet."""
    queue = _queue(request)
    return {
        "proposals": queue.since(after, limit),
        "last_id": queue.last_id,
        "dropped": queue.dropped,
    }


MAX_SCENE_LINES = 50
"""The last lines of a scene a snapshot shows."""


def scene_status(scene: Scene, lines: int = MAX_SCENE_LINES) -> dict[str, Any]:
    """A scene as the API shows it: members, who is speaking, its last `lines` lines."""
    speaking = scene.speaking
    return {
        "scene_id": scene.id,
        "npcs": list(scene.npcs),
        "sessions": list(scene.sessions),
        "max_exchanges": scene.max_exchanges,
        "speaking": (
            {"npc_id": speaking[0], "session_id": speaking[1], "turn_id": speaking[2]}
            if speaking
            else None
        ),
        "lines": [
            {
                "speaker": r.speaker,
                "turn_id": r.turn_id,
                "text": r.text,
                "heard_by": sorted(r.heard_by),
            }
            for r in list(scene.log)[-lines:]
        ],
    }


@proposal_routes.get("/v1/scenes")
async def scenes(request: Request) -> dict[str, Any]:
    """The open group scenes: members, who is speaking, their last lines."""
    gateway: Gateway = request.app.state.gateway
    return {"scenes": [scene_status(s) for _, s in sorted(gateway.scenes.scenes.items())]}


@proposal_routes.get("/v1/scenes/{scene_id}")
async def scene(request: Request, scene_id: str) -> dict[str, Any]:
    """One open scene."""
    gateway: Gateway = request.app.state.gateway
    found = gateway.scenes.scenes.get(scene_id)
    if found is None:
        raise HTTPException(404, f"no open scene {scene_id!r}")
    return scene_status(found)


def mount_proposals(app: FastAPI) -> None:
    """Give `app` its proposal queue, and the proposal and scene routes."""
    app.state.proposals = ProposalQueue()
    app.include_router(proposal_routes)
