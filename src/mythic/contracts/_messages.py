"""The v1 messages: one pydantic model each, in one union discriminated by `type`.

Field names follow the technical design's data contracts (section 4) and scene/tools API
(section 11). Every message carries `schema_version: "v1"` and `type`; both have defaults in
Python and are required on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from pydantic.config import JsonDict

from mythic.contracts._types import (
    MAX_AMBIENT_LINES,
    MAX_SCENE_MEMBERS,
    MAX_SCENE_OBJECTS,
    MAX_VISEMES,
    Bark,
    Code,
    Distance,
    FalseFlag,
    GameDate,
    GameTime,
    Id,
    JsonObject,
    Lang,
    Line,
    Note,
    Pcm,
    Ref,
    SampleRate,
    Seconds,
    Seq,
    Text,
    ToolName,
)

_ENVELOPE = ("schema_version", "type")


def _envelope_schema(schema: JsonDict) -> None:
    """`type` and `schema_version` have Python defaults but a peer must always send them."""
    required = schema.get("required")
    rest = [r for r in required if r not in _ENVELOPE] if isinstance(required, list) else []
    schema["required"] = [*_ENVELOPE, *rest]
    properties = schema.get("properties")
    kind = properties.get("type") if isinstance(properties, dict) else None
    if isinstance(kind, dict):
        kind["description"] = "The message type: what the rest of the fields mean."


def _present(name: str, value: JsonDict) -> JsonDict:
    """JSON Schema: the object has `name`, and its value matches `value`."""
    return {"properties": {name: value}, "required": [name]}


def _with_rules(*rules: JsonDict) -> Callable[[JsonDict], None]:
    """The envelope's schema plus the cross-field rules the message's validator checks
    (`if`/`then`/`else` in an `allOf`), so that a client checking what it sends against the
    JSON Schema refuses what the server would."""

    def extra(schema: JsonDict) -> None:
        _envelope_schema(schema)
        schema["allOf"] = list(rules)

    return extra


_A_STRING: JsonDict = {"type": "string"}

_STRICT = ConfigDict(
    extra="forbid",
    frozen=True,
    allow_inf_nan=False,
    use_attribute_docstrings=True,
)


class _Part(BaseModel):
    """A JSON object nested inside a message."""

    model_config = _STRICT


class _Envelope(BaseModel):
    """What every v1 message carries."""

    model_config = ConfigDict(**_STRICT, json_schema_extra=_envelope_schema)

    schema_version: Literal["v1"] = "v1"
    """Protocol version. Any other value is answered with an `Error` of code
    `bad_schema_version`."""


# -- sessions -------------------------------------------------------------------------------------


class VoiceFormat(_Part):
    """How a session's audio travels (in `SessionStart.voice`)."""

    input_rate: Annotated[SampleRate, Field(json_schema_extra={"enum": [16000, 32000, 48000]})] = (
        16000
    )
    """Samples per second of the player's microphone audio (`AudioChunk.sample_rate` must
    match): 16000, or 32000 or 48000 (the server decimates to 16000)."""
    binary: StrictBool = False
    """True: the server sends `TTSChunk`s as binary audio frames (a JSON header and raw PCM,
    see `dump_audio_frame`) instead of JSON with base64 PCM. Either way the client may send
    `AudioChunk`s in binary frames."""
    push_to_talk: StrictBool = False
    """True: an utterance is the audio from the first `AudioChunk` after the last one with
    `end` set up to the next one with `end` set (the talk key), not delimited by silence."""

    @model_validator(mode="after")
    def _rate_divides(self) -> VoiceFormat:
        if self.input_rate not in (16000, 32000, 48000):
            raise ValueError("input_rate must be 16000, 32000 or 48000")
        return self


class SessionStart(_Envelope):
    """Client -> server: open a session, or resume one with the token from its `Welcome`."""

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra=_with_rules(
            {"if": _present("session_id", _A_STRING), "then": _present("resume_token", _A_STRING)},
            {"if": _present("resume_token", _A_STRING), "then": _present("session_id", _A_STRING)},
        ),
    )

    type: Literal["SessionStart"] = "SessionStart"
    player_id: Id | None = None
    """The player this session belongs to, when the game has one."""
    session_id: Id | None = None
    """The session to resume; leave out to open a new one. Requires `resume_token`."""
    resume_token: Id | None = None
    """The token the server gave in `Welcome`; required with `session_id`."""
    voice: VoiceFormat | None = None
    """The session talks by voice: the format of its audio. Without it, `AudioChunk`s are
    refused with `voice_off`."""

    @model_validator(mode="after")
    def _resume_needs_both(self) -> SessionStart:
        if (self.session_id is None) != (self.resume_token is None):
            raise ValueError("resuming a session needs both session_id and resume_token")
        return self


class Welcome(_Envelope):
    """Server -> client: the answer to `SessionStart`."""

    type: Literal["Welcome"] = "Welcome"
    session_id: Id
    """The session's id, to put in every later message of this session."""
    resume_token: Id
    """Send it back with `session_id` in a `SessionStart` to resume after a disconnect."""
    max_frame_bytes: Annotated[int, Field(strict=True, ge=1)]
    """The largest frame the server accepts, in bytes of UTF-8; larger ones get
    `frame_too_large`."""
    resumed: StrictBool = False
    """True when an existing session was resumed, false for a new one."""


class SessionEnd(_Envelope):
    """Either direction: the session is over; the server forgets its resume token."""

    type: Literal["SessionEnd"] = "SessionEnd"
    session_id: Id
    """The session that ends."""
    reason: Note | None = None
    """Why, for logs."""


# -- player input ---------------------------------------------------------------------------------


class AudioChunk(_Envelope):
    """Client -> server: a slice of the player's microphone audio, 20-100 ms of it, sent as it
    is captured (in a JSON frame, or a binary audio frame: `dump_audio_frame`)."""

    type: Literal["AudioChunk"] = "AudioChunk"
    npc_id: Id
    """The NPC the player is talking to."""
    session_id: Id
    """The session the audio belongs to."""
    pcm: Pcm
    """16-bit little-endian mono PCM: raw bytes in Python, base64 on the wire."""
    sample_rate: SampleRate
    """Samples per second of `pcm`."""
    ts_client: Seconds
    """When the chunk was captured, in seconds on the client's clock (Unix time)."""
    turn_id: Id | None = None
    """The turn the utterance in this audio opens, chosen by the client as for
    `PlayerUtterance` (its `ASRPartial`s, `ASRFinal` and reply carry it); when left out, or
    already used by an earlier utterance, the server picks one."""
    end: StrictBool = False
    """Push-to-talk sessions: the talk key was released, the utterance ends with this chunk.
    (Otherwise the server's voice activity detection finds the end, and `end` is ignored.)"""


class ASRPartial(_Envelope):
    """Server -> client: an unstable transcript of what the player is saying (captions)."""

    type: Literal["ASRPartial"] = "ASRPartial"
    npc_id: Id
    """The NPC being spoken to."""
    session_id: Id
    """The session the audio came in on."""
    turn_id: Id
    """The turn this speech opens; the NPC's reply carries the same id."""
    text: Text
    """The transcript so far; a later partial or the final one replaces it."""
    is_final: FalseFlag = False
    """Always false: the stable transcript comes as `ASRFinal`."""


class ASRFinal(_Envelope):
    """Server -> client: the stable transcript of one player utterance."""

    type: Literal["ASRFinal"] = "ASRFinal"
    npc_id: Id
    """The NPC being spoken to."""
    session_id: Id
    """The session the audio came in on."""
    turn_id: Id
    """The turn this utterance opens; the NPC's reply carries the same id."""
    text: Text
    """What the player said."""
    lang: Lang | None = None
    """The detected language, a BCP 47 tag."""


class PlayerUtterance(_Envelope):
    """Client -> server: the player says something to an NPC, as text."""

    type: Literal["PlayerUtterance"] = "PlayerUtterance"
    npc_id: Id
    """The NPC spoken to."""
    session_id: Id
    """The session the conversation belongs to."""
    turn_id: Id
    """Chosen by the client, unique in the session; the NPC's reply carries the same id."""
    text: Line
    """What the player says."""
    player_id: Id | None = None
    """Who says it, when several players share a session."""


class SceneObject(_Part):
    """Something an NPC perceives, and how far away it is."""

    id: Id
    """The object's id in the game (`guard_3`, `player`)."""
    dist: Distance
    """Distance from the NPC, in game units."""


class SceneUpdate(_Envelope):
    """Client -> server: what an NPC perceives now; fields left out are unchanged."""

    type: Literal["SceneUpdate"] = "SceneUpdate"
    npc_id: Id
    """The NPC whose surroundings these are."""
    zone: Id | None = None
    """The zone the NPC is in (`market`)."""
    time: GameTime | None = None
    """Time of day in the game world, `HH:MM`."""
    date: GameDate | None = None
    """The game's date, `year-month-day` in the world's calendar: the NPC's memories are
    dated by it (with `time`), "yesterday" and "last winter" are the game's, and old
    memories fade by its days. A date not in the calendar gets `bad_game_date`."""
    objects: Annotated[tuple[SceneObject, ...], Field(max_length=MAX_SCENE_OBJECTS)] | None = None
    """What is near the NPC, replacing the previous list; an empty list means nothing is."""


class IntentRequest(_Envelope):
    """Client -> server: ask for a fresh intent for an NPC (the game's intent cache, 1-2 Hz)."""

    type: Literal["IntentRequest"] = "IntentRequest"
    npc_id: Id
    """The NPC to decide for."""
    request_id: Id
    """Chosen by the client; the `IntentUpdate` answering this request carries it."""
    context: Note | None = None
    """What just happened, in a few words (`the player drew a sword`)."""
    with_bark: StrictBool = False
    """Also ask for a one-line remark the NPC can say right away."""


# -- NPC output -----------------------------------------------------------------------------------


class LLMStreamDelta(_Envelope):
    """Server -> client: the next piece of an NPC's reply text, streamed as it is generated."""

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra=_with_rules(
            {
                "if": _present("final", {"const": True}),
                "then": _present("finish_reason", _A_STRING),
                "else": {"properties": {"finish_reason": {"type": "null"}}},
            }
        ),
    )

    type: Literal["LLMStreamDelta"] = "LLMStreamDelta"
    npc_id: Id
    """The NPC speaking."""
    session_id: Id
    """The session of the conversation."""
    turn_id: Id
    """The turn being answered."""
    seq: Seq
    """Position of this delta in the turn, from 0 without gaps."""
    delta: Text
    """The new text; may be empty on the final delta."""
    final: StrictBool = False
    """True on the last delta of a reply, which also carries `finish_reason`."""
    finish_reason: Literal["stop", "length", "tool_call", "cutoff", "error"] | None = None
    """Why the reply ended: `stop` (done), `length` (token cap), `tool_call` (a `ToolCall`
    follows; after its `Ack` the turn goes on with a reply voicing the result, `seq`
    continuing), `cutoff` (barge-in) or `error` (an `Error` follows)."""

    @model_validator(mode="after")
    def _final_has_reason(self) -> LLMStreamDelta:
        if self.final != (self.finish_reason is not None):
            raise ValueError("finish_reason is set on the final delta, and only there")
        return self


class Viseme(_Part):
    """A mouth shape at a time offset, for lip-sync."""

    t: Seconds
    """Seconds from the start of the chunk."""
    p: Annotated[str, Field(strict=True, pattern=r"^[A-Za-z_]{1,16}$")]
    """The viseme or phoneme label (`AA`)."""


class TTSChunk(_Envelope):
    """Server -> client: 40-80 ms of an NPC's synthesized voice with its visemes, sent a little
    ahead of playback (JSON, or a binary audio frame when the session asked for `binary`)."""

    type: Literal["TTSChunk"] = "TTSChunk"
    npc_id: Id
    """The NPC speaking."""
    session_id: Id
    """The session of the conversation."""
    turn_id: Id
    """The turn being answered."""
    seq: Seq
    """Position of this chunk in the turn, from 0 without gaps."""
    pcm: Pcm
    """16-bit little-endian mono PCM: raw bytes in Python, base64 on the wire."""
    sample_rate: SampleRate
    """Samples per second of `pcm`."""
    visemes: Annotated[tuple[Viseme, ...], Field(max_length=MAX_VISEMES)] = ()
    """Mouth shapes over this chunk."""
    final: StrictBool = False
    """True on the turn's last chunk."""


class ToolCall(_Envelope):
    """Server -> client: the NPC acts in the game; the game answers with an `Ack`.

    A repeated `call_id` is the same call sent again: the game acknowledges it with status
    `duplicate` and does not act twice.
    """

    type: Literal["ToolCall"] = "ToolCall"
    name: ToolName
    """The game tool (`give_item`, `set_waypoint`, `play_emote`, ...)."""
    args: JsonObject
    """The tool's arguments."""
    npc_id: Id
    """The NPC acting."""
    turn_id: Id
    """The turn the call belongs to."""
    call_id: Id
    """Unique per call: the key for idempotency and for the `Ack`."""
    needs_approval: StrictBool = False
    """True: Mythic asks the game to approve a tool it runs itself (an MCP server's write
    tool, `name` is `server.tool`); the game does not act, it answers with an `Ack`: `ok`
    approves the call, `rejected` (or no answer in time) refuses it."""


class IntentUpdate(_Envelope):
    """Server -> client: what an NPC means to do now, for the game's intent cache."""

    type: Literal["IntentUpdate"] = "IntentUpdate"
    npc_id: Id
    """The NPC decided for."""
    intent: Literal["chitchat", "trade", "quest", "hint", "combat", "navigation", "admin"]
    """The kind of thing the NPC is about to do."""
    urgency: Annotated[float, Field(strict=True, ge=0, le=1)] = 0.5
    """How pressing it is, from 0 (whenever) to 1 (now)."""
    target: Id | None = None
    """Who or what the intent is aimed at (an object id from `SceneUpdate`)."""
    bark: Bark | None = None
    """A one-line remark to say right away, at most 8 words."""
    request_id: Id | None = None
    """The `IntentRequest` this answers; absent when the server pushes an update."""


class NPCState(_Envelope):
    """Server -> client: an NPC's dialogue state changed (for animation and UI)."""

    type: Literal["NPCState"] = "NPCState"
    npc_id: Id
    """The NPC."""
    state: Literal["idle", "listening", "thinking", "speaking", "barge_in"]
    """Its dialogue state now."""
    session_id: Id | None = None
    """The session of the conversation, when there is one."""
    turn_id: Id | None = None
    """The turn in progress, when there is one."""


# -- either direction -----------------------------------------------------------------------------


class Cutoff(_Envelope):
    """Either direction: stop an NPC's turn now (barge-in).

    From the server: stop playing the turn's audio. From the client: the player interrupted or
    the game cancels; the server stops generating.
    """

    type: Literal["Cutoff"] = "Cutoff"
    npc_id: Id
    """The NPC to cut off."""
    session_id: Id
    """The session of the conversation."""
    turn_id: Id
    """The turn to stop."""
    reason: Literal["barge_in", "cancelled"] = "barge_in"
    """`barge_in`: the player spoke over the NPC; `cancelled`: the game or server called it off."""


# -- scenes: group conversations ------------------------------------------------------------------


def _unique(ids: tuple[str, ...], what: str) -> tuple[str, ...]:
    seen = [i for n, i in enumerate(ids) if i in ids[:n]]
    if seen:
        raise ValueError(f"{what} names {seen[0]!r} more than once")
    return ids


_UNIQUE_IDS: JsonDict = {"uniqueItems": True}

Members = Annotated[
    tuple[Id, ...],
    Field(min_length=1, max_length=MAX_SCENE_MEMBERS, json_schema_extra=_UNIQUE_IDS),
]


class SceneStart(_Envelope):
    """Client -> server: open a scene, a conversation of several NPCs and the session's player
    in earshot of each other. The server answers with `SceneState`."""

    type: Literal["SceneStart"] = "SceneStart"
    scene_id: Id
    """Chosen by the client, unique while the scene lasts."""
    session_id: Id
    """The session opening it; its player is in the scene."""
    npcs: Members
    """The NPCs in the scene, each once (at most the server's `scenes.max_members`)."""
    max_exchanges: Annotated[int, Field(strict=True, ge=0, le=8)] | None = None
    """After an NPC's reply, how many more times NPCs may answer each other before the scene
    waits for a player (default: the server's `scenes.max_exchanges`)."""

    @model_validator(mode="after")
    def _members_once(self) -> SceneStart:
        _unique(self.npcs, "npcs")
        return self


class SceneJoin(_Envelope):
    """Client -> server: an NPC comes into earshot (`npc_id`), or, without `npc_id`, this
    session's player joins a scene another session opened. The joiner hears only what is
    said from now on."""

    type: Literal["SceneJoin"] = "SceneJoin"
    scene_id: Id
    """The scene joined."""
    session_id: Id
    """The session sending it."""
    npc_id: Id | None = None
    """The NPC joining; leave out for the session's player."""


class SceneLeave(_Envelope):
    """Client -> server: an NPC (`npc_id`), or this session's player, leaves earshot; what is
    said after is not heard by them. An NPC answering when it leaves stops."""

    type: Literal["SceneLeave"] = "SceneLeave"
    scene_id: Id
    """The scene left."""
    session_id: Id
    """The session sending it."""
    npc_id: Id | None = None
    """The NPC leaving; leave out for the session's player."""


class SceneEnd(_Envelope):
    """Either direction: the scene is over (its NPCs stop; what they heard stays theirs)."""

    type: Literal["SceneEnd"] = "SceneEnd"
    scene_id: Id
    """The scene that ends."""
    session_id: Id
    """The session sending it (from the server: the session told)."""
    reason: Note | None = None
    """Why, for logs."""


class SceneLine(_Envelope):
    """Client -> server: the player says something to a scene, as text. The server picks who
    answers (`SceneTurn`): an NPC the line names first, else `to`, else the scene's speaker
    selector; the replies stream as `LLMStreamDelta`s of their NPCs."""

    type: Literal["SceneLine"] = "SceneLine"
    scene_id: Id
    """The scene spoken to."""
    session_id: Id
    """The session the line comes from; its player must be in the scene."""
    turn_id: Id
    """Chosen by the client, unique in the session; the first reply carries it."""
    text: Line
    """What the player says."""
    to: Id | None = None
    """The NPC the player faces or targets, when the game knows (a name in `text` wins)."""
    player_id: Id | None = None
    """Who says it, when several players share a session."""


class SceneAmbient(_Envelope):
    """Client -> server: the scene's NPCs talk among themselves, `lines` lines in all (the game
    decides when; Mythic decides what they say). Each line streams as `LLMStreamDelta`s of its
    NPC, announced by a `SceneTurn` (`chosen_by`: `ambient`); the others of the scene hear it.
    Ambient lines run at `priority` below every player's line: a player's line is never kept
    waiting by them, and a line said to one of their NPCs stops its ambient line. A player's
    `SceneLine` to the scene ends the exchange, as does a new `SceneAmbient`."""

    type: Literal["SceneAmbient"] = "SceneAmbient"
    scene_id: Id
    """The scene whose NPCs talk."""
    session_id: Id
    """The session asking; its player must be in the scene, and the lines stream to it."""
    turn_id: Id
    """Chosen by the client, unique in the session; line k's turn is `turn_id.k` (from 1)."""
    lines: Annotated[int, Field(strict=True, ge=1, le=MAX_AMBIENT_LINES)] = 4
    """How many lines the NPCs say, all together."""
    opener: Id | None = None
    """The NPC who speaks first (default: the scene's first NPC)."""
    topic: Note | None = None
    """What they talk about, when the game has something in mind ("the fog", "the new
    tax"); left out, the NPCs choose."""
    priority: Literal["silver", "bronze"] = "silver"
    """`silver`: chatter in the player's earshot; `bronze`: off-screen, served after every
    other dialogue."""


class SceneState(_Envelope):
    """Server -> client: who is in a scene now (after each `SceneStart`, `SceneJoin` and
    `SceneLeave`, to every session in it)."""

    type: Literal["SceneState"] = "SceneState"
    scene_id: Id
    """The scene."""
    session_id: Id
    """The session told."""
    npcs: Annotated[tuple[Id, ...], Field(max_length=MAX_SCENE_MEMBERS)]
    """Its NPCs, in the order they joined."""
    players: Annotated[tuple[Id, ...], Field(max_length=MAX_SCENE_MEMBERS)] = ()
    """The sessions of its players, in the order they joined."""


class SceneTurn(_Envelope):
    """Server -> client: who answers a line of a scene, in order, before the first of them
    begins. Each reply streams as `LLMStreamDelta`s with the NPC's id and its `turn_ids`
    entry. No speakers: nobody answers; the replies to a line (and an ambient exchange) end
    with one, for the last reply, unless a new line stopped them."""

    type: Literal["SceneTurn"] = "SceneTurn"
    scene_id: Id
    """The scene."""
    session_id: Id
    """The session told."""
    turn_id: Id
    """The line answered: a player's `SceneLine`, or an NPC's reply (NPCs answering each
    other)."""
    speakers: Annotated[tuple[Id, ...], Field(max_length=MAX_SCENE_MEMBERS)]
    """The NPCs who answer, in order."""
    turn_ids: Annotated[tuple[Id, ...], Field(max_length=MAX_SCENE_MEMBERS)]
    """The turn of each speaker's reply, in the same order."""
    chosen_by: Literal["name", "to", "selector", "nobody", "ambient"]
    """`name`: the line names them; `to`: the NPC the player faces; `selector`: the scene's
    speaker selector decided (a gold request); `nobody`: no one answers; `ambient`: a line of
    NPCs talking among themselves (`SceneAmbient`)."""

    @model_validator(mode="after")
    def _a_turn_per_speaker(self) -> SceneTurn:
        if len(self.speakers) != len(self.turn_ids):
            raise ValueError("turn_ids has one turn per speaker")
        return self


MessageType = Literal[
    "ASRFinal",
    "ASRPartial",
    "Ack",
    "AudioChunk",
    "Cutoff",
    "Error",
    "IntentRequest",
    "IntentUpdate",
    "LLMStreamDelta",
    "NPCState",
    "PlayerUtterance",
    "SceneAmbient",
    "SceneEnd",
    "SceneJoin",
    "SceneLeave",
    "SceneLine",
    "SceneStart",
    "SceneState",
    "SceneTurn",
    "SceneUpdate",
    "SessionEnd",
    "SessionStart",
    "TTSChunk",
    "ToolCall",
    "Welcome",
]
"""The name of every v1 message type."""


class Ack(_Envelope):
    """Either direction: a message was handled; for a `ToolCall`, the game's result."""

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra=_with_rules(
            {
                "if": _present("ack_of", {"const": "ToolCall"}),
                "then": _present("call_id", _A_STRING),
            }
        ),
    )

    type: Literal["Ack"] = "Ack"
    ack_of: MessageType
    """The type of the message acknowledged (`ToolCall`)."""
    status: Literal["ok", "error", "rejected", "duplicate"]
    """`ok`: done; `error`: tried and failed; `rejected`: refused (not allowed now, bad
    arguments); `duplicate`: this `call_id` was already handled, nothing was done again."""
    turn_id: Id | None = None
    """The turn of the acknowledged message."""
    call_id: Id | None = None
    """The acknowledged call; required when `ack_of` is `ToolCall`."""
    result: JsonObject | None = None
    """What the tool returned, for the NPC to react to."""
    message: Note | None = None
    """Why it failed or was rejected."""

    @model_validator(mode="after")
    def _tool_ack_has_call_id(self) -> Ack:
        if self.ack_of == "ToolCall" and self.call_id is None:
            raise ValueError("an Ack of a ToolCall carries its call_id")
        return self


class Error(_Envelope):
    """Either direction: something failed. Malformed input gets one of these, never a dropped
    connection.

    Protocol errors use the codes of `ProtocolError`; other subsystems add their own
    (`TOOL_TIMEOUT`).
    """

    type: Literal["Error"] = "Error"
    code: Code
    """Machine-readable and stable: branch on this, not on `message`."""
    message: Note
    """Human-readable, for logs."""
    ref: Ref | None = None
    """What the error is about: a message type, or a dotted path to the offending field
    (`PlayerUtterance.text`, `SceneUpdate.objects.2.dist`)."""
    turn_id: Id | None = None
    """The turn concerned, when known."""
    call_id: Id | None = None
    """The tool call concerned, when known."""
    retryable: StrictBool = False
    """Whether sending the same message again may succeed (a busy server)."""


Message = Annotated[
    SessionStart
    | Welcome
    | SessionEnd
    | AudioChunk
    | ASRPartial
    | ASRFinal
    | PlayerUtterance
    | SceneUpdate
    | SceneStart
    | SceneJoin
    | SceneLeave
    | SceneEnd
    | SceneLine
    | SceneAmbient
    | SceneState
    | SceneTurn
    | IntentRequest
    | LLMStreamDelta
    | TTSChunk
    | ToolCall
    | IntentUpdate
    | NPCState
    | Cutoff
    | Ack
    | Error,
    Field(discriminator="type"),
]
"""Any v1 message, discriminated by its `type` field."""

ClientMessage = Annotated[
    SessionStart
    | SessionEnd
    | AudioChunk
    | PlayerUtterance
    | SceneUpdate
    | SceneStart
    | SceneJoin
    | SceneLeave
    | SceneEnd
    | SceneLine
    | SceneAmbient
    | IntentRequest
    | Cutoff
    | Ack
    | Error,
    Field(discriminator="type"),
]
"""A message a game client sends to the server."""

ServerMessage = Annotated[
    Welcome
    | SessionEnd
    | ASRPartial
    | ASRFinal
    | LLMStreamDelta
    | TTSChunk
    | ToolCall
    | IntentUpdate
    | NPCState
    | SceneState
    | SceneTurn
    | SceneEnd
    | Cutoff
    | Ack
    | Error,
    Field(discriminator="type"),
]
"""A message the server sends to a game client."""


def message_classes(union: object) -> dict[str, type[BaseModel]]:
    """The models of a message union, by their `type` value."""
    members: tuple[type[BaseModel], ...] = get_args(get_args(union)[0])
    return {cls.model_fields["type"].default: cls for cls in members}


MESSAGE_TYPES = message_classes(Message)
"""Every v1 message model, by its `type` value."""
