"""`McpSettings`: the MCP servers whose tools Mythic's NPCs may call (Mythic as an MCP client)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mythic.config._section import Section

SERVER_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,31}$"
"""A server's name: the first part of its tools' NPC names (`weather.forecast`)."""


class McpServerSettings(Section):
    """One MCP server: how to reach it, and which of its tools change the world."""

    name: str = Field(pattern=SERVER_NAME)
    """The server's name; its tools reach NPCs as `name.tool`."""
    transport: Literal["stdio", "http"] = "stdio"
    """`stdio`: Mythic starts `command` and talks over its stdin/stdout; `http`: a running
    server's Streamable HTTP endpoint at `url`."""
    command: str | None = None
    """The program to start (`stdio`)."""
    args: list[str] = Field(default_factory=list)
    """Its arguments (`stdio`)."""
    env: dict[str, str] | None = None
    """Variables set for it (`stdio`), over the SDK's default environment: a safe subset of
    Mythic's (`PATH`, `HOME`, ...), never its secrets."""
    url: str | None = None
    """The endpoint (`http`), e.g. `http://127.0.0.1:8000/mcp`."""
    write_tools: list[str] = Field(default_factory=list)
    """Tools treated as write tools (they need approval) whatever the server's annotations
    say."""
    read_tools: list[str] = Field(default_factory=list)
    """Tools treated as read-only (no approval; results cached) whatever the annotations say.
    Without either list, a tool is read-only only when the server marks it `readOnlyHint`."""

    @model_validator(mode="after")
    def _reachable(self) -> McpServerSettings:
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"MCP server {self.name!r}: a stdio server needs a command")
        if self.transport == "http" and not self.url:
            raise ValueError(f"MCP server {self.name!r}: an http server needs a url")
        both = sorted(set(self.write_tools) & set(self.read_tools))
        if both:
            raise ValueError(f"MCP server {self.name!r}: tools both read and write: {both}")
        return self


class McpSettings(Section):
    """MCP servers whose tools become NPC tools, who may use them, and how calls are bounded."""

    servers: list[McpServerSettings] = Field(default_factory=list)
    """The servers, connected when the server starts."""
    npcs: dict[str, list[str]] = Field(default_factory=dict)
    """Per NPC id (`*`: every NPC), what it may call: `server` (all its tools) or
    `server.tool`. An NPC not listed calls none."""
    call_timeout_s: float = Field(default=0.25, gt=0, le=60)
    """How long one tool call may take: a silver turn's tool call must fit in the dialogue
    budget (80-250 ms to first token); a slower server's call fails as a timeout and the NPC
    answers without it."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """How long connecting to a server and listing its tools may take."""
    reconnect_s: float = Field(default=2.0, gt=0, le=3600)
    """The wait before connecting again to a server whose connection failed."""
    max_result_chars: int = Field(default=2000, ge=16, le=1_000_000)
    """A result longer than this (as JSON) is refused as too large: it would flood the
    prompt."""
    cache_ttl_s: float = Field(default=30.0, ge=0, le=86_400)
    """How long a read tool's result is reused for the same arguments (0: never). Gold reads
    only this cache, never a server."""
    breaker_failures: int = Field(default=3, ge=1, le=100)
    """Consecutive failed calls (timeouts, errors, garbage) after which a server is skipped."""
    breaker_cooldown_s: float = Field(default=30.0, gt=0, le=3600)
    """How long an open breaker skips its server before one call probes it again."""
    approver: Literal["game", "allow", "deny"] = "game"
    """Who approves a write tool's call: `game`, a `ToolCall` with `needs_approval` answered
    by the game's `Ack` (`ok`: approved); `allow` or `deny`: always."""

    @model_validator(mode="after")
    def _known_servers(self) -> McpSettings:
        names = [s.name for s in self.servers]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names repeat: {names}")
        for npc, allowed in self.npcs.items():
            for entry in allowed:
                server = entry.split(".", 1)[0]
                if server not in names:
                    raise ValueError(f"mcp.npcs[{npc!r}] names unknown MCP server {server!r}")
        return self
