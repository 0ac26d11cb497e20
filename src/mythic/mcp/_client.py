"""Mythic as an MCP client: a connection to each configured MCP server, kept open and made
again when it fails, whose tools NPCs call inside a silver turn.

Every call is bounded: its arguments are checked against the tool's schema before it leaves,
it has `mcp.call_timeout_s` to answer, its result is capped, and a server that keeps failing
is skipped by its breaker (`mythic.route.Breaker`) until one call probes it again. Read
tools' results are cached, so gold reads them without waiting on a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import anyio
import pydantic
from mcp import Client, MCPError, StdioServerParameters
from mcp.server import MCPServer, Server
from mcp_types import CONNECTION_CLOSED

from mythic.config import McpServerSettings, McpSettings
from mythic.mcp._errors import (
    McpError,
    McpServerError,
    McpTimeoutError,
    McpToolNotAllowedError,
    McpUnavailableError,
)
from mythic.mcp._tools import (
    AllowList,
    CachedResult,
    McpTool,
    ResultCache,
    result_of,
    tool_of,
    validate_args,
)
from mythic.route import Breaker

log = logging.getLogger(__name__)

InProcess = Server[Any] | MCPServer
"""An MCP server object in this process (tests, a game embedding Mythic)."""

_TRANSPORT_ERRORS = (
    MCPError,
    pydantic.ValidationError,
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    OSError,
)
"""What a call raises when its server crashed, closed the connection, or sent a malformed
answer."""


@dataclass(frozen=True, slots=True)
class McpOutcome:
    """How a call ended, for the NPC: `ok` with its result, or why not."""

    status: Literal["ok", "error", "rejected", "timeout"]
    result: dict[str, Any] | None = None
    message: str | None = None


@dataclass(slots=True)
class _Connection:
    """One server: its session while connected, its tools, its breaker."""

    settings: McpServerSettings
    breaker: Breaker
    target: InProcess | None = None
    client: Client | None = None
    tools: dict[str, McpTool] = field(default_factory=dict)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call finds the connection dead: the keeper connects again."""
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    connects: int = 0
    """Times a connection (and its tool listing) succeeded."""

    def transport(self) -> InProcess | StdioServerParameters | str:
        if self.target is not None:
            return self.target
        s = self.settings
        if s.transport == "http":
            assert s.url is not None  # checked by McpServerSettings
            return s.url
        assert s.command is not None
        return StdioServerParameters(command=s.command, args=s.args, env=s.env)


class McpClient:
    """The MCP servers of `mcp.servers`, their tools as NPC tools (`server.tool`).

    `run()` keeps the connections (the gateway runs it in its task group); `async with`
    does the same for a block and waits for the first connections. `in_process`: server
    objects by name, connected in memory instead of their configured transport.
    """

    def __init__(
        self,
        settings: McpSettings,
        *,
        in_process: Mapping[str, InProcess] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.allow = AllowList(settings.npcs)
        self.cache = ResultCache(settings.cache_ttl_s, clock)
        configured = {s.name: s for s in settings.servers}
        self._connections: dict[str, _Connection] = {}
        for name, s in configured.items():
            self._connections[name] = _Connection(s, self._breaker(clock))
        for name, target in (in_process or {}).items():
            s = configured.get(name) or McpServerSettings(name=name, command="(in process)")
            self._connections[name] = _Connection(s, self._breaker(clock), target=target)
        self._runner: asyncio.Task[None] | None = None

    def _breaker(self, clock: Callable[[], float]) -> Breaker:
        s = self.settings
        return Breaker(s.breaker_failures, s.breaker_cooldown_s, clock)

    # -- connections --------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep every server connected until cancelled, connecting again after a failure."""
        async with asyncio.TaskGroup() as group:
            for connection in self._connections.values():
                group.create_task(self._keep(connection))

    async def _keep(self, connection: _Connection) -> None:
        name = connection.settings.name
        while True:
            connection.lost.clear()
            try:
                async with contextlib.AsyncExitStack() as stack:
                    # The handshake too: a server that accepts but never answers would hold
                    # the keeper in `Client.__aenter__`, never trying again.
                    async with asyncio.timeout(self.settings.connect_timeout_s):
                        client = await stack.enter_async_context(Client(connection.transport()))
                        listed = await client.list_tools()
                    tools = [tool_of(connection.settings, t) for t in listed.tools]
                    connection.tools = {t.tool: t for t in tools if t is not None}
                    connection.client = client
                    connection.connects += 1
                    connection.connected.set()
                    log.info("MCP server %s: %d tools", name, len(connection.tools))
                    await connection.lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception:  # top level of the connection: log it, connect again
                log.warning("MCP server %s: connection failed", name, exc_info=True)
            finally:
                connection.client = None
                connection.connected.clear()
            await asyncio.sleep(self.settings.reconnect_s)

    async def __aenter__(self) -> McpClient:
        self._runner = asyncio.create_task(self.run())
        await self.wait_connected()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None

    async def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Wait (at most `timeout_s`, default `mcp.connect_timeout_s`) until every server is
        connected; False if some are not (they keep trying)."""
        waits = [c.connected.wait() for c in self._connections.values()]
        try:
            async with asyncio.timeout(timeout_s or self.settings.connect_timeout_s):
                await asyncio.gather(*waits)
        except TimeoutError:
            return False
        return True

    def connects(self, server: str) -> int:
        """How many times `server` has connected (reconnects after the first)."""
        return self._connections[server].connects

    def breaker(self, server: str) -> Breaker:
        """The breaker of `server`."""
        return self._connections[server].breaker

    # -- tools --------------------------------------------------------------------------------

    def tools(self) -> list[McpTool]:
        """Every tool of the connected servers."""
        return [t for c in self._connections.values() if c.client for t in c.tools.values()]

    def offered(self, npc_id: str) -> list[McpTool]:
        """The tools `npc_id` may call now: allowed, connected, breaker not open. No I/O."""
        return [
            t
            for c in self._connections.values()
            if c.client is not None and c.breaker.available()
            for t in c.tools.values()
            if self.allow.allows(npc_id, t.name)
        ]

    def tool(self, npc_id: str, name: str) -> McpTool:
        """The tool `name` (`server.tool`) if `npc_id` may call it.

        Raises:
            McpToolNotAllowedError: not allowed, or its server does not list it.
            McpUnavailableError: its server has not connected yet.
        """
        server, _, tool_name = name.partition(".")
        connection = self._connections.get(server)
        allowed = connection is not None and self.allow.allows(npc_id, name)
        if allowed and connection is not None and not connection.connects:
            raise McpUnavailableError(f"MCP server {server!r} has not connected")
        tool = connection.tools.get(tool_name) if connection is not None else None
        if tool is None or not allowed:
            raise McpToolNotAllowedError(f"no MCP tool {name!r} for NPC {npc_id!r}")
        return tool

    def writes(self, name: str) -> bool:
        """Whether `name` (`server.tool`) changes the world; True for a tool not listed (yet),
        so approval is never skipped because a server was away. No I/O."""
        server, _, tool_name = name.partition(".")
        connection = self._connections.get(server)
        tool = connection.tools.get(tool_name) if connection is not None else None
        return tool is None or tool.write

    def refusal(self, npc_id: str, name: str, args: dict[str, Any]) -> McpOutcome | None:
        """The outcome refusing this call before it is made (not allowed, arguments failing
        the schema), or None: it may be made. No I/O."""
        try:
            validate_args(self.tool(npc_id, name), args)
        except McpError as exc:
            return McpOutcome(exc.status, message=exc.message)
        return None

    def cached(self, npc_id: str, name: str, args: dict[str, Any]) -> McpOutcome | None:
        """A read tool's fresh cached result for `args`, or None. No I/O: gold calls it."""
        if not self.allow.allows(npc_id, name):
            return None
        result = self.cache.get(name, args, npc_id)
        return McpOutcome("ok", result) if result is not None else None

    def recent(self, npc_id: str, limit: int) -> list[CachedResult]:
        """The fresh results of read tools `npc_id` was given (called, or reused from the
        cache), newest first, at most `limit`, of tools it may still call. No I/O: the gold
        decision puts them in its prompt."""
        return self.cache.recent(npc_id, limit, lambda name: self.allow.allows(npc_id, name))

    async def call_checked(self, npc_id: str, name: str, args: Any) -> dict[str, Any]:
        """Call `name` for `npc_id` with `args`; a read tool's fresh cached result is reused.

        Raises:
            McpToolNotAllowedError: the NPC may not call it, or no server lists it.
            McpUnavailableError: its server is not connected, or its breaker is open.
            McpArgumentsError: the arguments fail its schema (the server never sees them).
            McpTimeoutError: no answer within `mcp.call_timeout_s`.
            McpServerError: the server failed the call or the connection.
            McpResultError: the result is not text or JSON, or too large.
        """
        tool = self.tool(npc_id, name)
        args = validate_args(tool, args)
        if not tool.write:
            hit = self.cache.get(name, args, npc_id)
            if hit is not None:
                return hit
        connection = self._connections[tool.server]
        client, breaker = connection.client, connection.breaker
        if client is None:
            raise McpUnavailableError(f"MCP server {tool.server!r} is not connected")
        if not breaker.available():
            raise McpUnavailableError(f"MCP server {tool.server!r} is failing; skipped a while")
        breaker.acquire()
        timeout = self.settings.call_timeout_s
        try:
            async with asyncio.timeout(timeout):
                raw = await client.call_tool(tool.tool, args, read_timeout_seconds=timeout)
            result = result_of(tool, raw, self.settings.max_result_chars)
        except TimeoutError as exc:
            breaker.failure()
            raise McpTimeoutError(f"{name} did not answer within {timeout} s") from exc
        except _TRANSPORT_ERRORS as exc:
            breaker.failure()
            closed = isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED
            if closed or not isinstance(exc, MCPError | pydantic.ValidationError):
                connection.lost.set()  # the keeper connects again
            raise McpServerError(f"{name}: the server failed: {exc}") from exc
        except McpError:
            breaker.failure()
            raise
        except asyncio.CancelledError:
            breaker.release()
            raise
        breaker.success()
        if not tool.write:
            self.cache.put(name, args, result, npc_id)
        return result

    async def call(self, npc_id: str, name: str, args: dict[str, Any]) -> McpOutcome:
        """`call_checked`, its failure as the outcome's status: never raises for a server's
        failure or bad arguments (the turn goes on without the tool)."""
        try:
            return McpOutcome("ok", await self.call_checked(npc_id, name, args))
        except McpError as exc:
            log.warning("MCP call %s for %s: %s", name, npc_id, exc.message)
            return McpOutcome(exc.status, message=exc.message)
