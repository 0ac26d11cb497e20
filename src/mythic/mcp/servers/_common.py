"""What the four servers share: the typed error a tool refuses with, the size cap on results,
the hints that tell a client which tools only read, and a small client of a Mythic server's
HTTP API."""

from __future__ import annotations

import json
from typing import Any

import httpx
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from mythic._errors import MythicError

MAX_RESULT_CHARS = 32_000
"""The most JSON characters one tool result carries: a client's context window is not ours to
fill. Longer lists lose their last items (`truncated: true`)."""

MAX_TEXT_CHARS = 4_000
"""The most characters of any one text field in a result."""

READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
"""A tool that changes nothing anywhere."""

NPC_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""An NPC's id, as world folders name their cards."""


class ToolRefusedError(MythicError, ToolError):
    """A tool call the server refuses, with why: bad arguments, an unknown NPC or job, a store
    or Mythic server that cannot be reached. The client gets an `isError` result carrying the
    message; the MCP server goes on serving."""


class ServerUnreachableError(ToolRefusedError):
    """The Mythic server a tool reads cannot be reached, or did not answer in time."""

    retryable = True


def _clip(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + " [...]"
    if isinstance(value, dict):
        return {k: _clip(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip(v, limit) for v in value]
    return value


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def capped(result: dict[str, Any], *, max_chars: int = MAX_RESULT_CHARS) -> dict[str, Any]:
    """`result` within `max_chars` of JSON: each text clipped to `MAX_TEXT_CHARS`, then the
    longest top-level list shortened from its end until it fits (`truncated: true`)."""
    fitted: dict[str, Any] = _clip(result, MAX_TEXT_CHARS)
    while _size(fitted) > max_chars:
        lists = [k for k, v in fitted.items() if isinstance(v, list) and v]
        if not lists:
            text = json.dumps(fitted, ensure_ascii=False, default=str)
            return {"truncated": True, "json": text[: max_chars - 100]}
        longest = max(lists, key=lambda k: _size(fitted[k]))
        fitted[longest] = fitted[longest][: len(fitted[longest]) // 2]
        fitted["truncated"] = True
    return fitted


def _detail(reply: httpx.Response) -> str:
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:500]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, dict) and "message" in detail:
        problems = detail.get("problems") or []
        return "; ".join([str(detail["message"]), *(str(p) for p in problems[:5])])
    return str(detail)[:500]


class MythicAPI:
    """The HTTP API of a running Mythic server (`mythic serve`), as tools read it: every
    failure becomes a `ToolRefusedError` that says what went wrong.

    Args:
        url: the server's HTTP address, e.g. `http://127.0.0.1:8765`.
        timeout_s: how long one request may take.
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ToolRefusedError(f"Mythic server address {url!r}: expected http://HOST:PORT")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    async def call(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> dict[str, Any]:
        """The server's JSON answer to `method path`.

        Raises:
            ServerUnreachableError: no answer (refused, reset, timed out).
            ToolRefusedError: the server refused the request (the status and its detail), or its
                answer was not a JSON object.
        """
        try:
            async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s) as client:
                reply = await client.request(method, path, params=params, json=body)
        except httpx.TimeoutException as exc:
            raise ServerUnreachableError(
                f"the Mythic server at {self.url} did not answer {method} {path} within "
                f"{self.timeout_s:g} s",
                fix="check that `mythic serve` runs there, or pass --server",
            ) from exc
        except httpx.HTTPError as exc:
            raise ServerUnreachableError(
                f"the Mythic server at {self.url} cannot be reached: {exc}",
                fix="start it with `mythic serve`, or pass --server with its address",
            ) from exc
        if reply.status_code >= 400:
            raise ToolRefusedError(f"{method} {path}: {reply.status_code}: {_detail(reply)}")
        try:
            data = reply.json()
        except ValueError as exc:
            raise ToolRefusedError(f"{method} {path}: the answer is not JSON") from exc
        if not isinstance(data, dict):
            raise ToolRefusedError(f"{method} {path}: the answer is not a JSON object")
        return data
