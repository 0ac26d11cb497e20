// The tavern example of docs/engines/typescript.md, run against the real server of the
// conformance suite (MYTHIC_URL): each line answered by the NPC it names or faces, the NPCs
// talking among themselves, every talk closed.
import assert from "node:assert/strict";
import { test } from "node:test";

import { tavern } from "../examples/tavern.js";

test("example: a tavern scene", async () => {
  const url = process.env.MYTHIC_URL;
  assert.ok(url, "set MYTHIC_URL to a running `mythic serve`");
  const printed: string[] = [];
  const talks = await tavern(url, (text) => printed.push(text));
  const said = printed.join("");
  assert.equal(talks.length, 4, said);
  assert.deepEqual(talks[0]!.speakers.slice(0, 1), ["captain_strand"], said);
  assert.equal(talks[0]!.turns[0]!.chosen_by, "name");
  assert.deepEqual(talks[1]!.speakers.slice(0, 1), ["countess_isolde"], said);
  assert.equal(talks[1]!.turns[0]!.chosen_by, "to");
  assert.deepEqual(talks[2]!.speakers.slice(0, 1), ["marla"], said);
  assert.ok(talks[2]!.speakers.every((npc) => npc !== "captain_strand"), said); // she was out
  assert.deepEqual(talks[3]!.speakers.slice(0, 1), ["marla"], said);
  for (const talk of talks) {
    assert.ok(talk.over && talk.replies.every((r) => ["stop", "length"].includes(r.finishReason ?? "")), said);
  }
  assert.ok(talks[0]!.replies[0]!.text.trim(), said);
});
