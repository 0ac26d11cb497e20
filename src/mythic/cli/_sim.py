"""`mythic sim`: a headless region run by the game-side controller, intents from a real server.

The region: a town of villagers, merchants and barkeeps, guards patrolling its walls,
vampires, werewolves, ghouls and liches on the outskirts, and a zombie horde; a player walks a
loop through it. Every frame the controller (`mythic.control`) moves every NPC; the NPCs near
the player ask a Mythic server for intents over the client SDK (`IntentRequest` ->
`IntentUpdate`), each sim NPC speaking through the world persona of its archetype. Frames are
paced to real time, so the model's answers arrive as they would in a game, and only the
controller's own work is timed.

`bench/frame.py` runs the same region with model traffic on and off.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mythic._errors import MythicError
from mythic.cli._replay import ReplayRecorder
from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control import IntentShedError

FRAME_BUDGET_S = 1 / 300
"""The frame path's budget: 3.3 ms, 300 frames per second."""
_NICE = 10
"""How far below the game the model's processes run (server and intent client)."""

# Sim archetype -> world archetype whose persona speaks for it (the town's humans share).
_SPEAKS_AS = {"barkeep": "human", "villager": "human", "merchant": "human", "guard": "human"}
# Share of the non-horde population by archetype.
_MIX = {
    "villager": 0.36,
    "merchant": 0.08,
    "barkeep": 0.02,
    "guard": 0.10,
    "vampire": 0.08,
    "werewolf": 0.08,
    "ghoul": 0.14,
    "lich": 0.02,
    "zombie": 0.12,
}


def cpu_model_settings(seed: int = 0) -> Any:
    """Controller settings sized for a model on one CPU core (about one intent a second, each
    taking seconds): fewer gold NPCs asking less often, longer request timeouts, and a busy
    persona's requests retried less eagerly. A GPU-served game keeps the defaults (200 gold
    at 2 Hz, 3 s timeouts)."""
    from mythic.control import ControlSettings, TierBand

    return ControlSettings(
        seed=seed,
        gold=TierBand(25.0, 35.0, 32, 1.0),
        silver=TierBand(60.0, 80.0, 120, 0.1),
        request_timeout_s=12.0,
        retry_after_s=2.0,
    )


class PersonaBusyError(MythicError, IntentShedError):
    """The persona speaking for an NPC's archetype is answering another NPC's intent."""


@dataclass(frozen=True, slots=True)
class RegionSpec:
    """What `build_region` places."""

    npcs: int = 1000
    """NPCs in all, the horde included."""
    horde: int = 300
    """Zombies in the horde (part of `npcs`)."""
    size_m: float = 240.0
    """The region is a square this wide; the town is its middle third."""
    player_speed: float = 1.6
    """Metres per second along the player's loop."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.npcs < 1 or not 0 <= self.horde <= self.npcs:
            raise ValueError("npcs must be at least 1 and horde between 0 and npcs")
        if not (self.size_m >= 60 and self.player_speed > 0):
            raise ValueError("size_m must be at least 60 and player_speed positive")


class PlayerPath:
    """The player walking a closed loop of waypoints at a constant speed."""

    def __init__(self, points: Sequence[tuple[float, float]], speed: float) -> None:
        self.points = list(points)
        self.speed = speed
        legs = zip(self.points, [*self.points[1:], self.points[0]], strict=True)
        self._legs = [(a, b, math.dist(a, b)) for a, b in legs]
        self.length = sum(d for _, _, d in self._legs)

    def at(self, t: float) -> tuple[tuple[float, float], tuple[float, float], float]:
        """Position, velocity and facing at `t` seconds."""
        s = (t * self.speed) % self.length
        for (ax, ay), (bx, by), d in self._legs:
            if s <= d and d > 0:
                ux, uy = (bx - ax) / d, (by - ay) / d
                return (
                    (ax + ux * s, ay + uy * s),
                    (ux * self.speed, uy * self.speed),
                    math.atan2(uy, ux),
                )
            s -= d
        return self.points[0], (0.0, 0.0), 0.0


def build_region(controller: Any, spec: RegionSpec) -> PlayerPath:
    """Place `spec.npcs` NPCs, the patrol routes and landmarks; returns the player's loop."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    size = spec.size_m
    lo, hi = size / 3, 2 * size / 3
    centre = (size / 2, size / 2)
    landmarks = {
        "tavern": (centre[0] - 12, centre[1] + 6),
        "chapel": (centre[0] + 20, centre[1] + 18),
        "gate": (lo, centre[1]),
        "square": centre,
    }
    for name, point in landmarks.items():
        controller.set_landmark(name, point)
    controller.add_route("walls", [(lo, lo), (hi, lo), (hi, hi), (lo, hi)])
    controller.add_route("market", [(centre[0] - 15, centre[1] - 10), (centre[0] + 15, centre[1])])

    others = spec.npcs - spec.horde
    counts = {a: int(share * others) for a, share in _MIX.items()}
    counts["villager"] += others - sum(counts.values())
    n = 0
    for archetype, count in counts.items():
        for _ in range(count):
            if archetype in ("villager", "merchant", "barkeep"):
                x, y = rng.uniform(lo, hi, 2)
            elif archetype == "guard":
                x, y = rng.uniform(lo - 4, hi + 4, 2)
            else:  # monsters roam outside the walls
                x, y = rng.uniform(0, size, 2)
                while lo < x < hi and lo < y < hi:
                    x, y = rng.uniform(0, size, 2)
            route = (
                "walls" if archetype == "guard" else "market" if archetype == "merchant" else None
            )
            controller.add(f"{archetype}-{n}", archetype, (float(x), float(y)), route=route)
            n += 1
    horde_at = np.array([size * 0.85, size * 0.8])
    # A normal spread with at most about one zombie a square metre at its middle (n / 2 pi
    # sigma^2): a larger horde packed tighter starts as bodies inside each other, and the
    # first second of frames is spent pushing them apart (a neighbour search every frame).
    spread = max(6.0, math.sqrt(spec.horde / (2 * math.pi)))
    for _ in range(spec.horde):
        x, y = horde_at + rng.normal(0, spread, 2)
        controller.add(f"zombie-{n}", "zombie", (float(x), float(y)))
        n += 1
    loop = [
        landmarks["gate"],
        landmarks["square"],
        landmarks["tavern"],
        landmarks["chapel"],
        (size * 0.75, size * 0.7),
    ]
    return PlayerPath(loop, spec.player_speed)


# -- model traffic ----------------------------------------------------------------------------


def speakers(world: Path) -> dict[str, str]:
    """For each sim archetype, the world NPC whose persona answers its intents.

    Raises:
        MythicError: the world has no NPCs.
    """
    from mythic.knowledge import load_world

    loaded = load_world(world)
    if not loaded.npcs:
        raise MythicError(f"world {world} has no NPCs to speak for the sim")
    by_archetype: dict[str, str] = {}
    for npc_id, persona in sorted(loaded.npcs.items()):
        by_archetype.setdefault(persona.archetype, npc_id)
    fallback = next(iter(sorted(loaded.npcs)))
    return {
        archetype: by_archetype.get(_SPEAKS_AS.get(archetype, archetype), fallback)
        for archetype in _MIX
    }


def server_fetch(client: Any, speaker_of: dict[str, str], player_id: str) -> Any:
    """A `fetch` for `AsyncIntentSource`: asks the server as the NPC's archetype persona and
    hands the answer back under the sim NPC's id (a target other than the player is
    dropped: the server's scene is not the sim's)."""

    # A persona's actor serves one intent at a time and keeps only the newest waiting one, so
    # sim NPCs sharing a persona must not overwrite each other's asks. A persona already
    # answering sheds the request at once (the controller asks again shortly): only fresh
    # requests reach the model, and an answer never arrives after its request timed out.
    busy: set[str] = set()

    async def fetch(request: IntentRequest) -> IntentUpdate:
        speaker = speaker_of[request.npc_id.rsplit("-", 1)[0]]
        if speaker in busy:
            raise PersonaBusyError(f"{speaker} is answering another NPC's intent")
        busy.add(speaker)
        try:
            update: IntentUpdate = await client.intent(
                speaker,
                context=request.context,
                with_bark=request.with_bark,
                request_id=request.request_id,
            )
        finally:
            busy.discard(speaker)
        target = player_id if update.target == "player" else None
        return update.model_copy(update={"npc_id": request.npc_id, "target": target})

    return fetch


@contextlib.asynccontextmanager
async def connect_server(
    url: str, speaker_of: dict[str, str], player_id: str, timeout_s: float = 10.0
) -> AsyncIterator[Any]:
    """`ProcessIntentSource`'s `connect` (pass it as a `functools.partial`): a connected
    `MythicClient` in the intent process, and `server_fetch` over it."""
    from mythic.client import MythicClient

    client = MythicClient(url, timeout_s=timeout_s)
    await client.connect()
    try:
        yield server_fetch(client, speaker_of, player_id)
    finally:
        await client.aclose()


SourceKind = Literal["process", "thread"]


@contextlib.contextmanager
def intent_source(
    controller: Any,
    url: str,
    speaker_of: dict[str, str],
    kind: SourceKind = "process",
    *,
    cpus: Collection[int] | None = None,
) -> Iterator[Any]:
    """Connect `controller` to the server at `url` through a started intent source: the
    client in a child process below the game's priority and on `cpus` (`process`), or on a
    thread of the game's process (`thread`); closed on exit."""
    from mythic.control import AsyncIntentSource, ProcessIntentSource

    settings = controller.settings
    connect = functools.partial(connect_server, url, speaker_of, settings.player_id)
    wait = settings.request_timeout_s
    if kind == "process":
        source: Any = ProcessIntentSource(
            connect, max_concurrency=16, max_wait_s=wait, nice=_NICE, cpus=cpus
        )
        source.start(controller)
        try:
            controller.source = source
            yield source
        finally:
            controller.source = None
            source.close()
        return
    from mythic.client import MythicClient

    client = MythicClient(url, timeout_s=10.0)
    fetch = server_fetch(client, speaker_of, settings.player_id)
    source = AsyncIntentSource(fetch, max_concurrency=16, max_wait_s=wait)
    source.start(controller)
    try:
        source.run(client.connect()).result(60)
        controller.source = source
        yield source
    finally:
        controller.source = None
        with contextlib.suppress(Exception):
            source.run(client.aclose()).result(10)
        source.close()


@contextlib.contextmanager
def pinned(cpus: Collection[int] | None, *, realtime: bool = False) -> Iterator[bool]:
    """Run the calling thread (the frame loop, and threads it starts) on `cpus` inside the
    block, then on the cores it had; yields whether it was pinned (None: left alone). With
    `realtime`, the thread also runs under the real-time FIFO policy inside the block where
    the OS allows it (`realtime_thread`; threads and processes it starts run ordinary)."""
    from mythic.control import ordinary_thread, pin_thread, realtime_thread

    if cpus is None or not hasattr(os, "sched_getaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    done = pin_thread(cpus)
    fifo = done and realtime and realtime_thread()
    try:
        yield done
    finally:
        if fifo:
            ordinary_thread()
        if done:
            pin_thread(before)


def runs_realtime() -> bool:
    """Whether the calling thread runs under the real-time FIFO policy."""
    if not hasattr(os, "sched_getscheduler"):
        return False
    policy = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    return bool(policy == os.SCHED_FIFO)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def spawned_server(
    world: Path,
    *,
    threads: int = 1,
    nice: int = _NICE,
    cpus: Collection[int] | None = None,
    voice: bool = False,
    timeout_s: float = 300,
    log_to: Path | None = None,
) -> Iterator[str]:
    """`mythic serve` in a process of its own (as a game would run it), its engines limited
    to `threads` cores so the game keeps the rest, below the game's priority (`nice`, on
    POSIX) so the frame loop wins a contended core, and pinned to `cpus` (Linux) so it never
    takes the frame loop's; yields its WebSocket URL once ready. Its output goes to `log_to`
    (appended) when given, else to a temporary file shown if it fails to start.

    Raises:
        MythicError: the server exited or was not ready within `timeout_s`.
    """
    import httpx

    from mythic.control import Placement

    port = free_port()
    env = {**os.environ, "MYTHIC_ENGINE__N_THREADS": str(threads)}
    placement = Placement(nice, frozenset(cpus) if cpus is not None else None)
    with log_to.open("a+b") if log_to is not None else tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "mythic", "serve", "--world", str(world)),
                *("--port", str(port), "--voice" if voice else "--no-voice"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=placement.apply if os.name == "posix" else None,
        )
        try:
            deadline = time.monotonic() + timeout_s
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as http:
                while True:
                    if proc.poll() is not None:
                        log.seek(0)
                        tail = log.read().decode(errors="replace")[-2000:]
                        raise MythicError(f"the server exited ({proc.returncode}):\n{tail}")
                    if time.monotonic() > deadline:
                        raise MythicError(f"the server was not ready within {timeout_s:.0f} s")
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get("/readyz").status_code == 200:
                            break
                    time.sleep(0.2)
            yield f"ws://127.0.0.1:{port}/v1/ws"
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# -- running ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SimRun:
    """What one paced run measured."""

    npcs: int
    seconds: float
    frame_s: list[float] = field(default_factory=list)
    """The controller's time per frame."""
    cpu_s: list[float] = field(default_factory=list)
    """The frame loop thread's CPU time per frame: below `frame_s` by the time the thread
    waited (another thread or process had its core, or it waited for the GIL)."""
    traffic_s: list[float] = field(default_factory=list)
    """The part of each frame spent on the model's traffic (`Controller.traffic_s`)."""
    stats: Any = None
    """`ControllerStats` at the end."""
    applied_before: int = 0
    collections: list[int] | None = None
    """Garbage collections run between frames, by generation (None: Python ran its own)."""
    gc_s: float = 0.0
    """Seconds those collections took, between frames."""
    gc_late: int = 0
    """Frames that started late because a collection ran past their start."""

    @property
    def over_budget(self) -> int:
        return sum(1 for s in self.frame_s if s > FRAME_BUDGET_S)

    @property
    def preempted(self) -> int:
        """Frames over budget whose own work (CPU time) was within it: the thread waited."""
        return sum(
            1 for s, cpu in zip(self.frame_s, self.cpu_s, strict=True) if s > FRAME_BUDGET_S >= cpu
        )

    @property
    def by_traffic(self) -> int:
        """Frames over budget that were within it but for the model's traffic they carried
        (answers read and applied, requests sent, in the frame loop's thread): what the
        game's side of the model costs a frame, apart from the load the model puts on the
        machine."""
        return sum(
            1
            for s, t in zip(self.frame_s, self.traffic_s, strict=True)
            if s > FRAME_BUDGET_S >= s - t
        )

    @property
    def applied_per_s(self) -> float:
        applied = (self.stats.applied if self.stats else 0) - self.applied_before
        return applied / self.seconds if self.seconds else 0.0


def run_paced(
    controller: Any,
    path: PlayerPath,
    *,
    seconds: float,
    fps: float = 300.0,
    start_s: float = 0.0,
    recorder: ReplayRecorder | None = None,
    gc_in_slack: bool = True,
) -> SimRun:
    """Run frames at `fps` in real time for `seconds`; the player starts `start_s` into its
    loop. When the player stops within 2.5 m in front of an NPC it counts as an interaction
    (scoring the prediction), at most one a second. A `recorder` samples the crowd between
    frames. With `gc_in_slack`, Python's garbage collections run between frames (`SlackGC`),
    as a game's loop would keep them; without, wherever Python runs them, frames included."""
    from mythic.control import SlackGC

    run = SimRun(len(controller.crowd), seconds)
    run.applied_before = controller.stats().applied
    period = 1.0 / fps
    collector = SlackGC() if gc_in_slack else None
    with collector or contextlib.nullcontext():
        _paced_frames(controller, path, run, collector, period, start_s, recorder)
    run.stats = controller.stats()
    if collector is not None:
        run.collections = list(collector.collections)
    return run


def _paced_frames(
    controller: Any,
    path: PlayerPath,
    run: SimRun,
    collector: Any,
    period: float,
    start_s: float,
    recorder: ReplayRecorder | None,
) -> None:
    import numpy as np

    from mythic.control import Player

    seconds = run.seconds
    clock, thread_time = time.perf_counter, time.thread_time
    began = clock()
    next_frame = began
    last_check = -math.inf
    last_partner: str | None = None
    previous = began
    crowd = controller.crowd
    while True:
        now = clock()
        elapsed = now - began
        if elapsed >= seconds:
            break
        position, velocity, facing = path.at(start_s + elapsed)
        player = Player(position, velocity, facing)
        started, cpu = clock(), thread_time()
        controller.frame(now - previous, now, player)
        run.frame_s.append(clock() - started)
        run.cpu_s.append(thread_time() - cpu)
        run.traffic_s.append(controller.traffic_s)
        previous = now
        if recorder is not None:
            recorder.sample(elapsed, position)
        if now - last_check >= 1.0:  # the game's own logic: who is the player talking to?
            last_check = now
            rel = crowd.positions - np.asarray(position, dtype=np.float32)
            dist = np.hypot(rel[:, 0], rel[:, 1])
            # Only NPCs in front of the player: behind it, it walks on by.
            ahead = rel[:, 0] * math.cos(facing) + rel[:, 1] * math.sin(facing) > 0
            dist[~ahead] = np.inf
            nearest = int(np.argmin(dist)) if len(dist) else -1
            if nearest >= 0 and dist[nearest] < 2.5:
                partner = crowd.id_at(nearest)
                if partner != last_partner:
                    controller.interacted(partner, now)
                    last_partner = partner
        next_frame += period
        if collector is not None:  # in the slack before the next frame, where it fits
            before = clock()
            if collector.collect(next_frame - before) is not None:
                after = clock()
                run.gc_s += after - before
                run.gc_late += after > next_frame > before
        pause = next_frame - clock()
        if pause > 0:
            time.sleep(pause)
        else:
            next_frame = clock()
