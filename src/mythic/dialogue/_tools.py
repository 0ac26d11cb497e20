"""Game tools an NPC can call: their argument models, the schema that constrains the model's
choice, and validation of whatever comes back (technical design, sections 5.2, 11.2 and 15).

Game tools are executed by the game, never by Mythic: the server sends a `ToolCall` and the
game answers with an `Ack`. External tools (MCP servers', `Stage.external`) are called by
Mythic; their arguments are checked against the tool's own schema there. Game tools'
arguments are validated, stripped of control characters and length-capped before they
leave, whether the model or a caller produced them.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from mythic._errors import MythicError
from mythic.dialogue._stage import ExternalTool
from mythic.knowledge import INTENTS as INTENTS  # the dialogue's intents are the wire's

EMOTES = ("wave", "bow", "nod", "shake_head", "laugh", "shrug", "point", "cheer", "glare")
"""The emotes `play_emote` knows; a game maps them to animations."""

DIALOGS = ("trade", "quest", "rumours", "services")
"""The dialog windows `open_dialog` can open."""

MAX_ARG_CHARS = 64
COORDINATE_LIMIT = 1_000_000.0


class ToolArgumentError(MythicError):
    """A tool call names an unknown tool or its arguments are invalid; it is not sent."""


def _clean(text: str) -> str:
    """Strip control and format characters and collapse whitespace: the game gets plain text."""
    kept = "".join(
        " " if c.isspace() else c for c in text if c.isspace() or unicodedata.category(c)[0] != "C"
    )
    return " ".join(kept.split())


def _nonempty(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


SafeText = Annotated[
    str,
    Field(strict=True, max_length=4 * MAX_ARG_CHARS),
    AfterValidator(_clean),
    AfterValidator(_nonempty),
    AfterValidator(lambda t: t[:MAX_ARG_CHARS]),
]
"""Free text for the game: control characters stripped, whitespace collapsed, capped."""

GameId = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
"""An id the game knows (`player`, `guard_3`, `old_town`)."""

Coordinate = Annotated[
    float, Field(strict=False, ge=-COORDINATE_LIMIT, le=COORDINATE_LIMIT, allow_inf_nan=False)
]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GiveItemArgs(_Args):
    """Hand an item from the NPC to someone."""

    item: SafeText
    quantity: Annotated[int, Field(strict=True, ge=1, le=99)] = 1
    to: GameId = "player"


class SetWaypointArgs(_Args):
    """Show the way to a place or object (`target`), or to coordinates the game resolves."""

    target: GameId | None = None
    x: Coordinate | None = None
    y: Coordinate | None = None
    z: Coordinate | None = None

    @model_validator(mode="after")
    def _somewhere(self) -> SetWaypointArgs:
        coords = (self.x, self.y, self.z)
        if all(c is None for c in coords):
            if self.target is None:
                raise ValueError("give a target or all of x, y and z")
        elif any(c is None for c in coords):
            raise ValueError("give all of x, y and z, or none")
        return self


class OpenDialogArgs(_Args):
    """Open one of the game's dialog windows for the player."""

    dialog: Literal["trade", "quest", "rumours", "services"]


class PlayEmoteArgs(_Args):
    """Play an emote animation."""

    emote: Literal["wave", "bow", "nod", "shake_head", "laugh", "shrug", "point", "cheer", "glare"]


class SetFocusArgs(_Args):
    """Turn to look at someone or something."""

    target: GameId


class SetMarkerArgs(_Args):
    """Put a marker on the player's map."""

    location: GameId
    label: SafeText | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    """A game tool: what it does (for the model), and the model of its arguments."""

    name: str
    description: str
    args: type[_Args]


TOOLS: Mapping[str, Tool] = {
    t.name: t
    for t in (
        Tool("give_item", "hand the player an item (a key, a drink, a map)", GiveItemArgs),
        Tool("set_waypoint", "show the player the way to a place", SetWaypointArgs),
        Tool("open_dialog", "open the trade, quest, rumours or services window", OpenDialogArgs),
        Tool("play_emote", "make a gesture: wave, bow, nod, laugh, shrug, point", PlayEmoteArgs),
        Tool("set_focus", "turn to look at someone or something nearby", SetFocusArgs),
        Tool("set_marker", "mark a place on the player's map", SetMarkerArgs),
    )
}
"""The built-in game tools, by name."""


def npc_tools(npc_id: str, listed: Iterable[str] | None) -> list[str]:
    """The tools an NPC's card allows, in the built-in order (all when the card lists none).

    Raises:
        ToolArgumentError: the card names a tool that does not exist.
    """
    if listed is None:
        return list(TOOLS)
    unknown = sorted(set(listed) - set(TOOLS))
    if unknown:
        raise ToolArgumentError(
            f"NPC {npc_id!r} lists unknown tools: {', '.join(unknown)}",
            fix=f"use some of: {', '.join(TOOLS)}",
        )
    return [name for name in TOOLS if name in set(listed)]


def validate_call(name: str, args: Any, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """The arguments of a call to `name`, validated, cleaned and capped, as JSON-ready data.

    Raises:
        ToolArgumentError: the tool is unknown or not allowed, or an argument is invalid.
    """
    tool = TOOLS.get(name)
    if tool is None or (allowed is not None and name not in set(allowed)):
        raise ToolArgumentError(f"no tool {name!r} for this NPC")
    if not isinstance(args, dict):
        raise ToolArgumentError(f"{name}: arguments must be a JSON object")
    try:
        parsed = tool.args.model_validate(args)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "args"
        raise ToolArgumentError(f"{name}.{where}: {first['msg']}") from exc
    return parsed.model_dump(mode="json", exclude_none=True)


def _choice(values: Sequence[str]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)} if values else {"type": "string"}


def _model_args(name: str, places: Sequence[str], targets: Sequence[str]) -> dict[str, Any]:
    """The arguments the model may write: ids only from what the NPC knows, so it cannot
    invent a place; no coordinates (the game resolves a target to a position)."""
    text = {"type": "string", "minLength": 1, "maxLength": 32}
    props: dict[str, dict[str, Any]]
    match name:
        case "give_item":
            props = {"item": text, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}}
        case "set_waypoint":
            props = {"target": _choice(places)}
        case "open_dialog":
            props = {"dialog": _choice(DIALOGS)}
        case "play_emote":
            props = {"emote": _choice(EMOTES)}
        case "set_focus":
            props = {"target": _choice(targets)}
        case "set_marker":
            props = {"location": _choice(places)}
        case _:
            raise ToolArgumentError(f"no tool {name!r}")
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


TOOLS_BY_INTENT: Mapping[str, tuple[str, ...]] = {
    "chitchat": (),
    "trade": ("open_dialog", "give_item"),
    "quest": ("set_marker", "open_dialog"),
    "hint": ("set_marker",),
    "combat": ("set_focus", "play_emote"),
    "navigation": ("set_waypoint", "set_marker"),
    "admin": (),
}
"""Which tools each intent exposes (technical design, section 5.2: the dialogue manager
chooses the tools by intent). Small models otherwise reach for a tool on "thank you"."""


def _call_schema(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "args": args},
        "required": ["name", "args"],
        "additionalProperties": False,
    }


def decision_schema(
    tools: Sequence[str],
    *,
    places: Sequence[str],
    targets: Sequence[str],
    external: Sequence[ExternalTool] = (),
) -> dict[str, Any]:
    """The JSON schema of a turn's decision: the player's intent, then one tool call that
    intent exposes, or none.

    `places` and `targets` are the ids the NPC may name (zones, scene objects, `player`).
    `external`: tools Mythic calls itself (MCP servers'), offered under every intent: what
    they answer is not tied to one kind of line.
    """
    branches = []
    for intent in INTENTS:
        calls: list[dict[str, Any]] = [{"type": "null"}]
        for name in TOOLS_BY_INTENT[intent]:
            if name in tools:
                calls.append(_call_schema(name, _model_args(name, places, targets)))
        calls += [_call_schema(tool.name, tool.args_schema) for tool in external]
        branches.append(
            {
                "type": "object",
                "properties": {
                    "intent": {"const": intent},
                    "action": calls[0] if len(calls) == 1 else {"anyOf": calls},
                },
                "required": ["intent", "action"],
                "additionalProperties": False,
            }
        )
    return {"anyOf": branches}


def describe_tools(tools: Sequence[str], external: Sequence[ExternalTool] = ()) -> str:
    """One line per tool, for the decision prompt."""
    lines = [f"- {name}: {TOOLS[name].description}" for name in tools]
    lines += [f"- {tool.name}: {tool.description}" for tool in external]
    return "\n".join(lines)
