"""Many NPCs on one model: the shared engine against llama-cpp-python serving one at a time.

For each model (default: the packaged Qwen 0.5B and SmolLM2-135M):
1. Aggregate generated tokens/s with N = 1, 4, 8, 16, 32 concurrent NPC conversations on the
   engine (each NPC answering its second turn), against the naive baseline measured in the
   same run: llama-cpp-python's `create_chat_completion` answering the same turns one request
   at a time. Both sides evaluate each NPC's first turn before the timed region (`WARM_UP`).
2. Time to first token (p50/p95) of a gold intent (JSON schema, strict priority) arriving
   while N silver conversations stream, against the same request on an idle engine.
3. Time to first token of a follow-up turn when the session's KV is reused, against the same
   turn evaluated from scratch.
4. Adapter switch cost: one `set_adapters` call, and a step whose sequences use two adapter sets
   (two decode calls) against the same sequences under one set.
5. What batch invariance costs: aggregate tokens/s at N = 8 with it on (the default) and off.

Every ratio is against a baseline measured in the same run (the machine is noisy); medians and
p95s over repeated trials. Writes bench/results/engine_concurrency.json.

    .venv/bin/python bench/engine_concurrency.py [--models a,b] [--trials 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _results import write_results  # noqa: E402
from mythic.config import EngineSettings, load_settings  # noqa: E402
from mythic.dialogue import persona_prompt  # noqa: E402
from mythic.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    GenerationRequest,
    LlamaCppBackend,
    ModelStore,
    Priority,
    Sampling,
    SequenceChunk,
)
from mythic.knowledge import load_world  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "engine_concurrency.json"
WORLD = ROOT / "examples" / "worlds" / "ravenmoor"
MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
QUESTIONS = [
    "What news from the road?",
    "What do you sell here?",
    "Who rules this city?",
    "Is the marsh safe at night?",
    "What happened at the old mill?",
    "Where can a stranger sleep?",
    "Why is the fog so thick tonight?",
    "What is buried in the catacombs?",
]
INTENT_SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"enum": ["attack", "flee", "talk", "wait"]},
        "target": {"enum": ["player", "guard", "nobody"]},
    },
    "required": ["action", "target"],
}
MAX_TOKENS = 64


WARM_UP = (
    "each NPC's first turn is evaluated before the timed region on both sides (the engine's "
    "session KV, the baseline's last-prompt KV); only the second turns are timed"
)
REPLY = "Aye, stranger. Sit down, the fog is thick tonight and the ale is cheap."
FOLLOW_UP = "And what should a stranger avoid in this town?"


def conversations(n: int) -> list[list[ChatMessage]]:
    """First turns of N conversations, one per NPC of the example world (repeating past 8)."""
    world = load_world(WORLD)
    npcs = sorted(world.npcs)
    return [
        [
            ChatMessage("system", persona_prompt(world, world.npc(npcs[i % len(npcs)]))),
            ChatMessage("user", QUESTIONS[(i // len(npcs) + i) % len(QUESTIONS)]),
        ]
        for i in range(n)
    ]


def second_turns(n: int) -> list[list[ChatMessage]]:
    """The same conversations one exchange later: the measured turn."""
    return [
        [*first, ChatMessage("assistant", REPLY), ChatMessage("user", FOLLOW_UP)]
        for first in conversations(n)
    ]


def baseline_tok_s(path: Path, n_ctx: int, requests: int) -> dict[str, float]:
    """llama-cpp-python's high-level API, one request at a time: tokens/s over all of them.

    As on the engine (`engine_tok_s`), each NPC's first turn is evaluated first, not timed:
    the `Llama` keeps the KV of its last prompt, so the second turn right after it reads only
    what is new. It holds one conversation's KV at a time: the next NPC's turn starts over.
    """
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_threads=os.cpu_count(), verbose=False, seed=1
    )
    tokens = 0
    wall = 0.0
    turns = zip(conversations(requests), second_turns(requests), strict=True)
    for i, (first, second) in enumerate(turns):
        llm.create_chat_completion(messages=_wire(first), max_tokens=1)  # the warm-up
        start = time.perf_counter()
        out: Any = llm.create_chat_completion(
            messages=_wire(second), max_tokens=MAX_TOKENS, temperature=0.7, seed=i
        )
        wall += time.perf_counter() - start
        tokens += out["usage"]["completion_tokens"]
    llm.close()
    return {"requests": requests, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}


def _wire(messages: list[ChatMessage]) -> list[Any]:
    return [{"role": m.role, "content": m.content} for m in messages]


async def engine_tok_s(engine: Engine, n: int, tag: str) -> dict[str, float]:
    """N NPCs' second turns at once; their first turns were evaluated before (not timed), as
    the baseline's are (`baseline_tok_s`)."""
    firsts = [
        GenerationRequest(
            npc_id=f"{tag}-{n}-{i}", messages=messages, sampling=Sampling(max_tokens=1)
        )
        for i, messages in enumerate(conversations(n))
    ]
    await asyncio.gather(*(engine.submit(r).collect() for r in firsts))
    requests = [
        GenerationRequest(
            npc_id=f"{tag}-{n}-{i}",
            messages=messages,
            sampling=Sampling(max_tokens=MAX_TOKENS, temperature=0.7, seed=i),
        )
        for i, messages in enumerate(second_turns(n))
    ]
    start = time.perf_counter()
    streams = [engine.submit(r) for r in requests]
    done = await asyncio.gather(*(s.collect() for s in streams))
    wall = time.perf_counter() - start
    tokens = sum(c.tokens for c in done)
    cached = sum(c.cached_tokens for c in done) / max(1, sum(c.prompt_tokens for c in done))
    return {"n": n, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "cached": cached}


def gold_request(i: int) -> GenerationRequest:
    return GenerationRequest(
        npc_id=f"guard-{i}-{time.monotonic_ns()}",
        prompt="The guard sees the player draw a blade at the gate. Intent as JSON: ",
        priority=Priority.GOLD,
        json_schema=INTENT_SCHEMA,
        sampling=Sampling(max_tokens=24, temperature=0.0),
    )


async def gold_ttft(engine: Engine, trials: int, load: int) -> tuple[list[float], int]:
    """Gold time to first token, with `load` silver conversations streaming meanwhile; and
    how many running steps the gold requests preempted."""
    silver = []
    if load:
        requests = [
            GenerationRequest(
                npc_id=f"talker-{i}-{time.monotonic_ns()}",
                messages=messages,
                sampling=Sampling(max_tokens=1200, temperature=0.7, seed=i),
                priority=Priority.SILVER,
            )
            for i, messages in enumerate(conversations(load))
        ]
        silver = [engine.submit(r) for r in requests]
        for stream in silver:
            await anext(stream)  # every silver conversation is streaming
    ttfts = []
    preempted = engine.metrics().preemptions
    for i in range(trials):
        stream = engine.submit(gold_request(i))
        first = await anext(stream)
        assert first.timing.first_token_s is not None
        ttfts.append(first.timing.first_token_s)
        await stream.collect()
    preempted = engine.metrics().preemptions - preempted
    for stream in silver:
        stream.cancel()
    for stream in silver:
        async for _ in stream:
            pass
    return ttfts, preempted


async def follow_up_ttft(engine: Engine, trials: int, reuse: bool) -> list[float]:
    ttfts = []
    for i, messages in enumerate(conversations(trials)):
        sampling = Sampling(max_tokens=24, temperature=0.0)
        first = await engine.submit(
            GenerationRequest(
                npc_id=f"f{i}", session_id="turn", messages=messages, sampling=sampling
            )
        ).collect()
        follow = [*messages, ChatMessage("assistant", first.text), ChatMessage("user", "Why?")]
        session = "turn" if reuse else f"fresh-{i}"
        second = engine.submit(
            GenerationRequest(
                npc_id=f"f{i}", session_id=session, messages=follow, sampling=sampling
            )
        )
        delta = await anext(second)
        assert delta.timing.first_token_s is not None
        ttfts.append(delta.timing.first_token_s)
        await second.collect()
    return ttfts


def adapter_costs(backend: LlamaCppBackend, trials: int) -> dict[str, float]:
    """Switching adapter sets, and a step split in two decode calls by adapter set."""
    keys = [(("vampire", 1.0),), (("werewolf", 1.0),), ()]
    switches = []
    for i in range(trials * 3):
        start = time.perf_counter()
        backend.set_adapters(keys[i % 3])
        switches.append(time.perf_counter() - start)
    prompt = backend.tokenize(
        "The night falls over Ravenmoor and", add_special=True, parse_special=False
    )
    seqs = 8
    backend.clear()
    backend.set_adapters(())
    for s in range(seqs):
        backend.decode([SequenceChunk(s, prompt, 0, False)])
    one, two = [], []
    for t in range(trials):
        pos = len(prompt) + 2 * t
        backend.set_adapters(keys[0])
        start = time.perf_counter()
        backend.decode([SequenceChunk(s, [prompt[-1]], pos, True) for s in range(seqs)])
        one.append(time.perf_counter() - start)
        start = time.perf_counter()
        backend.set_adapters(keys[0])
        backend.decode([SequenceChunk(s, [prompt[-1]], pos + 1, True) for s in range(seqs // 2)])
        backend.set_adapters(keys[1])
        backend.decode(
            [SequenceChunk(s, [prompt[-1]], pos + 1, True) for s in range(seqs // 2, seqs)]
        )
        two.append(time.perf_counter() - start)
    backend.clear()
    backend.set_adapters(())
    return {
        "switch_ms_median": 1000 * statistics.median(switches),
        "step_one_set_ms_median": 1000 * statistics.median(one),
        "step_two_sets_ms_median": 1000 * statistics.median(two),
        "two_sets_vs_one": statistics.median(two) / statistics.median(one),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def bench_model(name: str, trials: int, ns: list[int], quick: bool) -> dict[str, Any]:
    settings = load_settings().engine
    path = ModelStore(settings.models_dir).resolve(name).path
    print(f"\n== {name}")
    base = baseline_tok_s(path, settings.n_ctx, requests=4 if quick else 8)
    print(f"baseline (create_chat_completion, one at a time): {base['tok_s']:.1f} tok/s")
    print(f"both sides: {WARM_UP}")

    loras = Path(tempfile.mkdtemp(prefix="mythic-bench-"))
    from tests.loras import write_lora

    adapters = {
        "vampire": write_lora(path, loras / "vampire.gguf", seed=1),
        "werewolf": write_lora(path, loras / "werewolf.gguf", seed=2),
    }
    engine_settings = EngineSettings(
        **(settings.model_dump() | {"adapters": adapters, "max_sequences": 48})
    )
    out: dict[str, Any] = {"model": name, "baseline": base}
    async with Engine.load(engine_settings, name) as engine:
        await engine_tok_s(engine, 2, "warmup")
        rows = []
        for n in ns:
            row = await engine_tok_s(engine, n, "tp")
            row["vs_baseline"] = row["tok_s"] / base["tok_s"]
            rows.append(row)
            print(
                f"N={n:>2}: {row['tok_s']:6.1f} tok/s  x{row['vs_baseline']:.2f} baseline  "
                f"({100 * row['cached']:.0f}% of prompt tokens from cache)"
            )
        out["throughput"] = rows
        out["batch_sizes"] = engine.metrics().batch_sizes

        idle, _ = await gold_ttft(engine, trials, load=0)
        loaded, preemptions = {}, {}
        for load in [8] if quick else [8, 16]:
            loaded[load], preemptions[load] = await gold_ttft(engine, trials, load=load)
        out["gold_ttft"] = {
            "idle_p50_ms": 1000 * pct(idle, 0.5),
            "idle_p95_ms": 1000 * pct(idle, 0.95),
            "under_load": {
                str(load): {
                    "p50_ms": 1000 * pct(v, 0.5),
                    "p95_ms": 1000 * pct(v, 0.95),
                    "p95_vs_idle_p95": pct(v, 0.95) / pct(idle, 0.95),
                    "preempted_steps": preemptions[load],
                }
                for load, v in loaded.items()
            },
        }
        reuse = await follow_up_ttft(engine, trials, reuse=True)
        assert isinstance(engine.backend, LlamaCppBackend)
        out["adapters"] = adapter_costs(engine.backend, trials)
    no_reuse_settings = EngineSettings(**(settings.model_dump() | {"prefix_min_tokens": 10**6}))
    async with Engine.load(no_reuse_settings, name) as engine:
        fresh = await follow_up_ttft(engine, trials, reuse=False)
    out["follow_up_ttft"] = {
        "reuse_p50_ms": 1000 * statistics.median(reuse),
        "fresh_p50_ms": 1000 * statistics.median(fresh),
        "fresh_vs_reuse": statistics.median(fresh) / statistics.median(reuse),
    }
    fast_settings = EngineSettings(
        **(settings.model_dump() | {"batch_invariant": False, "max_sequences": 48})
    )
    async with Engine.load(fast_settings, name) as engine:
        await engine_tok_s(engine, 2, "warmup")
        fast = await engine_tok_s(engine, 8, "fast")
    invariant = next(r for r in out["throughput"] if r["n"] == 8) if 8 in ns else None
    out["batch_invariance"] = {
        "off_tok_s_n8": fast["tok_s"],
        "on_tok_s_n8": invariant["tok_s"] if invariant else None,
        "on_vs_off": invariant["tok_s"] / fast["tok_s"] if invariant else None,
    }
    return out


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"\nthroughput: {WARM_UP}")
    header = f"{'model':30} {'N':>3} {'tok/s':>7} {'x base':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['model']:30} {'base':>3} {r['baseline']['tok_s']:>7.1f} {1.0:>7.2f}")
        for row in r["throughput"]:
            print(f"{'':30} {row['n']:>3} {row['tok_s']:>7.1f} {row['vs_baseline']:>7.2f}")
    print()
    print(
        f"{'model':30} {'gold TTFT ms':>14} {'p50':>7} {'p95':>7} {'p95/idle':>9} {'preempted':>9}"
    )
    for r in results:
        g = r["gold_ttft"]
        print(f"{r['model']:30} {'idle':>14} {g['idle_p50_ms']:>7.0f} {g['idle_p95_ms']:>7.0f}")
        for load, v in g["under_load"].items():
            label = f"{load} silver"
            print(
                f"{'':30} {label:>14} {v['p50_ms']:>7.0f} {v['p95_ms']:>7.0f} "
                f"{v['p95_vs_idle_p95']:>9.2f} {v['preempted_steps']:>9}"
            )
    print()
    print(f"{'model':30} {'follow-up TTFT reuse/fresh ms':>30} {'x':>6}")
    for r in results:
        f = r["follow_up_ttft"]
        pair = f"{f['reuse_p50_ms']:.0f} / {f['fresh_p50_ms']:.0f}"
        print(f"{r['model']:30} {pair:>30} {f['fresh_vs_reuse']:>6.2f}")
    print()
    print(f"{'model':30} {'switch ms':>10} {'1 set ms':>9} {'2 sets ms':>10} {'x':>6}")
    for r in results:
        a = r["adapters"]
        print(
            f"{r['model']:30} {a['switch_ms_median']:>10.3f} {a['step_one_set_ms_median']:>9.1f} "
            f"{a['step_two_sets_ms_median']:>10.1f} {a['two_sets_vs_one']:>6.2f}"
        )
    print()
    for r in results:
        b = r["batch_invariance"]
        if b["on_vs_off"] is not None:
            print(
                f"{r['model']:30} batch-invariant N=8: {b['on_tok_s_n8']:.1f} tok/s, "
                f"fastest kernels: {b['off_tok_s_n8']:.1f} tok/s (x{b['on_vs_off']:.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="N = 1, 8 only; fewer trials")
    args = parser.parse_args()
    ns = [1, 8] if args.quick else [1, 4, 8, 16, 32]
    trials = 3 if args.quick else args.trials
    results = [
        asyncio.run(bench_model(name, trials, ns, args.quick)) for name in args.models.split(",")
    ]
    print_table(results)
    write_results(
        RESULTS,
        ROOT,
        results=results,
        benchmark="engine_concurrency",
        baseline="llama-cpp-python create_chat_completion, one request at a time",
        warm_up=WARM_UP,
        max_tokens=MAX_TOKENS,
    )


if __name__ == "__main__":
    main()
