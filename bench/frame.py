"""Frame time of the game-side controller, with the model's intent traffic off and on.

The `mythic sim` region (a town, its monsters, a zombie horde, a player walking a loop) at
1,000 and 10,000 NPCs, frames paced at 300 per second in real time; only `Controller.frame`
is timed. Rows, in one run, for each size: `off` (no intent requests: the baseline), then the
NPCs near the player asking a real Mythic server for intents over the client SDK, the client
on a thread of the game's process (`thread`) or in a process of its own (`process`, the
default of `mythic sim`). The server runs in its own process with `--threads` cores, as
beside a game; it and the intent process run at nice 10, below the game.

Columns: frame p50/p99/max (ms); over: frames over the 3.3 ms budget; by model: over-budget
frames attributable to the traffic (the row's minus `off`'s, at the same size; the target is
0); x p99: against `off`; applied/s: intents applied per second; hit: the share of the player's
interactions whose NPC was predicted (and prefetched) in advance.

Writes bench/results/frame.json.

    .venv/bin/python bench/frame.py [--seconds 20] [--sizes 1000,10000] [--threads 1]
                                    [--clients thread,process]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

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
    run_paced,
    spawned_server,
    speakers,
)
from mythic.control import Controller  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"


def run_row(
    npcs: int, seconds: float, url: str | None, client: SourceKind | None
) -> dict[str, Any]:
    settings = cpu_model_settings(0)  # as `mythic sim`
    controller = Controller(settings=settings, capacity=npcs)
    path = build_region(controller, RegionSpec(npcs=npcs, horde=npcs * 3 // 10, seed=0))
    source = None
    with contextlib.ExitStack() as stack:
        if url is not None and client is not None:
            source = stack.enter_context(intent_source(controller, url, speakers(WORLD), client))
        run = run_paced(controller, path, seconds=seconds)
    s = run.stats
    interactions = s.prediction_hits + s.prediction_misses
    return {
        "npcs": npcs,
        "traffic": client or "off",
        "frames": len(run.frame_s),
        "frame_ms": latency(run.frame_s, 1000),
        "over_budget": run.over_budget,
        "intents": {
            "sent": s.requests_sent,
            "applied": s.applied,
            "applied_per_s": run.applied_per_s,
            "stale": s.dropped_stale,
            "timed_out": s.timed_out,
            "failed": s.failed,
            "queued_too_long": source.expired_in_queue if source is not None else 0,
        },
        "tiers": {"gold": s.gold, "silver": s.silver, "bronze": s.bronze},
        "interactions": interactions,
        "hit_rate": s.hit_rate if interactions else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--threads", type=int, default=1, help="cores for the server's model")
    parser.add_argument("--clients", default="thread,process", help="where the client runs")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    clients: list[SourceKind | None] = [None]
    for name in args.clients.split(","):
        if name not in ("thread", "process"):
            parser.error(f"--clients: {name!r} is neither thread nor process")
        clients.append("thread" if name == "thread" else "process")

    rows = []
    with spawned_server(WORLD, threads=args.threads) as url:
        for npcs in sizes:
            for client in clients:
                rows.append(run_row(npcs, args.seconds, url, client))
    off = {r["npcs"]: r for r in rows if r["traffic"] == "off"}
    print(f"frames paced at 300/s for {args.seconds:g} s; budget {FRAME_BUDGET_S * 1000:.1f} ms")
    header = f"{'npcs':>6} {'client':<8}{'p50':>7}{'p99':>7}{'max':>7}{'over':>6}{'by model':>9}"
    print(header + f"{'x p99':>7}{'applied/s':>10}{'hit':>6}")
    for r in rows:
        base = off[r["npcs"]]
        on = r["traffic"] != "off"
        r["over_by_model"] = max(0, r["over_budget"] - base["over_budget"]) if on else 0
        r["x_p99"] = ratio(r["frame_ms"]["p99"], base["frame_ms"]["p99"])
        ms = r["frame_ms"]
        print(
            f"{r['npcs']:>6} {r['traffic']:<8}{fmt(ms['p50'], '.2f'):>7}"
            f"{fmt(ms['p99'], '.2f'):>7}{fmt(ms['max'], '.2f'):>7}{r['over_budget']:>6}"
            f"{r['over_by_model']:>9}{fmt(r['x_p99'], '.2f'):>7}"
            f"{fmt(r['intents']['applied_per_s'], '.1f'):>10}{fmt(r['hit_rate'], '.2f'):>6}"
        )
    write_results(
        ROOT / "bench" / "results" / "frame.json",
        ROOT,
        benchmark="frame",
        seconds=args.seconds,
        fps=300,
        budget_ms=FRAME_BUDGET_S * 1000,
        server_threads=args.threads,
        nice=10,
        results=rows,
    )


if __name__ == "__main__":
    main()
