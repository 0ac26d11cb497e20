"""NPC state as a struct of arrays: one NumPy column per property, one row per NPC.

The frame path reads and writes whole columns at once; nothing loops over NPCs. Rows are kept
dense: removing an NPC moves the last row into its place, and `Crowd` keeps the id <-> row map
(and every column that refers to another row) right. Columns grow by doubling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from enum import IntEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from mythic.contracts import ID_PATTERN
from mythic.control._archetypes import NO_POLICY, ArchetypeTable, Policy

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]
I32 = NDArray[np.int32]
I8 = NDArray[np.int8]
Bools = NDArray[np.bool_]
Index = NDArray[np.intp]

_ID = re.compile(ID_PATTERN)

PLAYER = -2
"""`target` value: the NPC's target is the player."""
NO_TARGET = -1
"""`target` value: there is no target (`point` holds the NPC's home)."""
PLACE = -3
"""`target` value: the target is the place in `point` (a landmark)."""


class StalkPhase(IntEnum):
    """Where a stalking predator is in its hunt (for animation)."""

    PROWL = 0
    """The prey is out of reach: roaming."""
    CREEP = 1
    """Unseen: creeping closer."""
    FREEZE = 2
    """Seen by the prey: holding still."""
    RUSH = 3
    """Close: charging."""
    FEED = 4
    """On the prey."""


class Tier(IntEnum):
    """Activation tier: how much of the model an NPC gets. Lower is more."""

    GOLD = 0
    SILVER = 1
    BRONZE = 2

    @property
    def label(self) -> str:
        """`gold`, `silver` or `bronze`, as the router names its tiers."""
        return self.name.lower()


# name, dtype, shape of one row, fill value for a new row
_COLUMNS: tuple[tuple[str, type[np.generic], tuple[int, ...], float], ...] = (
    ("pos", np.float32, (2,), 0.0),
    ("vel", np.float32, (2,), 0.0),
    ("heading", np.float32, (), 0.0),
    ("home", np.float32, (2,), 0.0),
    ("max_speed", np.float32, (), 1.0),
    ("max_accel", np.float32, (), 1.0),
    ("body_radius", np.float32, (), 0.3),
    ("archetype", np.int16, (), 0),
    ("policy", np.int8, (), Policy.IDLE),
    ("target", np.int32, (), NO_TARGET),
    ("point", np.float32, (2,), 0.0),
    ("radius", np.float32, (), 0.0),
    ("reach", np.float32, (), math.inf),
    ("speed", np.float32, (), 0.5),
    ("then", np.int8, (), NO_POLICY),
    ("desired", np.float32, (2,), 0.0),
    ("blend_from", np.float32, (2,), 0.0),
    ("blend_left", np.float32, (), 0.0),
    ("steer_lag", np.float64, (), 0.0),
    ("route", np.int32, (), -1),
    ("waypoint", np.int32, (), 0),
    ("wander_angle", np.float32, (), 0.0),
    ("stalk_phase", np.int8, (), StalkPhase.PROWL),
    ("cohesion", np.float32, (2,), 0.0),
    ("alignment", np.float32, (2,), 0.0),
    ("tier", np.int8, (), Tier.BRONZE),
    ("quest", np.bool_, (), False),
    ("relationship", np.float32, (), 0.0),
    ("next_request_at", np.float64, (), math.inf),
    ("in_flight", np.bool_, (), False),
    ("sent_at", np.float64, (), -math.inf),
    ("intent_at", np.float64, (), math.nan),
    ("intent_stamp", np.float64, (), -math.inf),
    ("wants_bark", np.bool_, (), False),
    ("last_interaction", np.float64, (), -math.inf),
)


def finite_point(what: str, value: Sequence[float] | NDArray[Any]) -> tuple[float, float]:
    """Two finite floats, or a ValueError naming `what`."""
    try:
        x, y = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be two numbers (x, y), got {value!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise ValueError(f"{what} must be finite, got ({x}, {y})")
    return x, y


class Crowd:
    """Every NPC's state in NumPy columns: rows `0 .. len(crowd) - 1` are live.

    Columns (each an attribute; slice `[:len(crowd)]` for the live rows):
    kinematics `pos`, `vel` (N, 2 float32, metres and metres per second), `heading` (radians,
    0 = +x), `home`, `max_speed`, `max_accel`, `body_radius`, `archetype` (id in `archetypes`);
    behaviour `policy` (a `Policy`), `target` (a row, `PLAYER`, `PLACE` or `NO_TARGET`), `point`,
    `radius`, `reach`, `speed`, `then`; steering `desired` (the desired velocity of the policy's
    last run), `blend_from` (the desired velocity a policy change cross-fades from),
    `blend_left` and `steer_lag` (seconds of the frames the micro-policy skipped since it last
    ran or was switched: bronze NPCs run every `bronze_every` frames);
    policy state `route`, `waypoint`, `wander_angle`, `stalk_phase`, the horde's `cohesion`
    and `alignment` (refreshed at `flock_period_s`); activation `tier`, `quest`,
    `relationship`; intent-cache clocks `next_request_at`, `in_flight`, `sent_at`, `intent_at`,
    `intent_stamp`, `wants_bark`; and `last_interaction`.

    Change the crowd (add, remove, teleport) between frames, from the thread that runs them.
    """

    pos: F32
    vel: F32
    heading: F32
    home: F32
    max_speed: F32
    max_accel: F32
    body_radius: F32
    archetype: NDArray[np.int16]
    policy: I8
    target: I32
    point: F32
    radius: F32
    reach: F32
    speed: F32
    then: I8
    desired: F32
    blend_from: F32
    blend_left: F32
    steer_lag: F64
    route: I32
    waypoint: I32
    wander_angle: F32
    stalk_phase: I8
    cohesion: F32
    alignment: F32
    tier: I8
    quest: Bools
    relationship: F32
    next_request_at: F64
    in_flight: Bools
    sent_at: F64
    intent_at: F64
    intent_stamp: F64
    wants_bark: Bools
    last_interaction: F64

    def __init__(self, archetypes: ArchetypeTable | None = None, capacity: int = 64) -> None:
        self.archetypes = archetypes if archetypes is not None else ArchetypeTable()
        self._n = 0
        self._revision = 0
        self._capacity = max(1, capacity)
        for name, dtype, shape, fill in _COLUMNS:
            setattr(self, name, np.full((self._capacity, *shape), fill, dtype=dtype))
        self._ids: list[str] = []
        self._index: dict[str, int] = {}
        self._route_names: dict[str, int] = {}
        self._route_points: list[F32] = []
        self.waypoints: F32 = np.zeros((0, 2), dtype=np.float32)
        """Every route's waypoints, concatenated."""
        self.route_start: I32 = np.zeros(0, dtype=np.int32)
        """Row in `waypoints` of each route's first waypoint."""
        self.route_len: I32 = np.zeros(0, dtype=np.int32)
        """Number of waypoints of each route."""

    # -- membership -------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @property
    def revision(self) -> int:
        """A number that changes whenever rows are added, removed or moved (not when columns
        change): whatever was cached per row is stale when it differs."""
        return self._revision

    def __contains__(self, npc_id: object) -> bool:
        return npc_id in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    @property
    def ids(self) -> Sequence[str]:
        """NPC ids in row order."""
        return tuple(self._ids)

    def index_of(self, npc_id: str) -> int:
        """The row of an NPC.

        Raises:
            KeyError: no NPC has this id.
        """
        try:
            return self._index[npc_id]
        except KeyError:
            raise KeyError(f"no NPC {npc_id!r} in the crowd") from None

    def find(self, npc_id: str) -> int | None:
        """The row of an NPC, or None."""
        return self._index.get(npc_id)

    def id_at(self, row: int) -> str:
        """The id of the NPC in a row."""
        return self._ids[row]

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
    ) -> int:
        """Add an NPC at `position` running its archetype's default behaviour; return its row.

        Raises:
            ValueError: a duplicate id, an unknown archetype or route, a non-finite position,
                heading, speed or relationship.
        """
        if not isinstance(npc_id, str) or _ID.match(npc_id) is None:
            raise ValueError(f"NPC id {npc_id!r} is not a protocol id (pattern {ID_PATTERN})")
        if npc_id in self._index:
            raise ValueError(f"NPC {npc_id!r} is already in the crowd")
        kind = self.archetypes.id_of(archetype)
        x, y = finite_point(f"position of NPC {npc_id!r}", position)
        if not math.isfinite(heading):
            raise ValueError(f"heading of NPC {npc_id!r} must be finite, got {heading}")
        if not math.isfinite(relationship):
            raise ValueError(f"relationship of NPC {npc_id!r} must be finite")
        route_id = -1 if route is None else self.route_id(route)
        spec = self.archetypes[kind]
        speed = spec.max_speed if max_speed is None else max_speed
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"max_speed of NPC {npc_id!r} must be positive, got {speed}")
        if self._n == self._capacity:
            self._grow(self._capacity * 2)
        row = self._n
        for name, _, _, fill in _COLUMNS:
            getattr(self, name)[row] = fill
        self.pos[row] = (x, y)
        self.home[row] = (x, y)
        self.heading[row] = heading
        self.wander_angle[row] = heading
        self.archetype[row] = kind
        self.max_speed[row] = speed
        self.max_accel[row] = spec.max_accel
        self.body_radius[row] = spec.body_radius
        self.route[row] = route_id
        self.quest[row] = quest
        self.relationship[row] = relationship
        self._ids.append(npc_id)
        self._index[npc_id] = row
        self._n += 1
        self._revision += 1
        self.apply_defaults(np.array([row], dtype=np.intp), blend_s=0.0)
        return row

    def remove(self, npc_id: str, *, blend_s: float = 0.0) -> list[str]:
        """Remove an NPC. NPCs that were aiming at it go back to their defaults, blending
        over `blend_s` seconds.

        Returns:
            The ids of the NPCs whose target was the removed one.

        Raises:
            KeyError: no NPC has this id.
        """
        row = self.index_of(npc_id)
        last = self._n - 1
        # Which rows aim at the removed NPC, and at the last one (about to move into its row),
        # taken before the move; the masks' own rows then move the same way as the columns.
        lost = self.target[: self._n] == row
        moved = self.target[: self._n] == last if row != last else np.zeros_like(lost)
        for name, _, _, _ in _COLUMNS:
            column = getattr(self, name)
            column[row] = column[last]
        moved_id = self._ids[last]
        self._ids[row] = moved_id
        self._index[moved_id] = row
        self._ids.pop()
        del self._index[npc_id]
        self._n = last
        self._revision += 1
        lost[row], moved[row] = lost[last], moved[last]
        live = self.target[:last]
        live[moved[:last]] = row
        orphans: Index = np.flatnonzero(lost[:last])
        live[orphans] = NO_TARGET
        self.apply_defaults(orphans, blend_s=blend_s)
        return [self._ids[i] for i in orphans.tolist()]

    def teleport(self, npc_id: str, position: Sequence[float]) -> None:
        """Put an NPC somewhere else (game physics, a cutscene), keeping its velocity.

        Raises:
            KeyError: no NPC has this id.
            ValueError: the position is not two finite numbers.
        """
        row = self.index_of(npc_id)
        self.pos[row] = finite_point(f"position of NPC {npc_id!r}", position)

    def set_positions(self, rows: NDArray[np.integer[Any]], positions: NDArray[Any]) -> None:
        """Overwrite many NPCs' positions at once (game physics corrections).

        Raises:
            ValueError: a position is not finite, or the shapes do not match.
        """
        values = np.asarray(positions, dtype=np.float32)
        if values.shape != (len(rows), 2):
            raise ValueError(f"positions must have shape ({len(rows)}, 2), got {values.shape}")
        if not np.isfinite(values).all():
            raise ValueError("positions must be finite (got NaN or infinity)")
        self.pos[rows] = values

    @property
    def positions(self) -> F32:
        """A read-only view of the live NPCs' positions, (N, 2) metres."""
        view = self.pos[: self._n]
        view.flags.writeable = False
        return view

    # -- routes -----------------------------------------------------------------------------

    def add_route(self, name: str, points: Iterable[Sequence[float]]) -> int:
        """Register a patrol route (a loop of waypoints) and return its id.

        Raises:
            ValueError: the name is taken, fewer than one waypoint, or a waypoint not finite.
        """
        if name in self._route_names:
            raise ValueError(f"route {name!r} already exists")
        loop = [finite_point(f"waypoint of route {name!r}", p) for p in points]
        if not loop:
            raise ValueError(f"route {name!r} needs at least one waypoint")
        self._route_names[name] = len(self._route_points)
        self._route_points.append(np.array(loop, dtype=np.float32))
        self.waypoints = np.concatenate(self._route_points).astype(np.float32)
        lengths = [len(p) for p in self._route_points]
        self.route_len = np.array(lengths, dtype=np.int32)
        self.route_start = (np.cumsum(lengths) - lengths).astype(np.int32)
        return self._route_names[name]

    def route_id(self, name: str) -> int:
        """The id of a registered route.

        Raises:
            ValueError: no route has this name.
        """
        try:
            return self._route_names[name]
        except KeyError:
            raise ValueError(f"unknown route {name!r}; add it with add_route first") from None

    # -- behaviour --------------------------------------------------------------------------

    def set_behaviour(
        self,
        rows: Index,
        policy: NDArray[np.integer[Any]] | int,
        *,
        target: NDArray[np.integer[Any]] | int = NO_TARGET,
        point: NDArray[np.floating[Any]] | tuple[float, float] | None = None,
        radius: NDArray[np.floating[Any]] | float = 0.0,
        reach: NDArray[np.floating[Any]] | float = math.inf,
        speed: NDArray[np.floating[Any]] | float = 0.5,
        then: NDArray[np.integer[Any]] | int = NO_POLICY,
        blend_s: float,
    ) -> None:
        """Switch NPCs to a behaviour; cross-fade from the old steering over `blend_s` seconds.

        A row whose policy and target do not change keeps running without a new blend (its
        parameters are updated in place). PATROL without a route becomes IDLE.
        """
        if rows.size == 0:
            return
        new_policy = np.broadcast_to(np.asarray(policy, dtype=np.int8), rows.shape).copy()
        new_policy[(new_policy == Policy.PATROL) & (self.route[rows] < 0)] = Policy.IDLE
        new_target = np.broadcast_to(np.asarray(target, dtype=np.int32), rows.shape)
        changed = (self.policy[rows] != new_policy) | (self.target[rows] != new_target)
        switch = rows[changed]
        if switch.size:
            self.blend_from[switch] = self.desired[switch]
            self.blend_left[switch] = blend_s
            self.steer_lag[switch] = 0.0  # the new policy steers from the switch on
            self.stalk_phase[switch] = StalkPhase.PROWL
            wander = switch[new_policy[changed] == Policy.WANDER]
            self.wander_angle[wander] = self.heading[wander]
        self.policy[rows] = new_policy
        self.target[rows] = new_target
        if point is not None:
            self.point[rows] = point
        self.radius[rows] = radius
        self.reach[rows] = reach
        self.speed[rows] = speed
        self.then[rows] = then

    def apply_defaults(self, rows: Index, *, blend_s: float) -> None:
        """Put NPCs back on their archetype's default behaviour (vectorised)."""
        if rows.size == 0:
            return
        table = self.archetypes
        kind = self.archetype[rows]
        self.set_behaviour(
            rows,
            table.default_policy[kind],
            target=np.where(table.default_player[kind], PLAYER, NO_TARGET),
            point=self.home[rows],
            radius=table.default_radius[kind],
            reach=table.default_reach[kind],
            speed=table.default_speed[kind],
            then=table.default_then[kind],
            blend_s=blend_s,
        )

    # -- storage ----------------------------------------------------------------------------

    def _grow(self, capacity: int) -> None:
        for name, dtype, shape, fill in _COLUMNS:
            old = getattr(self, name)
            new = np.full((capacity, *shape), fill, dtype=dtype)
            new[: self._n] = old[: self._n]
            setattr(self, name, new)
        self._capacity = capacity
