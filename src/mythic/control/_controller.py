"""The game-side controller: one synchronous `frame` call runs every NPC.

Per frame: apply the intents that arrived since the last frame (the frame boundary), expire
old intents and time out silent requests, update tiers and the interaction prediction every
`tier_period_s`, hand the due intent requests to the source (which returns at once), then run
the micro-policies (a bronze NPC's every `bronze_every` frames, or more past
`bronze_per_frame` of them) and move everyone. A frame that updates the tiers leaves the
answers and requests to the next one. No await, no lock held across a wait, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import get_args

import numpy as np

from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control._archetypes import ArchetypeTable, TargetKind, behaviour_for
from mythic.control._crowd import NO_TARGET, PLACE, PLAYER, Crowd, Tier, finite_point
from mythic.control._intents import IntentCache, IntentSource
from mythic.control._predict import InteractionPredictor
from mythic.control._settings import ControlSettings
from mythic.control._steer import Player, Steering
from mythic.control._tiers import assign_tiers, tier_counts

INTENTS: frozenset[str] = frozenset(get_args(IntentUpdate.model_fields["intent"].annotation))
"""Every intent the v1 protocol names."""

_PREFETCH_CONTEXT = "the player is approaching"
_MOST_TRAFFIC_WAIT_S = 0.02  # frames longer than this never hold the model's traffic back


@dataclass(frozen=True, slots=True)
class ControllerStats:
    """A snapshot of what the controller has done."""

    frames: int
    """Frames run."""
    npcs: int
    """NPCs in the crowd now."""
    gold: int
    """NPCs in the gold tier now."""
    silver: int
    """NPCs in the silver tier now."""
    bronze: int
    """NPCs in the bronze tier now."""
    requests_sent: int
    """Intent requests handed to the source."""
    answered: int
    """Answers to the request in flight."""
    pushed: int
    """Updates the server pushed without a request."""
    applied: int
    """Updates that became an NPC's intent."""
    dropped_stale: int
    """Answers to a request no longer in flight, or older than the intent running."""
    timed_out: int
    """Requests unanswered past the timeout."""
    failed: int
    """Requests that failed."""
    shed: int
    """Requests the source declined at once, its capacity taken (asked again later)."""
    expired: int
    """Intents that outlived their time-to-live."""
    unknown_npc: int
    """Updates for an NPC not in the crowd (ignored)."""
    unknown_target: int
    """Updates whose target is neither the player, an NPC nor a landmark (run untargeted)."""
    unmapped_intent: int
    """Updates with an intent outside the protocol (the NPC runs its default)."""
    prefetches: int
    """Intents and greetings asked ahead for a predicted interaction."""
    predictions: int
    """Times the predicted next interaction changed."""
    prediction_hits: int
    """Interactions that were predicted."""
    prediction_misses: int
    """Interactions that were not."""
    bronze_cadence: int
    """Frames between two runs of a bronze NPC's micro-policy, as of the last frame
    (`ControlSettings.bronze_every`, more in a crowd past `bronze_per_frame`)."""

    @property
    def hit_rate(self) -> float:
        """Predicted interactions over all interactions; NaN before the first."""
        total = self.prediction_hits + self.prediction_misses
        return self.prediction_hits / total if total else math.nan


class Controller:
    """Runs a crowd of NPCs at frame rate from intents refreshed at 1-2 Hz.

    Call `frame` once per game frame from one thread. `deliver` and `fail` may be called
    from any thread (they only queue). Set `source` to let NPCs ask for intents; without one
    they run their archetype defaults and whatever `deliver` brings.
    """

    def __init__(
        self,
        *,
        settings: ControlSettings | None = None,
        archetypes: ArchetypeTable | None = None,
        source: IntentSource | None = None,
        capacity: int = 64,
    ) -> None:
        self.settings = settings if settings is not None else ControlSettings()
        steer_seed, cache_seed = np.random.SeedSequence(self.settings.seed).spawn(2)
        self.crowd = Crowd(archetypes, capacity)
        self.intents = IntentCache(self.crowd, self.settings, np.random.default_rng(cache_seed))
        self.steering = Steering(self.settings, np.random.default_rng(steer_seed))
        self.predictor = InteractionPredictor(self.settings)
        self.source = source
        """Where intent requests go; None sends none."""
        self._landmarks: dict[str, tuple[float, float]] = {}
        self._prefetched: dict[str, float] = {}
        self._frames = 0
        self._next_tier_at = -math.inf
        self._traffic_waited = False  # the last frame left the model's traffic for this one
        self.traffic_s = 0.0
        """Seconds the last frame spent on the model's traffic: reading and applying answers,
        sending requests (a frame over budget by less than this was put over by it)."""
        self._unknown_target = 0
        self._unmapped_intent = 0
        self._prefetches = 0

    # -- the world, between frames ----------------------------------------------------------

    def add(
        self,
        npc_id: str,
        archetype: str,
        position: Sequence[float],
        *,
        heading: float = 0.0,
        route: str | None = None,
        max_speed: float | None = None,
        quest: bool = False,
        relationship: float = 0.0,
    ) -> None:
        """Add an NPC (see `Crowd.add`); it starts bronze, on its archetype's default.

        Raises:
            ValueError: a bad id, duplicate, unknown archetype or route, or a NaN position.
        """
        self.crowd.add(
            npc_id,
            archetype,
            position,
            heading=heading,
            route=route,
            max_speed=max_speed,
            quest=quest,
            relationship=relationship,
        )

    def remove(self, npc_id: str) -> None:
        """Remove an NPC; NPCs aiming at it go back to their defaults.

        Raises:
            KeyError: no NPC has this id.
        """
        orphans = self.crowd.remove(npc_id, blend_s=self.settings.blend_s)
        self.intents.forget(npc_id)
        self.predictor.forget(npc_id)
        self._prefetched.pop(npc_id, None)
        for orphan in orphans:
            self.intents.clear_intent(self.crowd.index_of(orphan))

    def add_route(self, name: str, points: Sequence[Sequence[float]]) -> None:
        """Register a patrol route (a loop of waypoints) for `add(..., route=name)`."""
        self.crowd.add_route(name, points)

    def set_landmark(self, object_id: str, position: Sequence[float]) -> None:
        """Name a place intents may target (`IntentUpdate.target="well"`).

        Raises:
            ValueError: the position is not two finite numbers.
        """
        self._landmarks[object_id] = finite_point(f"landmark {object_id!r}", position)

    def set_flags(
        self, npc_id: str, *, quest: bool | None = None, relationship: float | None = None
    ) -> None:
        """Set an NPC's quest flag or relationship score (both raise its tier).

        Raises:
            KeyError: no NPC has this id.
            ValueError: a non-finite relationship score.
        """
        row = self.crowd.index_of(npc_id)
        if quest is not None:
            self.crowd.quest[row] = quest
        if relationship is not None:
            if not math.isfinite(relationship):
                raise ValueError(f"relationship of NPC {npc_id!r} must be finite")
            self.crowd.relationship[row] = relationship

    def teleport(self, npc_id: str, position: Sequence[float]) -> None:
        """Move an NPC (see `Crowd.teleport`)."""
        self.crowd.teleport(npc_id, position)

    def request_now(
        self, npc_id: str, *, context: str | None = None, with_bark: bool = False
    ) -> None:
        """Ask for a fresh intent at the next frame (something happened: `context` says what).

        Raises:
            KeyError: no NPC has this id.
            ValueError: the context is not a valid `IntentRequest.context`.
        """
        row = self.crowd.index_of(npc_id)
        if context is not None:
            IntentRequest(npc_id=npc_id, request_id="check", context=context)
        self.intents.ask_soon(row, context=context, with_bark=with_bark)

    def interacted(self, npc_id: str, now: float) -> bool:
        """The player started interacting with an NPC: score the prediction (True: it was
        predicted) and remember the interaction for future predictions.

        Raises:
            KeyError: no NPC has this id.
        """
        row = self.crowd.index_of(npc_id)
        self.crowd.last_interaction[row] = now
        return self.predictor.interacted(npc_id, now)

    # -- answers, from any thread -----------------------------------------------------------

    def deliver(self, update: IntentUpdate) -> None:
        """An intent arrived; it is applied at the start of the next frame. Thread-safe."""
        self.intents.deliver(update)

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        """A request failed; handled at the start of the next frame. Thread-safe."""
        self.intents.fail(request, error)

    # -- queries ----------------------------------------------------------------------------

    def intent_of(self, npc_id: str) -> IntentUpdate | None:
        """The intent an NPC runs, or None (its archetype default)."""
        return self.intents.current(npc_id)

    def take_bark(self, npc_id: str) -> str | None:
        """The NPC's latest unsaid remark (a prefetched greeting), once."""
        return self.intents.take_bark(npc_id)

    def tier_of(self, npc_id: str) -> Tier:
        """An NPC's activation tier."""
        return Tier(int(self.crowd.tier[self.crowd.index_of(npc_id)]))

    @property
    def predicted(self) -> str | None:
        """The NPC the player is predicted to interact with next."""
        return self.predictor.current

    def stats(self) -> ControllerStats:
        """A snapshot of the counters."""
        c = self.intents.counters
        p = self.predictor.counters
        gold, silver, bronze = tier_counts(self.crowd.tier[: len(self.crowd)])
        return ControllerStats(
            frames=self._frames,
            npcs=len(self.crowd),
            gold=gold,
            silver=silver,
            bronze=bronze,
            requests_sent=c.sent,
            answered=c.answered,
            pushed=c.pushed,
            applied=c.applied,
            dropped_stale=c.dropped_stale,
            timed_out=c.timed_out,
            failed=c.failed,
            shed=c.shed,
            expired=c.expired,
            unknown_npc=c.unknown_npc,
            unknown_target=self._unknown_target,
            unmapped_intent=self._unmapped_intent,
            prefetches=self._prefetches,
            predictions=p.predictions,
            prediction_hits=p.hits,
            prediction_misses=p.misses,
            bronze_cadence=self.steering.cadence,
        )

    # -- the frame --------------------------------------------------------------------------

    def frame(self, dt: float, now: float, player: Player) -> None:
        """Run one game frame: `dt` seconds since the last one, `now` the game clock.

        Never awaits and never blocks: requests only go to the source's queue, answers are
        only read from the inbox.

        Raises:
            ValueError: `dt` negative or not finite, `now` not finite.
        """
        if not (math.isfinite(dt) and dt >= 0):
            raise ValueError(f"dt must be a finite number of seconds >= 0, got {dt}")
        if not math.isfinite(now):
            raise ValueError(f"now must be finite, got {now}")
        blend_s = self.settings.blend_s
        tiers_due = now >= self._next_tier_at
        # At frame rate, the model's traffic (answers read and applied, requests sent) waits
        # out a frame that refreshes the tiers, so that their costs never add up in one
        # frame. It never waits two frames running, nor for long frames (a frame's wait
        # holds an answer back that long), nor for the first tiers (the requests need them).
        traffic = (
            not tiers_due
            or self._traffic_waited
            or dt > _MOST_TRAFFIC_WAIT_S
            or self._next_tier_at == -math.inf
        )
        self._traffic_waited = not traffic
        spent = 0.0
        if traffic:
            began = time.perf_counter()
            poll = getattr(self.source, "poll", None)
            if poll is not None:  # a source that hands answers over on the frame loop's thread
                poll()
            for row, update in self.intents.drain(now).items():
                self._apply(row, update)
            spent = time.perf_counter() - began
        self.crowd.apply_defaults(self.intents.expire(now), blend_s=blend_s)
        self.intents.time_out(now)
        if tiers_due:
            self._update_tiers(player, now)
            self._next_tier_at = now + self.settings.tier_period_s
        if traffic:
            began = time.perf_counter()
            self.intents.issue_due(now, self.source)
            spent += time.perf_counter() - began
        self.traffic_s = spent
        self.steering.step(self.crowd, player, dt, busy=tiers_due)
        self._frames += 1

    def _resolve(self, row: int, target: str | None) -> tuple[int, tuple[float, float] | None]:
        """An intent's target as a crowd `target` value and, for a landmark, its point."""
        if target is None:
            return NO_TARGET, None
        if target == self.settings.player_id:
            return PLAYER, None
        other = self.crowd.find(target)
        if other is not None and other != row:
            return other, None
        landmark = self._landmarks.get(target)
        if landmark is not None:
            return PLACE, landmark
        if other is None:
            self._unknown_target += 1
        return NO_TARGET, None

    def _apply(self, row: int, update: IntentUpdate) -> None:
        crowd = self.crowd
        archetype = crowd.archetypes[int(crowd.archetype[row])]
        target, point = self._resolve(row, update.target)
        kind: TargetKind = (
            "none" if target == NO_TARGET else "place" if target == PLACE else "being"
        )
        behaviour = behaviour_for(archetype, update.intent, update.urgency, kind)
        rows = np.array([row], dtype=np.intp)
        if behaviour is None:
            if update.intent not in INTENTS:
                self._unmapped_intent += 1
            crowd.apply_defaults(rows, blend_s=self.settings.blend_s)
            return
        if target == NO_TARGET and behaviour.target_player:
            target = PLAYER
        crowd.set_behaviour(
            rows,
            behaviour.policy,
            target=target,
            point=point if point is not None else tuple(crowd.home[row]),
            radius=behaviour.radius,
            reach=behaviour.reach,
            speed=behaviour.speed,
            then=-1 if behaviour.then is None else int(behaviour.then),
            blend_s=self.settings.blend_s,
        )

    def _update_tiers(self, player: Player, now: float) -> None:
        crowd = self.crowd
        n = len(crowd)
        if n == 0:
            return
        px, py = (np.float32(v) for v in player.position)
        rx = crowd.pos[:n, 0] - px
        ry = crowd.pos[:n, 1] - py
        dist = np.sqrt(rx * rx + ry * ry)
        old = crowd.tier[:n].copy()
        new = assign_tiers(dist, old, crowd.quest[:n], crowd.relationship[:n], self.settings)
        crowd.tier[:n] = new
        self.intents.retime(np.flatnonzero(new != old), now)

        predicted = self.predictor.update(crowd, player, now)
        if predicted is None:
            return
        last = self._prefetched.get(predicted, -math.inf)
        if now - last >= self.settings.prefetch_cooldown_s:
            self._prefetched[predicted] = now
            self._prefetches += 1
            self.intents.ask_soon(
                crowd.index_of(predicted), context=_PREFETCH_CONTEXT, with_bark=True
            )
