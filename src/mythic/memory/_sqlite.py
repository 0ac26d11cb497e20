"""One SQLite file used from one worker thread, so the event loop never waits on disk."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from mythic.memory._model import MemoryStoreError

T = TypeVar("T")


class SqliteWorker:
    """Runs functions on a connection to `path` in a dedicated thread, each in a transaction.

    `setup(db)` runs once when the connection opens (schema, pragmas)."""

    def __init__(
        self,
        path: Path,
        what: str,
        setup: Callable[[sqlite3.Connection], None],
        *,
        error: type[Exception] = MemoryStoreError,
    ) -> None:
        self.path = path
        self.error = error
        self.what = what
        self._setup = setup
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mythic-sqlite")
        self._db: sqlite3.Connection | None = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA busy_timeout=5000")
                self._setup(db)
            except (OSError, sqlite3.Error) as exc:
                raise self.error(f"cannot open the {self.what} {self.path}: {exc}") from exc
            self._db = db
        return self._db

    async def run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(db)` in one transaction on the worker thread.

        Raises:
            MemoryStoreError (or `error`): the file cannot be opened or the statement failed.
        """

        def work() -> T:
            db = self._conn()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    result = fn(db)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise self.error(f"{self.what} {self.path}: {what} failed: {exc}") from exc

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def aclose(self) -> None:
        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._pool, close)
        self._pool.shutdown(wait=True)
