// The client: one WebSocket to a Mythic server, a session that survives drops, turns as
// async iterators. Every wait is bounded by `timeoutMs`; nothing the server sends can throw
// into the caller's loop except through the promise or iterator that waits for it.
import {
  ConnectionLostError,
  MythicError,
  ProtocolError,
  ServerError,
  ValidationError,
  WaitTimeoutError,
} from "./errors.js";
import type {
  SceneStart,
  Cutoff,
  Error as ErrorMessage,
  IntentUpdate,
  LLMStreamDelta,
  ToolCall,
  VoiceFormat,
  Welcome,
} from "./generated/messages.js";
import {
  checkOutgoing,
  decodeAudioFrame,
  encodeAudioFrame,
  parseServerFrame,
  type ClientMessage,
  type Outgoing,
  type ServerMessage,
} from "./protocol.js";
import { Inbox } from "./inbox.js";
import { Scene, SceneTalk } from "./scene.js";

/** The part of the WebSocket API this client uses: the browser's, and the `ws` package's. */
export interface SocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  // The events are typed `any`: each implementation has its own event classes (DOM's, ws's),
  // and a handler parameter of a narrower type would refuse one or the other.
  onopen: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  onmessage: ((event: any) => void) | null;
}

/** A WebSocket constructor: `globalThis.WebSocket` in browsers, `WebSocket` from `ws` in Node 20. */
export type SocketFactory = new (url: string) => SocketLike;

/** What a tool handler returns: the Ack's status, and the result for the NPC to react to. */
export interface ToolResult {
  status: "ok" | "error" | "rejected";
  result?: Record<string, unknown>;
  message?: string;
}

/** Runs a game tool the NPC called; its answer goes back as the call's Ack. */
export type ToolHandler = (call: ToolCall) => Promise<ToolResult> | ToolResult;

/** What a turn yields, in the order the server sent it. */
export type TurnEvent = LLMStreamDelta | ToolCall | Cutoff | ErrorMessage;

/** A message of no turn (NPC states, pushed intents, errors), or a frame the client could not read. */
export type ClientEvent = ServerMessage | ProtocolError | ConnectionLostError;

export interface ClientOptions {
  /** The WebSocket constructor; default `globalThis.WebSocket` (browsers, Node 22+). */
  WebSocket?: SocketFactory;
  /** The player the session belongs to. */
  playerId?: string;
  /** Answers every ToolCall with an Ack (once per `call_id`); without it, call `ack`. */
  toolHandler?: ToolHandler;
  /** Reconnect and resume the session when the connection drops (default true). */
  reconnect?: boolean;
  /** First wait before reconnecting, doubled after each failed try up to `maxBackoffMs`. */
  backoffMs?: number;
  maxBackoffMs?: number;
  /** Tries before the client gives up reconnecting (and reports a ConnectionLostError). */
  maxReconnects?: number;
  /** The bound on every wait: connecting, an answer, the next event of a turn (default 30 s). */
  timeoutMs?: number;
  /** The session talks by voice: the format of its audio. */
  voice?: VoiceFormat;
  /** Called with each ClientEvent as it arrives (besides the `nextEvent` queue). */
  onEvent?: (event: ClientEvent) => void;
  /** Events of no turn kept for `nextEvent`; the oldest are dropped beyond it (default 1024). */
  maxEvents?: number;
}

const OPEN = 1;
const CLOSED = 3;
const REMEMBERED_CALLS = 256;

/**
 * One player line and everything the NPC sends back for it. Iterate it for the events
 * (`for await (const event of turn)`), or `textStream()` for the reply's text as it streams;
 * the iteration ends with the reply (a final delta that is not `tool_call`), and throws a
 * ConnectionLostError when the connection drops first, or a WaitTimeoutError when the server
 * sends nothing for the turn within `timeoutMs`.
 */
export class Turn implements AsyncIterable<TurnEvent> {
  readonly deltas: LLMStreamDelta[] = [];
  readonly toolCalls: ToolCall[] = [];
  readonly errors: ErrorMessage[] = [];
  readonly cutoffs: Cutoff[] = [];
  /** Why the reply ended (`stop`, `length`, `cutoff`, `error`); undefined while it goes on. */
  finishReason: string | undefined;
  private done = false;
  /** @internal */ readonly inbox = new Inbox<TurnEvent>();

  constructor(
    private readonly client: MythicClient,
    readonly npcId: string,
    readonly turnId: string,
  ) {}

  /** The reply text so far: the deltas joined, a space after the part before a tool call. */
  get text(): string {
    let text = "";
    let gap = false;
    for (const d of this.deltas) {
      if (gap && text && d.delta && !/\s$/.test(text) && !/^\s/.test(d.delta)) text += " ";
      text += d.delta;
      if (d.delta || d.final) gap = d.final === true && d.finish_reason === "tool_call";
    }
    return text;
  }

  /** Whether the turn is over (its reply ended, or it failed). */
  get over(): boolean {
    return this.done;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<TurnEvent> {
    while (!this.done) {
      let event: TurnEvent;
      try {
        event = await this.inbox.take(this.client.timeoutMs, `message for turn ${this.turnId}`);
      } catch (error) {
        this.finish();
        throw error;
      }
      switch (event.type) {
        case "LLMStreamDelta":
          this.deltas.push(event);
          if (event.final && event.finish_reason !== "tool_call") {
            this.finishReason = event.finish_reason ?? undefined;
            this.finish();
          }
          break;
        case "ToolCall":
          this.toolCalls.push(event);
          break;
        case "Cutoff":
          this.cutoffs.push(event);
          break;
        case "Error":
          this.errors.push(event);
          break;
      }
      yield event;
    }
  }

  /** The reply's text, piece by piece as it streams. */
  async *textStream(): AsyncGenerator<string> {
    for await (const event of this) {
      if (event.type === "LLMStreamDelta" && event.delta) yield event.delta;
    }
  }

  /** Waits for the end of the turn; the whole reply text. */
  async reply(): Promise<string> {
    for await (const _ of this);
    return this.text;
  }

  /** Stops the NPC (the player interrupted); the turn ends with finish reason `cutoff`. */
  async cutoff(reason: "barge_in" | "cancelled" = "barge_in"): Promise<void> {
    await this.client.send({
      type: "Cutoff",
      npc_id: this.npcId,
      session_id: this.client.sessionId,
      turn_id: this.turnId,
      reason,
    });
  }

  private finish(): void {
    this.done = true;
    this.client.forget(this.turnId);
  }
}

/**
 * A game's connection to a Mythic server.
 *
 * ```ts
 * const client = new MythicClient("ws://127.0.0.1:8765/v1/ws", { toolHandler });
 * await client.connect();
 * const turn = await client.say("marla", "Is the tavern open?");
 * for await (const piece of turn.textStream()) process.stdout.write(piece);
 * await client.close();
 * ```
 *
 * The client reconnects by itself with bounded backoff and resumes its session (the NPCs keep
 * their history); turns in flight when the connection drops end with ConnectionLostError.
 * Messages of no turn, and frames it could not read, go to `nextEvent` and `onEvent`.
 */
export class MythicClient {
  readonly url: string;
  readonly timeoutMs: number;
  /** The session's id, once connected. */
  sessionId = "";
  /** How many times the session was resumed (after a drop, or `disconnect` then `connect`). */
  resumes = 0;
  private resumeToken: string | undefined;
  private ws: SocketLike | null = null;
  private readonly options: ClientOptions;
  private readonly factory: SocketFactory;
  private readonly turns = new Map<string, Turn>();
  private readonly intents = new Map<string, (update: IntentUpdate | MythicError) => void>();
  private readonly calls = new Map<string, Promise<ToolResult>>();
  private readonly events: Inbox<ClientEvent>;
  /** @internal The scenes this client is in, by id. */
  readonly scenes = new Map<string, Scene>();
  /** @internal The open scene talk of each line and reply turn id. */
  readonly sceneTalks = new Map<string, SceneTalk>();
  private readonly sceneCalls: {
    kind: string;
    scene: Scene;
    settle: (error?: MythicError) => void;
  }[] = [];
  private connected: Promise<void> | null = null;
  private markConnected: (() => void) | null = null;
  private stopped = true;
  private turnCount = 0;

  constructor(url: string, options: ClientOptions = {}) {
    const factory = options.WebSocket ?? (globalThis as { WebSocket?: SocketFactory }).WebSocket;
    if (factory === undefined) {
      throw new MythicError(
        "no WebSocket here: pass one (Node 20: `import { WebSocket } from \"ws\"`; " +
          "new MythicClient(url, { WebSocket }))",
      );
    }
    this.url = url;
    this.factory = factory;
    this.options = options;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.events = new Inbox<ClientEvent>(options.maxEvents ?? 1024);
  }

  /** The socket of the current connection (for diagnostics); null while disconnected. */
  get socket(): SocketLike | null {
    return this.ws;
  }

  // -- lifecycle ------------------------------------------------------------------------------

  /**
   * Connects and opens the session, or resumes it after `disconnect`.
   *
   * @throws ServerError the server refused the session.
   * @throws ValidationError the options break the schema (a voice format's `input_rate`).
   * @throws WaitTimeoutError no Welcome within `timeoutMs`.
   */
  async connect(): Promise<Welcome> {
    this.stopped = false;
    this.connected ??= new Promise((resolve) => (this.markConnected = resolve));
    return this.open();
  }

  /** Closes the connection without ending the session: `connect` resumes it. */
  async disconnect(): Promise<void> {
    this.stopped = true;
    await this.closeSocket();
  }

  /** Ends the session (SessionEnd) and closes the connection. */
  async close(): Promise<void> {
    if (this.ws?.readyState === OPEN && this.sessionId) {
      this.ws.send(JSON.stringify({ schema_version: "v1", type: "SessionEnd", session_id: this.sessionId }));
    }
    this.stopped = true;
    await this.closeSocket();
  }

  private async closeSocket(): Promise<void> {
    const ws = this.ws;
    if (ws === null || ws.readyState === CLOSED) return; // closed already: no close event comes
    const closed = new Promise<void>((resolve) => {
      const previous = ws.onclose;
      ws.onclose = (event: unknown) => {
        previous?.(event);
        resolve();
      };
    });
    ws.close(1000);
    await bounded(closed, this.timeoutMs, "close of the connection");
  }

  private open(): Promise<Welcome> {
    // Checked before the socket opens: options the schema refuses (a voice format's
    // input_rate) fail here, as a ValidationError, not in the socket's open handler.
    const start = checkOutgoing({
      type: "SessionStart",
      ...(this.options.playerId !== undefined && { player_id: this.options.playerId }),
      ...(this.resumeToken !== undefined && {
        session_id: this.sessionId,
        resume_token: this.resumeToken,
      }),
      ...(this.options.voice !== undefined && { voice: this.options.voice }),
    });
    return bounded(
      new Promise<Welcome>((resolve, reject) => {
        const ws = new this.factory(this.url);
        ws.binaryType = "arraybuffer";
        let welcomed = false;
        ws.onopen = () => ws.send(JSON.stringify(start));
        ws.onmessage = (event: { data: unknown }) => {
          const message = this.read(event.data);
          if (message === null) return;
          if (!welcomed && message.type === "Welcome") {
            welcomed = true;
            this.ws = ws;
            this.sessionId = message.session_id;
            this.resumeToken = message.resume_token;
            if (message.resumed) this.resumes += 1;
            this.markConnected?.();
            resolve(message);
          } else if (!welcomed && message.type === "Error") {
            ws.close(1000);
            reject(new ServerError(message));
          } else {
            this.route(message);
          }
        };
        ws.onerror = () => {
          if (!welcomed) reject(new ConnectionLostError(`cannot connect to ${this.url}`));
        };
        ws.onclose = () => {
          if (!welcomed) {
            reject(new ConnectionLostError(`the connection to ${this.url} closed before Welcome`));
            return;
          }
          if (this.ws === ws) this.lost();
        };
      }),
      this.timeoutMs,
      `Welcome from ${this.url}`,
    );
  }

  /** The connection is gone: fail the turns in flight, then resume unless stopped. */
  private lost(): void {
    this.ws = null;
    this.connected = new Promise((resolve) => (this.markConnected = resolve));
    for (const turn of this.turns.values()) {
      turn.inbox.fail(new ConnectionLostError(`connection lost during turn ${turn.turnId}`));
    }
    this.turns.clear();
    for (const answer of this.intents.values()) answer(new ConnectionLostError("connection lost"));
    this.intents.clear();
    for (const talk of new Set(this.sceneTalks.values())) {
      talk.finish(new ConnectionLostError(`connection lost during scene line ${talk.turnId}`));
    }
    this.sceneTalks.clear();
    for (const call of [...this.sceneCalls]) call.settle(new ConnectionLostError("connection lost"));
    if (!this.stopped && (this.options.reconnect ?? true)) void this.resume();
  }

  private async resume(): Promise<void> {
    let backoff = this.options.backoffMs ?? 100;
    const tries = this.options.maxReconnects ?? 10;
    for (let attempt = 0; attempt < tries && !this.stopped; attempt++) {
      await sleep(backoff);
      try {
        await this.open();
        return;
      } catch (error) {
        if (error instanceof ServerError && error.code === "unknown_session") {
          this.resumeToken = undefined; // the session expired: open a fresh one
        } else {
          backoff = Math.min(this.options.maxBackoffMs ?? 5_000, backoff * 2);
        }
      }
    }
    if (!this.stopped) {
      this.stopped = true;
      this.report(new ConnectionLostError(`gave up reconnecting to ${this.url} after ${tries} tries`));
    }
  }

  // -- sending --------------------------------------------------------------------------------

  /**
   * Sends a message after checking it against the v1 schema, waiting (bounded) while the
   * client reconnects.
   *
   * @throws ValidationError the message breaks the schema; nothing was sent.
   * @throws WaitTimeoutError not connected within `timeoutMs`.
   */
  async send(message: Outgoing): Promise<void> {
    const checked = checkOutgoing(message);
    await this.sendFrame(JSON.stringify(checked));
  }

  /**
   * Sends a frame as it is, past the schema check: for conformance tests and debugging a
   * server, never for game messages.
   */
  async sendRaw(frame: string | Uint8Array): Promise<void> {
    await this.sendFrame(frame);
  }

  private async sendFrame(frame: string | Uint8Array): Promise<void> {
    if (this.connected === null) throw new MythicError("connect() first");
    await bounded(this.connected, this.timeoutMs, "connection to send on");
    this.ws!.send(frame);
  }

  /** Says `text` to an NPC; iterate the returned turn for the reply. */
  async say(npcId: string, text: string, options: { turnId?: string } = {}): Promise<Turn> {
    const turnId = options.turnId ?? `t-${Date.now().toString(36)}-${(this.turnCount++).toString(36)}`;
    const turn = new Turn(this, npcId, turnId);
    this.turns.set(turnId, turn);
    try {
      await this.send({
        type: "PlayerUtterance",
        npc_id: npcId,
        session_id: this.sessionId,
        turn_id: turnId,
        text,
        ...(this.options.playerId !== undefined && { player_id: this.options.playerId }),
      });
    } catch (error) {
      this.turns.delete(turnId);
      throw error;
    }
    return turn;
  }

  /**
   * Tells an NPC what it perceives now (`objects`: id -> distance) and the game's `date`
   * (`year-month-day` in the world's calendar) and `time` (`HH:MM`); fields left out stay.
   */
  async scene(
    npcId: string,
    update: { zone?: string; time?: string; date?: string; objects?: Record<string, number> } = {},
  ): Promise<void> {
    await this.send({
      type: "SceneUpdate",
      npc_id: npcId,
      ...(update.zone !== undefined && { zone: update.zone }),
      ...(update.time !== undefined && { time: update.time }),
      ...(update.date !== undefined && { date: update.date }),
      ...(update.objects !== undefined && {
        objects: Object.entries(update.objects).map(([id, dist]) => ({ id, dist })),
      }),
    });
  }

  /**
   * Asks for an NPC's intent (the game's intent cache) and waits for it.
   *
   * @throws WaitTimeoutError no answer within `timeoutMs`.
   * @throws ConnectionLostError the connection dropped first.
   */
  async intent(
    npcId: string,
    options: { context?: string; withBark?: boolean; requestId?: string } = {},
  ): Promise<IntentUpdate> {
    const requestId = options.requestId ?? `i-${Date.now().toString(36)}-${(this.turnCount++).toString(36)}`;
    if (this.intents.has(requestId)) throw new MythicError(`intent request ${requestId} is already waiting`);
    const answer = new Promise<IntentUpdate>((resolve, reject) =>
      this.intents.set(requestId, (update) => (update instanceof MythicError ? reject(update) : resolve(update))),
    );
    try {
      await this.send({
        type: "IntentRequest",
        npc_id: npcId,
        request_id: requestId,
        ...(options.context !== undefined && { context: options.context }),
        with_bark: options.withBark ?? false,
      });
      return await bounded(answer, this.timeoutMs, `IntentUpdate for ${requestId}`);
    } finally {
      this.intents.delete(requestId);
    }
  }

  /** Answers a tool call (what the tool handler does for you). */
  async ack(
    call: Pick<ToolCall, "turn_id" | "call_id">,
    status: "ok" | "error" | "rejected" | "duplicate",
    answer: { result?: Record<string, unknown>; message?: string } = {},
  ): Promise<void> {
    await this.send({
      type: "Ack",
      ack_of: "ToolCall",
      status,
      turn_id: call.turn_id,
      call_id: call.call_id,
      ...(answer.result !== undefined && { result: answer.result }),
      ...(answer.message !== undefined && { message: answer.message.slice(0, 1000) }),
    });
  }

  /** Sends a chunk of the player's microphone audio (16-bit mono PCM) as a binary frame. */
  async sendAudio(
    npcId: string,
    pcm: Uint8Array,
    options: { sampleRate?: number; turnId?: string; end?: boolean } = {},
  ): Promise<void> {
    const voice = this.options.voice;
    if (voice === undefined) throw new MythicError("this client's session has no voice: pass the voice option");
    const header = {
      type: "AudioChunk" as const,
      npc_id: npcId,
      session_id: this.sessionId,
      sample_rate: options.sampleRate ?? voice.input_rate ?? 16000,
      ts_client: Date.now() / 1000,
      ...(options.turnId !== undefined && { turn_id: options.turnId }),
      end: options.end ?? false,
    };
    if (pcm.length < 2 || pcm.length % 2) throw new ValidationError("pcm is 16-bit samples: an even number of bytes, at least 2", "AudioChunk.pcm");
    const { pcm: _, ...checked } = checkOutgoing({ ...header, pcm: "AAAA" }) as unknown as Record<string, unknown>;
    await this.sendFrame(encodeAudioFrame(checked, pcm));
  }

  // -- scenes ---------------------------------------------------------------------------------

  /**
   * Opens a scene of `npcs` with this client's player in it; the player's lines to it
   * (`scene.say`) are answered by the NPC they name, else the one the player faces, else
   * the scene's choice.
   *
   * @throws ServerError the server refused it (an unknown NPC, a duplicate, too many).
   * @throws WaitTimeoutError no answer within `timeoutMs`.
   */
  async startScene(sceneId: string, npcs: string[], options: { maxExchanges?: number } = {}): Promise<Scene> {
    const scene = new Scene(this, sceneId);
    await this.sceneCall(scene, "SceneStart", {
      type: "SceneStart",
      scene_id: sceneId,
      session_id: this.sessionId,
      npcs: npcs as SceneStart["npcs"], // its length is checked with the rest of the message
      ...(options.maxExchanges !== undefined && { max_exchanges: options.maxExchanges }),
    });
    return scene;
  }

  /**
   * This client's player joins a scene another player opened (it hears what follows).
   *
   * @throws ServerError no such scene, or it has ended.
   */
  async joinScene(sceneId: string): Promise<Scene> {
    const scene = new Scene(this, sceneId);
    await this.sceneCall(scene, "SceneJoin", { type: "SceneJoin", scene_id: sceneId, session_id: this.sessionId });
    return scene;
  }

  /** @internal Sends a scene message; resolves when the scene's state (or end) answers it. */
  async sceneCall(scene: Scene, kind: string, message: Outgoing): Promise<void> {
    const opening = !this.scenes.has(scene.sceneId);
    if (opening) this.scenes.set(scene.sceneId, scene);
    let call: (typeof this.sceneCalls)[number] | undefined;
    const answered = new Promise<void>((resolve, reject) => {
      call = {
        kind,
        scene,
        settle: (error) => {
          this.sceneCalls.splice(this.sceneCalls.indexOf(call!), 1);
          if (error === undefined) resolve();
          else reject(error);
        },
      };
      this.sceneCalls.push(call);
    });
    try {
      await this.send(message);
      await bounded(answered, this.timeoutMs, `answer to ${kind}`);
    } catch (error) {
      if (this.sceneCalls.includes(call!)) this.sceneCalls.splice(this.sceneCalls.indexOf(call!), 1);
      if (opening && scene.npcs.length === 0 && this.scenes.get(scene.sceneId) === scene) {
        this.scenes.delete(scene.sceneId);
      }
      throw error;
    }
  }

  /** Hands a scene or a scene talk its messages; true when one took it. */
  private routeScene(message: ServerMessage): boolean {
    switch (message.type) {
      case "SceneState":
      case "SceneEnd": {
        const scene = this.scenes.get(message.scene_id);
        if (scene === undefined) return false;
        if (message.type === "SceneState") scene.onState(message);
        else {
          this.scenes.delete(message.scene_id);
          scene.onEnd(message.reason ?? "ended");
        }
        for (const call of this.sceneCalls.filter((c) => c.scene === scene)) call.settle();
        return true;
      }
      case "SceneTurn": {
        const talk = this.sceneTalks.get(message.turn_id);
        talk?.onTurn(message);
        return talk !== undefined;
      }
      case "LLMStreamDelta":
      case "ToolCall":
      case "Error": {
        const talk = message.turn_id ? this.sceneTalks.get(message.turn_id) : undefined;
        if (talk !== undefined) {
          if (message.type === "LLMStreamDelta") talk.onDelta(message);
          else talk.onEvent(message);
          return true;
        }
        if (message.type === "Error" && message.ref) {
          const call = this.sceneCalls.find((c) => c.kind === message.ref!.split(".")[0]);
          if (call !== undefined) {
            call.settle(new ServerError(message));
            return true;
          }
        }
        return false;
      }
      default:
        return false;
    }
  }

  // -- receiving ------------------------------------------------------------------------------

  /**
   * The next message of no turn (NPC states, pushed intents, errors), or a frame the client
   * could not read.
   *
   * @throws WaitTimeoutError nothing within `timeoutMs` (or the given bound).
   */
  nextEvent(timeoutMs = this.timeoutMs): Promise<ClientEvent> {
    return this.events.take(timeoutMs, "event");
  }

  /** @internal A turn that ended stops receiving. */
  forget(turnId: string): void {
    this.turns.delete(turnId);
  }

  private read(data: unknown): ServerMessage | null {
    try {
      if (typeof data === "string") return parseServerFrame(data);
      if (data instanceof ArrayBuffer) return decodeAudioFrame(new Uint8Array(data));
      if (ArrayBuffer.isView(data)) return decodeAudioFrame(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      throw new ProtocolError("bad_json", "the server sent a frame of an unknown kind");
    } catch (error) {
      if (!(error instanceof ProtocolError)) throw error;
      this.report(error);
      return null;
    }
  }

  private report(event: ClientEvent): void {
    this.events.put(event);
    this.options.onEvent?.(event);
  }

  private route(message: ServerMessage): void {
    if (message.type === "ToolCall" && this.options.toolHandler !== undefined) {
      void this.answer(message, this.options.toolHandler);
    }
    if (this.routeScene(message)) return;
    const turnId = "turn_id" in message ? message.turn_id : undefined;
    const turn = turnId ? this.turns.get(turnId) : undefined;
    switch (message.type) {
      case "LLMStreamDelta":
      case "ToolCall":
      case "Cutoff":
      case "Error":
        if (turn !== undefined) {
          turn.inbox.put(message);
          return;
        }
        break;
      case "IntentUpdate": {
        const answer = message.request_id ? this.intents.get(message.request_id) : undefined;
        if (answer !== undefined) {
          answer(message);
          return;
        }
        break;
      }
    }
    this.report(message);
  }

  /**
   * Runs the tool handler once per `call_id`: a call the server sends again (its Ack was
   * late or lost) is acknowledged `duplicate` with the first answer, and not run again.
   */
  private async answer(call: ToolCall, handler: ToolHandler): Promise<void> {
    const first = this.calls.get(call.call_id);
    const running =
      first ??
      bounded(Promise.resolve().then(() => handler(call)), this.timeoutMs, `tool handler of ${call.name}`).catch(
        (error: unknown): ToolResult => ({ status: "error", message: String(error) }),
      );
    if (first === undefined) {
      this.calls.set(call.call_id, running);
      if (this.calls.size > REMEMBERED_CALLS) this.calls.delete(this.calls.keys().next().value!);
    }
    const result = await running;
    try {
      await this.ack(call, first === undefined ? result.status : "duplicate", result);
    } catch (error) {
      if (!(error instanceof MythicError)) throw error;
      this.report(new ConnectionLostError(`the Ack of ${call.call_id} was not sent: ${error.message}`));
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** `promise`, or a WaitTimeoutError after `ms`. */
export async function bounded<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new WaitTimeoutError(`no ${what} within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
