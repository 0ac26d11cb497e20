"""The cold tier: the append-only lifetime archive, in PostgreSQL or (embedded) SQLite.

Nothing on a turn's path reads or awaits it: the archiver writes to it in batches, and only
`mythic memory show`, the tests and offline jobs read it. The schema is created by versioned
migrations (`mythic db migrate`), the same tables in both databases.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mythic._extras import require
from mythic.memory._model import (
    CorruptRecordError,
    MemoryEvent,
    MemoryStoreError,
)
from mythic.memory._sqlite import SqliteWorker

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger(__name__)

SNAPSHOT_KINDS = ("card", "fact", "emotion")
"""Kinds whose older rows a compaction may drop: each row is a snapshot that a newer one of the
same NPCxplayer supersedes. Turns, events and summaries are never compacted."""

_COLUMNS = "event_id, kind, npc_id, player_id, session_id, role, ts, text, data, game_time"


class MigrationError(MemoryStoreError):
    """The archive's schema is missing, too new, or a migration failed."""

    retryable = False


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(dialect: str) -> list[Migration]:
    """The versioned migrations of `dialect` (`postgres` or `sqlite`), oldest first."""
    folder = resources.files("mythic.memory") / "migrations" / dialect
    found = []
    for item in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", item.name)
        if match:
            found.append(Migration(int(match[1]), match[2], item.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    player_id: str | None = None
    npc_id: str | None = None
    since: float | None = None
    until: float | None = None
    kinds: tuple[str, ...] = ()
    limit: int = 1000


class ColdStore(Protocol):
    """What the cold tier does, whichever database holds it."""

    name: str

    async def migrate(self) -> list[Migration]: ...
    async def append(self, events: list[MemoryEvent]) -> int: ...
    async def history(self, query: HistoryQuery) -> list[MemoryEvent]: ...
    async def count(self, player_id: str | None = None) -> int: ...
    async def forget(self, player_id: str) -> int: ...
    async def compact(self, older_than: float) -> int: ...
    async def aclose(self) -> None: ...


def _event(row: Any, data: Any) -> MemoryEvent | None:
    try:
        return MemoryEvent.from_dict(
            {
                "event_id": row[0],
                "kind": row[1],
                "npc_id": row[2],
                "player_id": row[3],
                "session_id": row[4],
                "role": row[5],
                "ts": row[6],
                "text": row[7],
                "data": json.loads(data) if isinstance(data, str) else data,
                "game_time": row[9],
            }
        )
    except (CorruptRecordError, ValueError) as exc:
        log.warning("cold archive: skipping corrupt row %s: %s", row[0], exc)
        return None


def _json(data: dict[str, Any] | None) -> str | None:
    return None if data is None else json.dumps(data, ensure_ascii=False)


# -- PostgreSQL -------------------------------------------------------------------------------


class PostgresCold:
    """The archive in PostgreSQL via an asyncpg pool (opened on first use, so a database that
    is down at start only delays the archive)."""

    name = "postgres"

    def __init__(self, dsn: str, *, timeout_s: float = 5.0) -> None:
        self._asyncpg = require("asyncpg", package="asyncpg", extra="services")
        self.dsn = dsn
        self.timeout_s = timeout_s
        self._pool: asyncpg.Pool | None = None

    async def _connect(self) -> asyncpg.Pool:
        if self._pool is None:
            try:
                self._pool = await self._asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=4,
                    timeout=self.timeout_s,
                    command_timeout=self.timeout_s,
                )
            except (OSError, TimeoutError, self._asyncpg.PostgresError) as exc:
                raise MemoryStoreError(f"cannot connect to PostgreSQL: {exc}") from exc
        return self._pool

    async def _run(self, what: str, sql: str, *args: Any, fetch: bool = True) -> Any:
        pool = await self._connect()
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn:
                if fetch:
                    return await conn.fetch(sql, *args)
                return await conn.execute(sql, *args)
        except self._asyncpg.UndefinedTableError as exc:
            raise MigrationError(
                "the memory archive has no tables yet", fix="mythic db migrate"
            ) from exc
        except (OSError, TimeoutError, self._asyncpg.PostgresError) as exc:
            raise MemoryStoreError(f"PostgreSQL: {what} failed: {exc}") from exc
        except self._asyncpg.InterfaceError as exc:
            raise MemoryStoreError(f"PostgreSQL: {what} failed: {exc}") from exc

    async def migrate(self) -> list[Migration]:
        pool = await self._connect()
        applied: list[Migration] = []
        try:
            async with pool.acquire(timeout=self.timeout_s) as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('mythic_schema'))")
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS mythic_schema (version INTEGER PRIMARY KEY, "
                    "name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                )
                current = await conn.fetchval("SELECT max(version) FROM mythic_schema") or 0
                known = migrations("postgres")
                if known and current > known[-1].version:
                    raise MigrationError(
                        f"the archive's schema is version {current}, newer than this Mythic's "
                        f"{known[-1].version}",
                        fix="upgrade Mythic",
                    )
                for migration in known:
                    if migration.version > current:
                        await conn.execute(migration.sql)
                        await conn.execute(
                            "INSERT INTO mythic_schema (version, name) VALUES ($1, $2)",
                            migration.version,
                            migration.name,
                        )
                        applied.append(migration)
        except (OSError, TimeoutError, self._asyncpg.PostgresError) as exc:
            raise MigrationError(f"PostgreSQL migration failed: {exc}") from exc
        return applied

    async def append(self, events: list[MemoryEvent]) -> int:
        if not events:
            return 0
        columns = list(zip(*(_row(e) for e in events), strict=True))
        rows = await self._run(
            "append",
            f"WITH ins AS (INSERT INTO memory_events ({_COLUMNS}) "
            "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], "
            "$6::text[], $7::float8[], $8::text[], $9::jsonb[], $10::bigint[]) "
            "ON CONFLICT (event_id) DO NOTHING RETURNING 1) SELECT count(*) FROM ins",
            *(list(c) for c in columns),
        )
        return int(rows[0][0])

    async def history(self, query: HistoryQuery) -> list[MemoryEvent]:
        where, args = _where(query, lambda i: f"${i}")
        rows = await self._run(
            "query",
            f"SELECT {_COLUMNS} FROM memory_events {where} ORDER BY ts, seq LIMIT ${len(args) + 1}",
            *args,
            query.limit,
        )
        return [e for r in rows if (e := _event(r, r[8])) is not None]

    async def count(self, player_id: str | None = None) -> int:
        where, args = _where(HistoryQuery(player_id=player_id), lambda i: f"${i}")
        rows = await self._run("count", f"SELECT count(*) FROM memory_events {where}", *args)
        return int(rows[0][0])

    async def forget(self, player_id: str) -> int:
        status = await self._run(
            "forget", "DELETE FROM memory_events WHERE player_id = $1", player_id, fetch=False
        )
        return int(str(status).rsplit(" ", 1)[-1])

    async def compact(self, older_than: float) -> int:
        status = await self._run(
            "compact",
            "DELETE FROM memory_events e WHERE e.kind = ANY($1::text[]) AND e.ts < $2 AND "
            "EXISTS (SELECT 1 FROM memory_events n WHERE n.npc_id = e.npc_id AND "
            "n.player_id = e.player_id AND n.kind = e.kind AND "
            "coalesce(n.data->>'name', '') = coalesce(e.data->>'name', '') AND n.seq > e.seq)",
            list(SNAPSHOT_KINDS),
            older_than,
            fetch=False,
        )
        await self._run("analyze", "ANALYZE memory_events", fetch=False)
        return int(str(status).rsplit(" ", 1)[-1])

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await pool.close()
            except (OSError, TimeoutError, self._asyncpg.PostgresError):
                pool.terminate()


def _row(e: MemoryEvent) -> tuple[Any, ...]:
    return (
        e.event_id,
        e.kind,
        e.npc_id,
        e.player_id,
        e.session_id,
        e.role,
        e.ts,
        e.text,
        _json(e.data),
        e.game_time,
    )


def _where(query: HistoryQuery, param: Any) -> tuple[str, list[Any]]:
    clauses, args = [], []

    def add(sql: str, value: Any) -> None:
        args.append(value)
        clauses.append(sql.format(param(len(args))))

    if query.player_id is not None:
        add("player_id = {}", query.player_id)
    if query.npc_id is not None:
        add("npc_id = {}", query.npc_id)
    if query.since is not None:
        add("ts >= {}", query.since)
    if query.until is not None:
        add("ts < {}", query.until)
    if query.kinds:
        parts = []
        for kind in query.kinds:
            args.append(kind)
            parts.append(f"kind = {param(len(args))}")
        clauses.append(f"({' OR '.join(parts)})")
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args


# -- SQLite (embedded) ------------------------------------------------------------------------


class SqliteCold:
    """The archive in a SQLite file: the same schema and migrations, for one machine."""

    name = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._worker = SqliteWorker(path, "memory archive", lambda db: None)

    async def migrate(self) -> list[Migration]:
        def work(db: sqlite3.Connection) -> list[Migration]:
            db.execute(
                "CREATE TABLE IF NOT EXISTS mythic_schema (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = db.execute("SELECT max(version) FROM mythic_schema").fetchone()[0] or 0
            known = migrations("sqlite")
            if known and current > known[-1].version:
                raise MigrationError(
                    f"the archive {self.path} has schema version {current}, newer than this "
                    f"Mythic's {known[-1].version}",
                    fix="upgrade Mythic",
                )
            applied = []
            for migration in known:
                if migration.version > current:
                    for statement in _statements(migration.sql):
                        db.execute(statement)
                    db.execute(
                        "INSERT INTO mythic_schema VALUES (?, ?, julianday('now'))",
                        (migration.version, migration.name),
                    )
                    applied.append(migration)
            return applied

        return await self._worker.run("migrate", work)

    async def append(self, events: list[MemoryEvent]) -> int:
        if not events:
            return 0

        def work(db: sqlite3.Connection) -> int:
            before = db.total_changes
            db.executemany(
                f"INSERT OR IGNORE INTO memory_events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [_row(e) for e in events],
            )
            return db.total_changes - before

        return await self._worker.run("append", work)

    async def _query(self, what: str, sql: str, args: list[Any]) -> list[Any]:
        def work(db: sqlite3.Connection) -> list[Any]:
            try:
                return db.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    raise MigrationError(
                        f"the memory archive {self.path} has no tables yet", fix="mythic db migrate"
                    ) from exc
                raise

        return await self._worker.run(what, work)

    async def history(self, query: HistoryQuery) -> list[MemoryEvent]:
        where, args = _where(query, lambda i: "?")
        rows = await self._query(
            "query",
            f"SELECT {_COLUMNS} FROM memory_events {where} ORDER BY ts, seq LIMIT ?",
            [*args, query.limit],
        )
        return [e for r in rows if (e := _event(r, r[8])) is not None]

    async def count(self, player_id: str | None = None) -> int:
        where, args = _where(HistoryQuery(player_id=player_id), lambda i: "?")
        rows = await self._query("count", f"SELECT count(*) FROM memory_events {where}", args)
        return int(rows[0][0])

    async def forget(self, player_id: str) -> int:
        def work(db: sqlite3.Connection) -> int:
            return db.execute(
                "DELETE FROM memory_events WHERE player_id = ?", (player_id,)
            ).rowcount

        return await self._worker.run("forget", work)

    async def compact(self, older_than: float) -> int:
        marks = ",".join("?" * len(SNAPSHOT_KINDS))

        def work(db: sqlite3.Connection) -> int:
            return db.execute(
                f"DELETE FROM memory_events AS e WHERE e.kind IN ({marks}) AND e.ts < ? AND "
                "EXISTS (SELECT 1 FROM memory_events n WHERE n.npc_id = e.npc_id AND "
                "n.player_id = e.player_id AND n.kind = e.kind AND "
                "coalesce(json_extract(n.data, '$.name'), '') = "
                "coalesce(json_extract(e.data, '$.name'), '') AND n.seq > e.seq)",
                (*SNAPSHOT_KINDS, older_than),
            ).rowcount

        return await self._worker.run("compact", work)

    async def aclose(self) -> None:
        await self._worker.aclose()


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (they hold no semicolons inside literals)."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def open_cold(url: str | None, default_path: Path) -> ColdStore:
    """`postgresql://...` → PostgreSQL; `sqlite:///path` or None → a SQLite file."""
    if url is None:
        return SqliteCold(default_path)
    if url.startswith(("postgres://", "postgresql://")):
        return PostgresCold(url)
    if url.startswith("sqlite:///"):
        return SqliteCold(Path(url.removeprefix("sqlite:///")))
    raise MemoryStoreError(f"memory.cold_url {url!r}: expected postgresql://... or sqlite:///path")
