"""Frame time of the game-side controller, with the model's intent traffic off and on.

The `mythic sim` region (a town, its monsters, a zombie horde, a player walking a loop) at
1,000 and 10,000 NPCs, frames paced at 300 per second in real time; only `Controller.frame`
is timed. Rows, in one run, for each size: `off` (no intent requests: the baseline), then the
NPCs near the player asking a real Mythic server for intents over the client SDK, the client
on a thread of the game's process (`thread`) or in a process of its own (`process`, the
default of `mythic sim`). The server runs in its own process with `--threads` cores, as
beside a game; it and the intent process run at nice 10, below the game. Each set of rows runs
twice: `shared` (every process may run on every core, as before) and `pinned` (the frame loop
on cores of its own, the server and the intent process on the `--threads` others, as `mythic
sim` does by default), each with its own `off` baseline. `--cores realtime` is `pinned` with
the frame loop's thread under the real-time FIFO policy (`realtime_thread`; where the OS
allows it), so that no ordinary process on its core makes a due frame wait.

Each row runs `--rounds` times, the rounds interleaved; the table shows medians over rounds.
Columns: frame p50/p99/max (ms); over: frames over the 3.3 ms budget; preempt: those of them
whose own work (the thread's CPU time) was within budget, so the frame waited for its core or
the GIL; by model: over-budget frames attributable to the traffic (the row's minus `off`'s, at
the same size and cores; the target is 0); traffic: over-budget frames that were within it but
for the model's traffic they carried (answers read and applied, requests sent: the game
thread's own work for the model, apart from the load the model puts on the machine); x p99:
against `off`; applied/s: intents applied
per second; hit: the share of the player's interactions whose NPC was predicted (and
prefetched) in advance.

`--clients busy` adds a row with no intent traffic but the model busy all the same: a process
on the model's cores talks to NPCs over the server's HTTP API, one line after another, so the
model generates all through the row. `vs busy` is then a traffic row's over-budget count
minus the busy row's: the frames the traffic put over beyond what the model's arithmetic on
the other core does to every frame.

`--bronze 1/0,2/0,2/2500` runs every row with far-off (bronze) NPCs' micro-policies every
`EVERY` frames, and no more than about `CAP` of them a frame (`ControlSettings.bronze_every`,
`bronze_per_frame`; 0: no cap; the default `2/2500` runs 10,000 NPCs' every 4 frames), so they
are compared in the same run: `x over` is a row's over-budget count against the same row at
the first spec given; `cad` the cadence it ran at.

`--gc python,slack` runs every row twice: with Python's garbage collections wherever they
fall (frames included), and between frames (`SlackGC`, the default: what a game's loop does
with it); `x over` is then against the first.

Writes bench/results/frame.json (or `--out`).

    .venv/bin/python bench/frame.py [--seconds 20] [--sizes 1000,10000] [--threads 1]
                                    [--clients thread,process] [--cores shared,pinned,realtime]
                                    [--rounds 3] [--bronze 2/2500] [--gc slack]
                                    [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.cli._sim import (  # noqa: E402
    FRAME_BUDGET_S,
    RegionSpec,
    SourceKind,
    build_region,
    cpu_model_settings,
    intent_source,
    pinned,
    run_paced,
    spawned_server,
    speakers,
)
from mythic.control import Controller, CoreSplit, split_cores  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
BUSY_LINES = [
    "Tell me everything you know about the old mill and the people who lived there.",
    "What happened in this town last winter? Spare no detail.",
    "Describe the road to the cathedral, every turn of it.",
]


def keep_busy(http: str, cpus: list[int] | None, stop: Any) -> None:
    """A player talking to NPCs over HTTP, one line after another, until `stop` is set: the
    model busy on its core with no intent traffic (the `busy` row)."""
    import itertools

    import httpx

    from mythic.control import pin_thread

    if cpus:
        pin_thread(cpus)
    os.nice(10)
    with httpx.Client(base_url=http, timeout=120.0) as client:
        for n in itertools.count():
            if stop.is_set():
                return
            npc = ("marla", "bran", "father_anselm")[n % 3]
            try:
                client.post(f"/v1/npcs/{npc}/say", json={"text": BUSY_LINES[n % 3]})
            except httpx.HTTPError:
                time.sleep(0.5)  # the server going away: no tight loop


@contextlib.contextmanager
def busy_model(url: str, cpus: Any) -> Iterator[None]:
    """The server's model kept busy generating chat replies, from a process on `cpus`."""
    import multiprocessing

    http = "http://" + url.removeprefix("ws://").removesuffix("/v1/ws")
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    process = context.Process(
        target=keep_busy, args=(http, sorted(cpus) if cpus else None, stop), daemon=True
    )
    process.start()
    time.sleep(1.0)  # the first line reaches the model before the frames start
    try:
        yield
    finally:
        stop.set()
        process.join(130)
        if process.is_alive():
            process.terminate()


def run_row(
    npcs: int,
    seconds: float,
    url: str | None,
    client: SourceKind | Literal["busy"] | None,
    split: CoreSplit | None,
    bronze: tuple[int, int],
    realtime: bool = False,
    gc: str = "slack",
) -> dict[str, Any]:
    every, cap = bronze
    settings = dataclasses.replace(cpu_model_settings(0), bronze_every=every, bronze_per_frame=cap)
    controller = Controller(settings=settings, capacity=npcs)
    path = build_region(controller, RegionSpec(npcs=npcs, horde=npcs * 3 // 10, seed=0))
    source = None
    with contextlib.ExitStack() as stack:
        if split is not None:
            stack.enter_context(pinned(split.game, realtime=realtime))
        cpus = split.model if split is not None else None
        if url is not None and client == "busy":
            stack.enter_context(busy_model(url, cpus))
        elif url is not None and client is not None:
            source = stack.enter_context(
                intent_source(controller, url, speakers(WORLD), client, cpus=cpus)
            )
        run = run_paced(controller, path, seconds=seconds, gc_in_slack=gc == "slack")
    s = run.stats
    interactions = s.prediction_hits + s.prediction_misses
    return {
        "npcs": npcs,
        "cores": "shared" if split is None else "realtime" if realtime else "pinned",
        "bronze": f"{every}/{cap}",
        "bronze_every": every,
        "bronze_per_frame": cap,
        "bronze_cadence": s.bronze_cadence,
        "gc": gc,
        "gc_collections": run.collections,
        "gc_between_frames_s": run.gc_s,
        "gc_late_frames": run.gc_late,
        "traffic": client or "off",
        "frames": len(run.frame_s),
        "frame_ms": latency(run.frame_s, 1000),
        "over_budget": run.over_budget,
        "preempted": run.preempted,
        "by_traffic": run.by_traffic,
        "intents": {
            "sent": s.requests_sent,
            "applied": s.applied,
            "applied_per_s": run.applied_per_s,
            "stale": s.dropped_stale,
            "timed_out": s.timed_out,
            "failed": s.failed,
            "shed": s.shed,
            "queued_too_long": source.expired_in_queue if source is not None else 0,
        },
        "tiers": {"gold": s.gold, "silver": s.silver, "bronze": s.bronze},
        "interactions": interactions,
        "hit_rate": s.hit_rate if interactions else None,
    }


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (size, cores, bronze spec, garbage collection, traffic): medians over the
    rounds; `over_by_model` is the row's median over-budget count minus its `off` row's (same
    size, cores, bronze spec and collection); `x_over` its over-budget count against the same
    row at the first bronze spec and collection run."""
    groups: dict[tuple[int, str, str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["npcs"], run["cores"], run["bronze"], run["gc"], run["traffic"])
        groups.setdefault(key, []).append(run)
    rows = []
    for (npcs, cores, bronze, gc, traffic), group in groups.items():
        rows.append(
            {
                "npcs": npcs,
                "cores": cores,
                "bronze": bronze,
                "gc": gc,
                "bronze_cadence": statistics.median(g["bronze_cadence"] for g in group),
                "traffic": traffic,
                "rounds": len(group),
                "frame_ms": {
                    k: statistics.median(g["frame_ms"][k] for g in group)
                    for k in ("p50", "p95", "p99", "max")
                },
                "over_budget": statistics.median(g["over_budget"] for g in group),
                "over_budget_each": [g["over_budget"] for g in group],
                "preempted": statistics.median(g["preempted"] for g in group),
                "by_traffic": statistics.median(g["by_traffic"] for g in group),
                "applied_per_s": statistics.median(g["intents"]["applied_per_s"] for g in group),
                "hit_rate": median_or_none([g["hit_rate"] for g in group]),
            }
        )
    # The baselines by (size, cores, bronze spec, collection): no traffic, and the model busy.
    baselines: dict[str, dict[tuple[int, str, str, str], dict[str, Any]]] = {"off": {}, "busy": {}}
    for r in rows:
        if r["traffic"] in baselines:
            baselines[r["traffic"]][(r["npcs"], r["cores"], r["bronze"], r["gc"])] = r
    first = (runs[0]["bronze"], runs[0]["gc"]) if runs else None
    same = {
        (r["npcs"], r["cores"], r["traffic"]): r for r in rows if (r["bronze"], r["gc"]) == first
    }
    for r in rows:
        before = same.get((r["npcs"], r["cores"], r["traffic"]))
        r["x_over"] = (
            ratio(max(r["over_budget"], 1), max(before["over_budget"], 1)) if before else None
        )
        key = (r["npcs"], r["cores"], r["bronze"], r["gc"])
        base = baselines["off"].get(key)
        on = r["traffic"] != "off"
        r["over_by_model"] = (
            max(0, r["over_budget"] - base["over_budget"]) if on and base is not None else 0
        )
        r["x_p99"] = ratio(r["frame_ms"]["p99"], base["frame_ms"]["p99"]) if base else None
        loaded = baselines["busy"].get(key)
        r["over_vs_busy"] = (
            max(0, r["over_budget"] - loaded["over_budget"])
            if loaded is not None and r["traffic"] in ("thread", "process")
            else None
        )
    return rows


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--threads", type=int, default=1, help="cores for the server's model")
    parser.add_argument("--clients", default="thread,process", help="where the client runs")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each row (medians)")
    parser.add_argument(
        "--cores",
        default="shared,pinned",
        help="shared: all processes on all cores; pinned: "
        "the frame loop on cores of its own, the server and intent process on --threads others; "
        "realtime: pinned, the frame loop under the real-time FIFO policy",
    )
    parser.add_argument(
        "--bronze",
        default="2/2500",
        help="EVERY/CAP: a bronze NPC's micro-policy every EVERY frames, at most about CAP "
        "of them a frame (0: no cap); several (2/0,2/2500) to compare",
    )
    parser.add_argument(
        "--gc",
        default="slack",
        help="slack: Python's garbage collections between frames (SlackGC), as a game's loop "
        "keeps them; python: wherever Python runs them, frames included; both to compare",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "frame.json",
        help="where to write the results",
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    clients: list[SourceKind | Literal["busy"] | None] = [None]
    for name in args.clients.split(","):
        if name not in ("thread", "process", "busy"):
            parser.error(f"--clients: {name!r} is not thread, process or busy")
        clients.append(name)  # type: ignore[arg-type]  # one of the three, checked above
    placements: list[tuple[CoreSplit | None, bool]] = []
    for name in args.cores.split(","):
        if name == "shared":
            placements.append((None, False))
        elif name in ("pinned", "realtime"):
            split = split_cores(args.threads)
            if split is None:
                parser.error("--cores pinned: this machine cannot pin (one core, or not Linux)")
            placements.append((split, name == "realtime"))
        else:
            parser.error(f"--cores: {name!r} is not shared, pinned or realtime")
    bronzes: list[tuple[int, int]] = []
    for spec in args.bronze.split(","):
        every, _, cap = spec.partition("/")
        try:
            bronzes.append((int(every), int(cap or 0)))
        except ValueError:
            parser.error(f"--bronze: {spec!r} is not EVERY/CAP (integers)")
        if bronzes[-1][0] < 1 or bronzes[-1][1] < 0:
            parser.error(f"--bronze: {spec!r}: EVERY must be >= 1 and CAP >= 0")

    gcs = args.gc.split(",")
    for name in gcs:
        if name not in ("slack", "python"):
            parser.error(f"--gc: {name!r} is neither slack nor python")

    runs: list[dict[str, Any]] = []
    for split, realtime in placements:
        cpus = split.model if split is not None else None
        # No background warm-up of NPC prompts at the server's start (server.warm_npcs): it
        # would load the first round only.
        os.environ.setdefault("MYTHIC_SERVER__WARM_NPCS", "0")
        with spawned_server(WORLD, threads=args.threads, cpus=cpus) as url:
            for n in range(args.rounds):  # rounds interleaved, so slow spells hit every row
                for npcs in sizes:
                    for bronze in bronzes:
                        for gc in gcs:
                            for client in clients:
                                row = run_row(
                                    npcs, args.seconds, url, client, split, bronze, realtime, gc
                                )
                                runs.append(row | {"round": n})
    rows = summarise(runs)
    print(
        f"frames paced at 300/s for {args.seconds:g} s, {args.rounds} round(s), medians; "
        f"budget {FRAME_BUDGET_S * 1000:.1f} ms"
    )
    header = (
        f"{'npcs':>6} {'cores':<9}{'bronze':>7}{'cad':>4} {'gc':<7}{'client':<8}"
        f"{'p50':>7}{'p99':>7}{'max':>7}"
    )
    print(
        header + f"{'over':>6}{'x over':>7}{'preempt':>8}{'by model':>9}{'traffic':>8}"
        f"{'vs busy':>8}{'x p99':>7}"
        f"{'applied/s':>10}{'hit':>6}"
    )
    for r in rows:
        ms = r["frame_ms"]
        print(
            f"{r['npcs']:>6} {r['cores']:<9}{r['bronze']:>7}{fmt(r['bronze_cadence'], 'g'):>4}"
            f" {r['gc']:<7}{r['traffic']:<8}"
            f"{fmt(ms['p50'], '.2f'):>7}{fmt(ms['p99'], '.2f'):>7}{fmt(ms['max'], '.2f'):>7}"
            f"{fmt(r['over_budget'], 'g'):>6}{fmt(r['x_over'], '.2f'):>7}"
            f"{fmt(r['preempted'], 'g'):>8}{fmt(r['over_by_model'], 'g'):>9}"
            f"{fmt(r['by_traffic'], 'g'):>8}{fmt(r['over_vs_busy'], 'g'):>8}"
            f"{fmt(r['x_p99'], '.2f'):>7}"
            f"{fmt(r['applied_per_s'], '.1f'):>10}{fmt(r['hit_rate'], '.2f'):>6}"
        )
    write_results(
        args.out.resolve(),
        ROOT,
        benchmark="frame",
        seconds=args.seconds,
        fps=300,
        budget_ms=FRAME_BUDGET_S * 1000,
        server_threads=args.threads,
        nice=10,
        rounds=args.rounds,
        bronze=[f"{every}/{cap}" for every, cap in bronzes],
        gc=gcs,
        runs=runs,
        cores={
            "shared" if s is None else "realtime" if rt else "pinned": None
            if s is None
            else {"game": sorted(s.game), "model": sorted(s.model)}
            for s, rt in placements
        },
        results=rows,
    )


if __name__ == "__main__":
    main()
