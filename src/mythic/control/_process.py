"""An intent source whose client lives in a process of its own, off the game's interpreter.

`AsyncIntentSource` runs the fetches on a thread of the game's process: the WebSocket
frames, the JSON and the validation of every answer hold the GIL, and a frame that wants it
back can wait a whole switch interval (5 ms) for it. `ProcessIntentSource` runs the same
fetch pool in a child process; the game only pickles small requests into a pipe and a reader
thread unpickles the answers (tens of microseconds each, released at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import pickle
import threading
import traceback
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from multiprocessing.connection import Connection
from typing import Any, Literal

from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control._cores import Placement, pin_thread
from mythic.control._crowd import Tier
from mythic.control._intents import (
    Fetch,
    FetchPool,
    IntentSink,
    QueuedTooLongError,
    check_pool,
)

log = logging.getLogger(__name__)

Connect = Callable[[], AbstractAsyncContextManager[Fetch]]
"""Picklable (a module-level function, or a `functools.partial` of one): called in the child
process, it opens the connection (a `MythicClient`, say) and yields the `fetch` to use;
leaving the context closes it."""


class ProcessIntentSource:
    """An `IntentSource` whose fetches run in a child process (`spawn`).

    `connect` is called there and yields the async `fetch`, as for `AsyncIntentSource`; up to
    `max_concurrency` fetches run at once, most urgent tier first, and a request queued longer
    than `max_wait_s` fails unfetched. `submit` pickles the request into a pipe and returns.
    Answers go to the sink's `deliver` and failures to `fail` when `poll()` reads them, on the
    frame loop's thread (`answers="poll"`, the default: `Controller.frame` polls first thing),
    or as they arrive, from a reader thread in the game's process (`answers="thread"`, for a
    sink that is not a `Controller`; that thread competes with frames for the GIL and, unless
    `cpus` moves it off the frame loop's cores, for a core). The child runs at `nice` (on
    POSIX), below the frame loop, and on `cpus` where the OS can pin a process (Linux): give
    it cores other than the frame loop's, so its work never preempts a frame (`split_cores`
    picks them).

    If the child dies, every request it held fails with `ConnectionError`, as does every
    later `submit`: the NPCs fall back to their archetype defaults and the game goes on.

    The child is started with `spawn` (the same on Linux, macOS and Windows): it imports the
    game's main module, so start the source from code under `if __name__ == "__main__":`.

        source = ProcessIntentSource(
            functools.partial(my_connect, "ws://127.0.0.1:8765/v1/ws"),
            max_wait_s=controller.settings.request_timeout_s,
        )
        source.start(controller)   # blocks until the child is connected (or raises)
        controller.source = source
        ...
        source.close()
    """

    def __init__(
        self,
        connect: Connect,
        *,
        max_concurrency: int = 4,
        max_wait_s: float | None = None,
        nice: int = 0,
        cpus: Collection[int] | None = None,
        answers: Literal["poll", "thread"] = "poll",
        name: str = "mythic-intents",
    ) -> None:
        check_pool(max_concurrency, max_wait_s)
        if not 0 <= nice <= 19:
            raise ValueError("nice must be between 0 and 19")
        if cpus is not None and (not cpus or min(cpus) < 0):
            raise ValueError("cpus must name at least one core, each >= 0")
        self._connect = connect
        self._max_concurrency = max_concurrency
        self._max_wait_s = max_wait_s
        self._nice = nice
        if answers not in ("poll", "thread"):
            raise ValueError(f"answers must be 'poll' or 'thread', not {answers!r}")
        self._cpus = frozenset(cpus) if cpus is not None else None
        self._answers = answers
        self._name = name
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._sink: IntentSink | None = None
        self._conn: Connection | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._reader: threading.Thread | None = None
        self._outstanding: dict[str, IntentRequest] = {}
        self._closed = False
        self._dead = False
        self.expired_in_queue = 0
        """Requests the child failed unfetched because they waited past `max_wait_s`."""

    @property
    def running(self) -> bool:
        """Started, not closed, and the child is alive."""
        return self._conn is not None and not (self._closed or self._dead)

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        return self._process.pid if self._process is not None else None

    def start(self, sink: IntentSink, *, timeout_s: float = 60.0) -> None:
        """Start the child, wait until it has connected, then start reading its answers.

        Raises:
            RuntimeError: already started.
            ConnectionError: the child could not connect (its error is in the message), died,
                or was not ready within `timeout_s`.
        """
        with self._lock:
            if self._process is not None:
                raise RuntimeError("the intent source is already started")
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe(duplex=True)
            process = context.Process(
                target=_child_main,
                args=(
                    child,
                    self._connect,
                    self._max_concurrency,
                    self._max_wait_s,
                    Placement(self._nice, self._cpus),
                ),
                name=self._name,
                daemon=True,
            )
            self._sink = sink
            self._process = process
            process.start()
            child.close()
        try:
            first = parent.recv() if parent.poll(timeout_s) else None
        except (EOFError, OSError):
            first = ("error", f"the intent process exited ({process.exitcode})")
        if first != ("ready",):
            self._closed = True
            self._stop_child(parent, process, timeout_s=1.0 if first is None else 5.0)
            if first is None:
                raise ConnectionError(f"the intent process was not ready within {timeout_s:g} s")
            detail = first[1] if isinstance(first, tuple) and len(first) == 2 else repr(first)
            raise ConnectionError(f"the intent process could not start: {detail}")
        with self._lock:
            self._conn = parent
            if self._answers == "thread":
                self._reader = threading.Thread(
                    target=self._read, args=(parent,), name=f"{self._name}-reader", daemon=True
                )
                self._reader.start()

    def submit(self, request: IntentRequest, tier: Tier) -> None:
        """Send a request to the child; return at once. Fails the request (through the sink)
        when the source is closed or the child is gone."""
        conn = self._conn
        if conn is None and not self._closed:
            raise RuntimeError("start the intent source before submitting")
        if conn is not None and not (self._closed or self._dead):
            with self._lock:
                self._outstanding[request.request_id] = request
            try:
                with self._send_lock:
                    conn.send(("submit", int(tier), request))
                return
            except (OSError, ValueError):  # the child is gone, or the pipe closed
                with self._lock:
                    self._outstanding.pop(request.request_id, None)
        assert self._sink is not None
        self._sink.fail(request, ConnectionError("the intent source is closed"))

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Stop the child (its running fetches are cancelled and their requests fail), join
        the reader. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn, process, reader = self._conn, self._process, self._reader
        if conn is not None and process is not None:
            with contextlib.suppress(OSError, ValueError), self._send_lock:
                conn.send(None)
            if reader is not None:
                reader.join(timeout_s)
            self._stop_child(conn, process, timeout_s=timeout_s)
        self._fail_outstanding("the intent source is closed")

    def __enter__(self) -> ProcessIntentSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the reader thread ------------------------------------------------------------------

    def poll(self, max_messages: int = 64) -> int:
        """Hand the answers that have arrived (at most `max_messages`) to the sink, without
        blocking; the number handed. `Controller.frame` calls it first thing, so answers are
        read on the frame loop's thread, between frames' work, and no thread of the source
        ever competes with a frame (for the GIL or a core). A no-op with a reader thread
        (`answers="thread"`) or once closed.
        """
        conn = self._conn
        if self._reader is not None or conn is None or self._closed or self._dead:
            return 0
        handed = 0
        try:
            while handed < max_messages and conn.poll(0):
                if not self._handle(conn):
                    self._gone()
                    break
                handed += 1
        except (EOFError, OSError):
            self._gone()
        return handed

    def _read(self, conn: Connection) -> None:
        if self._cpus is not None:
            # Off the frame loop's cores: waking up to read an answer must not preempt a frame.
            pin_thread(self._cpus)
        while True:
            try:
                if not self._handle(conn):
                    break
            except (EOFError, OSError):
                break
        self._gone()

    def _handle(self, conn: Connection) -> bool:
        """Read one message and act on it; False when the child said it closed.

        Raises:
            EOFError, OSError: the pipe is closed (the child is gone).
        """
        sink = self._sink
        assert sink is not None
        try:
            message = conn.recv()
        except (EOFError, OSError):
            raise
        except Exception:  # an unreadable message must not stop the answers
            log.exception("unreadable message from the intent process")
            return True
        kind = message[0]
        if kind == "ok":
            update: IntentUpdate = message[1]
            if update.request_id is not None:
                with self._lock:
                    self._outstanding.pop(update.request_id, None)
            sink.deliver(update)
        elif kind == "fail":
            request: IntentRequest = message[1]
            error: BaseException = message[2]
            with self._lock:
                self._outstanding.pop(request.request_id, None)
            if isinstance(error, QueuedTooLongError):
                self.expired_in_queue += 1
            sink.fail(request, error)
        return bool(kind != "closed")

    def _gone(self) -> None:
        if self._dead:
            return
        if not self._closed:
            log.error("the intent process exited; NPCs keep their archetype defaults")
        self._dead = True
        self._fail_outstanding("the intent process exited")

    def _fail_outstanding(self, reason: str) -> None:
        with self._lock:
            lost, self._outstanding = list(self._outstanding.values()), {}
        if self._sink is not None:
            for request in lost:
                self._sink.fail(request, ConnectionError(reason))

    @staticmethod
    def _stop_child(
        conn: Connection, process: multiprocessing.process.BaseProcess, *, timeout_s: float
    ) -> None:
        process.join(timeout_s)
        if process.is_alive():
            process.terminate()
            process.join(timeout_s)
        if process.is_alive():
            process.kill()
            process.join(timeout_s)
        conn.close()


# -- the child process ------------------------------------------------------------------------


class _PipeSink:
    """The child's sink: answers and failures go back up the pipe."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def deliver(self, update: IntentUpdate) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("ok", update))

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("fail", request, _portable(error)))


def _portable(error: BaseException | None) -> BaseException:
    """The error itself if it survives pickling, else a `RuntimeError` naming it."""
    if error is None:
        return RuntimeError("the request failed")
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error unpicklable for any reason
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def _child_main(
    conn: Connection,
    connect: Connect,
    max_concurrency: int,
    max_wait_s: float | None,
    placement: Placement,
) -> None:
    placement.apply()
    try:
        asyncio.run(_child_serve(conn, connect, max_concurrency, max_wait_s))
    except KeyboardInterrupt:  # the game's Ctrl-C reaches the whole process group
        pass
    finally:
        with contextlib.suppress(OSError, ValueError):
            conn.send(("closed",))
        conn.close()


def _receive(conn: Connection) -> Any:
    """The next message from the game; None when it says stop or is gone."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


async def _child_serve(
    conn: Connection, connect: Connect, max_concurrency: int, max_wait_s: float | None
) -> None:
    loop = asyncio.get_running_loop()
    try:
        entered = connect()
        fetch = await entered.__aenter__()
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc(limit=4)))
        return
    try:
        pool = FetchPool(
            fetch, _PipeSink(conn), max_concurrency=max_concurrency, max_wait_s=max_wait_s
        )

        async def pump() -> None:
            # The pipe is read on a thread (not `add_reader`: Windows' loop lacks it).
            while (message := await loop.run_in_executor(None, _receive, conn)) is not None:
                _, tier, request = message
                pool.put(request, Tier(tier))

        runner = asyncio.create_task(pool.run(ready=lambda: conn.send(("ready",))))
        pumping = asyncio.create_task(pump())
        await asyncio.wait({runner, pumping}, return_when=asyncio.FIRST_COMPLETED)
        pool.stop()
        await runner
        pumping.cancel()
    finally:
        await entered.__aexit__(None, None, None)
