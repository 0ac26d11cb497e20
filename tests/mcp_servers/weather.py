"""A real MCP server for the MCP client's tests, built with the MCP SDK: the weather of
a frontier town, a dice roll, a bell that rings (a write tool), and tools that misbehave (one
hangs, one crashes the process, one returns an image, one returns a megabyte).

Run over stdio: `python tests/mcp_servers/weather.py [--junk]`. Every call it receives is
appended as a JSON line to the file `WEATHER_MCP_LOG` names (when set), so a test can prove
which calls reached it. `--junk`: it writes garbage to stdout instead of speaking MCP.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp_types import ImageContent, ToolAnnotations

READ = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True)

FORECASTS = {"old_town": "heavy rain until dusk", "docks": "fog rolling in from the sea"}


def _log(tool: str, args: dict[str, Any]) -> None:
    path = os.environ.get("WEATHER_MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "args": args}) + "\n")


def build() -> MCPServer:
    """The server (tests also connect to it in memory)."""
    server = MCPServer("weather")

    @server.tool(description="the weather forecast for a place in town", annotations=READ)
    def forecast(place: str) -> dict[str, str]:
        _log("forecast", {"place": place})
        return {"place": place, "forecast": FORECASTS.get(place, "clear skies")}

    @server.tool(description="roll a die with this many sides", annotations=READ)
    def roll_dice(sides: int) -> dict[str, int]:
        _log("roll_dice", {"sides": sides})
        return {"sides": sides, "roll": 1 + (7 * sides + 3) % sides}

    @server.tool(description="ring the town bell this many times", annotations=WRITE)
    def ring_bell(times: int) -> dict[str, int]:
        _log("ring_bell", {"times": times})
        return {"rang": times}

    @server.tool(description="ask the slow oracle", annotations=READ)
    async def hang() -> str:
        _log("hang", {})
        await anyio.sleep_forever()
        return "never"

    @server.tool(description="break the barometer", annotations=READ)
    def crash() -> str:
        _log("crash", {})
        os._exit(3)

    @server.tool(description="a picture of the sky", annotations=READ)
    def garbage() -> ImageContent:
        _log("garbage", {})
        return ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")

    @server.tool(description="the whole almanac", annotations=READ)
    def huge() -> str:
        _log("huge", {})
        return "almanac " * 200_000

    return server


def junk() -> None:
    """Speak no MCP: garbage lines on stdout, until stdin closes."""
    while True:
        sys.stdout.write("\x00\xff this is not JSON-RPC {{{\n")
        sys.stdout.flush()
        if not sys.stdin.readline():
            return
        time.sleep(0)


if __name__ == "__main__":
    if "--junk" in sys.argv:
        junk()
    else:
        build().run()
