// A first NPC line from Node, with a game tool, and an NPC's lip-sync: the code of
// docs/engines/typescript.md.
// Run: node build-test/examples/first_npc.js ws://127.0.0.1:8765/v1/ws
import { pathToFileURL } from "node:url";

// --8<-- [start:tool-handler]
import { WebSocket } from "ws"; // Node 20; browsers and Node 22+ have a global WebSocket
import { MythicClient, ServerError, type ToolHandler } from "@mythic-npc/client";

// The game's side of a tool call: do it, then answer with the result for the NPC to voice.
const setWaypoint: ToolHandler = async (call) => {
  if (call.name !== "set_waypoint") return { status: "rejected", message: "not in this game" };
  return { status: "ok", result: { distance_m: 140 } };
};
// --8<-- [end:tool-handler]

/** Says one line to Marla and prints her reply as it streams; returns the whole turn. */
export async function firstLine(url: string, print: (text: string) => void = console.log) {
  // --8<-- [start:first-line]
  const client = new MythicClient(url, { WebSocket, toolHandler: setWaypoint });
  await client.connect();
  try {
    await client.scene("marla", { zone: "old_town", time: "21:10", objects: { player: 1.2 } });
    const turn = await client.say("marla", "Which way to Blackfen Marsh? Set a waypoint to blackfen_marsh for me.");
    for await (const event of turn) {
      if (event.type === "LLMStreamDelta") print(event.delta);
      if (event.type === "ToolCall") print(`<game> ${event.name} ${JSON.stringify(event.args)}`);
    }
    print(`[${turn.finishReason}]`);
    return turn;
  } catch (error) {
    if (error instanceof ServerError) print(`refused: ${error.code} (${error.ref})`);
    throw error;
  } finally {
    await client.close();
  }
  // --8<-- [end:first-line]
}

// --8<-- [start:lip-sync]
import { BlendShapeMap, WebAudioSpeaker, type AudioOut, type ClientEvent } from "@mythic-npc/client";

/** What lip-sync moves: a three.js mesh with morph targets (a Ready Player Me avatar's head). */
export interface Face {
  morphTargetDictionary?: Record<string, number>;
  morphTargetInfluences?: number[];
}

/** Marla's voice on `audio` (a browser's `new AudioContext()`) and her mouth on `face`. */
export function lipSync(audio: AudioOut, face: Face) {
  const speaker = new WebAudioSpeaker(audio, { npcId: "marla" });
  const map = BlendShapeMap.oculusVisemes(); // viseme_aa, viseme_PP, ...; arKit() for ARKit faces
  const targets = map.shapes.map((shape) => face.morphTargetDictionary?.[shape]);
  return {
    // The voice session's onEvent: her TTSChunks play back to back, a Cutoff silences her.
    hear: (event: ClientEvent) => speaker.hear(event),
    // Each animation frame: the mouth at what is heard now.
    frame() {
      speaker.weights(map).forEach((weight, i) => {
        const target = targets[i];
        if (target !== undefined && face.morphTargetInfluences) face.morphTargetInfluences[target] = weight;
      });
    },
  };
}
// --8<-- [end:lip-sync]

const [, script, url] = process.argv;
if (script !== undefined && url !== undefined && import.meta.url === pathToFileURL(script).href) {
  await firstLine(url, (text) => process.stdout.write(text));
}
