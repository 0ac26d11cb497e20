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

Vectors are handled as separate x and y columns (views of the crowd's (N, 2) arrays): NumPy
gathers, scatters and broadcasts one-dimensional float32 columns many times faster than rows
of two, and at ten thousand NPCs that is most of the frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mythic.control._archetypes import NO_POLICY, Policy
from mythic.control._crowd import (
    F32,
    I8,
    NO_TARGET,
    PLAYER,
    Crowd,
    Index,
    StalkPhase,
    finite_point,
)
from mythic.control._grid import NO_PAIRS, NeighbourList, Pairs, neighbourhood_means
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
    vx: F32
    """Desired velocity, x (zero unless a policy sets it)."""
    vy: F32
    fx: F32
    """Direction to face, x; NaN where the NPC faces where it walks."""
    fy: F32
    switches: list[tuple[Index, I8 | int, int]] = field(default_factory=list)
    """Policy changes the policies ask for: rows, new policy, its follow-up."""

    def face_target(self, rows: Index) -> None:
        """Face the target (rows whose target is not on top of them)."""
        inv = _ONE / self.dist[rows]
        self.fx[rows] = self.ox[rows] * inv
        self.fy[rows] = self.oy[rows] * inv


def _length(x: F32, y: F32) -> F32:
    out: F32 = np.sqrt(x * x + y * y)
    return out


def _clip_length(x: F32, y: F32, limit: F32 | np.float32) -> tuple[F32, F32]:
    """The vectors (x, y) shortened to at most `limit`."""
    scale = np.minimum(_ONE, limit / np.maximum(_length(x, y), _EPS))
    return x * scale, y * scale


def _wrap(angle: F32) -> F32:
    """Angles into [-pi, pi]."""
    out: F32 = angle - _TAU * np.rint(angle * _INV_TAU)
    return out


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
        self._handlers: dict[int, Callable[[Crowd, _Frame, Index, float], None]] = {
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
        self._flock_due = False
        self._separation: tuple[F32, F32, F32] | None = None
        self._separation_clock = math.inf  # seconds since separation was refreshed
        self._separation_rows: object = None  # the crowd's rows it was refreshed for
        self._separation_fresh = False  # looked at in this frame
        self.neighbours = NeighbourList(settings.neighbour_radius_m, settings.neighbour_skin_m)
        """The pairs closer than `neighbour_radius_m`, kept across frames."""
        self._pairs: Pairs = NO_PAIRS

    # -- the frame --------------------------------------------------------------------------

    def step(self, crowd: Crowd, player: Player, dt: float) -> None:
        """Advance every NPC by `dt` seconds: policies, blending, velocity, position, heading."""
        n = len(crowd)
        if n == 0:
            return
        px, py = player.position
        vx, vy = player.velocity
        self._player_pos = (np.float32(px), np.float32(py))
        self._player_vel = (np.float32(vx), np.float32(vy))
        facing = player.facing
        self._player_dir = (np.float32(math.cos(facing)), np.float32(math.sin(facing)))
        self._separation_fresh = False
        self._separation_clock += dt
        self._flock_clock += dt
        self._flock_due = self._flock_clock >= self.settings.flock_period_s
        if self._flock_due:
            self._flock_clock = 0.0
        self._pairs = self.neighbours.pairs(crowd.pos[:n], crowd.revision, crowd.vel[:n], dt)

        frame = self._evaluate(crowd, dt)
        dx, dy = frame.vx, frame.vy
        left = crowd.blend_left[:n]
        blending = np.flatnonzero(left > 0)
        if blending.size:
            blend_s = np.float32(max(self.settings.blend_s, 1e-6))
            w = np.clip(1 - left[blending] / blend_s, 0, 1)
            w = w * w * (3 - 2 * w)
            keep = 1 - w
            dx[blending] = _x(crowd.blend_from)[blending] * keep + dx[blending] * w
            dy[blending] = _y(crowd.blend_from)[blending] * keep + dy[blending] * w
            left[blending] = np.maximum(left[blending] - np.float32(dt), 0)
        _x(crowd.desired)[:n] = dx
        _y(crowd.desired)[:n] = dy

        self._integrate(crowd, frame, dt)
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

    def _evaluate(self, crowd: Crowd, dt: float) -> _Frame:
        n = len(crowd)
        px = _x(crowd.pos)[:n]
        py = _y(crowd.pos)[:n]
        target = crowd.target[:n]
        tx = _x(crowd.point)[:n].copy()
        ty = _y(crowd.point)[:n].copy()
        on_npc = np.flatnonzero(target >= 0)
        if on_npc.size:
            other = target[on_npc]
            tx[on_npc] = px[other]
            ty[on_npc] = py[other]
        on_player = np.flatnonzero(target == PLAYER)
        tx[on_player], ty[on_player] = self._player_pos
        ox = tx - px
        oy = ty - py
        frame = _Frame(
            px=px,
            py=py,
            tx=tx,
            ty=ty,
            ox=ox,
            oy=oy,
            dist=_length(ox, oy),
            vx=np.zeros(n, dtype=np.float32),
            vy=np.zeros(n, dtype=np.float32),
            fx=np.full(n, np.nan, dtype=np.float32),
            fy=np.full(n, np.nan, dtype=np.float32),
        )
        # Rows by policy, each in row order, in one sort.
        policies = crowd.policy[:n]
        present = np.bincount(policies.astype(np.intp), minlength=len(Policy))
        by_policy = np.argsort(policies, kind="stable")
        ends = np.cumsum(present)
        for policy in np.flatnonzero(present).tolist():
            rows = by_policy[ends[policy] - present[policy] : ends[policy]]
            self._handlers[policy](crowd, frame, rows, dt)
        return frame

    def _integrate(self, crowd: Crowd, f: _Frame, dt: float) -> None:
        n = len(crowd)
        s = self.settings
        step = np.float32(dt)
        vx = _x(crowd.vel)[:n]
        vy = _y(crowd.vel)[:n]
        cx, cy = _clip_length(f.vx - vx, f.vy - vy, crowd.max_accel[:n] * step)
        vx += cx
        vy += cy
        cx, cy = _clip_length(vx, vy, crowd.max_speed[:n])
        vx[:] = cx
        vy[:] = cy
        f.px += vx * step
        f.py += vy * step
        self._separate_bodies(crowd, s.overlap_passes, dt)

        heading = crowd.heading[:n]
        moving = _length(vx, vy) > _MOVING
        goal = np.where(moving, np.arctan2(vy, vx), heading)
        facing = np.flatnonzero(~np.isnan(f.fx))
        goal[facing] = np.arctan2(f.fy[facing], f.fx[facing])
        limit = np.float32(s.turn_rate * dt)
        turn = np.clip(_wrap(goal - heading), -limit, limit)
        heading[:] = _wrap(heading + turn)

    def _separate_bodies(self, crowd: Crowd, passes: int, dt: float) -> None:
        """Push overlapping bodies apart, each by half the overlap (position-based)."""
        pairs = self._pairs
        if not len(pairs) or passes == 0:
            return
        n = len(crowd)
        body = crowd.body_radius[:n]
        # Only pairs that can touch after this frame's moves need checking.
        fastest = float(crowd.max_speed[:n].max())
        limit = 2 * float(body.max()) + 2 * fastest * dt + _PUSH_SLACK
        close = np.flatnonzero(pairs.d2 < np.float32(limit * limit))
        if close.size == 0:
            return
        i, j = pairs.i[close], pairs.j[close]
        reach = body[i] + body[j]
        x = _x(crowd.pos)[:n]
        y = _y(crowd.pos)[:n]
        for _ in range(passes):
            dx = x[j] - x[i]
            dy = y[j] - y[i]
            d2 = dx * dx + dy * dy
            hit = np.flatnonzero(d2 < reach * reach)
            if hit.size == 0:
                return
            hi, hj = i[hit], j[hit]
            dx, dy = dx[hit], dy[hit]
            dist = np.sqrt(d2[hit])
            half = (reach[hit] - dist) * np.float32(0.5)
            # Coincident bodies split along a fixed per-pair direction, not a NaN.
            same = np.flatnonzero(dist < _EPS)
            if same.size:
                angle = (hi[same] * 2.399963).astype(np.float32)
                dx[same] = np.cos(angle)
                dy[same] = np.sin(angle)
                dist[same] = 1.0
            scale = half / dist
            mx = dx * scale
            my = dy * scale
            np.subtract.at(x, hi, mx)
            np.subtract.at(y, hi, my)
            np.add.at(x, hj, mx)
            np.add.at(y, hj, my)

    # -- the policies -----------------------------------------------------------------------

    def _idle(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        """Stand: the desired velocity stays zero."""

    def _face_talk(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        dist = f.dist[i]
        f.face_target(i[dist > _EPS])
        # The partner walked off: go after them, then face them again.
        gone = dist > crowd.radius[i] + _REAPPROACH
        if gone.any():
            f.switches.append((i[gone], Policy.SEEK, Policy.FACE_TALK))

    def _arrive(
        self, crowd: Crowd, i: Index, ox: F32, oy: F32, dist: F32, stop: F32
    ) -> tuple[F32, F32]:
        """Velocity toward (ox, oy) that cruises and brakes to a halt `stop` metres short."""
        gap = np.maximum(dist - stop, 0)
        cruise = crowd.speed[i] * crowd.max_speed[i]
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel[i] * gap)
        scale = np.minimum(cruise, brake) / np.maximum(dist, _EPS)
        return ox * scale, oy * scale

    def _seek(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        dist = f.dist[i]
        radius = crowd.radius[i]
        f.vx[i], f.vy[i] = self._arrive(crowd, i, f.ox[i], f.oy[i], dist, radius)
        arrived = dist - radius <= self.settings.arrive_tolerance_m
        f.face_target(i[arrived & (dist > _EPS)])
        follow_up = crowd.then[i]
        done = arrived & (follow_up != NO_POLICY)
        if done.any():
            f.switches.append((i[done], follow_up[done], NO_POLICY))

    def _flee(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        dist = f.dist[i]
        radius = crowd.radius[i]
        inv = -_ONE / np.maximum(dist, _EPS)
        ax = f.ox[i] * inv
        ay = f.oy[i] * inv
        on_top = np.flatnonzero(dist < _EPS)
        if on_top.size:
            heading = crowd.heading[i[on_top]]
            ax[on_top] = np.cos(heading)
            ay[on_top] = np.sin(heading)
        ramp = np.maximum(np.float32(0.15) * radius, np.float32(0.5))
        urge = np.clip((radius - dist) / ramp, 0, 1)
        speed = urge * crowd.speed[i] * crowd.max_speed[i]
        f.vx[i] = ax * speed
        f.vy[i] = ay * speed

    def _target_motion(self, crowd: Crowd, i: Index) -> tuple[F32, F32, F32, F32]:
        """Velocity and facing direction (x, y, x, y) of each row's target (a point stands
        still, facing +x)."""
        target = crowd.target[i]
        vx = np.zeros(len(i), dtype=np.float32)
        vy = np.zeros(len(i), dtype=np.float32)
        ax = np.zeros(len(i), dtype=np.float32)
        ay = np.zeros(len(i), dtype=np.float32)
        on_npc = np.flatnonzero(target >= 0)
        if on_npc.size:
            other = target[on_npc]
            vx[on_npc] = _x(crowd.vel)[other]
            vy[on_npc] = _y(crowd.vel)[other]
            heading = crowd.heading[other]
            ax[on_npc] = np.cos(heading)
            ay[on_npc] = np.sin(heading)
        on_player = np.flatnonzero(target == PLAYER)
        vx[on_player], vy[on_player] = self._player_vel
        ax[on_player], ay[on_player] = self._player_dir
        return vx, vy, ax, ay

    def _follow(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        tvx, tvy, ax, ay = self._target_motion(crowd, i)
        tspeed = _length(tvx, tvy)
        moving = tspeed > _MOVING
        inv = _ONE / np.maximum(tspeed, _EPS)
        ax = np.where(moving, tvx * inv, ax)
        ay = np.where(moving, tvy * inv, ay)
        radius = crowd.radius[i]
        gx = f.tx[i] - ax * radius - f.px[i]
        gy = f.ty[i] - ay * radius - f.py[i]
        # Keep pace with the target and close the gap to the slot behind it.
        max_speed = crowd.max_speed[i]
        cruise = np.maximum(crowd.speed[i] * max_speed, tspeed * np.float32(1.2))
        f.vx[i], f.vy[i] = _clip_length(
            tvx + gx * np.float32(1.5),
            tvy + gy * np.float32(1.5),
            np.minimum(cruise, max_speed),
        )
        still = ~moving & (_length(gx, gy) < self.settings.arrive_tolerance_m * 2)
        f.face_target(i[still & (f.dist[i] > _EPS)])

    def _patrol(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        route = crowd.route[i]
        walks = np.flatnonzero(route >= 0)
        if walks.size == 0:
            return
        i, route = i[walks], route[walks]
        length = crowd.route_len[route]
        slot = crowd.waypoint[i] % length
        point = crowd.route_start[route] + slot
        ox = _x(crowd.waypoints)[point] - f.px[i]
        oy = _y(crowd.waypoints)[point] - f.py[i]
        dist = _length(ox, oy)
        f.vx[i], f.vy[i] = self._arrive(crowd, i, ox, oy, dist, np.zeros_like(dist))
        reached = dist < self.settings.waypoint_tolerance_m
        crowd.waypoint[i] = np.where(reached, (slot + 1) % length, slot)

    def _wander_velocity(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> tuple[F32, F32]:
        """Smooth random steering around home."""
        angle = crowd.wander_angle[i] + (
            self.rng.standard_normal(len(i)).astype(np.float32)
            * np.float32(self.settings.wander_jitter * math.sqrt(dt))
        )
        hx = _x(crowd.home)[i] - f.px[i]
        hy = _y(crowd.home)[i] - f.py[i]
        far = np.flatnonzero(_length(hx, hy) > crowd.reach[i])
        if far.size:
            back = np.arctan2(hy[far], hx[far])
            angle[far] += _wrap(back - angle[far]) * np.float32(min(1.0, 2.0 * dt))
        angle = _wrap(angle)
        crowd.wander_angle[i] = angle
        speed = crowd.speed[i] * crowd.max_speed[i]
        return np.cos(angle) * speed, np.sin(angle) * speed

    def _wander(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        f.vx[i], f.vy[i] = self._wander_velocity(crowd, f, i, dt)

    def _stalk(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        s = self.settings
        dist = f.dist[i]
        radius = crowd.radius[i]
        inv = _ONE / np.maximum(dist, _EPS)
        ux = f.ox[i] * inv
        uy = f.oy[i] * inv
        tvx, tvy, ax, ay = self._target_motion(crowd, i)
        target = crowd.target[i]
        has_prey = (target != NO_TARGET) & (dist <= crowd.reach[i])
        # The prey sees the predator inside its field of view and sight range; a place has
        # no eyes.
        eyes = (target >= 0) | (target == PLAYER)
        seen = eyes & (dist < s.prey_sight_m)
        seen &= -(ax * ux + ay * uy) >= self._seen_cos
        was_rushing = crowd.stalk_phase[i] == StalkPhase.RUSH
        rush_limit = np.where(was_rushing, np.float32(s.rush_m * 1.5), np.float32(s.rush_m))
        feed = has_prey & (dist <= radius + s.arrive_tolerance_m)
        rush = has_prey & ~feed & (dist <= rush_limit)
        freeze = has_prey & ~feed & ~rush & seen
        creep = has_prey & ~feed & ~rush & ~freeze
        prowl = np.flatnonzero(~has_prey)

        phase = np.full(len(i), StalkPhase.PROWL, dtype=np.int8)
        phase[creep] = StalkPhase.CREEP
        phase[freeze] = StalkPhase.FREEZE
        phase[rush] = StalkPhase.RUSH
        phase[feed] = StalkPhase.FEED

        gap = np.maximum(dist - radius, 0)
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel[i] * gap)
        max_speed = crowd.max_speed[i]
        creep_speed = crowd.speed[i] * max_speed
        speed = np.where(
            creep,
            np.minimum(creep_speed, brake),
            np.where(rush, np.minimum(max_speed, brake), np.float32(0)),
        )
        vx = np.where(feed, tvx, ux * speed)  # feeding: stay on the prey
        vy = np.where(feed, tvy, uy * speed)
        if prowl.size:
            vx[prowl], vy[prowl] = self._wander_velocity(crowd, f, i[prowl], dt)
        f.vx[i] = vx
        f.vy[i] = vy
        watch = np.flatnonzero((feed | freeze) & (dist > _EPS))
        rows = i[watch]
        f.fx[rows] = ux[watch]
        f.fy[rows] = uy[watch]
        crowd.stalk_phase[i] = phase

    def _flock_fields(self, crowd: Crowd) -> tuple[F32, F32, F32]:
        """Separation (x, y) and crowding of every NPC (read for horde members only),
        refreshed every `separation_period_s`; cohesion and alignment are refreshed into the
        crowd every `flock_period_s`."""
        s = self.settings
        n = len(crowd)
        if not self._separation_fresh:
            self._separation_fresh = True
            rows = (crowd.revision, n)
            if (
                self._separation is None
                or self._separation_rows != rows
                or self._separation_clock >= s.separation_period_s
            ):
                self._separation = self._separation_fields(n)
                self._separation_rows = rows
                self._separation_clock = 0.0
        if self._flock_due:
            self._flock_due = False
            self._refresh_cohesion(crowd)
        assert self._separation is not None
        return self._separation

    def _separation_fields(self, n: int) -> tuple[F32, F32, F32]:
        """Every NPC's push away from its close neighbours (x, y) and how crowded it is."""
        pairs = self._pairs
        if not len(pairs):
            zero = np.zeros(n, dtype=np.float32)
            return zero, zero, zero
        # Everyone pushes a horde member away (a zombie does not walk into a villager).
        i, j = pairs.i, pairs.j
        dist = np.sqrt(pairs.d2)
        weight = _ONE - dist * np.float32(1 / self.settings.neighbour_radius_m)
        scale = weight / np.maximum(dist, _EPS)
        mx = pairs.dx * scale
        my = pairs.dy * scale
        # A pair's delta points from i to j: j is pushed along it, i the other way.
        sep_x = np.bincount(j, weights=mx, minlength=n)
        sep_x -= np.bincount(i, weights=mx, minlength=n)
        sep_y = np.bincount(j, weights=my, minlength=n)
        sep_y -= np.bincount(i, weights=my, minlength=n)
        crowding = np.bincount(i, weights=weight, minlength=n)
        crowding += np.bincount(j, weights=weight, minlength=n)
        return sep_x.astype(np.float32), sep_y.astype(np.float32), crowding.astype(np.float32)

    def _refresh_cohesion(self, crowd: Crowd) -> None:
        """Horde cohesion (toward the neighbourhood's centre) and alignment (its mean
        velocity, as a fraction of full speed) into the crowd."""
        s = self.settings
        rows = np.flatnonzero(crowd.policy[: len(crowd)] == Policy.HORDE)
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

    def _horde(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        s = self.settings
        sep_x, sep_y, crowding = self._flock_fields(crowd)
        dist = f.dist[i]
        cruise = crowd.speed[i] * crowd.max_speed[i]
        engaged = (crowd.target[i] != NO_TARGET) & (dist <= crowd.reach[i])
        # Toward the target, easing off within a body length of the stopping distance; with
        # nothing in reach, drift along with the horde.
        gap = np.maximum(dist - crowd.radius[i], 0)
        pull = np.where(engaged, np.minimum(gap / np.float32(1.5), _ONE), np.float32(0))
        pull /= np.maximum(dist, _EPS)
        gx = f.ox[i] * pull
        gy = f.oy[i] * pull
        roam = np.flatnonzero(~engaged)
        if roam.size:
            wx, wy = self._wander_velocity(crowd, f, i[roam], dt)
            slow = np.float32(0.5) / np.maximum(cruise[roam], _EPS)
            gx[roam] = wx * slow
            gy[roam] = wy * slow
        calm = _ONE / (1 + crowding[i])
        cohesion = np.float32(s.cohesion_weight)
        alignment = np.float32(s.alignment_weight)
        steer_x = gx * calm + cohesion * _x(crowd.cohesion)[i] + alignment * _x(crowd.alignment)[i]
        steer_y = gy * calm + cohesion * _y(crowd.cohesion)[i] + alignment * _y(crowd.alignment)[i]
        wx, wy = _clip_length(steer_x, steer_y, _ONE)
        max_speed = crowd.max_speed[i]
        push = np.float32(s.separation_weight) * max_speed
        f.vx[i], f.vy[i] = _clip_length(
            wx * cruise + sep_x[i] * push, wy * cruise + sep_y[i] * push, max_speed
        )
        close = i[engaged & (gap <= s.arrive_tolerance_m) & (dist > _EPS)]
        f.face_target(close)
