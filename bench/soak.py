"""A long run of a real server (the design's test plan, 004 §16.2): does anything grow?

Starts its own Redis (`redis-server` on a free port, nothing saved) and `mythic serve` on a
copy of the example world with `--npcs-extra` more NPCs (copies of its cards, renamed), the
NPCs' warm memory on that Redis, voice on unless `--no-voice`. Then, for `--minutes`:
- `--talkers` players (one WebSocket each) talk to the example world's NPCs, a line every few
  seconds (first token and whole reply timed);
- one game client asks the extra NPCs for intents at `--intent-hz` each (answers timed; the
  server keeps only the newest request per NPC, as a game's intent cache would);
- with voice, one player speaks a line (Piper's audio, as bench/voice.py makes it) every
  `--voice-every` seconds;
- at half time a lore file of the world copy is edited (the server reloads its knowledge), and
  half a minute later the Redis is stopped and started again on its port.

Each minute it samples the server and its workers: resident memory (from /proc smaps), open
file descriptors, threads, the asyncio tasks the server reports (`mythic_asyncio_tasks` on
/metrics), the host memory its engines hold parked KV in (`mythic_engine_parked_bytes`), and
the minute's p95 latencies and errors. The slopes of memory, descriptors and
tasks over the run after the warm-up (`--warmup` minutes) are fitted by least squares; "flat"
means the fitted growth over the whole run is within `--flat-mb` MB and `--flat-fds` fds.
Writes bench/results/soak.json (soak_quick.json with --quick).

    .venv/bin/python bench/soak.py [--minutes 60] [--talkers 8] [--npcs-extra 100]
        [--intent-hz 1.5] [--voice-every 30] [--no-voice] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _procs import free_port, process_tree  # noqa: E402
from _results import pct, write_results  # noqa: E402
from mythic.client import MythicClient  # noqa: E402
from mythic.contracts import ToolCall, VoiceFormat  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "soak.json"
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
LINES = [
    "Evening. What news from the road?",
    "What do you sell here, and for how much?",
    "Who runs this part of town?",
    "I heard something strange happened last night. Tell me.",
    "Where should a stranger stay the night?",
    "What do you think of the Night Watch?",
    "Is there work for someone like me?",
    "Thanks. Until next time.",
]


def _role(pid: int, server: int) -> str:
    """ "server", or a worker by its module's short name ("tts_worker"), or the pid."""
    if pid == server:
        return "server"
    with contextlib.suppress(OSError):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        for arg in args:
            if arg.startswith("mythic.speech._"):
                return arg.removeprefix("mythic.speech._")
    return str(pid)


def _process(pids: list[int]) -> dict[str, Any]:
    """Resident MB (in all and by process), open descriptors and threads of the server and
    its workers."""
    rss_kb, fds, threads = 0, 0, 0
    by_process: dict[str, float] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            rss = int(re.search(r"^Rss:\s+(\d+)", rollup, re.M).group(1))  # type: ignore[union-attr]
            rss_kb += rss
            role = _role(pid, pids[0])
            by_process[role] = by_process.get(role, 0.0) + rss / 1024
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            threads += len(os.listdir(f"/proc/{pid}/task"))
    return {
        "rss_mb": rss_kb / 1024,
        "rss_mb_by_process": by_process,
        "fds": fds,
        "threads": threads,
    }


def world_copy(folder: Path, extra: int) -> tuple[Path, list[str]]:
    """The example world with `extra` more NPCs (its cards again, renamed); their ids."""
    world = folder / "world"
    shutil.copytree(WORLD, world)
    cards = sorted((world / "npcs").glob("*.yaml"))
    ids = []
    for i in range(extra):
        card = yaml.safe_load(cards[i % len(cards)].read_text())
        first = card["name"].split(",")[0]
        card["name"] = f"{first} {i + 2}" + card["name"][len(first) :]
        npc_id = f"extra_{i:03d}"
        (world / "npcs" / f"{npc_id}.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
        ids.append(npc_id)
    return world, ids


@dataclass
class Minute:
    """What one minute of the run saw, client side."""

    ttft: list[float] = field(default_factory=list)
    reply: list[float] = field(default_factory=list)
    intent: list[float] = field(default_factory=list)
    voice: list[float] = field(default_factory=list)
    errors: int = 0


class Soak:
    def __init__(self, args: argparse.Namespace, url: str, talkers: list[str], extra: list[str]):
        self.args = args
        self.url = url
        self.talkers = talkers
        self.extra = extra
        self.minute = Minute()
        self.stop = asyncio.Event()
        self.error_kinds: dict[str, int] = {}
        self.skipped = 0
        """Intent asks skipped: the NPC's last one was not answered yet."""

    def _error(self, exc: BaseException) -> None:
        self.minute.errors += 1
        kind = type(exc).__name__
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    async def talker(self, i: int) -> None:
        rng = random.Random(i)
        npc = self.talkers[i % len(self.talkers)]
        async with MythicClient(self.url, player_id=f"player{i}", timeout_s=180) as client:
            while not self.stop.is_set():
                began = time.perf_counter()
                try:
                    turn = await client.say(npc, rng.choice(LINES))
                    first = None
                    async for _ in turn:
                        if first is None and turn.text:
                            first = time.perf_counter() - began
                    if first is not None:
                        self.minute.ttft.append(first)
                    self.minute.reply.append(time.perf_counter() - began)
                except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                    self._error(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), rng.uniform(2.0, 6.0))

    async def intents(self) -> None:
        async with MythicClient(self.url, timeout_s=self.args.intent_timeout) as client:
            interval = 1.0 / (self.args.intent_hz * len(self.extra))
            pending: dict[str, asyncio.Task[None]] = {}

            async def ask(npc: str) -> None:
                began = time.perf_counter()
                try:
                    await client.intent(npc, context="the player walks past")
                    self.minute.intent.append(time.perf_counter() - began)
                except Exception as exc:  # noqa: BLE001
                    self._error(exc)
                finally:
                    pending.pop(npc, None)

            i = 0
            next_at = time.perf_counter()
            while not self.stop.is_set():
                npc = self.extra[i % len(self.extra)]
                i += 1
                # One request per NPC at a time, as a game asks again once answered (the
                # server answers only an NPC's newest request): past what the engine serves,
                # an NPC's turn is skipped, and the offered rate is an upper bound.
                if npc not in pending:
                    pending[npc] = asyncio.create_task(ask(npc))
                else:
                    self.skipped += 1
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            for task in list(pending.values()):
                task.cancel()

    async def speaker(self, lines: list[bytes]) -> None:
        async def game(call: ToolCall) -> tuple[Any, None]:
            return "ok", None

        async with MythicClient(
            self.url, voice=VoiceFormat(binary=True), timeout_s=180, tool_handler=game
        ) as client:
            n = 0
            while not self.stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), self.args.voice_every)
                if self.stop.is_set():
                    break
                try:
                    turn = await client.talk(
                        self.talkers[n % len(self.talkers)], lines[n % len(lines)]
                    )
                    await turn.wait(120)
                    if turn.first_audio_at is not None and turn.speech_end_at is not None:
                        self.minute.voice.append(turn.first_audio_at - turn.speech_end_at)
                except Exception as exc:  # noqa: BLE001
                    self._error(exc)
                n += 1


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else None


def _gauges(http: httpx.Client) -> dict[str, Any]:
    """The server's asyncio tasks and the host memory of its parked KV (MB, by engine)."""
    out: dict[str, Any] = {"tasks": None, "parked_mb": {}}
    with contextlib.suppress(httpx.HTTPError):
        text = http.get("/metrics").text
        found = re.search(r"^mythic_asyncio_tasks\s+([0-9.e+]+)", text, re.M)
        out["tasks"] = float(found.group(1)) if found else None
        for engine, value in re.findall(
            r'^mythic_engine_parked_bytes\{engine="([^"]+)"\}\s+([0-9.e+]+)', text, re.M
        ):
            out["parked_mb"][engine] = float(value) / 2**20
    return out


class Services:
    """The Redis and the server the soak starts, stops and restarts (blocking calls: run them
    off the event loop)."""

    def __init__(self, args: argparse.Namespace, folder: Path, world: Path) -> None:
        self.redis_port, self.port = free_port(), free_port()
        self.redis_cmd = [
            "redis-server", "--port", str(self.redis_port), "--save", "", "--appendonly", "no"
        ]  # fmt: skip
        self.redis = self._start_redis()
        env = {
            **os.environ,
            "MYTHIC_MEMORY__WARM_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "MYTHIC_MEMORY__DATA_DIR": str(folder / "memory"),
            "MYTHIC_KNOWLEDGE__CACHE_DIR": str(folder / "cache"),
        }
        command = [sys.executable, "-m", "mythic", "serve", "--world", str(world)]
        command += ["--port", str(self.port), *([] if args.no_voice else ["--voice"])]
        self.server = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def _start_redis(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.redis_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def wait_ready(self) -> None:
        stdout = self.server.stdout
        assert stdout is not None
        seen, deadline = b"", time.monotonic() + 900
        while b"NPCs: " not in seen:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"mythic serve did not start: {seen.decode()[-2000:]}")
            if select.select([stdout], [], [], 5)[0]:
                seen += os.read(stdout.fileno(), 4096)
        while self.http.get("/readyz").status_code != 200:
            time.sleep(0.5)

    def restart_redis(self) -> None:
        self.redis.send_signal(signal.SIGTERM)
        self.redis.wait(30)
        time.sleep(2)
        self.redis = self._start_redis()

    def sample(self) -> dict[str, Any]:
        return {**_process(process_tree(self.server.pid)), **_gauges(self.http)}

    def close(self) -> None:
        self.server.send_signal(signal.SIGINT)
        try:
            self.server.wait(60)
        except subprocess.TimeoutExpired:
            self.server.kill()
        self.redis.terminate()
        self.http.close()


async def drive(
    args: argparse.Namespace, services: Services, world: Path, extra: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Soak]:
    """The load, and a sample a minute; the edit and the Redis restart at half time."""
    talkers = sorted(p.stem for p in (WORLD / "npcs").glob("*.yaml"))
    soak = Soak(args, f"ws://127.0.0.1:{services.port}/v1/ws", talkers, extra)
    samples: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    voice_lines: list[bytes] = []
    if not args.no_voice:
        from voice import synthesise

        voice_lines = await synthesise(5)
    tasks = [asyncio.create_task(soak.talker(i)) for i in range(args.talkers)]
    tasks.append(asyncio.create_task(soak.intents()))
    if voice_lines:
        tasks.append(asyncio.create_task(soak.speaker(voice_lines)))
    start = time.perf_counter()
    half = args.minutes * 30.0
    reloaded = restarted = False
    for minute in range(1, args.minutes + 1):
        while time.perf_counter() - start < minute * 60:
            elapsed = time.perf_counter() - start
            if not reloaded and elapsed >= half:
                lore = sorted((world / "lore").rglob("*.md"))[0]
                lore.write_text(lore.read_text() + "\n\nA new bell was hung this week.\n")
                events.append({"minute": elapsed / 60, "event": "lore edited (reload)"})
                reloaded = True
            if not restarted and elapsed >= half + 30:
                await asyncio.to_thread(services.restart_redis)
                events.append({"minute": elapsed / 60, "event": "redis restarted"})
                restarted = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(soak.stop.wait(), 1.0)
        seen, soak.minute = soak.minute, Minute()
        sample: dict[str, Any] = {
            "minute": minute,
            **await asyncio.to_thread(services.sample),
            "turns": len(seen.reply),
            "intents": len(seen.intent),
            "voice_turns": len(seen.voice),
            "errors": seen.errors,
            "ttft_p95_s": pct(seen.ttft, 0.95),
            "reply_p95_s": pct(seen.reply, 0.95),
            "intent_p95_s": pct(seen.intent, 0.95),
            "voice_p95_s": pct(seen.voice, 0.95),
        }
        samples.append(sample)
        print(
            f"minute {minute:3d}: {sample['rss_mb']:7.0f} MB {sample['fds']:4d} fds "
            f"{sample['threads']:3d} threads, tasks {sample['tasks']}, turns {sample['turns']}, "
            f"intents {sample['intents']}, voice {sample['voice_turns']}, "
            f"errors {sample['errors']}, TTFT p95 {sample['ttft_p95_s']}; MB by process "
            + ", ".join(f"{k} {v:.0f}" for k, v in sample["rss_mb_by_process"].items())
            + "; parked MB "
            + ", ".join(f"{k} {v:.0f}" for k, v in sample["parked_mb"].items()),
            flush=True,
        )
        if services.server.poll() is not None:
            events.append(
                {"minute": minute, "event": f"server exited ({services.server.returncode})"}
            )
            break
    soak.stop.set()
    await asyncio.wait(tasks, timeout=120)
    for task in tasks:
        task.cancel()
    return samples, events, soak


def fit_slopes(
    samples: list[dict[str, Any]], warmup: int, flat_mb: float, flat_fds: float
) -> dict[str, Any]:
    """Least-squares slopes after the warm-up: resident memory, the same less the engines'
    parked KV (a cache filling to its `engine.park_mb` budgets, not a leak), descriptors,
    threads and tasks; "flat" where the growth over the run is within its limit."""
    after = [s for s in samples if s["minute"] > warmup]
    xs = [float(s["minute"]) for s in after]
    span = (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
    series: dict[str, tuple[list[float], float | None]] = {
        "rss_mb": ([float(s["rss_mb"]) for s in after], flat_mb),
        "fds": ([float(s["fds"]) for s in after], flat_fds),
        "threads": ([float(s["threads"]) for s in after], None),
    }
    if after and all("parked_mb" in s for s in after):
        less = [float(s["rss_mb"]) - sum(s["parked_mb"].values()) for s in after]
        series["rss_less_parked_mb"] = (less, flat_mb)
    slopes: dict[str, Any] = {}
    for key, (ys, limit) in series.items():
        slope = _slope(xs, ys)
        slopes[key] = {
            "per_minute": slope,
            "over_run": slope * span if slope is not None else None,
            "flat": None if slope is None or limit is None else abs(slope * span) <= limit,
        }
    task_rows = [s for s in after if s["tasks"] is not None]
    task_slope = _slope([float(s["minute"]) for s in task_rows], [s["tasks"] for s in task_rows])
    slopes["tasks"] = {"per_minute": task_slope}
    return slopes


def refit(path: Path) -> None:
    """Fit the slopes of a results file again from its samples (after this file's fitting
    changed), with the warm-up and limits it was run with."""
    document = json.loads(path.read_text())
    flat = document["flat"]
    document["results"]["slopes"] = fit_slopes(
        document["results"]["samples"], document["warmup_minutes"], flat["mb"], flat["fds"]
    )
    path.write_text(json.dumps(document, indent=2) + "\n")
    for key, slope in document["results"]["slopes"].items():
        print(f"slope of {key}: {slope}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="mythic-soak-"))
    world, extra = world_copy(folder, args.npcs_extra)
    services = Services(args, folder, world)
    try:
        services.wait_ready()
        samples, events, soak = asyncio.run(drive(args, services, world, extra))
    finally:
        services.close()
        shutil.rmtree(folder, ignore_errors=True)
    slopes = fit_slopes(samples, args.warmup, args.flat_mb, args.flat_fds)
    return {
        "samples": samples,
        "events": events,
        "slopes": slopes,
        "errors": sum(s["errors"] for s in samples),
        "error_kinds": soak.error_kinds,
        "intents_skipped": soak.skipped,
        "server_survived": len(samples) == args.minutes
        and not any(e["event"].startswith("server exited") for e in events),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--talkers", type=int, default=8)
    parser.add_argument("--npcs-extra", type=int, default=100)
    parser.add_argument("--intent-hz", type=float, default=1.5)
    parser.add_argument("--voice-every", type=float, default=30.0)
    parser.add_argument(
        "--intent-timeout",
        type=float,
        default=600.0,
        help="seconds a game waits for an intent; an ask given up on still costs the engine "
        "its work (60 s made every ask time out on 2 cores, 100 NPCs at 1.5 Hz)",
    )
    parser.add_argument("--no-voice", action="store_true")
    parser.add_argument("--warmup", type=int, default=5, help="minutes left out of the slopes")
    parser.add_argument("--flat-mb", type=float, default=50.0)
    parser.add_argument("--flat-fds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="4 minutes, 20 extra NPCs")
    parser.add_argument(
        "--refit",
        type=Path,
        help="only fit the slopes of this results file again, from its samples",
    )
    args = parser.parse_args()
    if args.refit:
        refit(args.refit)
        return
    if args.quick:
        args.minutes, args.npcs_extra, args.warmup = 4, 20, 1
    out = run(args)
    for key, slope in out["slopes"].items():
        print(f"slope of {key}: {slope}")
    print(f"errors {out['errors']} {out['error_kinds']}; server survived: {out['server_survived']}")
    write_results(
        RESULTS if not args.quick else RESULTS.with_name("soak_quick.json"),
        ROOT,
        results=out,
        benchmark="soak",
        minutes=args.minutes,
        talkers=args.talkers,
        npcs_extra=args.npcs_extra,
        intent_hz=args.intent_hz,
        intent_timeout_s=args.intent_timeout,
        voice=not args.no_voice,
        voice_every_s=args.voice_every,
        warmup_minutes=args.warmup,
        flat={"mb": args.flat_mb, "fds": args.flat_fds},
    )


if __name__ == "__main__":
    main()
