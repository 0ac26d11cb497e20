// Lip-sync from the viseme marks of an NPC's TTSChunks: which mouth shape shows at a time of
// playback, and the face's blend shape weights for it. The core knows no audio API (it runs in
// Node); WebAudioSpeaker plays the chunks on a browser's AudioContext.
import type { ClientEvent } from "./client.js";
import type { TTSChunk, Viseme } from "./generated/messages.js";
import { fromBase64 } from "./protocol.js";

/**
 * The 15 visemes of the Oculus/Meta lip-sync set that `TTSChunk.visemes` carries
 * (mythic.speech.VISEMES), in that set's order: `sil` (mouth at rest), `PP` (p b m), `FF`
 * (f v), `TH`, `DD` (t d), `kk` (k g h), `CH` (ch j sh), `SS` (s z), `nn` (n l), `RR`, `aa`,
 * `E`, `ih`, `oh`, `ou`.
 */
export const VISEMES = ["sil", "PP", "FF", "TH", "DD", "kk", "CH", "SS", "nn", "RR", "aa", "E", "ih", "oh", "ou"] as const;

/** One of the 15 visemes (`Viseme.p`). */
export type VisemeLabel = (typeof VISEMES)[number];

/**
 * How each viseme moves a face rig: its blend shapes (morph targets) and how far (0-1). Build
 * one per rig (`oculusVisemes()`, `arKit()`, or `map` by hand); weights come one per shape,
 * in the order of `shapes`.
 */
export class BlendShapeMap {
  private readonly names: string[] = [];
  private readonly targets = new Map<string, [shape: number, weight: number][]>();

  /** The rig's blend shapes this map moves, in the order of the weights. */
  get shapes(): readonly string[] {
    return this.names;
  }

  /**
   * Viseme `viseme` moves `shape` to `weight` (added to what it moves already).
   *
   * @throws RangeError not one of the 15 visemes, or a weight outside 0-1.
   */
  map(viseme: VisemeLabel, shape: string, weight = 1): this {
    if (!(VISEMES as readonly string[]).includes(viseme)) {
      throw new RangeError(`${viseme} is not one of the 15 visemes (VISEMES)`);
    }
    if (!(weight >= 0 && weight <= 1)) throw new RangeError(`a blend shape weight is 0-1, not ${weight}`);
    let index = this.names.indexOf(shape);
    if (index < 0) index = this.names.push(shape) - 1;
    const targets = this.targets.get(viseme) ?? [];
    targets.push([index, weight]);
    this.targets.set(viseme, targets);
    return this;
  }

  /**
   * A rig with one blend shape per viseme, named `prefix` and the viseme (`viseme_aa`: Ready
   * Player Me and Oculus LipSync avatars, their three.js morph targets). `sil` is the rest
   * pose: it moves nothing.
   */
  static oculusVisemes(prefix = "viseme_"): BlendShapeMap {
    const map = new BlendShapeMap();
    for (const viseme of VISEMES) if (viseme !== "sil") map.map(viseme, prefix + viseme);
    return map;
  }

  /** A rig with Apple ARKit's face blend shapes (`jawOpen`, `mouthClose`, `mouthFunnel`, ...): each viseme a mix of them. */
  static arKit(): BlendShapeMap {
    return new BlendShapeMap()
      .map("PP", "mouthClose", 0.6).map("PP", "mouthPressLeft", 0.5).map("PP", "mouthPressRight", 0.5)
      .map("FF", "mouthRollLower", 0.7).map("FF", "mouthUpperUpLeft", 0.3).map("FF", "mouthUpperUpRight", 0.3)
      .map("TH", "jawOpen", 0.15).map("TH", "tongueOut", 0.6)
      .map("DD", "jawOpen", 0.2).map("DD", "mouthShrugUpper", 0.2)
      .map("kk", "jawOpen", 0.25).map("kk", "mouthStretchLeft", 0.2).map("kk", "mouthStretchRight", 0.2)
      .map("CH", "mouthFunnel", 0.6).map("CH", "jawOpen", 0.15)
      .map("SS", "mouthStretchLeft", 0.35).map("SS", "mouthStretchRight", 0.35).map("SS", "jawOpen", 0.05)
      .map("nn", "jawOpen", 0.2).map("nn", "mouthShrugUpper", 0.1)
      .map("RR", "mouthFunnel", 0.3).map("RR", "jawOpen", 0.2)
      .map("aa", "jawOpen", 0.7)
      .map("E", "jawOpen", 0.4).map("E", "mouthStretchLeft", 0.3).map("E", "mouthStretchRight", 0.3)
      .map("ih", "jawOpen", 0.25).map("ih", "mouthSmileLeft", 0.4).map("ih", "mouthSmileRight", 0.4)
      .map("oh", "jawOpen", 0.5).map("oh", "mouthFunnel", 0.5)
      .map("ou", "mouthPucker", 0.8).map("ou", "jawOpen", 0.15);
  }

  /** Adds `amount` of `viseme` to `weights` (one per shape), each at most 1; a label outside the map moves nothing. */
  add(viseme: string, amount: number, weights: Float32Array): void {
    for (const [shape, weight] of this.targets.get(viseme) ?? []) {
      weights[shape] = Math.min(1, weights[shape]! + weight * amount);
    }
  }
}

/** A viseme mark on a track: from `t` (seconds of playback) it shows `p`. */
export interface VisemeMark {
  readonly t: number;
  readonly p: string;
}

/**
 * An NPC's mouth over time: the viseme marks of its speech chunks, each placed at its chunk's
 * start in playback. A viseme holds from its mark to the next; the new one fades in over
 * `blendSeconds` while the old one fades out.
 */
export class VisemeTrack {
  /**
   * How long a viseme takes to replace the one before (coarticulation): shorter than a
   * phoneme (Piper speaks one each 20-100 ms), or the mouth never reaches a shape.
   */
  blendSeconds = 0.02;
  private readonly held: VisemeMark[] = [];

  /** The marks held, in time order. */
  get marks(): readonly VisemeMark[] {
    return this.held;
  }

  /**
   * Adds a chunk's visemes (`t`: seconds from the chunk's start) for a chunk that starts
   * `chunkStart` seconds into playback. A mark before the last one held is moved up to it:
   * the track only goes forward.
   */
  add(chunkStart: number, visemes: readonly Viseme[]): void {
    for (const v of visemes) {
      const last = this.held.at(-1);
      this.held.push({ t: last === undefined ? chunkStart + v.t : Math.max(last.t, chunkStart + v.t), p: v.p });
    }
  }

  clear(): void {
    this.held.length = 0;
  }

  /** The viseme showing at `t` (undefined before the first mark). */
  at(t: number): string | undefined {
    return this.held[this.indexAt(t)]?.p;
  }

  /**
   * The rig's weights at `t`: the viseme there, faded in from the one before, through `map`
   * (into `out` when given, else a new array). Marks long past are dropped: `t` goes forward.
   */
  weights(t: number, map: BlendShapeMap, out: Float32Array = new Float32Array(map.shapes.length)): Float32Array {
    out.fill(0);
    const i = this.indexAt(t);
    const mark = this.held[i];
    if (mark === undefined) return out;
    const into = this.blendSeconds <= 0 ? 1 : Math.min(1, (t - mark.t) / this.blendSeconds);
    map.add(mark.p, into, out);
    const before = this.held[i - 1];
    if (before !== undefined && into < 1) map.add(before.p, 1 - into, out);
    if (i > 1) this.held.splice(0, i - 1);
    return out;
  }

  private indexAt(t: number): number {
    let i = -1;
    while (i + 1 < this.held.length && this.held[i + 1]!.t <= t) i++;
    return i;
  }
}

/** A TTSChunk's 16-bit little-endian PCM as samples in [-1, 1). */
export function pcmSamples(chunk: Pick<TTSChunk, "pcm">): Float32Array {
  const pcm = fromBase64(chunk.pcm);
  const view = new DataView(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  const samples = new Float32Array(pcm.byteLength >> 1);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
  return samples;
}

export interface SpeechOptions {
  /** Only this NPC's chunks are queued (default: every chunk given). */
  npcId?: string;
  /** Seconds a viseme takes to replace the one before (default: VisemeTrack's, 0.02). */
  blendSeconds?: number;
}

/** A chunk in the queue: when its audio plays, on the playhead's clock, and its samples. */
export interface QueuedChunk {
  readonly chunk: TTSChunk;
  readonly start: number;
  readonly end: number;
  /** The PCM as samples in [-1, 1), at `chunk.sample_rate`. */
  readonly samples: Float32Array;
}

/**
 * An NPC's streamed voice on the game's clock, without any audio API: give it the NPC's
 * TTSChunks as they arrive (in seq order, as the WebSocket delivers them), play each at the
 * `start` it returns, and ask which viseme and weights show at the playhead. The clock is the
 * game's: a browser's `AudioContext.currentTime`, or seconds of a stream played.
 */
export class SpeechQueue {
  readonly npcId: string | undefined;
  readonly track = new VisemeTrack();
  private queuedUntil = 0;
  private lastTurn: string | undefined;
  private cutTurn: string | undefined;

  constructor(options: SpeechOptions = {}) {
    this.npcId = options.npcId;
    if (options.blendSeconds !== undefined) this.track.blendSeconds = options.blendSeconds;
  }

  /** When the audio queued so far ends, on the playhead's clock. */
  get end(): number {
    return this.queuedUntil;
  }

  /**
   * Queues a chunk right after the audio queued before it, or at `now` when that has run out
   * (the NPC paused, or the network was late); its visemes move with it. Returns null for a
   * chunk of another NPC, or of a turn that `stop` cut.
   */
  add(chunk: TTSChunk, now: number): QueuedChunk | null {
    if ((this.npcId !== undefined && chunk.npc_id !== this.npcId) || chunk.turn_id === this.cutTurn) return null;
    const samples = pcmSamples(chunk);
    const start = Math.max(now, this.queuedUntil);
    this.queuedUntil = start + samples.length / chunk.sample_rate;
    this.lastTurn = chunk.turn_id;
    this.track.add(start, chunk.visemes ?? []);
    return { chunk, start, end: this.queuedUntil, samples };
  }

  /** The viseme showing at `now`; undefined when no audio plays (before the first mark, after the end). */
  at(now: number): string | undefined {
    return now < this.queuedUntil ? this.track.at(now) : undefined;
  }

  /** The mouth at `now`, one weight (0-1) per shape of `map`: all 0 when no audio plays. */
  weights(now: number, map: BlendShapeMap, out: Float32Array = new Float32Array(map.shapes.length)): Float32Array {
    if (now < this.queuedUntil) return this.track.weights(now, map, out);
    return out.fill(0);
  }

  /**
   * The NPC was cut off at `now`: what is not played yet is dropped, and later chunks of the
   * same turn (sent before the server heard of it) are refused. The game stops its audio.
   */
  stop(now: number): void {
    this.track.clear();
    this.queuedUntil = Math.min(this.queuedUntil, now);
    this.cutTurn = this.lastTurn;
  }
}

/** The part of an `AudioBuffer` that WebAudioSpeaker uses. */
export interface AudioBufferLike {
  copyToChannel(source: Float32Array, channel: number): void;
}

/** The part of an `AudioBufferSourceNode` that WebAudioSpeaker uses. */
export interface AudioSourceLike {
  buffer: AudioBufferLike | null;
  connect(destination: unknown): unknown;
  start(when?: number): void;
  stop(when?: number): void;
}

/** The part of the Web Audio API that WebAudioSpeaker uses: a browser's `AudioContext`. */
export interface AudioOut {
  readonly currentTime: number;
  readonly destination: unknown;
  createBuffer(channels: number, length: number, sampleRate: number): AudioBufferLike;
  createBufferSource(): AudioSourceLike;
}

/**
 * An NPC's voice on a browser's `AudioContext`, one buffer source per TTSChunk scheduled
 * back to back, and its mouth at the context's `currentTime`.
 */
export class WebAudioSpeaker {
  readonly speech: SpeechQueue;
  private playing: { source: AudioSourceLike; end: number }[] = [];

  constructor(
    readonly audio: AudioOut,
    options: SpeechOptions = {},
  ) {
    this.speech = new SpeechQueue(options);
  }

  /** The client's events (its `onEvent`): plays the NPC's TTSChunks, stops at its Cutoff. */
  hear(event: ClientEvent): void {
    if (event instanceof Error) return;
    if (event.type === "TTSChunk") this.play(event);
    if (event.type === "Cutoff" && (this.speech.npcId === undefined || event.npc_id === this.speech.npcId)) this.stop();
  }

  /** Schedules a chunk's audio after what is queued (another NPC's chunk is not played). */
  play(chunk: TTSChunk): void {
    const now = this.audio.currentTime;
    const queued = this.speech.add(chunk, now);
    this.playing = this.playing.filter((p) => p.end > now);
    if (queued === null || queued.samples.length === 0) return;
    const buffer = this.audio.createBuffer(1, queued.samples.length, chunk.sample_rate);
    buffer.copyToChannel(queued.samples, 0);
    const source = this.audio.createBufferSource();
    source.buffer = buffer;
    source.connect(this.audio.destination);
    source.start(queued.start);
    this.playing.push({ source, end: queued.end });
  }

  /** Silences the NPC now (it was cut off). */
  stop(): void {
    for (const { source } of this.playing) source.stop();
    this.playing = [];
    this.speech.stop(this.audio.currentTime);
  }

  /** The mouth now, one weight (0-1) per shape of `map`. */
  weights(map: BlendShapeMap, out?: Float32Array): Float32Array {
    return this.speech.weights(this.audio.currentTime, map, out);
  }
}
