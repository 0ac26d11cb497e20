// The client against a scripted peer (the other side of the boundary): what a real server
// never sends (a newer schema_version, an unknown type, a ToolCall sent again) and waits that
// must end. The real server's behaviour is the conformance suite's (conformance.test.ts).
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { WebSocket, WebSocketServer } from "ws";

import {
  MythicClient,
  ProtocolError,
  ServerError,
  ValidationError,
  WaitTimeoutError,
  decodeAudioFrame,
  encodeAudioFrame,
  fromBase64,
  toBase64,
  type ClientOptions,
  type Outgoing,
  type VoiceFormat,
} from "../src/index.js";

type Script = (ws: WebSocket, received: Record<string, any>[]) => void;

/** A peer that welcomes every SessionStart, then follows `script` for each message. */
async function withPeer(
  script: Script,
  run: (client: MythicClient, received: Record<string, any>[]) => Promise<void>,
  options: ClientOptions = {},
): Promise<void> {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((ok) => server.once("listening", ok));
  const received: Record<string, any>[] = [];
  server.on("connection", (ws) => {
    ws.on("message", (data) => {
      const message = JSON.parse(String(data));
      received.push(message);
      if (message.type === "SessionStart") {
        const welcome = { schema_version: "v1", type: "Welcome", session_id: "s-1", resume_token: "r-1", max_frame_bytes: 262144 };
        ws.send(JSON.stringify(welcome));
      }
      script(ws, received);
    });
  });
  const { port } = server.address() as AddressInfo;
  const client = new MythicClient(`ws://127.0.0.1:${port}/v1/ws`, { WebSocket, timeoutMs: 2000, ...options });
  try {
    await client.connect();
    await run(client, received);
  } finally {
    await client.close();
    for (const ws of server.clients) ws.terminate();
    await new Promise((ok) => server.close(ok));
  }
}

const delta = (seq: number, text: string, final = false) => ({
  schema_version: "v1",
  type: "LLMStreamDelta",
  npc_id: "marla",
  session_id: "s-1",
  turn_id: "t-1",
  seq,
  delta: text,
  ...(final && { final: true, finish_reason: "stop" }),
});

test("a newer schema_version or an unknown type is a typed event, and the turn goes on", async () => {
  const reported: unknown[] = [];
  await withPeer(
    (ws, received) => {
      if (received.at(-1)?.type !== "PlayerUtterance") return;
      ws.send(JSON.stringify(delta(0, "Aye, ")));
      ws.send(JSON.stringify({ ...delta(1, "x"), schema_version: "v2" }));
      ws.send(JSON.stringify({ schema_version: "v1", type: "Teleport" }));
      ws.send("not json");
      ws.send(JSON.stringify({ ...delta(1, "x"), seq: -1 }));
      ws.send(JSON.stringify(delta(1, "we're open.", true)));
    },
    async (client) => {
      const turn = await client.say("marla", "Open?", { turnId: "t-1" });
      assert.equal(await turn.reply(), "Aye, we're open.");
      assert.equal(turn.finishReason, "stop");
      const codes = [];
      for (let i = 0; i < 4; i++) {
        const event = await client.nextEvent();
        assert.ok(event instanceof ProtocolError);
        codes.push(event.code);
      }
      assert.deepEqual(codes, ["bad_schema_version", "unknown_type", "bad_json", "invalid_message"]);
      assert.equal(reported.length, 4);
    },
    { onEvent: (event) => reported.push(event) },
  );
});

test("a ToolCall sent again runs the handler once and is acknowledged duplicate", async () => {
  const runs: string[] = [];
  const call = { schema_version: "v1", type: "ToolCall", name: "give_item", args: { item: "ale" }, npc_id: "marla", turn_id: "t-1", call_id: "c-1" };
  await withPeer(
    (ws, received) => {
      if (received.at(-1)?.type === "PlayerUtterance") {
        ws.send(JSON.stringify(call));
        ws.send(JSON.stringify(call));
      }
      if (received.filter((m) => m.type === "Ack").length === 2 && received.at(-1)?.type === "Ack") {
        ws.send(JSON.stringify(delta(0, "Here.", true)));
      }
    },
    async (client, received) => {
      const turn = await client.say("marla", "Ale, please.", { turnId: "t-1" });
      await turn.reply();
      assert.deepEqual(runs, ["give_item"]);
      const acks = received.filter((m) => m.type === "Ack");
      assert.deepEqual(acks.map((a) => [a.status, a.call_id, a.result]), [
        ["ok", "c-1", { given: 1 }],
        ["duplicate", "c-1", { given: 1 }],
      ]);
      assert.equal(turn.toolCalls.length, 2);
    },
    {
      toolHandler: async (c) => {
        runs.push(c.name);
        return { status: "ok", result: { given: 1 } };
      },
    },
  );
});

test("every wait is bounded: an unanswered intent and a silent turn time out", async () => {
  await withPeer(
    () => {},
    async (client) => {
      await assert.rejects(client.intent("marla", { requestId: "i-1" }), WaitTimeoutError);
      const turn = await client.say("marla", "Hello?");
      await assert.rejects(turn.reply(), WaitTimeoutError);
      assert.ok(turn.over);
      await assert.rejects(client.nextEvent(50), WaitTimeoutError);
    },
    { timeoutMs: 200 },
  );
});

test("a server Error on SessionStart is a ServerError from connect", async () => {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((ok) => server.once("listening", ok));
  server.on("connection", (ws) =>
    ws.on("message", () =>
      ws.send(JSON.stringify({ schema_version: "v1", type: "Error", code: "too_many_sessions", message: "full", retryable: true })),
    ),
  );
  const { port } = server.address() as AddressInfo;
  const client = new MythicClient(`ws://127.0.0.1:${port}/v1/ws`, { WebSocket, timeoutMs: 2000 });
  await assert.rejects(client.connect(), (error: unknown) => {
    assert.ok(error instanceof ServerError);
    assert.equal(error.code, "too_many_sessions");
    assert.equal(error.retryable, true);
    return true;
  });
  await new Promise((ok) => server.close(ok));
});

test("outgoing messages are checked against the schema before sending", async () => {
  await withPeer(
    () => {},
    async (client, received) => {
      await assert.rejects(client.say("marla", "   "), (error: unknown) => error instanceof ValidationError && error.ref === "PlayerUtterance.text");
      await assert.rejects(client.scene("marla", { objects: { player: -1 } }), ValidationError);
      await assert.rejects(client.say("not an id!", "Hi"), ValidationError);
      assert.deepEqual(received.map((m) => m.type), ["SessionStart"]);
    },
  );
});

test("the schema's cross-field rules are checked before sending, naming the field", async () => {
  await withPeer(
    () => {},
    async (client, received) => {
      const refused = (message: Outgoing, ref: string, why: RegExp) =>
        assert.rejects(client.send(message), (error: unknown) => {
          assert.ok(error instanceof ValidationError);
          assert.equal(error.ref, ref);
          assert.match(error.message, why);
          return true;
        });
      await refused({ type: "Ack", ack_of: "ToolCall", status: "ok", turn_id: "t-1" }, "Ack.call_id", /when ack_of is "ToolCall"/);
      await refused({ type: "SessionStart", session_id: "s-1" }, "SessionStart.resume_token", /when session_id is given/);
      await refused({ type: "SessionStart", resume_token: "r-1" }, "SessionStart.session_id", /when resume_token is given/);
      await refused({ type: "SessionStart", session_id: "s-1", resume_token: null }, "SessionStart.resume_token", /must be string/);
      // @ts-expect-error the types allow the three rates only, as the schema does
      await refused({ type: "SessionStart", voice: { input_rate: 22050 } }, "SessionStart.voice.input_rate", /16000, 32000, 48000/);
      await client.send({ type: "Ack", ack_of: "ToolCall", status: "ok", turn_id: "t-1", call_id: "c-1" });
      await client.send({ type: "Ack", ack_of: "SceneUpdate", status: "ok" });
      await client.send({ type: "SessionStart", session_id: "s-1", resume_token: "r-1" });
      await client.send({ type: "SessionStart", voice: { input_rate: 48000 } });
      for (let i = 0; i < 2; i++) {
        const answer = await client.nextEvent(); // the peer welcomes each SessionStart, in order
        assert.ok(!(answer instanceof Error) && answer.type === "Welcome", String(answer));
      }
      assert.deepEqual(
        received.map((m) => [m.type, m.ack_of ?? m.session_id ?? m.voice?.input_rate ?? null]),
        [["SessionStart", null], ["Ack", "ToolCall"], ["Ack", "SceneUpdate"], ["SessionStart", "s-1"], ["SessionStart", 48000]],
      );
    },
  );
});

test("a voice format the schema refuses fails connect before a socket opens", async () => {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise((ok) => server.once("listening", ok));
  let connections = 0;
  server.on("connection", () => connections++);
  const { port } = server.address() as AddressInfo;
  const voice = { input_rate: 22050 } as unknown as VoiceFormat; // a game's config, read at runtime
  const client = new MythicClient(`ws://127.0.0.1:${port}/v1/ws`, { WebSocket, timeoutMs: 2000, voice });
  await assert.rejects(client.connect(), (error: unknown) => error instanceof ValidationError && error.ref === "SessionStart.voice.input_rate");
  assert.equal(connections, 0);
  await client.close();
  await new Promise((ok) => server.close(ok));
});

test("a delta breaking the finish_reason rule is a typed event, and the turn goes on", async () => {
  await withPeer(
    (ws, received) => {
      if (received.at(-1)?.type !== "PlayerUtterance") return;
      ws.send(JSON.stringify(delta(0, "Aye, ")));
      ws.send(JSON.stringify({ ...delta(1, "x"), final: true })); // final, with no finish_reason
      ws.send(JSON.stringify({ ...delta(1, "x"), finish_reason: "stop" })); // a finish_reason, not final
      ws.send(JSON.stringify(delta(1, "we're open.", true)));
    },
    async (client) => {
      const turn = await client.say("marla", "Open?", { turnId: "t-1" });
      assert.equal(await turn.reply(), "Aye, we're open.");
      assert.equal(turn.finishReason, "stop");
      for (const why of [/required property 'finish_reason' when final is true/, /must be null unless final is true/]) {
        const event = await client.nextEvent();
        assert.ok(event instanceof ProtocolError);
        assert.equal(event.code, "invalid_message");
        assert.equal(event.ref, "LLMStreamDelta.finish_reason");
        assert.match(event.message, why);
      }
    },
  );
});

test("binary audio frames: MYA1, the header's length little-endian, the header, the PCM", () => {
  const pcm = new Uint8Array([1, 0, 255, 127, 0, 128]);
  const header = { schema_version: "v1", type: "TTSChunk", npc_id: "marla", session_id: "s-1", turn_id: "t-1", seq: 0, sample_rate: 22050, visemes: [{ t: 0, p: "AA" }] };
  const frame = encodeAudioFrame(header, pcm);
  const json = JSON.stringify(header);
  assert.equal(new TextDecoder().decode(frame.subarray(0, 4)), "MYA1");
  assert.equal(new DataView(frame.buffer).getUint32(4, true), json.length);
  const chunk = decodeAudioFrame(frame);
  assert.deepEqual(fromBase64(chunk.pcm), pcm);
  assert.equal(chunk.pcm, toBase64(pcm));
  assert.deepEqual(chunk.visemes, header.visemes);
  assert.throws(() => decodeAudioFrame(new Uint8Array([77, 89, 65, 49, 255, 255, 255, 127])), ProtocolError);
});
