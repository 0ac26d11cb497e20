"""The game-side controller: micro-policies, blending, the intent cache, tiers, prediction.

Deterministic: every frame gets its time from the test (`now`), randomness is seeded, and
nothing asserts on wall-clock time. Threads are joined or waited on with bounded events.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control import (
    Archetype,
    ArchetypeTable,
    AsyncIntentSource,
    Behaviour,
    Controller,
    ControlSettings,
    IntentShedError,
    Player,
    Policy,
    StalkPhase,
    Tier,
    TierBand,
)
from mythic.control._grid import NeighbourList, close_pairs, neighbourhood_means

pytestmark = pytest.mark.unit

DT = 1 / 60
ORIGIN = Player((0.0, 0.0))


class RecordingSource:
    """Takes requests and keeps them; the test answers them (or not)."""

    def __init__(self) -> None:
        self.sent: list[tuple[IntentRequest, Tier]] = []

    def submit(self, request: IntentRequest, tier: Tier) -> None:
        self.sent.append((request, tier))

    def for_npc(self, npc_id: str) -> list[IntentRequest]:
        return [r for r, _ in self.sent if r.npc_id == npc_id]


class AnsweringSource:
    """Answers every request at once (the answer waits in the inbox for the next frame)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.sent: list[tuple[IntentRequest, Tier]] = []

    def submit(self, request: IntentRequest, tier: Tier) -> None:
        self.sent.append((request, tier))
        self.controller.deliver(answer(request, "chitchat"))


def answer(
    request: IntentRequest, intent: str, target: str | None = None, **fields: object
) -> IntentUpdate:
    return IntentUpdate.model_validate(
        {
            "npc_id": request.npc_id,
            "intent": intent,
            "target": target,
            "request_id": request.request_id,
            **fields,
        }
    )


def push(npc_id: str, intent: str, target: str | None = None, **fields: object) -> IntentUpdate:
    return IntentUpdate.model_validate(
        {"npc_id": npc_id, "intent": intent, "target": target, **fields}
    )


def run(
    controller: Controller,
    seconds: float,
    player: Player | Callable[[float], Player] = ORIGIN,
    *,
    start: float = 0.0,
    dt: float = DT,
    each: Callable[[float], None] | None = None,
) -> float:
    """Run frames for `seconds` of game time from `start`; return the time reached."""
    frames = round(seconds / dt)
    now = start
    for k in range(frames):
        now = start + k * dt
        controller.frame(dt, now, player(now) if callable(player) else player)
        if each is not None:
            each(now)
    return start + frames * dt


def row(controller: Controller, npc_id: str) -> int:
    return controller.crowd.index_of(npc_id)


def position(controller: Controller, npc_id: str) -> np.ndarray:
    return controller.crowd.pos[row(controller, npc_id)].astype(np.float64)


def speed(controller: Controller, npc_id: str) -> float:
    return float(np.hypot(*controller.crowd.vel[row(controller, npc_id)]))


def min_pair_distance(pos: np.ndarray) -> float:
    _, _, _, dist = close_pairs(np.ascontiguousarray(pos, dtype=np.float32), 2.0)
    return float(dist.min()) if dist.size else math.inf


# -- micro-policies ---------------------------------------------------------------------------


def test_horde_closes_on_the_player_stays_cohesive_and_never_overlaps() -> None:
    controller = Controller(settings=ControlSettings(seed=3))
    rng = np.random.default_rng(0)
    for k, p in enumerate(rng.random((200, 2)) * 20 - 10 + (12.0, 0.0)):
        controller.add(f"z{k}", "zombie", p)
    gaps: list[float] = []
    reach: list[float] = []

    def measure(now: float) -> None:
        if now > 28.0 and round(now / DT) % 10 == 0:
            pos = controller.crowd.positions
            gaps.append(min_pair_distance(pos))
            reach.append(float(np.linalg.norm(pos, axis=1).max()))

    run(controller, 30.0, each=measure)
    body = 2 * 0.3
    assert min(gaps) >= 0.9 * body  # bodies may touch, never sink into each other
    assert max(reach) <= 8.0  # 200 zombies packed around the player, not strung out
    assert controller.crowd.policy[:200].tolist() == [Policy.HORDE] * 200


@pytest.mark.parametrize("bronze_every", [1, 2])
def test_a_roaming_horde_holds_together(bronze_every: int) -> None:
    # Out of the player's reach they are bronze: with 2, half of them steer in a frame.
    controller = Controller(settings=ControlSettings(seed=5, bronze_every=bronze_every))
    rng = np.random.default_rng(1)
    for k, p in enumerate(rng.random((200, 2)) * 20):
        controller.add(f"z{k}", "zombie", p)
    far_away = Player((1000.0, 1000.0))  # out of reach: they roam
    start = controller.crowd.positions.copy()
    spread_before = np.linalg.norm(start - start.mean(axis=0), axis=1).max()
    run(controller, 30.0, far_away)
    pos = controller.crowd.positions
    spread_after = np.linalg.norm(pos - pos.mean(axis=0), axis=1).max()
    assert spread_after <= spread_before
    assert min_pair_distance(pos) >= 0.9 * 0.6


def test_a_vampire_creeps_unseen_rushes_and_feeds() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.add("marla", "barkeep", (0.0, 0.0), heading=math.pi)  # looking away
    controller.add("vlad", "vampire", (30.0, 0.0))
    controller.deliver(push("vlad", "combat", "marla"))
    phases: list[int] = []
    distances: list[float] = []

    def watch(now: float) -> None:
        phases.append(int(controller.crowd.stalk_phase[row(controller, "vlad")]))
        distances.append(float(np.linalg.norm(position(controller, "vlad"))))

    run(controller, 20.0, each=watch)
    seen = [p for k, p in enumerate(phases) if k == 0 or p != phases[k - 1]]
    assert seen[-3:] == [StalkPhase.CREEP, StalkPhase.RUSH, StalkPhase.FEED]
    creep = [d for d, p in zip(distances, phases, strict=True) if p == StalkPhase.CREEP]
    rush = [d for d, p in zip(distances, phases, strict=True) if p == StalkPhase.RUSH]
    creep_speed = (creep[0] - creep[-1]) / (len(creep) * DT)
    rush_speed = (rush[0] - rush[-1]) / (len(rush) * DT)
    assert rush_speed > 1.5 * creep_speed  # slowly while unseen, then a rush
    assert distances[-1] <= 1.2 + 0.2  # feeding, at the prey
    assert controller.crowd.policy[row(controller, "vlad")] == Policy.STALK


def test_a_watched_vampire_holds_still() -> None:
    controller = Controller()
    controller.add("marla", "barkeep", (0.0, 0.0), heading=0.0)  # looking at the vampire
    controller.add("vlad", "vampire", (20.0, 0.0))
    controller.deliver(push("vlad", "combat", "marla"))
    run(controller, 5.0)
    assert controller.crowd.stalk_phase[row(controller, "vlad")] == StalkPhase.FREEZE
    assert np.linalg.norm(position(controller, "vlad") - (20.0, 0.0)) < 0.1


def test_a_villager_in_combat_flees_until_safe() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.add("ann", "villager", (5.0, 0.0))
    controller.deliver(push("ann", "combat", "player", urgency=1.0))
    distances: list[float] = []
    run(
        controller,
        15.0,
        each=lambda now: distances.append(float(np.linalg.norm(position(controller, "ann")))),
    )
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FLEE
    assert all(b >= a - 1e-4 for a, b in itertools.pairwise(distances))
    assert distances[-1] >= 24.0
    assert speed(controller, "ann") < 0.2  # safe: it stops running


def test_seek_arrives_and_stops_at_its_distance() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.set_landmark("gate", (20.0, 0.0))
    controller.add("gus", "guard", (0.0, 0.0))
    controller.deliver(push("gus", "navigation", "gate"))
    gaps: list[float] = []
    run(
        controller, 20.0, each=lambda now: gaps.append(20.0 - float(position(controller, "gus")[0]))
    )
    assert controller.crowd.policy[row(controller, "gus")] == Policy.SEEK
    assert abs(gaps[-1] - 1.0) <= 0.2
    assert min(gaps) >= 1.0 - 0.2  # no overshoot
    assert speed(controller, "gus") < 0.05


def test_talk_intent_approaches_then_faces_the_partner() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.add("ann", "villager", (10.0, 0.0))
    controller.deliver(push("ann", "chitchat", "player"))
    run(controller, 15.0)
    r = row(controller, "ann")
    assert controller.crowd.policy[r] == Policy.FACE_TALK
    assert abs(np.linalg.norm(position(controller, "ann")) - 1.8) <= 0.2
    heading = float(controller.crowd.heading[r])
    assert abs(math.remainder(heading - math.pi, 2 * math.pi)) < 0.05
    assert speed(controller, "ann") < 0.05


def test_a_partner_who_walks_off_is_approached_again() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.add("ann", "villager", (10.0, 0.0))
    controller.deliver(push("ann", "hint", "player"))
    end = run(controller, 8.0)
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FACE_TALK
    moved = Player((30.0, 0.0))
    run(controller, 0.1, moved, start=end)
    assert controller.crowd.policy[row(controller, "ann")] == Policy.SEEK
    run(controller, 20.0, moved, start=end + 0.1)  # 26 m at a walk
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FACE_TALK
    assert abs(np.linalg.norm(position(controller, "ann") - (30.0, 0.0)) - 1.8) <= 0.2


def test_a_horde_marches_on_a_place() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=120.0))
    controller.set_landmark("gate", (40.0, 0.0))
    for k in range(20):
        controller.add(f"z{k}", "zombie", (float(k % 5), float(k // 5)))
        controller.deliver(push(f"z{k}", "combat", "gate"))
    run(controller, 40.0, Player((-500.0, 0.0)))  # the player is far out of reach
    pos = controller.crowd.positions
    assert np.linalg.norm(pos - (40.0, 0.0), axis=1).max() < 4.0
    assert min_pair_distance(pos) >= 0.9 * 0.6


def test_face_and_talk_turns_in_place_to_the_partner() -> None:
    controller = Controller()
    controller.add("ann", "barkeep", (0.0, 0.0), heading=0.0)
    controller.add("bob", "barkeep", (0.0, 1.5))
    controller.deliver(push("ann", "quest", "bob"))
    run(controller, 1.0)
    r = row(controller, "ann")
    assert controller.crowd.policy[r] == Policy.FACE_TALK
    assert abs(float(controller.crowd.heading[r]) - math.pi / 2) < 0.02
    assert np.linalg.norm(position(controller, "ann")) < 0.05


def test_patrol_walks_its_waypoints_in_a_loop() -> None:
    controller = Controller()
    square = [(0.0, 0.0), (10.0, 0.0), (10.0, 10.0), (0.0, 10.0)]
    controller.add_route("yard", square)
    controller.add("gus", "guard", (0.0, 0.0), route="yard")
    visits: list[int] = []
    closest = [math.inf] * 4

    def watch(now: float) -> None:
        slot = int(controller.crowd.waypoint[row(controller, "gus")])
        if not visits or visits[-1] != slot:
            visits.append(slot)
        here = position(controller, "gus")
        for k, p in enumerate(square):
            closest[k] = min(closest[k], float(np.linalg.norm(here - p)))

    run(controller, 60.0, each=watch)
    assert visits[:9] == [1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert max(closest) <= controller.settings.waypoint_tolerance_m


def test_follow_keeps_its_distance_behind_the_player() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=60.0))
    controller.add("sam", "villager", (-5.0, 0.0))
    controller.deliver(push("sam", "navigation", "player"))

    def walking(now: float) -> Player:
        return Player((1.2 * now, 0.0), (1.2, 0.0), 0.0)

    end = run(controller, 20.0, walking)
    assert controller.crowd.policy[row(controller, "sam")] == Policy.FOLLOW
    slot = np.array([1.2 * (end - DT) - 2.5, 0.0])
    assert np.linalg.norm(position(controller, "sam") - slot) < 0.5


def test_policy_change_blends_velocity_without_a_jump() -> None:
    def largest_step(blend_s: float) -> float:
        table = ArchetypeTable()
        table.register(Archetype("sprinter", "civilian", 4.0, 1000.0, Behaviour(Policy.IDLE)))
        controller = Controller(settings=ControlSettings(blend_s=blend_s), archetypes=table)
        controller.add("sue", "sprinter", (10.0, 0.0))
        controller.deliver(push("sue", "combat", "player"))  # flee: +x at speed
        end = run(controller, 1.0)
        controller.deliver(push("sue", "chitchat", "player"))  # approach: -x
        vx = [float(controller.crowd.vel[0, 0])]
        run(
            controller,
            1.0,
            start=end,
            each=lambda now: vx.append(float(controller.crowd.vel[0, 0])),
        )
        assert vx[0] > 2.5 and vx[-1] < -1.0  # it did turn around
        return max(abs(b - a) for a, b in itertools.pairwise(vx))

    # 4.6 m/s of change spread over 0.4 s (smoothstep peaks at 1.5x the mean slope).
    assert largest_step(0.4) < 4.6 * 1.5 * DT / 0.4 + 0.02
    assert largest_step(0.0) > 4.0  # without blending, the same change is one pop


def test_a_switch_in_the_middle_of_a_blend_stays_smooth() -> None:
    table = ArchetypeTable()
    table.register(Archetype("sprinter", "civilian", 4.0, 1000.0, Behaviour(Policy.IDLE)))
    controller = Controller(archetypes=table)
    controller.add("sue", "sprinter", (10.0, 0.0))
    controller.deliver(push("sue", "combat", "player"))
    end = run(controller, 1.0)
    vx = [float(controller.crowd.vel[0, 0])]

    def watch(now: float) -> None:
        vx.append(float(controller.crowd.vel[0, 0]))

    for intent in ("chitchat", "combat", "chitchat"):  # a new intent every 0.2 s
        controller.deliver(push("sue", intent, "player"))
        end = run(controller, 0.2, start=end, each=watch)
    assert max(abs(b - a) for a, b in itertools.pairwise(vx)) < 4.6 * 1.5 * DT / 0.4 + 0.02


def test_a_horde_refreshing_separation_seldom_still_never_overlaps() -> None:
    # Separation steering four times a second and a wide skin (few searches): bodies are
    # still checked against exactly the close pairs every frame.
    settings = ControlSettings(seed=3, separation_period_s=0.25, neighbour_skin_m=1.0)
    controller = Controller(settings=settings)
    rng = np.random.default_rng(0)
    for k, p in enumerate(rng.random((200, 2)) * 20 - 10 + (12.0, 0.0)):
        controller.add(f"z{k}", "zombie", p)
    gaps: list[float] = []

    def measure(now: float) -> None:
        if now > 10.0 and round(now / DT) % 10 == 0:
            gaps.append(min_pair_distance(controller.crowd.positions))

    run(controller, 30.0, each=measure)
    assert min(gaps) >= 0.9 * 2 * 0.3
    pos = controller.crowd.positions
    assert float(np.linalg.norm(pos, axis=1).max()) <= 8.0  # packed around the player
    assert controller.steering.neighbours.builds < 30.0 / DT / 4


def test_overlap_pushes_match_pushes_over_every_pair() -> None:
    # The pushes look only at the listed pairs near touching; a packed horde's pushes equal
    # those found by comparing every pair with every other, frame after frame. Without
    # separation steering, only the pushes keep the horde pressing on the player apart.
    controller = Controller(settings=ControlSettings(seed=3, separation_weight=0.0))
    rng = np.random.default_rng(0)
    for k, p in enumerate(rng.random((150, 2)) * 14 - 7 + (10.0, 0.0)):
        controller.add(f"z{k}", "zombie", p)

    def circling(now: float) -> Player:  # the horde presses after a player walking a circle
        angle = 0.4 * now
        return Player((4 * math.cos(angle), 4 * math.sin(angle)), (0.0, 0.0), angle)

    end = run(controller, 4.0, circling)  # packed around the player by now
    steering = controller.steering
    crowd = controller.crowd
    body = crowd.body_radius[:150].astype(np.float64)
    reach = body[:, None] + body[None, :]
    separate = steering._separate_bodies
    pushed: list[float] = []

    def checked(crowd_: Any, passes: int, dt: float) -> None:
        pos = crowd.pos[:150].astype(np.float64)
        for _ in range(passes):  # every overlapping pair, each pushed apart by half
            delta = pos[None, :, :] - pos[:, None, :]
            dist = np.linalg.norm(delta, axis=2)
            i, j = np.nonzero(np.triu(dist < reach, 1))
            if i.size == 0:
                break
            move = delta[i, j] * ((reach[i, j] - dist[i, j]) / 2 / dist[i, j])[:, None]
            np.subtract.at(pos, i, move)
            np.add.at(pos, j, move)
        before = crowd.pos[:150].astype(np.float64)
        separate(crowd_, passes, dt)
        after = crowd.pos[:150].astype(np.float64)
        pushed.append(float(np.abs(after - before).max()))
        np.testing.assert_allclose(after, pos, rtol=0, atol=1e-4)

    steering._separate_bodies = checked  # type: ignore[method-assign]
    run(controller, 2.0, circling, start=end)
    assert min(pushed) > 0.001  # bodies were pushed every frame: there were overlaps to see


def test_stalk_phases_follow_the_rules_for_every_stalker() -> None:
    # A crowd of vampires around a player who looks along +x: one vectorised pass gives each
    # the phase its own distance, the player's view and its previous phase call for.
    settings = ControlSettings()
    controller = Controller(settings=settings)
    places = [
        (r * math.cos(a), r * math.sin(a))
        for r in (0.6, 1.3, 5.0, 8.0, 9.5, 15.0, 29.0, 35.0, 45.0)
        for a in (0.0, 1.5, 3.14)
    ]
    for k, p in enumerate(places):
        controller.add(f"v{k}", "vampire", p)
    crowd = controller.crowd
    n = len(places)
    crowd.stalk_phase[:n:2] = StalkPhase.RUSH  # every other one was rushing
    before = crowd.stalk_phase[:n].copy()
    controller.frame(1e-4, 0.0, ORIGIN)
    half_fov = math.radians(settings.prey_fov_deg) / 2
    for k, (x, y) in enumerate(places):
        dist = math.hypot(x, y)
        seen = dist < settings.prey_sight_m and x / dist >= math.cos(half_fov)
        rush_m = settings.rush_m * (1.5 if before[k] == StalkPhase.RUSH else 1.0)
        if dist > 40.0:  # out of reach
            want = StalkPhase.PROWL
        elif dist <= 1.2 + settings.arrive_tolerance_m:
            want = StalkPhase.FEED
        elif dist <= rush_m:
            want = StalkPhase.RUSH
        else:
            want = StalkPhase.FREEZE if seen else StalkPhase.CREEP
        assert crowd.stalk_phase[k] == want, (k, x, y)


def test_wandering_turns_by_standard_normal_steps() -> None:
    steering = Controller().steering
    draws = np.concatenate([steering._standard_normal(k) for k in (1, 2, 999, 200_000)])
    assert draws.dtype == np.float32 and len(draws) == 201_002
    assert abs(float(draws.mean())) < 0.01
    assert abs(float(draws.std()) - 1.0) < 0.01
    assert abs(float((np.abs(draws) > 2).mean()) - 0.0455) < 0.003  # the normal's tails
    assert abs(float((np.abs(draws) > 3).mean()) - 0.0027) < 0.0006


@pytest.mark.parametrize("tiers_every_frame", [False, True])
def test_horde_refreshes_take_turns_and_never_wait_long(tiers_every_frame: bool) -> None:
    # At 300 frames a second, separation (every 10 frames), cohesion and the tiers (every
    # 30) never refresh in the same frame; a refresh waits two frames at most, even when
    # the tiers take every frame.
    dt = 1 / 300
    period = 1e-4 if tiers_every_frame else 0.1
    controller = Controller(settings=ControlSettings(seed=1, tier_period_s=period))
    rng = np.random.default_rng(2)
    for k, p in enumerate(rng.random((40, 2)) * 10 + (20.0, 0.0)):
        controller.add(f"z{k}", "zombie", p)
    steering = controller.steering
    ran: dict[str, list[int]] = {"tiers": [], "separation": [], "cohesion": []}
    frame = [0]

    def spy(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            ran[name].append(frame[0])
            return method(*args)

        return wrapped

    controller._update_tiers = spy("tiers", controller._update_tiers)  # type: ignore[method-assign]
    steering._separation_fields = spy("separation", steering._separation_fields)  # type: ignore[method-assign]
    steering._refresh_cohesion = spy("cohesion", steering._refresh_cohesion)  # type: ignore[method-assign]

    def count(now: float) -> None:
        frame[0] += 1

    run(controller, 2.0, dt=dt, each=count)
    for name, every in (("separation", 10), ("cohesion", 30)):
        gaps = np.diff(ran[name])
        assert gaps.max() <= every + 1 + 2  # a frame of rounding, two of waiting
        assert len(ran[name]) >= 600 / (every + 3)
    if not tiers_every_frame:  # but for the first frame, where separation is due at once
        frames = [f for runs in ran.values() for f in runs if f > 0]
        assert len(set(frames)) == len(frames)


def test_npcs_added_removed_or_teleported_between_frames_are_pushed_apart() -> None:
    controller = Controller()
    for k in range(30):
        controller.add(f"b{k}", "barkeep", (k * 2.0, 0.0))  # idle, 2 m apart
    end = run(controller, 0.5)
    controller.remove("b5")  # the last row moves into b5's
    controller.add("late", "barkeep", (40.1, 0.0))  # on top of b20
    controller.teleport("b3", (20.05, 0.0))  # on top of b10
    run(controller, 0.5, start=end)
    assert min_pair_distance(controller.crowd.positions) >= 0.9 * 2 * 0.3


# -- neighbour search -------------------------------------------------------------------------


def brute_pairs(pos: np.ndarray, radius: float) -> set[tuple[int, int]]:
    """Every pair closer than `radius`, by comparing all of them (same float32 arithmetic)."""
    d = pos[None, :, :] - pos[:, None, :]
    d2 = d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]
    i, j = np.nonzero(np.triu(d2 < np.float32(radius * radius), 1))
    return set(zip(i.tolist(), j.tolist(), strict=True))


def pair_set(i: np.ndarray, j: np.ndarray) -> set[tuple[int, int]]:
    return set(zip(np.minimum(i, j).tolist(), np.maximum(i, j).tolist(), strict=True))


def layout(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "scatter":
        pos = rng.random((n, 2)) * 20 - 10
    elif kind == "on_cell_edges":  # on multiples of the radius, with duplicates
        pos = np.round(rng.random((n, 2)) * 10) * 0.6
    elif kind == "far_from_origin":
        pos = rng.random((n, 2)) * 5 + 1e5
    elif kind == "one_column":
        pos = np.stack([rng.random(n) * 0.01, rng.random(n) * 200], axis=1)
    else:  # a dense cluster
        pos = rng.normal(0, 2, (n, 2))
    return pos.astype(np.float32)


@pytest.mark.parametrize(
    "kind", ["scatter", "on_cell_edges", "far_from_origin", "one_column", "cluster"]
)
def test_close_pairs_finds_exactly_the_close_pairs_once(kind: str) -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 60, 300):
        pos = layout(kind, n, rng)
        for radius in (0.6, 1.2, 1.7):
            i, j, delta, dist = close_pairs(pos, radius)
            found = pair_set(i, j)
            assert len(found) == len(i)
            assert found == brute_pairs(pos, radius)
            assert np.array_equal(delta, pos[j] - pos[i])
            np.testing.assert_allclose(dist, np.hypot(delta[:, 0], delta[:, 1]), rtol=1e-6)


def test_close_pairs_leaves_out_positions_that_are_not_finite() -> None:
    pos = np.array([[0, 0], [0.5, 0], [np.nan, 0], [0.2, np.inf], [0.3, 0.1]], np.float32)
    i, j, _, _ = close_pairs(pos, 1.2)
    assert pair_set(i, j) == {(0, 1), (0, 4), (1, 4)}


@pytest.mark.parametrize("skin", [0.0, 0.5])
@pytest.mark.parametrize("velocity", ["none", "right", "wrong"])
def test_the_neighbour_list_finds_what_a_new_search_finds(skin: float, velocity: str) -> None:
    rng = np.random.default_rng(3)
    pos = (rng.random((250, 2)) * 20).astype(np.float32)
    neighbours = NeighbourList(1.2, skin)
    frames = 200
    for frame in range(frames):
        moving = rng.random(250) < 0.5
        pos[moving] += rng.normal(0, 0.01, (int(moving.sum()), 2)).astype(np.float32)
        pos += np.float32(0.02)  # and the whole crowd walks on together
        if frame == 100:
            pos[7] = pos[200] + 0.1  # teleported next to someone
        # Velocities only guide where a search in the background looks: right or wrong,
        # the pairs are exact.
        vel = {
            "none": None,
            "right": np.full((250, 2), 0.02 / DT, dtype=np.float32),
            "wrong": rng.normal(0, 3, (250, 2)).astype(np.float32),
        }[velocity]
        pairs = neighbours.pairs(pos, "rows", vel, DT)
        assert pair_set(pairs.i, pairs.j) == brute_pairs(pos, 1.2)
        assert np.array_equal(pairs.dx, pos[pairs.j, 0] - pos[pairs.i, 0])
    if skin and velocity != "wrong":
        assert neighbours.builds < frames / 10  # it searched again only now and then ...
        assert neighbours.waits == 2  # ... in the background, but for the first and the jump
    for _ in range(5):  # flung about: no list lasts a frame
        pos += rng.normal(0, 1.0, pos.shape).astype(np.float32)
        pairs = neighbours.pairs(pos, "rows")
        assert pair_set(pairs.i, pairs.j) == brute_pairs(pos, 1.2)
    shuffled = pos[::-1].copy()  # the same places, the rows in another order
    pairs = neighbours.pairs(shuffled, "other rows")
    assert pair_set(pairs.i, pairs.j) == brute_pairs(shuffled, 1.2)


@pytest.mark.parametrize("velocity", ["right", "wrong"])
def test_touching_holds_every_pair_whose_bodies_may_touch(velocity: str) -> None:
    rng = np.random.default_rng(4)
    pos = (rng.random((250, 2)) * 12).astype(np.float32)
    body = np.where(rng.random(250) < 0.3, 0.45, 0.3).astype(np.float32)
    neighbours = NeighbourList(1.2, 0.5)
    gap = 0.16
    for frame in range(200):
        step = rng.normal(0, 0.01, pos.shape).astype(np.float32)
        step[:5] += np.float32(0.05)  # a few run, and wear the skin out for everyone
        pos += step
        if frame == 100:
            pos[7] = pos[200] + 0.1  # teleported onto someone
        vel = step / np.float32(DT) if velocity == "right" else None
        neighbours.update(pos, "rows", vel, DT)
        i, j, reach = neighbours.touching(body, gap)
        found = pair_set(i, j)
        assert len(found) == len(i)  # each pair once
        np.testing.assert_array_equal(reach, body[i] + body[j])
        d = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=2)
        close = (d - body[:, None] - body[None, :] < gap) & (d < 1.2)
        want = set(zip(*np.nonzero(np.triu(close, 1)), strict=True))
        assert {(int(a), int(b)) for a, b in want} <= found
    assert neighbours.builds > 3  # the bands were cut from several lists


@pytest.mark.parametrize("spread", [20.0, 5000.0])  # a table over the box; sorted cells
def test_neighbourhood_means_average_the_others_in_the_3x3_cells(spread: float) -> None:
    rng = np.random.default_rng(2)
    pos = (rng.random((300, 2)) * spread).astype(np.float32)
    pos[:100] = pos[100:200] + np.float32(1.5)  # neighbours even when spread far and wide
    vel = rng.normal(0, 1, (300, 2)).astype(np.float32)
    means = neighbourhood_means(pos[:, 0], pos[:, 1], vel[:, 0], vel[:, 1], 4.0)
    cell = np.floor(pos * np.float32(1 / 4.0))
    for k in range(300):
        others = np.all(np.abs(cell - cell[k]) <= 1, axis=1)
        others[k] = False
        if others.any():
            want = [*pos[others].mean(axis=0), *vel[others].mean(axis=0)]
        else:
            want = [*pos[k], 0.0, 0.0]
        got = [float(m[k]) for m in means]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


# -- intent cache -----------------------------------------------------------------------------


def gold_npc(**settings: Any) -> tuple[Controller, RecordingSource]:
    """A barkeep 5 m from the player (gold) whose first request goes out on the first frame."""
    source = RecordingSource()
    controller = Controller(settings=ControlSettings(**settings), source=source)
    controller.add("marla", "barkeep", (5.0, 0.0))
    controller.request_now("marla")
    return controller, source


def test_an_answer_to_another_request_is_stale_and_dropped() -> None:
    controller, source = gold_npc()
    controller.frame(DT, 0.0, ORIGIN)
    ((request, tier),) = source.sent
    assert tier == Tier.GOLD
    controller.deliver(push("marla", "trade", "player", request_id="someone-elses"))
    controller.frame(DT, DT, ORIGIN)
    assert controller.intent_of("marla") is None
    assert controller.stats().dropped_stale == 1
    controller.deliver(answer(request, "trade", "player"))
    controller.frame(DT, 2 * DT, ORIGIN)
    assert controller.intent_of("marla") is not None
    assert controller.stats().applied == 1


def test_one_request_in_flight_then_timeout_then_ask_again() -> None:
    controller, source = gold_npc(request_timeout_s=3.0, retry_after_s=0.5)
    step = 0.05
    run(controller, 2.95, dt=step)  # frames at 0.00 .. 2.90: gold asks at 2 Hz, but waits
    assert len(source.sent) == 1
    first = source.sent[0][0]
    assert controller.intents.in_flight("marla") == first.request_id
    end = run(controller, 0.5, start=2.95, dt=step)  # the timeout passes at 3.0
    assert controller.stats().timed_out == 1
    run(controller, 0.3, start=end, dt=step)  # asks again 0.5 s after the timeout
    assert len(source.sent) == 2
    second = source.sent[1][0]
    assert second.request_id != first.request_id
    controller.deliver(answer(first, "hint", "player"))  # the late answer to the first
    controller.deliver(answer(second, "trade", "player"))
    controller.frame(step, 4.0, ORIGIN)
    intent = controller.intent_of("marla")
    assert intent is not None and intent.request_id == second.request_id
    stats = controller.stats()
    assert (stats.dropped_stale, stats.answered, stats.applied) == (1, 1, 1)


def test_an_answer_older_than_a_pushed_intent_is_stale() -> None:
    controller, source = gold_npc()
    controller.frame(DT, 0.0, ORIGIN)
    ((request, _),) = source.sent
    controller.deliver(push("marla", "quest", "player"))  # the server pushes meanwhile
    controller.frame(DT, 0.5, ORIGIN)
    controller.deliver(answer(request, "trade", "player"))  # asked at 0.0: older
    controller.frame(DT, 1.0, ORIGIN)
    intent = controller.intent_of("marla")
    assert intent is not None and intent.intent == "quest"
    stats = controller.stats()
    assert (stats.pushed, stats.answered, stats.dropped_stale) == (1, 1, 1)


def test_a_failed_request_is_asked_again_after_the_retry_delay() -> None:
    controller, source = gold_npc(retry_after_s=1.0)
    controller.frame(0.1, 0.0, ORIGIN)
    ((request, _),) = source.sent
    controller.fail(request, RuntimeError("model down"))
    run(controller, 0.9, start=0.1, dt=0.1)  # the failure lands at 0.1; retry at 1.1
    assert len(source.sent) == 1
    run(controller, 0.2, start=1.0, dt=0.1)
    assert len(source.sent) == 2
    assert controller.stats().failed == 1


def test_a_shed_request_is_asked_again_and_counted_apart_from_failures() -> None:
    controller, source = gold_npc(retry_after_s=1.0)
    controller.frame(0.1, 0.0, ORIGIN)
    ((request, _),) = source.sent
    controller.fail(request, IntentShedError("the persona is answering another NPC"))
    run(controller, 0.9, start=0.1, dt=0.1)
    assert len(source.sent) == 1
    run(controller, 0.2, start=1.0, dt=0.1)
    assert len(source.sent) == 2
    stats = controller.stats()
    assert (stats.shed, stats.failed) == (1, 0)


@pytest.mark.parametrize("every", [32, 1])  # tiers refreshed every 32nd frame; every frame
def test_at_frame_rate_the_traffic_waits_out_a_tier_frame_never_two(every: int) -> None:
    dt = 1 / 256  # binary fractions: frame `k` is at `k * dt` exactly
    controller, source = gold_npc(tier_period_s=every * dt if every > 1 else dt / 2)
    controller.frame(dt, 0.0, ORIGIN)  # the first tiers: the request goes out with them
    ((first, _),) = source.sent
    controller.deliver(answer(first, "trade", "player"))
    for k in range(1, every):  # frames between tier refreshes take the answer at once
        controller.frame(dt, k * dt, ORIGIN)
    if every > 1:
        assert controller.stats().applied == 1
        controller.request_now("marla")
    sent = len(source.sent)
    controller.frame(dt, every * dt, ORIGIN)  # a tier frame: the answer or request waits ...
    assert (controller.stats().applied, len(source.sent)) == (int(every > 1), sent)
    controller.frame(dt, (every + 1) * dt, ORIGIN)  # ... a frame, tiers refreshed in it or not
    assert (controller.stats().applied, len(source.sent)) == (1, sent + int(every > 1))
    # At 10 frames a second a wait would hold an answer back 100 ms: nothing waits.
    slow, slow_source = gold_npc(tier_period_s=0.05)
    slow.frame(0.1, 0.0, ORIGIN)
    ((request, _),) = slow_source.sent
    slow.deliver(answer(request, "trade", "player"))
    slow.frame(0.1, 0.1, ORIGIN)
    assert slow.stats().applied == 1


def test_a_frame_says_what_the_models_traffic_cost_it() -> None:
    from mythic.cli._sim import FRAME_BUDGET_S, SimRun

    dt = 1 / 256
    controller, source = gold_npc(tier_period_s=2 * dt)
    controller.frame(dt, 0.0, ORIGIN)  # the first tiers, and a request sent
    assert len(source.sent) == 1 and controller.traffic_s > 0.0
    controller.frame(dt, dt, ORIGIN)
    controller.frame(dt, 2 * dt, ORIGIN)  # a tier frame: the traffic waits, costs nothing
    assert controller.traffic_s == 0.0
    # A frame over budget is the traffic's doing when it was within budget without it.
    budget = FRAME_BUDGET_S
    run = SimRun(npcs=1, seconds=1.0)
    run.frame_s = [budget + 0.0005, budget + 0.0005, budget / 2, budget + 0.002]
    run.traffic_s = [0.001, 0.0001, 0.001, 0.001]
    run.cpu_s = list(run.frame_s)
    assert (run.over_budget, run.by_traffic, run.preempted) == (3, 1, 0)


def test_a_source_that_raises_fails_the_request_not_the_frame(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def submit(self, request: IntentRequest, tier: Tier) -> None:
            raise OSError("socket gone")

    controller = Controller(source=Broken())
    controller.add("marla", "barkeep", (5.0, 0.0))
    controller.request_now("marla")
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.stats().failed == 1
    assert controller.intents.in_flight("marla") is None
    assert "socket gone" in caplog.text


def test_an_expired_intent_falls_back_to_the_archetype_default() -> None:
    controller = Controller(settings=ControlSettings(intent_ttl_s=2.0))
    controller.add("ann", "villager", (5.0, 0.0))
    controller.add("zed", "zombie", (50.0, 0.0))
    controller.deliver(push("ann", "combat", "player"))
    controller.deliver(push("zed", "navigation", None))
    end = run(controller, 1.9)
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FLEE
    run(controller, 0.2, start=end)
    assert controller.crowd.policy[row(controller, "ann")] == Policy.WANDER
    assert controller.crowd.policy[row(controller, "zed")] == Policy.HORDE
    assert controller.intent_of("ann") is None
    assert controller.stats().expired == 2


def test_an_update_delivered_mid_frame_waits_for_the_next_frame() -> None:
    class ThreadedSource:
        """Answers from another thread while the frame is still running."""

        def __init__(self, controller: Controller) -> None:
            self.controller = controller

        def submit(self, request: IntentRequest, tier: Tier) -> None:
            reply = threading.Thread(
                target=self.controller.deliver, args=(answer(request, "chitchat", "player"),)
            )
            reply.start()
            reply.join(5)

    controller = Controller()
    controller.source = ThreadedSource(controller)
    controller.add("ann", "villager", (10.0, 0.0))
    controller.request_now("ann")
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.intents.waiting == 1  # arrived during the frame ...
    assert controller.intent_of("ann") is None  # ... and was not applied in it
    assert controller.crowd.policy[row(controller, "ann")] == Policy.WANDER
    controller.frame(DT, DT, ORIGIN)
    assert controller.intent_of("ann") is not None
    assert controller.crowd.policy[row(controller, "ann")] == Policy.SEEK


def test_updates_from_many_threads_are_all_applied() -> None:
    controller = Controller()
    ids = [f"v{k}" for k in range(4)]
    for k, npc_id in enumerate(ids):
        controller.add(npc_id, "villager", (float(k), 0.0))

    def flood(npc_id: str) -> None:
        for _ in range(250):
            controller.deliver(push(npc_id, "chitchat", None))

    threads = [threading.Thread(target=flood, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    now = 0.0
    while any(t.is_alive() for t in threads):
        controller.frame(DT, now, ORIGIN)
        now += DT
    for t in threads:
        t.join(5)
    controller.frame(DT, now, ORIGIN)
    stats = controller.stats()
    assert stats.pushed == stats.applied == 1000
    assert controller.intents.waiting == 0


# -- tiers ------------------------------------------------------------------------------------


def tier_at(controller: Controller, distance: float, now: float) -> Tier:
    controller.frame(0.1, now, Player((distance, 0.0)))
    return controller.tier_of("npc")


def test_tiers_have_hysteresis() -> None:
    controller = Controller()
    controller.add("npc", "barkeep", (0.0, 0.0))
    assert tier_at(controller, 30.0, 0.0) == Tier.SILVER  # 30 m: not inside 25 m
    wobble = [28.0, 32.0, 29.0, 31.0, 30.0] * 4
    assert {tier_at(controller, d, 0.1 * (k + 1)) for k, d in enumerate(wobble)} == {Tier.SILVER}
    assert tier_at(controller, 24.0, 3.0) == Tier.GOLD  # crossing 25 m promotes
    later = [30.0, 34.0, 26.0, 34.9] * 4
    assert {tier_at(controller, d, 3.1 + 0.1 * k) for k, d in enumerate(later)} == {Tier.GOLD}
    assert tier_at(controller, 35.5, 6.0) == Tier.SILVER  # crossing 35 m demotes
    assert tier_at(controller, 81.0, 6.1) == Tier.BRONZE


def test_budgets_keep_the_nearest_and_the_important() -> None:
    settings = ControlSettings(gold=TierBand(25.0, 35.0, 200, 2.0))
    controller = Controller(settings=settings)
    distances = np.linspace(1.0, 20.0, 300)
    for k, d in enumerate(distances):
        controller.add(f"n{k}", "villager", (float(d), 0.0))
    controller.add("quest", "villager", (0.0, 30.0), quest=True)
    controller.add("friend", "villager", (0.0, -30.0), relationship=0.9)
    controller.frame(DT, 0.0, ORIGIN)
    stats = controller.stats()
    assert (stats.gold, stats.silver) == (200, 102)
    assert controller.tier_of("quest") == Tier.GOLD  # 30 m, boosted, ranked as 10 m
    assert controller.tier_of("friend") == Tier.GOLD
    gold = [controller.tier_of(f"n{k}") == Tier.GOLD for k in range(300)]
    assert gold == [True] * 198 + [False] * 102  # the nearest plain ones
    controller.set_flags("quest", quest=False)
    controller.frame(DT, 1.0, ORIGIN)
    assert controller.tier_of("quest") == Tier.SILVER


def test_tier_sets_the_request_rate_and_model_tier() -> None:
    controller = Controller()
    source = AnsweringSource(controller)
    controller.source = source
    controller.add("near", "barkeep", (10.0, 0.0))
    controller.add("mid", "barkeep", (50.0, 0.0))
    controller.add("far", "barkeep", (100.0, 0.0))
    run(controller, 20.0, dt=0.05)
    by_npc = {npc: [t for r, t in source.sent if r.npc_id == npc] for npc in ("near", "mid", "far")}
    assert 34 <= len(by_npc["near"]) <= 46  # 2 Hz with jitter
    assert 8 <= len(by_npc["mid"]) <= 12  # 0.5 Hz
    assert by_npc["far"] == []  # bronze: never
    assert set(by_npc["near"]) == {Tier.GOLD}
    assert set(by_npc["mid"]) == {Tier.SILVER}


def test_a_tier_change_keeps_the_running_intent() -> None:
    controller = Controller()
    controller.add("ann", "villager", (10.0, 0.0))
    controller.deliver(push("ann", "combat", "player"))
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.tier_of("ann") == Tier.GOLD
    controller.frame(DT, 0.5, Player((-200.0, 0.0)))
    assert controller.tier_of("ann") == Tier.BRONZE
    assert controller.intent_of("ann") is not None
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FLEE


# -- bronze NPCs at a lower rate --------------------------------------------------------------


def ran(controller: Controller) -> np.ndarray:
    """Whether each NPC's micro-policy ran in the last frame (its skipped time is zero)."""
    return controller.crowd.steer_lag[: len(controller.crowd)] == 0.0


@pytest.mark.parametrize(
    ("bronze_every", "per_frame", "every"),
    [(2, 0, 2), (3, 0, 3), (2, 100, 2), (2, 20, 3), (1, 15, 4)],  # the cap over the setting
)
def test_bronze_npcs_take_turns_and_every_one_runs_every_bronze_every_frames(
    bronze_every: int, per_frame: int, every: int
) -> None:
    settings = ControlSettings(seed=4, bronze_every=bronze_every, bronze_per_frame=per_frame)
    controller = Controller(settings=settings)
    for k in range(6):
        controller.add(f"gold{k}", "villager", (5.0 + k, 0.0))  # near the player
    for k in range(6):
        controller.add(f"silver{k}", "villager", (0.0, 45.0 + k))
    for k in range(60):  # far off, apart: bronze wanderers
        controller.add(f"far{k}", "villager", (300.0 + 3.0 * k, 300.0))
    crowd = controller.crowd
    since: dict[str, int] = dict.fromkeys(crowd.ids, 0)  # frames since each NPC last ran
    runs: list[np.ndarray] = []
    previous = [crowd.positions.copy()]

    def watch(now: float) -> None:
        mask = ran(controller)
        runs.append(mask)
        for npc in crowd.ids:
            since[npc] = 0 if mask[row(controller, npc)] else since[npc] + 1
            assert since[npc] < every, npc  # no NPC waits `every` frames or more
        lag = crowd.steer_lag[: len(crowd)]
        assert lag.max() <= (every - 1) * DT * (1 + 1e-9)
        pos = crowd.positions
        if len(pos) == len(previous[0]):
            steps = np.linalg.norm(pos - previous[0], axis=1)
            assert steps.min() > 0.0  # every wanderer moves in every frame: no stalls
        previous[0] = pos.copy()

    end = run(controller, 2.0, each=watch)
    assert {controller.tier_of(npc) for npc in crowd.ids if npc.startswith("far")} == {Tier.BRONZE}
    assert {controller.tier_of(f"gold{k}") for k in range(6)} == {Tier.GOLD}
    assert {controller.tier_of(f"silver{k}") for k in range(6)} == {Tier.SILVER}
    assert controller.stats().bronze_cadence == every  # 60 bronze, so many a frame at most
    masks = np.array(runs[1:])  # after the first frame, where every NPC runs
    assert masks[:, :12].all()  # gold and silver: every frame
    bronze = masks[:, 12:]
    assert set(bronze.sum(axis=1).tolist()) == {60 // every}  # an even share each frame
    for start in range(len(bronze) - every + 1):  # each one exactly once in every `every`
        assert (bronze[start : start + every].sum(axis=0) == 1).all()

    # Rows move when NPCs leave or join: every NPC runs in the next frame, and none waits
    # longer than before, whichever row it lands in.
    controller.remove("far3")
    controller.remove("gold0")
    controller.add("late", "villager", (600.0, 600.0))
    runs.clear()
    del since["far3"], since["gold0"]
    since["late"] = 0
    run(controller, 1.0, start=end, each=watch)
    assert runs[0].all()
    assert not runs[1].all()


def test_staggered_bronze_npcs_walk_the_same_paths_at_the_same_speeds() -> None:
    # The same far-off crowd, its policies run every frame or every other frame (each run
    # over the time since the NPC's last one): the same patrol paths, wandering that turns
    # as much and covers as much ground, at the same speeds.
    def crowd_after(every: int) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        table = ArchetypeTable()  # slow to speed up: 3 s to walking speed
        table.register(Archetype("porter", "guard", 3.0, 0.5, Behaviour(Policy.PATROL)))
        settings = ControlSettings(seed=9, bronze_every=every)
        controller = Controller(settings=settings, archetypes=table)
        for k in range(8):  # each on a road of its own
            x, y = 500.0 + 50.0 * k, 10.0 * k
            controller.add_route(f"road{k}", [(x, y), (x + 5.0 * k, y + 100.0)])
            controller.add(f"pat{k}", "porter", (x, y), route=f"road{k}")
        for k in range(600):  # far apart: each wanders on its own
            controller.add(
                f"ann{k}", "villager", (-500.0 + 40.0 * (k % 25), 400 + 40.0 * (k // 25))
            )
        crowd = controller.crowd
        start = crowd.positions.copy()
        walked = np.zeros(len(crowd))
        speeds: list[float] = []

        def watch(now: float) -> None:
            speeds.append(float(np.linalg.norm(crowd.vel[8 : len(crowd)], axis=1).mean()))

        before = [start]

        def measure(now: float) -> None:
            watch(now)
            pos = crowd.positions.copy()
            walked[:] += np.linalg.norm(pos - before[0], axis=1)
            before[0] = pos

        run(controller, 6.0, Player((0.0, -500.0)), each=measure)
        assert set(crowd.tier[: len(crowd)].tolist()) == {Tier.BRONZE}
        pos = crowd.positions.copy()
        return pos, walked, float(np.mean(speeds[60:])), np.linalg.norm(pos - start, axis=1)

    pos1, walked1, speed1, away1 = crowd_after(1)
    pos2, walked2, speed2, away2 = crowd_after(2)
    # Patrols are deterministic: the same path, speeding up and walking as far.
    np.testing.assert_allclose(pos2[:8], pos1[:8], atol=0.05)
    np.testing.assert_allclose(walked2[:8], walked1[:8], rtol=0.01)
    # Wandering is random: the same speed, ground covered and distance from home, on average.
    assert speed2 == pytest.approx(speed1, rel=0.02)
    assert walked2[8:].mean() == pytest.approx(walked1[8:].mean(), rel=0.02)
    assert away2[8:].mean() == pytest.approx(away1[8:].mean(), rel=0.08)  # turning as much
    assert not np.array_equal(pos2[8:], pos1[8:])  # they did run differently


def test_a_promoted_bronze_npc_runs_every_frame_at_once_without_a_jump() -> None:
    controller = Controller(settings=ControlSettings(seed=2, bronze_every=2))
    controller.add_route("yard", [(100.0, 0.0), (140.0, 0.0)])
    controller.add("gus", "guard", (100.0, 0.0), route="yard")
    for k in range(9):
        controller.add(f"far{k}", "villager", (200.0 + 3.0 * k, 0.0))
    gus = row(controller, "gus")
    crowd = controller.crowd
    arrived = 1.2  # the player walks up to the guard then: it is gold from the tier update

    def player(now: float) -> Player:
        return Player((0.0, 0.0) if now < arrived else (118.0, 5.0))

    tiers: list[Tier] = []
    steps: list[float] = []
    runs: list[bool] = []
    last = [position(controller, "gus")]

    def watch(now: float) -> None:
        tiers.append(controller.tier_of("gus"))
        runs.append(bool(ran(controller)[gus]))
        here = position(controller, "gus")
        steps.append(float(np.linalg.norm(here - last[0])))
        last[0] = here

    run(controller, 3.0, player, each=watch)
    promoted = tiers.index(Tier.GOLD)
    assert set(tiers[:promoted]) == {Tier.BRONZE} and set(tiers[promoted:]) == {Tier.GOLD}
    assert not all(runs[1:promoted])  # bronze: it skipped frames
    assert all(runs[promoted:])  # gold: it runs in every frame from the first one on
    # It walks on without a jump or a stall: every frame a step of its walking speed.
    cruise = 5.0 * 0.3 * DT
    assert max(steps[60:]) <= cruise * 1.01
    assert min(steps[60:]) >= cruise * 0.99
    assert float(crowd.steer_lag[gus]) == 0.0


@pytest.mark.parametrize("every", [1, 2, 3])
def test_a_bronze_npc_blends_a_new_policy_in_over_blend_s(every: int) -> None:
    settings = ControlSettings(bronze_every=every, blend_s=0.4, intent_ttl_s=60.0)
    controller = Controller(settings=settings)
    controller.add("ann", "villager", (300.0, 0.0))
    end = run(controller, 0.5)
    controller.deliver(push("ann", "combat", "player"))
    left: list[float] = []
    run(
        controller,
        1.0,
        start=end,
        each=lambda now: left.append(float(controller.crowd.blend_left[0])),
    )
    assert controller.crowd.policy[0] == Policy.FLEE and controller.tier_of("ann") == Tier.BRONZE
    # Over 0.4 s of game time, whichever frames it ran in (up to `every` - 1 frames late).
    done = left.index(0.0) + 1
    assert round(0.4 / DT) <= done <= round(0.4 / DT) + every - 1


def test_bronze_every_1_runs_everyone_every_frame_as_before() -> None:
    # Before bronze NPCs took turns, the tier never changed how an NPC moved: with
    # `bronze_every=1` a far-off (bronze) crowd moves exactly as the same crowd near the
    # player (gold), same seed, same positions. With turns, it does not.
    def positions(every: int, near: bool) -> np.ndarray:
        gold = TierBand(1e4, 1e4, 1000, 2.0) if near else TierBand(25.0, 35.0, 200, 2.0)
        silver = TierBand(1e4, 1e4, 400, 0.5) if near else TierBand(60.0, 80.0, 400, 0.5)
        settings = ControlSettings(seed=7, bronze_every=every, gold=gold, silver=silver)
        controller = Controller(settings=settings)
        controller.add_route("yard", [(0.0, 0.0), (20.0, 0.0), (20.0, 20.0)])
        for k in range(60):
            controller.add(f"ann{k}", "villager", (3.0 * k, 0.0))
            controller.add(f"zed{k}", "zombie", (3.0 * k, 40.0 + 0.4 * (k % 7)))
            controller.add(f"gus{k}", "guard", (0.0, 0.5 * k), route="yard")
        controller.deliver(push("ann0", "combat", "zed3"))
        controller.deliver(push("ann1", "chitchat", "gus2"))
        run(controller, 2.0, Player((2000.0, 2000.0)))
        expected = Tier.GOLD if near else Tier.BRONZE
        assert set(controller.crowd.tier[:180].tolist()) == {expected}
        return controller.crowd.positions.copy()

    everyone_gold = positions(1, near=True)
    np.testing.assert_array_equal(positions(1, near=False), everyone_gold)
    np.testing.assert_array_equal(positions(2, near=True), everyone_gold)  # nobody bronze
    assert not np.array_equal(positions(2, near=False), everyone_gold)


# -- prediction -------------------------------------------------------------------------------


def test_prediction_prefetches_the_greeting_and_counts_hits() -> None:
    source = RecordingSource()
    controller = Controller(source=source)
    controller.add("ahead", "barkeep", (8.0, 0.5))
    controller.add("aside", "barkeep", (0.0, 8.0))
    controller.add("behind", "barkeep", (-5.0, 0.0))
    controller.add("zed", "zombie", (4.0, 0.0))  # closer, but zombies do not talk
    walking = Player((0.0, 0.0), (1.4, 0.0), 0.0)
    controller.frame(DT, 0.0, walking)
    assert controller.predicted == "ahead"
    (prefetch,) = source.for_npc("ahead")
    assert prefetch.with_bark and prefetch.context
    controller.deliver(answer(prefetch, "chitchat", "player", bark="Welcome, traveller!"))
    controller.frame(DT, DT, walking)
    assert controller.take_bark("ahead") == "Welcome, traveller!"
    assert controller.take_bark("ahead") is None
    assert controller.interacted("ahead", 1.0)
    assert not controller.interacted("behind", 2.0)
    stats = controller.stats()
    assert (stats.prediction_hits, stats.prediction_misses, stats.prefetches) == (1, 1, 1)
    assert stats.hit_rate == 0.5


def test_a_prediction_counts_within_its_window() -> None:
    controller = Controller()
    controller.add("ahead", "barkeep", (8.0, 0.0))
    controller.add("behind", "barkeep", (-8.0, 0.0))
    controller.frame(DT, 0.0, Player((0.0, 0.0), facing=0.0))
    controller.frame(DT, 1.0, Player((0.0, 0.0), facing=math.pi))  # the player turns round
    assert controller.predicted == "behind"
    assert controller.interacted("ahead", 1.2)  # predicted 1.2 s ago: inside 1.5 s
    controller.frame(DT, 3.0, Player((0.0, 0.0), facing=math.pi))
    assert not controller.interacted("ahead", 3.0)
    assert controller.stats().predictions == 2


# -- the frame never waits ------------------------------------------------------------------


class SignallingSink:
    """Forwards to the controller and says when something arrived."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.arrived = threading.Event()

    def deliver(self, update: IntentUpdate) -> None:
        self.controller.deliver(update)
        self.arrived.set()

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        self.controller.fail(request, error)
        self.arrived.set()


def test_a_pending_fetch_never_delays_the_frame() -> None:
    started = threading.Event()

    async def fetch(request: IntentRequest) -> IntentUpdate:
        started.set()
        await asyncio.Event().wait()  # the model never answers
        raise AssertionError("unreachable")

    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    source = AsyncIntentSource(fetch)
    sink = SignallingSink(controller)
    source.start(sink)
    controller.source = source
    try:
        controller.request_now("marla")
        controller.frame(DT, 0.0, ORIGIN)
        assert started.wait(5)
        end = run(controller, 1.0, start=DT)  # 60 frames while the fetch hangs
        assert controller.stats().frames == 61
        assert controller.intents.in_flight("marla") is not None
    finally:
        source.close()
    assert sink.arrived.wait(5)  # closing fails the hanging request back to the controller
    controller.frame(DT, end, ORIGIN)
    assert controller.stats().failed == 1
    assert not source.running
    assert not [t for t in threading.enumerate() if t.name == "mythic-intents"]


def test_async_source_delivers_answers_and_failures() -> None:
    async def fetch(request: IntentRequest) -> IntentUpdate:
        await asyncio.sleep(0)
        if request.npc_id == "broken":
            raise RuntimeError("model down")
        return IntentUpdate(
            npc_id=request.npc_id, intent="trade", target="player", request_id="sdk-1"
        )

    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    controller.add("broken", "barkeep", (-5.0, 0.0))
    with AsyncIntentSource(fetch, max_concurrency=2) as source:
        sink = SignallingSink(controller)
        source.start(sink)
        controller.source = source
        for npc_id in ("marla", "broken"):
            sink.arrived.clear()
            controller.request_now(npc_id)
            controller.frame(DT, 0.0, ORIGIN)
            assert sink.arrived.wait(5)
        controller.frame(DT, DT, ORIGIN)
    intent = controller.intent_of("marla")
    assert intent is not None and intent.intent == "trade"
    assert intent.request_id != "sdk-1"  # re-stamped with the request it answers
    stats = controller.stats()
    assert (stats.answered, stats.failed) == (1, 1)
    assert not [t for t in threading.enumerate() if t.name == "mythic-intents"]


def test_async_source_serves_gold_before_silver_before_bronze() -> None:
    started = threading.Event()
    gate: dict[str, asyncio.Event] = {}

    async def fetch(request: IntentRequest) -> IntentUpdate:
        if request.npc_id == "first":
            gate["open"] = asyncio.Event()
            started.set()
            await gate["open"].wait()  # holds the only worker while the others queue
        return IntentUpdate(npc_id=request.npc_id, intent="hint", request_id=request.request_id)

    order: list[str] = []
    done = threading.Event()

    class Recorder:
        def deliver(self, update: IntentUpdate) -> None:
            order.append(update.npc_id)
            if len(order) == 4:
                done.set()

        def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
            raise AssertionError(f"{request.npc_id} failed: {error!r}")

    def request(npc_id: str) -> IntentRequest:
        return IntentRequest(npc_id=npc_id, request_id=f"r-{npc_id}")

    with AsyncIntentSource(fetch, max_concurrency=1) as source:
        source.start(Recorder())
        source.submit(request("first"), Tier.BRONZE)
        assert started.wait(5)
        source.submit(request("bronze"), Tier.BRONZE)
        source.submit(request("silver"), Tier.SILVER)
        source.submit(request("gold"), Tier.GOLD)
        source.loop.call_soon_threadsafe(gate["open"].set)  # runs after the three are queued
        assert done.wait(5)
    assert order == ["first", "gold", "silver", "bronze"]


def test_async_source_can_run_on_the_games_own_loop() -> None:
    loop = asyncio.new_event_loop()
    network = threading.Thread(target=loop.run_forever, name="game-network")
    network.start()
    try:

        async def fetch(request: IntentRequest) -> IntentUpdate:
            assert asyncio.get_running_loop() is loop
            return IntentUpdate(npc_id=request.npc_id, intent="quest", request_id="x")

        controller = Controller()
        controller.add("marla", "barkeep", (5.0, 0.0))
        source = AsyncIntentSource(fetch, loop=loop)
        sink = SignallingSink(controller)
        source.start(sink)
        controller.source = source
        controller.request_now("marla")
        controller.frame(DT, 0.0, ORIGIN)
        assert sink.arrived.wait(5)
        source.close()
        assert loop.is_running()  # the game's loop is not the source's to stop
        controller.frame(DT, DT, ORIGIN)
        intent = controller.intent_of("marla")
        assert intent is not None and intent.intent == "quest"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        network.join(5)
        loop.close()


def test_submit_after_close_fails_the_request() -> None:
    async def fetch(request: IntentRequest) -> IntentUpdate:
        raise AssertionError("never called")

    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    source = AsyncIntentSource(fetch)
    source.start(controller)
    source.close()
    controller.source = source
    controller.request_now("marla")
    controller.frame(DT, 0.0, ORIGIN)  # submit fails into the inbox
    controller.frame(DT, DT, ORIGIN)
    assert controller.stats().failed == 1


# -- bad input --------------------------------------------------------------------------------


def test_updates_for_unknown_npcs_are_ignored_and_counted() -> None:
    controller = Controller()
    controller.add("ann", "villager", (1.0, 0.0))
    controller.deliver(push("ghost", "chitchat", "player"))
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.stats().unknown_npc == 1
    assert controller.intent_of("ghost") is None


def test_nan_and_bad_values_are_refused() -> None:
    controller = Controller()
    with pytest.raises(ValueError, match="finite"):
        controller.add("ann", "villager", (math.nan, 0.0))
    with pytest.raises(ValueError, match="two numbers"):
        controller.add("ann", "villager", (1.0,))
    with pytest.raises(ValueError, match="player position must be finite"):
        Player((0.0, math.inf))
    controller.add("ann", "villager", (1.0, 0.0))
    with pytest.raises(ValueError, match="finite"):
        controller.teleport("ann", (0.0, math.nan))
    with pytest.raises(ValueError, match="finite"):
        controller.crowd.set_positions(np.array([0]), np.array([[math.nan, 0.0]]))
    with pytest.raises(ValueError, match="dt"):
        controller.frame(math.nan, 0.0, ORIGIN)
    with pytest.raises(ValueError, match="dt"):
        controller.frame(-DT, 0.0, ORIGIN)
    with pytest.raises(ValueError, match="protocol id"):
        controller.add("has space", "villager", (0.0, 0.0))
    with pytest.raises(ValueError, match="already"):
        controller.add("ann", "villager", (0.0, 0.0))
    assert np.isfinite(controller.crowd.positions).all()


def test_unknown_archetype_intent_and_target_follow_the_rules() -> None:
    controller = Controller()
    with pytest.raises(ValueError, match="unknown archetype 'dragon'; known: barkeep"):
        controller.add("smaug", "dragon", (0.0, 0.0))
    controller.add("zed", "zombie", (10.0, 0.0))
    controller.add("ann", "villager", (5.0, 0.0))
    # A zombie does not trade: no rule, so it keeps its default (the horde).
    controller.deliver(push("zed", "trade", "player"))
    # An intent outside the protocol (unvalidated) runs the default and is counted.
    controller.deliver(IntentUpdate.model_construct(npc_id="ann", intent="dance", target=None))
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.crowd.policy[row(controller, "zed")] == Policy.HORDE
    assert controller.crowd.policy[row(controller, "ann")] == Policy.WANDER
    assert controller.stats().unmapped_intent == 1
    # A target nobody knows: counted, and the intent runs as if it named none.
    controller.deliver(push("ann", "chitchat", "the_moon"))
    controller.frame(DT, DT, ORIGIN)
    assert controller.stats().unknown_target == 1
    assert controller.crowd.policy[row(controller, "ann")] == Policy.WANDER
    # Combat naming nobody is combat with the player.
    controller.deliver(push("ann", "combat", None))
    controller.frame(DT, 2 * DT, ORIGIN)
    assert controller.crowd.policy[row(controller, "ann")] == Policy.FLEE


def test_without_numpy_the_import_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['numpy'] = None\n"
        "try:\n"
        "    import mythic.control\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc.extra)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["MissingExtraError", "control"]


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="demote_beyond"):
        TierBand(30.0, 20.0, 10, 1.0)
    with pytest.raises(ValueError, match="blend_s"):
        ControlSettings(blend_s=-1.0)
    with pytest.raises(ValueError, match="intent_ttl_s"):
        ControlSettings(intent_ttl_s=math.nan)
    with pytest.raises(ValueError, match="neighbour_skin_m"):
        ControlSettings(neighbour_skin_m=-0.1)
    with pytest.raises(ValueError, match="separation_period_s"):
        ControlSettings(separation_period_s=-1.0)
    for every in (0, -2, 1.5, 2.0, True, "2"):
        with pytest.raises(ValueError, match="bronze_every: must be an integer >= 1"):
            ControlSettings(bronze_every=every)  # type: ignore[arg-type]
    assert ControlSettings(bronze_every=1).bronze_every == 1
    for cap in (-1, 2.5, False, "100"):
        with pytest.raises(ValueError, match="bronze_per_frame: must be an integer >= 0"):
            ControlSettings(bronze_per_frame=cap)  # type: ignore[arg-type]
    assert ControlSettings(bronze_per_frame=0).bronze_per_frame == 0


# -- the crowd --------------------------------------------------------------------------------


def test_removing_an_npc_keeps_ids_and_targets_right() -> None:
    controller = Controller(capacity=2)
    for k in range(100):  # grows by doubling from 2
        controller.add(f"n{k}", "villager", (float(k), 0.0))
    assert [controller.crowd.id_at(k) for k in range(100)] == [f"n{k}" for k in range(100)]
    assert controller.crowd.pos[99, 0] == 99.0
    controller.add("alice", "villager", (0.0, 5.0))
    controller.add("bob", "villager", (0.0, 8.0))
    controller.add("dave", "guard", (0.0, 9.0))
    controller.deliver(push("bob", "navigation", "alice"))  # bob follows alice
    controller.deliver(push("n0", "navigation", "dave"))  # n0 follows dave, the last row
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.crowd.policy[row(controller, "bob")] == Policy.FOLLOW

    controller.remove("alice")  # dave moves into alice's row
    controller.frame(DT, DT, ORIGIN)
    crowd = controller.crowd
    assert "alice" not in crowd and len(crowd) == 102
    assert all(crowd.index_of(npc) == k for k, npc in enumerate(crowd.ids))
    assert crowd.policy[row(controller, "bob")] == Policy.WANDER  # its target is gone
    assert controller.intent_of("bob") is None
    assert crowd.target[row(controller, "n0")] == row(controller, "dave")
    assert crowd.policy[row(controller, "n0")] == Policy.FOLLOW
    with pytest.raises(KeyError):
        controller.remove("alice")


# -- the sim's region -------------------------------------------------------------------------


def test_at_10000_npcs_the_neighbour_search_keeps_to_the_background() -> None:
    # The sim's region at 300 frames a second: after the first frames, every new search of
    # the close pairs is done in slices between frames, never at once in one (2-4 ms at this
    # size). It was, about once every 2 s, when searches looked where NPCs would be at the
    # end of their frames: lists were taken over a third closed already, and the next search
    # ran out of frames.
    from mythic.cli._sim import RegionSpec, build_region, cpu_model_settings

    controller = Controller(settings=cpu_model_settings(0), capacity=10_000)
    path = build_region(controller, RegionSpec(npcs=10_000, horde=3_000, seed=0))
    neighbours = controller.steering.neighbours
    dt = 1 / 300
    for k in range(1_500):
        position, velocity, facing = path.at(k * dt)
        controller.frame(dt, k * dt, Player(position, velocity, facing))
        if k == 30:
            started = neighbours.waits
    assert neighbours.waits == started
    assert neighbours.builds > 60  # it did search again, often


@pytest.mark.parametrize("horde", [80, 3000])
def test_the_sims_horde_starts_without_a_neighbour_search_every_frame(horde: int) -> None:
    # Packed tighter, a large horde starts as bodies inside each other and its first second of
    # frames goes into pushing them apart, with a new neighbour search held up in nearly every
    # frame (in all of the first 60 at 3,000 zombies, as it was): the sim would time its spawn.
    from mythic.cli._sim import RegionSpec, build_region

    controller = Controller(settings=ControlSettings(seed=0), capacity=horde + 1000)
    path = build_region(controller, RegionSpec(npcs=horde + 1000, horde=horde, seed=0))
    crowd = controller.crowd
    last = range(len(crowd) - horde, len(crowd))  # the horde is placed last
    assert {crowd.id_at(k).split("-")[0] for k in last} == {"zombie"}
    start = crowd.positions[-horde:].copy()
    run(controller, 1.0, Player(path.at(0.0)[0]))
    assert controller.steering.neighbours.waits <= 10
    pos = crowd.positions[-horde:]
    assert np.linalg.norm(pos - start, axis=1).max() < 2.0  # no one flung across the field
    spread = np.linalg.norm(pos - pos.mean(axis=0), axis=1)
    assert np.median(spread) < math.sqrt(horde / math.pi) + 8.0  # still a horde
