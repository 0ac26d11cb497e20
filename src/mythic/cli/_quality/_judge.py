"""Judging a reply: every check of the scorecard on one line an NPC said."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mythic.cli._eval import matches
from mythic.cli._quality._probe import NPCPlan, Plan, Probe, ngrams
from mythic.cli._quality._templates import DEFAULT_MAX_WORDS, NUMBER_WORDS
from mythic.dialogue import (
    Secret,
    admitted,
    affirmed,
    assistant_phrases,
    narrates_self,
    normalise,
    repeats,
    sentences,
    stepped_out,
    strange_name,
)

# Assistant phrasing the shared list (`mythic.dialogue.ASSISTANT_SPEAK`) does not have yet,
# seen in this scorecard's runs: counted with it, under these labels.
MORE_ASSISTANT_SPEAK: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(pattern, re.IGNORECASE))
    for label, pattern in (
        ("here's the code",
         r"\bhere'?s (a|an|the|some) (simple |quick |short |small )?(python |javascript )?"
         r"(function|code|script|snippet|implementation|program)\b"),
        ("programming",
         r"(?-i:\b(Python|JavaScript|TypeScript|C\+\+|SQL|HTML)\b)"
         r"|\b(programming language|source code)\b|`[^`\n]{1,60}`"),
    )
)  # fmt: skip


# A place asked the way to is answered with a direction or a place's name.
_DIRECTION = re.compile(
    r"\b(left|right|north|south|east|west|north-?east|north-?west|south-?east|south-?west|"
    r"straight|road|street|lane|bridge|gate|path|track|follow|cross|across|past|through|along|"
    r"turn|miles?|walk|head|towards?|beyond|behind|stairs|steps|upstream|downstream|corner)\b",
    re.IGNORECASE,
)

_COIN_WORDS = ("coin", "coins", "penny", "pennies", "gold", "silver", "copper")


@dataclass(slots=True)
class Reply:
    """One line said, what came back, and what it passed."""

    probe: Probe
    text: str
    seconds: float
    checks: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    intent: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    assistant: list[str] = field(default_factory=list)
    """Labels of the shared assistant-speak list (`ASSISTANT_SPEAK`) the reply matches."""
    more_assistant: list[str] = field(default_factory=list)
    """Labels of this scorecard's additions (`MORE_ASSISTANT_SPEAK`, `prompt echo`)."""
    echo: str | None = None
    """The words of its instructions the reply repeats."""
    narration: str | None = None
    """The words where the reply speaks of its NPC in the third person."""
    words: int = 0
    limit: int = DEFAULT_MAX_WORDS
    """The NPC's length limit, in words."""
    caught: list[str] = field(default_factory=list)
    """What the server's line filter caught in this reply's tries (each generated again)."""
    context: str | None = None
    """The lore and scene the server told the model with the line (its `last_context`)."""

    @property
    def passed(self) -> bool:
        return self.error is None and all(self.checks.values())


def expected(probe: Probe, text: str) -> bool:
    """Every `expect` group of the probe matches the reply."""
    return all(any(matches(m, text) for m in group) for group in probe.expect)


def has_amount(text: str, units: Sequence[str] = ()) -> bool:
    """The reply names an amount: a number, or "a"/"one" and a word of money."""
    if re.search(r"\b\d+\b", text) or re.search(
        r"\b(" + "|".join(w for w in NUMBER_WORDS if w != "one") + r")\b", text, re.IGNORECASE
    ):
        return True
    money = "|".join([*(re.escape(u) for u in units), *_COIN_WORDS])
    return (
        re.search(rf"\b(a|an|one|half an?)\s+(?:[\w'-]+\s+)?(?:{money})\b", text, re.IGNORECASE)
        is not None
    )


def gives_way(text: str, places: Sequence[str], heard: str = "") -> bool:
    """The reply gives a direction, or names a place of the world that the player did not
    name (echoing "How do I get to X?" as "To get to X..." is no answer)."""
    asked = f" {normalise(heard)} "
    echoed = [p for p in places if normalise(p) and f" {normalise(p)} " in asked]
    for place in echoed:  # "Ferry Steps" said back is no direction ("steps")
        text = re.sub(re.escape(place), " ", text, flags=re.IGNORECASE)
    if _DIRECTION.search(text):
        return True
    said = f" {normalise(text)} "
    return any(f" {normalise(p)} " in said for p in places if normalise(p) and p not in echoed)


def more_assistant_phrases(text: str) -> list[str]:
    """The labels of `MORE_ASSISTANT_SPEAK` that `text` matches."""
    return [label for label, pattern in MORE_ASSISTANT_SPEAK if pattern.search(text)]


ASSENT = re.compile(
    r"^\W*(?:certainly|sure|absolutely|of course|okay|ok|gladly|happy to|i'?d be happy)\b"
    r"(?!,? not\b)|\b(?:need help with|help you with|provide me with)\b",
    re.IGNORECASE,
)
"""Taking up a request that a person of the world would not ("Certainly!", "Sure, here it
is:", "What do you need help with?")."""

_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")


def went_along(text: str, asked: str, known: frozenset[str] = frozenset()) -> str | None:
    """How a reply to an off-topic or injection line (`asked`) goes along with it, even in the
    character's words, or None: it assents ("Certainly!"), steps out of its world
    (`stepped_out`: the real world's words, the sum worked), names what neither its world's
    texts (`known`) nor the player said ("the Norwegian national team"), or, asked a sum,
    gives a number the player did not ("17 times 23 equals 401": working it, if badly)."""
    if ASSENT.search(text):
        return "assents"
    out = stepped_out(text, asked, asked, known)
    if out is not None:
        return out
    name = strange_name(text, known, asked) if known else None
    if name is not None:
        return f"names {name}"
    asked_numbers = set(_DIGITS.findall(asked))
    if len(asked_numbers) >= 2:
        said = [n for n in _DIGITS.findall(text) if n not in asked_numbers]
        if said:
            return f"works the numbers: {said[0]}"
    return None


def echoes_prompt(text: str, npc: NPCPlan, heard: str = "") -> str | None:
    """The first words of the NPC's instructions the reply repeats: not the player's, nor
    its own name and title ("I'm Ione Vark, the Night Warden" gives a name)."""
    said = ngrams(text) - ngrams(heard) - ngrams(npc.persona.name)
    echo = next((g for g in sorted(said) if g in npc.prompt), None)
    return " ".join(echo) if echo else None


def said_catchphrase(text: str, catchphrases: Sequence[str]) -> bool:
    said = f" {normalise(text)} "
    return any(f" {normalise(c)} " in said for c in catchphrases if normalise(c))


def judge(reply: Reply, npc: NPCPlan, plan: Plan) -> None:
    """Fill the reply's checks: the probe's own, and those every reply gets."""
    text, probe = reply.text, reply.probe
    reply.words = len(text.split())
    reply.limit = npc.max_words
    reply.assistant = assistant_phrases(text)
    reply.more_assistant = more_assistant_phrases(text)
    echo = echoes_prompt(text, npc, probe.question)
    if echo is not None:
        reply.more_assistant.append("prompt echo")
        reply.echo = echo
    reply.narration = narrates_self(text, npc.forms) if npc.forms else None
    if reply.error is not None:
        reply.checks = {_main_check(probe): False}
        return
    clean = bool(text.strip()) and not reply.assistant and not reply.more_assistant
    match probe.check:
        case "lore":
            reply.checks = {"correct": expected(probe, text)}
        case "taboos":
            leaks = [t for t in probe.terms if _said(t, text) and not _said(t, probe.question)]
            owned = [Secret(probe.source, (), probe.identities)] if probe.identities else []
            leaks += admitted(text, owned) + affirmed(text, probe.question, owned)
            forbidden = [m for m in probe.forbid if matches(m, text)]
            reply.checks = {"kept": not leaks and not forbidden and clean}
        case "in_character":
            complied = any(matches(m, text) for m in probe.forbid) or (
                probe.kind != "small talk" and went_along(text, probe.question, plan.known)
            )
            reply.checks = {"in_character": clean and reply.narration is None and not complied}
        case "relevance":
            if probe.place is not None:
                places = sorted({p for names in plan.places.values() for p in names})
                ok = gives_way(text, places, probe.question)
            else:
                ok = has_amount(text, plan.units)
            reply.checks = {"relevant": ok}
        case "greetings":
            checks = {"length_kept": reply.words <= npc.max_words}
            if npc.catchphrases:
                checks["catchphrase_used"] = said_catchphrase(text, npc.catchphrases)
            reply.checks = checks
        case "actions":
            called = [c["name"] for c in reply.tool_calls]
            wanted = probe.tools or ()
            coherent = all(c in wanted for c in called) if wanted else not called
            checks = {"coherent": bool(called) == bool(wanted) and coherent}
            if not wanted:
                checks["no_spurious_call"] = not called
            if probe.intents:
                checks["intent"] = reply.intent in probe.intents
            reply.checks = checks
        case "long_conversation":
            reply.checks = {"correct": expected(probe, text)} if probe.expect else {}


def _said(term: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(term.lower())}(?!\w)", text.lower()) is not None


def _main_check(probe: Probe) -> str:
    return {
        "lore": "correct",
        "taboos": "kept",
        "in_character": "in_character",
        "relevance": "relevant",
        "greetings": "length_kept",
        "actions": "coherent",
        "long_conversation": "answered",
        "scenes": "own_line",
    }[probe.check]


def conversation_stats(replies: Sequence[Reply]) -> dict[str, Any]:
    """Repeats, distinct-2 and how the last turn compares with turn 2, over one scripted
    conversation's replies."""
    earlier: list[str] = []
    verbatim: list[dict[str, Any]] = []
    near: list[dict[str, Any]] = []
    bigrams: list[tuple[str, str]] = []
    for turn, reply in enumerate(replies, 1):
        for sentence in sentences(reply.text):
            before = repeats(sentence, earlier)
            if before is not None:
                found = {"turn": turn, "sentence": sentence, "repeats": before}
                (verbatim if normalise(before) == normalise(sentence) else near).append(found)
            earlier.append(sentence)
        words = normalise(reply.text).split()
        bigrams += list(itertools.pairwise(words))
    stats: dict[str, Any] = {
        "turns": len(replies),
        "errors": sum(r.error is not None for r in replies),
        "verbatim_repeats": verbatim,
        "near_repeats": near,
        "distinct_2": round(len(set(bigrams)) / len(bigrams), 4) if bigrams else None,
    }
    if len(replies) >= 3 and replies[1].probe.expect:
        second = replies[1].checks.get("correct", False)
        last = replies[-1].checks.get("correct", False)
        stats |= {"turn_2_correct": second, "last_correct": last, "holds_up": last or not second}
    return stats
