"""Write-behind to the cold tier: batched, never awaited by a turn, and lossless.

`submit` only appends to an in-memory queue. The archiver task writes a batch when 100 events
are waiting or 100 ms after the first one. When the database is down or slow, batches go to a
local append-only spool file instead (fsynced), and every later batch too, so order is kept;
every `retry_s` the spool is replayed from its committed offset, in order. Event ids make the
writes idempotent: a chunk replayed twice (a crash between the insert and the offset update)
is stored once, so each event lands exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from mythic.memory._cold import ColdStore
from mythic.memory._model import CorruptRecordError, MemoryEvent, MemoryStoreError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ArchiverStats:
    submitted: int = 0
    written: int = 0
    """Events stored by a direct batch write."""
    duplicates: int = 0
    """Events the archive already held (a replay after a crash): stored once."""
    spooled: int = 0
    replayed: int = 0
    """Events stored from the spool once the database was back."""
    batches: int = 0
    outages: int = 0
    corrupt: int = 0
    """Spool lines that did not parse (a write torn by a crash), skipped."""


class Spool:
    """An append-only JSON-lines file and the byte offset up to which it is archived."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "archive-spool.jsonl"
        self.offset_path = folder / "archive-spool.offset"
        self.corrupt = 0

    def append(self, events: list[MemoryEvent]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as f:
            if f.tell() and not self._ends_with_newline():
                f.write(b"\n")  # end a line torn by a crash; it is skipped on replay
            f.write("".join(e.to_json() + "\n" for e in events).encode())
            f.flush()
            os.fsync(f.fileno())

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def offset(self) -> int:
        try:
            return int(self.offset_path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except ValueError:
            log.warning("spool offset %s is corrupt; replaying from the start", self.offset_path)
            return 0

    def backlog(self) -> int:
        """Bytes not yet archived."""
        try:
            return max(0, self.path.stat().st_size - self.offset())
        except FileNotFoundError:
            return 0

    def read(self, offset: int, limit: int) -> tuple[list[MemoryEvent], int]:
        """Up to `limit` whole events from `offset`, and the offset after them."""
        events: list[MemoryEvent] = []
        with self.path.open("rb") as f:
            f.seek(offset)
            while len(events) < limit:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # the end, or a line still being written
                offset += len(line)
                if not line.strip():
                    continue
                try:
                    events.append(MemoryEvent.from_json(line))
                except CorruptRecordError as exc:
                    self.corrupt += 1
                    log.warning("spool %s: skipping a corrupt line: %s", self.path, exc)
        return events, offset

    def commit(self, offset: int) -> None:
        """Record that everything before `offset` is archived; empty the spool when all is."""
        size = self.path.stat().st_size
        if offset >= size:
            self.path.unlink()
            self.offset_path.unlink(missing_ok=True)
            return
        tmp = self.offset_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.offset_path)


class Archiver:
    """Batches events into the cold store; spools them while it is unreachable."""

    def __init__(
        self,
        cold: ColdStore,
        spool_dir: Path,
        *,
        flush_s: float = 0.1,
        batch: int = 100,
        timeout_s: float = 5.0,
        retry_s: float = 1.0,
    ) -> None:
        self.cold = cold
        self.spool = Spool(spool_dir)
        self.flush_s = flush_s
        self.batch = batch
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.stats = ArchiverStats()
        self.down = False
        self._pending: deque[MemoryEvent] = deque()
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._last_try = 0.0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def submit(self, event: MemoryEvent) -> None:
        """Queue `event` for the archive. Never blocks, never awaits."""
        self._pending.append(event)
        self.stats.submitted += 1
        self._wake.set()
        if len(self._pending) >= self.batch:
            self._full.set()

    def start(self) -> None:
        """Start writing. A spool left by an earlier run (a crash, an outage at shutdown) is
        replayed before anything newer, so order is kept."""
        self.down = self.spool.backlog() > 0
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mythic archiver")

    async def _run(self) -> None:
        while True:
            if self.down:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.retry_s):
                        await self._wake.wait()
            else:
                await self._wake.wait()
            if self._pending and len(self._pending) < self.batch:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.flush_s):
                        await self._full.wait()
            self._full.clear()
            if len(self._pending) <= self.batch:
                self._wake.clear()
            async with self._lock:
                await self._step()

    async def _step(self) -> None:
        batch = [self._pending.popleft() for _ in range(min(self.batch, len(self._pending)))]
        if batch and not self.down:
            try:
                async with asyncio.timeout(self.timeout_s):
                    stored = await self.cold.append(batch)
                self.stats.written += stored
                self.stats.duplicates += len(batch) - stored
                self.stats.batches += 1
                return
            except (MemoryStoreError, TimeoutError) as exc:
                self._went_down(exc)
        if batch:
            await asyncio.to_thread(self.spool.append, batch)
            self.stats.spooled += len(batch)
        if self.down and time.monotonic() - self._last_try >= self.retry_s:
            await self._replay()

    def _went_down(self, exc: BaseException) -> None:
        self.down = True
        self.stats.outages += 1
        self._last_try = time.monotonic()
        reason = str(exc) or "timed out"
        log.warning("memory archive unreachable (%s); spooling to %s", reason, self.spool.path)

    async def _replay(self) -> bool:
        """Archive the spool from its offset, in order; True when it is empty afterwards."""
        self._last_try = time.monotonic()
        offset = await asyncio.to_thread(self.spool.offset)
        while await asyncio.to_thread(self.spool.backlog) > 0:
            events, end = await asyncio.to_thread(self.spool.read, offset, self.batch)
            self.stats.corrupt = self.spool.corrupt
            try:
                if events:
                    async with asyncio.timeout(self.timeout_s):
                        stored = await self.cold.append(events)
                    self.stats.replayed += stored
                    self.stats.duplicates += len(events) - stored
            except (MemoryStoreError, TimeoutError):
                return False
            if end == offset:
                break  # only a partial line is left
            await asyncio.to_thread(self.spool.commit, end)
            offset = end
        if self.down:
            log.warning("memory archive reachable again; the spool is replayed")
        self.down = False
        return True

    async def flush(self) -> None:
        """Write everything queued now (to the spool if the archive is down); replay the spool
        if it can be."""
        async with self._lock:
            while self._pending:
                await self._step()
            if self.down:
                await self._replay()

    async def aclose(self) -> None:
        """Stop, after writing or spooling everything queued: nothing is lost."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
