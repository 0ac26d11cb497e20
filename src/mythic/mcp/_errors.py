"""The MCP client's typed errors: each says how the call ended for the NPC (`status`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from mythic._errors import MythicError

Status = Literal["error", "rejected", "timeout"]


class McpError(MythicError):
    """A call of an MCP server's tool failed; the NPC answers without it."""

    status: ClassVar[Status] = "error"


class McpToolNotAllowedError(McpError):
    """The NPC may not call this tool (not in `mcp.npcs`), or no server has it."""

    status: ClassVar[Status] = "rejected"


class McpArgumentsError(McpError):
    """The call's arguments fail the tool's input schema; it never reaches the server."""

    status: ClassVar[Status] = "rejected"


class McpUnavailableError(McpError):
    """The tool's server is not connected, or its breaker is open after failures."""

    retryable = True


class McpTimeoutError(McpError):
    """The server did not answer within `mcp.call_timeout_s`."""

    status: ClassVar[Status] = "timeout"
    retryable = True


class McpServerError(McpError):
    """The server failed the call: it crashed, closed the connection or reported an error."""

    retryable = True


class McpResultError(McpError):
    """The server's result is unusable: not text or JSON, malformed, or over
    `mcp.max_result_chars`."""
