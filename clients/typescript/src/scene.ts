// Scenes from the game's side: `client.startScene` opens one, `scene.say` sends the player's
// line to it and `scene.ambient` asks its NPCs to talk among themselves; each returns a
// SceneTalk, every reply to the line in order.
import type { MythicClient } from "./client.js";
import { type MythicError } from "./errors.js";
import type {
  Error as ErrorMessage,
  LLMStreamDelta,
  SceneState,
  SceneTurn,
  ToolCall,
} from "./generated/messages.js";
import { Inbox } from "./inbox.js";

/** What a SceneTalk yields: who answers next, the replies' deltas, tool calls, an error. */
export type SceneEvent = SceneTurn | LLMStreamDelta | ToolCall | ErrorMessage;

/** One NPC's reply in a scene: to the player's line, or to another NPC's. */
export class SceneReply {
  readonly deltas: LLMStreamDelta[] = [];
  /** Set by its final delta; undefined while it streams. */
  finishReason: string | undefined;

  constructor(
    readonly npcId: string,
    /** The reply's turn: the line's own for its first reply, `<line>.1`, ... after. */
    readonly turnId: string,
  ) {}

  get text(): string {
    return this.deltas.map((d) => d.delta).join("");
  }
}

/**
 * A line said to a scene (the player's, or the game's cue for NPCs talking among
 * themselves) and every reply it gets, in order, as the scene announces them (SceneTurn).
 * It is over when the scene says nobody answers the last reply, when the line is refused
 * (`errors`), when a new line to the scene stopped it (its reply then ends `cutoff`), or when
 * the scene ends. Iterate it for the events; `wait()` for all of it.
 */
export class SceneTalk implements AsyncIterable<SceneEvent> {
  readonly replies: SceneReply[] = [];
  readonly turns: SceneTurn[] = [];
  readonly errors: ErrorMessage[] = [];
  private done = false;
  private stopped = false;
  private readonly open = new Map<string, SceneReply>();
  /** @internal */ readonly inbox = new Inbox<SceneEvent | null>();

  constructor(
    readonly scene: Scene,
    readonly turnId: string,
  ) {}

  /** Who answered, in order. */
  get speakers(): string[] {
    return this.replies.map((r) => r.npcId);
  }

  /** Whether every reply is in (or the line was refused, stopped, or the scene ended). */
  get over(): boolean {
    return this.done;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<SceneEvent> {
    for (;;) {
      const event = await this.inbox.take(this.scene.client.timeoutMs, `message for scene line ${this.turnId}`);
      if (event === null) return;
      yield event;
    }
  }

  /** Waits until it is over; itself. */
  async wait(): Promise<SceneTalk> {
    for await (const _ of this);
    return this;
  }

  /** @internal */
  onTurn(turn: SceneTurn): void {
    this.turns.push(turn);
    turn.speakers.forEach((npcId, i) => {
      const reply = new SceneReply(npcId, turn.turn_ids[i]!);
      this.replies.push(reply);
      this.open.set(reply.turnId, reply);
      this.scene.client.sceneTalks.set(reply.turnId, this);
    });
    this.inbox.put(turn);
    if (turn.speakers.length === 0) this.finish();
  }

  /** @internal */
  onDelta(delta: LLMStreamDelta): void {
    const reply = this.open.get(delta.turn_id);
    if (reply === undefined) return;
    reply.deltas.push(delta);
    this.inbox.put(delta);
    if (delta.final && delta.finish_reason !== "tool_call") {
      reply.finishReason = delta.finish_reason ?? undefined;
      this.open.delete(delta.turn_id);
      if (this.stopped && this.open.size === 0) this.finish();
    }
  }

  /** @internal */
  onEvent(event: ToolCall | ErrorMessage): void {
    this.inbox.put(event);
    if (event.type === "Error") {
      this.errors.push(event);
      if (event.turn_id === this.turnId && this.replies.length === 0) this.finish(); // refused
    }
  }

  /** @internal A new line to the scene stopped this one: over once its reply in flight ends. */
  stop(): void {
    this.stopped = true;
    if (this.open.size === 0) this.finish();
  }

  /** @internal */
  finish(error?: MythicError): void {
    if (this.done) return;
    this.done = true;
    const talks = this.scene.client.sceneTalks;
    for (const turnId of [this.turnId, ...this.replies.map((r) => r.turnId)]) {
      if (talks.get(turnId) === this) talks.delete(turnId);
    }
    if (this.scene.talk === this) this.scene.talk = undefined;
    if (error !== undefined) this.inbox.fail(error);
    else this.inbox.put(null);
  }
}

/**
 * A scene this client opened (`client.startScene`) or joined (`client.joinScene`): its NPCs
 * and players as the server last said, and its lines. A message the server refuses throws a
 * ServerError (the scene unharmed).
 */
export class Scene {
  npcs: string[] = [];
  players: string[] = [];
  /** Why the scene ended (SceneEnd's reason); undefined while it is open. */
  ended: string | undefined;
  /** @internal The line being answered now. */ talk: SceneTalk | undefined;
  private count = 0;

  constructor(
    /** @internal */ readonly client: MythicClient,
    readonly sceneId: string,
  ) {}

  /** The player says `text` to the scene (`to`: the NPC the player faces); the NPC speaking stops. */
  async say(text: string, options: { to?: string; turnId?: string } = {}): Promise<SceneTalk> {
    const turnId = options.turnId ?? this.newId("t");
    return this.talkBy(turnId, {
      type: "SceneLine",
      scene_id: this.sceneId,
      session_id: this.client.sessionId,
      turn_id: turnId,
      text,
      ...(options.to !== undefined && { to: options.to }),
    });
  }

  /** The scene's NPCs talk among themselves, `lines` lines (1-30), below every player's line. */
  async ambient(
    options: {
      lines?: number;
      topic?: string;
      opener?: string;
      priority?: "silver" | "bronze";
      turnId?: string;
    } = {},
  ): Promise<SceneTalk> {
    const turnId = options.turnId ?? this.newId("a");
    return this.talkBy(turnId, {
      type: "SceneAmbient",
      scene_id: this.sceneId,
      session_id: this.client.sessionId,
      turn_id: turnId,
      lines: options.lines ?? 6,
      priority: options.priority ?? "bronze",
      ...(options.topic !== undefined && { topic: options.topic }),
      ...(options.opener !== undefined && { opener: options.opener }),
    });
  }

  /** An NPC walks in (it hears what is said from now); the scene's NPCs then. */
  async join(npcId: string): Promise<string[]> {
    await this.client.sceneCall(this, "SceneJoin", {
      type: "SceneJoin",
      scene_id: this.sceneId,
      session_id: this.client.sessionId,
      npc_id: npcId,
    });
    return this.npcs;
  }

  /** An NPC walks out (mid-sentence: it stops); the scene's NPCs then. */
  async leave(npcId: string): Promise<string[]> {
    await this.client.sceneCall(this, "SceneLeave", {
      type: "SceneLeave",
      scene_id: this.sceneId,
      session_id: this.client.sessionId,
      npc_id: npcId,
    });
    return this.npcs;
  }

  /** This client's player walks out of the scene (the others go on without them). */
  async exit(): Promise<void> {
    await this.client.send({ type: "SceneLeave", scene_id: this.sceneId, session_id: this.client.sessionId });
    this.client.scenes.delete(this.sceneId);
    this.onEnd("the player left");
  }

  /** Ends the scene for everyone in it; waits for the server's SceneEnd. */
  async end(reason?: string): Promise<void> {
    await this.client.sceneCall(this, "SceneEnd", {
      type: "SceneEnd",
      scene_id: this.sceneId,
      session_id: this.client.sessionId,
      ...(reason !== undefined && { reason }),
    });
  }

  private async talkBy(turnId: string, message: Parameters<MythicClient["send"]>[0]): Promise<SceneTalk> {
    const talk = new SceneTalk(this, turnId);
    const before = this.talk;
    this.client.sceneTalks.set(turnId, talk);
    this.talk = talk;
    try {
      await this.client.send(message);
    } catch (error) {
      this.client.sceneTalks.delete(turnId);
      this.talk = before;
      throw error;
    }
    before?.stop();
    return talk;
  }

  private newId(prefix: string): string {
    return `${prefix}-${Date.now().toString(36)}-${(this.count++).toString(36)}`;
  }

  /** @internal */
  onState(state: SceneState): void {
    this.npcs = [...(state.npcs ?? [])];
    this.players = [...(state.players ?? [])];
  }

  /** @internal */
  onEnd(reason: string): void {
    this.ended = reason;
    this.talk?.finish();
  }
}
