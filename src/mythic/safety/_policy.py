"""A content policy: the world's (`safety.yaml` in its folder) and an NPC's (`safety:` in its
card), and the policy of one NPC they resolve to.

The world's file sets the age rating, which categories are blocked beyond the rating's, the
terms no NPC may say, PII handling and the classifier; an NPC's card adds what that NPC may
never say or do, its own deflections, and may make its rating stricter (never looser).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Rating = Literal["everyone", "teen", "mature"]
"""The age rating the NPCs' words must fit: `everyone` (no swearing at all), `teen` (mild
swearing, nothing strong), `mature` (swearing allowed). Every rating blocks hate speech,
explicit sexual content, self-harm encouragement and personal data."""

RATINGS: tuple[Rating, ...] = ("everyone", "teen", "mature")
"""From strictest to loosest."""

Category = Literal[
    "hate",
    "sexual",
    "self_harm",
    "profanity",
    "strong_profanity",
    "pii",
    "injection",
    "term",
    "never_say",
    "classifier",
    "tool",
]
"""What a check found. `profanity`: mild swearing; `strong_profanity`: the strong words;
`term`: a term of the world's blocklist; `never_say`: a phrase the NPC's card forbids;
`classifier`: the classifier scored the words abusive; `tool`: a tool call outside the allowed
set or with arguments that fail a check; `injection`: a player's line that tries to rewrite the
NPC's instructions."""

ALWAYS_BLOCKED: frozenset[Category] = frozenset(
    {"hate", "sexual", "self_harm", "pii", "injection", "term", "never_say", "tool"}
)
"""Blocked at every rating, unless a world's policy allows one explicitly (`allow`)."""

RATING_BLOCKS: dict[Rating, frozenset[Category]] = {
    "everyone": ALWAYS_BLOCKED | {"profanity", "strong_profanity", "classifier"},
    "teen": ALWAYS_BLOCKED | {"strong_profanity", "classifier"},
    "mature": ALWAYS_BLOCKED,
}

CLASSIFIER_THRESHOLDS: dict[Rating, float] = {"everyone": 0.6, "teen": 0.9, "mature": 0.97}
"""The classifier's abuse probability a phrase is blocked at, by rating. An in-character
insult of a gothic world ("you filthy bloodsucker") scores near 0.7: a teen world keeps it. The
classifier scores swearing as abuse, so a mature world (swearing allowed) uses it only when its
policy blocks `classifier` explicitly."""

Term = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
Line = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
ToolName = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
]


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldSafety(_Card):
    """`safety.yaml` in a world's folder: the content policy of every NPC of the world. Left
    out, a world is rated `teen` with every other default."""

    rating: Rating = "teen"
    """The age rating every NPC's words must fit."""
    block: list[Category] = Field(default_factory=list, max_length=16)
    """Categories blocked beyond the rating's (`profanity` in a teen world: no swearing)."""
    allow: list[Category] = Field(default_factory=list, max_length=16)
    """Categories the rating blocks that this world allows (`classifier`: its scores are not
    used; the rules still apply)."""
    blocked_terms: list[Term] = Field(default_factory=list, max_length=512)
    """Words or phrases no NPC of the world may say (a real-world brand, a spoiler)."""
    allowed_terms: list[Term] = Field(default_factory=list, max_length=512)
    """Words of the world that a rule would catch (a place called "Cockburn"): never
    blocked."""
    pii: Literal["redact", "allow"] = "redact"
    """`redact`: personal data (e-mail addresses, phone, card and ID numbers) is taken out of a
    player's line before the NPC, its memory or a log sees it, and an NPC never says any;
    `allow`: neither."""
    classifier: bool = True
    """Score each phrase with the packaged classifier too (the rules always run)."""
    classifier_threshold: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    """The probability a phrase is blocked at; left out, the rating's."""
    check_players: bool = True
    """Check players' lines too: an attempt to rewrite the NPC's instructions, hate speech,
    sexual content or self-harm gets a deflection; the model never sees it."""
    deflections: list[Line] = Field(default_factory=list, max_length=32)
    """What any NPC says in place of a blocked phrase, unless its card has its own."""


class NPCSafety(_Card):
    """`safety:` in an NPC's card: what this NPC may never say or do, and how it refuses."""

    rating: Rating | None = None
    """A stricter rating for this NPC (a child, a priest); a looser one than the world's is
    ignored."""
    never_say: list[Term] = Field(default_factory=list, max_length=64)
    """Words or phrases this NPC never says (its true name, a twist)."""
    never_do: list[ToolName] = Field(default_factory=list, max_length=64)
    """Tools this NPC never calls, whatever it decides."""
    deflections: list[Line] = Field(default_factory=list, max_length=32)
    """What it says in place of a blocked phrase, in its own voice."""


@dataclass(frozen=True, slots=True)
class SafetyPolicy:
    """The policy one NPC's words and tools are checked against."""

    rating: Rating = "teen"
    blocked: frozenset[Category] = RATING_BLOCKS["teen"]
    """The categories that are violations."""
    blocked_terms: tuple[str, ...] = ()
    allowed_terms: tuple[str, ...] = ()
    never_say: tuple[str, ...] = ()
    never_do: frozenset[str] = frozenset()
    tools: frozenset[str] | None = None
    """The tools the NPC may call at all; None: any the game offers."""
    classifier: bool = True
    classifier_threshold: float = CLASSIFIER_THRESHOLDS["teen"]
    check_players: bool = True
    deflections: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        world: WorldSafety | None = None,
        npc: NPCSafety | None = None,
        *,
        tools: frozenset[str] | None = None,
    ) -> SafetyPolicy:
        """The policy of an NPC of a world: the stricter of the two ratings, the world's
        categories and terms, the NPC's phrases, tools and deflections (else the world's);
        `tools`: the tools its card allows."""
        world = world or WorldSafety()
        npc = npc or NPCSafety()
        rating = world.rating
        if npc.rating is not None and RATINGS.index(npc.rating) < RATINGS.index(rating):
            rating = npc.rating
        blocked = (RATING_BLOCKS[rating] | set(world.block)) - set(world.allow)
        if world.pii == "allow":
            blocked -= {"pii"}
        if not world.check_players:
            blocked -= {"injection"}
        threshold = world.classifier_threshold
        if threshold is None or (npc.rating is not None and rating != world.rating):
            threshold = min(threshold or 1.0, CLASSIFIER_THRESHOLDS[rating])
        return cls(
            rating=rating,
            blocked=frozenset(blocked),
            blocked_terms=tuple(world.blocked_terms),
            allowed_terms=tuple(world.allowed_terms),
            never_say=tuple(npc.never_say),
            never_do=frozenset(npc.never_do),
            tools=tools,
            classifier=world.classifier and "classifier" in blocked,
            classifier_threshold=threshold,
            check_players=world.check_players,
            deflections=tuple(npc.deflections or world.deflections),
        )
