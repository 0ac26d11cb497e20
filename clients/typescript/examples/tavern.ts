// A tavern scene from Node: the barkeep, a guard and a vampire noble at one table, the player's
// lines answered by the NPC they name or face, an NPC walking out and back in, the NPCs talking
// among themselves. The code of docs/engines/typescript.md's "A scene".
// Run: node build-test/examples/tavern.js ws://127.0.0.1:8765/v1/ws
import { pathToFileURL } from "node:url";

import { WebSocket } from "ws";
import { MythicClient, type SceneTalk } from "@mythic-npc/client";

/** Plays the tavern scene, printing each reply with who says it; the scene's talks, in order. */
export async function tavern(url: string, print: (text: string) => void = console.log) {
  // --8<-- [start:tavern]
  const client = new MythicClient(url, { WebSocket, playerId: "tavern-guest" });
  await client.connect();
  const talks: SceneTalk[] = [];
  const show = async (talk: SceneTalk) => {
    for await (const event of talk) {
      if (event.type === "SceneTurn" && event.speakers.length) print(`${event.speakers} (${event.chosen_by}):`);
      if (event.type === "LLMStreamDelta") print(event.delta);
    }
    talks.push(talk);
  };
  try {
    const scene = await client.startScene("tavern", ["marla", "captain_strand", "countess_isolde"]);
    await show(await scene.say("Captain Strand, when does the curfew begin?")); // the NPC named answers
    await show(await scene.say("What will you drink tonight?", { to: "countess_isolde" })); // the one faced
    await scene.leave("captain_strand"); // she walks out: she hears nothing more
    await show(await scene.ambient({ lines: 4, topic: "the fog tonight", opener: "marla" }));
    await scene.join("captain_strand"); // back: she hears what follows
    await show(await scene.say("Marla, one more ale before I go."));
    await scene.end("the player left the tavern");
    return talks;
  } finally {
    await client.close();
  }
  // --8<-- [end:tavern]
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const url = process.argv[2] ?? "ws://127.0.0.1:8765/v1/ws";
  tavern(url, (text) => process.stdout.write(text.endsWith(":") ? `\n${text} ` : text)).then(
    () => process.stdout.write("\n"),
    (error) => {
      console.error(error);
      process.exit(1);
    },
  );
}
