import type { Error as ErrorMessage } from "./generated/messages.js";

/** Every error this client raises or reports; `retryable` says whether trying again may help. */
export class MythicError extends Error {
  readonly retryable: boolean;

  constructor(message: string, options: { retryable?: boolean; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.name = new.target.name;
    this.retryable = options.retryable ?? false;
  }
}

/**
 * The server refused something: an `Error` message it sent, as an exception. Branch on
 * `code` (stable), not on `message`.
 */
export class ServerError extends MythicError {
  readonly code: string;
  readonly ref: string | undefined;
  readonly turnId: string | undefined;
  readonly callId: string | undefined;
  readonly error: ErrorMessage;

  constructor(error: ErrorMessage) {
    super(`${error.code}: ${error.message}`, { retryable: error.retryable ?? false });
    this.error = error;
    this.code = error.code;
    this.ref = error.ref ?? undefined;
    this.turnId = error.turn_id ?? undefined;
    this.callId = error.call_id ?? undefined;
  }
}

/** Why a frame from the server could not be read. */
export type ProtocolErrorCode =
  | "bad_json"
  | "not_an_object"
  | "bad_schema_version"
  | "unknown_type"
  | "invalid_message"
  | "bad_audio_frame";

/**
 * The server sent a frame this client cannot read: not JSON, a message type it does not
 * know, a newer `schema_version` (upgrade the client), or fields outside the schema. The
 * frame is skipped and reported (the client's `onError` and event queue); nothing throws
 * into the game loop.
 */
export class ProtocolError extends MythicError {
  readonly code: ProtocolErrorCode;
  readonly ref: string | undefined;

  constructor(code: ProtocolErrorCode, message: string, ref?: string) {
    super(message);
    this.code = code;
    this.ref = ref;
  }
}

/**
 * A message this client was asked to send breaks the v1 schema; it was not sent.
 * `ref` is the offending field as a dotted path (`PlayerUtterance.text`).
 */
export class ValidationError extends MythicError {
  readonly ref: string;

  constructor(message: string, ref: string) {
    super(message);
    this.ref = ref;
  }
}

/** The connection dropped while a turn was in flight; the session is being resumed. */
export class ConnectionLostError extends MythicError {
  constructor(message: string) {
    super(message, { retryable: true });
  }
}

/** A bounded wait ran out: no answer, no next event, no connection within the timeout. */
export class WaitTimeoutError extends MythicError {
  constructor(message: string) {
    super(message, { retryable: true });
  }
}
