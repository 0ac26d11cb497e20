"""The micro-policies, vectorised: every NPC's desired velocity from its policy, in one pass.

Each policy is a function over the rows running it (NumPy fancy indexing, no loop over NPCs).
When an NPC's policy changes, the desired velocity it had at that moment is kept and
cross-faded into the new policy's over the blend time (a switch in the middle of a blend
starts from the blended value, so chains of switches stay smooth too); velocity then follows
the desired one under the NPC's acceleration limit, positions integrate, and overlapping
bodies are pushed apart using pairs from a uniform spatial grid.
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
from mythic.control._grid import close_pairs, neighbourhood_means
from mythic.control._settings import ControlSettings

_EPS = np.float32(1e-6)
_BRAKE = np.float32(0.8)  # plan stops with 80% of the acceleration limit: no overshoot
_MOVING = np.float32(0.15)  # m/s: slower than this, an NPC keeps its heading
_REAPPROACH = np.float32(1.0)  # m: a partner this much beyond talking distance is followed


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
    """One evaluation: every NPC's geometry toward its target, and the outputs."""

    pos: F32
    tpos: F32
    to: F32
    dist: F32
    desired: F32
    face: F32
    switches: list[tuple[Index, I8 | int, int]] = field(default_factory=list)
    """Policy changes the policies ask for: rows, new policy, its follow-up."""


def _norm(v: F32) -> F32:
    out: F32 = np.sqrt(np.einsum("ij,ij->i", v, v))
    return out


def _unit(v: F32, length: F32) -> F32:
    out = v / np.maximum(length, _EPS)[:, None]
    return out.astype(np.float32, copy=False)


def _clip_length(v: F32, limit: F32) -> F32:
    length = _norm(v)
    scale = np.minimum(np.float32(1.0), limit / np.maximum(length, _EPS)).astype(
        np.float32, copy=False
    )
    out: F32 = v * scale[:, None]
    return out


def _wrap(angle: F32) -> F32:
    out: F32 = (angle + np.float32(math.pi)) % np.float32(2 * math.pi) - np.float32(math.pi)
    return out


def _directions(angle: F32) -> F32:
    out: F32 = np.stack([np.cos(angle), np.sin(angle)], axis=1)
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
        self._player_pos = np.zeros(2, dtype=np.float32)
        self._player_vel = np.zeros(2, dtype=np.float32)
        self._player_dir = np.array([1.0, 0.0], dtype=np.float32)
        self._flock: tuple[F32, F32] | None = None
        self._flock_clock = math.inf  # seconds since cohesion and alignment were refreshed
        self._flock_due = False
        self._pairs: tuple[Index, Index, F32, F32] | None = None

    # -- the frame --------------------------------------------------------------------------

    def step(self, crowd: Crowd, player: Player, dt: float) -> None:
        """Advance every NPC by `dt` seconds: policies, blending, velocity, position, heading."""
        n = len(crowd)
        if n == 0:
            return
        self._player_pos[:] = player.position
        self._player_vel[:] = player.velocity
        self._player_dir[:] = (math.cos(player.facing), math.sin(player.facing))
        self._flock = None
        self._flock_clock += dt
        self._flock_due = self._flock_clock >= self.settings.flock_period_s
        if self._flock_due:
            self._flock_clock = 0.0
        self._pairs = close_pairs(crowd.pos[:n], self.settings.neighbour_radius_m)

        frame = self._evaluate(crowd, dt)
        desired = frame.desired
        blending = np.flatnonzero(crowd.blend_left[:n] > 0)
        if blending.size:
            blend_s = np.float32(max(self.settings.blend_s, 1e-6))
            w = np.clip(1 - crowd.blend_left[blending] / blend_s, 0, 1)
            w = (w * w * (3 - 2 * w))[:, None]
            desired[blending] = crowd.blend_from[blending] * (1 - w) + desired[blending] * w
            crowd.blend_left[blending] = np.maximum(crowd.blend_left[blending] - dt, 0)
        crowd.desired[:n] = desired

        self._integrate(crowd, desired, frame.face, dt)
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
        pos = crowd.pos[:n]
        target = crowd.target[:n]
        tpos = crowd.point[:n].copy()
        on_npc = np.flatnonzero(target >= 0)
        tpos[on_npc] = pos[target[on_npc]]
        tpos[target == PLAYER] = self._player_pos
        to = tpos - pos
        frame = _Frame(
            pos=pos,
            tpos=tpos,
            to=to,
            dist=_norm(to),
            desired=np.zeros((n, 2), dtype=np.float32),
            face=np.full((n, 2), np.nan, dtype=np.float32),
        )
        policies = crowd.policy[:n]
        present = np.bincount(policies.astype(np.intp), minlength=len(Policy))
        for policy in np.flatnonzero(present):
            rows = np.flatnonzero(policies == policy)
            self._handlers[int(policy)](crowd, frame, rows, dt)
        return frame

    def _integrate(self, crowd: Crowd, desired: F32, face: F32, dt: float) -> None:
        n = len(crowd)
        s = self.settings
        vel = crowd.vel[:n]
        max_speed = crowd.max_speed[:n]
        change = _clip_length(desired - vel, crowd.max_accel[:n] * np.float32(dt))
        vel += change
        vel[:] = _clip_length(vel, max_speed)
        pos = crowd.pos[:n]
        pos += vel * np.float32(dt)
        self._separate_bodies(crowd, s.overlap_passes)

        heading = crowd.heading[:n]
        speed = _norm(vel)
        goal = heading.copy()
        moving = speed > _MOVING
        goal[moving] = np.arctan2(vel[moving, 1], vel[moving, 0])
        facing = ~np.isnan(face[:, 0])
        goal[facing] = np.arctan2(face[facing, 1], face[facing, 0])
        turn = np.clip(_wrap(goal - heading), -s.turn_rate * dt, s.turn_rate * dt)
        heading[:] = _wrap(heading + turn)

    def _separate_bodies(self, crowd: Crowd, passes: int) -> None:
        """Push overlapping bodies apart, each by half the overlap (position-based)."""
        assert self._pairs is not None
        i, j, _, _ = self._pairs
        if i.size == 0:
            return
        n = len(crowd)
        pos = crowd.pos[:n]
        reach = crowd.body_radius[i] + crowd.body_radius[j]
        both = np.concatenate([i, j])
        for _ in range(passes):
            delta = pos[j] - pos[i]
            dist = _norm(delta)
            overlap = reach - dist
            hit = overlap > 0
            if not hit.any():
                return
            # Coincident bodies split along a fixed per-pair direction, not a NaN.
            same = dist < _EPS
            angle = (i[same] * 2.399963).astype(np.float32)
            delta[same] = _directions(angle)
            dist[same] = 1.0
            push = np.where(hit, overlap * 0.5, 0)[:, None] * delta / dist[:, None]
            moves = np.concatenate([-push, push])
            pos[:, 0] += np.bincount(both, weights=moves[:, 0], minlength=n).astype(np.float32)
            pos[:, 1] += np.bincount(both, weights=moves[:, 1], minlength=n).astype(np.float32)

    # -- the policies -----------------------------------------------------------------------

    def _idle(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        """Stand: the desired velocity stays zero."""

    def _face_talk(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        near = f.dist[i] > _EPS
        f.face[i[near]] = f.to[i[near]] / f.dist[i[near], None]
        # The partner walked off: go after them, then face them again.
        gone = f.dist[i] > crowd.radius[i] + _REAPPROACH
        if gone.any():
            f.switches.append((i[gone], Policy.SEEK, Policy.FACE_TALK))

    def _arrive(self, crowd: Crowd, i: Index, to: F32, dist: F32, stop: F32) -> F32:
        """Velocity toward `to` that cruises and brakes to a halt `stop` metres short."""
        gap = np.maximum(dist - stop, 0)
        cruise = crowd.speed[i] * crowd.max_speed[i]
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel[i] * gap)
        out: F32 = _unit(to, dist) * np.minimum(cruise, brake)[:, None]
        return out

    def _seek(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        dist = f.dist[i]
        f.desired[i] = self._arrive(crowd, i, f.to[i], dist, crowd.radius[i])
        arrived = dist - crowd.radius[i] <= self.settings.arrive_tolerance_m
        there = i[arrived & (dist > _EPS)]
        f.face[there] = f.to[there] / f.dist[there, None]
        follow_up = crowd.then[i]
        done = arrived & (follow_up != NO_POLICY)
        if done.any():
            f.switches.append((i[done], follow_up[done], NO_POLICY))

    def _flee(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        dist = f.dist[i]
        radius = crowd.radius[i]
        away = -_unit(f.to[i], dist)
        on_top = dist < _EPS
        away[on_top] = _directions(crowd.heading[i[on_top]])
        ramp = np.maximum(np.float32(0.15) * radius, np.float32(0.5))
        urge = np.clip((radius - dist) / ramp, 0, 1)
        f.desired[i] = away * (urge * crowd.speed[i] * crowd.max_speed[i])[:, None]

    def _target_motion(self, crowd: Crowd, i: Index) -> tuple[F32, F32]:
        """Velocity and facing direction of each row's target (a point stands still)."""
        target = crowd.target[i]
        vel = np.zeros((len(i), 2), dtype=np.float32)
        ahead = np.zeros((len(i), 2), dtype=np.float32)
        on_npc = np.flatnonzero(target >= 0)
        vel[on_npc] = crowd.vel[target[on_npc]]
        ahead[on_npc] = _directions(crowd.heading[target[on_npc]])
        on_player = target == PLAYER
        vel[on_player] = self._player_vel
        ahead[on_player] = self._player_dir
        return vel, ahead

    def _follow(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        tvel, ahead = self._target_motion(crowd, i)
        tspeed = _norm(tvel)
        moving = tspeed > _MOVING
        ahead[moving] = tvel[moving] / tspeed[moving, None]
        goal = f.tpos[i] - ahead * crowd.radius[i][:, None]
        to_goal = goal - f.pos[i]
        # Keep pace with the target and close the gap to the slot behind it.
        cruise = np.maximum(crowd.speed[i] * crowd.max_speed[i], tspeed * np.float32(1.2))
        want = tvel + to_goal * np.float32(1.5)
        f.desired[i] = _clip_length(want, np.minimum(cruise, crowd.max_speed[i]))
        still = ~moving & (_norm(to_goal) < self.settings.arrive_tolerance_m * 2)
        near = still & (f.dist[i] > _EPS)
        f.face[i[near]] = f.to[i[near]] / f.dist[i[near], None]

    def _patrol(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        route = crowd.route[i]
        walks = np.flatnonzero(route >= 0)
        if walks.size == 0:
            return
        i, route = i[walks], route[walks]
        length = crowd.route_len[route]
        slot = crowd.waypoint[i] % length
        to = crowd.waypoints[crowd.route_start[route] + slot] - f.pos[i]
        dist = _norm(to)
        f.desired[i] = self._arrive(crowd, i, to, dist, np.zeros_like(dist))
        reached = dist < self.settings.waypoint_tolerance_m
        crowd.waypoint[i] = np.where(reached, (slot + 1) % length, slot)

    def _wander_velocity(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> F32:
        """Smooth random steering around home."""
        angle = crowd.wander_angle[i] + (
            self.rng.standard_normal(len(i)).astype(np.float32)
            * np.float32(self.settings.wander_jitter * math.sqrt(dt))
        )
        home = crowd.home[i] - f.pos[i]
        far = _norm(home) > crowd.reach[i]
        back = np.arctan2(home[far, 1], home[far, 0])
        angle[far] += _wrap(back - angle[far]) * np.float32(min(1.0, 2.0 * dt))
        angle = _wrap(angle)
        crowd.wander_angle[i] = angle
        out: F32 = _directions(angle) * (crowd.speed[i] * crowd.max_speed[i])[:, None]
        return out

    def _wander(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        f.desired[i] = self._wander_velocity(crowd, f, i, dt)

    def _stalk(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        s = self.settings
        dist = f.dist[i]
        radius = crowd.radius[i]
        toward = _unit(f.to[i], dist)
        tvel, prey_ahead = self._target_motion(crowd, i)
        target = crowd.target[i]
        has_prey = (target != NO_TARGET) & (dist <= crowd.reach[i])
        # The prey sees the predator inside its field of view and sight range; a place has
        # no eyes.
        eyes = (target >= 0) | (target == PLAYER)
        seen = eyes & (dist < s.prey_sight_m)
        seen &= np.einsum("ij,ij->i", prey_ahead, -toward) >= self._seen_cos
        was_rushing = crowd.stalk_phase[i] == StalkPhase.RUSH
        rush_limit = np.where(was_rushing, np.float32(s.rush_m * 1.5), np.float32(s.rush_m))
        feed = has_prey & (dist <= radius + s.arrive_tolerance_m)
        rush = has_prey & ~feed & (dist <= rush_limit)
        freeze = has_prey & ~feed & ~rush & seen
        creep = has_prey & ~feed & ~rush & ~freeze
        prowl = ~has_prey

        phase = np.full(len(i), StalkPhase.PROWL, dtype=np.int8)
        phase[creep] = StalkPhase.CREEP
        phase[freeze] = StalkPhase.FREEZE
        phase[rush] = StalkPhase.RUSH
        phase[feed] = StalkPhase.FEED

        desired = np.zeros((len(i), 2), dtype=np.float32)
        gap = np.maximum(dist - radius, 0)
        brake = np.sqrt(2 * _BRAKE * crowd.max_accel[i] * gap)
        creep_speed = crowd.speed[i] * crowd.max_speed[i]
        desired[creep] = toward[creep] * np.minimum(creep_speed, brake)[creep, None]
        desired[rush] = toward[rush] * np.minimum(crowd.max_speed[i], brake)[rush, None]
        desired[feed] = tvel[feed]  # stay on the prey
        if prowl.any():
            desired[prowl] = self._wander_velocity(crowd, f, i[prowl], dt)
        f.desired[i] = desired
        watch = (feed | freeze) & (dist > _EPS)
        f.face[i[watch]] = toward[watch]
        crowd.stalk_phase[i] = phase

    def _flock_fields(self, crowd: Crowd) -> tuple[F32, F32]:
        """Separation and crowding of every horde member (zeros for the others), once per
        frame; cohesion and alignment are refreshed into the crowd every `flock_period_s`."""
        if self._flock is not None:
            return self._flock
        s = self.settings
        n = len(crowd)
        member = crowd.policy[:n] == Policy.HORDE
        sep = np.zeros((n, 2), dtype=np.float32)
        crowding = np.zeros(n, dtype=np.float32)
        assert self._pairs is not None
        i, j, delta, dist = self._pairs
        if i.size:
            # Everyone pushes a horde member away (a zombie does not walk into a villager).
            weight = np.float32(1) - dist / np.float32(s.neighbour_radius_m)
            push = delta / np.maximum(dist, _EPS)[:, None] * weight[:, None]
            both = np.concatenate([i, j])
            moves = np.concatenate([-push, push])
            sep[:, 0] = np.bincount(both, weights=moves[:, 0], minlength=n)
            sep[:, 1] = np.bincount(both, weights=moves[:, 1], minlength=n)
            crowding[:] = np.bincount(both, weights=np.concatenate([weight, weight]), minlength=n)
            sep[~member] = 0
            crowding[~member] = 0
        if self._flock_due:
            self._flock_due = False
            rows = np.flatnonzero(member)
            pos = crowd.pos[rows]
            mean_pos, mean_vel = neighbourhood_means(pos, crowd.vel[rows], s.flock_radius_m)
            one = np.ones(len(rows), dtype=np.float32)
            toward = (mean_pos - pos) / np.float32(s.flock_radius_m)
            crowd.cohesion[rows] = _clip_length(toward, one)
            crowd.alignment[rows] = _clip_length(mean_vel / crowd.max_speed[rows][:, None], one)
        self._flock = (sep, crowding)
        return self._flock

    def _horde(self, crowd: Crowd, f: _Frame, i: Index, dt: float) -> None:
        s = self.settings
        sep, crowding = self._flock_fields(crowd)
        dist = f.dist[i]
        cruise = crowd.speed[i] * crowd.max_speed[i]
        engaged = (crowd.target[i] != NO_TARGET) & (dist <= crowd.reach[i])
        # Toward the target, easing off within a body length of the stopping distance; with
        # nothing in reach, drift along with the horde.
        goal = np.zeros((len(i), 2), dtype=np.float32)
        gap = np.maximum(dist - crowd.radius[i], 0)
        pull = np.clip(gap / np.float32(1.5), 0, 1)
        goal[engaged] = _unit(f.to[i], dist)[engaged] * pull[engaged, None]
        roam = ~engaged
        if roam.any():
            wander = self._wander_velocity(crowd, f, i[roam], dt)
            goal[roam] = wander / np.maximum(cruise[roam], _EPS)[:, None] * np.float32(0.5)
        steer = (
            goal / (1 + crowding[i])[:, None]
            + np.float32(s.cohesion_weight) * crowd.cohesion[i]
            + np.float32(s.alignment_weight) * crowd.alignment[i]
        )
        velocity = _clip_length(steer, np.ones(len(i), dtype=np.float32)) * cruise[:, None]
        velocity += np.float32(s.separation_weight) * sep[i] * crowd.max_speed[i][:, None]
        f.desired[i] = _clip_length(velocity, crowd.max_speed[i])
        close = engaged & (gap <= s.arrive_tolerance_m) & (dist > _EPS)
        f.face[i[close]] = f.to[i[close]] / dist[close, None]
