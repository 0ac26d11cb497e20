"""The `utilities` MCP server: the wall clock and the world's game calendar, fresh ids, and
the content filter."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from mythic.knowledge import Calendar, GameDateError, World
from mythic.mcp.servers._common import NPC_ID_PATTERN, READ_ONLY, ToolRefusedError, capped
from mythic.safety import Guard, SafetyPolicy

FRESH = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
"""Reads nothing and writes nothing, but answers anew each call (the clock, new ids)."""

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

GameDate = Annotated[
    str,
    Field(
        pattern=r"^\d{1,6}-\d{1,2}-\d{1,2}$",
        description="A date of the world's calendar: year-month-day, e.g. 612-11-3.",
    ),
]
GameClock = Annotated[
    str | None, Field(pattern=r"^\d{1,2}:\d{2}$", description="HH:MM; unset: midnight.")
]


def ulid(now_ms: int | None = None) -> str:
    """A ULID: 48 bits of milliseconds since the epoch and 80 random bits, 26 characters of
    Crockford base 32; ids made later sort after (to the millisecond)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    value = (ms & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -5, -5))


def utilities_server(world: World | None = None) -> MCPServer[None]:
    """The `utilities` server; `world` gives the game calendar and the content policy (else
    the defaults: the Gregorian months, a teen rating)."""
    calendar = world.card.calendar if world is not None else Calendar()
    of = f"world {world.name!r}" if world is not None else "no world (the defaults)"
    server: MCPServer[None] = MCPServer(
        "mythic-utilities",
        instructions=(
            f"Time (the wall clock and the game calendar), fresh ids and the content filter, "
            f"of {of}."
        ),
    )

    def minutes(date: str, clock: str | None) -> int:
        try:
            return calendar.minutes(date, clock)
        except GameDateError as exc:
            raise ToolRefusedError(str(exc)) from exc

    @server.tool(annotations=FRESH)
    async def now() -> dict[str, Any]:
        """The wall clock now: UTC in ISO 8601 and as Unix seconds."""
        at = datetime.now(UTC)
        return {"utc": at.isoformat(timespec="milliseconds"), "unix": at.timestamp()}

    @server.tool(annotations=READ_ONLY)
    async def game_date(
        date: GameDate,
        time_of_day: GameClock = None,
        today: Annotated[
            str | None,
            Field(
                pattern=r"^\d{1,6}-\d{1,2}-\d{1,2}$",
                description="The game's date now: the answer then says how long ago `date` was.",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """A date of the world's calendar as an NPC says it ("the 3rd of Mistmonth, the year
        612 of the Drowning"), its season, its game minutes, and how long before `today`."""
        at = minutes(date, time_of_day)
        found: dict[str, Any] = {
            "date": date,
            "minutes": at,
            "said": calendar.say(at),
            "season": calendar.season(at),
        }
        if today is not None:
            found["ago"] = calendar.ago(at, minutes(today, None))
        return found

    @server.tool(annotations=READ_ONLY)
    async def calendar_months() -> dict[str, Any]:
        """The months of the world's year, in order, with their days and seasons."""
        return capped(
            {
                "year": calendar.year,
                "days": calendar.year_days,
                "months": [m.model_dump() for m in calendar.months],
            }
        )

    @server.tool(annotations=FRESH)
    async def new_ids(
        kind: Annotated[
            Literal["uuid4", "ulid"],
            Field(description="uuid4: random; ulid: sorts by creation time."),
        ] = "uuid4",
        count: Annotated[int, Field(ge=1, le=100)] = 1,
    ) -> dict[str, Any]:
        """Fresh unique ids."""
        ids = [str(uuid.uuid4()) if kind == "uuid4" else ulid() for _ in range(count)]
        return {"kind": kind, "ids": ids}

    @server.tool(annotations=READ_ONLY)
    async def check_content(
        text: Annotated[str, Field(max_length=4000, description="The text to check.")],
        where: Annotated[
            Literal["reply", "player", "tool"],
            Field(
                description="Whose words: reply (an NPC's, the strictest), player (a "
                "player's line: personal data is redacted), tool (a tool's text)."
            ),
        ] = "reply",
        npc_id: Annotated[
            str | None,
            Field(
                pattern=NPC_ID_PATTERN,
                description="Check against this NPC's policy (its card's rating and phrases).",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """The content filter NPCs' words pass through (`mythic.safety`): whether `text` is
        allowed by the world's policy (its rating, blocklist, personal data, and the NPC's
        never-say phrases), and if not, which category and why."""
        card = None
        if npc_id is not None:
            card = world.npcs.get(npc_id) if world is not None else None
            if card is None:
                raise ToolRefusedError(f"no NPC {npc_id!r} in {of}")
        policy = SafetyPolicy.of(
            world.safety if world is not None else None, card.safety if card else None
        )
        verdict = await asyncio.to_thread(Guard(policy).check, text, where)
        return {
            "ok": verdict.ok,
            "category": verdict.category,
            "detail": verdict.detail,
            "source": verdict.source,
            "score": verdict.score,
            "text": verdict.text,
            "redacted": verdict.redacted,
            "rating": policy.rating,
        }

    return server
