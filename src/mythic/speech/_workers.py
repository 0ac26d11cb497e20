"""Worker processes for models that must not run in the server process.

A `WorkerPool` starts N processes, each a fresh interpreter (`python -c`, not a fork and not
multiprocessing's `spawn`, which would re-run the server's `__main__` script), that imports
one worker module by name, builds its engine once (`load(config)`) and then serves jobs one
at a time over a socket pair. The parent never imports the worker module, so whatever that
imports (Piper, GPL-licensed; CTranslate2) stays out of the server process.

The parent side is asyncio: each worker's socket, and on Linux a pidfd of its process, are
watched with `loop.add_reader`, so no thread blocks on a worker. A worker that dies is seen
at once: the job it was serving fails with `SpeechWorkerError` and a new process replaces
it. Every wait has a timeout; a worker that does not answer in time is killed and replaced.

Wire protocol, parent -> child: ("config", config) first, then ("job", id, payload),
("cancel", id), ("stop",). Child -> parent: ("ready", info) or ("failed", error), then
("item", id, data), ("done", id), ("error", id, error), where `error` is
(class name, message, fix, extra args).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, Protocol, Self

from mythic._errors import MissingExtraError, MythicError
from mythic._heap import trim
from mythic.speech import _errors

log = logging.getLogger(__name__)

_STOP_GRACE_S = 3.0
_REAP_S = 1.0
_SEND_IN_THREAD = 64 * 1024  # larger payloads could fill the pipe and block the loop


class Engine(Protocol):
    """What a worker module's `load(config)` returns, inside the worker process."""

    info: dict[str, Any]

    def run(self, payload: Any, cancelled: Callable[[], bool]) -> Iterator[Any]:
        """Serve one job: yield items to send back; stop early when `cancelled()`."""
        ...


ErrorRecord = tuple[str, str, str | None, tuple[str, ...]]


def encode_error(exc: BaseException) -> ErrorRecord:
    """An exception as plain data that crosses the pipe (typed errors keep their class)."""
    if isinstance(exc, MissingExtraError):
        return ("MissingExtraError", exc.message, exc.fix, (exc.package, exc.extra))
    if isinstance(exc, MythicError):
        return (type(exc).__name__, exc.message, exc.fix, ())
    return ("SpeechWorkerError", f"{type(exc).__name__}: {exc}", None, ())


def decode_error(record: ErrorRecord) -> MythicError:
    """The typed error of a record made by `encode_error`."""
    name, message, fix, extra = record
    if name == "MissingExtraError" and len(extra) == 2:
        return MissingExtraError(extra[0], extra[1])
    cls = getattr(_errors, name, None)
    if (
        isinstance(cls, type)
        and issubclass(cls, _errors.SpeechError)
        and name != "UnknownVoiceError"
    ):
        return cls(message, fix=fix)
    return _errors.SpeechWorkerError(message, fix=fix)


# -- the child side ---------------------------------------------------------------------------


_BOOTSTRAP = (
    "import json, os, sys; "
    "sys.path[:0] = json.loads(os.environ.pop('MYTHIC_WORKER_PATH', '[]')); "
    "from mythic.speech._workers import child_entry; child_entry()"
)


def child_entry() -> None:
    """`python -c _BOOTSTRAP MODULE FD`: receive the config, then run `child_main`."""
    module, fd = sys.argv[1], int(sys.argv[2])
    conn = Connection(fd)
    try:
        kind, config = conn.recv()
    except (EOFError, OSError):
        return
    if kind == "config":
        child_main(module, conn, config)


def child_main(module: str, conn: Connection, config: dict[str, Any]) -> None:
    """Entry point of a worker process: load the engine, then serve jobs until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        engine: Engine = importlib.import_module(module).load(config)
    except Exception as exc:  # top-level handler of the worker: report, then exit
        log.exception("speech worker %s failed to start", module)
        conn.send(("failed", encode_error(exc)))
        return
    trim()  # what loading the model parsed and dropped
    conn.send(("ready", engine.info))
    _serve(engine, conn)


def _serve(engine: Engine, conn: Connection) -> None:
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "job" and not _run_job(engine, conn, message[1], message[2]):
            return
        # Anything else is a cancel for a job already finished.


def _run_job(engine: Engine, conn: Connection, job_id: int, payload: Any) -> bool:
    """Serve one job; False when the worker should exit (stop received, pipe closed)."""
    state = {"cancelled": False, "stop": False}

    def cancelled() -> bool:
        while not state["cancelled"] and conn.poll():
            note = conn.recv()
            if note[0] == "stop":
                state["cancelled"] = state["stop"] = True
            elif note[0] == "cancel" and note[1] == job_id:
                state["cancelled"] = True
        return state["cancelled"]

    try:
        for item in engine.run(payload, cancelled):
            if cancelled():
                break
            conn.send(("item", job_id, item))
        conn.send(("done", job_id))
    except (BrokenPipeError, EOFError):
        return False
    except Exception as exc:  # top-level handler of one job: report it, keep serving
        if not isinstance(exc, MythicError):
            log.exception("speech worker job %s failed", job_id)
        conn.send(("error", job_id, encode_error(exc)))
    return not state["stop"]


# -- the parent side --------------------------------------------------------------------------


@dataclass(eq=False)
class Job:
    """One request in flight on a worker; read its messages with `next`, stop it with `cancel`."""

    id: int
    pool: WorkerPool
    worker: _Worker
    inbox: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    finished: bool = False
    cancelled: bool = False

    async def next(self, timeout_s: float) -> tuple[bool, Any]:
        """The next item: (True, item), or (False, None) when the job is done.

        Raises the job's typed error, `SpeechWorkerError` if the worker died,
        `SpeechPoolClosedError` if the pool was closed, or `SpeechTimeoutError` (after
        killing the worker) if nothing came within `timeout_s`.
        """
        if self.cancelled:
            return False, None
        try:
            async with asyncio.timeout(timeout_s):
                message = await self.inbox.get()
        except TimeoutError:
            self.pool.kill_worker(self.worker, f"no answer to job {self.id} in {timeout_s:g} s")
            raise _errors.SpeechTimeoutError(
                f"{self.pool.name} worker did not answer within {timeout_s:g} s; it was restarted"
            ) from None
        kind = message[0]
        if kind == "item":
            return True, message[1]
        if kind == "done":
            return False, None
        if kind == "error":
            raise decode_error(message[1])
        if kind == "closed":
            raise _errors.SpeechPoolClosedError(f"the {self.pool.name} pool was closed")
        raise _errors.SpeechWorkerError(
            f"{self.pool.name} worker exited while serving a request ({message[1]}); "
            "it was restarted"
        )

    def cancel(self) -> None:
        """Stop the job: the worker stops sending within one item; nothing more arrives."""
        if self.cancelled or self.finished:
            self.cancelled = True
            return
        self.cancelled = True
        self.pool.send_cancel(self)


@dataclass(eq=False)
class _Worker:
    slot: int
    process: subprocess.Popen[bytes]
    conn: Connection
    pidfd: int | None
    ready: asyncio.Future[dict[str, Any]]
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    job: Job | None = None
    info: dict[str, Any] = field(default_factory=dict)


class WorkerPool:
    """N worker processes serving jobs one at a time each; see the module docstring.

    Args:
        name: for messages and logs (`asr`, `tts`).
        module: the worker module, imported in the child only; it defines `load(config)`.
        config: plain data handed to `load`.
        size: number of processes.
        start_timeout_s: longest wait for a process to report ready.
    """

    def __init__(
        self,
        name: str,
        module: str,
        config: dict[str, Any],
        *,
        size: int,
        start_timeout_s: float,
    ) -> None:
        if size < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.name = name
        self.module = module
        self.config = config
        self.size = size
        self.start_timeout_s = start_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: dict[int, _Worker] = {}
        self._idle: deque[_Worker] = deque()
        self._waiters: deque[asyncio.Future[_Worker]] = deque()
        self._ids = itertools.count(1)
        self._started = False
        self._closed = False
        self._broken: MythicError | None = None
        self.restarts = 0

    # -- lifecycle

    async def start(self) -> None:
        """Spawn the workers and wait until each has loaded its model.

        Raises the typed error a worker reported (a missing model or extra), or
        `SpeechWorkerError` when one exits or does not get ready within `start_timeout_s`.
        """
        if self._closed:
            raise _errors.SpeechPoolClosedError(f"the {self.name} pool is closed")
        if self._started:
            return
        self._loop = asyncio.get_running_loop()
        self._started = True
        for slot in range(self.size):
            self._spawn(slot)
        try:
            async with asyncio.timeout(self.start_timeout_s):
                await asyncio.gather(*(w.ready for w in self._workers.values()))
        except TimeoutError:
            await self.close()
            raise _errors.SpeechWorkerError(
                f"{self.name} workers did not start within {self.start_timeout_s:g} s"
            ) from None
        except MythicError:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop every worker (killing any that does not exit promptly); idempotent."""
        if self._closed:
            return
        self._closed = True
        closed = _errors.SpeechPoolClosedError(f"the {self.name} pool is closed")
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(closed)
        workers = list(self._workers.values())
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.conn.send(("stop",))
        for worker in workers:
            try:
                async with asyncio.timeout(_STOP_GRACE_S):
                    await worker.exited.wait()
            except TimeoutError:
                self.kill_worker(worker, "it did not stop when closed")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(worker.process.wait, _STOP_GRACE_S)
            self._forget(worker)
        self._idle.clear()
        self._workers.clear()

    @property
    def started(self) -> bool:
        """Whether `start` has run and `close` has not."""
        return self._started and not self._closed

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (for operators and tests)."""
        return [w.process.pid for w in self._workers.values() if not w.exited.is_set()]

    @property
    def infos(self) -> list[dict[str, Any]]:
        """What each ready worker reported about itself at start-up."""
        return [w.info for w in self._workers.values() if w.ready.done() and w.info]

    # -- jobs

    async def submit(self, payload: Any, *, wait: bool, timeout_s: float) -> Job:
        """Hand `payload` to a free worker and return its job.

        Args:
            payload: plain data for the worker engine's `run`.
            wait: wait up to `timeout_s` for a worker to be free; False raises
                `SpeechBusyError` at once when none is.
            timeout_s: longest wait for a free worker.
        """
        worker = await self._acquire(wait=wait, timeout_s=timeout_s)
        job = Job(next(self._ids), self, worker)
        worker.job = job
        message = ("job", job.id, payload)
        try:
            if _payload_size(payload) > _SEND_IN_THREAD:
                async with asyncio.timeout(timeout_s):
                    await asyncio.to_thread(worker.conn.send, message)
            else:
                worker.conn.send(message)
        except (OSError, TimeoutError) as exc:
            self.kill_worker(worker, f"cannot send a job: {exc}")
            raise _errors.SpeechWorkerError(
                f"{self.name} worker could not take the request; it was restarted"
            ) from exc
        return job

    def send_cancel(self, job: Job) -> None:
        """Tell the job's worker to stop it; its remaining messages are dropped."""
        with contextlib.suppress(OSError):
            job.worker.conn.send(("cancel", job.id))

    def kill_worker(self, worker: _Worker, reason: str) -> None:
        """Kill a worker (stuck or broken); its exit is then handled like any death."""
        log.warning("%s worker %s killed: %s", self.name, worker.process.pid, reason)
        with contextlib.suppress(OSError):
            worker.process.kill()

    async def _acquire(self, *, wait: bool, timeout_s: float) -> _Worker:
        if not self._started or self._closed:
            raise _errors.SpeechPoolClosedError(f"the {self.name} pool is not running")
        if self._broken is not None:
            raise self._broken
        if self._idle:
            return self._idle.popleft()
        if not wait:
            raise _errors.SpeechBusyError(f"every {self.name} worker is busy")
        assert self._loop is not None
        waiter: asyncio.Future[_Worker] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            # Handed a worker just as the wait was given up: give it back.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())
            if isinstance(exc, TimeoutError):
                raise _errors.SpeechBusyError(
                    f"no {self.name} worker was free within {timeout_s:g} s"
                ) from None
            raise

    def _release(self, worker: _Worker) -> None:
        if self._closed or worker.slot not in self._workers:
            return
        if self._workers[worker.slot] is not worker or worker.exited.is_set():
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    # -- processes

    def _spawn(self, slot: int) -> None:
        assert self._loop is not None
        ours, theirs = socket.socketpair()
        env = dict(os.environ, MYTHIC_WORKER_PATH=json.dumps([p or os.getcwd() for p in sys.path]))
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, self.module, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        conn.send(("config", self.config))
        pidfd = _pidfd(process.pid)
        worker = _Worker(slot, process, conn, pidfd, self._loop.create_future())
        self._workers[slot] = worker
        self._loop.add_reader(conn.fileno(), self._on_readable, worker)
        if pidfd is not None:
            self._loop.add_reader(pidfd, self._on_exit, worker)

    def _on_readable(self, worker: _Worker) -> None:
        if not self._drain(worker) and self._loop is not None:
            # The child closed its end: it is exiting.
            if worker.pidfd is None:
                self._on_exit(worker)  # no pidfd to tell us: the end of the socket does
            else:
                with contextlib.suppress(ValueError, OSError):
                    self._loop.remove_reader(worker.conn.fileno())

    def _drain(self, worker: _Worker) -> bool:
        """Dispatch every message waiting in the worker's pipe; False at end of file."""
        try:
            while worker.conn.poll():
                self._dispatch(worker, worker.conn.recv())
        except (EOFError, OSError):
            return False
        return True

    def _dispatch(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            worker.info = message[1]
            if not worker.ready.done():
                worker.ready.set_result(message[1])
            self._release(worker)
            return
        if kind == "failed":
            error = decode_error(message[1])
            if not worker.ready.done():
                worker.ready.set_exception(error)
                worker.ready.exception()  # retrieved: start() or the log reports it
            if self._started and not self._closed and self._broken is None:
                # A worker that cannot load its model will not load it on a restart either.
                log.error("%s worker failed to start: %s", self.name, error)
                self._break(error)
            return
        job = worker.job
        if job is None or job.id != message[1]:
            return
        if kind in ("done", "error"):
            job.finished = True
            worker.job = None
            self._release(worker)
        if not job.cancelled:
            job.inbox.put_nowait((kind, *message[2:]))

    def _on_exit(self, worker: _Worker) -> None:
        if worker.exited.is_set():
            return
        worker.exited.set()
        self._drain(worker)  # what it sent before it died (a last item, "done", "failed")
        self._forget(worker)
        code = worker.process.returncode
        if not worker.ready.done():
            worker.ready.set_exception(
                _errors.SpeechWorkerError(
                    f"{self.name} worker exited during start-up (exit code {code})"
                )
            )
            worker.ready.exception()
        job, worker.job = worker.job, None
        if job is not None:
            job.finished = True
            job.inbox.put_nowait(("closed",) if self._closed else ("died", f"exit code {code}"))
        with contextlib.suppress(ValueError):
            self._idle.remove(worker)
        if self._closed or self._workers.get(worker.slot) is not worker:
            return
        if self._broken is not None:
            del self._workers[worker.slot]
            return
        log.warning(
            "%s worker %s exited (code %s); restarting it", self.name, worker.process.pid, code
        )
        self.restarts += 1
        try:
            self._spawn(worker.slot)
        except OSError as exc:
            del self._workers[worker.slot]
            self._break(_errors.SpeechWorkerError(f"cannot restart a {self.name} worker: {exc}"))

    def _break(self, error: MythicError) -> None:
        """No more workers will come: every request from now on (and every waiting one)
        fails with `error`."""
        self._broken = error
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def _forget(self, worker: _Worker) -> None:
        """Stop watching a worker that has exited (or is being closed) and reap it."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(worker.conn.fileno())
            if worker.pidfd is not None:
                self._loop.remove_reader(worker.pidfd)
        if worker.pidfd is not None:
            os.close(worker.pidfd)
            worker.pidfd = None
        with contextlib.suppress(OSError):
            worker.conn.close()
        # The process has exited (its pidfd or socket said so): this reaps it at once.
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(_REAP_S)


def _pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when the process exits (Linux 5.3+)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _payload_size(payload: Any) -> int:
    if isinstance(payload, dict):
        return sum(len(v) for v in payload.values() if isinstance(v, bytes | bytearray))
    return 0


class PooledWorkers:
    """What a model served by a `WorkerPool` shares: start (by the subclass), close, and the
    async context manager that does both; the workers' pids and restarts."""

    _pool: WorkerPool | None = None

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Stop the workers; idempotent."""
        if self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return self._pool.pids if self._pool is not None else []

    @property
    def restarts(self) -> int:
        """Workers restarted after dying or hanging, since start."""
        return self._pool.restarts if self._pool is not None else 0
