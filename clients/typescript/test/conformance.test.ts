// The conformance suite (clients/conformance/scenarios) played through this SDK against a
// real `mythic serve`: MYTHIC_URL is its WebSocket URL, MYTHIC_CONFORMANCE_AUDIO the folder of
// the clips `talk` speaks (tests/integration/test_sdk_typescript.py starts the server, makes
// the clips and sets both).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { WebSocket } from "ws";

import {
  ConnectionLostError,
  MythicClient,
  ServerError,
  ValidationError,
  encodeAudioFrame,
  fromBase64,
  parseServerFrame,
  type ClientEvent,
  type LLMStreamDelta,
  type Outgoing,
  type Scene,
  type SceneTalk,
  type ServerMessage,
  type ToolResult,
  type Turn,
  type TurnEvent,
} from "../src/index.js";
import type { Error as ErrorMessage } from "../src/generated/messages.js";

type Step = Record<string, any> & { do: string; client?: string };
interface Scenario {
  name: string;
  about: string;
  steps: Step[];
}

const URL = process.env.MYTHIC_URL;
const DIR = resolve(process.env.MYTHIC_CONFORMANCE_DIR ?? "../conformance/scenarios");
const AUDIO = process.env.MYTHIC_CONFORMANCE_AUDIO;
const WAIT_MS = 120_000;
/** The clips' format: 16-bit little-endian mono PCM at this rate. */
const CLIP_RATE = 16_000;

class TurnLog {
  readonly events: TurnEvent[] = [];
  lost = false;
  over = false;
  private readonly iterator: AsyncIterator<TurnEvent>;

  constructor(readonly turn: Turn) {
    this.iterator = turn[Symbol.asyncIterator]();
  }

  async read(until: string): Promise<void> {
    while (!this.over) {
      let next: IteratorResult<TurnEvent>;
      try {
        next = await this.iterator.next();
      } catch (error) {
        if (!(error instanceof ConnectionLostError)) throw error;
        this.lost = this.over = true;
        return;
      }
      if (next.done) {
        this.over = true;
        return;
      }
      this.events.push(next.value);
      if (until === "text" && next.value.type === "LLMStreamDelta" && next.value.delta) return;
    }
  }
}

/**
 * A spoken line's turn: the messages carrying its turn id, from the client's event stream (a
 * line spoken as audio has no Turn object; the SDK hands its messages to `onEvent`).
 */
class SpokenLog {
  readonly messages: ServerMessage[] = [];
  /** The reply's text is complete (its final delta that is not `tool_call`, or a Cutoff). */
  replied = false;
  /** The reply's last audio came (its final TTSChunk), or the NPC was cut off. */
  spoken = false;
  private wake: (() => void) | null = null;

  put(message: ServerMessage): void {
    this.messages.push(message);
    if (message.type === "LLMStreamDelta" && message.final && message.finish_reason !== "tool_call") {
      this.replied = true;
      if (message.finish_reason === "cutoff" || message.finish_reason === "error") this.spoken = true;
    } else if (message.type === "TTSChunk" && message.final) {
      this.spoken = true;
    } else if (message.type === "Cutoff") {
      this.replied = this.spoken = true;
    }
    this.wake?.();
  }

  get deltas(): LLMStreamDelta[] {
    return this.messages.filter((m) => m.type === "LLMStreamDelta");
  }

  /** The turn is over: replied and, when the reply said something, spoken to its end. */
  async over(): Promise<void> {
    const said = () => this.deltas.map((d) => d.delta).join("").trim() !== "";
    while (!(this.replied && (this.spoken || !said()))) {
      await new Promise<void>((wake) => (this.wake = wake));
    }
  }
}

/** A plain WebSocket, no SDK: frames in arrival order, each taken once, then its close. */
class Bare {
  private readonly frames: string[] = [];
  private wake: (() => void) | null = null;
  /** The WebSocket close code, once the connection closed. */
  private closeCode: number | null = null;
  private failure: Error | null = null;

  constructor(readonly ws: WebSocket) {
    ws.on("message", (data) => {
      this.frames.push(String(data));
      this.wake?.();
    });
    ws.on("error", (error) => (this.failure = error)); // a close (1006) follows
    ws.on("close", (code) => {
      this.closeCode = code;
      this.wake?.();
    });
  }

  static open(url: string): Promise<Bare> {
    const ws = new WebSocket(url);
    return new Promise((ok, fail) => {
      ws.once("open", () => ok(new Bare(ws)));
      ws.once("error", fail);
    });
  }

  async next(): Promise<ServerMessage> {
    while (this.frames.length === 0) {
      if (this.closeCode !== null) throw new Error(`the connection closed (${this.closeCode}) ${this.failure ?? ""}`);
      await new Promise<void>((wake) => (this.wake = wake));
    }
    return parseServerFrame(this.frames.shift()!);
  }

  /**
   * Skips what the server sends until it closes the connection: its close code, and the
   * error that broke it off, if one did.
   */
  async closed(): Promise<{ code: number; failure: Error | null }> {
    while (this.closeCode === null) await new Promise<void>((wake) => (this.wake = wake));
    this.frames.length = 0;
    return { code: this.closeCode, failure: this.failure };
  }
}

class Player {
  private readonly clients = new Map<string, MythicClient>();
  private readonly sessions = new Map<string, string>();
  private readonly bare = new Map<string, Bare>();
  private readonly turns = new Map<string, TurnLog>();
  private readonly spoken = new Map<string, SpokenLog>();
  /** Frames a client could not read: a failed step shows them. */
  private readonly unread: ClientEvent[] = [];
  private readonly toolRuns = new Map<string, number>();
  private readonly scenes = new Map<string, Scene>();
  private readonly talks = new Map<string, SceneTalk>();

  constructor(
    private readonly url: string,
    private readonly name: string,
  ) {}

  async play(steps: Step[]): Promise<void> {
    try {
      for (const [n, step] of steps.entries()) {
        const who = step.client ?? "main";
        const action = (this as unknown as Record<string, (s: Step, w: string) => Promise<void>>)[step.do];
        assert.ok(action, `unknown step ${step.do}`);
        let timer: NodeJS.Timeout | undefined;
        try {
          await Promise.race([
            action.call(this, step, who),
            new Promise((_, fail) => {
              timer = setTimeout(() => fail(new Error("the step timed out")), step.timeout_s ? step.timeout_s * 1000 : WAIT_MS);
            }),
          ]);
        } catch (error) {
          const unread = this.unread.length ? ` (frames the client could not read: ${this.unread.join("; ")})` : "";
          throw new Error(`${this.name} step ${n} ${JSON.stringify(step).slice(0, 300)}: ${String(error)}${unread}`, {
            cause: error,
          });
        } finally {
          clearTimeout(timer);
        }
      }
    } finally {
      for (const client of this.clients.values()) await client.close();
      for (const bare of this.bare.values()) bare.ws.terminate();
    }
  }

  private fill(value: unknown, who: string): any {
    if (typeof value === "string") return value.replaceAll("$session_id", this.clients.get(who)?.sessionId ?? "");
    if (Array.isArray(value)) return value.map((v) => this.fill(v, who));
    if (value !== null && typeof value === "object") {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, this.fill(v, who)]));
    }
    return value;
  }

  /** Hands a spoken turn its messages; every event stays in the client's `nextEvent` queue too. */
  private hear(event: ClientEvent): void {
    if (event instanceof Error) {
      this.unread.push(event);
      return;
    }
    const turnId = "turn_id" in event ? event.turn_id : undefined;
    const spoken = turnId ? this.spoken.get(turnId) : undefined;
    spoken?.put(event);
  }

  private client(who: string): MythicClient {
    const client = this.clients.get(who);
    assert.ok(client, `no client ${who}`);
    return client;
  }

  // -- steps ----------------------------------------------------------------------------------

  async connect(step: Step, who: string): Promise<void> {
    let client = this.clients.get(who);
    if (client === undefined) {
      const tools: Record<string, ToolResult & { delay_s?: number }> = step.tools ?? {};
      client = new MythicClient(this.url, {
        WebSocket,
        toolHandler: async (call) => {
          this.toolRuns.set(call.turn_id, (this.toolRuns.get(call.turn_id) ?? 0) + 1);
          const answer = tools[call.name] ?? { status: "rejected" };
          await new Promise((r) => setTimeout(r, (answer.delay_s ?? 0) * 1000)); // the game takes its time
          return answer;
        },
        backoffMs: 50,
        timeoutMs: WAIT_MS,
        ...(step.voice !== undefined && { voice: step.voice }),
        onEvent: (event) => this.hear(event),
      });
      this.clients.set(who, client);
    }
    const welcome = await client.connect();
    const expect = step.expect ?? {};
    if ("resumed" in expect) assert.equal(welcome.resumed ?? false, expect.resumed);
    if (expect.same_session) assert.equal(welcome.session_id, this.sessions.get(who));
    this.sessions.set(who, welcome.session_id);
  }

  async disconnect(_step: Step, who: string): Promise<void> {
    await this.client(who).disconnect();
  }

  async drop(_step: Step, who: string): Promise<void> {
    (this.client(who).socket as unknown as WebSocket).terminate(); // no close handshake
  }

  async wait_resumed(step: Step, who: string): Promise<void> {
    const client = this.client(who);
    while (client.resumes < step.expect.resumes || client.socket === null) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(client.resumes, step.expect.resumes);
    if (step.expect.same_session) assert.equal(client.sessionId, this.sessions.get(who));
  }

  async close(_step: Step, who: string): Promise<void> {
    const bare = this.bare.get(who);
    if (bare !== undefined) {
      bare.ws.close();
      this.bare.delete(who);
      return;
    }
    await this.client(who).close();
    this.clients.delete(who);
  }

  async open_bare(_step: Step, who: string): Promise<void> {
    this.bare.set(who, await Bare.open(this.url));
  }

  async say(step: Step, who: string): Promise<void> {
    const turn = await this.client(who).say(step.npc, step.text, { turnId: step.turn });
    this.turns.set(step.turn, new TurnLog(turn));
  }

  async talk(step: Step, who: string): Promise<void> {
    assert.ok(AUDIO, "set MYTHIC_CONFORMANCE_AUDIO to the folder of the clips; see clients/conformance/README.md");
    const clip = new Uint8Array(readFileSync(join(AUDIO, `${step.audio}.pcm`)));
    const size = Math.floor((CLIP_RATE * (step.chunk_ms ?? 40)) / 1000) * 2;
    const silence = new Uint8Array(Math.floor((CLIP_RATE * (step.silence_ms ?? 800)) / 1000) * 2);
    this.spoken.set(step.turn, new SpokenLog());
    const client = this.client(who);
    for (const pcm of [clip, silence]) {
      for (let at = 0; at < pcm.length; at += size) {
        const chunk = pcm.subarray(at, at + size);
        if (chunk.length < 2) continue;
        await client.sendAudio(step.npc, chunk, { sampleRate: CLIP_RATE, turnId: step.turn });
      }
    }
  }

  async listen(step: Step): Promise<void> {
    const log = this.spoken.get(step.turn);
    assert.ok(log, `no talk of turn ${step.turn}`);
    await log.over();
    checkSpoken(log, step.expect ?? {});
  }

  async cutoff(step: Step): Promise<void> {
    await this.turns.get(step.turn)!.turn.cutoff();
  }

  async scene(step: Step, who: string): Promise<void> {
    await this.client(who).scene(step.npc, { zone: step.zone, time: step.time, objects: step.objects });
  }

  async scene_start(step: Step, who: string): Promise<void> {
    const expect = step.expect ?? {};
    const start = this.client(who).startScene(step.scene, step.npcs, { maxExchanges: step.max_exchanges });
    if (expect.error) {
      const refused = await start.then(
        () => assert.fail("the scene was not refused"),
        (error: unknown) => error,
      );
      assert.ok(refused instanceof ServerError, String(refused));
      for (const [key, value] of Object.entries(expect.error)) {
        assert.equal((refused.error as unknown as Record<string, unknown>)[key], value, key);
      }
      return;
    }
    const scene = await start;
    this.scenes.set(step.scene, scene);
    if (expect.npcs) assert.deepEqual(scene.npcs, expect.npcs);
  }

  async scene_say(step: Step): Promise<void> {
    const scene = this.scenes.get(step.scene)!;
    this.talks.set(step.turn, await scene.say(step.text, { to: step.to, turnId: step.turn }));
  }

  async scene_ambient(step: Step): Promise<void> {
    const scene = this.scenes.get(step.scene)!;
    const talk = await scene.ambient({
      lines: step.lines,
      topic: step.topic,
      opener: step.opener,
      priority: step.priority,
      turnId: step.turn,
    });
    this.talks.set(step.turn, talk);
  }

  async scene_read(step: Step): Promise<void> {
    const talk = await this.talks.get(step.turn)!.wait();
    const expect = step.expect ?? {};
    const said = JSON.stringify(talk.replies.map((r) => [r.npcId, r.text, r.finishReason]));
    for (const reply of talk.replies) {
      assert.deepEqual(reply.deltas.map((d) => d.seq), [...reply.deltas.keys()], "seq has gaps");
    }
    if (expect.speakers) assert.deepEqual(talk.speakers, expect.speakers, said);
    if (expect.first_speaker) assert.deepEqual(talk.speakers.slice(0, 1), [expect.first_speaker], said);
    if (expect.at_most !== undefined) assert.ok(talk.replies.length <= expect.at_most, said);
    if (expect.chosen_by) assert.equal(talk.turns[0]?.chosen_by, expect.chosen_by, said);
    if (expect.text) assert.ok(talk.replies[0]?.text.trim(), said);
    if (expect.finish_reason) {
      assert.ok(talk.replies.every((r) => expect.finish_reason.includes(r.finishReason)), said);
    }
    if (expect.errors) assert.deepEqual(talk.errors.map((e) => e.code), expect.errors);
  }

  async scene_join(step: Step): Promise<void> {
    const npcs = await this.scenes.get(step.scene)!.join(step.npc);
    if (step.expect?.npcs) assert.deepEqual(npcs, step.expect.npcs);
  }

  async scene_leave(step: Step): Promise<void> {
    const npcs = await this.scenes.get(step.scene)!.leave(step.npc);
    if (step.expect?.npcs) assert.deepEqual(npcs, step.expect.npcs);
  }

  async scene_end(step: Step): Promise<void> {
    const scene = this.scenes.get(step.scene)!;
    await scene.end();
    assert.ok(scene.ended !== undefined);
  }

  async intent(step: Step, who: string): Promise<void> {
    const update = await this.client(who).intent(step.npc, {
      context: step.context,
      withBark: step.with_bark,
      requestId: step.request_id,
    });
    const expect = step.expect ?? {};
    assert.equal(update.npc_id, step.npc);
    if ("request_id" in expect) assert.equal(update.request_id, expect.request_id);
    if (expect.bark) {
      const words = (update.bark ?? "").split(/\s+/).filter(Boolean).length;
      assert.ok(words >= 1 && words <= 8, `bark ${JSON.stringify(update.bark)}`);
    }
    if ("target_in" in expect) assert.ok(expect.target_in.includes(update.target ?? null), `target ${update.target}`);
  }

  async ack(step: Step, who: string): Promise<void> {
    if ("call" in step) {
      const calls = this.turns.get(step.turn)!.events.filter((e) => e.type === "ToolCall");
      const call = calls[step.call];
      assert.ok(call, `the turn has no ToolCall ${step.call}`);
      await this.client(who).ack(call, step.status);
      return;
    }
    await this.client(who).ack({ turn_id: step.turn, call_id: step.call_id }, step.status);
  }

  async send(step: Step, who: string): Promise<void> {
    const message = this.fill(step.message, who) as Outgoing;
    if (step.refused_locally) {
      await assert.rejects(this.client(who).send(message), ValidationError);
      return;
    }
    await this.client(who).send(message);
  }

  async send_raw(step: Step, who: string): Promise<void> {
    let frame: string | Uint8Array;
    if ("text" in step) frame = this.fill(step.text, who).repeat(step.repeat ?? 1);
    else if ("binary_base64" in step) frame = fromBase64(step.binary_base64);
    else frame = encodeAudioFrame(this.fill(step.audio_frame.header, who), fromBase64(step.audio_frame.pcm_base64));
    const count: number = step.count ?? 1;
    const bare = this.bare.get(who);
    if (bare === undefined) {
      for (let i = 0; i < count; i++) await this.client(who).sendRaw(frame);
      return;
    }
    // All handed to the socket at once, each send's callback awaited: as fast as it takes them.
    const sent = Array.from(
      { length: count },
      () => new Promise<void>((ok, fail) => bare.ws.send(frame, (error) => (error ? fail(error) : ok()))),
    );
    await Promise.all(sent);
  }

  async expect_closed(step: Step, who: string): Promise<void> {
    const bare = this.bare.get(who);
    assert.ok(bare, `expect_closed is a bare connection's step; ${who} is not one`);
    const { code, failure } = await bare.closed();
    assert.equal(code, step.expect.code, `close code ${code} ${failure ?? ""}`);
  }

  async expect_error(step: Step, who: string): Promise<void> {
    const bare = this.bare.get(who);
    let error: ErrorMessage | undefined;
    while (error === undefined) {
      const event: ClientEvent = bare !== undefined ? await bare.next() : await this.client(who).nextEvent(WAIT_MS);
      // A spoken turn's Errors are its own (`listen` reads them), as a said turn's are.
      if (!(event instanceof Error) && event.type === "Error" && !this.spoken.has(event.turn_id ?? "")) error = event;
    }
    for (const [key, value] of Object.entries(step.expect)) {
      assert.equal((error as unknown as Record<string, unknown>)[key], value, `${key} of ${JSON.stringify(error)}`);
    }
  }

  async read(step: Step): Promise<void> {
    const log = this.turns.get(step.turn)!;
    await log.read(step.until);
    if (step.until === "end") checkTurn(log, step.expect ?? {}, this.toolRuns.get(step.turn) ?? 0);
  }
}

function checkTurn(log: TurnLog, expect: Record<string, any>, toolRuns: number): void {
  const seen = JSON.stringify(log.events).slice(0, 2000);
  const deltas = log.events.filter((e) => e.type === "LLMStreamDelta");
  assert.deepEqual(deltas.map((d) => d.seq), [...deltas.keys()], "seq has gaps");
  assert.equal(log.lost, expect.lost ?? false, seen);
  if ("finish_reason" in expect) assert.ok(expect.finish_reason.includes(log.turn.finishReason), seen);
  if (expect.text) assert.ok(log.turn.text.trim(), seen);
  if ("tool_calls" in expect) {
    const calls = log.events.filter((e) => e.type === "ToolCall");
    assert.deepEqual(calls.map((c) => c.name), expect.tool_calls.map((c: { name: string }) => c.name), seen);
    calls.forEach((call, i) => {
      for (const [key, value] of Object.entries(expect.tool_calls[i].args ?? {})) {
        assert.deepEqual(call.args[key], value, seen);
      }
    });
  }
  if ("distinct_calls" in expect) {
    const ids = new Set(log.events.filter((e) => e.type === "ToolCall").map((c) => c.call_id));
    assert.equal(ids.size, expect.distinct_calls, seen);
  }
  if ("tool_runs" in expect) assert.equal(toolRuns, expect.tool_runs, seen);
  if (expect.voiced) {
    const end = deltas.findIndex((d) => d.finish_reason === "tool_call");
    assert.ok(end >= 0 && deltas.slice(end + 1).map((d) => d.delta).join("").trim(), seen);
  }
  if ("cutoffs" in expect) {
    assert.deepEqual(log.events.filter((e) => e.type === "Cutoff").map((c) => c.reason), expect.cutoffs, seen);
  }
  if ("errors" in expect) {
    assert.deepEqual(log.events.filter((e) => e.type === "Error").map((e) => e.code), expect.errors, seen);
  }
}

function checkSpoken(log: SpokenLog, expect: Record<string, any>): void {
  const pcmLength = (key: string, value: unknown) => (key === "pcm" ? `<${String(value).length} base64 chars>` : value);
  const seen = JSON.stringify(log.messages, pcmLength).slice(0, 2000);
  const deltas = log.deltas;
  assert.deepEqual(deltas.map((d) => d.seq), [...deltas.keys()], "seq has gaps");
  if ("finish_reason" in expect) assert.ok(expect.finish_reason.includes(deltas.at(-1)?.finish_reason), seen);
  if (expect.text) assert.ok(deltas.map((d) => d.delta).join("").trim(), seen);
  if (expect.heard) {
    const transcript = log.messages.filter((m) => m.type === "ASRFinal").at(-1)?.text;
    assert.ok(transcript?.trim(), seen);
  }
  if (expect.audio) {
    const chunks = log.messages.filter((m) => m.type === "TTSChunk");
    assert.deepEqual(chunks.map((c) => c.seq), [...chunks.keys()], `TTSChunk seq has gaps: ${seen}`);
    assert.ok(chunks.length && chunks.at(-1)!.final && !chunks.slice(0, -1).some((c) => c.final), seen);
    let start = 0;
    const heard: number[] = []; // each viseme's time in the whole turn
    for (const chunk of chunks) {
      const bytes = fromBase64(chunk.pcm).length;
      const what = `TTSChunk ${chunk.seq}: ${bytes} bytes at ${chunk.sample_rate} Hz`;
      assert.ok(bytes > 0 && bytes % 2 === 0 && chunk.sample_rate > 0, what);
      const duration = bytes / 2 / chunk.sample_rate;
      const times = (chunk.visemes ?? []).map((v) => v.t);
      assert.ok(times.every((t, i) => i === 0 || times[i - 1]! < t), `${what}, visemes not increasing: ${times}`);
      assert.ok(times.every((t) => t >= 0 && t <= duration), `${what}, visemes ${times} beyond 0..${duration} s`);
      heard.push(...times.map((t) => start + t));
      start += duration;
    }
    assert.ok(heard.length, `no visemes: ${seen}`);
    assert.ok(heard.every((t, i) => i === 0 || heard[i - 1]! <= t), `visemes not running forward: ${heard}`);
  }
}

const scenarios: Scenario[] = readdirSync(DIR)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((f) => JSON.parse(readFileSync(join(DIR, f), "utf8")));

test("the suite holds scenarios", () => {
  assert.ok(scenarios.length >= 10, `only ${scenarios.length} scenarios in ${DIR}`);
});

for (const scenario of scenarios) {
  test(`conformance: ${scenario.name}`, async () => {
    assert.ok(URL, "set MYTHIC_URL to a running `mythic serve` (ws://host:port/v1/ws); see clients/conformance/README.md");
    await new Player(URL, scenario.name).play(scenario.steps);
  });
}
