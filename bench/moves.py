"""Each player line's intent and tool: the line classifier against the model's decision.

Both deciders judge the same lines in one run, through the actor's own `_decide` (the cast's
settings differ only in `dialogue.decider`), on Marla of the example world (every tool):

- `classifier` (the default): all-MiniLM-L6-v2's nearest labelled examples
  (`mythic.dialogue._moves`), the tool's place from the line;
- `model`: the earlier decision, a greedy gold request under the decision's JSON schema on the
  dialogue model (Qwen2.5 0.5B), the reply's engine.

The lines are `UNSEEN` of `tests/integration/test_moves.py` (43 lines written apart from the
classifier's examples: small talk, questions, prices, purchases, the way, work, threats, the
game). Reported per decider: intents as expected, acting lines acted on (a tool called where
the line asks for one) and calm lines acted on (a tool nobody asked for), and the time of one
decision alone (p50/p95 over `--rounds` rounds of all lines; x = against the model). Places
the lines name are not Ravenmoor's, so a way-asking line counts as acted on when the
classifier reads the way (it then calls no tool: no such place) or the model calls any tool.

Writes bench/results/moves.json.

    .venv/bin/python bench/moves.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.integration.test_moves import UNSEEN  # noqa: E402

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.config import load_settings  # noqa: E402
from mythic.dialogue import Cast  # noqa: E402
from mythic.dialogue._events import PlayerLine  # noqa: E402
from mythic.dialogue._moves import MOVES  # noqa: E402
from mythic.knowledge import load_world  # noqa: E402
from mythic.route import open_router  # noqa: E402

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
NPC = "marla"
DECIDERS = ("classifier", "model")


async def judge(cast: Cast, tag: str) -> tuple[dict[str, int], list[float]]:
    counts = {"intent": 0, "acted": 0, "acting_lines": 0, "spurious": 0, "calm_lines": 0}
    times: list[float] = []
    actor = cast.actor(NPC)
    for i, (move, line) in enumerate((m, t) for m, lines in UNSEEN.items() for t in lines):
        start = time.perf_counter()
        decision = await actor.decider.decide(
            PlayerLine(f"{tag}-{i}", f"t{i}", line, time.perf_counter())
        )
        times.append(time.perf_counter() - start)
        intent = decision.intent if decision else None
        acts = decision is not None and decision.tool is not None
        if cast.settings.dialogue.decider == "classifier" and decision is not None:
            # A way-asking line to a place this world has not: read as acting, no tool.
            acts = acts or (intent == "navigation" and MOVES[move].acts)
        counts["intent"] += intent == MOVES[move].intent
        if MOVES[move].acts:
            counts["acting_lines"] += 1
            counts["acted"] += acts
        else:
            counts["calm_lines"] += 1
            counts["spurious"] += acts
    return counts, times


async def run(rounds: int) -> list[dict[str, Any]]:
    base = load_settings()
    world = load_world(WORLD)
    router, engines = open_router(base)
    out: list[dict[str, Any]] = []
    casts = {}
    for decider in DECIDERS:
        dialogue = base.dialogue.model_copy(update={"decider": decider})
        settings = base.model_copy(update={"dialogue": dialogue})
        casts[decider] = Cast(world, router, settings, lambda session, message: None)
    try:
        for decider, cast in casts.items():
            await asyncio.to_thread(cast.classifier)
            await judge(cast, f"warm-{decider}")  # the actor, its prompts' caches
        for r in range(rounds):
            for decider, cast in casts.items():
                counts, times = await judge(cast, f"{decider}-{r}")
                out.append({"decider": decider, "round": r, **counts, "ms": latency(times, 1000)})
                print(f"round {r} {decider:<10} {counts} p50 {fmt(out[-1]['ms']['p50'], '.1f')} ms")
    finally:
        for cast in casts.values():
            await cast.aclose()
        await router.aclose()
        for engine in engines:
            engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = asyncio.run(run(args.rounds))
    summary = {}
    for decider in DECIDERS:
        mine = [r for r in rows if r["decider"] == decider]
        last = mine[-1]
        summary[decider] = {
            "intent": f"{last['intent']}/{last['acting_lines'] + last['calm_lines']}",
            "acted": f"{last['acted']}/{last['acting_lines']}",
            "spurious": f"{last['spurious']}/{last['calm_lines']}",
            "p50_ms": statistics.median(r["ms"]["p50"] for r in mine),
            "p95_ms": statistics.median(r["ms"]["p95"] for r in mine),
        }
    model = summary["model"]
    print(
        "\n| decider | intents as expected | acting lines acted on | calm lines acted on "
        "| p50 | p95 | x p50 |"
    )
    print("|---|---|---|---|---|---|---|")
    for decider, s in summary.items():
        print(
            f"| {decider} | {s['intent']} | {s['acted']} | {s['spurious']} "
            f"| {fmt(s['p50_ms'], '.1f')} ms | {fmt(s['p95_ms'], '.1f')} ms "
            f"| {fmt(ratio(s['p50_ms'], model['p50_ms']), '.3f')} |"
        )
    write_results(
        ROOT / "bench" / "results" / "moves.json",
        ROOT,
        results=rows,
        kind="moves",
        npc=NPC,
        lines=sum(len(v) for v in UNSEEN.values()),
        rounds=args.rounds,
        summary=summary,
    )


if __name__ == "__main__":
    main()
