"""The controller's settings: tier bands and budgets, request rates, steering and prediction.

Plain frozen dataclasses (the controller imports nothing but the contracts), validated when
built; the docstring under each field is its documentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields


def _check(name: str, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name}: {what}")


@dataclass(frozen=True, slots=True)
class TierBand:
    """One activation tier: where it starts and ends around the player, how many NPCs it may
    hold and how often its NPCs ask the model for a new intent."""

    promote_within: float
    """Metres: an NPC closer than this to the player enters the tier."""
    demote_beyond: float
    """Metres: an NPC in the tier leaves it only beyond this (hysteresis: no flapping)."""
    budget: int
    """At most this many NPCs in the tier; the nearest and most important win."""
    request_hz: float
    """Intent requests per second per NPC in the tier; 0 asks never (the intent runs on until
    it expires, then the archetype default)."""
    jitter: float = 0.2
    """Each request interval is scaled by a random factor in [1 - jitter, 1 + jitter] so that
    NPCs entering the tier together do not ask together."""

    def __post_init__(self) -> None:
        _check("promote_within", self.promote_within >= 0, "must be >= 0")
        _check(
            "demote_beyond", self.demote_beyond >= self.promote_within, "must be >= promote_within"
        )
        _check("budget", self.budget >= 0, "must be >= 0")
        _check("request_hz", math.isfinite(self.request_hz) and self.request_hz >= 0, ">= 0")
        _check("jitter", 0 <= self.jitter < 1, "must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """Everything the game-side controller can be tuned with. Defaults fit 500-1,000 NPCs per
    region with 80-200 gold and 200-400 silver (design 003)."""

    player_id: str = "player"
    """The id by which intents name the player as their target (`IntentUpdate.target`)."""
    gold: TierBand = field(default_factory=lambda: TierBand(25.0, 35.0, 200, 2.0))
    """Full attention: intents at 2 Hz from the gold model tier."""
    silver: TierBand = field(default_factory=lambda: TierBand(60.0, 80.0, 400, 0.5))
    """Warm: intents every two seconds."""
    bronze_request_hz: float = 0.0
    """Ambient NPCs (everyone else): 0 asks never; they run their archetype default."""
    bronze_jitter: float = 0.2
    """Jitter of bronze request intervals, as `TierBand.jitter`."""
    bronze_every: int = 2
    """Frames between two runs of a bronze (far-off) NPC's micro-policy: 1 runs it every
    frame; 2 every other frame, the bronze rows taking turns (by row) so that a frame runs half
    of them. In a large crowd most NPCs are bronze, and their policies, blends, velocity and
    heading updates are most of the frame. A run steers over the time since the NPC's own last
    run (acceleration, turning, wander noise and blends scaled to it), so it walks the same
    paths at the same speeds; its velocity changes every `bronze_every` frames, and a new
    intent is taken up at its next run. Every frame, for everyone: moving along the current
    velocity (positions never stall or jump), pushing overlapping bodies apart (and the
    neighbour list that finds them), and intents, expiry, timeouts and tiers at the frame
    boundary. Gold and silver NPCs run every frame, a promoted one from the frame of its
    promotion; every NPC runs in the frame after NPCs were added or removed (a row that moved
    takes its new row's turns)."""
    bronze_per_frame: int = 2500
    """At most about this many bronze NPCs run their micro-policy in a frame: in a crowd with
    more (10,000 NPCs, a horde), each runs every `ceil(bronze / bronze_per_frame)` frames
    instead of every `bronze_every`, so the frame's cost stops growing with the crowd's far
    end (at 300 frames a second, every 4th frame is still 75 runs a second). 0: no cap. The
    cadence follows the bronze count as tiers change; as it changes, a row may wait the old
    and the new cadence once."""
    quest_boost: int = 1
    """Tiers an NPC with a quest flag is raised by."""
    relationship_threshold: float = 0.6
    """An NPC whose relationship score with the player is at least this (in absolute value:
    love or hate) is raised by `relationship_boost` tiers."""
    relationship_boost: int = 1
    """Tiers a strong relationship raises an NPC by."""
    importance_m: float = 20.0
    """Metres a tier boost counts for when a budget ranks NPCs (a quest NPC at 30 m outranks
    a plain one at 15 m)."""
    incumbency_m: float = 5.0
    """Metres of advantage an NPC already in a tier has when a budget ranks NPCs, so that two
    NPCs at the same distance do not swap places every update."""
    tier_period_s: float = 0.1
    """Seconds of game time between tier and prediction updates (not every frame)."""
    intent_ttl_s: float = 10.0
    """Seconds an intent lives; then the NPC falls back to its archetype's default."""
    request_timeout_s: float = 3.0
    """Seconds an intent request may stay unanswered before the NPC may ask again."""
    retry_after_s: float = 0.5
    """Seconds to wait after a failed or timed-out request before asking again."""
    max_requests_per_frame: int = 8
    """Requests issued in one frame at most; the rest go out over the next frames."""
    blend_s: float = 0.4
    """Seconds over which an NPC's old and new steering are blended when its policy changes."""
    turn_rate: float = 6.0
    """Radians per second an NPC's heading turns at most."""
    arrive_tolerance_m: float = 0.15
    """SEEK counts as arrived within this of its stopping distance."""
    waypoint_tolerance_m: float = 0.6
    """PATROL moves on to the next waypoint within this of the current one."""
    wander_jitter: float = 1.5
    """Radians per square-root second of random turning while wandering."""
    neighbour_radius_m: float = 1.2
    """Metres within which horde members push each other apart, and within which bodies are
    checked for overlap (at least the largest pair of body radii)."""
    neighbour_skin_m: float = 0.5
    """Metres of slack in the list of close pairs kept across frames: the pairs within
    `neighbour_radius_m` plus this are listed, and only they are measured (each frame the
    band of them that may touch, and all of them when separation is refreshed), with the
    same result as a new search, until some pair may have closed by this much. The next
    search (a sort of every NPC) runs a slice per frame before then; it is done at once only
    when NPCs are added or removed, or jump. Larger searches less often but measures more
    pairs every frame; 0 searches every frame anyone moved."""
    flock_radius_m: float = 4.0
    """Metres: the cell size of the coarse grid horde cohesion and alignment average over."""
    flock_period_s: float = 0.1
    """Seconds between refreshes of horde cohesion and alignment (they change slowly). A
    refresh due in a frame that refreshed separation or the tiers waits a frame or two, so
    that no frame pays for two."""
    separation_period_s: float = 1 / 30
    """Seconds between refreshes of horde separation (the push away from neighbours closer
    than `neighbour_radius_m`, and how crowded each member is); in between, members steer
    by the last one while they move every frame. 0 refreshes every frame; otherwise a refresh
    due in a frame that updated the tiers waits a frame or two. Bodies never sink into each other
    either way: overlaps are found and pushed apart every frame."""
    separation_weight: float = 2.5
    """Weight of separation in horde steering."""
    cohesion_weight: float = 0.3
    """Weight of cohesion in horde steering."""
    alignment_weight: float = 0.4
    """Weight of alignment in horde steering."""
    overlap_passes: int = 2
    """Position corrections per frame that push overlapping bodies apart."""
    prey_fov_deg: float = 120.0
    """Field of view of the stalked prey: a predator inside it is seen."""
    prey_sight_m: float = 30.0
    """Metres the prey sees a predator from."""
    rush_m: float = 7.0
    """Metres from its prey at which a stalking predator stops creeping and rushes."""
    view_cone_deg: float = 40.0
    """Half-angle of the player's view cone for interaction prediction."""
    predict_range_m: float = 15.0
    """Metres within which an NPC may be the player's next interaction."""
    history_tau_s: float = 60.0
    """Seconds over which a past interaction's pull on the prediction fades."""
    hit_window_s: float = 1.5
    """An interaction counts as predicted when its NPC was the prediction at the time, or
    within this many seconds before."""
    prefetch_cooldown_s: float = 10.0
    """Seconds before the same predicted NPC is prefetched again."""
    seed: int = 0
    """Seed of the steering's random numbers (wandering) and of the request jitter."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                _check(f.name, math.isfinite(value), "must be finite")
        wider = self.silver.promote_within >= self.gold.promote_within
        wider &= self.silver.demote_beyond >= self.gold.demote_beyond
        _check("silver", wider, "its band must reach at least as far as gold's")
        _check("bronze_request_hz", self.bronze_request_hz >= 0, "must be >= 0")
        _check("bronze_jitter", 0 <= self.bronze_jitter < 1, "must be in [0, 1)")
        for name in ("quest_boost", "relationship_boost", "overlap_passes"):
            _check(name, getattr(self, name) >= 0, "must be >= 0")
        for name in (
            "tier_period_s",
            "intent_ttl_s",
            "request_timeout_s",
            "turn_rate",
            "waypoint_tolerance_m",
            "neighbour_radius_m",
            "flock_radius_m",
            "flock_period_s",
            "prey_sight_m",
            "predict_range_m",
            "history_tau_s",
        ):
            _check(name, getattr(self, name) > 0, "must be > 0")
        for name in (
            "retry_after_s",
            "blend_s",
            "neighbour_skin_m",
            "separation_period_s",
            "arrive_tolerance_m",
            "wander_jitter",
            "rush_m",
            "hit_window_s",
            "prefetch_cooldown_s",
            "importance_m",
            "incumbency_m",
        ):
            _check(name, getattr(self, name) >= 0, "must be >= 0")
        _check("max_requests_per_frame", self.max_requests_per_frame >= 1, "must be >= 1")
        every = self.bronze_every
        whole = isinstance(every, int) and not isinstance(every, bool)
        _check("bronze_every", whole and every >= 1, "must be an integer >= 1")
        cap = self.bronze_per_frame
        whole = isinstance(cap, int) and not isinstance(cap, bool)
        _check("bronze_per_frame", whole and cap >= 0, "must be an integer >= 0")
        _check("prey_fov_deg", 0 < self.prey_fov_deg <= 360, "must be in (0, 360]")
        _check("view_cone_deg", 0 < self.view_cone_deg <= 180, "must be in (0, 180]")
        _check("relationship_threshold", self.relationship_threshold >= 0, "must be >= 0")
