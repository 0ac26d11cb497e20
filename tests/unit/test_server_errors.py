"""The one table from Mythic's errors to the HTTP answers the server's routes give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.requests import Request

from mythic._errors import MythicError
from mythic.dialogue import MailboxFullError, ToolArgumentError, UnknownNPCError
from mythic.jobs import JobError, JobStoreError
from mythic.knowledge import WorldLoadError, WorldProblem
from mythic.memory import CardError, MemoryStoreError, MigrationError
from mythic.server._app import ReplyTimeoutError
from mythic.server._routes_http import refuse

pytestmark = pytest.mark.unit

_REQUEST = Request({"type": "http", "method": "GET", "path": "/", "headers": []})


async def _answer(error: MythicError) -> tuple[int, object]:
    response = await refuse(_REQUEST, error)
    return response.status_code, json.loads(bytes(response.body))["detail"]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UnknownNPCError("no NPC 'nobody'"), 404),
        (CardError("trust must be a number"), 422),
        (JobError("unknown job kind 'poem'"), 422),
        (MailboxFullError("marla has 8 lines waiting"), 429),
        (MemoryStoreError("Redis does not answer"), 503),
        (MigrationError("the archive is at version 9"), 503),  # a subclass answers as its base
        (JobStoreError("the queue does not answer"), 503),
        (ReplyTimeoutError("the NPC did not finish its reply in 120 s"), 504),
    ],
)
async def test_each_error_answers_its_status_with_its_message(
    error: MythicError, status: int
) -> None:
    assert await _answer(error) == (status, error.message)


async def test_a_world_the_server_refuses_lists_its_problems() -> None:
    problem = WorldProblem(Path("npcs/marla.yaml"), 3, "tools", "no such tool 'fly'")
    status, detail = await _answer(WorldLoadError([problem]))
    assert status == 422
    assert detail == {
        "message": "world not loaded, 1 problem:\n  npcs/marla.yaml:3: tools: no such tool 'fly'",
        "problems": ["npcs/marla.yaml:3: tools: no such tool 'fly'"],
    }
    status, detail = await _answer(ToolArgumentError("marla lists an unknown tool 'fly'"))
    assert status == 422
    assert detail == {
        "message": "marla lists an unknown tool 'fly'",
        "problems": ["marla lists an unknown tool 'fly'"],
    }
