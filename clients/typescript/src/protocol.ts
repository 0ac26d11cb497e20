// Messages to frames and back: validation against the generated schema, JSON frames and
// binary audio frames. Nothing here throws anything but this package's typed errors.
import { Ajv2020 } from "ajv/dist/2020.js";
import type { ErrorObject, ValidateFunction } from "ajv/dist/2020.js";

import { ProtocolError, ValidationError } from "./errors.js";
import type { MythicMessage, TTSChunk } from "./generated/messages.js";
import { clientSchema, serverSchema } from "./generated/schemas.js";

/** The protocol version this client speaks. */
export const SCHEMA_VERSION = "v1";

/** The messages of the generated types that `schema`'s discriminator names: what one side sends. */
type SentBy<Schema extends { discriminator: { mapping: object } }> = Extract<
  MythicMessage,
  { type: keyof Schema["discriminator"]["mapping"] }
>;

/** A message a game client sends. */
export type ClientMessage = SentBy<typeof clientSchema>;

/** A message the server sends. */
export type ServerMessage = SentBy<typeof serverSchema>;

/** A client message as a game writes it: `schema_version` may be left out. */
export type Outgoing<M extends ClientMessage = ClientMessage> = M extends ClientMessage
  ? Omit<M, "schema_version"> & { schema_version?: "v1" }
  : never;

type Side = "client" | "server";

// Each message is checked against its own definition (its type is known before), so only the
// schemas' `$defs` are compiled: the errors name that message's fields. ajv's strict mode
// stays as it is: the cross-field rules' `if`/`then`/`else` check the message object itself,
// so strictTypes knows their `properties` and `required` apply to an object.
const ajv = new Ajv2020({ allErrors: false });
const SCHEMAS = { client: clientSchema, server: serverSchema } as const;
for (const side of ["client", "server"] as const) {
  ajv.addSchema({ $id: `mythic-v1-${side}`, $defs: structuredClone(SCHEMAS[side].$defs) });
}
const validators = new Map<string, ValidateFunction>();

function typesOf(side: Side): ReadonlySet<string> {
  return new Set(Object.keys(SCHEMAS[side].discriminator.mapping));
}
const TYPES = { client: typesOf("client"), server: typesOf("server") };
const ALL_TYPES = new Set([...TYPES.client, ...TYPES.server]);

/** The validator of one message type sent by `side` (compiled once, on first use). */
function validatorOf(side: Side, type: string): ValidateFunction {
  const key = `${side}:${type}`;
  let validate = validators.get(key);
  if (validate === undefined) {
    validate = ajv.getSchema(`mythic-v1-${side}#/$defs/${type}`);
    if (validate === undefined) throw new Error(`no schema for ${type}`);
    validators.set(key, validate);
  }
  return validate;
}

/** The ajv errors that point at the object, and the param of each that names the field. */
const FIELD_PARAMS: Readonly<Record<string, string>> = {
  required: "missingProperty",
  additionalProperties: "additionalProperty",
};

/**
 * The first schema violation of `obj`, as a dotted ref and a message; null when valid. The
 * ref names the field even where ajv points at the object (a field left out or not in the
 * schema).
 */
function violation(side: Side, obj: Record<string, unknown>): [string, string] | null {
  const type = String(obj.type);
  const validate = validatorOf(side, type);
  if (validate(obj)) return null;
  const first = validate.errors?.[0];
  if (first === undefined) return [type, `${type}: invalid`];
  const path = first.instancePath.split("/").filter(Boolean);
  const param = FIELD_PARAMS[first.keyword];
  const field: unknown = param === undefined ? undefined : first.params[param];
  const ref = [type, ...path, ...(typeof field === "string" ? [field] : [])].join(".");
  return [ref, `${ref}: ${first.message ?? "invalid"}${allowed(first)}${condition(side, type, first)}`];
}

/** The values an `enum` allows, which ajv's message leaves out. */
function allowed(error: ErrorObject): string {
  return error.keyword === "enum" ? ` (${(error.params.allowedValues as unknown[]).join(", ")})` : "";
}

/**
 * When `error` breaks one of the message's cross-field rules (`allOf` of `if`/`then`/`else`):
 * the rule's condition (` when ack_of is "ToolCall"`), without which the message reads as if
 * the field were always required.
 */
function condition(side: Side, type: string, error: ErrorObject): string {
  const branch = /^#\/allOf\/(\d+)\/(then|else)\//.exec(error.schemaPath);
  if (branch === null) return "";
  const definitions = SCHEMAS[side].$defs as Readonly<Record<string, { allOf?: readonly Rule[] }>>;
  const rule = definitions[type]?.allOf?.[Number(branch[1])];
  if (rule === undefined) return "";
  const fields = Object.entries(rule.if.properties ?? {}).map(([name, spec]) =>
    "const" in spec ? `${name} is ${JSON.stringify(spec.const)}` : `${name} is given`,
  );
  return ` ${branch[2] === "then" ? "when" : "unless"} ${fields.join(" and ")}`;
}

/** A cross-field rule of the schema, as far as `condition` reads it. */
interface Rule {
  readonly if: { readonly properties?: Readonly<Record<string, { readonly const?: unknown }>> };
}

/**
 * The message ready to send: `schema_version` filled in and the whole checked against the
 * client schema.
 *
 * @throws ValidationError the message breaks the schema (it is not sent).
 */
export function checkOutgoing(message: Outgoing): ClientMessage {
  const obj = { schema_version: SCHEMA_VERSION, ...message } as Record<string, unknown>;
  const type = obj.type;
  if (typeof type !== "string" || !TYPES.client.has(type)) {
    const why = ALL_TYPES.has(String(type)) ? "is not sent by a client" : "is not a v1 message type";
    throw new ValidationError(`${String(type)} ${why}`, "type");
  }
  const wrong = violation("client", obj);
  if (wrong !== null) throw new ValidationError(wrong[1], wrong[0]);
  return obj as unknown as ClientMessage;
}

/**
 * Reads one JSON frame from the server.
 *
 * @throws ProtocolError not JSON, not an object, another `schema_version`, an unknown or
 *   client-only type, or fields outside the schema.
 */
export function parseServerFrame(text: string): ServerMessage {
  return parseServerObject(jsonObject(text, "a frame"));
}

function jsonObject(text: string, what: string): Record<string, unknown> {
  let obj: unknown;
  try {
    obj = JSON.parse(text);
  } catch (cause) {
    throw new ProtocolError("bad_json", `the server sent ${what} that is not JSON: ${String(cause)}`);
  }
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) {
    throw new ProtocolError("not_an_object", `the server sent ${what} that is not a JSON object`);
  }
  return obj as Record<string, unknown>;
}

function parseServerObject(obj: Record<string, unknown>): ServerMessage {
  const version = obj.schema_version;
  if (version !== SCHEMA_VERSION) {
    throw new ProtocolError(
      "bad_schema_version",
      `the server speaks schema_version ${JSON.stringify(version)}, this client ${SCHEMA_VERSION}: ` +
        "use a client release of the server's protocol version",
      "schema_version",
    );
  }
  const type = obj.type;
  if (typeof type !== "string" || !TYPES.server.has(type)) {
    throw new ProtocolError(
      "unknown_type",
      `the server sent a message of type ${JSON.stringify(type)}, which a v1 server never sends`,
      "type",
    );
  }
  const wrong = violation("server", obj);
  if (wrong !== null) throw new ProtocolError("invalid_message", `the server sent ${wrong[1]}`, wrong[0]);
  return obj as unknown as ServerMessage;
}

/** The first four bytes of a binary audio frame. */
export const AUDIO_FRAME_MAGIC = new Uint8Array([0x4d, 0x59, 0x41, 0x31]); // "MYA1"

/**
 * A binary audio frame: `MYA1`, the header's length (4 bytes, little-endian), the message as
 * JSON without `pcm` (the header), then the raw 16-bit little-endian PCM. Audio travels
 * without base64's third more bytes.
 */
export function encodeAudioFrame(header: Record<string, unknown>, pcm: Uint8Array): Uint8Array {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const frame = new Uint8Array(8 + json.length + pcm.length);
  frame.set(AUDIO_FRAME_MAGIC, 0);
  new DataView(frame.buffer).setUint32(4, json.length, true);
  frame.set(json, 8);
  frame.set(pcm, 8 + json.length);
  return frame;
}

/** A `TTSChunk` from a binary frame: the message with `pcm` in base64, as in JSON frames. */
export function decodeAudioFrame(frame: Uint8Array): TTSChunk {
  const magic = AUDIO_FRAME_MAGIC.every((byte, i) => frame[i] === byte);
  if (frame.length < 8 || !magic) {
    throw new ProtocolError("bad_audio_frame", "a binary frame from the server must start with MYA1");
  }
  const size = new DataView(frame.buffer, frame.byteOffset, frame.byteLength).getUint32(4, true);
  if (size > frame.length - 8) {
    throw new ProtocolError("bad_audio_frame", `the audio header claims ${size} bytes; the frame has ${frame.length - 8}`);
  }
  const header = jsonObject(new TextDecoder().decode(frame.subarray(8, 8 + size)), "an audio header");
  if (header.type !== "TTSChunk" || "pcm" in header) {
    throw new ProtocolError("bad_audio_frame", "a binary frame from the server is a TTSChunk header without pcm");
  }
  return parseServerObject({ ...header, pcm: toBase64(frame.subarray(8 + size)) }) as TTSChunk;
}

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/** Base64 of bytes, in browsers and Node alike (no `Buffer`, no `btoa` string juggling). */
export function toBase64(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const [a, b, c] = [bytes[i]!, bytes[i + 1], bytes[i + 2]];
    const n = (a << 16) | ((b ?? 0) << 8) | (c ?? 0);
    out += B64[(n >> 18) & 63]! + B64[(n >> 12) & 63]!;
    out += b === undefined ? "=" : B64[(n >> 6) & 63]!;
    out += c === undefined ? "=" : B64[n & 63]!;
  }
  return out;
}

/** The bytes of base64 text (`TTSChunk.pcm`). */
export function fromBase64(text: string): Uint8Array {
  const clean = text.replace(/=+$/, "");
  const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
  let bits = 0;
  let value = 0;
  let at = 0;
  for (const char of clean) {
    const digit = B64.indexOf(char);
    if (digit < 0) throw new ProtocolError("invalid_message", "pcm is not base64");
    value = (value << 6) | digit;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[at++] = (value >> bits) & 0xff;
    }
  }
  return out;
}
