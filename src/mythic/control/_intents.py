"""The intent cache: what each NPC means to do, refreshed from the model without blocking.

The frame path never waits for the model. It hands requests to an `IntentSource` whose
`submit` returns at once; answers come back on any thread through `deliver` (or `fail`), land
in a thread-safe inbox, and are applied at the start of the next frame, never in the middle of
one. Each NPC has at most one request in flight; an answer to anything but that request, or
one older than the intent already applied, is stale and dropped; a request that never answers
times out so the NPC can ask again; an intent older than its time-to-live expires.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control._crowd import Crowd, Index, Tier
from mythic.control._settings import ControlSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

_NO_ROWS: Index = np.zeros(0, dtype=np.intp)

Fetch = Callable[[IntentRequest], Awaitable[IntentUpdate]]
"""An async callable that asks the model for one intent (the client SDK's `intent`, adapted)."""


class QueuedTooLongError(TimeoutError):
    """A request waited in an intent source's queue past its `max_wait_s`; it was never sent."""


class IntentShedError(Exception):
    """A source declined a request at once, without asking the model, because what would
    answer it is taken (the sim's persona answering another NPC, say): no fault, the NPC asks
    again after `retry_after_s`. Counted as `shed`, apart from `failed`."""


class IntentSink(Protocol):
    """Where answers go: thread-safe, callable from any thread."""

    def deliver(self, update: IntentUpdate) -> None:
        """An intent arrived (the answer to a request, or pushed by the server)."""

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        """A request failed; the NPC may ask again after the retry delay."""


class IntentSource(Protocol):
    """Sends intent requests to the model. `submit` must not block: it is called on the frame
    path. The answer goes to the sink the source was given."""

    def submit(self, request: IntentRequest, tier: Tier) -> None:
        """Send a request for an NPC in `tier`, which says which model tier to ask (and how
        urgent it is); return at once."""


@dataclass(slots=True)
class IntentCounters:
    """What the intent cache has done since it was built."""

    sent: int = 0
    """Requests handed to the source."""
    answered: int = 0
    """Answers to the request in flight."""
    pushed: int = 0
    """Updates the server sent without a request."""
    applied: int = 0
    """Updates that became an NPC's current intent."""
    dropped_stale: int = 0
    """Answers (or failures) to a request no longer in flight, or older than the intent."""
    timed_out: int = 0
    """Requests that stayed unanswered past the timeout."""
    failed: int = 0
    """Requests the source reported as failed (or whose submit raised)."""
    shed: int = 0
    """Requests the source declined at once (`IntentShedError`): asked again later."""
    expired: int = 0
    """Intents that outlived their time-to-live (the NPC went back to its default)."""
    unknown_npc: int = 0
    """Updates for an NPC id that is not in the crowd (ignored)."""


@dataclass(slots=True)
class _Pending:
    npc_id: str
    sent_at: float


@dataclass(frozen=True, slots=True)
class _Failure:
    request: IntentRequest
    error: BaseException | None


class IntentCache:
    """Per NPC: the current intent, the request in flight and when to ask next.

    The clocks live in the crowd's columns (`next_request_at`, `in_flight`, `sent_at`,
    `intent_at`, `intent_stamp`), so due requests, timeouts and expiries are found with one
    vectorised comparison; only the few NPCs found loop in Python. `deliver` and `fail` may
    be called from any thread; everything else belongs to the thread that runs the frames.
    """

    def __init__(self, crowd: Crowd, settings: ControlSettings, rng: np.random.Generator) -> None:
        self.crowd = crowd
        self.settings = settings
        self.counters = IntentCounters()
        self._rng = rng
        self._inbox: deque[IntentUpdate | _Failure] = deque()
        self._pending: dict[str, _Pending] = {}
        self._in_flight: dict[str, str] = {}
        self._intents: dict[str, IntentUpdate] = {}
        self._barks: dict[str, str] = {}
        self._context: dict[str, str] = {}
        self._prefix = f"i{uuid.uuid4().hex[:8]}-"
        self._seq = itertools.count(1)
        hz = (settings.gold.request_hz, settings.silver.request_hz, settings.bronze_request_hz)
        self._period = np.array([1 / r if r > 0 else math.inf for r in hz], dtype=np.float64)
        self._jitter = np.array(
            [settings.gold.jitter, settings.silver.jitter, settings.bronze_jitter],
            dtype=np.float64,
        )

    # -- any thread -------------------------------------------------------------------------

    def deliver(self, update: IntentUpdate) -> None:
        """Queue an intent for the next frame boundary. Thread-safe, never blocks."""
        self._inbox.append(update)

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        """Queue a request's failure for the next frame boundary. Thread-safe, never blocks."""
        self._inbox.append(_Failure(request, error))

    @property
    def waiting(self) -> int:
        """Updates and failures in the inbox, not yet applied."""
        return len(self._inbox)

    # -- the frame thread -------------------------------------------------------------------

    def current(self, npc_id: str) -> IntentUpdate | None:
        """The intent an NPC is running, or None (it runs its archetype default)."""
        return self._intents.get(npc_id)

    def in_flight(self, npc_id: str) -> str | None:
        """The request id an NPC is waiting on, or None."""
        return self._in_flight.get(npc_id)

    def take_bark(self, npc_id: str) -> str | None:
        """The NPC's latest unsaid remark (a prefetched greeting), once."""
        return self._barks.pop(npc_id, None)

    def ask_soon(self, row: int, *, context: str | None = None, with_bark: bool = False) -> None:
        """Make an NPC due at the next frame (one request in flight still holds)."""
        npc_id = self.crowd.id_at(row)
        if context is not None:
            self._context[npc_id] = context
        if with_bark:
            self.crowd.wants_bark[row] = True
        self.crowd.next_request_at[row] = -math.inf

    def forget(self, npc_id: str) -> None:
        """Drop everything about an NPC (removed, or its target vanished)."""
        request_id = self._in_flight.pop(npc_id, None)
        if request_id is not None:
            self._pending.pop(request_id, None)
        self._intents.pop(npc_id, None)
        self._barks.pop(npc_id, None)
        self._context.pop(npc_id, None)

    def clear_intent(self, row: int) -> None:
        """The NPC no longer runs its intent (it went back to its default)."""
        self._intents.pop(self.crowd.id_at(row), None)
        self.crowd.intent_at[row] = math.nan

    def drain(self, now: float) -> dict[int, IntentUpdate]:
        """Apply the inbox: the frame boundary. Returns the accepted updates by row (the last
        one per NPC); the caller turns them into behaviours."""
        accepted: dict[int, IntentUpdate] = {}
        crowd = self.crowd
        for _ in range(len(self._inbox)):
            item = self._inbox.popleft()
            if isinstance(item, _Failure):
                self._failed(item, now)
                continue
            row = crowd.find(item.npc_id)
            if row is None:
                self.counters.unknown_npc += 1
                continue
            if item.request_id is None:
                self.counters.pushed += 1
                stamp = now
            else:
                if self._in_flight.get(item.npc_id) != item.request_id:
                    self.counters.dropped_stale += 1
                    continue
                del self._in_flight[item.npc_id]
                stamp = self._pending.pop(item.request_id).sent_at
                crowd.in_flight[row] = False
                self.counters.answered += 1
                if stamp < crowd.intent_stamp[row]:
                    self.counters.dropped_stale += 1  # a newer push arrived meanwhile
                    continue
            crowd.intent_stamp[row] = stamp
            crowd.intent_at[row] = now
            self._intents[item.npc_id] = item
            if item.bark is not None:
                self._barks[item.npc_id] = item.bark
            self.counters.applied += 1
            accepted[row] = item
        return accepted

    def _failed(self, failure: _Failure, now: float) -> None:
        request = failure.request
        if self._in_flight.get(request.npc_id) != request.request_id:
            self.counters.dropped_stale += 1
            return
        del self._in_flight[request.npc_id]
        self._pending.pop(request.request_id, None)
        row = self.crowd.index_of(request.npc_id)
        self.crowd.in_flight[row] = False
        self.crowd.next_request_at[row] = now + self.settings.retry_after_s
        if isinstance(failure.error, IntentShedError):
            self.counters.shed += 1
        else:
            self.counters.failed += 1
        log.debug("intent request %s failed: %r", request.request_id, failure.error)

    def time_out(self, now: float) -> Index:
        """Give up on requests unanswered past the timeout; return their rows."""
        if not self._in_flight:  # the column is only set with an entry here: none to scan
            return _NO_ROWS
        crowd = self.crowd
        n = len(crowd)
        late = (
            crowd.in_flight[:n] & (crowd.sent_at[:n] + self.settings.request_timeout_s <= now)
        ).nonzero()[0]
        for row in late.tolist():
            request_id = self._in_flight.pop(crowd.id_at(row))
            del self._pending[request_id]
        crowd.in_flight[late] = False
        crowd.next_request_at[late] = now + self.settings.retry_after_s
        self.counters.timed_out += len(late)
        return late

    def expire(self, now: float) -> Index:
        """End intents older than their time-to-live; return the rows (they need defaults)."""
        if not self._intents:  # the clock is only set with an entry here: none to scan
            return _NO_ROWS
        crowd = self.crowd
        n = len(crowd)
        old = (crowd.intent_at[:n] + self.settings.intent_ttl_s <= now).nonzero()[0]
        for row in old.tolist():
            self._intents.pop(crowd.id_at(row), None)
        crowd.intent_at[old] = math.nan
        self.counters.expired += len(old)
        return old

    def retime(self, rows: Index, now: float) -> None:
        """Reschedule NPCs whose tier changed: a faster tier asks within one of its (jittered)
        periods, a tier that never asks stops asking (unless a prefetch is pending)."""
        if rows.size == 0:
            return
        crowd = self.crowd
        tier = crowd.tier[rows].astype(np.intp)
        period = self._period[tier]
        soon = now + period * self._rng.uniform(0.0, 1.0, rows.size)
        current = crowd.next_request_at[rows]
        later = np.where(np.isfinite(period), np.minimum(current, soon), math.inf)
        crowd.next_request_at[rows] = np.where(crowd.wants_bark[rows], current, later)

    def issue_due(self, now: float, source: IntentSource | None) -> int:
        """Send the requests that are due (at most `max_requests_per_frame`): prefetches
        first, then by tier, then the longest overdue. Returns how many went out."""
        if source is None:
            return 0
        crowd = self.crowd
        n = len(crowd)
        due = (~crowd.in_flight[:n] & (crowd.next_request_at[:n] <= now)).nonzero()[0]
        if due.size == 0:
            return 0
        cap = self.settings.max_requests_per_frame
        if due.size > cap:
            order = np.lexsort(
                (crowd.next_request_at[due], crowd.tier[due], ~crowd.wants_bark[due])
            )
            due = due[order[:cap]]
        for row in due:
            self._issue(int(row), now, source)
        return len(due)

    def _issue(self, row: int, now: float, source: IntentSource) -> None:
        crowd = self.crowd
        npc_id = crowd.id_at(row)
        tier = Tier(int(crowd.tier[row]))
        request = IntentRequest(
            npc_id=npc_id,
            request_id=f"{self._prefix}{next(self._seq)}",
            context=self._context.pop(npc_id, None),
            with_bark=bool(crowd.wants_bark[row]),
        )
        crowd.wants_bark[row] = False
        crowd.in_flight[row] = True
        crowd.sent_at[row] = now
        spread = self._jitter[tier]
        scale = 1.0 + spread * (2.0 * float(self._rng.random()) - 1.0)
        crowd.next_request_at[row] = now + self._period[tier] * scale
        self._in_flight[npc_id] = request.request_id
        self._pending[request.request_id] = _Pending(npc_id, now)
        self.counters.sent += 1
        try:
            source.submit(request, tier)
        except Exception:  # a broken source must not stop the game loop
            log.exception("intent source failed to take request %s", request.request_id)
            self._failed(_Failure(request, None), now)


def check_pool(max_concurrency: int, max_wait_s: float | None) -> None:
    """Validate a fetch pool's sizing.

    Raises:
        ValueError: `max_concurrency` below 1, or `max_wait_s` not positive.
    """
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be >= 1")
    if max_wait_s is not None and not max_wait_s > 0:
        raise ValueError("max_wait_s must be positive (or None: wait for ever)")


class FetchPool:
    """Fetch workers on one event loop: queued requests, most urgent tier first, at most
    `max_concurrency` at once; each answer goes to the sink's `deliver` under the request's
    id (the fetch may have used its own), each exception to `fail`.

    A request that waited in the queue longer than `max_wait_s` fails with `QueuedTooLongError`
    without being fetched: the controller has given up on it by then (its
    `request_timeout_s`), and asking the model anyway only delays the requests behind it.

    Everything but the constructor runs on the loop's thread: `put` to queue, `run` to work
    until `stop`. `AsyncIntentSource` drives one from a thread, `ProcessIntentSource` from a
    child process.
    """

    def __init__(
        self,
        fetch: Fetch,
        sink: IntentSink,
        *,
        max_concurrency: int = 4,
        max_wait_s: float | None = None,
    ) -> None:
        check_pool(max_concurrency, max_wait_s)
        self._fetch = fetch
        self._sink = sink
        self._max_concurrency = max_concurrency
        self._max_wait_s = max_wait_s
        self._queue: asyncio.PriorityQueue[tuple[int, int, float, IntentRequest]] = (
            asyncio.PriorityQueue()
        )
        self._stop = asyncio.Event()
        self._seq = itertools.count()
        self.expired_in_queue = 0
        """Requests failed unfetched because they waited past `max_wait_s`."""

    def put(self, request: IntentRequest, tier: Tier) -> None:
        """Queue a request (on the loop's thread)."""
        self._queue.put_nowait((int(tier), next(self._seq), time.monotonic(), request))

    def stop(self) -> None:
        """Make `run` cancel its fetches (failing their requests) and return."""
        self._stop.set()

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Work until `stop`; `ready` is called once the workers are up. On the way out,
        running fetches are cancelled and queued requests fail with `ConnectionError`."""
        closed = ConnectionError("the intent source is closed")
        try:
            async with asyncio.TaskGroup() as group:
                workers = [group.create_task(self._work()) for _ in range(self._max_concurrency)]
                if ready is not None:
                    ready()
                await self._stop.wait()
                for worker in workers:
                    worker.cancel()
        finally:
            while not self._queue.empty():
                *_, request = self._queue.get_nowait()
                self._sink.fail(request, closed)

    async def _work(self) -> None:
        sink, max_wait = self._sink, self._max_wait_s
        while True:
            _, _, queued_at, request = await self._queue.get()
            if max_wait is not None and time.monotonic() - queued_at > max_wait:
                self.expired_in_queue += 1
                sink.fail(request, QueuedTooLongError(f"queued for more than {max_wait:g} s"))
                continue
            try:
                update = await self._fetch(request)
            except asyncio.CancelledError:
                sink.fail(request, ConnectionError("the intent source closed mid-request"))
                raise
            except Exception as exc:  # noqa: BLE001 - handed to the sink: the NPC asks again
                sink.fail(request, exc)
                continue
            if update.request_id != request.request_id:
                update = update.model_copy(update={"request_id": request.request_id})
            sink.deliver(update)


class AsyncIntentSource:
    """An `IntentSource` that runs an async `fetch` on an asyncio event loop in another thread.

    `submit` only schedules the request on that loop (`call_soon_threadsafe`) and returns;
    up to `max_concurrency` fetches run at once, gold requests before silver before bronze,
    and one queued longer than `max_wait_s` fails unfetched (see `FetchPool`). Each result
    goes to the sink's `deliver`, each exception to `fail`. `close` cancels what is running
    (failing those requests), stops the loop and joins the thread.

    The loop is the source's own unless `loop` names a running one (where a connected
    `MythicClient` lives): `fetch` must run on the loop that owns its connection.

        source = AsyncIntentSource(
            lambda r: client.intent(
                r.npc_id, context=r.context, with_bark=r.with_bark, request_id=r.request_id
            ),
            max_wait_s=controller.settings.request_timeout_s,
        )
        source.start(controller)
        source.run(client.connect()).result(5)   # the client lives on the source's loop
        controller.source = source

    The fetches share the game's interpreter: their parsing takes the GIL from the frame
    loop now and then. `ProcessIntentSource` moves them to a process of their own.
    """

    def __init__(
        self,
        fetch: Fetch,
        *,
        max_concurrency: int = 4,
        max_wait_s: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        name: str = "mythic-intents",
    ) -> None:
        check_pool(max_concurrency, max_wait_s)
        self._fetch = fetch
        self._max_concurrency = max_concurrency
        self._max_wait_s = max_wait_s
        self._external = loop
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sink: IntentSink | None = None
        self._serving: concurrent.futures.Future[None] | None = None
        self._ready = threading.Event()
        self._pool: FetchPool | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        """Started and not closed."""
        return self._serving is not None and not self._closed

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the fetches run on.

        Raises:
            RuntimeError: the source has not been started.
        """
        if self._loop is None:
            raise RuntimeError("start the intent source first")
        return self._loop

    @property
    def expired_in_queue(self) -> int:
        """Requests failed unfetched because they waited past `max_wait_s`."""
        return self._pool.expired_in_queue if self._pool is not None else 0

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the source's loop (setup and teardown, such as connecting the
        client); never from the frame path."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(self, sink: IntentSink, *, timeout_s: float = 5.0) -> None:
        """Start the loop (unless external) and the fetch workers; results go to `sink`.

        Raises:
            RuntimeError: already started, or the workers did not come up in `timeout_s`.
        """
        with self._lock:
            if self._serving is not None:
                raise RuntimeError("the intent source is already started")
            self._sink = sink
            if self._external is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=_serve_forever, args=(loop,), name=self._name, daemon=True
                )
                self._thread.start()
            else:
                loop = self._external
            self._loop = loop
            self._serving = asyncio.run_coroutine_threadsafe(self._serve(), loop)
        if not self._ready.wait(timeout_s):
            self.close(timeout_s=timeout_s)
            raise RuntimeError(f"the intent source did not start within {timeout_s} s")

    def submit(self, request: IntentRequest, tier: Tier) -> None:
        """Queue a request on the loop; return at once. After `close`, the request fails."""
        with self._lock:
            loop, pool = self._loop, self._pool
            if self._serving is None or loop is None:
                raise RuntimeError("start the intent source before submitting")
            if not self._closed and pool is not None:
                try:
                    loop.call_soon_threadsafe(pool.put, request, tier)
                    return
                except RuntimeError:  # the loop closed under us
                    pass
        assert self._sink is not None
        self._sink.fail(request, ConnectionError("the intent source is closed"))

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Cancel running fetches (their requests fail), stop the loop, join the thread.
        Idempotent."""
        with self._lock:
            if self._closed or self._serving is None or self._loop is None:
                self._closed = True
                return
            self._closed = True
            loop, serving, pool = self._loop, self._serving, self._pool
        if pool is not None:
            loop.call_soon_threadsafe(pool.stop)
        else:  # the workers never came up
            serving.cancel()
        try:
            serving.result(timeout_s)
        except concurrent.futures.CancelledError:
            pass
        finally:
            if self._thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join(timeout_s)

    def __enter__(self) -> AsyncIntentSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _serve(self) -> None:
        assert self._sink is not None
        pool = FetchPool(
            self._fetch,
            self._sink,
            max_concurrency=self._max_concurrency,
            max_wait_s=self._max_wait_s,
        )
        with self._lock:
            self._pool = pool
        await pool.run(ready=self._ready.set)


def _serve_forever(loop: asyncio.AbstractEventLoop) -> None:
    """The source's own thread: run the loop until stopped, then shut it down cleanly."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
