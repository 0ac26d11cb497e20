"""What the per-line decision costs, and what two engine settings save of it.

Every spoken or typed line ends with a decision (the player's intent and at most one game
tool): a greedy gold request under a JSON schema, on the dialogue model, in the engine's one
worker thread. Three configurations, in one run:

- `before`: llama.cpp's grammar sampler matches every token of the vocabulary against the
  grammar at every step (`engine.grammar_check_first: false`), and a step that advances the
  decision also evaluates other NPCs' prompts in full chunks (`engine.prefill_beside_gold`
  as large as a step).
- `grammar`: the grammar is asked about the greedy pick first, then about the next most likely
  tokens, and matches the whole vocabulary only when none of them may come next (the same
  tokens: tests/integration/test_engine.py).
- `steps`: that, and a step that advances a gold request evaluates at most
  `prefill_beside_gold` (16) tokens of other prompts, so each of the decision's tokens does not
  wait for them. The defaults.

The decisions are the actor's own (`NPCActor._decide`: its prompt, its schema, through the
router) on the default models (Qwen2.5 0.5B for dialogue and decisions, 152k tokens), for the
voice bench's 20 questions. Two measures per mode, the modes alternating round by round so
that both see the same machine:

- alone: the 20 decisions one after another; ms per decision.
- beside replies: four NPCs answer a question each (silver, greedy, 48 tokens) while all 20
  decisions run, four at a time: the decisions' time, and the replies' time to their first
  token (their prompts), between tokens (a step waits for the decisions' sampling in the same
  thread) and to their last token. The decisions run back to back here, so a gold request is
  in almost every step: the worst case for the replies' prompts under `steps`.

Ratio: against `before` (p50), in the same run. Writes bench/results/decision.json.

`--beside-gold 16,48` runs a `steps` configuration for each value (`steps-16`, `steps-48`).

    .venv/bin/python bench/decision.py [--rounds 3] [--threads N] [--beside-gold 16,48]
                                       [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.config import EngineSettings, load_settings  # noqa: E402
from mythic.dialogue import Cast, persona_prompt  # noqa: E402
from mythic.dialogue._events import PlayerLine  # noqa: E402
from mythic.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    GenerationRequest,
    LlamaCppBackend,
    Sampling,
)
from mythic.knowledge import load_world  # noqa: E402
from mythic.route import open_router  # noqa: E402
from voice import NPCS, QUESTIONS  # noqa: E402  (the voice bench's NPCs and 20 questions)

WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
MODES: dict[str, tuple[bool, int | None]] = {"before": (False, None), "grammar": (True, None)}
"""Configuration: engine.grammar_check_first, engine.prefill_beside_gold (None: a whole step);
`main` adds a `steps` configuration for each `--beside-gold` value."""
REPLY_TOKENS = 48


def _line(session: str, i: int, text: str) -> PlayerLine:
    return PlayerLine(session, f"t{i}", text, received_at=time.perf_counter())


async def decide_alone(cast: Cast, tag: str) -> list[float]:
    times = []
    for i, question in enumerate(QUESTIONS):
        actor = cast.actor(NPCS[i % len(NPCS)])
        start = time.perf_counter()
        decision = await actor.decider.decide(_line(f"{tag}-alone-{i}", i, question))
        times.append(time.perf_counter() - start)
        if decision is None:
            raise SystemExit(f"the decision for {question!r} failed: see the log")
    return times


async def reply(engine: Engine, world: Any, npc: str, question: str, tag: str) -> list[float]:
    """One silver reply: its start, then the time each token came (a delta's tokens share its
    interval evenly)."""
    request = GenerationRequest(
        npc_id=npc,
        session_id=f"{tag}-{npc}",
        messages=[
            ChatMessage("system", persona_prompt(world, world.npc(npc))),
            ChatMessage("user", question),
        ],
        sampling=Sampling(max_tokens=REPLY_TOKENS, temperature=0.0),
    )
    stamps = [time.perf_counter()]
    async for delta in engine.submit(request):
        now = time.perf_counter()
        if delta.tokens and len(stamps) > 1:
            step = (now - stamps[-1]) / delta.tokens
            stamps += [stamps[-1] + step * (k + 1) for k in range(delta.tokens)]
        elif delta.tokens:
            stamps += [now] * delta.tokens
    return stamps


async def beside_replies(cast: Cast, engine: Engine, world: Any, tag: str) -> dict[str, Any]:
    async def decisions(npc: str, start: int) -> list[float]:
        times = []
        for i in range(start, len(QUESTIONS), len(NPCS)):
            began = time.perf_counter()
            await cast.actor(npc).decider.decide(_line(f"{tag}-beside-{npc}", i, QUESTIONS[i]))
            times.append(time.perf_counter() - began)
        return times

    replies = [reply(engine, world, npc, QUESTIONS[i], tag) for i, npc in enumerate(NPCS)]
    decided = [decisions(npc, i) for i, npc in enumerate(NPCS)]
    done = await asyncio.gather(*replies, *decided)
    stamps, times = done[: len(NPCS)], done[len(NPCS) :]
    gaps = [b - a for s in stamps for a, b in itertools.pairwise(s[1:])]
    return {
        "reply_gap_ms": latency(gaps, 1000),
        "reply_first_ms": latency([s[1] - s[0] for s in stamps], 1000),
        "reply_total_ms": latency([s[-1] - s[0] for s in stamps], 1000),
        "decision_ms": latency([t for ts in times for t in ts], 1000),
    }


async def run(rounds: int) -> list[dict[str, Any]]:
    settings = load_settings()
    # What is measured is the model's decision (`dialogue.decider: model`); the default line
    # classifier uses no engine.
    model_decides = settings.dialogue.model_copy(update={"decider": "model"})
    settings = settings.model_copy(update={"dialogue": model_decides})
    world = load_world(WORLD)
    router, engines = open_router(settings)
    dialogue = next(e for e in engines if e.backend.name == settings.engine.dialogue_model)
    cast = Cast(world, router, settings, lambda session, message: None)
    out: list[dict[str, Any]] = []
    try:
        # Warm up both paths (first decisions build the actors and the prompts' caches).
        def configure(check: bool, beside_gold: int | None) -> None:
            for engine in engines:
                if isinstance(engine.backend, LlamaCppBackend):
                    engine.backend.grammar_check_first = check
                step = engine.config.scheduler
                step.prefill_beside_gold = (
                    step.max_batch_tokens if beside_gold is None else beside_gold
                )

        for mode, config in MODES.items():  # warm-up: actors, prompts' caches, both samplers
            configure(*config)
            await decide_alone(cast, f"warm-{mode}")
        for r in range(rounds):
            for mode, config in MODES.items():
                configure(*config)
                tag = f"{mode}-{r}"
                before = dict(dialogue.backend.grammar_picks)  # type: ignore[attr-defined]
                alone = await decide_alone(cast, tag)
                beside = await beside_replies(cast, dialogue, world, tag)
                picks = {
                    k: v - before[k]
                    for k, v in dialogue.backend.grammar_picks.items()  # type: ignore[attr-defined]
                }
                out.append(
                    {"mode": mode, "round": r, "alone_ms": latency(alone, 1000), **beside}
                    | {"grammar_picks": picks}
                )
                print(
                    f"round {r} {mode:<8} decision alone p50 "
                    f"{fmt(out[-1]['alone_ms']['p50'], '.0f')} ms, reply gap p50 "
                    f"{fmt(out[-1]['reply_gap_ms']['p50'], '.1f')} ms",
                    flush=True,
                )
    finally:
        await cast.aclose()
        await router.aclose()
        for engine in engines:
            engine.close()
    return out


def _median(rows: list[dict[str, Any]], key: str, stat: str) -> float | None:
    values = [r[key][stat] for r in rows if r[key][stat] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="model threads (all cores)")
    parser.add_argument(
        "--beside-gold",
        default=None,
        help="engine.prefill_beside_gold of the `steps` configurations, e.g. 16,48 (default: "
        "the setting's)",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "decision.json", help="results"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        besides = [int(n) for n in args.beside_gold.split(",")] if args.beside_gold else []
    except ValueError:
        parser.error("--beside-gold takes whole numbers, e.g. 16,48")
    if any(n < 0 for n in besides):
        parser.error("--beside-gold values must be at least 0")
    if not besides:
        besides = [EngineSettings.model_fields["prefill_beside_gold"].default]
    for n in besides:
        MODES["steps" if len(besides) == 1 else f"steps-{n}"] = (True, n)
    if args.threads:
        os.environ["MYTHIC_ENGINE__N_THREADS"] = str(args.threads)
    rows = asyncio.run(run(args.rounds))
    summary = {}
    print(f"\nmedian over {args.rounds} rounds of each round's p50 / p95, ms")
    print(f"{'measure':<26}{'config':<10}{'p50':>9}{'p95':>9}{'x p50':>7}")
    for key, name in (
        ("alone_ms", "decision alone"),
        ("decision_ms", "decision beside replies"),
        ("reply_first_ms", "reply first token"),
        ("reply_gap_ms", "reply token gap"),
        ("reply_total_ms", "reply (48 tokens)"),
    ):
        cells = {
            mode: {
                s: _median([r for r in rows if r["mode"] == mode], key, s) for s in ("p50", "p95")
            }
            for mode in MODES
        }
        summary[key] = cells
        for mode, cell in cells.items():
            x = ratio(cell["p50"], cells["before"]["p50"])
            cell["x_p50"] = x
            print(
                f"{name:<26}{mode:<10}{fmt(cell['p50'], '.1f'):>9}{fmt(cell['p95'], '.1f'):>9}"
                f"{fmt(x, '.2f'):>7}"
            )
    settings = load_settings()
    write_results(
        args.out.resolve(),
        ROOT,
        benchmark="decision",
        dialogue_model=settings.engine.dialogue_model,
        model_threads=settings.engine.n_threads or os.cpu_count(),
        rounds=args.rounds,
        summary=summary,
        results=rows,
    )


if __name__ == "__main__":
    main()
