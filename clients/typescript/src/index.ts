// @mythic-npc/client: the TypeScript client of a Mythic server (v1 protocol), for browsers and Node.
export {
  MythicClient,
  Turn,
  bounded,
  type ClientEvent,
  type ClientOptions,
  type SocketFactory,
  type SocketLike,
  type ToolHandler,
  type ToolResult,
  type TurnEvent,
} from "./client.js";
export {
  ConnectionLostError,
  MythicError,
  ProtocolError,
  ServerError,
  ValidationError,
  WaitTimeoutError,
  type ProtocolErrorCode,
} from "./errors.js";
export {
  AUDIO_FRAME_MAGIC,
  SCHEMA_VERSION,
  checkOutgoing,
  decodeAudioFrame,
  encodeAudioFrame,
  fromBase64,
  parseServerFrame,
  toBase64,
  type ClientMessage,
  type Outgoing,
  type ServerMessage,
} from "./protocol.js";
export type * from "./generated/messages.js";
