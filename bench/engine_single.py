"""Single-request speed of each packaged chat model on the shared engine (llama.cpp backend).

For each model: load time, time to first token (TTFT) for a ~300-token persona prompt with no
cached prefix, and generation speed in tokens/s. Medians over repeated runs; ratios against the
smallest model (SmolLM2-135M) measured in the same run, so the table compares like with like on
a noisy machine. Writes bench/results/engine_single.json.

    .venv/bin/python bench/engine_single.py [--runs 5] [--models a,b]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from _results import write_results
from mythic.config import load_settings
from mythic.dialogue import persona_prompt
from mythic.engine import (
    PACKAGED_MODELS,
    ChatMessage,
    Engine,
    GenerationRequest,
    ModelStore,
    Sampling,
)
from mythic.knowledge import load_world

ROOT = Path(__file__).resolve().parent.parent
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
RESULTS = ROOT / "bench" / "results" / "engine_single.json"
BASELINE = "smollm2-135m-instruct"
TARGET_PROMPT_TOKENS = 300


@dataclass(slots=True)
class Row:
    model: str
    prompt_tokens: int
    runs: int
    load_s_median: float
    ttft_ms_median: float
    ttft_ms_p90: float
    gen_tok_s_median: float
    ttft_vs_baseline: float = 1.0
    tok_s_vs_baseline: float = 1.0


def _persona_messages(count_tokens: Callable[[str], int]) -> list[ChatMessage]:
    world = load_world(WORLD)
    # Marla's persona prompt, cut at a line boundary to about TARGET_PROMPT_TOKENS tokens.
    lines = persona_prompt(world, world.npc("marla")).splitlines()
    system = lines[0]
    for line in lines[1:]:
        if count_tokens(system) >= TARGET_PROMPT_TOKENS:
            break
        system += "\n" + line
    return [
        ChatMessage("system", system),
        ChatMessage("user", "Tell me a long story about this town."),
    ]


def bench_model(name: str, runs: int) -> Row:
    settings = load_settings()
    loads: list[float] = []
    ttfts: list[float] = []
    rates: list[float] = []
    prompt_tokens = 0
    for run in range(runs):
        t0 = time.perf_counter()
        engine = Engine.load(settings.engine, name)
        loads.append(time.perf_counter() - t0)
        try:

            def count(text: str, engine: Engine = engine) -> int:
                return len(engine.backend.tokenize(text, add_special=False, parse_special=True))

            messages = _persona_messages(count)
            for attempt in range(2):  # second pass: warm caches, but a new NPC (no KV reuse)
                request = GenerationRequest(
                    npc_id=f"bench-{run}-{attempt}",
                    messages=messages,
                    sampling=Sampling(max_tokens=96, temperature=0.8, seed=run),
                )
                start = time.perf_counter()
                first = None
                generated = 0
                last = None
                for delta in engine.submit_sync(request):
                    if first is None and delta.tokens:
                        first = time.perf_counter()
                    generated += delta.tokens
                    last = delta
                end = time.perf_counter()
                assert first is not None and last is not None
                prompt_tokens = last.prompt_tokens
                ttfts.append(first - start)
                if generated > 1 and end > first:
                    rates.append((generated - 1) / (end - first))
        finally:
            engine.close()
    return Row(
        model=name,
        prompt_tokens=prompt_tokens,
        runs=runs,
        load_s_median=statistics.median(loads),
        ttft_ms_median=1000 * statistics.median(ttfts),
        ttft_ms_p90=1000 * sorted(ttfts)[int(0.9 * (len(ttfts) - 1))],
        gen_tok_s_median=statistics.median(rates),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--models", help="comma-separated names (default: every fetched chat model)"
    )
    args = parser.parse_args()

    store = ModelStore(load_settings().engine.models_dir)
    chat_models = [m.name for m in PACKAGED_MODELS if m.chat_format and store.status(m).present]
    names = args.models.split(",") if args.models else chat_models
    if BASELINE not in names:
        names.insert(0, BASELINE)
    rows = [bench_model(name, args.runs) for name in names]
    base = next(r for r in rows if r.model == BASELINE)
    for row in rows:
        row.ttft_vs_baseline = row.ttft_ms_median / base.ttft_ms_median
        row.tok_s_vs_baseline = row.gen_tok_s_median / base.gen_tok_s_median

    header = (
        f"{'model':32} {'prompt':>6} {'load s':>7} {'TTFT ms':>8} {'p90':>7} "
        f"{'tok/s':>7} {'TTFT x':>7} {'tok/s x':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.model:32} {r.prompt_tokens:>6} {r.load_s_median:>7.2f} "
            f"{r.ttft_ms_median:>8.0f} {r.ttft_ms_p90:>7.0f} {r.gen_tok_s_median:>7.1f} "
            f"{r.ttft_vs_baseline:>7.2f} {r.tok_s_vs_baseline:>7.2f}"
        )
    print(f"(medians of {args.runs} loads x 2 prompts; ratios against {BASELINE} in this run)")

    write_results(
        RESULTS,
        ROOT,
        results=[asdict(r) for r in rows],
        benchmark="engine_single",
        baseline=BASELINE,
    )


if __name__ == "__main__":
    main()
