"""Frames to messages and back: parse, dump, and turn a bad frame into a wire `Error`.

Parsing checks the frame in the order a peer can act on: size, UTF-8 and JSON, an object,
`schema_version`, a known `type`, the right direction, then the fields. Whatever goes wrong
comes out as a `ProtocolError` with a stable code, never as a pydantic or JSON exception.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal, NoReturn, TypeVar

from pydantic import TypeAdapter, ValidationError

from mythic._errors import MythicError
from mythic.contracts._messages import (
    MESSAGE_TYPES,
    AudioChunk,
    ClientMessage,
    Error,
    Message,
    ServerMessage,
    TTSChunk,
    message_classes,
)
from mythic.contracts._types import MAX_FRAME_BYTES, MAX_NOTE_CHARS, MAX_REF_CHARS, SCHEMA_VERSION

M = TypeVar("M")

ProtocolErrorCode = Literal[
    "frame_too_large",
    "bad_json",
    "not_an_object",
    "bad_schema_version",
    "unknown_type",
    "unexpected_type",
    "invalid_message",
    "bad_audio_frame",
]
"""The stable codes of `ProtocolError` (and of the `Error` messages made from one)."""

_SCHEMA_HINT = "run `mythic schema export` for the JSON Schema of every message"
_FIXES: Final[dict[ProtocolErrorCode, str]] = {
    "frame_too_large": "split the payload (audio into 20-100 ms chunks) or shorten the text",
    "bad_json": "send one UTF-8 JSON object per frame (NaN and Infinity are not JSON)",
    "not_an_object": 'send a JSON object: {"schema_version": "v1", "type": ..., ...}',
    "bad_schema_version": f'set "schema_version": "{SCHEMA_VERSION}" on every message',
    "unknown_type": _SCHEMA_HINT,
    "unexpected_type": "this message type goes the other way; " + _SCHEMA_HINT,
    "invalid_message": _SCHEMA_HINT,
    "bad_audio_frame": "a binary frame is b'MYA1', a 4-byte little-endian header length, "
    "the message's JSON without pcm, then the PCM (see dump_audio_frame)",
}
_JSON_KINDS: Final[dict[type, str]] = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
}
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_REF_PART_CHARS = 64


class ProtocolError(MythicError):
    """A frame is not a valid v1 message. Answer it with `error_message(exc)`.

    Attributes:
        code: stable and machine-readable, one of `ProtocolErrorCode`.
        ref: the offending message type or dotted field path (`PlayerUtterance.text`), or
            None when the frame as a whole is at fault (too large, not JSON).
        turn_id: the frame's `turn_id` when it had a well-formed one, to correlate the error.
        call_id: the frame's `call_id` when it had a well-formed one.
    """

    def __init__(
        self,
        code: ProtocolErrorCode,
        message: str,
        *,
        ref: str | None = None,
        turn_id: str | None = None,
        call_id: str | None = None,
    ) -> None:
        super().__init__(message, fix=_FIXES[code])
        self.code: ProtocolErrorCode = code
        self.ref = _printable(ref)[:MAX_REF_CHARS] if ref else None
        self.turn_id = turn_id
        self.call_id = call_id


def _printable(text: str) -> str:
    """Escape everything outside printable ASCII: refs and messages quote peer-chosen keys."""
    return "".join(
        c if " " <= c <= "~" else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
        for c in text
    )


def _quote(value: object) -> str:
    text = repr(value)
    return _printable(text if len(text) <= 40 else text[:40] + "...")


class _NotJSONError(ValueError):
    """Input Python's parser takes that JSON does not allow (NaN, duplicate keys)."""


def _reject_constant(name: str) -> NoReturn:
    raise _NotJSONError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotJSONError(f"duplicate key {_quote(key)}")
            seen.add(key)
    return obj


def _decode(data: str | bytes, max_bytes: int) -> object:
    if len(data) > max_bytes:
        raise ProtocolError("frame_too_large", f"frame is larger than {max_bytes} bytes")
    try:
        if isinstance(data, str):
            size = len(data.encode("utf-8"))
            text = data
        else:
            size = len(data)
            text = data.decode("utf-8")
    except UnicodeError:
        raise ProtocolError("bad_json", "frame is not valid UTF-8") from None
    if size > max_bytes:
        raise ProtocolError("frame_too_large", f"frame is {size} bytes, over {max_bytes}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        detail = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise ProtocolError("bad_json", f"frame is not JSON: {detail}") from None
    except _NotJSONError as exc:
        raise ProtocolError("bad_json", f"frame is not JSON: {exc}") from None
    except ValueError:
        # Python refuses to convert integers of more than 4300 digits (CVE-2020-10735).
        raise ProtocolError("bad_json", "frame has a number with too many digits") from None
    except RecursionError:
        raise ProtocolError("bad_json", "frame is nested too deeply") from None


def _known_id(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def _ref(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part)[:_REF_PART_CHARS] for part in loc)


def _parse(
    data: str | bytes,
    max_bytes: int,
    adapter: TypeAdapter[M],
    allowed: frozenset[str],
    side: str,
) -> M:
    obj = _decode(data, max_bytes)
    if not isinstance(obj, dict):
        raise ProtocolError(
            "not_an_object", f"a message is a JSON object, not {_JSON_KINDS[type(obj)]}"
        )
    return _validate(obj, adapter, allowed, side)


def _validate(
    obj: dict[str, Any], adapter: TypeAdapter[M], allowed: frozenset[str], side: str
) -> M:
    kind = obj.get("type")
    known = kind if isinstance(kind, str) and kind in MESSAGE_TYPES else None
    ids = {"turn_id": _known_id(obj, "turn_id"), "call_id": _known_id(obj, "call_id")}
    version = obj.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProtocolError(
            "bad_schema_version",
            f"schema_version is {_quote(version)}, this peer speaks {SCHEMA_VERSION!r}"
            if "schema_version" in obj
            else f"schema_version is missing, this peer speaks {SCHEMA_VERSION!r}",
            ref=f"{known}.schema_version" if known else "schema_version",
            **ids,
        )
    if known is None:
        problem = f"unknown message type {_quote(kind)}" if "type" in obj else "no message type"
        raise ProtocolError("unknown_type", problem, ref="type", **ids)
    if known not in allowed:
        raise ProtocolError(
            "unexpected_type", f"{known} is not sent by the {side}", ref=known, **ids
        )
    try:
        return adapter.validate_python(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        first = errors[0]
        ref = _ref(first["loc"])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = f"{_printable(ref)}: {first['msg']}{more}"
        raise ProtocolError("invalid_message", message, ref=ref, **ids) from None


_ANY: TypeAdapter[Message] = TypeAdapter(Message)
_FROM_CLIENT: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
_FROM_SERVER: TypeAdapter[ServerMessage] = TypeAdapter(ServerMessage)
_AUDIO_IN: TypeAdapter[AudioChunk] = TypeAdapter(AudioChunk)
_AUDIO_OUT: TypeAdapter[TTSChunk] = TypeAdapter(TTSChunk)
_CLIENT_TYPES = frozenset(message_classes(ClientMessage))
_SERVER_TYPES = frozenset(message_classes(ServerMessage))


def parse_message(data: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Parse one frame into a message of either direction.

    Args:
        data: the frame, a JSON object as text or UTF-8 bytes.
        max_bytes: the largest frame accepted, in bytes of UTF-8.

    Raises:
        ProtocolError: the frame is not a valid v1 message; `code` says why.
    """
    return _parse(data, max_bytes, _ANY, frozenset(MESSAGE_TYPES), "any side")


def parse_client_message(data: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> ClientMessage:
    """Parse a frame a game client sent (the server's side of the socket).

    Raises:
        ProtocolError: as `parse_message`, and code `unexpected_type` for a message only the
            server sends.
    """
    return _parse(data, max_bytes, _FROM_CLIENT, _CLIENT_TYPES, "client")


def parse_server_message(data: str | bytes, *, max_bytes: int = MAX_FRAME_BYTES) -> ServerMessage:
    """Parse a frame the server sent (the game client's side of the socket).

    Raises:
        ProtocolError: as `parse_message`, and code `unexpected_type` for a message only a
            client sends.
    """
    return _parse(data, max_bytes, _FROM_SERVER, _SERVER_TYPES, "server")


AUDIO_FRAME_MAGIC: Final = b"MYA1"
"""The first four bytes of a binary audio frame."""
_AUDIO_TYPES = {"client": frozenset({"AudioChunk"}), "server": frozenset({"TTSChunk"})}


def is_audio_frame(data: str | bytes) -> bool:
    """Whether a frame is a binary audio frame (else it is a JSON message)."""
    return isinstance(data, bytes) and data[:4] == AUDIO_FRAME_MAGIC


def dump_audio_frame(message: AudioChunk | TTSChunk) -> bytes:
    """A binary audio frame: `MYA1`, the header's length (4 bytes, little-endian), the message
    as JSON without its `pcm` (the header), then the PCM itself, raw.

    Audio travels without base64's third more bytes or its encoding work; the header is the
    same message, checked the same way.
    """
    header = message.model_dump_json(exclude_none=True, exclude={"pcm"}).encode("utf-8")
    return b"".join((AUDIO_FRAME_MAGIC, len(header).to_bytes(4, "little"), header, message.pcm))


def parse_audio_frame(
    data: bytes, *, side: Literal["client", "server"], max_bytes: int = MAX_FRAME_BYTES
) -> AudioChunk | TTSChunk:
    """Parse a binary audio frame sent by `side`: an `AudioChunk` from a client, a `TTSChunk`
    from the server.

    Raises:
        ProtocolError: not an audio frame, a header that is not a valid message of the
            right type, a `pcm` field in the header, or bad PCM (odd length, too long).
    """
    if len(data) > max_bytes:
        raise ProtocolError("frame_too_large", f"frame is larger than {max_bytes} bytes")
    if not is_audio_frame(data) or len(data) < 8:
        raise ProtocolError("bad_audio_frame", "a binary frame must start with b'MYA1'")
    size = int.from_bytes(data[4:8], "little")
    if size > len(data) - 8:
        raise ProtocolError(
            "bad_audio_frame", f"the header claims {size} bytes; the frame has {len(data) - 8}"
        )
    obj = _decode(data[8 : 8 + size], max_bytes)
    if not isinstance(obj, dict):
        raise ProtocolError(
            "not_an_object", f"an audio header is a JSON object, not {_JSON_KINDS[type(obj)]}"
        )
    if "pcm" in obj:
        raise ProtocolError(
            "invalid_message", "an audio frame carries its PCM after the header", ref="pcm"
        )
    obj["pcm"] = data[8 + size :]
    if side == "client":
        return _validate(obj, _AUDIO_IN, _AUDIO_TYPES["client"], "client in an audio frame")
    return _validate(obj, _AUDIO_OUT, _AUDIO_TYPES["server"], "server in an audio frame")


def dump_message(message: Message) -> str:
    """Serialize a message as compact JSON; fields that are None are left out."""
    return message.model_dump_json(exclude_none=True)


def error_message(
    exc: ProtocolError, *, turn_id: str | None = None, call_id: str | None = None
) -> Error:
    """The wire `Error` that answers a frame which failed to parse.

    Args:
        exc: the error `parse_message` (or a directional parser) raised.
        turn_id: the turn concerned, when the caller knows better than the frame did.
        call_id: the tool call concerned, likewise.
    """
    message = _printable(exc.message)
    if len(message) > MAX_NOTE_CHARS:
        message = message[: MAX_NOTE_CHARS - 3] + "..."
    return Error(
        code=exc.code,
        message=message,
        ref=exc.ref,
        turn_id=turn_id or exc.turn_id,
        call_id=call_id or exc.call_id,
        retryable=exc.retryable,
    )
