"""The v1 wire protocol: round trips, strictness, error codes, directions, JSON Schema export."""

from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

import mythic.contracts
from mythic import MythicError
from mythic.cli import app
from mythic.contracts import (
    ID_PATTERN,
    MAX_FRAME_BYTES,
    MAX_TEXT_CHARS,
    MESSAGE_TYPES,
    Ack,
    ASRFinal,
    ASRPartial,
    AudioChunk,
    Cutoff,
    Error,
    IntentRequest,
    IntentUpdate,
    LLMStreamDelta,
    Message,
    MessageType,
    NPCState,
    PlayerUtterance,
    ProtocolError,
    SceneAmbient,
    SceneEnd,
    SceneJoin,
    SceneLeave,
    SceneLine,
    SceneObject,
    SceneStart,
    SceneState,
    SceneTurn,
    SceneUpdate,
    SessionEnd,
    SessionStart,
    ToolCall,
    TTSChunk,
    Viseme,
    VoiceFormat,
    Welcome,
    dump_audio_frame,
    dump_message,
    error_message,
    is_audio_frame,
    json_schemas,
    parse_audio_frame,
    parse_client_message,
    parse_message,
    parse_server_message,
)

pytestmark = pytest.mark.unit

PCM = bytes(range(256)) * 4  # 1024 bytes: every byte value goes through base64

# One message of every type, with every optional field set.
SAMPLES: list[Message] = [
    SessionStart(
        player_id="p-7",
        session_id="s-1",
        resume_token="r-9f2c",
        voice=VoiceFormat(input_rate=48000, binary=True, push_to_talk=True),
    ),
    Welcome(session_id="s-1", resume_token="r-9f2c", resumed=True, max_frame_bytes=65536),
    SessionEnd(session_id="s-1", reason="player logged out"),
    AudioChunk(
        npc_id="barkeep_01",
        session_id="s-1",
        pcm=PCM,
        sample_rate=16000,
        ts_client=1723909123.102,
        turn_id="t-310",
        end=True,
    ),
    ASRPartial(npc_id="barkeep_01", session_id="s-1", turn_id="t-309", text="did you say"),
    ASRFinal(
        npc_id="barkeep_01",
        session_id="s-1",
        turn_id="t-309",
        text="Did you say the tavern is closed?",
        lang="en",
    ),
    PlayerUtterance(
        npc_id="barkeep_01",
        session_id="s-1",
        turn_id="t-310",
        text='Is the "Crow & Crown" open? Ünïcode, emoji 🍺, newline\nand a \\ backslash',
        player_id="p-7",
    ),
    SceneUpdate(
        npc_id="barkeep_01",
        zone="market",
        time="21:10",
        date="612-11-3",
        objects=(SceneObject(id="guard_3", dist=5.1), SceneObject(id="player", dist=1.2)),
    ),
    IntentRequest(
        npc_id="guard_3", request_id="q-1", context="the player drew a sword", with_bark=True
    ),
    SceneStart(
        scene_id="tavern-1", session_id="s-1", npcs=("barkeep_01", "guard_3"), max_exchanges=3
    ),
    SceneJoin(scene_id="tavern-1", session_id="s-1", npc_id="countess"),
    SceneLeave(scene_id="tavern-1", session_id="s-1", npc_id="guard_3"),
    SceneEnd(scene_id="tavern-1", session_id="s-1", reason="the player left the tavern"),
    SceneLine(
        scene_id="tavern-1",
        session_id="s-1",
        turn_id="t-311",
        text="Guard, is the road north safe?",
        to="barkeep_01",
        player_id="p-7",
    ),
    SceneAmbient(
        scene_id="tavern-1",
        session_id="s-1",
        turn_id="amb-1",
        lines=6,
        opener="guard_3",
        topic="the fog on the marsh road",
        priority="bronze",
    ),
    SceneState(
        scene_id="tavern-1", session_id="s-1", npcs=("barkeep_01", "countess"), players=("s-1",)
    ),
    SceneTurn(
        scene_id="tavern-1",
        session_id="s-1",
        turn_id="t-311",
        speakers=("guard_3", "barkeep_01"),
        turn_ids=("t-311", "t-311.1"),
        chosen_by="name",
    ),
    LLMStreamDelta(
        npc_id="barkeep_01",
        session_id="s-1",
        turn_id="t-309",
        seq=3,
        delta="open till the moon's high.",
        final=True,
        finish_reason="stop",
    ),
    TTSChunk(
        npc_id="barkeep_01",
        session_id="s-1",
        turn_id="t-309",
        seq=0,
        pcm=PCM,
        sample_rate=24000,
        visemes=(Viseme(t=0.12, p="AA"), Viseme(t=0.2, p="sil")),
        final=True,
    ),
    ToolCall(
        name="set_waypoint",
        args={"x": 12.4, "y": 0.0, "z": -3.1, "tags": ["inn", None, True], "meta": {"n": 2}},
        npc_id="barkeep_01",
        turn_id="t-309",
        call_id="c-88310",
    ),
    IntentUpdate(
        npc_id="guard_3",
        intent="combat",
        urgency=0.9,
        target="player",
        bark="Put that blade away, stranger!",
        request_id="q-1",
    ),
    NPCState(npc_id="barkeep_01", state="speaking", session_id="s-1", turn_id="t-309"),
    Cutoff(npc_id="barkeep_01", session_id="s-1", turn_id="t-309", reason="cancelled"),
    Ack(
        ack_of="ToolCall",
        status="ok",
        turn_id="t-309",
        call_id="c-88310",
        result={"arrived": False, "eta_s": 4.5},
        message="on its way",
    ),
    Error(
        code="TOOL_TIMEOUT",
        message="set_waypoint timed out",
        ref="ToolCall",
        turn_id="t-309",
        call_id="c-88310",
        retryable=True,
    ),
]

CLIENT_SENDS = {
    "SessionStart",
    "SessionEnd",
    "AudioChunk",
    "PlayerUtterance",
    "SceneUpdate",
    "SceneStart",
    "SceneJoin",
    "SceneLeave",
    "SceneEnd",
    "SceneLine",
    "SceneAmbient",
    "IntentRequest",
    "Cutoff",
    "Ack",
    "Error",
}
SERVER_SENDS = {
    "Welcome",
    "SessionEnd",
    "ASRPartial",
    "ASRFinal",
    "LLMStreamDelta",
    "TTSChunk",
    "ToolCall",
    "IntentUpdate",
    "NPCState",
    "SceneState",
    "SceneTurn",
    "SceneEnd",
    "Cutoff",
    "Ack",
    "Error",
}


def _utterance(**changes: Any) -> str:
    """A PlayerUtterance frame with fields changed; a value of ... removes the field."""
    fields: dict[str, Any] = {
        "schema_version": "v1",
        "type": "PlayerUtterance",
        "npc_id": "marla",
        "session_id": "s-1",
        "turn_id": "t-1",
        "text": "Is the tavern open?",
    }
    fields.update(changes)
    return json.dumps({k: v for k, v in fields.items() if v is not ...})


def _frame(type_name: str, **fields: Any) -> str:
    return json.dumps({"schema_version": "v1", "type": type_name, **fields})


def _check_error(exc: ProtocolError) -> Error:
    """Every ProtocolError can be answered: its Error message is valid and survives the wire."""
    assert isinstance(exc, MythicError)
    assert exc.message and exc.fix
    wire = error_message(exc)
    assert (wire.code, wire.ref) == (exc.code, exc.ref)
    assert parse_server_message(dump_message(wire)) == wire
    return wire


# -- the message set --------------------------------------------------------------------------


def test_every_message_type_has_a_sample_and_a_name() -> None:
    assert sorted(m.type for m in SAMPLES) == sorted(MESSAGE_TYPES)
    assert set(get_args(MessageType)) == set(MESSAGE_TYPES)
    assert len(MESSAGE_TYPES) == 25


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.type)
def test_round_trip(message: Message) -> None:
    frame = dump_message(message)
    obj = json.loads(frame)
    assert list(obj)[:2] == ["schema_version", "type"]
    assert obj["schema_version"] == "v1" and obj["type"] == message.type
    assert frame == json.dumps(obj, separators=(",", ":"), ensure_ascii=False)  # compact
    assert parse_message(frame) == message
    assert parse_message(frame.encode("utf-8")) == message
    assert dump_message(parse_message(frame)) == frame


def test_none_fields_are_left_out_and_defaults_fill_in() -> None:
    message = NPCState(npc_id="marla", state="idle")
    assert dump_message(message) == (
        '{"schema_version":"v1","type":"NPCState","npc_id":"marla","state":"idle"}'
    )
    parsed = parse_message(
        '{"schema_version":"v1","type":"Cutoff","npc_id":"a","session_id":"s","turn_id":"t"}'
    )
    assert isinstance(parsed, Cutoff) and parsed.reason == "barge_in"


def test_binary_audio_frames_round_trip_without_base64() -> None:
    chunk = AudioChunk(npc_id="a", session_id="s", pcm=PCM, sample_rate=16000, ts_client=1.5)
    frame = dump_audio_frame(chunk)
    assert is_audio_frame(frame) and frame.endswith(PCM)
    assert len(frame) < len(dump_message(chunk))  # no base64
    assert parse_audio_frame(frame, side="client") == chunk
    out = TTSChunk(
        npc_id="a",
        session_id="s",
        turn_id="t",
        seq=3,
        pcm=PCM,
        sample_rate=22050,
        visemes=(Viseme(t=0.0, p="aa"), Viseme(t=0.02, p="PP")),
        final=True,
    )
    assert parse_audio_frame(dump_audio_frame(out), side="server") == out
    assert not is_audio_frame(dump_message(chunk)) and not is_audio_frame(b'{"type":1}')


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"MYA2" + bytes(8), "bad_audio_frame"),  # not the magic
        (b"MYA1\x00", "bad_audio_frame"),  # no header length
        (b"MYA1" + (1000).to_bytes(4, "little") + b"{}", "bad_audio_frame"),  # claims too much
        (b"MYA1" + (2).to_bytes(4, "little") + b"[]\x00\x00", "not_an_object"),
        (b"MYA1" + (3).to_bytes(4, "little") + b"{x}\x00\x00", "bad_json"),
    ],
)
def test_malformed_audio_frames_get_typed_errors(frame: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_audio_frame(frame, side="client")
    assert caught.value.code == code


def test_audio_frame_headers_are_checked_like_json_messages() -> None:
    chunk = AudioChunk(npc_id="a", session_id="s", pcm=b"\x01\x02", sample_rate=16000, ts_client=0)
    frame = dump_audio_frame(chunk)
    with pytest.raises(ProtocolError) as caught:
        parse_audio_frame(frame[:-1], side="client")  # odd PCM
    assert caught.value.code == "invalid_message" and caught.value.ref == "pcm"
    with pytest.raises(ProtocolError) as caught:
        parse_audio_frame(frame, side="server")  # a client's audio is not the server's
    assert caught.value.code == "unexpected_type"
    header = dump_message(chunk).encode()  # pcm inside the header too
    with pytest.raises(ProtocolError) as caught:
        parse_audio_frame(b"MYA1" + len(header).to_bytes(4, "little") + header, side="client")
    assert caught.value.ref == "pcm"
    with pytest.raises(ProtocolError) as caught:
        parse_audio_frame(frame, side="client", max_bytes=10)
    assert caught.value.code == "frame_too_large"


def test_voice_format_takes_rates_the_server_can_decimate() -> None:
    assert VoiceFormat().input_rate == 16000
    with pytest.raises(ValidationError, match="16000, 32000 or 48000"):
        VoiceFormat(input_rate=44100)


def test_audio_is_raw_bytes_in_python_and_base64_on_the_wire() -> None:
    chunk = AudioChunk(npc_id="a", session_id="s", pcm=b"\x01\x02", sample_rate=16000, ts_client=0)
    assert chunk.pcm == b"\x01\x02"
    assert json.loads(dump_message(chunk))["pcm"] == "AQI="
    assert chunk.model_dump()["pcm"] == b"\x01\x02"


@pytest.mark.parametrize(
    "frame",
    [
        # The technical design's own examples (sections 4.1, 4.4, 11.2); SceneUpdate gains the
        # schema_version the design requires of every message.
        '{"schema_version": "v1", "type": "AudioChunk", "npc_id": "barkeep_01", '
        '"session_id": "s-124", "pcm": "AAABAAIA", "sample_rate": 16000, '
        '"ts_client": 1723909123.102}',
        '{ "schema_version":"v1", "type":"Error", "code":"TOOL_TIMEOUT", '
        '"message":"set_waypoint timed out", "turn_id":"t-309", "call_id":"c-88310", '
        '"ref":"e-72f4" }',
        '{ "schema_version":"v1", "type":"Ack", "ack_of":"ToolCall", "turn_id":"t-309", '
        '"call_id":"c-88310", "status":"ok" }',
        '{ "schema_version":"v1", "type":"ToolCall", "name":"set_waypoint", '
        '"args":{"x":12.4,"y":0.0,"z":-3.1}, "npc_id":"barkeep_01", "turn_id":"t-309", '
        '"call_id":"c-88310" }',
        '{ "schema_version":"v1", "type":"SceneUpdate", "npc_id":"barkeep_01", '
        '"objects":[{"id":"guard_3","dist":5.1},{"id":"player","dist":1.2}], '
        '"time":"21:10", "zone":"market" }',
    ],
)
def test_the_design_documents_examples_parse(frame: str) -> None:
    message = parse_message(frame)
    assert parse_message(dump_message(message)) == message


def test_messages_are_frozen_and_checked_when_built_in_python() -> None:
    message = SAMPLES[0]
    with pytest.raises(ValidationError):
        message.player_id = "someone-else"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        SceneObject(id="guard_3", dist=math.nan)
    with pytest.raises(ValidationError):
        ToolCall(name="x", args={"a": math.inf}, npc_id="a", turn_id="t", call_id="c")
    with pytest.raises(ValidationError):
        ToolCall(name="x", args={"a": {1, 2}}, npc_id="a", turn_id="t", call_id="c")
    with pytest.raises(ValidationError):
        PlayerUtterance(npc_id="a", session_id="s", turn_id="t", text="hi", mood="grumpy")  # type: ignore[call-arg]


# -- bad input --------------------------------------------------------------------------------

BAD_FRAMES: list[tuple[str, str | bytes, str, str | None]] = [
    # (case, frame, code, ref)
    ("truncated JSON", '{"schema_version": "v1", "type": "PlayerUtterance",', "bad_json", None),
    ("empty frame", "", "bad_json", None),
    ("invalid UTF-8", b'{"schema_version": "v1", "type": "\xff"}', "bad_json", None),
    ("UTF-16", _utterance().encode("utf-16"), "bad_json", None),
    ("raw lone surrogate", '{"text": "\ud800"}', "bad_json", None),
    (
        "NaN",
        _frame("SceneUpdate", npc_id="a", objects=[{"id": "x", "dist": math.nan}]),
        "bad_json",
        None,
    ),
    ("Infinity", _utterance(turn_id=math.inf), "bad_json", None),
    ("duplicate key", '{"schema_version":"v1","type":"Ack","type":"ToolCall"}', "bad_json", None),
    ("deep nesting", "[" * 50_000, "bad_json", None),
    ("5000-digit integer", "9" * 5000, "bad_json", None),
    ("JSON array", "[1, 2]", "not_an_object", None),
    ("JSON string", '"PlayerUtterance"', "not_an_object", None),
    ("JSON null", "null", "not_an_object", None),
    ("JSON number", "42", "not_an_object", None),
    (
        "wrong schema_version",
        _utterance(schema_version="v2"),
        "bad_schema_version",
        "PlayerUtterance.schema_version",
    ),
    (
        "numeric schema_version",
        _utterance(schema_version=1),
        "bad_schema_version",
        "PlayerUtterance.schema_version",
    ),
    (
        "no schema_version",
        _utterance(schema_version=...),
        "bad_schema_version",
        "PlayerUtterance.schema_version",
    ),
    (
        "v2 and unknown type",
        _utterance(schema_version="v2", type="Teleport"),
        "bad_schema_version",
        "schema_version",
    ),
    ("unknown type", _utterance(type="Teleport"), "unknown_type", "type"),
    ("no type", _utterance(type=...), "unknown_type", "type"),
    ("numeric type", _utterance(type=7), "unknown_type", "type"),
    ("case of the type", _utterance(type="playerutterance"), "unknown_type", "type"),
    ("missing field", _utterance(text=...), "invalid_message", "PlayerUtterance.text"),
    ("extra field", _utterance(mood="grumpy"), "invalid_message", "PlayerUtterance.mood"),
    ("null required field", _utterance(npc_id=None), "invalid_message", "PlayerUtterance.npc_id"),
    ("over-long id", _utterance(npc_id="n" * 129), "invalid_message", "PlayerUtterance.npc_id"),
    ("empty id", _utterance(session_id=""), "invalid_message", "PlayerUtterance.session_id"),
    ("space in id", _utterance(npc_id="bar keep"), "invalid_message", "PlayerUtterance.npc_id"),
    ("newline after id", _utterance(npc_id="marla\n"), "invalid_message", "PlayerUtterance.npc_id"),
    ("non-ASCII id", _utterance(npc_id="marlä"), "invalid_message", "PlayerUtterance.npc_id"),
    (
        "over-long text",
        _utterance(text="a" * (MAX_TEXT_CHARS + 1)),
        "invalid_message",
        "PlayerUtterance.text",
    ),
    ("blank text", _utterance(text=" \n\t "), "invalid_message", "PlayerUtterance.text"),
    (
        "escaped lone surrogate",
        _utterance(text="\ud800"),
        "invalid_message",
        "PlayerUtterance.text",
    ),
    ("number for text", _utterance(text=5), "invalid_message", "PlayerUtterance.text"),
    (
        "string for int",
        _frame("Welcome", session_id="s", resume_token="r", max_frame_bytes="65536"),
        "invalid_message",
        "Welcome.max_frame_bytes",
    ),
    (
        "number for bool",
        _frame("IntentRequest", npc_id="a", request_id="q", with_bark=1),
        "invalid_message",
        "IntentRequest.with_bark",
    ),
    (
        "0 for false",
        _frame("ASRPartial", npc_id="a", session_id="s", turn_id="t", text="x", is_final=0),
        "invalid_message",
        "ASRPartial.is_final",
    ),
    (
        "float for int",
        _frame(
            "AudioChunk", npc_id="a", session_id="s", pcm="AAA=", sample_rate=16000.0, ts_client=1
        ),
        "invalid_message",
        "AudioChunk.sample_rate",
    ),
    (
        "sample rate out of range",
        _frame(
            "AudioChunk", npc_id="a", session_id="s", pcm="AAA=", sample_rate=1_000_000, ts_client=1
        ),
        "invalid_message",
        "AudioChunk.sample_rate",
    ),
    (
        "pcm not base64",
        _frame(
            "AudioChunk",
            npc_id="a",
            session_id="s",
            pcm="not base64!",
            sample_rate=16000,
            ts_client=1,
        ),
        "invalid_message",
        "AudioChunk.pcm",
    ),
    (
        "pcm of odd length",
        _frame(
            "AudioChunk", npc_id="a", session_id="s", pcm="AAAA", sample_rate=16000, ts_client=1
        ),
        "invalid_message",
        "AudioChunk.pcm",
    ),
    (
        "number overflowing to infinity",
        '{"schema_version":"v1","type":"SceneUpdate","npc_id":"a",'
        '"objects":[{"id":"x","dist":1e999}]}',
        "invalid_message",
        "SceneUpdate.objects.0.dist",
    ),
    (
        "a game date that is not year-month-day",
        _frame("SceneUpdate", npc_id="a", date="3rd of Mistmonth"),
        "invalid_message",
        "SceneUpdate.date",
    ),
    (
        "negative distance",
        _frame("SceneUpdate", npc_id="a", objects=[{"id": "x", "dist": -1}]),
        "invalid_message",
        "SceneUpdate.objects.0.dist",
    ),
    (
        "extra field in a nested object",
        _frame("SceneUpdate", npc_id="a", objects=[{"id": "x", "dist": 1, "hp": 3}]),
        "invalid_message",
        "SceneUpdate.objects.0.hp",
    ),
    (
        "too many objects",
        _frame("SceneUpdate", npc_id="a", objects=[{"id": f"o{i}", "dist": 1} for i in range(257)]),
        "invalid_message",
        "SceneUpdate.objects",
    ),
    (
        "ambient lines over the limit",
        _frame("SceneAmbient", scene_id="t", session_id="s", turn_id="a", lines=31),
        "invalid_message",
        "SceneAmbient.lines",
    ),
    (
        "ambient priority not a class",
        _frame("SceneAmbient", scene_id="t", session_id="s", turn_id="a", priority="gold"),
        "invalid_message",
        "SceneAmbient.priority",
    ),
    (
        "bad game time",
        _frame("SceneUpdate", npc_id="a", time="25:00"),
        "invalid_message",
        "SceneUpdate.time",
    ),
    (
        "infinite tool argument",
        '{"schema_version":"v1","type":"ToolCall","name":"set_waypoint","args":{"x":-1e999},'
        '"npc_id":"a","turn_id":"t","call_id":"c"}',
        "invalid_message",
        "ToolCall.args",
    ),
    (
        "tool arguments nested too deeply",
        _frame(
            "ToolCall",
            name="x",
            args={"a": [[[[[[[[[1]]]]]]]]]},
            npc_id="a",
            turn_id="t",
            call_id="c",
        ),
        "invalid_message",
        "ToolCall.args",
    ),
    (
        "integer beyond 2**53 in tool arguments",
        _frame("ToolCall", name="x", args={"id": 2**60}, npc_id="a", turn_id="t", call_id="c"),
        "invalid_message",
        "ToolCall.args",
    ),
    (
        "too many tool argument values",
        _frame(
            "ToolCall",
            name="x",
            args={"a": list(range(2000))},
            npc_id="a",
            turn_id="t",
            call_id="c",
        ),
        "invalid_message",
        "ToolCall.args",
    ),
    (
        "tool arguments not an object",
        _frame("ToolCall", name="x", args=[1], npc_id="a", turn_id="t", call_id="c"),
        "invalid_message",
        "ToolCall.args",
    ),
    (
        "tool name not an identifier",
        _frame("ToolCall", name="rm -rf", args={}, npc_id="a", turn_id="t", call_id="c"),
        "invalid_message",
        "ToolCall.name",
    ),
    (
        "Ack of a ToolCall without call_id",
        _frame("Ack", ack_of="ToolCall", status="ok"),
        "invalid_message",
        "Ack",
    ),
    (
        "Ack of an unknown type",
        _frame("Ack", ack_of="Teleport", status="ok"),
        "invalid_message",
        "Ack.ack_of",
    ),
    (
        "resume without a token",
        _frame("SessionStart", session_id="s-1"),
        "invalid_message",
        "SessionStart",
    ),
    (
        "final delta without a reason",
        _frame(
            "LLMStreamDelta", npc_id="a", session_id="s", turn_id="t", seq=0, delta="", final=True
        ),
        "invalid_message",
        "LLMStreamDelta",
    ),
    (
        "negative seq",
        _frame("LLMStreamDelta", npc_id="a", session_id="s", turn_id="t", seq=-1, delta="x"),
        "invalid_message",
        "LLMStreamDelta.seq",
    ),
    (
        "unknown intent",
        _frame("IntentUpdate", npc_id="a", intent="dance"),
        "invalid_message",
        "IntentUpdate.intent",
    ),
    (
        "urgency above 1",
        _frame("IntentUpdate", npc_id="a", intent="trade", urgency=1.5),
        "invalid_message",
        "IntentUpdate.urgency",
    ),
    (
        "bark of nine words",
        _frame(
            "IntentUpdate",
            npc_id="a",
            intent="hint",
            bark="one two three four five six seven eight nine",
        ),
        "invalid_message",
        "IntentUpdate.bark",
    ),
    (
        "bark over 80 characters",
        _frame("IntentUpdate", npc_id="a", intent="hint", bark="a" * 81),
        "invalid_message",
        "IntentUpdate.bark",
    ),
    (
        "unknown NPC state",
        _frame("NPCState", npc_id="a", state="dancing"),
        "invalid_message",
        "NPCState.state",
    ),
]


@pytest.mark.parametrize(
    ("frame", "code", "ref"), [c[1:] for c in BAD_FRAMES], ids=[c[0] for c in BAD_FRAMES]
)
def test_bad_input_gets_a_code_and_a_ref(frame: str | bytes, code: str, ref: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_message(frame)
    assert (info.value.code, info.value.ref) == (code, ref), info.value.message
    _check_error(info.value)


def test_boundaries_are_inclusive() -> None:
    assert parse_message(_utterance(text="a" * MAX_TEXT_CHARS))
    assert parse_message(_utterance(npc_id="n" * 128, turn_id="a.b:c-d_9"))
    bark = _frame(
        "IntentUpdate", npc_id="a", intent="hint", bark="one two three four five six seven eight"
    )
    assert parse_message(bark)
    nested = _frame(
        "ToolCall", name="x", args={"a": [[[[[[[1]]]]]]]}, npc_id="a", turn_id="t", call_id="c"
    )
    assert parse_message(nested)


def test_an_error_names_the_frames_turn_and_call_when_they_are_well_formed() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_message(_utterance(text="", turn_id="t-42"))
    wire = _check_error(info.value)
    assert wire.turn_id == "t-42" and wire.call_id is None
    assert error_message(info.value, turn_id="t-43").turn_id == "t-43"
    with pytest.raises(ProtocolError) as info:
        parse_message(_utterance(text="", turn_id="not an id"))
    assert _check_error(info.value).turn_id is None


def test_refs_and_messages_stay_short_and_printable_whatever_the_peer_sends() -> None:
    key = "\u2028\x00" + "k" * 5000
    with pytest.raises(ProtocolError) as info:
        parse_message(_utterance(**{key: 1}))
    exc = info.value
    assert exc.code == "invalid_message"
    assert exc.ref is not None and exc.ref.startswith("PlayerUtterance.\\u2028\\u0000kkk")
    assert len(exc.ref) <= 256 and exc.ref.isprintable() and exc.message.isprintable()
    assert len(error_message(exc).message) <= 1000


def test_oversized_frames_are_refused_before_parsing() -> None:
    frame = dump_message(PlayerUtterance(npc_id="a", session_id="s", turn_id="t", text="é" * 40))
    size = len(frame.encode("utf-8"))
    assert len(frame) < size
    assert parse_message(frame, max_bytes=size)
    assert parse_message(frame.encode("utf-8"), max_bytes=size)
    for data in (frame, frame.encode("utf-8")):
        with pytest.raises(ProtocolError) as info:
            parse_message(data, max_bytes=size - 1)
        assert (info.value.code, info.value.ref) == ("frame_too_large", None)
        _check_error(info.value)
    # Past the default cap even whitespace is refused as too large, not parsed.
    with pytest.raises(ProtocolError) as info:
        parse_client_message(" " * (MAX_FRAME_BYTES + 1))
    assert info.value.code == "frame_too_large"


def test_each_side_accepts_only_what_the_other_side_sends() -> None:
    for message in SAMPLES:
        frame = dump_message(message)
        for parse, sends in (
            (parse_client_message, CLIENT_SENDS),
            (parse_server_message, SERVER_SENDS),
        ):
            if message.type in sends:
                assert parse(frame) == message
            else:
                with pytest.raises(ProtocolError) as info:
                    parse(frame)
                assert (info.value.code, info.value.ref) == ("unexpected_type", message.type)
                _check_error(info.value)
    assert set(MESSAGE_TYPES) == CLIENT_SENDS | SERVER_SENDS


def test_wrong_direction_keeps_the_turn_for_the_error() -> None:
    tool_call = next(m for m in SAMPLES if isinstance(m, ToolCall))
    with pytest.raises(ProtocolError) as info:
        parse_client_message(dump_message(tool_call))
    wire = error_message(info.value)
    assert (wire.code, wire.turn_id, wire.call_id) == ("unexpected_type", "t-309", "c-88310")


# -- random and mutated frames (hypothesis) -----------------------------------------------------


def _answer(data: str | bytes) -> None:
    """Parse with every parser: a message that dumps and parses back, or a ProtocolError."""
    for parse in (parse_message, parse_client_message, parse_server_message):
        try:
            message = parse(data)
        except ProtocolError as exc:
            _check_error(exc)
        else:
            assert parse(dump_message(message)) == message


def test_random_and_mutated_frames_raise_nothing_but_protocol_error() -> None:
    pytest.importorskip("hypothesis", reason="hypothesis comes with the dev extra")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    texts = (
        st.text(max_size=12)
        | st.characters(categories=["Cs"])
        | st.sampled_from(["v1", "ToolCall", "t-1", "", " ", "AAAA", "21:10", "combat", "ok"])
    )
    numbers = st.integers() | st.floats() | st.integers(-(2**63), 2**63)
    scalars = st.none() | st.booleans() | numbers | texts
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
        max_leaves=12,
    )

    @st.composite
    def mutated(draw: st.DrawFn) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(dump_message(draw(st.sampled_from(SAMPLES))))
        for _ in range(draw(st.integers(1, 3))):
            keys = sorted(obj)
            action = draw(st.sampled_from(["drop", "replace", "add"]))
            if action == "drop" and keys:
                del obj[draw(st.sampled_from(keys))]
            elif action == "replace" and keys:
                obj[draw(st.sampled_from(keys))] = draw(values)
            else:
                obj[draw(texts)] = draw(values)
        return obj

    @st.composite
    def frames(draw: st.DrawFn) -> str | bytes:
        kind = draw(st.sampled_from(["bytes", "text", "json", "mutated"]))
        if kind == "bytes":
            return draw(st.binary(max_size=200))
        if kind == "text":
            return draw(st.text(max_size=200))
        obj = draw(values if kind == "json" else mutated())
        frame = json.dumps(obj, ensure_ascii=draw(st.booleans()))
        if draw(st.booleans()):
            return frame.encode("utf-8", errors="surrogatepass")
        return frame

    @settings(
        max_examples=400,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(frames())
    def check(frame: str | bytes) -> None:
        _answer(frame)

    check()


def test_any_player_text_survives_the_round_trip() -> None:
    pytest.importorskip("hypothesis", reason="hypothesis comes with the dev extra")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None, database=None)
    @given(st.text(min_size=1, max_size=MAX_TEXT_CHARS).filter(lambda t: not t.isspace()))
    def check(text: str) -> None:
        message = PlayerUtterance(npc_id="a", session_id="s", turn_id="t", text=text)
        assert parse_client_message(dump_message(message)) == message

    check()


# -- JSON Schema ------------------------------------------------------------------------------


def _export(tmp_path: Path, *args: str) -> tuple[Path, str]:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["schema", "export", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return out, result.stdout


def test_schema_export_writes_every_document_and_says_so(tmp_path: Path) -> None:
    out, stdout = _export(tmp_path)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert written == sorted(json_schemas())
    assert len(written) == 3 + len(MESSAGE_TYPES)
    for name in written:
        assert f"wrote {out / name}" in stdout
        document = json.loads((out / name).read_text(encoding="utf-8"))
        assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    ("name", "types"),
    [
        ("mythic-v1.schema.json", set(MESSAGE_TYPES)),
        ("mythic-v1-client.schema.json", CLIENT_SENDS),
        ("mythic-v1-server.schema.json", SERVER_SENDS),
    ],
)
def test_union_schemas_discriminate_on_type(tmp_path: Path, name: str, types: set[str]) -> None:
    out, _ = _export(tmp_path)
    schema = json.loads((out / name).read_text(encoding="utf-8"))
    assert schema["discriminator"]["propertyName"] == "type"
    assert set(schema["discriminator"]["mapping"]) == types
    refs = {one["$ref"] for one in schema["oneOf"]}
    assert refs == set(schema["discriminator"]["mapping"].values())
    for ref in refs:
        definition = schema["$defs"][ref.removeprefix("#/$defs/")]
        assert definition["required"][:2] == ["schema_version", "type"]
        assert definition["additionalProperties"] is False


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.type)
def test_message_schema_matches_what_goes_on_the_wire(message: Message) -> None:
    schema = json_schemas()[f"messages/{message.type}.schema.json"]
    wire = json.loads(dump_message(message))
    properties = schema["properties"]
    assert properties["type"]["const"] == message.type
    assert properties["schema_version"]["const"] == "v1"
    assert schema["additionalProperties"] is False
    assert set(wire) == set(properties)  # the samples set every field
    assert set(schema["required"]) <= set(wire)
    for field, spec in properties.items():
        assert spec.get("description"), f"{message.type}.{field} has no description"
        if field.endswith("_id") and "pattern" in spec:
            assert spec["pattern"] == ID_PATTERN


def test_nested_objects_are_defined_in_the_schema() -> None:
    scene = json_schemas()["messages/SceneUpdate.schema.json"]
    assert scene["$defs"]["SceneObject"]["additionalProperties"] is False
    assert scene["properties"]["objects"]["anyOf"][0]["maxItems"] == 256


def _meets_rules(schema: dict[str, Any], message: dict[str, Any]) -> bool:
    """Whether `message` meets the cross-field rules (`allOf` of `if`/`then`/`else` with
    `properties`, `required`, `const` and `type`) of its definition: the part of JSON Schema
    the rules use, evaluated as a client's validator does."""

    def holds(part: dict[str, Any]) -> bool:
        if any(name not in message for name in part.get("required", [])):
            return False
        for name, spec in part.get("properties", {}).items():
            if name not in message:
                continue
            value = message[name]
            if "const" in spec and value != spec["const"]:
                return False
            kind = spec.get("type")
            if kind == "string" and not isinstance(value, str):
                return False
            if kind == "null" and value is not None:
                return False
        return True

    return all(
        holds(rule["then"]) if holds(rule["if"]) else holds(rule.get("else", {}))
        for rule in schema.get("allOf", [])
    )


@pytest.mark.parametrize(
    ("type_name", "message"),
    [
        ("SessionStart", {"session_id": "s-1"}),
        ("SessionStart", {"resume_token": "r-1"}),
        ("SessionStart", {"session_id": "s-1", "resume_token": None}),
        ("SessionStart", {}),
        ("SessionStart", {"session_id": "s-1", "resume_token": "r-1"}),
        ("Ack", {"ack_of": "ToolCall", "status": "ok", "turn_id": "t-1"}),
        ("Ack", {"ack_of": "ToolCall", "status": "ok", "call_id": "c-1"}),
        ("Ack", {"ack_of": "SceneUpdate", "status": "ok"}),
        ("LLMStreamDelta", {"final": True}),
        ("LLMStreamDelta", {"final": True, "finish_reason": "stop"}),
        ("LLMStreamDelta", {"finish_reason": "stop"}),
        ("LLMStreamDelta", {"final": False, "finish_reason": None}),
        ("LLMStreamDelta", {}),
    ],
)
def test_the_schema_refuses_what_the_cross_field_validators_refuse(
    type_name: str, message: dict[str, Any]
) -> None:
    """A client that checks what it sends against the JSON Schema refuses exactly what the
    server's validators would (`SessionStart`'s resume, `Ack`'s call_id, `LLMStreamDelta`'s
    finish_reason): the rules are in the schema, not only in pydantic."""
    ids = {"npc_id": "marla", "session_id": "s-1", "turn_id": "t-1", "seq": 0, "delta": ""}
    model = MESSAGE_TYPES[type_name]
    fields = {k: v for k, v in ids.items() if k in model.model_fields} | message
    try:
        model.model_validate({"type": type_name, **fields})
        valid = True
    except ValidationError:
        valid = False
    schema = json_schemas()[f"messages/{type_name}.schema.json"]
    assert _meets_rules(schema, fields) is valid


def test_a_voice_sessions_input_rate_is_one_of_three_in_the_schema_too() -> None:
    voice = json_schemas()["messages/SessionStart.schema.json"]["$defs"]["VoiceFormat"]
    assert voice["properties"]["input_rate"]["enum"] == [16000, 32000, 48000]
    for rate in (16000, 22050):
        accepted = rate in voice["properties"]["input_rate"]["enum"]
        try:
            VoiceFormat(input_rate=rate)
            assert accepted
        except ValidationError:
            assert not accepted


def test_schema_export_defaults_to_schemas_in_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["schema", "export"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "schemas" / "mythic-v1.schema.json").is_file()
    assert (tmp_path / "schemas" / "messages" / "ToolCall.schema.json").is_file()


def test_schema_export_into_a_file_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(app, ["schema", "export", "--out", str(blocker)])
    assert result.exit_code == 2
    assert "cannot write" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


# -- the package ------------------------------------------------------------------------------


def test_public_surface_is_declared_and_documented() -> None:
    exported = mythic.contracts.__all__
    assert len(set(exported)) == len(exported)
    for name in exported:
        value = getattr(mythic.contracts, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, f"mythic.contracts.{name} has no docstring"


def test_contracts_import_nothing_above_the_base_layer() -> None:
    folder = Path(mythic.contracts.__file__).parent
    for file in folder.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("mythic.")
            ):
                assert node.module.split(".")[1] in {"_errors", "contracts"}, (file, node.module)
