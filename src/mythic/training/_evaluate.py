"""`mythic eval archetype`: an archetype's adapters against the base model, in the same run.

Every probe is asked twice on the same loaded engine, greedy, with the server's own prompts:
once with the archetype's adapter and once without, so the difference is the adapter's.

- **style** (`dialogue_style`): held-out questions; a reply is in style when it uses the
  archetype's register (`STYLES`: lexicon or the NPC's catchphrases), keeps its length (and,
  for zombies, fragments of at most four words), and never steps out of the fiction.
- **consistency** (`dialogue_style`): one long scripted conversation with its history; the
  share of turns in style, less the share that repeat an earlier reply (loops).
- **lore** (`dialogue_style`): the world's lore probes for the archetype's NPCs, asked under
  the persona prompt; an adapter must not make the NPC forget its facts (`Gate.max_lore_drop`).
- **actions** (`action_policy`): held-out scenarios decided under the server's JSON schema;
  coherent when the intent is one the archetype may choose there; a `never` intent (a zombie
  trading) is counted apart as a violation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mythic.engine import ChatMessage, Engine, GenerationRequest, Priority, Sampling
from mythic.knowledge import Persona, World, intent_prompt, intent_schema, persona_prompt
from mythic.training._curate import EVAL_QUESTIONS, GREETINGS, scene_line, style_for
from mythic.training._styles import (
    OUT_OF_CHARACTER,
    SCENARIOS,
    ArchetypeStyle,
    clauses,
    words,
)

SCRIPT = (*EVAL_QUESTIONS, *GREETINGS[:4])
"""The long scripted conversation of the consistency probe."""


@dataclass(frozen=True, slots=True)
class Gate:
    """What an adapter must reach to be registered (`archetypes.gate` in mythic.yaml)."""

    min_gain: float = 0.0
    """An adapter must beat the base by more than this on its own probes."""
    min_score: float = 0.5
    """...and score at least this."""
    max_violations: int = 0
    """Never-intents chosen (a zombie trading) allowed to the action adapter."""
    max_lore_drop: float = 0.25
    """The lore probe is a regression check: the adapter may score at most this much below
    the base (it need not beat it: the style adapter is not trained on lore questions)."""


@dataclass(slots=True)
class ProbeResult:
    """One probe's score with and without the adapter (0-1, higher is better)."""

    probe: str
    task: str
    adapter: str | None
    base: float
    tuned: float | None
    n: int
    violations: tuple[int, int] = (0, 0)
    """Never-intents chosen: (base, adapter)."""
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gain(self) -> float | None:
        return None if self.tuned is None else self.tuned - self.base


@dataclass(slots=True)
class ArchetypeEval:
    """Every probe of one archetype, and whether each adapter passed the gate."""

    archetype: str
    results: list[ProbeResult]
    passed: dict[str, bool]
    reasons: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "archetype": self.archetype,
            "passed": self.passed,
            "reasons": self.reasons,
            "probes": [
                {
                    "probe": r.probe,
                    "task": r.task,
                    "adapter": r.adapter,
                    "base": round(r.base, 4),
                    "adapter_score": None if r.tuned is None else round(r.tuned, 4),
                    "gain": None if r.gain is None else round(r.gain, 4),
                    "n": r.n,
                    "violations": {"base": r.violations[0], "adapter": r.violations[1]},
                    "samples": r.samples,
                }
                for r in self.results
            ],
        }


def style_score(text: str, style: ArchetypeStyle, persona: Persona) -> float:
    """How well one reply keeps the archetype's register: the share of checks it passes."""
    if not words(text):
        return 0.0
    lowered = text.lower()
    marks = (*style.lexicon, *(p.lower() for p in persona.catchphrases))
    checks = [
        any(m.lower() in lowered for m in marks),
        len(words(text)) <= style.max_words,
        OUT_OF_CHARACTER.search(text) is None,
    ]
    if style.max_clause_words is not None:
        checks.append(all(len(words(c)) <= style.max_clause_words for c in clauses(text)))
    if style.fragments:
        checks.append("..." in text or "\u2026" in text)
    return sum(checks) / len(checks)


def _reply(engine: Engine, messages: Sequence[ChatMessage], adapter: str | None, npc: str) -> str:
    request = GenerationRequest(
        npc_id=npc,
        session_id=f"eval-{adapter or 'base'}",
        messages=list(messages),
        priority=Priority.SILVER,
        sampling=Sampling(max_tokens=64, temperature=0.0, repeat_penalty=1.1),
        adapters={adapter: 1.0} if adapter else {},
    )
    return engine.submit_sync(request).collect().text.strip()


def _decide(
    engine: Engine, persona: Persona, npc: str, context: str, adapter: str | None, seed: int
) -> dict[str, Any]:
    scene = scene_line(persona, random.Random(f"{seed}:{context}"))
    request = GenerationRequest(
        npc_id=npc,
        session_id="intent",
        messages=[
            ChatMessage("system", intent_prompt(persona, scene, context=context)),
            ChatMessage("user", "Decide."),
        ],
        priority=Priority.GOLD,
        json_schema=intent_schema(["player"]),
        sampling=Sampling(max_tokens=32, temperature=0.0),
        adapters={adapter: 1.0} if adapter else {},
    )
    result: dict[str, Any] = json.loads(engine.submit_sync(request).collect().text)
    return result


def _conversation(
    engine: Engine,
    system: ChatMessage,
    npc_id: str,
    adapter: str | None,
    style: ArchetypeStyle,
    persona: Persona,
) -> float:
    """The scripted conversation's share of turns in style, less its share of repeats."""
    history: list[ChatMessage] = []
    seen: set[str] = set()
    scores: list[float] = []
    repeats = 0
    for question in SCRIPT:
        messages = [system, *history[-12:], ChatMessage("user", question)]
        text = _reply(engine, messages, adapter, npc_id)
        key = " ".join(words(text.lower()))
        repeats += key in seen
        seen.add(key)
        history += [ChatMessage("user", question), ChatMessage("assistant", text)]
        scores.append(style_score(text, style, persona))
    return max(0.0, sum(scores) / len(scores) - repeats / len(SCRIPT))


def _style_probe(
    engine: Engine, world: World, npcs: Sequence[tuple[str, Persona]], adapter: str | None
) -> tuple[ProbeResult, ProbeResult]:
    style = style_for(npcs[0][1].archetype, [p for _, p in npcs])
    single: dict[str | None, list[float]] = {None: [], adapter: []}
    chat: dict[str | None, list[float]] = {None: [], adapter: []}
    samples: list[dict[str, Any]] = []
    for npc_id, persona in npcs:
        system = ChatMessage("system", persona_prompt(world, persona))
        for which in [None, adapter] if adapter else [None]:
            for question in EVAL_QUESTIONS:
                text = _reply(engine, [system, ChatMessage("user", question)], which, npc_id)
                single[which].append(style_score(text, style, persona))
                samples.append({"adapter": which, "question": question, "reply": text})
            chat[which].append(_conversation(engine, system, npc_id, which, style, persona))

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    n = len(EVAL_QUESTIONS) * len(npcs)
    style_result = ProbeResult(
        "style",
        "dialogue_style",
        adapter,
        mean(single[None]),
        mean(single[adapter]) if adapter else None,
        n,
        samples=samples,
    )
    chat_result = ProbeResult(
        "consistency",
        "dialogue_style",
        adapter,
        mean(chat[None]),
        mean(chat[adapter]) if adapter else None,
        len(SCRIPT) * len(npcs),
    )
    return style_result, chat_result


@dataclass(frozen=True, slots=True)
class LoreQuestion:
    """A lore probe: the NPC asked, the question, and whether a reply is correct."""

    npc: str
    question: str
    correct: Callable[[str], bool]


def _lore_probe(
    engine: Engine,
    world: World,
    questions: Sequence[LoreQuestion],
    adapter: str | None,
) -> ProbeResult:
    right: dict[str | None, int] = {None: 0, adapter: 0}
    samples: list[dict[str, Any]] = []
    for q in questions:
        system = ChatMessage("system", persona_prompt(world, world.npc(q.npc)))
        for which in [None, adapter] if adapter else [None]:
            text = _reply(engine, [system, ChatMessage("user", q.question)], which, q.npc)
            ok = q.correct(text)
            right[which] += ok
            samples.append({"adapter": which, "question": q.question, "reply": text, "ok": ok})
    n = len(questions)
    return ProbeResult(
        "lore",
        "dialogue_style",
        adapter,
        right[None] / n,
        right[adapter] / n if adapter else None,
        n,
        samples=samples,
    )


def _action_probe(
    engine: Engine, npcs: Sequence[tuple[str, Persona]], adapter: str | None, seed: int
) -> ProbeResult:
    archetype = npcs[0][1].archetype
    style = style_for(archetype, [p for _, p in npcs])
    good: dict[str | None, int] = {None: 0, adapter: 0}
    never: dict[str | None, int] = {None: 0, adapter: 0}
    samples: list[dict[str, Any]] = []
    n = 0
    for npc_id, persona in npcs:
        for scenario in SCENARIOS:
            context = scenario.contexts[-1]  # held out of training
            n += 1
            for which in [None, adapter] if adapter else [None]:
                decision = _decide(engine, persona, npc_id, context, which, seed)
                good[which] += decision["intent"] in scenario.allowed(archetype)
                never[which] += decision["intent"] in style.never
                samples.append({"adapter": which, "context": context, "decision": decision})
    return ProbeResult(
        "actions",
        "action_policy",
        adapter,
        good[None] / n,
        good[adapter] / n if adapter else None,
        n,
        (never[None], never[adapter] if adapter else 0),
        samples,
    )


def evaluate_archetype(
    engine: Engine,
    world: World,
    archetype: str,
    adapters: Mapping[str, str],
    *,
    gate: Gate | None = None,
    seed: int = 0,
    tasks: Sequence[str] = ("dialogue_style", "action_policy"),
    lore: Sequence[LoreQuestion] = (),
) -> ArchetypeEval:
    """Run `archetype`'s probes of `tasks` with and without its adapters (task -> loaded
    adapter name).

    A task without an adapter is still probed on the base model, so the report shows where
    an adapter would start from. `lore`: the world's lore probes of this archetype's NPCs.
    """
    gate = gate or Gate()
    npcs = [(i, p) for i, p in sorted(world.npcs.items()) if p.archetype == archetype]
    if not npcs:
        raise ValueError(f"world {world.name} has no NPC of archetype {archetype!r}")
    results: list[ProbeResult] = []
    if "dialogue_style" in tasks:
        results += _style_probe(engine, world, npcs, adapters.get("dialogue_style"))
        asked = [q for q in lore if q.npc in dict(npcs)]
        if asked:
            results.append(_lore_probe(engine, world, asked, adapters.get("dialogue_style")))
    if "action_policy" in tasks:
        results.append(_action_probe(engine, npcs, adapters.get("action_policy"), seed))
    passed, reasons = judge(results, adapters, gate)
    return ArchetypeEval(archetype, results, passed, reasons)


def judge(
    results: Sequence[ProbeResult], adapters: Mapping[str, str], gate: Gate
) -> tuple[dict[str, bool], dict[str, str]]:
    """Whether each adapter (task -> name) passes `gate` on its task's probes, and why not."""
    passed: dict[str, bool] = {}
    reasons: dict[str, str] = {}
    for task, name in adapters.items():
        mine = [r for r in results if r.task == task and r.tuned is not None]
        why = []
        for r in mine:
            assert r.tuned is not None and r.gain is not None
            if r.probe == "lore":
                if r.gain < -gate.max_lore_drop:
                    why.append(f"lore: {r.tuned:.2f} fell from the base's {r.base:.2f}")
                continue
            if r.gain <= gate.min_gain:
                why.append(f"{r.probe}: {r.tuned:.2f} does not beat the base's {r.base:.2f}")
            if r.tuned < gate.min_score:
                why.append(f"{r.probe}: {r.tuned:.2f} is below {gate.min_score:.2f}")
            if r.violations[1] > gate.max_violations:
                why.append(f"{r.probe}: {r.violations[1]} never-intents chosen")
        passed[name] = bool(mine) and not why
        reasons[name] = "; ".join(why) or ("passed" if mine else "no probe for this task")
    return passed, reasons
