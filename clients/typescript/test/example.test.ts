// The example of docs/engines/typescript.md, run against the real server of the conformance
// suite (MYTHIC_URL): the line is answered, the tool handler ran, the result was voiced.
import assert from "node:assert/strict";
import { test } from "node:test";

import { firstLine } from "../examples/first_npc.js";

test("example: a first NPC line with a tool handler", async () => {
  const url = process.env.MYTHIC_URL;
  assert.ok(url, "set MYTHIC_URL to a running `mythic serve`");
  const printed: string[] = [];
  const turn = await firstLine(url, (text) => printed.push(text));
  assert.deepEqual(turn.toolCalls.map((c) => c.name), ["set_waypoint"]);
  assert.ok(turn.text.trim() && ["stop", "length"].includes(turn.finishReason ?? ""), printed.join(""));
  assert.ok(printed.includes('<game> set_waypoint {"target":"blackfen_marsh"}'), printed.join("|"));
});
