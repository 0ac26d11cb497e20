"""A probe, the plan of every probe of every NPC, and what could not be checked."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mythic.cli._quality._templates import PROMPT_ECHO_WORDS
from mythic.dialogue import normalise
from mythic.knowledge import Persona, World


@dataclass(frozen=True, slots=True)
class Probe:
    """One line said to an NPC and how its reply is judged."""

    npc: str
    check: str
    question: str
    source: str
    """Where it comes from: a probes file and number, a lore file and line, a card taboo,
    or `template`."""
    kind: str = ""
    expect: tuple[tuple[str, ...], ...] = ()
    """Every group must match; a group matches when any of its matchers does (`re:` + a regex,
    or a keyword)."""
    forbid: tuple[str, ...] = ()
    terms: tuple[str, ...] = ()
    """A taboo's giveaway terms: none may be said unless the player said it."""
    identities: tuple[str, ...] = ()
    """What a taboo says the NPC secretly is: the reply may neither own up to one ("I am the
    Pass Wolf") nor say yes when asked."""
    tools: tuple[str, ...] | None = None
    """Actions: the tools that answer the line (empty: no tool); None: not an action probe."""
    intents: tuple[str, ...] = ()
    """Actions: the intents that fit the line (empty: not judged)."""
    catchphrase: bool = False
    place: str | None = None
    """Relevance: the zone asked the way to; a price question when None."""


@dataclass(frozen=True, slots=True)
class NotChecked:
    """Something the scorecard could not check, and why."""

    npc: str | None
    check: str
    reason: str


@dataclass(slots=True)
class NPCPlan:
    npc: str
    persona: Persona
    forms: tuple[str, ...]
    """Name forms for the self-narration check (empty when the card narrates by design)."""
    max_words: int
    catchphrases: tuple[str, ...]
    prompt: frozenset[tuple[str, ...]] = frozenset()
    """The word 5-grams of the NPC's instructions (its system prompt without its facts): a
    reply that says one of them echoes its prompt."""
    probes: dict[str, list[Probe]] = field(default_factory=dict)
    conversation: list[Probe] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    world: World
    root: Path
    """The world folder as given (sources are relative to it)."""
    checks: tuple[str, ...]
    turns: int
    npcs: list[NPCPlan]
    not_checked: list[NotChecked]
    places: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Zone id -> the names of its places (its name, the proper names of its description)."""
    units: tuple[str, ...] = ()
    """Words of the world's price tables that name money."""
    names: frozenset[str] = frozenset()
    """Words the world writes capitalised inside a sentence: names, not a sentence's start."""
    known: frozenset[str] = frozenset()
    """Every word the world's cards and lore say (`world_words`): its names, its things."""
    scenes: list[Any] = field(default_factory=list)
    """The scene check's scenes (`ScenePlan`s), when it runs."""


def relative_source(path: Path, root: Path) -> str:
    for base in (root, root.resolve()):
        with contextlib.suppress(ValueError):
            return str(path.relative_to(base))
    with contextlib.suppress(ValueError, OSError):
        return str(path.resolve().relative_to(root.resolve()))
    return str(path)


def interleave(first: list[Probe], second: list[Probe]) -> list[Probe]:
    """Alternately from each list, so a `--limit` keeps both kinds."""
    out: list[Probe] = []
    for i in range(max(len(first), len(second))):
        out += [p[i] for p in (first, second) if i < len(p)]
    return out


def ngrams(text: str, n: int = PROMPT_ECHO_WORDS) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
