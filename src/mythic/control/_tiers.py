"""Activation tiers: gold, silver or bronze per NPC, from its distance to the player with
hysteresis, raised by quest flags and strong relationships, capped by per-tier budgets.

Vectorised over the crowd. A tier only decides how often an NPC asks the model for an intent
and from which model tier; the intent it is running keeps running across a change.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from mythic.control._crowd import F32, I8, Bools, Tier
from mythic.control._settings import ControlSettings

# Tiers as plain ints: NumPy compares, fills and picks with an IntEnum member several times
# slower than with an int, and this runs over the whole crowd.
_GOLD, _SILVER, _BRONZE = int(Tier.GOLD), int(Tier.SILVER), int(Tier.BRONZE)


def assign_tiers(
    dist: F32,
    tier: I8,
    quest: Bools,
    relationship: F32,
    settings: ControlSettings,
) -> I8:
    """The new tier of every NPC.

    Args:
        dist: metres from each NPC to the player.
        tier: each NPC's tier now (for hysteresis and incumbency).
        quest: whether each NPC carries a quest flag.
        relationship: each NPC's relationship score with the player.
        settings: bands, boosts and budgets.
    """
    gold, silver = settings.gold, settings.silver
    keep_gold = (tier == _GOLD) & (dist <= gold.demote_beyond)
    keep_silver = (tier <= _SILVER) & (dist <= silver.demote_beyond)
    by_distance = np.where(
        (dist < gold.promote_within) | keep_gold,
        np.int8(_GOLD),
        np.where((dist < silver.promote_within) | keep_silver, np.int8(_SILVER), np.int8(_BRONZE)),
    )
    strong = np.abs(relationship) >= settings.relationship_threshold
    boost = quest.astype(np.int8) * np.int8(settings.quest_boost) + strong.astype(
        np.int8
    ) * np.int8(settings.relationship_boost)
    wanted: I8 = np.maximum(by_distance - boost, np.int8(_GOLD))

    # Budgets: rank by distance, less a bonus per tier of boost and for already being there.
    rank = dist - boost.astype(np.float32) * np.float32(settings.importance_m)
    for level, budget in ((_GOLD, gold.budget), (_SILVER, silver.budget)):
        rows = np.flatnonzero(wanted == level)
        if rows.size <= budget:
            continue
        key = rank[rows] - np.where(tier[rows] == level, np.float32(settings.incumbency_m), 0)
        losers = rows[np.argpartition(key, budget)[budget:]] if budget else rows
        wanted[losers] = level + 1
    return wanted


def tier_counts(tier: NDArray[np.int8]) -> tuple[int, int, int]:
    """How many NPCs are gold, silver and bronze."""
    gold, silver, bronze = np.bincount(tier.astype(np.intp), minlength=3)[:3]
    return int(gold), int(silver), int(bronze)
