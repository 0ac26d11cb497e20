"""An NPC actor's mailbox: priority lanes, where a barge-in may drop speech and data but never
system events (Pipecat's SystemFrame vs DataFrame)."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from mythic._errors import MythicError

E = TypeVar("E")


class Lane(enum.IntEnum):
    """Mailbox lanes, served in this order."""

    SYSTEM = 0
    """Lifecycle and control (cutoff, scene changes, session end): never dropped, unbounded."""
    SPEECH = 1
    """What the player says: a cutoff drops its player's waiting lines."""
    DATA = 2
    """Intent requests and partial transcripts: served when no line waits."""


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

    def drop(self, *lanes: Lane, where: Callable[[E], bool] | None = None) -> list[E]:
        """Barge-in: discard what waits in `lanes` (default SPEECH and DATA), only the events
        `where` picks if given, and return them (oldest first per lane). SYSTEM events cannot
        be dropped."""
        if Lane.SYSTEM in lanes:
            raise ValueError("system events are never dropped")
        dropped: list[E] = []
        for lane in lanes or (Lane.SPEECH, Lane.DATA):
            queue = self._lanes[lane]
            kept: deque[E] = deque()
            for event in queue:
                (dropped if where is None or where(event) else kept).append(event)
            queue.clear()
            queue.extend(kept)
        return dropped

    def close(self) -> None:
        """Refuse new events; `get` drains what is left, then raises `MailboxClosedError`."""
        self._closed = True
        self._ready.set()

    def __len__(self) -> int:
        return sum(len(q) for q in self._lanes)
