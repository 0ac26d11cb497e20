"""Ahead-of-player prediction: which NPC the player is about to talk to.

NPCs that can talk are scored by how squarely they sit in the player's view cone, how close
they are, whether the player is closing in on them, whether they carry a quest, and how
recently the player talked to them. The best one is the prediction; the controller prefetches
its intent and greeting so they are ready when the player arrives. Every prediction is
recorded, and each real interaction is scored as a hit or a miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mythic.control._crowd import F32, Crowd
from mythic.control._settings import ControlSettings
from mythic.control._steer import Player

_W_CONE = 1.0
_W_NEAR = 1.0
_W_CLOSING = 0.5
_W_QUEST = 0.3
_W_HISTORY = 0.4


@dataclass(slots=True)
class PredictionCounters:
    """How good the predictions have been."""

    predictions: int = 0
    """Times the predicted NPC changed to a new one."""
    hits: int = 0
    """Interactions with the NPC predicted at the time (or within the hit window before)."""
    misses: int = 0
    """Interactions with an NPC that was not predicted."""

    @property
    def hit_rate(self) -> float:
        """Hits over interactions; NaN before the first interaction."""
        total = self.hits + self.misses
        return self.hits / total if total else math.nan


class InteractionPredictor:
    """Scores NPCs ahead of the player and keeps the record of predictions and outcomes."""

    def __init__(self, settings: ControlSettings) -> None:
        self.settings = settings
        self.counters = PredictionCounters()
        self.current: str | None = None
        """The NPC predicted now, if any."""
        self._cone_cos = np.float32(math.cos(math.radians(settings.view_cone_deg)))
        self._recent: dict[str, float] = {}

    def scores(self, crowd: Crowd, player: Player, now: float) -> F32:
        """Each live NPC's score as the next interaction; -inf for those that cannot be."""
        n = len(crowd)
        s = self.settings
        score = np.full(n, -np.inf, dtype=np.float32)
        px, py = (np.float32(v) for v in player.position)
        rx = crowd.pos[:n, 0] - px
        ry = crowd.pos[:n, 1] - py
        dist = np.sqrt(rx * rx + ry * ry)
        # Only NPCs that talk and are in range can be candidates: score just those.
        talks = crowd.archetypes.talks[crowd.archetype[:n]]
        rows = np.flatnonzero(talks & (dist <= s.predict_range_m))
        if rows.size == 0:
            return score
        rel = np.stack([rx[rows], ry[rows]], axis=1)
        dist = dist[rows]
        vel = np.asarray(player.velocity, dtype=np.float32)
        speed = float(np.hypot(vel[0], vel[1]))
        ahead = (
            vel / np.float32(speed)
            if speed > 0.3
            else np.array([math.cos(player.facing), math.sin(player.facing)], dtype=np.float32)
        )
        toward = rel / np.maximum(dist, np.float32(1e-6))[:, None]
        cos = toward @ ahead
        cos[dist < 1e-6] = 1.0
        candidate = cos >= self._cone_cos
        closing = np.clip(rel @ vel / np.maximum(dist, 1e-6) / max(speed, 1.0), 0, 1)
        since = now - crowd.last_interaction[rows]
        history = np.exp(-np.maximum(since, 0) / s.history_tau_s)
        scored = (
            _W_CONE * (cos - self._cone_cos) / max(1 - float(self._cone_cos), 1e-6)
            + _W_NEAR * (1 - dist / np.float32(s.predict_range_m))
            + _W_CLOSING * closing
            + _W_QUEST * crowd.quest[rows]
            + _W_HISTORY * history
        ).astype(np.float32)
        score[rows[candidate]] = scored[candidate]
        return score

    def update(self, crowd: Crowd, player: Player, now: float) -> str | None:
        """Predict now. Returns the NPC id when the prediction changed to a new NPC (the one
        to prefetch), else None."""
        self._forget_before(now - self.settings.hit_window_s)
        if len(crowd) == 0:
            self.current = None
            return None
        score = self.scores(crowd, player, now)
        best = int(np.argmax(score))
        if not np.isfinite(score[best]):
            self.current = None
            return None
        npc_id = crowd.id_at(best)
        self._recent[npc_id] = now
        if npc_id == self.current:
            return None
        self.current = npc_id
        self.counters.predictions += 1
        return npc_id

    def interacted(self, npc_id: str, now: float) -> bool:
        """Score an interaction that just began: a hit when its NPC is the prediction now or
        was one within the hit window."""
        self._forget_before(now - self.settings.hit_window_s)
        hit = npc_id == self.current or npc_id in self._recent
        if hit:
            self.counters.hits += 1
        else:
            self.counters.misses += 1
        return hit

    def forget(self, npc_id: str) -> None:
        """An NPC left the crowd."""
        self._recent.pop(npc_id, None)
        if self.current == npc_id:
            self.current = None

    def _forget_before(self, cutoff: float) -> None:
        if self._recent and min(self._recent.values()) < cutoff:
            self._recent = {k: t for k, t in self._recent.items() if t >= cutoff}
