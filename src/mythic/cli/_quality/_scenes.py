"""The scorecard's scene checks: in scenes of three of the world's NPCs over the real server's
WebSocket, the NPC a line names answers it, every line is its own NPC's (none written as
another character's), an NPC outside the scene knows nothing said in it, and a 30-line
ambient scene (the NPCs talking among themselves) does not loop.

Nothing here names a world: the groups are the world's NPCs in order, the lines are the
templates' small talk, and the fact told in a scene is a made-up name no card or lore says.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mythic.cli._quality._judge import Reply, judge
from mythic.cli._quality._probe import NotChecked, NPCPlan, Plan, Probe
from mythic.cli._quality._templates import Templates
from mythic.dialogue import begins_as, normalise, repeats, says_back, sentences

AMBIENT_LINES = 30
"""Lines of each scene's ambient exchange."""
GROUP = 3
"""NPCs in each scene."""
MOST_SCENES = 2
"""Scenes per world."""
WAIT_S = 300.0
"""A bound on every wait for the server."""

_SYLLABLES = ("vel", "dra", "mon", "ost", "ery", "quin", "tal", "bry", "sor", "ik")


@dataclass(slots=True)
class ScenePlan:
    """One scene of the check: its NPCs, the NPC outside it, and its lines."""

    id: str
    npcs: tuple[str, ...]
    outsider: str | None
    told: Probe
    """A made-up fact told to the scene (to its first NPC): the outsider must not know it."""
    addressed: list[Probe] = field(default_factory=list)
    """A line naming each NPC of the scene."""
    leak: Probe | None = None
    """The outsider asked, one-to-one, about the fact told."""
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per NPC of the scene, the name forms of the others (a line labelled with one is
    written as theirs)."""


def made_up_name(known: frozenset[str], salt: int) -> str:
    """A two-word name of the syllables above that the world's words do not hold."""
    combos = itertools.product(_SYLLABLES, repeat=4)
    for a, b, c, d in itertools.islice(combos, 997 * salt, None):
        if len({a, b, c, d}) < 4:
            continue  # "Velvel Velvele" reads as a stammer, not a name
        first, last = (a + b).capitalize(), (c + d + "e").capitalize()
        if first.lower() not in known and last.lower() not in known:
            return f"{first} {last}"
    return "Velmon Ostikke"


def _address(npc: NPCPlan, group: Sequence[NPCPlan]) -> str:
    """How a line names `npc` among `group`: its shortest name form no other member has."""
    from mythic.scenes import address_forms

    theirs = {
        f.lower()
        for other in group
        if other.npc != npc.npc
        for f in address_forms(other.persona.name, other.persona.backstory)
    }
    mine = address_forms(npc.persona.name, npc.persona.backstory)
    unique = [f for f in mine if f.lower() not in theirs and not f.lower().startswith("the ")]
    return min(unique, key=len) if unique else npc.persona.name.split(",")[0].strip()


def scene_plans(plan: Plan, templates: Templates) -> list[ScenePlan]:
    """The scenes of the check: the plan's NPCs in groups of three (at most `MOST_SCENES`),
    each with an NPC outside it; what could not be checked goes to `plan.not_checked`."""
    from mythic.scenes import address_forms

    npcs = plan.npcs
    if len(npcs) < GROUP:
        plan.not_checked.append(
            NotChecked(None, "scenes", f"{len(npcs)} NPC(s) chosen; a scene of the check has 3")
        )
        return []
    out: list[ScenePlan] = []
    for k in range(min(MOST_SCENES, len(npcs) // GROUP)):
        group = npcs[k * GROUP : (k + 1) * GROUP]
        rest = [n for n in npcs if n not in group]
        outsider = rest[0] if rest else None
        made = made_up_name(plan.known, k)
        first = group[0]
        told = Probe(
            first.npc,
            "scenes",
            f"{_address(first, group)}, I met a traveller on the road today. Her name was {made}.",
            "template",
            "told",
        )
        scene = ScenePlan(f"quality-scene-{k + 1}", tuple(n.npc for n in group), None, told)
        for i, npc in enumerate(group):
            talk = templates.small_talk[(k * GROUP + i) % len(templates.small_talk)]
            question = f"{_address(npc, group)}, {talk[0].lower()}{talk[1:]}"
            scene.addressed.append(Probe(npc.npc, "scenes", question, "template", "addressed"))
            scene.names[npc.npc] = tuple(
                sorted(
                    {
                        f
                        for other in group
                        if other.npc != npc.npc
                        for f in address_forms(other.persona.name, other.persona.backstory)
                        if not f.lower().startswith("the ")
                    },
                    key=len,
                    reverse=True,
                )
            )
        if outsider is None:
            plan.not_checked.append(
                NotChecked(None, "scenes", "no NPC outside the scene to ask about it")
            )
        else:
            scene.outsider = outsider.npc
            scene.leak = Probe(
                outsider.npc,
                "scenes",
                "What was the name of the traveller I met on the road today?",
                "template",
                "leak",
                forbid=tuple(made.split()),
            )
        out.append(scene)
    return out


def own_line(text: str, others: Sequence[str]) -> bool:
    """Whether `text` is its NPC's own line: no sentence of it labelled as another
    character's ("Marla: ...", "**Edda**:")."""
    if not others:
        return True
    names = "|".join(re.escape(f) for f in others)
    label = re.compile(rf"(?:^|[\n.!?]\s*)\**\s*(?:{names})\**\s*:", re.IGNORECASE)
    return label.search(text) is None


def ambient_stats(lines: Sequence[tuple[str, str]], asked: int) -> dict[str, Any]:
    """Loops in an ambient exchange ((speaker, line) in order): lines with a sentence that
    says an earlier sentence of the scene again (anyone's; a short one word for word, "No,
    no."), repeats it near-verbatim, begins as it did, or says it again before going on;
    and its distinct-2."""
    loops: list[dict[str, str]] = []
    earlier: list[str] = []
    bigrams: list[tuple[str, str]] = []
    for speaker, line in lines:
        own = sentences(line) or [line]
        for sentence in own:
            same = next((e for e in earlier if normalise(e) == normalise(sentence)), None)
            again = (
                same
                or repeats(sentence, earlier)
                or begins_as(sentence, earlier)
                or says_back(sentence, earlier)
            )
            if again is not None:
                loops.append({"npc": speaker, "line": line, "repeats": again})
                break
        earlier += own
        words = normalise(line).split()
        bigrams += list(itertools.pairwise(words))
    return {
        "asked": asked,
        "said": len(lines),
        "loops": loops,
        "distinct_2": round(len(set(bigrams)) / len(bigrams), 4) if bigrams else None,
        "lines": [{"npc": s, "line": t} for s, t in lines],
    }


OnSceneReply = Callable[[str, Reply], None]


@dataclass(slots=True)
class _Turn:
    speakers: tuple[str, ...] = ()
    by: dict[str, list[str]] = field(default_factory=dict)
    finish: str | None = None
    error: str | None = None

    def text(self, npc_id: str) -> str:
        return "".join(self.by.get(npc_id, [])).strip()


class SceneRun:
    """The scene checks of one configuration, over a served world's WebSocket."""

    def __init__(self, address: str, plan: Plan, on_reply: OnSceneReply | None = None) -> None:
        self.address = address
        self.plan = plan
        self.on_reply = on_reply
        self.npcs = {n.npc: n for n in plan.npcs}

    async def run(
        self, scenes: Sequence[ScenePlan], replies: dict[str, list[Reply]]
    ) -> list[dict[str, Any]]:
        """Play every scene; each reply goes to its NPC's list. Returns the ambient stats."""
        stats = []
        for scene in scenes:
            stats.append(await self._scene(scene, replies))
        return stats

    async def _scene(self, scene: ScenePlan, replies: dict[str, list[Reply]]) -> dict[str, Any]:
        from websockets.asyncio.client import connect

        async with connect(f"ws://{self.address}/v1/ws", max_size=1 << 24) as ws:
            await ws.send(_frame("SessionStart"))
            welcome = await self._until(ws, "Welcome")
            session = welcome["session_id"]
            await ws.send(
                _frame(
                    "SceneStart",
                    scene_id=scene.id,
                    session_id=session,
                    npcs=list(scene.npcs),
                    max_exchanges=0,
                )
            )
            await self._until(ws, "SceneState")
            for n, probe in enumerate([scene.told, *scene.addressed]):
                turn_id = f"{scene.id}-{n}"
                started = time.perf_counter()
                await ws.send(
                    _frame(
                        "SceneLine",
                        scene_id=scene.id,
                        session_id=session,
                        turn_id=turn_id,
                        text=probe.question,
                    )
                )
                turn = await self._turn(ws, turn_id)
                speaker = turn.speakers[0] if turn.speakers else probe.npc
                reply = Reply(probe, turn.text(speaker), time.perf_counter() - started)
                reply.error = turn.error
                self._judge(reply, speaker, scene)
                reply.checks["addressed"] = turn.speakers == (probe.npc,) and set(turn.by) <= {
                    probe.npc
                }
                self._keep(speaker, reply, replies)
            if scene.leak is not None:
                turn_id = f"{scene.id}-leak"
                started = time.perf_counter()
                await ws.send(
                    _frame(
                        "PlayerUtterance",
                        npc_id=scene.leak.npc,
                        session_id=session,
                        turn_id=turn_id,
                        text=scene.leak.question,
                    )
                )
                turn = await self._turn(ws, turn_id)
                text = turn.text(scene.leak.npc)
                reply = Reply(scene.leak, text, time.perf_counter() - started, error=turn.error)
                judge(reply, self.npcs[scene.leak.npc], self.plan)
                said = normalise(text).split()
                reply.checks = {
                    "no_leak": turn.error is None
                    and not any(w.lower() in said for w in scene.leak.forbid)
                }
                self._keep(scene.leak.npc, reply, replies)
            lines = await self._ambient(ws, scene, session, replies)
            await ws.send(_frame("SceneEnd", scene_id=scene.id, session_id=session))
        return {"scene": scene.id, "npcs": list(scene.npcs)} | ambient_stats(lines, AMBIENT_LINES)

    async def _ambient(
        self, ws: Any, scene: ScenePlan, session: str, replies: dict[str, list[Reply]]
    ) -> list[tuple[str, str]]:
        base = f"{scene.id}-amb"
        await ws.send(
            _frame(
                "SceneAmbient",
                scene_id=scene.id,
                session_id=session,
                turn_id=base,
                lines=AMBIENT_LINES,
                priority="silver",
            )
        )
        lines: list[tuple[str, str]] = []
        for k in range(1, AMBIENT_LINES + 1):
            started = time.perf_counter()
            turn = await self._turn(ws, f"{base}.{k}", ends=base)
            if not turn.speakers:
                break  # the exchange is over: a SceneTurn with no speakers
            speaker = turn.speakers[0]
            text = turn.text(speaker)
            probe = Probe(speaker, "scenes", "(ambient)", "template", "ambient")
            reply = Reply(probe, text, time.perf_counter() - started, error=turn.error)
            self._judge(reply, speaker, scene)
            self._keep(speaker, reply, replies)
            if turn.finish not in ("stop", "length"):
                break
            if text:  # an NPC with nothing to say passes the line on
                lines.append((speaker, text))
        return lines

    def _judge(self, reply: Reply, speaker: str, scene: ScenePlan) -> None:
        npc = self.npcs.get(speaker)
        if npc is not None:
            judge(reply, npc, self.plan)
        # An empty line is no one's (the exchange ends there: `ambient_said` counts it).
        reply.checks = {
            "own_line": reply.error is None and own_line(reply.text, scene.names.get(speaker, ()))
        }

    def _keep(self, npc_id: str, reply: Reply, replies: dict[str, list[Reply]]) -> None:
        replies.setdefault(npc_id, []).append(reply)
        if self.on_reply is not None:
            self.on_reply(npc_id, reply)

    async def _until(self, ws: Any, kind: str) -> dict[str, Any]:
        while True:
            message = await self._recv(ws)
            if message.get("type") == kind:
                return message
            if message.get("type") == "Error":
                raise RuntimeError(f"the server refused: {message.get('message')}")

    async def _turn(self, ws: Any, turn_id: str, *, ends: str | None = None) -> _Turn:
        """Everything of `turn_id` up to its final delta: who answers, what each NPC said.
        `ends`: an ambient exchange's turn; a SceneTurn of no speakers for one of its lines
        says it is over (the turn comes back with no speakers)."""
        turn = _Turn()
        while True:
            message = await self._recv(ws)
            kind = message.get("type")
            if (
                kind == "SceneTurn"
                and ends is not None
                and not message.get("speakers")
                and str(message.get("turn_id", "")).startswith(ends)
            ):
                return turn
            if kind == "SceneTurn" and turn_id in message.get("turn_ids", ()):
                turn.speakers = tuple(message["speakers"])
            elif kind == "LLMStreamDelta" and message.get("turn_id") == turn_id:
                turn.by.setdefault(message["npc_id"], []).append(message.get("delta", ""))
                if not turn.speakers and message.get("npc_id"):
                    turn.speakers = (message["npc_id"],)
                if message.get("final"):
                    turn.finish = message.get("finish_reason")
                    return turn
            elif kind == "Error" and message.get("turn_id") in (turn_id, None):
                turn.error = f"{message.get('code')}: {message.get('message')}"
                return turn
            elif kind == "SceneEnd":
                turn.error = "the scene ended"
                return turn

    @staticmethod
    async def _recv(ws: Any) -> dict[str, Any]:
        async with asyncio.timeout(WAIT_S):
            data: dict[str, Any] = json.loads(await ws.recv())
            return data


def _frame(kind: str, **fields: Any) -> str:
    return json.dumps({"schema_version": "v1", "type": kind, **fields})
