"""MCP servers' tools as NPC tools: their names (`server.tool`), which NPCs may call them,
which change the world, their arguments checked against the tool's schema, their results
turned into JSON for the prompt, and the cache of read tools' results."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from mcp_types import CallToolResult, TextContent, Tool

from mythic.config import McpServerSettings
from mythic.mcp._errors import McpArgumentsError, McpResultError, McpServerError

TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
"""An MCP tool name that fits the wire's `server.tool` (others are not offered)."""

_GRAMMAR_KEYS = frozenset(
    {"type", "enum", "const", "minimum", "maximum", "minLength", "maxLength", "pattern"}
)
_SCALARS = frozenset({"string", "integer", "number", "boolean"})
_MAX_DESCRIPTION = 200


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool of a connected MCP server, as an NPC sees it."""

    server: str
    tool: str
    """Its name on the server."""
    description: str
    input_schema: dict[str, Any]
    """The server's JSON schema of its arguments; every call is validated against it."""
    write: bool
    """It changes the world (not read-only): a call needs approval first."""
    validator: jsonschema.protocols.Validator = field(compare=False, repr=False)

    @property
    def name(self) -> str:
        """Its NPC name, `server.tool`."""
        return f"{self.server}.{self.tool}"

    @property
    def args_schema(self) -> dict[str, Any]:
        """The arguments' schema for the decision's grammar: scalar properties with their
        simple constraints, the required ones required, nothing else."""
        props: dict[str, Any] = {}
        for key, spec in (self.input_schema.get("properties") or {}).items():
            if isinstance(spec, dict) and (spec.get("type") in _SCALARS or "enum" in spec):
                props[key] = {k: v for k, v in spec.items() if k in _GRAMMAR_KEYS}
        required = [r for r in self.input_schema.get("required") or [] if r in props]
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }


def is_write(server: McpServerSettings, tool: Tool) -> bool:
    """Whether `tool` changes the world: the configured lists first, then the server's
    annotations (only `readOnlyHint: true` makes a tool read-only; MCP's default is not)."""
    if tool.name in server.write_tools:
        return True
    if tool.name in server.read_tools:
        return False
    hints = tool.annotations
    return not (hints is not None and hints.read_only_hint is True)


def tool_of(server: McpServerSettings, tool: Tool) -> McpTool | None:
    """The NPC tool for a listed MCP tool; None when its name or schema cannot be offered."""
    if not TOOL_NAME.match(tool.name):
        return None
    schema = tool.input_schema
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    description = " ".join((tool.description or tool.title or tool.name).split())
    return McpTool(
        server=server.name,
        tool=tool.name,
        description=description[:_MAX_DESCRIPTION],
        input_schema=schema,
        write=is_write(server, tool),
        validator=cls(schema),
    )


class AllowList:
    """Which tools each NPC may call (`mcp.npcs`): `server` allows all its tools,
    `server.tool` one; `*` lists what every NPC may call. An NPC not listed calls none."""

    def __init__(self, npcs: Mapping[str, Iterable[str]]) -> None:
        self._npcs = {npc: frozenset(entries) for npc, entries in npcs.items()}

    def allows(self, npc_id: str, name: str) -> bool:
        """Whether `npc_id` may call the tool `name` (`server.tool`)."""
        server = name.split(".", 1)[0]
        for key in (npc_id, "*"):
            entries = self._npcs.get(key, frozenset())
            if name in entries or server in entries:
                return True
        return False


def validate_args(tool: McpTool, args: Any) -> dict[str, Any]:
    """`args` when they satisfy the tool's input schema.

    Raises:
        McpArgumentsError: they do not (the first error, with where it is).
    """
    if not isinstance(args, dict):
        raise McpArgumentsError(f"{tool.name}: arguments must be a JSON object")
    error = jsonschema.exceptions.best_match(tool.validator.iter_errors(args))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "args"
        raise McpArgumentsError(f"{tool.name}.{where}: {error.message[:200]}")
    return args


def result_of(tool: McpTool, result: CallToolResult, max_chars: int) -> dict[str, Any]:
    """A tool's result as a JSON object for the NPC: its structured content, else its text
    (parsed when it is a JSON object).

    Raises:
        McpServerError: the server reports the call failed (`isError`).
        McpResultError: the result holds no text or JSON, or exceeds `max_chars`.
    """
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if result.is_error:
        raise McpServerError(f"{tool.name} failed: {' '.join(texts)[:200] or 'no reason given'}")
    data: dict[str, Any]
    if isinstance(result.structured_content, dict):
        data = result.structured_content
    elif texts:
        text = "\n".join(texts)
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        data = parsed if isinstance(parsed, dict) else {"text": text}
    else:
        kinds = ", ".join(sorted({block.type for block in result.content})) or "nothing"
        raise McpResultError(f"{tool.name} returned no text or JSON ({kinds})")
    size = len(json.dumps(data, ensure_ascii=False))
    if size > max_chars:
        raise McpResultError(f"{tool.name} returned {size} characters; the cap is {max_chars}")
    return data


@dataclass(frozen=True, slots=True)
class CachedResult:
    """A read tool's result an NPC was told, still fresh in the cache."""

    name: str
    """The tool, `server.tool`."""
    args: dict[str, Any]
    result: dict[str, Any]


@dataclass(slots=True)
class _Entry:
    at: float
    args: dict[str, Any]
    result: dict[str, Any]
    told: set[str]
    """The NPCs given this result (by a call, or from the cache)."""


class ResultCache:
    """Read tools' results by tool and arguments, for `ttl_s` seconds: a turn reuses them
    without a call, and gold reads them without ever waiting on a server."""

    def __init__(
        self, ttl_s: float, clock: Callable[[], float] = time.monotonic, size: int = 1024
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.size = size
        # In the order they were fetched: the newest last, the expired first.
        self._entries: dict[tuple[str, str], _Entry] = {}

    @staticmethod
    def _key(name: str, args: Mapping[str, Any]) -> tuple[str, str]:
        return (name, json.dumps(args, sort_keys=True, ensure_ascii=False))

    def get(
        self, name: str, args: Mapping[str, Any], npc_id: str | None = None
    ) -> dict[str, Any] | None:
        """The fresh result of `name` for `args`, or None; `npc_id`: the NPC it is given to
        (it is then among that NPC's `recent` results)."""
        entry = self._entries.get(self._key(name, args))
        if entry is None or self.clock() - entry.at >= self.ttl_s:
            return None
        if npc_id is not None:
            entry.told.add(npc_id)
        return entry.result

    def put(
        self,
        name: str,
        args: Mapping[str, Any],
        result: dict[str, Any],
        npc_id: str | None = None,
    ) -> None:
        """Keep a result (nothing when the TTL is 0), fetched for `npc_id`; the oldest go
        past `size` entries."""
        if self.ttl_s <= 0:
            return
        key = self._key(name, args)
        self._entries.pop(key, None)
        told = {npc_id} if npc_id is not None else set()
        self._entries[key] = _Entry(self.clock(), dict(args), result, told)
        while len(self._entries) > self.size:
            del self._entries[next(iter(self._entries))]

    def recent(
        self, npc_id: str, limit: int, allowed: Callable[[str], bool] = lambda _: True
    ) -> list[CachedResult]:
        """The fresh results `npc_id` was given, newest first, at most `limit`, of the tools
        `allowed` accepts. No I/O: gold reads it."""
        found: list[CachedResult] = []
        now = self.clock()
        for (name, _), entry in reversed(self._entries.items()):
            if len(found) >= limit or now - entry.at >= self.ttl_s:
                break  # the rest are older still
            if npc_id in entry.told and allowed(name):
                found.append(CachedResult(name, entry.args, entry.result))
        return found
