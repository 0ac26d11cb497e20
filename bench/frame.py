"""Frame time of the game-side controller, with the model's intent traffic off and on.

The `mythic sim` region (a town, its monsters, a zombie horde, a player walking a loop) at
1,000 and 10,000 NPCs, frames paced at 300 per second in real time; only `Controller.frame`
is timed. Rows, in one run, for each size: `traffic off` (no intent requests: the baseline)
and `traffic on` (the NPCs near the player ask a real Mythic server for intents over the
client SDK; the server runs in its own process with `--threads` cores, as beside a game).

Columns: frame p50/p99/max (ms); over: frames over the 3.3 ms budget; by model: over-budget
frames attributable to the traffic (on minus off, at the same size; the target is 0); x p99:
against traffic off; applied/s: intents applied per second; hit: the share of the player's
interactions whose NPC was predicted (and prefetched) in advance.

Writes bench/results/frame.json.

    .venv/bin/python bench/frame.py [--seconds 20] [--sizes 1000,10000] [--threads 1]
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
    build_region,
    cpu_model_settings,
    run_paced,
    server_fetch,
    spawned_server,
    speakers,
)
from mythic.client import MythicClient  # noqa: E402
from mythic.control import AsyncIntentSource, Controller  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"


def run_row(npcs: int, seconds: float, url: str | None) -> dict[str, Any]:
    settings = cpu_model_settings(0)  # as `mythic sim`
    controller = Controller(settings=settings, capacity=npcs)
    path = build_region(controller, RegionSpec(npcs=npcs, horde=npcs * 3 // 10, seed=0))
    with contextlib.ExitStack() as stack:
        if url is not None:
            client = MythicClient(url, timeout_s=10.0)
            fetch = server_fetch(client, speakers(WORLD), settings.player_id)
            source = AsyncIntentSource(fetch, max_concurrency=16)
            source.start(controller)
            stack.callback(source.close)
            source.run(client.connect()).result(60)
            stack.callback(lambda: source.run(client.aclose()).result(10))
            controller.source = source
        run = run_paced(controller, path, seconds=seconds)
    s = run.stats
    interactions = s.prediction_hits + s.prediction_misses
    return {
        "npcs": npcs,
        "traffic": url is not None,
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
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]

    rows = []
    with spawned_server(WORLD, threads=args.threads) as url:
        for npcs in sizes:
            for traffic in (False, True):
                rows.append(run_row(npcs, args.seconds, url if traffic else None))
    off = {r["npcs"]: r for r in rows if not r["traffic"]}
    print(f"frames paced at 300/s for {args.seconds:g} s; budget {FRAME_BUDGET_S * 1000:.1f} ms")
    header = f"{'npcs':>6} {'traffic':<8}{'p50':>7}{'p99':>7}{'max':>7}{'over':>6}{'by model':>9}"
    print(header + f"{'x p99':>7}{'applied/s':>10}{'hit':>6}")
    for r in rows:
        base = off[r["npcs"]]
        r["over_by_model"] = max(0, r["over_budget"] - base["over_budget"]) if r["traffic"] else 0
        r["x_p99"] = ratio(r["frame_ms"]["p99"], base["frame_ms"]["p99"])
        ms = r["frame_ms"]
        print(
            f"{r['npcs']:>6} {'on' if r['traffic'] else 'off':<8}{fmt(ms['p50'], '.2f'):>7}"
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
        results=rows,
    )


if __name__ == "__main__":
    main()
