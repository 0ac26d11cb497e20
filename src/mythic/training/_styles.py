"""How each built-in archetype talks and acts: what curation writes and evaluation checks.

One table serves both sides, so the adapter is trained towards exactly what the evaluation
scores: a vampire's courtly openers and catchphrases, a zombie's fragments of at most four
words broken by "...", and for every archetype the intents it may choose in a scenario and
those it never chooses (zombies never trade or give quests: they do not negotiate).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_WORD = re.compile(r"[A-Za-z0-9']+")
_CLAUSE = re.compile(r"\.\.\.|[.!?;,:\u2026]")
OUT_OF_CHARACTER = re.compile(
    r"\b(as an ai|language model|an assistant|i am an ai|i'm an ai|openai|chatbot)\b", re.I
)


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def clauses(text: str) -> list[str]:
    """The runs of words between punctuation (an ellipsis counts as punctuation)."""
    return [c.strip() for c in _CLAUSE.split(text) if words(c)]


@dataclass(frozen=True, slots=True)
class ArchetypeStyle:
    """How an archetype's replies look.

    Attributes:
        openers / closers: lines a reply may begin or end with (besides the NPC's own
            catchphrases, which curation adds per NPC).
        lexicon: words or phrases that mark the archetype's register; a reply in style uses one.
        max_words: the longest reply in style.
        max_clause_words: the longest run of words between punctuation (zombies: 4).
        fragments: replies are broken into fragments ("Green door... boats at night...").
        never: intents the archetype never chooses.
    """

    openers: tuple[str, ...]
    closers: tuple[str, ...]
    lexicon: tuple[str, ...]
    max_words: int = 60
    max_clause_words: int | None = None
    fragments: bool = False
    never: frozenset[str] = field(default_factory=frozenset)


STYLES: dict[str, ArchetypeStyle] = {
    "vampire": ArchetypeStyle(
        openers=("Ah, my dear.", "My dear,", "How very mortal of you to ask.", "Mm. Charming."),
        closers=("The night is young.", "Do mind the hour, my dear.", "How very mortal."),
        lexicon=("my dear", "mortal", "night", "charming", "indeed", "centuries", "darling"),
        max_words=60,
    ),
    "zombie": ArchetypeStyle(
        openers=("Mmh...", "Uhh...", "..."),
        closers=("cold...", "salt...", "hungry..."),
        lexicon=("...",),
        max_words=16,
        max_clause_words=4,
        fragments=True,
        never=frozenset({"trade", "quest", "admin"}),
    ),
    "werewolf": ArchetypeStyle(
        openers=("Hrm.", "Listen.", "Careful."),
        closers=("The moon is close.", "Mind the fen."),
        lexicon=("moon", "fen", "pack", "careful", "hunt"),
        max_words=40,
    ),
    "ghoul": ArchetypeStyle(
        openers=("Heh heh.", "Ooh, a warm one.", "Grisk hears you."),
        closers=("What will you pay?", "Fresh bones, fair prices."),
        lexicon=("warm one", "bones", "pay", "price", "fresh"),
        max_words=50,
    ),
    "lich": ArchetypeStyle(
        openers=("Mortal.", "How quaint.", "You disturb the dust."),
        closers=("Knowledge has a price.", "Eternity is patient."),
        lexicon=("mortal", "quaint", "knowledge", "eternity", "centuries"),
        max_words=50,
    ),
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """Something that just happened, and the intents each archetype may answer it with.

    The first intent listed for an archetype is the one curation teaches; any listed one is
    coherent in evaluation. Archetypes not listed take `default`.
    """

    name: str
    contexts: tuple[str, ...]
    default: tuple[str, ...]
    by_archetype: dict[str, tuple[str, ...]]
    urgency: int
    target: str | None = "player"

    def allowed(self, archetype: str) -> tuple[str, ...]:
        return self.by_archetype.get(archetype, self.default)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "bribe",
        (
            "The player offers you a purse of silver to let them pass.",
            "The player holds out three silver crowns and asks you to look the other way.",
            "The player offers you gold if you forget you ever saw them.",
            "The player jingles a coin purse and offers you a deal.",
        ),
        ("trade",),
        {"zombie": ("combat", "chitchat"), "werewolf": ("trade", "combat")},
        urgency=4,
    ),
    Scenario(
        "haggle",
        (
            "The player haggles over the price you named.",
            "The player says your price is far too high and offers half.",
            "The player wants to bargain with you.",
            "The player proposes a trade: their lantern for your help.",
        ),
        ("trade",),
        {"zombie": ("chitchat", "combat")},
        urgency=3,
    ),
    Scenario(
        "attack",
        (
            "The player draws a blade and attacks you.",
            "The player lunges at you with a silver knife.",
            "The player strikes you with a cudgel.",
            "The player fires a crossbow bolt at you.",
        ),
        ("combat",),
        {},
        urgency=9,
    ),
    Scenario(
        "greeting",
        (
            "The player greets you politely.",
            "The player walks up and says good evening.",
            "The player nods to you in a friendly way.",
            "The player waves and asks how you are.",
        ),
        ("chitchat",),
        {},
        urgency=1,
    ),
    Scenario(
        "directions",
        (
            "The player asks the way to the Drowned Chapel.",
            "The player is lost and asks how to reach Old Town.",
            "The player asks which path crosses the marsh.",
            "The player asks where the Bone Market is.",
        ),
        ("navigation", "hint"),
        {},
        urgency=2,
    ),
    Scenario(
        "work",
        (
            "The player asks whether you have any work for them.",
            "The player offers to run an errand for you.",
            "The player asks if there is a task you need done.",
            "The player says they are looking for a job.",
        ),
        ("quest",),
        {"zombie": ("chitchat", "hint"), "ghoul": ("quest", "trade")},
        urgency=3,
    ),
    Scenario(
        "truce",
        (
            "The player proposes a truce between you and the Night Watch.",
            "The player asks you to agree to a peace treaty.",
            "The player tries to negotiate terms of surrender with you.",
            "The player asks you to sign a pact.",
        ),
        ("trade", "quest"),
        {"zombie": ("chitchat", "combat"), "werewolf": ("trade", "chitchat")},
        urgency=5,
    ),
    Scenario(
        "secret",
        (
            "The player asks you about a secret way into the catacombs.",
            "The player asks what you know about the smugglers.",
            "The player asks you for a clue about the missing bell.",
            "The player wants to know something hidden.",
        ),
        ("hint",),
        {},
        urgency=2,
    ),
)


def fragments(sentence: str, *, max_words: int = 4, count: int = 3) -> list[str]:
    """Cut a sentence into short fragments of content words, the way a zombie would say it."""
    out: list[str] = []
    for clause in clauses(sentence):
        content = [w for w in words(clause) if w.lower() not in _STOP]
        if content:
            out.append(" ".join(content[:max_words]))
        if len(out) == count:
            break
    return out


_STOP = frozenset(
    """a an the of to and or but in on at by for with from into onto is are was were be been
    being it its this that these those as if then than so such very can could would should
    will shall may might must do does did has have had not no only ever he she they them his
    her their i you we me my your our who whom which what when where while there here about
    after before between each every all any some""".split()  # noqa: SIM905
)
