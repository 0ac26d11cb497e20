"""Limits and constrained field types shared by the v1 messages.

Every field a peer can fill is bounded (design section 15: length caps per field): ids use a
safe charset, text has a length cap, numbers are finite, lists and JSON arguments have size and
depth caps. A JSON Schema consumer sees the same bounds (`mythic schema export`).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    Strict,
    StringConstraints,
    WithJsonSchema,
)

SCHEMA_VERSION: Final = "v1"
MAX_FRAME_BYTES: Final = 256 * 1024
MAX_ID_CHARS: Final = 128
ID_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,128}$"
MAX_TEXT_CHARS: Final = 4000
MAX_NOTE_CHARS: Final = 1000
MAX_REF_CHARS: Final = 256
MAX_BARK_WORDS: Final = 8
MAX_BARK_CHARS: Final = 80
MAX_SCENE_OBJECTS: Final = 256
MAX_SCENE_MEMBERS: Final = 16
"""The most NPCs (and, apart, players) a scene message names."""
MAX_AMBIENT_LINES: Final = 30
"""The most lines one `SceneAmbient` asks for."""
MAX_VISEMES: Final = 512
# One second of 48 kHz 16-bit mono audio: chunks are meant to be 20-100 ms.
MAX_PCM_BYTES: Final = 96_000
MAX_JSON_DEPTH: Final = 8
MAX_JSON_VALUES: Final = 1024
# Integers beyond 2**53 lose precision in JavaScript and C# doubles: refuse them in arguments.
MAX_JSON_INT: Final = 2**53 - 1
MAX_SEQ: Final = 2**31 - 1


def _valid_unicode(text: str) -> None:
    """JSON `\\ud800` escapes decode to lone surrogates that cannot be written back as UTF-8.

    Strict `str` fields refuse them already; this is for the free-form JSON in tool arguments.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text contains a lone surrogate (not valid Unicode)") from None


def _require_bool(value: object) -> object:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _bark_words(text: str) -> str:
    words = len(text.split())
    if words > MAX_BARK_WORDS:
        raise ValueError(f"a bark has at most {MAX_BARK_WORDS} words, this one has {words}")
    return text


def _pcm_from_wire(value: object) -> object:
    """Base64 text on the wire, raw bytes in Python."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("pcm is not valid base64") from None
    return value


def _pcm_samples(value: bytes) -> bytes:
    if len(value) % 2:
        raise ValueError("pcm is 16-bit samples: its length in bytes must be even")
    return value


def _pcm_to_wire(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _bounded_json(value: dict[str, Any]) -> dict[str, Any]:
    """Check a JSON object iteratively: JSON types only, finite, bounded in size and depth."""
    stack: list[tuple[object, str, int]] = [(value, "", 1)]
    seen = 0
    while stack:
        node, path, depth = stack.pop()
        seen += 1
        if seen > MAX_JSON_VALUES:
            raise ValueError(f"more than {MAX_JSON_VALUES} values")
        where = path or "the object"
        if node is None or isinstance(node, bool):
            continue
        if isinstance(node, int):
            if abs(node) > MAX_JSON_INT:
                raise ValueError(f"{where}: integer beyond +/-{MAX_JSON_INT}")
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise ValueError(f"{where}: number is not finite")
        elif isinstance(node, str):
            if len(node) > MAX_TEXT_CHARS:
                raise ValueError(f"{where}: string longer than {MAX_TEXT_CHARS} characters")
            _valid_unicode(node)
        elif isinstance(node, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(node, dict):
                for key, item in node.items():
                    if not isinstance(key, str) or len(key) > MAX_ID_CHARS:
                        raise ValueError(f"{where}: keys are strings of at most {MAX_ID_CHARS}")
                    _valid_unicode(key)
                    stack.append((item, f"{path}.{key}" if path else key, depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node))
        else:
            raise ValueError(f"{where}: {type(node).__name__} is not a JSON value")
    return value


Id = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN),
]
"""An id chosen by the game or the server: 1-128 characters of `A-Z a-z 0-9 _ . : -`."""

Text = Annotated[
    str,
    StringConstraints(strict=True, max_length=MAX_TEXT_CHARS),
]
"""Free text, possibly empty, at most `MAX_TEXT_CHARS` characters."""

Line = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=MAX_TEXT_CHARS, pattern=r"\S"),
]
"""Free text with at least one non-space character, at most `MAX_TEXT_CHARS` characters."""

Note = Annotated[
    str,
    StringConstraints(strict=True, max_length=MAX_NOTE_CHARS),
]
"""A short human-readable explanation (error messages, reasons)."""

Bark = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=MAX_BARK_CHARS, pattern=r"\S"),
    AfterValidator(_bark_words),
]
"""A one-line NPC remark: at most `MAX_BARK_WORDS` words and `MAX_BARK_CHARS` characters."""

ToolName = Annotated[
    str,
    StringConstraints(
        strict=True, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_-]{0,63})?$"
    ),
]
"""A game tool's name, an identifier of at most 64 characters (`set_waypoint`), or an MCP
server's tool as `server.tool` (`weather.forecast`)."""

Code = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z][A-Za-z0-9_.]{0,63}$")]
"""A machine-readable error code (`invalid_message`, `TOOL_TIMEOUT`)."""

Ref = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_REF_CHARS)]
"""What an error is about: a message type or a dotted field path (`SceneUpdate.objects.2.dist`)."""

Lang = Annotated[
    str, StringConstraints(strict=True, pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$")
]
"""A BCP 47 language tag (`en`, `en-GB`)."""

GameTime = Annotated[
    str, StringConstraints(strict=True, pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
]
"""Time of day in the game world, `HH:MM` on a 24-hour clock."""

GameDate = Annotated[
    str, StringConstraints(strict=True, pattern=r"^[0-9]{1,6}-[0-9]{1,3}-[0-9]{1,3}$")
]
"""A date in the world's calendar (`calendar:` in world.yaml), `year-month-day`, months and
days counted from 1 (`11-9-21`: the 21st of the ninth month of year 11)."""

Seconds = Annotated[float, Strict(), Field(ge=0)]
"""A non-negative, finite number of seconds."""

Distance = Annotated[float, Strict(), Field(ge=0)]
"""A non-negative, finite distance in game units."""

Seq = Annotated[int, Strict(), Field(ge=0, le=MAX_SEQ)]
"""A position in a stream, counted from 0."""

SampleRate = Annotated[int, Strict(), Field(ge=8000, le=48000)]
"""Samples per second of PCM audio, 8000-48000."""

Pcm = Annotated[
    bytes,
    BeforeValidator(_pcm_from_wire),
    Field(min_length=2, max_length=MAX_PCM_BYTES),
    AfterValidator(_pcm_samples),
    PlainSerializer(_pcm_to_wire, return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
            "minLength": 4,
            "maxLength": 4 * -(-MAX_PCM_BYTES // 3),
        }
    ),
]
"""16-bit little-endian mono PCM: raw bytes in Python, base64 text on the wire."""

JsonObject = Annotated[dict[str, Any], AfterValidator(_bounded_json)]
"""A JSON object of finite numbers, bounded in size (`MAX_JSON_VALUES`) and depth."""

FalseFlag = Annotated[Literal[False], BeforeValidator(_require_bool)]
"""Always `false` (a `Literal` alone would also take 0)."""
