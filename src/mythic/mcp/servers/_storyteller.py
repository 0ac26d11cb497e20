"""The `storyteller` MCP server: submit bronze jobs (worldbuilding lore, quests, summaries) to a
running Mythic server and read them back with their artifacts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from mythic.mcp.servers._common import READ_ONLY, MythicAPI, capped

SUBMIT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
"""`submit_job` adds a job (and, when done, lore the NPCs know): additive, not destructive."""

JobId = Annotated[
    str,
    Field(pattern=r"^[A-Za-z0-9_.:-]{1,128}$", description="A job's id (its idempotency key)."),
]


def storyteller_server(url: str, *, timeout_s: float = 10.0) -> MCPServer[None]:
    """The `storyteller` server of the Mythic server at `url` (`http://HOST:PORT`).

    Raises:
        ToolRefusedError: `url` is not an http(s) address.
    """
    api = MythicAPI(url, timeout_s=timeout_s)
    server: MCPServer[None] = MCPServer(
        "mythic-storyteller",
        instructions=(
            "Bronze jobs of a running Mythic world: lore (worldbuilding), quest (a quest an NPC "
            "offers) and summary. Jobs take seconds to minutes: submit, then read_job."
        ),
    )

    @server.tool(annotations=SUBMIT)
    async def submit_job(
        kind: Annotated[
            Literal["lore", "quest", "summary"],
            Field(description="lore: a lore entry; quest: a quest for an NPC; summary."),
        ],
        payload: Annotated[
            dict[str, Any] | None,
            Field(
                description="lore: topic, zone, hint; quest: npc_id, hint; summary: npc_id, "
                "player_id."
            ),
        ] = None,
        job_id: Annotated[
            str | None,
            Field(
                pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
                description="Idempotency key: the same id again returns the job already queued.",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Queue a bronze job; its artifact joins the world's lore when done."""
        body = {"kind": kind, "payload": payload or {}, "job_id": job_id}
        return capped(await api.call("POST", "/v1/jobs", body=body))

    @server.tool(annotations=READ_ONLY)
    async def list_jobs(
        status: Annotated[
            Literal["queued", "running", "done", "dead"] | None,
            Field(description="Only jobs in this state; dead: the dead letters."),
        ] = None,
        limit: Annotated[int, Field(ge=1, le=100)] = 20,
    ) -> dict[str, Any]:
        """Jobs, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        return capped(await api.call("GET", "/v1/jobs", params=params))

    @server.tool(annotations=READ_ONLY)
    async def read_job(job_id: JobId) -> dict[str, Any]:
        """One job: its state, attempts, error, artifact, and whether the NPCs know it yet."""
        return capped(await api.call("GET", f"/v1/jobs/{job_id}"))

    return server
