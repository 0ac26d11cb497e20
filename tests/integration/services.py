"""Real Redis and PostgreSQL for the tests, and a TCP proxy that can cut them off.

URLs come from MYTHIC_TEST_REDIS_URL / MYTHIC_TEST_POSTGRES_DSN (default: the services on
127.0.0.1). A service that does not answer skips its tests, or fails them under CI=true.
Each test gets its own Redis key prefix and its own PostgreSQL schema, removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import unavailable

REDIS_URL = os.environ.get("MYTHIC_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "MYTHIC_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A fresh key prefix on the real Redis; its keys are deleted afterwards."""
    from redis.asyncio import Redis
    from redis.exceptions import RedisError

    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        unavailable(f"Redis at {REDIS_URL} is not reachable: {exc}")
    prefix = f"mythictest{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
async def postgres_dsn() -> AsyncIterator[str]:
    """A DSN on the real PostgreSQL whose search_path is a fresh schema, dropped afterwards."""
    async with fresh_schema() as dsn:
        yield dsn


@contextlib.asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """What `postgres_dsn` yields, for fixtures that choose the database by parameter."""
    import asyncpg

    try:
        admin = await asyncpg.connect(POSTGRES_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        unavailable(f"PostgreSQL at {POSTGRES_DSN} is not reachable: {exc}")
    schema = f"mythictest_{uuid.uuid4().hex[:10]}"
    await admin.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in POSTGRES_DSN else "?"
    try:
        yield f"{POSTGRES_DSN}{separator}search_path={schema}"
    finally:
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


def with_address(url: str, host: str, port: int) -> str:
    """`url` pointed at host:port instead (for going through a `Cutoff` proxy)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    user = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return parts._replace(netloc=f"{user}{host}:{port}").geturl()


class Cutoff:
    """A TCP proxy in front of a real service: `cut()` drops every connection and refuses new
    ones, as a stopped server would; `restore()` listens again on the same port."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 0)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    def url(self, url: str) -> str:
        return with_address(url, "127.0.0.1", self.port)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def restore(self) -> None:
        await self.start()

    async def aclose(self) -> None:
        await self.cut()


@contextlib.asynccontextmanager
async def cutoff(url: str) -> AsyncIterator[Cutoff]:
    proxy = Cutoff(url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.aclose()
