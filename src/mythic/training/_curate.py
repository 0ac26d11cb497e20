"""Training data for an archetype's adapter, curated from a world's cards and lore.

Every example is a chat (system, player, NPC) rendered later with the base model's own chat
template. The system prompts are the server's own (`persona_prompt` for replies,
`intent_prompt` for intents). Replies are trained under the persona prompt's head only (who
the NPC is and how it speaks, without the packed card and lore that follow it when served):
on 2 CPU cores a served prompt of 300-900 tokens makes a training step 3-6 times slower, and
the register the adapter learns carries over to the longer prompt (`mythic eval archetype`
scores it under the full one).

- `dialogue_style`: the player's questions (greetings, questions about the NPC, about the
  lore of its zones, about the people and places its rules name) answered in the archetype's
  register (`STYLES`): the facts come from the cards and lore, the wording from the style.
- `action_policy`: scenarios ("the player offers a purse of silver") answered with the
  decision JSON an archetype of this kind chooses (zombies never trade).

Extra examples (bronze-generated dialogues, hand-written lines) come in as JSON lines; they
are validated like any other input and counted by source. An extra example may carry the
`context` its reply was written with (the lore and scene the server told the teacher,
`mythic distill`): it is then trained as served, a system message of its own just before the
player's line, so the adapter learns to answer from the lore it is given, not the world's
facts by heart.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mythic._errors import MythicError
from mythic.engine import ChatMessage
from mythic.knowledge import Persona, World, intent_prompt, persona_prompt
from mythic.training._styles import SCENARIOS, STYLES, ArchetypeStyle, fragments, words

Task = Literal["dialogue_style", "action_policy"]
MAX_CONTEXT_CHARS = 16_000
"""The longest `context` an extra example may carry."""
CONTEXT_CHARS = 1_500
"""How much of an extra example's context it is trained with (about 400 tokens): the head of
the lore, where retrieval puts the lines that answer. A longer example loses the start of its
prompt to `TrainSettings.max_tokens` and makes every step slower."""
TASKS: tuple[Task, ...] = ("dialogue_style", "action_policy")
"""The adapter tasks curation can build data for."""

GREETINGS = (
    "Good evening.",
    "Who are you?",
    "What do you want?",
    "Can you help me?",
    "Any news tonight?",
    "What is this place?",
    "Are you dangerous?",
    "What do you fear?",
    "Tell me about yourself.",
    "I'm new in town.",
    "Do you have a name?",
    "What do you do here?",
    "Is it safe around here?",
    "Where should I go next?",
    "Goodbye for now.",
    "You look troubled.",
)
"""Questions any NPC gets; evaluation asks others (`EVAL_QUESTIONS`)."""

EVAL_QUESTIONS = (
    "Hello there, stranger.",
    "What brings you out tonight?",
    "How long have you been here?",
    "Tell me something about this city.",
    "What should a traveller know?",
    "Who rules this place?",
    "What happened to you?",
    "Why should I trust you?",
)
"""Held out from training: the style evaluation asks these."""

_SAY_VERBS = re.compile(r"^(say|says|explain|warn|tell|insist)( that)? ", re.I)
_META_VERBS = re.compile(r"^(mention|answer|point|quote|refer|use|speak|call)\b", re.I)
_QUOTED = re.compile(r"(?<!\w)'([^']{3,}?)'(?!\w)|\"([^\"]{3,})\"")
_TOPIC = re.compile(r"\b(?:the |The )?(?:[A-Z][\w']+)(?:[ -](?:of |the )?[A-Z][\w']+)*")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


class CurationError(MythicError):
    """Training data cannot be built: an archetype with no NPCs, an unknown task, or a bad
    extra-examples file (every problem listed with its line)."""


@dataclass(frozen=True, slots=True)
class Example:
    """One training chat: the reply the adapter learns is the last message."""

    task: str
    npc: str
    messages: tuple[ChatMessage, ...]
    source: str

    def to_json(self) -> dict[str, object]:
        return {
            "task": self.task,
            "npc": self.npc,
            "source": self.source,
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
        }


@dataclass(frozen=True, slots=True)
class Dataset:
    """Curated examples of one archetype and task, split into training and held-out sets."""

    archetype: str
    task: str
    train: tuple[Example, ...]
    held_out: tuple[Example, ...]
    sources: dict[str, int] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """sha256 of the examples: names the exact data an adapter was trained on."""
        h = hashlib.sha256()
        for ex in (*self.train, *self.held_out):
            h.update(json.dumps(ex.to_json(), sort_keys=True).encode())
        return h.hexdigest()

    def describe(self) -> str:
        parts = ", ".join(f"{n} {src}" for src, n in sorted(self.sources.items()))
        return (
            f"{len(self.train)} training + {len(self.held_out)} held-out examples "
            f"({parts}); sha256 {self.digest[:12]}"
        )

    def write_jsonl(self, path: Path) -> None:
        with path.open("w", encoding="utf-8") as f:
            for split, items in (("train", self.train), ("held_out", self.held_out)):
                for ex in items:
                    f.write(json.dumps({"split": split, **ex.to_json()}) + "\n")


class _ExtraLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    npc: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
    question: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        max_length=2000
    )
    reply: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        max_length=2000
    )
    source: str = "extra"
    context: str | None = Field(default=None, max_length=MAX_CONTEXT_CHARS)


@dataclass(frozen=True, slots=True)
class ExtraDialogue:
    """A dialogue line an adapter learns besides the card's: the player's `question`, the
    NPC's `reply`, and the `context` (lore and scene) the reply was written with, if any."""

    npc: str
    question: str
    reply: str
    source: str = "extra"
    context: str | None = None


def load_extra(path: Path, world: World) -> list[ExtraDialogue]:
    """Read extra dialogue examples: JSON lines of {npc, question, reply[, source, context]}.

    Raises `CurationError` listing every bad line (not JSON, missing fields, an NPC the world
    does not have).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CurationError(f"cannot read extra examples {path}: {exc}") from None
    out: list[ExtraDialogue] = []
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = _ExtraLine.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            problems.append(f"{path}:{n}: {where}: {first['msg']}")
            continue
        if line.npc not in world.npcs:
            problems.append(f"{path}:{n}: npc {line.npc!r} is not in world {world.name}")
            continue
        out.append(
            ExtraDialogue(line.npc, line.question, line.reply, line.source, line.context or None)
        )
    if problems:
        raise CurationError(
            f"{len(problems)} bad line(s) in {path}:\n  " + "\n  ".join(problems[:20])
        )
    return out


def style_for(archetype: str, personas: Sequence[Persona]) -> ArchetypeStyle:
    """The built-in style of `archetype`, or one made from its NPCs' catchphrases."""
    if archetype in STYLES:
        return STYLES[archetype]
    phrases = tuple(p for persona in personas for p in persona.catchphrases)
    return ArchetypeStyle(
        openers=(),
        closers=tuple(_capital(p).rstrip(".") + "." for p in phrases),
        lexicon=phrases,
    )


def curate(
    world: World,
    archetype: str,
    task: str,
    *,
    seed: int = 0,
    held_out: float = 0.1,
    extra: Iterable[ExtraDialogue] = (),
    synthetic: bool = True,
) -> Dataset:
    """Build the training data of `archetype`'s `task` adapter from `world`: the lines built
    from its cards and lore (`synthetic`), plus `extra` dialogues, such as a teacher model's
    (`mythic distill`).

    Raises:
        CurationError: the task is not one of `TASKS`, or no NPC of the world has the
            archetype.
    """
    if task not in TASKS:
        raise CurationError(
            f"no training data recipe for task {task!r}", fix=f"use one of: {', '.join(TASKS)}"
        )
    personas = [(npc_id, p) for npc_id, p in sorted(world.npcs.items()) if p.archetype == archetype]
    if not personas:
        have = sorted({p.archetype for p in world.npcs.values()})
        raise CurationError(
            f"world {world.name} has no NPC of archetype {archetype!r}",
            fix=f"add a persona card with `archetype: {archetype}`, or use one of: "
            + ", ".join(have),
        )
    rng = random.Random(f"{seed}:{archetype}:{task}")
    style = style_for(archetype, [p for _, p in personas])
    examples: list[Example] = []
    fixed_held_out: list[Example] = []
    for npc_id, persona in personas:
        if task == "dialogue_style":
            if synthetic:
                examples += _dialogue(world, npc_id, persona, style, rng)
        else:
            train, hold = _actions(npc_id, persona, rng)
            examples += train
            fixed_held_out += hold
    if task == "dialogue_style":
        for line in extra:
            persona = world.npcs[line.npc]
            if persona.archetype == archetype:
                examples.append(
                    _chat(
                        task,
                        line.npc,
                        _reply_prompt(world, persona),
                        line.question,
                        line.reply,
                        line.source,
                        _context_head(line.context),
                    )
                )
    if not examples and not fixed_held_out:
        raise CurationError(
            f"no {task} examples for archetype {archetype!r} in world {world.name}",
            fix="give it extra dialogues of its NPCs, or build them from the cards (synthetic)",
        )
    rng.shuffle(examples)
    cut = 0 if fixed_held_out else max(1, round(len(examples) * held_out))
    hold_out = tuple(fixed_held_out) or tuple(examples[:cut])
    kept = tuple(examples[cut:])
    sources = Counter(ex.source for ex in (*kept, *hold_out))
    return Dataset(archetype, task, kept, hold_out, dict(sources))


def _chat(
    task: str,
    npc: str,
    system: str,
    user: str,
    reply: str,
    source: str,
    context: str | None = None,
) -> Example:
    told = (ChatMessage("system", context),) if context else ()
    return Example(
        task,
        npc,
        (
            ChatMessage("system", system),
            *told,
            ChatMessage("user", user),
            ChatMessage("assistant", reply),
        ),
        source,
    )


def _context_head(context: str | None) -> str | None:
    """The first lines of `context` that fit `CONTEXT_CHARS` (retrieval puts the lines that
    answer first), at least one line cut at a word."""
    if not context or not context.strip():
        return None
    kept: list[str] = []
    size = 0
    for line in context.strip().splitlines():
        if size + len(line) + 1 > CONTEXT_CHARS:
            if not kept:
                kept.append(line[:CONTEXT_CHARS].rsplit(" ", 1)[0])
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept).strip() or None


def _lower_article(topic: str) -> str:
    return "the " + topic[4:] if topic.startswith("The ") else topic


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(text: str, limit: int) -> str:
    """The first sentence of `text`, cut to `limit` words."""
    first = _SENTENCE.split(text.strip())[0]
    ws = first.split()
    if len(ws) > limit:
        first = " ".join(ws[:limit]).rstrip(",;:") + "."
    if first[-1:] not in ".!?":
        first += "."
    return first


def _topic(text: str) -> str | None:
    for match in _TOPIC.finditer(text):
        name = match.group(0)
        if len(words(name)) >= 2 or not text.startswith(name):
            return name
    return None


def _facts(world: World, persona: Persona) -> list[tuple[str | None, str, str]]:
    """(topic, fact, source) from the NPC's rules, and the lore of its zones."""
    out: list[tuple[str | None, str, str]] = []
    for rule in persona.rules:
        quoted = _QUOTED.search(rule)
        # The rule's first word is its verb ("Uphold the Silver Accord"), never the topic.
        topic = _topic(_QUOTED.sub("", rule).split(" ", 1)[-1])
        if _META_VERBS.match(rule):
            if quoted:
                out.append((topic, quoted.group(1) or quoted.group(2), "card"))
            continue
        said = _SAY_VERBS.sub("", rule)
        if said != rule:
            out.append((topic, _capital(said), "card"))
        else:
            out.append((topic, "I " + rule[:1].lower() + rule[1:], "card"))
    for zone in persona.zones_known():
        for doc in world.lore_for(zone):
            prose = " ".join(
                line for line in doc.text.splitlines() if not line.lstrip().startswith("#")
            )
            sentences = [s for s in _SENTENCE.split(prose) if len(words(s)) > 4]
            for s in sentences[:4]:
                out.append((doc.title, s.strip(), "lore"))
    return out


def speak(style: ArchetypeStyle, persona: Persona, fact: str | None, rng: random.Random) -> str:
    """Say `fact` (or only greet, when None) in `style`, with the NPC's own catchphrases."""
    closers = (*style.closers, *(_capital(p).rstrip(".") + "." for p in persona.catchphrases))
    if style.fragments:
        frags = fragments(fact, max_words=style.max_clause_words or 4) if fact else []
        frags = frags[: rng.choice((2, 3))]
        ending = [c.rstrip(". ").lower() for c in rng.sample(closers, k=1)] if closers else []
        opener = (
            [rng.choice(style.openers).strip(". ")] if style.openers and rng.random() < 0.3 else []
        )
        parts = [p.lower() for p in (*opener, *frags, *ending) if p]
        text = "... ".join(parts[:4])
        text = _capital(text.rstrip(".")) + "..."
        return text
    parts = []
    if style.openers:
        parts.append(rng.choice(style.openers))
    if fact:
        said = _sentence(fact, max(8, style.max_words - 16))
        if parts and parts[-1].endswith(","):
            said = said[:1].lower() + said[1:] if not said.startswith("I ") else said
        parts.append(said)
    fresh = [c for c in closers if not any(_same(c, p) for p in parts)]
    if fresh and (not fact or rng.random() < 0.7):
        parts.append(rng.choice(fresh))
    return " ".join(parts)


def _same(a: str, b: str) -> bool:
    x, y = " ".join(words(a.lower())), " ".join(words(b.lower()))
    return x in y or y in x


def _reply_prompt(world: World, persona: Persona) -> str:
    return persona_prompt(world, persona, full=False)


def _dialogue(
    world: World, npc_id: str, persona: Persona, style: ArchetypeStyle, rng: random.Random
) -> list[Example]:
    system = _reply_prompt(world, persona)
    out: list[Example] = []
    facts = _facts(world, persona)
    for question in GREETINGS:
        # A fact about the NPC more often than not: with greetings answered by catchphrases
        # alone (30% facts), a 25-step vampire adapter answered everything "My dear, the
        # night is young." and its consistency fell from 0.50 to 0.25.
        about_self = [f for f in facts if f[2] == "card"]
        fact = rng.choice(about_self)[1] if about_self and rng.random() < 0.6 else None
        out.append(
            _chat(
                "dialogue_style", npc_id, system, question, speak(style, persona, fact, rng), "card"
            )
        )
    for topic, fact, source in facts:
        asks = (
            [
                f"What do you know about {_lower_article(topic)}?",
                f"Tell me about {_lower_article(topic)}.",
                f"What of {_lower_article(topic)}?",
                f"Have you heard of {_lower_article(topic)}?",
            ]
            if topic
            else ["What are your ways?", "What rules do you keep?", "What should I know about you?"]
        )
        for question in rng.sample(asks, k=3):
            out.append(
                _chat(
                    "dialogue_style",
                    npc_id,
                    system,
                    question,
                    speak(style, persona, fact, rng),
                    source,
                )
            )
    return out


def scene_line(persona: Persona, rng: random.Random) -> str:
    """A scene description in the form the server's scene tracker writes."""
    parts = []
    if persona.zone:
        parts.append(f"zone {persona.zone}")
    parts.append(f"time {rng.choice(('dusk', 'night', 'midnight', 'dawn', 'evening'))}")
    near = [f"player ({rng.randint(1, 6)} away)"]
    if rng.random() < 0.5:
        near.append(
            f"{rng.choice(('guard_1', 'crow', 'lantern', 'cart'))} ({rng.randint(4, 20)} away)"
        )
    parts.append("nearby: " + ", ".join(near))
    return "Scene now: " + "; ".join(parts)


def decision_reply(intent: str, target: str | None, urgency: int) -> str:
    """The decision JSON, formatted as the constrained sampler writes it."""
    return json.dumps({"intent": intent, "target": target, "urgency": urgency})


def _actions(
    npc_id: str, persona: Persona, rng: random.Random
) -> tuple[list[Example], list[Example]]:
    train: list[Example] = []
    held: list[Example] = []
    for scenario in SCENARIOS:
        intent = scenario.allowed(persona.archetype)[0]
        reply = decision_reply(intent, scenario.target, scenario.urgency)
        for i, context in enumerate(scenario.contexts):
            repeats = 1 if i == len(scenario.contexts) - 1 else 3
            for _ in range(repeats):
                system = intent_prompt(persona, scene_line(persona, rng), context=context)
                example = _chat("action_policy", npc_id, system, "Decide.", reply, "scenario")
                (held if i == len(scenario.contexts) - 1 else train).append(example)
    return train, held
