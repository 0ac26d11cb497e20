"""Tiers: gold intent latency while silver dialogues and bronze jobs run, against gold alone.

The embedded defaults, as `mythic serve` loads them (`open_router`): gold on
`engine.intent_model` (SmolLM2-135M), silver on `engine.dialogue_model` (Qwen2.5 0.5B), bronze
on `engine.bronze_model` (`auto`: the largest fetched chat model; with only the default models
fetched, the silver engine, shared). Every request goes through the router, as the NPC actors'
do.

- gold: `--gold` intent requests (the actor's intent prompt and JSON schema: intent, target,
  urgency; greedy, at most 48 tokens; replies that do not parse are counted), one after
  another with `--gap-ms` between them, like a controller asking at a few Hz. Per request:
  the latency (submit to last token) and the per-token latency (latency / generated tokens).
- rows, in one run: `gold alone` (the baseline); `gold + silver + bronze`: the same gold
  requests while `--speakers` silver dialogue streams talk without pause (64 tokens a reply)
  and a bronze worker runs lore jobs from an embedded SQLite queue without pause.
- x: against gold alone. Also: silver tokens/s and bronze jobs done during the loaded row.

The design's target is 16 ms per gold token; on this 2-core CPU machine three models share
two cores, so the loaded row shows how much of it gold keeps by priority and preemption.

Writes bench/results/tiers.json.

    .venv/bin/python bench/tiers.py [--gold 40] [--speakers 4] [--gap-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.config import load_settings  # noqa: E402
from mythic.engine import ChatMessage, GenerationRequest, Priority, Sampling  # noqa: E402
from mythic.jobs import JobQueue, JobWorker  # noqa: E402
from mythic.knowledge import load_world  # noqa: E402
from mythic.route import Router, open_router  # noqa: E402

INTENT_SCHEMA = {
    "type": "object",
    "properties": {
        "intent": {"enum": ["chitchat", "trade", "quest", "hint", "combat", "navigation"]},
        "target": {"anyOf": [{"type": "null"}, {"enum": ["player", "guard_3", "cat"]}]},
        "urgency": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["intent", "target", "urgency"],
    "additionalProperties": False,
}
LINES = [
    "The player drew a sword.",
    "The player waved from across the square.",
    "The player asked about the price of ale.",
    "A guard shouted at the player.",
    "The player dropped a coin.",
]


def intent_request(i: int) -> GenerationRequest:
    return GenerationRequest(
        npc_id=f"npc{i % 8}",
        session_id="intent",
        messages=[
            ChatMessage(
                "system",
                "You decide what Grisk (a ghoul) wants to do next in a video game. "
                "Scene now: zone old_town; nearby: player (2 away), guard_3 (9 away). "
                f"What just happened: {LINES[i % len(LINES)]} Answer with JSON.",
            ),
            ChatMessage("user", "Decide."),
        ],
        priority=Priority.GOLD,
        json_schema=INTENT_SCHEMA,
        sampling=Sampling(max_tokens=48, temperature=0.0),
    )


async def gold_run(router: Router, n: int, gap_s: float) -> dict[str, list[float]]:
    total: list[float] = []
    per_token: list[float] = []
    bad: list[str] = []
    for i in range(n):
        start = time.perf_counter()
        done = await router.complete(intent_request(i), "intent", canned="{}")
        seconds = time.perf_counter() - start
        try:
            json.loads(done.text)
        except ValueError:
            bad.append(done.text)
        total.append(seconds)
        per_token.append(seconds / max(1, done.tokens))
        await asyncio.sleep(gap_s)
    return {"latency": total, "per_token": per_token, "unparsed": [float(len(bad))]}


async def speaker(router: Router, i: int, counts: dict[str, float]) -> None:
    turn = 0
    while True:
        request = GenerationRequest(
            npc_id=f"speaker{i}",
            session_id=f"s{i}-{turn}",
            messages=[
                ChatMessage("system", "You are Marla, a barkeep in Ravenmoor. Talk a lot."),
                ChatMessage("user", f"Tell me about the town, part {turn}."),
            ],
            priority=Priority.SILVER,
            sampling=Sampling(max_tokens=64, temperature=0.7),
        )
        done = await router.complete(request, "dialogue", canned="...")
        counts["silver_tokens"] += done.tokens
        turn += 1


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gold", type=int, default=40)
    parser.add_argument("--speakers", type=int, default=4)
    parser.add_argument("--gap-ms", type=float, default=100.0)
    args = parser.parse_args()

    settings = load_settings()
    router, engines = open_router(settings)
    tiers = {
        name: [router.states[e].endpoint.engine.backend.name for e in tier.endpoints]  # type: ignore[attr-defined]
        for name, tier in router.route.tiers.items()
    }
    print("tiers:", tiers)
    world = load_world(ROOT / "examples" / "worlds" / "ravenmoor")
    gap = args.gap_ms / 1000
    try:
        await gold_run(router, 3, gap)  # warm-up: each engine's first request
        alone = await gold_run(router, args.gold, gap)

        with tempfile.TemporaryDirectory() as tmp:
            jobs = settings.jobs.model_copy(update={"max_tokens": 96, "poll_s": 0.1})
            queue = JobQueue(jobs, path=Path(tmp) / "jobs.sqlite3")
            for i in range(200):
                await queue.submit("lore", {"topic": f"The old mill, chapter {i}"})
            worker = JobWorker(queue, router, lambda: world, jobs)
            counts = {"silver_tokens": 0.0}
            background = [
                asyncio.create_task(speaker(router, i, counts)) for i in range(args.speakers)
            ]
            background.append(asyncio.create_task(worker.run()))
            await asyncio.sleep(2.0)  # let the load settle
            counts["silver_tokens"] = 0
            done_before = worker.counts["done"]
            start = time.perf_counter()
            loaded = await gold_run(router, args.gold, gap)
            spent = time.perf_counter() - start
            silver_tps = counts["silver_tokens"] / spent
            bronze_jobs = worker.counts["done"] - done_before
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await queue.aclose()
    finally:
        await router.aclose()
        for engine in engines:
            engine.close()

    rows: dict[str, Any] = {}
    for name, run in (("gold alone", alone), ("gold + silver + bronze", loaded)):
        rows[name] = {
            "latency_ms": latency(run["latency"], 1000),
            "per_token_ms": latency(run["per_token"], 1000),
            "unparsed": int(run["unparsed"][0]),
        }
    base = rows["gold alone"]
    print(
        f"\n{'row':<24} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'x p50':>6} {'x p95':>6} "
        f"{'tok p50':>8} {'tok p95':>8} {'x tok p50':>9}"
    )
    for name, row in rows.items():
        lat, tok = row["latency_ms"], row["per_token_ms"]
        print(
            f"{name:<24} {lat['n']:>4} {fmt(lat['p50'], '8.1f')} {fmt(lat['p95'], '8.1f')} "
            f"{fmt(ratio(lat['p50'], base['latency_ms']['p50']), '6.2f')} "
            f"{fmt(ratio(lat['p95'], base['latency_ms']['p95']), '6.2f')} "
            f"{fmt(tok['p50'], '8.1f')} {fmt(tok['p95'], '8.1f')} "
            f"{fmt(ratio(tok['p50'], base['per_token_ms']['p50']), '9.2f')}"
        )
    print(
        f"\nduring the loaded row: silver {silver_tps:.1f} tokens/s over {args.speakers} "
        f"speakers, bronze {bronze_jobs} lore jobs done; gold target 16 ms/token"
    )
    write_results(
        ROOT / "bench" / "results" / "tiers.json",
        ROOT,
        benchmark="tiers",
        tiers=tiers,
        args=vars(args),
        results={
            **rows,
            "silver_tokens_per_s": silver_tps,
            "bronze_jobs_done": bronze_jobs,
            "gold_target_ms_per_token": 16,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
