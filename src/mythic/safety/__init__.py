"""Guardrails: a content policy per world and per NPC, checked on the player's line, on the
reply as it streams (phrase by phrase, before speech and before it leaves the server) and on
tool calls. The rule layer is always on; the packaged classifier (`alt-profanity-check`) adds
a score where the policy uses it.

Capability layer: imports only the base. The world's `safety.yaml` and the cards' `safety:`
sections are read by `mythic.knowledge` into `WorldSafety` and `NPCSafety`; `SafetyPolicy.of`
resolves them for one NPC.
"""

from mythic.safety._classifier import abuse_scores, warm_classifier
from mythic.safety._guard import Guard, ReplyGuard, Verdict
from mythic.safety._policy import (
    ALWAYS_BLOCKED,
    CLASSIFIER_THRESHOLDS,
    RATING_BLOCKS,
    RATINGS,
    Category,
    NPCSafety,
    Rating,
    SafetyPolicy,
    WorldSafety,
)
from mythic.safety._rules import Hit, Where, normalised, pii_hits, redact, rule_hits

__all__ = [
    "ALWAYS_BLOCKED",
    "CLASSIFIER_THRESHOLDS",
    "RATINGS",
    "RATING_BLOCKS",
    "Category",
    "Guard",
    "Hit",
    "NPCSafety",
    "Rating",
    "ReplyGuard",
    "SafetyPolicy",
    "Verdict",
    "Where",
    "WorldSafety",
    "abuse_scores",
    "normalised",
    "pii_hits",
    "redact",
    "rule_hits",
    "warm_classifier",
]
