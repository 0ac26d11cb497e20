"""The micro-policies, vectorised: every NPC's desired velocity from its policy, in one pass.

Each policy is a function over the rows running it (NumPy fancy indexing, no loop over NPCs).
When an NPC's policy changes, the desired velocity it had at that moment is kept and
cross-faded into the new policy's over the blend time (a switch in the middle of a blend
starts from the blended value, so chains of switches stay smooth too); velocity then follows
the desired one under the NPC's acceleration limit, positions integrate, and overlapping
bodies are pushed apart. The close pairs come from a neighbour list kept across frames
(`NeighbourList`: exact every frame, searched again in the background); horde separation
steering is refreshed from them every `separation_period_s`, cohesion and alignment every
`flock_period_s`.

Vectors are handled as separate, contiguous x and y columns (copied out of the crowd's (N, 2)
arrays once a frame and written back once): NumPy gathers, scatters and broadcasts
one-dimensional contiguous float32 columns many times faster than rows of two or strided
views, and at ten thousand NPCs that is most of the frame. Where pairs of NPCs are gathered
(overlap pushes), each position is read as one complex64 number: one gather per pair end
instead of two, with the same float32 arithmetic on each part. Gathers use `take`, which
skips the general indexing machinery. The rows of each policy, and of each kind of target,
are kept from frame to frame while the policy and target columns stay the same (`_Layout`),
and every NPC that wanders in a frame (wanderers, and horde members and stalkers with
nothing in reach) does so in one pass.

Far-off (bronze) NPCs run their micro-policies every `bronze_every` frames (more in a crowd
past `bronze_per_frame` of them: `Steering.bronze_cadence`), taking turns by row, so that a
frame runs only a share of them; each run steers over the time since the NPC's
own last one (its `steer_lag` and the frame's `dt`). Moving along the velocity, the overlap
pushes and the neighbour list are per frame for every NPC: positions advance smoothly, and no
body sinks into another, whichever NPCs ran. The frame's geometry (positions, targets,
distances) is taken for every row in contiguous passes, cheaper than gathering the rows that
run; the policies, the wandering, the blends, the velocity and heading updates (the gathers,
the random numbers, the trigonometry) only for the rows that run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mythic.control._archetypes import NO_POLICY, Policy
from mythic.control._crowd import (
    F32,
    F64,
    I8,
    I32,
    NO_TARGET,
    PLAYER,
    Bools,
    Crowd,
    Index,
    StalkPhase,
    Tier,
    finite_point,
)
from mythic.control._grid import (
    C64,
    NeighbourList,
    complex_positions,
    neighbourhood_means,
    squared_norm,
)
from mythic.control._settings import ControlSettings

_EPS = np.float32(1e-6)
_BRAKE = np.float32(0.8)  # plan stops with 80% of the acceleration limit: no overshoot
_MOVING = np.float32(0.15)  # m/s: slower than this, an NPC keeps its heading
_REAPPROACH = np.float32(1.0)  # m: a partner this much beyond talking distance is followed
_ONE = np.float32(1.0)
_TAU = np.float32(2 * math.pi)
_INV_TAU = np.float32(1 / (2 * math.pi))
# Metres a body may be pushed by the first overlap pass on top of its own motion: pairs
# further apart than their bodies plus both moves plus this cannot touch in this frame.
_PUSH_SLACK = 0.1
# Frames a due periodic refresh waits at most for another to have its frame alone.
_MOST_WAIT = 2
# Stalk phases as plain ints: NumPy compares and fills with an IntEnum member several times
# slower than with an int.
_PROWL, _CREEP, _FREEZE, _RUSH, _FEED = (int(p) for p in StalkPhase)
_I8 = tuple(np.int8(p) for p in StalkPhase)  # the phases as int8 scalars, to pick from
_WANDER, _HORDE, _STALK = int(Policy.WANDER), int(Policy.HORDE), int(Policy.STALK)
_BRONZE = int(Tier.BRONZE)


@dataclass(frozen=True, slots=True)
class Player:
    """The player this frame: the centre of the tiers, the hordes' target, the stalkers' prey.

    Raises:
        ValueError: a coordinate, velocity or the facing is NaN or infinite.
    """

    position: tuple[float, float]
    """Metres, in the same frame as the NPCs."""
    velocity: tuple[float, float] = (0.0, 0.0)
    """Metres per second."""
    facing: float = 0.0
    """Radians, 0 = +x: where the player looks (the view cone of predictions, what a stalked
    player sees)."""

    def __init__(
        self,
        position: Sequence[float],
        velocity: Sequence[float] = (0.0, 0.0),
        facing: float = 0.0,
    ) -> None:
        object.__setattr__(self, "position", finite_point("player position", position))
        object.__setattr__(self, "velocity", finite_point("player velocity", velocity))
        if not math.isfinite(facing):
            raise ValueError(f"player facing must be finite, got {facing}")
        object.__setattr__(self, "facing", float(facing))


@dataclass(frozen=True, slots=True)
class _Layout:
    """The rows whose micro-policy runs in a frame, and of those the rows of each policy and
    of each kind of target, from the policy, target and tier columns as they were."""

    due: Index | None
    """The rows that run, in row order; None: every row."""
    running: Bools | None
    """`due` as a mask over every row; None: every row."""
    rows: list[tuple[int, Index]]
    """Each policy present among the rows that run and its rows, in row order."""
    on_npc: Index
    """Rows that run whose target is an NPC ..."""
    other: I32
    """... and that NPC's row."""
    on_player: Index
    """Rows that run whose target is the player."""
    has_target: Bools
    """Every row: whether it has a target."""


@dataclass(slots=True)
class _Frame:
    """One evaluation: every NPC's geometry toward its target, and the outputs, by column."""

    px: F32
    py: F32
    tx: F32
    ty: F32
    ox: F32
    """Target minus position, x."""
    oy: F32
    dist: F32
    cruise: F32
    """Cruising speed, `speed * max_speed` (every policy that walks at its speed reads it)."""
    engaged: Bools
    """The target is in reach (`reach`); a horde member or stalker without one roams."""
    vx: F32
    """Desired velocity, x (zero unless a policy sets it; when the policies run, it holds the
    wandering velocity of every row that wanders)."""
    vy: F32
    fx: F32
    """Direction to face, x; NaN where the NPC faces where it walks."""
    fy: F32
    elapsed: float | F64
    """Seconds each row that runs steers over: the frame's `dt` when every row ran in the
    frame before too, else a column over every row (its `steer_lag` and `dt`)."""
    switches: list[tuple[Index, I8 | int, int]] = field(default_factory=list)
    """Policy changes the policies ask for: rows, new policy, its follow-up."""

    def elapsed_at(self, rows: Index) -> float | F64:
        """The seconds `rows` steer over."""
        return _seconds_at(self.elapsed, rows)

    def face_target(self, rows: Index) -> None:
        """Face the target (rows whose target is not on top of them)."""
        if rows.size == 0:
            return
        inv = _ONE / self.dist.take(rows)
        self.fx[rows] = self.ox.take(rows) * inv
        self.fy[rows] = self.oy.take(rows) * inv


def _seconds_at(seconds: float | F64, rows: Index) -> float | F64:
    """A time the same for every row, or a column of times (one per row) at `rows`."""
    return seconds if isinstance(seconds, float) else seconds.take(rows)


def _f32(seconds: float | F64) -> np.float32 | F32:
    """A time, or a column of times, in float32."""
    return np.float32(seconds) if isinstance(seconds, float) else seconds.astype(np.float32)


def _at(column: F32, n: int, rows: Index | None) -> F32:
    """A column at `rows` (a copy), or its first `n` rows for None (a view: to read only)."""
    out: F32 = column[:n] if rows is None else column.take(rows)
    return out


def _put(column: F32, n: int, rows: Index | None, values: F32) -> None:
    """Write one value per row of `rows` (its first `n` rows for None) into a column."""
    if rows is None:
        column[:n] = values
    else:
        column[rows] = values


def _take_xy(column: F32, n: int, rows: Index | None) -> tuple[F32, F32]:
    """Copies of the x and y of an (N, 2) column at `rows`, or at its first `n` rows for None.
    Rows are gathered as complex numbers: one gather for both, and `take` on a column of
    the pair (a strided view) would copy the whole column first."""
    if rows is None:
        return column[:n, 0].copy(), column[:n, 1].copy()
    z = complex_positions(column[:n]).take(rows)
    return z.real.copy(), z.imag.copy()


def _put_xy(column: F32, n: int, rows: Index | None, x: F32, y: F32) -> None:
    """Write x and y of `rows` (its first `n` rows for None) into an (N, 2) column."""
    if rows is None:
        column[:n, 0] = x
        column[:n, 1] = y
        return
    z = np.empty(len(rows), dtype=np.complex64)
    z.real = x
    z.imag = y
    column[:n].view(np.complex64)[rows, 0] = z


def _lay_out(policies: I8, targets: I32, tiers: I8 | None, turn: int | None, every: int) -> _Layout:
    """Which rows run (all of them for a `turn` of None; else the rows that are not bronze
    and the bronze rows `r` with `r % every == turn`), and of those which run each policy and
    which aim at an NPC or the player."""
    due: Index | None = None
    running: Bools | None = None
    if turn is not None and tiers is not None:
        mask = tiers != _BRONZE
        mask |= np.arange(len(tiers)) % every == turn
        if not mask.all():
            due, running = mask.nonzero()[0], mask
    kinds = policies if due is None else policies.take(due)
    aims = targets if due is None else targets.take(due)
    present = np.bincount(kinds.astype(np.intp), minlength=len(Policy))
    by_policy = np.argsort(kinds, kind="stable")
    on_npc = (aims >= 0).nonzero()[0]
    other = aims.take(on_npc)
    on_player = (aims == PLAYER).nonzero()[0]
    if due is not None:  # back from places among the rows that run to rows
        by_policy, on_npc, on_player = due.take(by_policy), due.take(on_npc), due.take(on_player)
    ends = np.cumsum(present)
    rows = [
        (policy, by_policy[ends[policy] - present[policy] : ends[policy]])
        for policy in present.nonzero()[0].tolist()
    ]
    layout = _Layout(
        due=due,
        running=running,
        rows=rows,
        on_npc=on_npc,
        other=other,
        on_player=on_player,
        has_target=targets != NO_TARGET,
    )
    for array in (by_policy, on_npc, other, on_player, due, running):
        if array is not None:
            array.flags.writeable = False  # shared by the frames until the layout changes
    return layout


def _length(x: F32, y: F32) -> F32:
    out: F32 = x * x
    out += y * y
    return np.sqrt(out, out=out)


def _clip_length(x: F32, y: F32, limit: F32 | np.float32) -> tuple[F32, F32]:
    """The vectors (x, y) shortened to at most `limit`."""
    scale = _length(x, y)
    np.maximum(scale, _EPS, out=scale)
    np.divide(limit, scale, out=scale)
    np.minimum(scale, _ONE, out=scale)
    return x * scale, y * scale


def _wrap(angle: F32) -> F32:
    """Angles into [-pi, pi]."""
    turns: F32 = angle * _INV_TAU
    np.rint(turns, out=turns)
    turns *= _TAU
    return np.subtract(angle, turns, out=turns)


def _x(column: F32) -> F32:
    out: F32 = column[:, 0]
    return out


def _y(column: F32) -> F32:
    out: F32 = column[:, 1]
    return out


class Steering:
    """Runs every NPC's micro-policy for one frame and moves the crowd.

    Owns the seeded random generator of wandering, so a run is reproducible from its seed.
    """

    def __init__(self, settings: ControlSettings, rng: np.random.Generator) -> None:
        self.settings = settings
        self.rng = rng
        self._handlers: dict[int, Callable[[Crowd, _Frame, Index], None]] = {
            Policy.IDLE: self._idle,
            Policy.WANDER: self._wander,
            Policy.SEEK: self._seek,
            Policy.FLEE: self._flee,
            Policy.FOLLOW: self._follow,
            Policy.PATROL: self._patrol,
            Policy.FACE_TALK: self._face_talk,
            Policy.HORDE: self._horde,
            Policy.STALK: self._stalk,
        }
        half_fov = math.radians(settings.prey_fov_deg) / 2
        self._seen_cos = np.float32(math.cos(half_fov))
        self._player_pos = (np.float32(0), np.float32(0))
        self._player_vel = (np.float32(0), np.float32(0))
        self._player_dir = (np.float32(1), np.float32(0))
        self._flock_clock = math.inf  # seconds since cohesion and alignment were refreshed
        self._busy = False  # a periodic refresh ran in this frame already
        self._waited: dict[str, int] = {}  # frames a due refresh waited for others
        self._separation: tuple[F32, F32, F32] | None = None
        self._separation_clock = math.inf  # seconds since separation was refreshed
        self._separation_rows: object = None  # the crowd's rows it was refreshed for
        self._separation_fresh = False  # looked at in this frame
        self.neighbours = NeighbourList(settings.neighbour_radius_m, settings.neighbour_skin_m)
        """The pairs closer than `neighbour_radius_m`, kept across frames."""
        # The columns the kept layouts are for, and a layout per turn (None: every row).
        self._kept_columns: tuple[I8, I32, I8 | None] | None = None
        self._layouts: dict[int | None, _Layout] = {}
        self._kept_every = 0  # the bronze cadence the kept layouts are for
        self.cadence = 1
        """The frames between two runs of a bronze NPC's micro-policy in the last frame
        (`bronze_cadence`)."""
        self._frames = 0  # frames stepped: whose turn it is among the bronze rows
        self._revision: object = None  # the crowd's rows as of the last frame
        self._lagging = False  # some row skipped a frame since it last ran

    # -- the frame --------------------------------------------------------------------------

    def step(self, crowd: Crowd, player: Player, dt: float, *, busy: bool = False) -> None:
        """Advance every NPC by `dt` seconds: policies, blending, velocity, position, heading.

        The micro-policies, blends, velocities and headings are updated for the rows that run
        in this frame (`_layout`: every row, or all but the bronze rows whose turn it is
        not), each over the time since its own last run; every NPC then moves along its
        velocity for `dt` and overlapping bodies are pushed apart.

        `busy` says the caller ran a periodic refresh of its own in this frame (the tiers):
        the horde's periodic refreshes then wait for a later frame. One periodic refresh
        runs in a frame (separation before cohesion), so that their costs do not add up in
        one frame; a refresh due at the same time as another runs a frame or two late, and
        never later than `_MOST_WAIT` frames.
        """
        n = len(crowd)
        if n == 0:
            return
        dt = float(dt)
        px, py = player.position
        vx, vy = player.velocity
        self._player_pos = (np.float32(px), np.float32(py))
        self._player_vel = (np.float32(vx), np.float32(vy))
        facing = player.facing
        self._player_dir = (np.float32(math.cos(facing)), np.float32(math.sin(facing)))
        self._busy = busy
        self._separation_fresh = False
        self._separation_clock += dt
        self._flock_clock += dt
        self.neighbours.update(crowd.pos[:n], crowd.revision, crowd.vel[:n], dt)

        layout = self._layout(crowd)
        due = layout.due
        frame = self._evaluate(crowd, layout, self._elapsed(crowd, due, dt))
        dx, dy = frame.vx, frame.vy
        left = crowd.blend_left[:n]
        blending = (left > 0).nonzero()[0]
        if layout.running is not None and blending.size:
            blending = blending.take(layout.running.take(blending).nonzero()[0])
        if blending.size:
            blend_s = np.float32(max(self.settings.blend_s, 1e-6))
            w = np.clip(1 - left[blending] / blend_s, 0, 1)
            w = w * w * (3 - 2 * w)
            keep = 1 - w
            dx[blending] = _x(crowd.blend_from)[blending] * keep + dx[blending] * w
            dy[blending] = _y(crowd.blend_from)[blending] * keep + dy[blending] * w
            left[blending] = np.maximum(left[blending] - _f32(frame.elapsed_at(blending)), 0)
        _put_xy(crowd.desired, n, due, _at(dx, n, due), _at(dy, n, due))

        self._integrate(crowd, frame, due, dt)
        self._frames += 1
        for switch, policy, then in frame.switches:
            crowd.set_behaviour(
                switch,
                policy,
                target=crowd.target[switch],
                radius=crowd.radius[switch],
                reach=crowd.reach[switch],
                speed=crowd.speed[switch],
                then=then,
                blend_s=self.settings.blend_s,
            )

    def _elapsed(self, crowd: Crowd, due: Index | None, dt: float) -> float | F64:
        """The seconds each row that runs (`due`; None: every row) steers over: `dt` while
        every row runs every frame; else per row, its `steer_lag` (the frames it skipped)
        and `dt`. The rows that run start their lag again; the others add `dt` to it."""
        if due is None and not self._lagging:
            return dt
        lag = crowd.steer_lag[: len(crowd)]
        lag += dt
        elapsed: F64 = lag.copy()
        if due is None:
            lag[:] = 0.0
        else:
            lag[due] = 0.0
        self._lagging = due is not None
        return elapsed

    def _evaluate(self, crowd: Crowd, layout: _Layout, elapsed: float | F64) -> _Frame:
        """The desired velocity (and facing) of the rows that run; the geometry toward the
        targets is taken for every row (contiguous passes cost less than gathering)."""
        n = len(crowd)
        pos = crowd.pos[:n]
        px = pos[:, 0].copy()
        py = pos[:, 1].copy()
        point = crowd.point[:n]
        tx = point[:, 0].copy()
        ty = point[:, 1].copy()
        if layout.on_npc.size:
            tx[layout.on_npc] = px.take(layout.other)
            ty[layout.on_npc] = py.take(layout.other)
        if layout.on_player.size:
            tx[layout.on_player], ty[layout.on_player] = self._player_pos
        ox = tx - px
        oy = ty - py
        dist = _length(ox, oy)
        frame = _Frame(
            px=px,
            py=py,
            tx=tx,
            ty=ty,
            ox=ox,
            oy=oy,
            dist=dist,
            cruise=crowd.speed[:n] * crowd.max_speed[:n],
            engaged=layout.has_target & (dist <= crowd.reach[:n]),
            vx=np.zeros(n, dtype=np.float32),
            vy=np.zeros(n, dtype=np.float32),
            fx=np.full(n, np.nan, dtype=np.float32),
            fy=np.full(n, np.nan, dtype=np.float32),
            elapsed=elapsed,
        )
        self._wander_all(crowd, frame, layout)
        for policy, rows in layout.rows:
            self._handlers[policy](crowd, frame, rows)
        return frame

    def bronze_cadence(self, crowd: Crowd) -> int:
        """The frames between two runs of a bronze NPC's micro-policy: `bronze_every`, or
        more where the crowd has over `bronze_per_frame` bronze NPCs a frame at that."""
        s = self.settings
        every = s.bronze_every
        if s.bronze_per_frame:
            bronze = int(np.count_nonzero(crowd.tier[: len(crowd)] == _BRONZE))
            every = max(every, -(-bronze // s.bronze_per_frame))
        self.cadence = every
        return every

    def _layout(self, crowd: Crowd) -> _Layout:
        """The rows that run in this frame, and which of them run each policy and aim at an
        NPC or the player: the same every `bronze_every` frames until a policy, a target or
        a tier changes, so kept until then, one per turn.

        Bronze rows take turns by row: row `r` runs when `r % cadence` is this frame's turn
        (`bronze_cadence`), the other tiers every frame. Every row runs in the frame after
        rows were added or removed: a row moved into another's place takes that row's turn
        from then on, so no row waits more than the cadence between runs (but once, as the
        cadence changes, the old and the new one).
        """
        n = len(crowd)
        every = self.bronze_cadence(crowd)
        policies = crowd.policy[:n]
        targets = crowd.target[:n]
        tiers = crowd.tier[:n] if every > 1 else None
        kept = self._kept_columns
        if not (
            kept is not None
            and every == self._kept_every
            and np.array_equal(kept[0], policies)
            and np.array_equal(kept[1], targets)
            and (tiers is None or (kept[2] is not None and np.array_equal(kept[2], tiers)))
        ):
            self._kept_every = every
            self._kept_columns = (
                policies.copy(),
                targets.copy(),
                None if tiers is None else tiers.copy(),
            )
            self._layouts.clear()
        same_rows = crowd.revision == self._revision
        turn = self._frames % every if every > 1 and same_rows else None
        self._revision = crowd.revision
        layout = self._layouts.get(turn)
        if layout is None:
            layout = self._layouts[turn] = _lay_out(policies, targets, tiers, turn, every)
        return layout

    def _integrate(self, crowd: Crowd, f: _Frame, due: Index | None, dt: float) -> None:
        """The velocities and headings of the rows that run (`due`; None: every row), each
        over the time it steers over; then every NPC moves along its velocity for the frame's
        `dt`, and overlapping bodies are pushed apart."""
        n = len(crowd)
        s = self.settings
        elapsed = f.elapsed if due is None else _seconds_at(f.elapsed, due)
        vx, vy = _take_xy(crowd.vel, n, due)
        wx, wy = _at(f.vx, n, due), _at(f.vy, n, due)
        cx, cy = _clip_length(wx - vx, wy - vy, _at(crowd.max_accel, n, due) * _f32(elapsed))
        vx += cx
        vy += cy
        vx, vy = _clip_length(vx, vy, _at(crowd.max_speed, n, due))
        _put_xy(crowd.vel, n, due, vx, vy)
        step = np.float32(dt)
        px, py = f.px, f.py  # the frame's own copies, from here on the new positions
        px += _x(crowd.vel)[:n] * step  # every NPC: those that did not run move on as they were
        py += _y(crowd.vel)[:n] * step
        pos = crowd.pos[:n]
        pos[:, 0] = px
        pos[:, 1] = py
        self._separate_bodies(crowd, s.overlap_passes, dt)

        heading = _at(crowd.heading, n, due)
        goal = np.arctan2(vy, vx)
        still = (~(_length(vx, vy) > _MOVING)).nonzero()[0]
        if still.size:
            goal[still] = heading.take(still)
        fx, fy = _at(f.fx, n, due), _at(f.fy, n, due)
        facing = (fx == fx).nonzero()[0]  # not NaN
        if facing.size:
            goal[facing] = np.arctan2(fy.take(facing), fx.take(facing))
        limit = _f32(s.turn_rate * elapsed)
        goal -= heading
        turn = _wrap(goal)
        np.minimum(turn, limit, out=turn)
        np.maximum(turn, -limit, out=turn)
        turn += heading
        _put(crowd.heading, n, due, _wrap(turn))

    def _separate_bodies(self, crowd: Crowd, passes: int, dt: float) -> None:
        """Push overlapping bodies apart, each by half the overlap (position-based).

        Only the listed pairs within both moves plus `_PUSH_SLACK` of touching are looked at
        (`NeighbourList.touching`); of those, the second and later passes look again only at
        the pairs the first pass's pushes could bring into touch.
        """
        n = len(crowd)
        if passes == 0 or n < 2:
            return
        body = crowd.body_radius[:n]
        # Only pairs that can touch after this frame's moves need checking.
        fastest = float(crowd.max_speed[:n].max())
        i, j, reach = self.neighbours.touching(body, 2 * fastest * dt + _PUSH_SLACK)
        if i.size == 0:
            return
        z: C64 = crowd.pos[:n].view(np.complex64)[:, 0]  # a view: the pushes write through
        for k in range(passes):
            dz = z.take(j)
            dz -= z.take(i)
            d2 = squared_norm(dz)
            hit = (d2 < reach * reach).nonzero()[0]
            if hit.size == 0:
                return
            hi, hj = i.take(hit), j.take(hit)
            dz = dz.take(hit)
            dist = np.sqrt(d2.take(hit))
            half = (reach.take(hit) - dist) * np.float32(0.5)
            if k == 0 and passes > 1:
                within = reach + np.float32(_PUSH_SLACK)
                near = (d2 < within * within).nonzero()[0]
                i, j, reach = i.take(near), j.take(near), reach.take(near)
            # Coincident bodies split along a fixed per-pair direction, not a NaN.
            same = (dist < _EPS).nonzero()[0]
            if same.size:
                angle = (hi[same] * 2.399963).astype(np.float32)
                dz.real[same] = np.cos(angle)
                dz.imag[same] = np.sin(angle)
                dist[same] = 1.0
            push = dz * (half / dist)
            np.subtract.at(z, hi, push)
            np.add.at(z, hj, push)

    # -- the policies -----------------------------------------------------------------------

    def _idle(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        """Stand: the desired velocity stays zero."""

    def _face_talk(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        dist = f.dist.take(i)
        f.face_target(i[dist > _EPS])
        # The partner walked off: go after them, then face them again.
        gone = dist > crowd.radius.take(i) + _REAPPROACH
        if gone.any():
            f.switches.append((i[gone], Policy.SEEK, Policy.FACE_TALK))

    def _arrive(
        self, crowd: Crowd, f: _Frame, i: Index, ox: F32, oy: F32, dist: F32, stop: F32
    ) -> tuple[F32, F32]:
        """Velocity toward (ox, oy) that cruises and brakes to a halt `stop` metres short."""
        gap = np.maximum(dist - stop, 0)
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel.take(i) * gap)
        scale = np.minimum(f.cruise.take(i), brake)
        scale /= np.maximum(dist, _EPS)
        return ox * scale, oy * scale

    def _seek(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        dist = f.dist.take(i)
        radius = crowd.radius.take(i)
        f.vx[i], f.vy[i] = self._arrive(crowd, f, i, f.ox.take(i), f.oy.take(i), dist, radius)
        arrived = dist - radius <= self.settings.arrive_tolerance_m
        f.face_target(i[arrived & (dist > _EPS)])
        follow_up = crowd.then.take(i)
        done = arrived & (follow_up != NO_POLICY)
        if done.any():
            f.switches.append((i[done], follow_up[done], NO_POLICY))

    def _flee(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        dist = f.dist.take(i)
        radius = crowd.radius.take(i)
        inv = -_ONE / np.maximum(dist, _EPS)
        ax = f.ox.take(i) * inv
        ay = f.oy.take(i) * inv
        on_top = (dist < _EPS).nonzero()[0]
        if on_top.size:
            heading = crowd.heading[i[on_top]]
            ax[on_top] = np.cos(heading)
            ay[on_top] = np.sin(heading)
        ramp = np.maximum(np.float32(0.15) * radius, np.float32(0.5))
        urge = np.clip((radius - dist) / ramp, 0, 1)
        speed = urge * crowd.speed.take(i) * crowd.max_speed.take(i)
        f.vx[i] = ax * speed
        f.vy[i] = ay * speed

    def _target_motion(self, crowd: Crowd, i: Index) -> tuple[F32, F32, F32, F32]:
        """Velocity and facing direction (x, y, x, y) of each row's target (a point stands
        still, facing +x)."""
        target = crowd.target.take(i)
        vx = np.zeros(len(i), dtype=np.float32)
        vy = np.zeros(len(i), dtype=np.float32)
        ax = np.zeros(len(i), dtype=np.float32)
        ay = np.zeros(len(i), dtype=np.float32)
        on_npc = (target >= 0).nonzero()[0]
        if on_npc.size:
            other = target.take(on_npc)
            vx[on_npc] = _x(crowd.vel)[other]
            vy[on_npc] = _y(crowd.vel)[other]
            heading = crowd.heading.take(other)
            ax[on_npc] = np.cos(heading)
            ay[on_npc] = np.sin(heading)
        on_player = (target == PLAYER).nonzero()[0]
        if on_player.size:
            vx[on_player], vy[on_player] = self._player_vel
            ax[on_player], ay[on_player] = self._player_dir
        return vx, vy, ax, ay

    def _follow(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        tvx, tvy, ax, ay = self._target_motion(crowd, i)
        tspeed = _length(tvx, tvy)
        moving = tspeed > _MOVING
        inv = _ONE / np.maximum(tspeed, _EPS)
        ax = np.where(moving, tvx * inv, ax)
        ay = np.where(moving, tvy * inv, ay)
        radius = crowd.radius.take(i)
        gx = f.tx.take(i) - ax * radius - f.px.take(i)
        gy = f.ty.take(i) - ay * radius - f.py.take(i)
        # Keep pace with the target and close the gap to the slot behind it.
        max_speed = crowd.max_speed.take(i)
        cruise = np.maximum(f.cruise.take(i), tspeed * np.float32(1.2))
        f.vx[i], f.vy[i] = _clip_length(
            tvx + gx * np.float32(1.5),
            tvy + gy * np.float32(1.5),
            np.minimum(cruise, max_speed),
        )
        still = ~moving & (_length(gx, gy) < self.settings.arrive_tolerance_m * 2)
        f.face_target(i[still & (f.dist.take(i) > _EPS)])

    def _patrol(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        route = crowd.route.take(i)
        walks = (route >= 0).nonzero()[0]
        if walks.size == 0:
            return
        if walks.size < i.size:
            i, route = i.take(walks), route.take(walks)
        length = crowd.route_len.take(route)
        slot = crowd.waypoint.take(i) % length
        point = crowd.route_start.take(route) + slot
        ox = _x(crowd.waypoints)[point] - f.px.take(i)
        oy = _y(crowd.waypoints)[point] - f.py.take(i)
        dist = _length(ox, oy)
        f.vx[i], f.vy[i] = self._arrive(crowd, f, i, ox, oy, dist, np.zeros_like(dist))
        reached = dist < self.settings.waypoint_tolerance_m
        crowd.waypoint[i] = np.where(reached, (slot + 1) % length, slot)

    def _wander_velocity(self, crowd: Crowd, f: _Frame, i: Index) -> tuple[F32, F32]:
        """Smooth random steering around home, over the time each row steers over."""
        dt = f.elapsed_at(i)
        angle = crowd.wander_angle.take(i)
        jitter = self._standard_normal(len(i))
        jitter *= _f32(self.settings.wander_jitter * np.sqrt(dt))
        angle += jitter
        n = len(crowd)
        home = complex_positions(crowd.home[:n]).take(i)
        home -= complex_positions(crowd.pos[:n]).take(i)  # the frame's start: not moved yet
        far = (np.sqrt(squared_norm(home)) > crowd.reach.take(i)).nonzero()[0]
        if far.size:
            way = home.take(far)
            back: F32 = np.arctan2(way.imag, way.real)
            homing = np.minimum(2.0 * _seconds_at(dt, far), 1.0)
            angle[far] += _wrap(back - angle[far]) * _f32(homing)
        angle = _wrap(angle)
        crowd.wander_angle[i] = angle
        speed = f.cruise.take(i)
        return np.cos(angle) * speed, np.sin(angle) * speed

    def _standard_normal(self, k: int) -> F32:
        """`k` standard normal float32 numbers by the Box-Muller transform of uniform ones:
        the same distribution as `Generator.standard_normal` (tails cut at 5.8 sigma), at
        less than half its cost for the few thousand a frame's wandering draws."""
        half = (k + 1) // 2
        uniform = self.rng.random(2 * half, dtype=np.float32)
        radius = np.log1p(-uniform[:half])  # 1 - u is in (0, 1]: the log is finite
        radius *= np.float32(-2)
        np.sqrt(radius, out=radius)
        turn = uniform[half:]
        turn *= _TAU
        out = np.empty(2 * half, dtype=np.float32)
        np.cos(turn, out=out[:half])
        np.sin(turn, out=out[half:])
        out[:half] *= radius
        out[half:] *= radius
        return out[:k]

    def _wander_all(self, crowd: Crowd, f: _Frame, layout: _Layout) -> None:
        """The wandering velocity of every row that wanders, into the desired velocity: the
        wanderers, and the horde members and stalkers with nothing in reach (they read it
        from there). One pass for all of them."""
        parts = []
        for policy, rows in layout.rows:
            if policy == _WANDER:
                parts.append(rows)
            elif policy in (_HORDE, _STALK):
                parts.append(rows.take((~f.engaged.take(rows)).nonzero()[0]))
        if not parts:
            return
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if rows.size:
            f.vx[rows], f.vy[rows] = self._wander_velocity(crowd, f, rows)

    def _wander(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        """The wandering velocity is in place already (`_wander_all`)."""

    def _stalk(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        s = self.settings
        dist = f.dist.take(i)
        radius = crowd.radius.take(i)
        inv = _ONE / np.maximum(dist, _EPS)
        ux = f.ox.take(i) * inv
        uy = f.oy.take(i) * inv
        tvx, tvy, ax, ay = self._target_motion(crowd, i)
        target = crowd.target.take(i)
        has_prey = f.engaged.take(i)
        # The prey sees the predator inside its field of view and sight range; a place has
        # no eyes.
        eyes = (target >= 0) | (target == PLAYER)
        seen = eyes & (dist < s.prey_sight_m)
        seen &= -(ax * ux + ay * uy) >= self._seen_cos
        was_rushing = crowd.stalk_phase.take(i) == _RUSH
        rush_limit = np.where(was_rushing, np.float32(s.rush_m * 1.5), np.float32(s.rush_m))
        # With prey in reach: feed on it, else rush it, else hold still where it sees, else
        # creep; without, prowl.
        phase = np.where(seen, _I8[_FREEZE], _I8[_CREEP])
        phase = np.where(dist <= rush_limit, _I8[_RUSH], phase)
        phase = np.where(dist <= radius + s.arrive_tolerance_m, _I8[_FEED], phase)
        phase = np.where(has_prey, phase, _I8[_PROWL])
        feed = phase == _FEED
        rush = phase == _RUSH
        creep = phase == _CREEP

        gap = np.maximum(dist - radius, 0)
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel.take(i) * gap)
        max_speed = crowd.max_speed.take(i)
        creep_speed = f.cruise.take(i)
        speed = np.where(
            creep,
            np.minimum(creep_speed, brake),
            np.where(rush, np.minimum(max_speed, brake), np.float32(0)),
        )
        vx = np.where(feed, tvx, ux * speed)  # feeding: stay on the prey
        vy = np.where(feed, tvy, uy * speed)
        # Prowlers keep the wandering velocity `_wander_all` left in place.
        f.vx[i] = np.where(has_prey, vx, f.vx.take(i))
        f.vy[i] = np.where(has_prey, vy, f.vy.take(i))
        watch = ((feed | (phase == _FREEZE)) & (dist > _EPS)).nonzero()[0]
        rows = i.take(watch)
        f.fx[rows] = ux.take(watch)
        f.fy[rows] = uy.take(watch)
        crowd.stalk_phase[i] = phase

    def _flock_fields(self, crowd: Crowd) -> tuple[F32, F32, F32]:
        """Separation (x, y) and crowding of every NPC (read for horde members only),
        refreshed every `separation_period_s` (at once when the rows changed, every frame for
        0); cohesion and alignment are refreshed into the crowd every `flock_period_s`. A
        refresh that is only due waits for a frame that ran no other (`_take_turn`)."""
        s = self.settings
        n = len(crowd)
        if not self._separation_fresh:
            self._separation_fresh = True
            rows = (crowd.revision, n)
            if (
                self._separation is None
                or self._separation_rows != rows
                or s.separation_period_s == 0
                or (
                    self._separation_clock >= s.separation_period_s
                    and self._take_turn("separation")
                )
            ):
                self._separation = self._separation_fields(crowd)
                self._separation_rows = rows
                self._separation_clock = 0.0
                self._busy = True
        if self._flock_clock >= s.flock_period_s and self._take_turn("cohesion"):
            self._flock_clock = 0.0
            self._refresh_cohesion(crowd)
        assert self._separation is not None
        return self._separation

    def _take_turn(self, refresh: str) -> bool:
        """Whether a due refresh runs in this frame: if none ran in it yet, or if it waited
        `_MOST_WAIT` frames already (then it runs beside the other)."""
        waited = self._waited.get(refresh, 0)
        if self._busy and waited < _MOST_WAIT:
            self._waited[refresh] = waited + 1
            return False
        self._waited.pop(refresh, None)
        self._busy = True
        return True

    def _separation_fields(self, crowd: Crowd) -> tuple[F32, F32, F32]:
        """Every NPC's push away from its close neighbours (x, y) and how crowded it is, from
        the pairs closer than `neighbour_radius_m` at the frame's start (measured only now,
        not every frame)."""
        n = len(crowd)
        pairs = self.neighbours.measure(crowd.pos[:n])
        if not len(pairs):
            zero = np.zeros(n, dtype=np.float32)
            return zero, zero, zero
        # Everyone pushes a horde member away (a zombie does not walk into a villager).
        i, j = pairs.i, pairs.j
        dist = np.sqrt(pairs.d2)
        weight = _ONE - dist * np.float32(1 / self.settings.neighbour_radius_m)
        push = pairs.delta * (weight / np.maximum(dist, _EPS))
        # A pair's delta points from i to j: j is pushed along it, i the other way. Summed
        # in float32 by `ufunc.at`, x and y at once as complex numbers.
        separation = np.zeros(n, dtype=np.complex64)
        np.add.at(separation, j, push)
        np.subtract.at(separation, i, push)
        crowding = np.zeros(n, dtype=np.float32)
        np.add.at(crowding, i, weight)
        np.add.at(crowding, j, weight)
        return separation.real.copy(), separation.imag.copy(), crowding

    def _refresh_cohesion(self, crowd: Crowd) -> None:
        """Horde cohesion (toward the neighbourhood's centre) and alignment (its mean
        velocity, as a fraction of full speed) into the crowd."""
        s = self.settings
        rows = (crowd.policy[: len(crowd)] == _HORDE).nonzero()[0]
        if rows.size == 0:
            return
        x = _x(crowd.pos)[rows]
        y = _y(crowd.pos)[rows]
        mx, my, mvx, mvy = neighbourhood_means(
            x, y, _x(crowd.vel)[rows], _y(crowd.vel)[rows], s.flock_radius_m
        )
        inv = np.float32(1 / s.flock_radius_m)
        cx, cy = _clip_length((mx - x) * inv, (my - y) * inv, _ONE)
        _x(crowd.cohesion)[rows] = cx
        _y(crowd.cohesion)[rows] = cy
        inv_speed = _ONE / crowd.max_speed[rows]
        ax, ay = _clip_length(mvx * inv_speed, mvy * inv_speed, _ONE)
        _x(crowd.alignment)[rows] = ax
        _y(crowd.alignment)[rows] = ay

    def _horde(self, crowd: Crowd, f: _Frame, i: Index) -> None:
        s = self.settings
        sep_x, sep_y, crowding = self._flock_fields(crowd)
        dist = f.dist.take(i)
        cruise = f.cruise.take(i)
        engaged = f.engaged.take(i)
        # Toward the target, easing off within a body length of the stopping distance; with
        # nothing in reach, drift along with the horde.
        gap = np.maximum(dist - crowd.radius.take(i), 0)
        pull = np.where(engaged, np.minimum(gap / np.float32(1.5), _ONE), np.float32(0))
        pull /= np.maximum(dist, _EPS)
        gx = f.ox.take(i) * pull
        gy = f.oy.take(i) * pull
        roam = (~engaged).nonzero()[0]
        if roam.size:
            roamers = i.take(roam)
            wx, wy = f.vx.take(roamers), f.vy.take(roamers)  # `_wander_all`
            slow = np.float32(0.5) / np.maximum(cruise.take(roam), _EPS)
            gx[roam] = wx * slow
            gy[roam] = wy * slow
        calm = crowding.take(i)
        calm += 1
        np.divide(_ONE, calm, out=calm)
        cohesion = np.float32(s.cohesion_weight)
        alignment = np.float32(s.alignment_weight)
        n = len(crowd)
        together = complex_positions(crowd.cohesion[:n]).take(i)
        along = complex_positions(crowd.alignment[:n]).take(i)
        gx *= calm
        gx += cohesion * together.real
        gx += alignment * along.real
        gy *= calm
        gy += cohesion * together.imag
        gy += alignment * along.imag
        wx, wy = _clip_length(gx, gy, _ONE)
        max_speed = crowd.max_speed.take(i)
        push = np.float32(s.separation_weight) * max_speed
        wx *= cruise
        wx += sep_x.take(i) * push
        wy *= cruise
        wy += sep_y.take(i) * push
        f.vx[i], f.vy[i] = _clip_length(wx, wy, max_speed)
        close = i[engaged & (gap <= s.arrive_tolerance_m) & (dist > _EPS)]
        f.face_target(close)
