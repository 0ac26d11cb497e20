"""The v1 wire protocol: every message a game and the server exchange, as pydantic models.

All messages form one union discriminated by `type`, each carrying `schema_version: "v1"`.
`ClientMessage` and `ServerMessage` are what each side sends. Models are frozen and strict:
unknown fields, ids outside `ID_PATTERN`, text over `MAX_TEXT_CHARS`, non-finite numbers and
oversized lists are refused.

    from mythic.contracts import PlayerUtterance, dump_message, parse_client_message

    frame = dump_message(PlayerUtterance(npc_id="marla", session_id="s-1", turn_id="t-1",
                                         text="Is the tavern open?"))
    message = parse_client_message(frame)  # ProtocolError if malformed; never anything else

A frame that does not parse raises `ProtocolError` with a stable `code` and a `ref` to the
offending field; `error_message(exc)` is the `Error` to send back. `mythic schema export`
writes the JSON Schema of every message for clients in other languages.
"""

from mythic.contracts._codec import (
    AUDIO_FRAME_MAGIC,
    ProtocolError,
    ProtocolErrorCode,
    dump_audio_frame,
    dump_message,
    error_message,
    is_audio_frame,
    parse_audio_frame,
    parse_client_message,
    parse_message,
    parse_server_message,
)
from mythic.contracts._messages import (
    MESSAGE_TYPES,
    Ack,
    ASRFinal,
    ASRPartial,
    AudioChunk,
    ClientMessage,
    Cutoff,
    Error,
    IntentRequest,
    IntentUpdate,
    LLMStreamDelta,
    Message,
    MessageType,
    NPCState,
    PlayerUtterance,
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
    ServerMessage,
    SessionEnd,
    SessionStart,
    ToolCall,
    TTSChunk,
    Viseme,
    VoiceFormat,
    Welcome,
)
from mythic.contracts._schema import json_schemas
from mythic.contracts._types import (
    ID_PATTERN,
    MAX_AMBIENT_LINES,
    MAX_BARK_WORDS,
    MAX_FRAME_BYTES,
    MAX_SCENE_MEMBERS,
    MAX_TEXT_CHARS,
    SCHEMA_VERSION,
)

__all__ = [
    "AUDIO_FRAME_MAGIC",
    "ID_PATTERN",
    "MAX_AMBIENT_LINES",
    "MAX_BARK_WORDS",
    "MAX_FRAME_BYTES",
    "MAX_SCENE_MEMBERS",
    "MAX_TEXT_CHARS",
    "MESSAGE_TYPES",
    "SCHEMA_VERSION",
    "ASRFinal",
    "ASRPartial",
    "Ack",
    "AudioChunk",
    "ClientMessage",
    "Cutoff",
    "Error",
    "IntentRequest",
    "IntentUpdate",
    "LLMStreamDelta",
    "Message",
    "MessageType",
    "NPCState",
    "PlayerUtterance",
    "ProtocolError",
    "ProtocolErrorCode",
    "SceneAmbient",
    "SceneEnd",
    "SceneJoin",
    "SceneLeave",
    "SceneLine",
    "SceneObject",
    "SceneStart",
    "SceneState",
    "SceneTurn",
    "SceneUpdate",
    "ServerMessage",
    "SessionEnd",
    "SessionStart",
    "TTSChunk",
    "ToolCall",
    "Viseme",
    "VoiceFormat",
    "Welcome",
    "dump_audio_frame",
    "dump_message",
    "error_message",
    "is_audio_frame",
    "json_schemas",
    "parse_audio_frame",
    "parse_client_message",
    "parse_message",
    "parse_server_message",
]
