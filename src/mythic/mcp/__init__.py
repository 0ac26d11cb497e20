"""Mythic and MCP: tools of configured MCP servers as NPC tools (`McpClient`).

Needs the `mcp` extra (`pip install 'mythic[mcp]'`).
"""

from mythic.mcp._client import McpClient, McpOutcome
from mythic.mcp._errors import (
    McpArgumentsError,
    McpError,
    McpResultError,
    McpServerError,
    McpTimeoutError,
    McpToolNotAllowedError,
    McpUnavailableError,
)
from mythic.mcp._tools import AllowList, McpTool, ResultCache, validate_args

__all__ = [
    "AllowList",
    "McpArgumentsError",
    "McpClient",
    "McpError",
    "McpOutcome",
    "McpResultError",
    "McpServerError",
    "McpTimeoutError",
    "McpTool",
    "McpToolNotAllowedError",
    "McpUnavailableError",
    "ResultCache",
    "validate_args",
]
