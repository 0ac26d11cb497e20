"""Picklable `connect` callables for `ProcessIntentSource` tests: they run in its child."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from mythic.contracts import IntentRequest, IntentUpdate


class UnpicklableError(Exception):
    """An error that cannot cross a process boundary as itself."""

    def __init__(self, message: str, handle: Any) -> None:
        super().__init__(message)
        self.handle = handle


@contextlib.asynccontextmanager
async def answering(intent: str = "trade") -> AsyncIterator[Any]:
    """Answers every request with `intent`; npc `broken` raises, `odd` raises an unpicklable
    error, `slow` waits forever, `pid` answers with a bark naming the child's process id,
    `cores` with one naming the cores it may run on and its niceness."""

    async def fetch(request: IntentRequest) -> IntentUpdate:
        await asyncio.sleep(0)
        if request.npc_id == "broken":
            raise ValueError("model down")
        if request.npc_id == "odd":
            raise UnpicklableError("odd failure", lambda: None)
        if request.npc_id == "slow":
            await asyncio.Event().wait()
        bark = f"pid {os.getpid()}" if request.npc_id == "pid" else None
        if request.npc_id == "cores":
            bark = f"{sorted(os.sched_getaffinity(0))} nice {os.nice(0)}"
        return IntentUpdate(npc_id=request.npc_id, intent=intent, request_id="sdk-1", bark=bark)

    yield fetch


@contextlib.asynccontextmanager
async def refusing() -> AsyncIterator[Any]:
    """Cannot connect."""
    raise ConnectionRefusedError("no server at ws://127.0.0.1:9/v1/ws")
    yield  # pragma: no cover
