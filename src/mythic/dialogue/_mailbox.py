"""An NPC actor's mailbox: priority lanes, where barge-in drops speech and data but never system
events (Pipecat's SystemFrame vs DataFrame)."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import Generic, TypeVar

from mythic._errors import MythicError

E = TypeVar("E")


class Lane(enum.IntEnum):
    """Mailbox lanes, served in this order."""

    SYSTEM = 0
    """Lifecycle and control (cutoff, scene changes, session end): never dropped, unbounded."""
    SPEECH = 1
    """What the player says: dropped on barge-in."""
    DATA = 2
    """Requests that a newer one supersedes (intents): dropped on barge-in."""


class MailboxFullError(MythicError):
    """An NPC has too many speech or data events waiting; the sender should retry later."""

    retryable = True


class MailboxClosedError(MythicError):
    """The NPC's actor has stopped; nothing more is delivered to it."""


class Mailbox(Generic[E]):
    """A single-consumer queue with priority lanes.

    SPEECH and DATA hold at most `max_pending` events each; SYSTEM is unbounded because its
    events are few and must never be lost (the client's rate limit bounds them).
    """

    def __init__(self, max_pending: int = 32) -> None:
        self.max_pending = max_pending
        self._lanes: tuple[deque[E], ...] = tuple(deque() for _ in Lane)
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, event: E, lane: Lane) -> None:
        """Deliver an event without waiting.

        Raises:
            MailboxFullError: the SPEECH or DATA lane is full.
            MailboxClosedError: the mailbox was closed.
        """
        if self._closed:
            raise MailboxClosedError("the NPC's actor has stopped")
        queue = self._lanes[lane]
        if lane is not Lane.SYSTEM and len(queue) >= self.max_pending:
            raise MailboxFullError(f"{len(queue)} {lane.name.lower()} events are already waiting")
        queue.append(event)
        self._ready.set()

    async def get(self) -> E:
        """The next event, SYSTEM first, then SPEECH, then DATA; FIFO within a lane.

        Raises:
            MailboxClosedError: the mailbox was closed and is empty.
        """
        while True:
            for queue in self._lanes:
                if queue:
                    return queue.popleft()
            if self._closed:
                raise MailboxClosedError("the NPC's actor has stopped")
            self._ready.clear()
            await self._ready.wait()

    def drop(self, *lanes: Lane) -> int:
        """Barge-in: discard what waits in `lanes` (default SPEECH and DATA); how many were
        dropped. SYSTEM events cannot be dropped."""
        if Lane.SYSTEM in lanes:
            raise ValueError("system events are never dropped")
        dropped = 0
        for lane in lanes or (Lane.SPEECH, Lane.DATA):
            dropped += len(self._lanes[lane])
            self._lanes[lane].clear()
        return dropped

    def close(self) -> None:
        """Refuse new events; `get` drains what is left, then raises `MailboxClosedError`."""
        self._closed = True
        self._ready.set()

    def __len__(self) -> int:
        return sum(len(q) for q in self._lanes)
