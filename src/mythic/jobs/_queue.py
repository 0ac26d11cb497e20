"""Bronze jobs: a durable queue with at-least-once delivery (the workers are in `_worker`).

One table, two databases: PostgreSQL (`jobs.url`; workers claim with `FOR UPDATE SKIP LOCKED`,
so many workers on many machines never take the same job) or an embedded SQLite file (the
default: `BEGIN IMMEDIATE` serialises claims between the processes sharing the file).

- A job has an idempotent id: submitting the same id twice queues it once.
- A claim leases the job for `visibility_timeout_s` under a fresh lease token; a worker that
  dies (or hangs) loses the lease and the job is delivered again, to any worker.
- Completion and the job's artifact are written in one transaction, and only under the lease
  the worker holds: a redelivered job's artifact is stored once, whichever worker finishes.
- A failed attempt is retried after `backoff_s * 2**(attempt-1)`; after `max_attempts`
  deliveries the job moves to the dead-letter list (`status: dead`) with its last error.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from mythic._errors import MythicError
from mythic._extras import require
from mythic.config import JobSettings

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger(__name__)

JobStatus = Literal["queued", "running", "done", "dead"]


class JobError(MythicError):
    """A job request is invalid (unknown kind, bad payload)."""


class JobStoreError(MythicError):
    """The job store cannot be reached or a statement failed."""

    retryable = True


# -- what jobs ask for ---------------------------------------------------------------------------

Slug = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
]
Line = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Hint = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoreJob(_Payload):
    """Worldbuilding: a lore entry about `topic`, for a zone (or the whole world)."""

    topic: Line
    zone: Slug | None = None
    npc_id: Slug | None = None
    """Lore only this NPC knows (its own shard)."""
    hint: Hint = ""


class QuestJob(_Payload):
    """Storyteller: a quest outline an NPC can offer."""

    npc_id: Slug
    hint: Hint = ""


class SummaryJob(_Payload):
    """A summary of a text (a session's events, a chronicle) an NPC then remembers."""

    npc_id: Slug
    text: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=20000)]
    title: Line = "What happened"


JOB_KINDS: dict[str, type[_Payload]] = {"lore": LoreJob, "quest": QuestJob, "summary": SummaryJob}
REQUEST_KIND_OF_JOB = {"lore": "lore_gen", "quest": "quest", "summary": "summary"}


def validate_job(kind: str, payload: object) -> dict[str, Any]:
    """The payload of a job of `kind`, checked and normalised.

    Raises:
        JobError: unknown kind, or the payload does not fit it.
    """
    model = JOB_KINDS.get(kind)
    if model is None:
        raise JobError(f"unknown job kind {kind!r}; kinds: {', '.join(JOB_KINDS)}")
    if not isinstance(payload, dict):
        raise JobError(f"a {kind} job's payload is an object, not {type(payload).__name__}")
    try:
        return model.model_validate(payload).model_dump()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in exc.errors()
        )
        raise JobError(f"invalid {kind} job: {problems}") from None


# -- records -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    kind: str
    payload: dict[str, Any]
    status: JobStatus
    attempts: int
    max_attempts: int
    available_at: float
    created_at: float
    updated_at: float
    lease_token: str | None = None
    lease_until: float | None = None
    worker: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["lease_token"]
        return data


@dataclass(frozen=True, slots=True)
class Artifact:
    """What a job made, for the stores: `lore` and `quest` become lore, `summary` memory."""

    job_id: str
    kind: str
    title: str
    text: str
    zone: str | None = None
    npc_id: str | None = None
    seq: int = 0
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_JOB_COLUMNS = (
    "job_id, kind, payload, status, attempts, max_attempts, available_at, created_at, "
    "updated_at, lease_token, lease_until, worker, error"
)
_ART_COLUMNS = "job_id, kind, title, text, zone, npc_id, seq, created_at"


def _job(row: Any) -> Job:
    payload = row[2]
    return Job(
        job_id=row[0],
        kind=row[1],
        payload=json.loads(payload) if isinstance(payload, str) else dict(payload),
        status=row[3],
        attempts=row[4],
        max_attempts=row[5],
        available_at=row[6],
        created_at=row[7],
        updated_at=row[8],
        lease_token=row[9],
        lease_until=row[10],
        worker=row[11],
        error=row[12],
    )


def _artifact(row: Any) -> Artifact:
    return Artifact(*row)


_SCHEMA = {
    "sqlite": [
        """CREATE TABLE IF NOT EXISTS mythic_jobs (
            job_id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL,
            status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL, available_at REAL NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, lease_token TEXT,
            lease_until REAL, worker TEXT, error TEXT)""",
        "CREATE INDEX IF NOT EXISTS mythic_jobs_due ON mythic_jobs (status, available_at)",
        """CREATE TABLE IF NOT EXISTS mythic_artifacts (
            job_id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, title TEXT NOT NULL,
            text TEXT NOT NULL, zone TEXT, npc_id TEXT,
            seq INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL NOT NULL)""",
    ],
    "postgres": [
        """CREATE TABLE IF NOT EXISTS mythic_jobs (
            job_id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload JSONB NOT NULL,
            status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL, available_at DOUBLE PRECISION NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
            lease_token TEXT, lease_until DOUBLE PRECISION, worker TEXT, error TEXT)""",
        "CREATE INDEX IF NOT EXISTS mythic_jobs_due ON mythic_jobs (status, available_at)",
        """CREATE TABLE IF NOT EXISTS mythic_artifacts (
            job_id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, title TEXT NOT NULL,
            text TEXT NOT NULL, zone TEXT, npc_id TEXT,
            seq BIGSERIAL PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL)""",
    ],
}


class JobQueue:
    """The durable queue and artifact store; see the module docstring for its guarantees.

    Args:
        url: `postgresql://...`, or None for the SQLite file `path`.
        clock: wall-clock seconds (leases compare times written by different processes).
    """

    def __init__(
        self,
        settings: JobSettings,
        *,
        path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.url = settings.url
        self.path = path
        self._pool: asyncpg.Pool | None = None
        self._connecting = asyncio.Lock()
        self._sqlite: Any = None
        if self.url is None:
            if path is None:
                raise ValueError("an embedded job queue needs a path")
            from mythic.memory._sqlite import SqliteWorker

            self._sqlite = SqliteWorker(path, "job queue", self._setup_sqlite, error=JobStoreError)
        elif not self.url.startswith(("postgres://", "postgresql://")):
            raise JobStoreError(
                f"jobs.url must be a postgresql:// URL, not {self.url.split(':', 1)[0]}://",
                fix="unset jobs.url for the embedded SQLite queue",
            )
        self.where = self.url.split("@")[-1] if self.url else str(path)

    @staticmethod
    def _setup_sqlite(db: sqlite3.Connection) -> None:
        for statement in _SCHEMA["sqlite"]:
            db.execute(statement)

    async def _pg(self) -> asyncpg.Pool:
        if self._pool is not None:
            return self._pool
        async with self._connecting:  # concurrent first calls open one pool
            if self._pool is not None:
                return self._pool
            asyncpg = require("asyncpg", package="asyncpg", extra="services")
            pool = None
            try:
                pool = await asyncpg.create_pool(self.url, min_size=1, max_size=4, timeout=5)
                async with pool.acquire() as conn, conn.transaction():
                    # Concurrent CREATE ... IF NOT EXISTS can collide: one process at a time.
                    await conn.execute("SELECT pg_advisory_xact_lock(7461932001)")
                    for statement in _SCHEMA["postgres"]:
                        await conn.execute(statement)
            except (OSError, asyncpg.PostgresError) as exc:
                if pool is not None:
                    await pool.close()
                raise JobStoreError(f"job queue {self.where}: {exc}") from exc
            self._pool = pool
            return pool

    async def _tx(
        self, what: str, sqlite_fn: Callable[[sqlite3.Connection], Any], pg_fn: Any
    ) -> Any:
        if self._sqlite is not None:
            return await self._sqlite.run(what, sqlite_fn)
        import asyncpg

        pool = await self._pg()
        try:
            async with pool.acquire() as conn, conn.transaction():
                return await pg_fn(conn)
        except (OSError, asyncpg.PostgresError) as exc:
            raise JobStoreError(f"job queue {self.where}: {what} failed: {exc}") from exc

    # -- submitting and reading ----------------------------------------------------------------

    async def submit(
        self, kind: str, payload: object, *, job_id: str | None = None
    ) -> tuple[Job, bool]:
        """Queue a job; (the job, whether it is new). The same `job_id` again returns the
        job already queued (idempotent).

        Raises:
            JobError: unknown kind or invalid payload, or the id is malformed.
        """
        data = validate_job(kind, payload)
        job_id = job_id or f"job-{uuid.uuid4().hex[:16]}"
        if not (0 < len(job_id) <= 128) or not job_id.isprintable() or " " in job_id:
            raise JobError("job_id must be 1-128 printable characters without spaces")
        now = self.clock()
        text = json.dumps(data, sort_keys=True)
        attempts = self.settings.max_attempts

        def lite(db: sqlite3.Connection) -> tuple[Job, bool]:
            cur = db.execute(
                "INSERT INTO mythic_jobs (job_id, kind, payload, status, max_attempts, "
                "available_at, created_at, updated_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO NOTHING",
                (job_id, kind, text, attempts, now, now, now),
            )
            row = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
            return _job(row), cur.rowcount == 1

        async def pg(conn: asyncpg.Connection) -> tuple[Job, bool]:
            status = await conn.execute(
                "INSERT INTO mythic_jobs (job_id, kind, payload, status, max_attempts, "
                "available_at, created_at, updated_at) VALUES ($1, $2, $3::jsonb, 'queued', $4, "
                "$5, $5, $5) ON CONFLICT (job_id) DO NOTHING",
                job_id,
                kind,
                text,
                attempts,
                now,
            )
            row = await conn.fetchrow(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE job_id = $1", job_id
            )
            return _job(row), status.endswith(" 1")

        job, created = await self._tx("submit", lite, pg)
        if not created and (job.kind != kind or job.payload != data):
            raise JobError(f"job {job_id!r} exists with another kind or payload")
        return job, created

    async def get(self, job_id: str) -> tuple[Job, Artifact | None] | None:
        def lite(db: sqlite3.Connection) -> Any:
            job = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
            art = db.execute(
                f"SELECT {_ART_COLUMNS} FROM mythic_artifacts WHERE job_id = ?", (job_id,)
            ).fetchone()
            return job, art

        async def pg(conn: asyncpg.Connection) -> Any:
            job = await conn.fetchrow(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE job_id = $1", job_id
            )
            art = await conn.fetchrow(
                f"SELECT {_ART_COLUMNS} FROM mythic_artifacts WHERE job_id = $1", job_id
            )
            return job, art

        job, art = await self._tx("get", lite, pg)
        if job is None:
            return None
        return _job(job), _artifact(art) if art is not None else None

    async def list(
        self, status: JobStatus | None = None, *, limit: int = 100
    ) -> builtins.list[Job]:
        """Jobs, newest first (`status: dead`: the dead-letter list)."""

        def lite(db: sqlite3.Connection) -> list[Any]:
            where, args = ("WHERE status = ?", [status]) if status else ("", [])
            return db.execute(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs {where} ORDER BY created_at DESC LIMIT ?",
                (*args, limit),
            ).fetchall()

        async def pg(conn: asyncpg.Connection) -> list[Any]:
            if status:
                return list(
                    await conn.fetch(
                        f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE status = $1 "
                        "ORDER BY created_at DESC LIMIT $2",
                        status,
                        limit,
                    )
                )
            return list(
                await conn.fetch(
                    f"SELECT {_JOB_COLUMNS} FROM mythic_jobs ORDER BY created_at DESC LIMIT $1",
                    limit,
                )
            )

        return [_job(row) for row in await self._tx("list", lite, pg)]

    async def artifacts(self, after: int = 0, *, limit: int = 1000) -> builtins.list[Artifact]:
        """Artifacts stored after sequence number `after`, oldest first."""

        def lite(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT {_ART_COLUMNS} FROM mythic_artifacts WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()

        async def pg(conn: asyncpg.Connection) -> list[Any]:
            return list(
                await conn.fetch(
                    f"SELECT {_ART_COLUMNS} FROM mythic_artifacts WHERE seq > $1 "
                    "ORDER BY seq LIMIT $2",
                    after,
                    limit,
                )
            )

        return [_artifact(row) for row in await self._tx("artifacts", lite, pg)]

    # -- working -------------------------------------------------------------------------------

    async def claim(self, worker: str, *, kinds: tuple[str, ...] = ()) -> Job | None:
        """Lease the next due job (queued, or running with an expired lease) to `worker`;
        None when there is none. A job whose lease expired after its last allowed delivery
        moves to the dead-letter list instead."""
        now = self.clock()
        until = now + self.settings.visibility_timeout_s
        token = uuid.uuid4().hex
        wanted = list(kinds or JOB_KINDS)
        expired_error = "the worker stopped answering (visibility timeout) on its last attempt"

        def lite(db: sqlite3.Connection) -> Any:
            db.execute(
                "UPDATE mythic_jobs SET status = 'dead', error = ?, updated_at = ?, "
                "lease_token = NULL WHERE status = 'running' AND lease_until < ? "
                "AND attempts >= max_attempts",
                (expired_error, now, now),
            )
            marks = ", ".join("?" for _ in wanted)
            row = db.execute(
                "SELECT job_id FROM mythic_jobs WHERE ((status = 'queued' AND available_at <= ?) "
                f"OR (status = 'running' AND lease_until < ?)) AND kind IN ({marks}) "
                "ORDER BY available_at LIMIT 1",
                (now, now, *wanted),
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE mythic_jobs SET status = 'running', attempts = attempts + 1, "
                "lease_token = ?, lease_until = ?, worker = ?, updated_at = ? WHERE job_id = ?",
                (token, until, worker, now, row[0]),
            )
            return db.execute(
                f"SELECT {_JOB_COLUMNS} FROM mythic_jobs WHERE job_id = ?", (row[0],)
            ).fetchone()

        async def pg(conn: asyncpg.Connection) -> Any:
            await conn.execute(
                "UPDATE mythic_jobs SET status = 'dead', error = $1, updated_at = $2, "
                "lease_token = NULL WHERE status = 'running' AND lease_until < $2 "
                "AND attempts >= max_attempts",
                expired_error,
                now,
            )
            return await conn.fetchrow(
                "UPDATE mythic_jobs SET status = 'running', attempts = attempts + 1, "
                "lease_token = $1, lease_until = $2, worker = $3, updated_at = $4 "
                "WHERE job_id = (SELECT job_id FROM mythic_jobs WHERE "
                "((status = 'queued' AND available_at <= $4) OR "
                "(status = 'running' AND lease_until < $4)) AND kind = ANY($5::text[]) "
                "ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
                f"RETURNING {_JOB_COLUMNS}",
                token,
                until,
                worker,
                now,
                wanted,
            )

        row = await self._tx("claim", lite, pg)
        return _job(row) if row is not None else None

    async def extend(self, job: Job) -> bool:
        """Renew the lease of a job being worked on; False when it was lost (expired and
        claimed by another worker)."""
        now = self.clock()
        until = now + self.settings.visibility_timeout_s

        def lite(db: sqlite3.Connection) -> int:
            return db.execute(
                "UPDATE mythic_jobs SET lease_until = ?, updated_at = ? WHERE job_id = ? "
                "AND lease_token = ? AND status = 'running'",
                (until, now, job.job_id, job.lease_token),
            ).rowcount

        async def pg(conn: asyncpg.Connection) -> int:
            status = await conn.execute(
                "UPDATE mythic_jobs SET lease_until = $1, updated_at = $2 WHERE job_id = $3 "
                "AND lease_token = $4 AND status = 'running'",
                until,
                now,
                job.job_id,
                job.lease_token,
            )
            return int(status.rsplit(" ", 1)[-1])

        return bool(await self._tx("extend", lite, pg))

    async def complete(self, job: Job, artifact: Artifact) -> bool:
        """Mark the job done and store its artifact, in one transaction, if the lease is still
        this worker's; False (nothing written) when another worker took the job over."""
        now = self.clock()
        a = artifact

        def lite(db: sqlite3.Connection) -> bool:
            done = db.execute(
                "UPDATE mythic_jobs SET status = 'done', lease_token = NULL, error = NULL, "
                "updated_at = ? WHERE job_id = ? AND lease_token = ? AND status = 'running'",
                (now, job.job_id, job.lease_token),
            ).rowcount
            if not done:
                return False
            db.execute(
                "INSERT INTO mythic_artifacts (job_id, kind, title, text, zone, npc_id, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO NOTHING",
                (job.job_id, a.kind, a.title, a.text, a.zone, a.npc_id, now),
            )
            return True

        async def pg(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE mythic_jobs SET status = 'done', lease_token = NULL, error = NULL, "
                "updated_at = $1 WHERE job_id = $2 AND lease_token = $3 AND status = 'running'",
                now,
                job.job_id,
                job.lease_token,
            )
            if status.endswith(" 0"):
                return False
            await conn.execute(
                "INSERT INTO mythic_artifacts (job_id, kind, title, text, zone, npc_id, "
                "created_at) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job_id) DO NOTHING",
                job.job_id,
                a.kind,
                a.title,
                a.text,
                a.zone,
                a.npc_id,
                now,
            )
            return True

        return bool(await self._tx("complete", lite, pg))

    async def fail(self, job: Job, error: str, *, permanent: bool = False) -> JobStatus | None:
        """Record a failed attempt: queued again after the backoff, or dead after the last
        attempt (or at once when `permanent`). None when the lease was lost."""
        now = self.clock()
        dead = permanent or job.attempts >= job.max_attempts
        status: JobStatus = "dead" if dead else "queued"
        retry_at = now + self.settings.backoff_s * 2 ** max(0, job.attempts - 1)
        error = error[:2000]

        def lite(db: sqlite3.Connection) -> int:
            return db.execute(
                "UPDATE mythic_jobs SET status = ?, error = ?, available_at = ?, "
                "lease_token = NULL, updated_at = ? WHERE job_id = ? AND lease_token = ? "
                "AND status = 'running'",
                (status, error, retry_at, now, job.job_id, job.lease_token),
            ).rowcount

        async def pg(conn: asyncpg.Connection) -> int:
            result = await conn.execute(
                "UPDATE mythic_jobs SET status = $1, error = $2, available_at = $3, "
                "lease_token = NULL, updated_at = $4 WHERE job_id = $5 AND lease_token = $6 "
                "AND status = 'running'",
                status,
                error,
                retry_at,
                now,
                job.job_id,
                job.lease_token,
            )
            return int(result.rsplit(" ", 1)[-1])

        return status if await self._tx("fail", lite, pg) else None

    async def aclose(self) -> None:
        if self._sqlite is not None:
            await self._sqlite.aclose()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


def open_queue(settings: JobSettings, data_dir: Path) -> JobQueue:
    """The configured queue: PostgreSQL at `jobs.url`, else SQLite in `data_dir`."""
    return JobQueue(settings, path=None if settings.url else data_dir / "jobs.sqlite3")
