// Lip-sync on a TTSChunk a real `mythic serve` sent with voice on (the Unity SDK's fixture,
// clients/unity/Tests/Fixtures/tts_chunk.json: Marla's Piper voice, read by this SDK's own
// decoder). The browser's AudioContext is the other side of a boundary here: RecordedAudio
// stands in for it, and the compiler checks that the real one fits AudioOut.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";
import ts from "typescript";

import { lipSync } from "../examples/first_npc.js";
import {
  BlendShapeMap,
  ProtocolError,
  SpeechQueue,
  VISEMES,
  VisemeTrack,
  decodeAudioFrame,
  fromBase64,
  pcmSamples,
  type AudioBufferLike,
  type AudioOut,
  type AudioSourceLike,
  type Cutoff,
  type TTSChunk,
  type VisemeLabel,
} from "../src/index.js";

// npm test runs in clients/typescript.
const FIXTURE = resolve("..", "unity", "Tests", "Fixtures", "tts_chunk.json");

function recorded(changes: Partial<TTSChunk> = {}): TTSChunk {
  const record = JSON.parse(readFileSync(FIXTURE, "utf8")) as { frame_base64: string };
  return { ...decodeAudioFrame(fromBase64(record.frame_base64)), ...changes };
}

const chunk = recorded();
const marks = chunk.visemes ?? [];
const seconds = pcmSamples(chunk).length / chunk.sample_rate;

/** Weights with only `shapes` moved, as far as each says. */
function only(map: BlendShapeMap, shapes: Record<string, number>): number[] {
  return map.shapes.map((shape) => shapes[shape] ?? 0);
}

function close(actual: ArrayLike<number>, expected: number[], what: string): void {
  assert.equal(actual.length, expected.length, what);
  for (let i = 0; i < expected.length; i++) {
    assert.ok(Math.abs(actual[i]! - expected[i]!) < 1e-6, `${what}: ${Array.from(actual)} is not ${expected}`);
  }
}

test("the recorded chunk is Marla's voice with a forward viseme track of the 15 visemes", () => {
  assert.equal(chunk.npc_id, "marla");
  assert.equal(chunk.sample_rate, 22050);
  assert.ok(seconds >= 0.03 && seconds <= 0.1, `a chunk is 40-80 ms: ${seconds}`);
  assert.ok(marks.length >= 3);
  assert.ok(marks.every((m, i) => m.t >= 0 && m.t < seconds && (i === 0 || m.t >= marks[i - 1]!.t)));
  assert.ok(marks.every((m) => (VISEMES as readonly string[]).includes(m.p)), JSON.stringify(marks));
  const pcm = fromBase64(chunk.pcm);
  const samples = pcmSamples(chunk);
  assert.equal(samples.length, pcm.length / 2);
  const last = samples.length - 1;
  assert.equal(samples[last], new DataView(pcm.buffer, pcm.byteOffset).getInt16(2 * last, true) / 32768);
  assert.ok(samples.some((s) => s !== 0) && samples.every((s) => s >= -1 && s < 1));
});

test("each viseme moves its own shape once its blend is done, sil moves nothing, before the first mark is rest", () => {
  const map = BlendShapeMap.oculusVisemes();
  assert.equal(map.shapes.length, 14, "sil moves nothing");
  const track = new VisemeTrack();
  track.add(1.0, marks);
  assert.equal(track.at(0.999), undefined);
  close(track.weights(0.999, map), only(map, {}), "before the first mark");
  let settled = 0;
  for (const [i, mark] of marks.entries()) {
    const t = 1.0 + mark.t + track.blendSeconds;
    if (t >= 1.0 + (marks[i + 1]?.t ?? Infinity)) continue; // replaced before it settles
    assert.equal(track.at(t), mark.p);
    close(track.weights(t, map), only(map, { [`viseme_${mark.p}`]: 1 }), `${mark.p} at ${t}`);
    settled++;
  }
  assert.ok(settled >= 2, "the recorded marks are far enough apart to settle");
  assert.ok(marks.some((m) => m.p === "sil"), "the recording has a sil to check");
});

test("a new viseme fades in while the one before fades out, through ARKit shapes too", () => {
  // The first change between two shapes that move the rig (sil moves nothing).
  const i = marks.findIndex((m, k) => k > 0 && m.p !== "sil" && marks[k - 1]!.p !== "sil" && m.p !== marks[k - 1]!.p);
  const [before, now] = [marks[i - 1]!, marks[i]!];
  const oculus = BlendShapeMap.oculusVisemes();
  const track = new VisemeTrack();
  track.add(1.0, marks);
  const t = 1.0 + now.t + track.blendSeconds / 4;
  close(track.weights(t, oculus), only(oculus, { [`viseme_${before.p}`]: 0.75, [`viseme_${now.p}`]: 0.25 }), "a quarter in");

  const arKit = BlendShapeMap.arKit();
  const expected = new Float32Array(arKit.shapes.length);
  arKit.add(before.p, 0.75, expected);
  arKit.add(now.p, 0.25, expected);
  close(track.weights(t, arKit), Array.from(expected), "ARKit, a quarter in");
  assert.ok(expected.some((w) => w > 0));
});

test("the ARKit preset mixes each viseme as the C# one does, a shape at most 1", () => {
  const arKit = BlendShapeMap.arKit();
  const mix = (...visemes: string[]) => {
    const weights = new Float32Array(arKit.shapes.length);
    for (const viseme of visemes) arKit.add(viseme, 1, weights);
    return weights;
  };
  close(mix("FF"), only(arKit, { mouthRollLower: 0.7, mouthUpperUpLeft: 0.3, mouthUpperUpRight: 0.3 }), "FF");
  close(mix("RR"), only(arKit, { mouthFunnel: 0.3, jawOpen: 0.2 }), "RR");
  close(mix("ou"), only(arKit, { mouthPucker: 0.8, jawOpen: 0.15 }), "ou");
  close(mix("aa", "oh"), only(arKit, { jawOpen: 1, mouthFunnel: 0.5 }), "aa and oh: jawOpen stops at 1");
  close(mix("sil", "AA"), only(arKit, {}), "sil and a label of no viseme move nothing");
});

test("a map refuses a label that is no viseme and a weight outside 0-1", () => {
  assert.throws(() => new BlendShapeMap().map("AA" as VisemeLabel, "jawOpen"), RangeError);
  for (const weight of [2, -0.1, NaN]) {
    assert.throws(() => new BlendShapeMap().map("aa", "jawOpen", weight), RangeError, String(weight));
  }
  const map = new BlendShapeMap().map("aa", "jawOpen", 0.5).map("oh", "jawOpen", 0.5).map("oh", "mouthFunnel");
  assert.deepEqual(map.shapes, ["jawOpen", "mouthFunnel"]);
});

test("a speech queue plays an NPC's chunks back to back on the game's clock, its mouth at the playhead", () => {
  const speech = new SpeechQueue({ npcId: "marla" });
  const ff = marks.find((m) => m.p === "FF")!;
  const map = BlendShapeMap.oculusVisemes();

  const first = speech.add(chunk, 10)!;
  assert.deepEqual([first.start, first.end], [10, 10 + seconds]);
  assert.deepEqual(first.samples, pcmSamples(chunk));
  const second = speech.add(recorded({ seq: 1 }), 10.01)!;
  assert.equal(second.start, first.end, "the next chunk starts where the one before ends");
  assert.equal(speech.add(recorded({ npc_id: "bran" }), 10.02), null, "another NPC's chunk");
  assert.equal(speech.end, second.end);

  assert.equal(speech.at(9.99), undefined, "before her speech");
  close(speech.weights(9.99, map), only(map, {}), "before her speech");
  for (const start of [first.start, second.start]) {
    const t = start + ff.t + speech.track.blendSeconds;
    assert.equal(speech.at(t), "FF");
    close(speech.weights(t, map), only(map, { viseme_FF: 1 }), `FF of the chunk at ${start}`);
  }
  assert.equal(speech.at(second.end), undefined, "her audio ran out");
  close(speech.weights(second.end, map), only(map, {}), "her audio ran out: the mouth rests");

  const late = speech.add(recorded({ seq: 2 }), 11)!;
  assert.equal(late.start, 11, "a chunk after the audio ran dry starts now");
  close(speech.weights(11 + ff.t + speech.track.blendSeconds, map), only(map, { viseme_FF: 1 }), "FF, late");

  const stream = new SpeechQueue();
  const starts = [0, 1, 2].map((seq) => stream.add(recorded({ seq }), 0)!.start);
  assert.deepEqual(starts, [0, seconds, 2 * seconds], "on a stream's clock (seconds played) one after the other");
});

test("stop drops what is not played and the rest of that turn; the next turn speaks at once", () => {
  const speech = new SpeechQueue({ npcId: "marla" });
  const map = BlendShapeMap.oculusVisemes();
  speech.add(chunk, 5);
  speech.add(recorded({ seq: 1 }), 5);
  speech.stop(5.01);
  assert.equal(speech.end, 5.01);
  assert.equal(speech.at(5.02), undefined);
  close(speech.weights(5.02, map), only(map, {}), "cut off");
  assert.equal(speech.add(recorded({ seq: 2 }), 5.03), null, "sent before the server heard of the cutoff");
  const next = speech.add(recorded({ turn_id: "t-next" }), 5.04)!;
  assert.equal(next.start, 5.04);
});

/** The browser's side: an AudioContext whose clock the test sets, keeping what it was given. */
class RecordedAudio implements AudioOut {
  currentTime = 0;
  readonly destination = { kind: "speakers" };
  readonly sources: RecordedSource[] = [];

  createBuffer(channels: number, length: number, sampleRate: number): RecordedBuffer {
    assert.equal(channels, 1);
    return new RecordedBuffer(length, sampleRate);
  }

  createBufferSource(): RecordedSource {
    const source = new RecordedSource();
    this.sources.push(source);
    return source;
  }
}

class RecordedBuffer implements AudioBufferLike {
  readonly samples: Float32Array;

  constructor(
    length: number,
    readonly sampleRate: number,
  ) {
    this.samples = new Float32Array(length);
  }

  copyToChannel(source: Float32Array, channel: number): void {
    assert.equal(channel, 0);
    this.samples.set(source);
  }
}

class RecordedSource implements AudioSourceLike {
  buffer: RecordedBuffer | null = null;
  readonly to: unknown[] = [];
  startedAt: number | undefined;
  stopped = false;

  connect(destination: unknown): void {
    this.to.push(destination);
  }

  start(when?: number): void {
    this.startedAt = when;
  }

  stop(): void {
    this.stopped = true;
  }
}

test("the docs' lipSync plays Marla's chunks on an AudioContext and moves a Ready Player Me face", () => {
  const audio = new RecordedAudio();
  const names = [...VISEMES.filter((v) => v !== "sil" && v !== "TH").map((v) => `viseme_${v}`), "eyeBlinkLeft"];
  const face = {
    morphTargetDictionary: Object.fromEntries(names.map((name, i) => [name, i])),
    morphTargetInfluences: names.map(() => 0.5),
  };
  const lips = lipSync(audio, face);
  audio.currentTime = 3;
  lips.hear(chunk);
  audio.currentTime = 3.01;
  lips.hear(recorded({ seq: 1 }));
  lips.hear(recorded({ npc_id: "bran" }));
  lips.hear(new ProtocolError("unknown_type", "a frame this client cannot read"));
  assert.deepEqual(
    audio.sources.map((s) => [s.startedAt, s.buffer?.sampleRate, s.to]),
    [
      [3, 22050, [audio.destination]],
      [3 + seconds, 22050, [audio.destination]],
    ],
  );
  assert.deepEqual(audio.sources[0]!.buffer?.samples, pcmSamples(chunk));

  const ff = marks.find((m) => m.p === "FF")!;
  audio.currentTime = 3 + seconds + ff.t + 0.02; // the second chunk's FF, its blend (20 ms) done
  lips.frame();
  const moved = names.map((name, i) => [name, face.morphTargetInfluences[i]]).filter(([, w]) => w !== 0);
  assert.deepEqual(moved, [["viseme_FF", 1], ["eyeBlinkLeft", 0.5]], "the mouth only: FF at full weight");

  const cutoff: Cutoff = {
    schema_version: "v1",
    type: "Cutoff",
    npc_id: "bran",
    session_id: chunk.session_id,
    turn_id: "t-bran",
    reason: "barge_in",
  };
  lips.hear(cutoff);
  assert.deepEqual(audio.sources.map((s) => s.stopped), [false, false], "another NPC's cutoff");
  lips.hear({ ...cutoff, npc_id: "marla", turn_id: chunk.turn_id });
  assert.deepEqual(audio.sources.map((s) => s.stopped), [true, true]);
  lips.frame();
  assert.ok(face.morphTargetInfluences.slice(0, -1).every((w) => w === 0), "cut off: the mouth rests");
});

test("a browser's AudioContext is an AudioOut (lib.dom)", () => {
  const file = resolve("lipsync-dom-check.ts");
  const text = 'import type { AudioOut } from "./src/lipsync.js";\nexport const out: AudioOut = new AudioContext();\n';
  const options: ts.CompilerOptions = {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    lib: ["lib.es2022.d.ts", "lib.dom.d.ts"],
    types: [],
    strict: true,
    noEmit: true,
  };
  const host = ts.createCompilerHost(options);
  const [read, exists] = [host.getSourceFile.bind(host), host.fileExists.bind(host)];
  host.getSourceFile = (name, language, ...rest) =>
    name === file ? ts.createSourceFile(name, text, language) : read(name, language, ...rest);
  host.fileExists = (name) => name === file || exists(name);
  const program = ts.createProgram([file], options, host);
  const problems = ts.getPreEmitDiagnostics(program, program.getSourceFile(file));
  assert.deepEqual(problems.map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n")), []);
});
