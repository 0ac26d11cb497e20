"""LoRA adapter sets on the embedded engine: what a switch costs, and throughput by adapter mix.

One model (default: the packaged SmolLM2-135M) and five LoRA adapters, all measured in one run
and one process:

1. Memory: resident memory before and after loading the adapters (llama.cpp copies them in).
2. Switch cost: one `set_adapters` call, cycling over the adapter sets and the base model
   (median, p95); and one decode step of `--requests` sequences, each sequence one token,
   with the sequences all on the base model (`none`, the baseline), all on one set, or split
   round-robin over 2 or 5 sets: one decode call per set, with the switches between them, as
   the engine runs a step.
3. Throughput: `--requests` concurrent streaming chat requests (greedy, `--tokens` each), with
   no adapter (the baseline), 1 adapter set, or 2 or 5 sets assigned round-robin. Generated
   tokens/s, requests/s, time to first token p50/p95, and from the engine's counters adapter
   switches/s and decode calls per round. Prefix sharing is off, so every mix evaluates the
   same prompt tokens. The sets take turns of `--quantum` steps (engine.adapter_quantum_steps),
   and, interleaved in the same engine, mixes of several sets also run at quantum 0 (every set
   advances every step, one call and one switch each: the engine before turns).

The adapters are random (seeded) rank `--rank` LoRAs on the projections `mythic train adapter`
trains (`--targets`), or trained ones (`--adapter PATH`, repeatable; random ones fill up to 5).
Decode steps are interleaved over the mixes ("x none": ratio of medians). Every throughput
configuration runs `--repeats` times, the mixes in a rotated order; the table shows medians,
and "x none" is the median of each repeat's ratio against the baseline of the same repeat.
Writes bench/results/adapters.json.

    .venv/bin/python bench/adapters.py [--model smollm2-135m-instruct] [--requests 8]
        [--tokens 32] [--repeats 3] [--threads N] [--adapter PATH ...] [--quantum 8] [--quick]
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
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, pct, ratio, write_results  # noqa: E402
from mythic.config import EngineSettings, load_settings  # noqa: E402
from mythic.engine import (  # noqa: E402
    AdapterKey,
    Backend,
    ChatMessage,
    Engine,
    GenerationRequest,
    ModelStore,
    Sampling,
    SequenceChunk,
    load_backend,
)

RESULTS = ROOT / "bench" / "results" / "adapters.json"
ARCHETYPES = ["vampire", "werewolf", "zombie", "ghoul", "lich"]
MIXES = [0, 1, 2, 5]
"""Adapter sets in the mix; 0 is the base model alone (the baseline)."""
TARGETS = {
    "q": "attn_q",
    "k": "attn_k",
    "v": "attn_v",
    "o": "attn_output",
    "gate": "ffn_gate",
    "up": "ffn_up",
    "down": "ffn_down",
}
"""Short target names -> llama.cpp tensor names; all seven are what `mythic train adapter`
adapts (`mythic.training.TARGETS`)."""
NPCS = [
    ("Mara", "innkeeper of the Drowned Lantern", "Tell me the story of the old mill."),
    ("Aldric", "captain of the town watch", "Describe every gate of the town and its guards."),
    ("Sefa", "herbalist of the marsh", "Which herbs grow in the marsh, and what do they cure?"),
    ("Brother Ewan", "keeper of the old chapel", "Tell me the history of your chapel."),
    ("Tilda", "ferrywoman on the black river", "Describe a night crossing of the river."),
    ("Corvin", "gravedigger", "Tell me about the strangest burial you have seen."),
    ("Wren", "street urchin", "Tell me every rumour you heard this week."),
    ("Lady Morwen", "widow of the manor on the hill", "Describe your manor, room by room."),
]


def write_random_lora(
    base: Path, out: Path, *, seed: int, rank: int, targets: list[str], scale: float = 0.02
) -> Path:
    """A random but valid GGUF LoRA for the base model at `base` on every block's `targets`.

    tests/loras.py writes q and v only; trained adapters adapt all seven projections, and each
    adapted tensor adds work to every decode call, so the targets are a choice here.
    """
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    suffixes = tuple(f".{TARGETS[t]}.weight" for t in targets)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 2.0 * rank)  # TrainSettings: alpha 32, rank 16
    for tensor in reader.tensors:
        if not (tensor.name.startswith("blk.") and tensor.name.endswith(suffixes)):
            continue
        n_in, n_out = (int(x) for x in tensor.shape[:2])  # ggml order: ne0 = inputs
        writer.add_tensor(
            f"{tensor.name}.lora_a", rng.normal(0.0, scale, (rank, n_in)).astype(np.float32)
        )
        writer.add_tensor(
            f"{tensor.name}.lora_b", rng.normal(0.0, scale, (n_out, rank)).astype(np.float32)
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def adapter_files(
    given: list[Path], base: Path, folder: Path, rank: int, targets: list[str]
) -> dict[str, Path]:
    """The `--adapter` files by name (their stems), then random ones up to the largest mix."""
    adapters: dict[str, Path] = {}
    for path in given:
        name = path.stem
        while name in adapters:
            name += "_"
        adapters[name] = path.resolve()
    names = [n for n in ARCHETYPES if n not in adapters]
    for i, name in enumerate(names[: max(0, max(MIXES) - len(adapters))]):
        adapters[name] = write_random_lora(
            base, folder / f"{name}.gguf", seed=i + 1, rank=rank, targets=targets
        )
    return adapters


def mix_keys(names: list[str], sets: int) -> list[AdapterKey]:
    """The adapter sets of a mix: one adapter at scale 1 each; `()` alone for none."""
    return [((name, 1.0),) for name in names[:sets]] or [()]


def rss_mib() -> float | None:
    """Resident memory of this process, MiB (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- 1 and 2: memory, switch calls and decode steps on the backend alone -------------------------


def switch_and_steps(
    settings: EngineSettings,
    model: str,
    adapters: dict[str, Path],
    seqs: int,
    switch_trials: int,
    step_trials: int,
) -> dict[str, Any]:
    backend = load_backend(model, settings, n_seq_max=seqs + 2)
    try:
        before = rss_mib()
        for name, path in adapters.items():
            backend.load_adapter(name, str(path))
        after = rss_mib()
        memory = {
            "adapters": len(adapters),
            "file_mib": sum(p.stat().st_size for p in adapters.values()) / 2**20,
            "rss_before_mib": before,
            "rss_after_mib": after,
            "rss_added_mib": after - before if after is not None and before is not None else None,
        }
        names = list(adapters)
        cycle = [*mix_keys(names, max(MIXES)), ()]
        switches = []
        for i in range(switch_trials * len(cycle)):
            start = time.perf_counter()
            backend.set_adapters(cycle[i % len(cycle)])
            switches.append(time.perf_counter() - start)
        steps = decode_steps(backend, names, seqs, step_trials)
    finally:
        backend.close()
    return {
        "memory": memory,
        "switch_ms": {
            "n": len(switches),
            "p50": 1000 * statistics.median(switches),
            "p95": 1000 * (pct(switches, 0.95) or 0.0),
        },
        "steps": steps,
    }


def decode_steps(
    backend: Backend, names: list[str], seqs: int, trials: int
) -> list[dict[str, Any]]:
    """Seconds per decode step of `seqs` one-token sequences, for each mix (rows interleaved).

    A step of a mix makes one decode call per adapter set, switching before each; the set left
    applied is the last one, as after the engine's previous step, so a mix of one set (or none)
    switches never and a mix of n > 1 sets switches n times a step.
    """
    prompt = backend.tokenize(
        "The fog rolls over Ravenmoor and the", add_special=True, parse_special=False
    )
    backend.set_adapters(())
    backend.clear()
    for s in range(seqs):
        backend.decode([SequenceChunk(s, prompt, 0, False)])
    pos = len(prompt)
    times: dict[int, list[float]] = {sets: [] for sets in MIXES}
    for t in range(trials + 1):  # the first round builds each set's graph: not counted
        for i in range(len(MIXES)):
            sets = MIXES[(i + t) % len(MIXES)]
            keys = mix_keys(names, sets)
            groups = [list(range(s, seqs, len(keys))) for s in range(len(keys))]
            backend.set_adapters(keys[-1])
            start = time.perf_counter()
            for key, group in zip(keys, groups, strict=True):
                if group:
                    backend.set_adapters(key)
                    backend.decode([SequenceChunk(s, [prompt[-1]], pos, True) for s in group])
            elapsed = time.perf_counter() - start
            if t:
                times[sets].append(elapsed)
            pos += 1
    backend.clear()
    backend.set_adapters(())
    rows: list[dict[str, Any]] = []
    for sets in MIXES:
        p50 = 1000 * statistics.median(times[sets])
        rows.append(
            {
                "sets": sets,
                "decode_calls": min(max(1, sets), seqs),
                "ms_p50": p50,
                "ms_p95": 1000 * (pct(times[sets], 0.95) or 0.0),
            }
        )
    for row in rows:
        row["x_none"] = ratio(row["ms_p50"], rows[0]["ms_p50"])
        row["x_one_set"] = ratio(row["ms_p50"], rows[1]["ms_p50"])
    return rows


# -- 3: throughput through the engine ------------------------------------------------------------


def chat(i: int) -> list[ChatMessage]:
    name, role, question = NPCS[i % len(NPCS)]
    system = f"You are {name}, the {role} in Ravenmoor, a town of fog. Answer at length."
    return [ChatMessage("system", system), ChatMessage("user", question)]


async def one_stream(engine: Engine, request: GenerationRequest) -> tuple[float, int, str]:
    """Time to first token, generated tokens and finish reason of one streamed request."""
    first: float | None = None
    tokens = 0
    reason = ""
    async for delta in engine.submit(request):
        if first is None and delta.timing.first_token_s is not None:
            first = delta.timing.first_token_s
        tokens += delta.tokens
        reason = delta.finish_reason or reason
    assert first is not None, "a request finished without a token"
    return first, tokens, reason


async def mix_round(
    engine: Engine, names: list[str], sets: int, requests: int, tokens: int, tag: str
) -> dict[str, Any]:
    keys = mix_keys(names, sets)
    batch = [
        GenerationRequest(
            npc_id=f"{tag}-{i}",
            messages=chat(i),
            sampling=Sampling(max_tokens=tokens, temperature=0.0, seed=i),
            adapters=dict(keys[i % len(keys)]),
        )
        for i in range(requests)
    ]
    # A one-token request on one of the mix's sets first (not counted), so that the switch
    # away from the previous mix's sets does not count against this one.
    primer = GenerationRequest(
        npc_id=f"{tag}-primer",
        prompt="The fog",
        sampling=Sampling(max_tokens=1, temperature=0.0),
        adapters=dict(keys[0]),
    )
    await engine.submit(primer).collect()
    before = engine.metrics()
    start = time.perf_counter()
    done = await asyncio.gather(*(one_stream(engine, r) for r in batch))
    wall = time.perf_counter() - start
    after = engine.metrics()
    ttfts = [d[0] for d in done]
    generated = sum(d[1] for d in done)
    return {
        "wall_s": wall,
        "tokens": generated,
        "at_cap": sum(d[2] == "length" for d in done),
        "tok_s": generated / wall,
        "req_s": requests / wall,
        "ttft_p50_ms": 1000 * (pct(ttfts, 0.5) or 0.0),
        "ttft_p95_ms": 1000 * (pct(ttfts, 0.95) or 0.0),
        "switches": after.adapter_switches - before.adapter_switches,
        "switches_s": (after.adapter_switches - before.adapter_switches) / wall,
        # Counted before a stream's last token is sent (the step count is not: it would race).
        "decode_calls": after.decode_calls - before.decode_calls,
        "cached_prompt_tokens": after.cached_prompt_tokens - before.cached_prompt_tokens,
    }


async def throughput(
    settings: EngineSettings,
    model: str,
    names: list[str],
    requests: int,
    tokens: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """Each mix at the configured adapter quantum and, for mixes of several sets, at 0 (every
    set every step: the engine before turns), all in one engine and interleaved, so that the
    machine's noise falls on both alike."""
    quantum = settings.adapter_quantum_steps
    configs = [(sets, quantum) for sets in MIXES]
    if quantum:
        configs += [(sets, 0) for sets in MIXES if sets > 1]
    runs: dict[tuple[int, int], list[dict[str, Any]]] = {c: [] for c in configs}
    async with Engine.load(settings, model) as engine:
        for sets in MIXES:  # warm-up: each adapter set's graph, the allocator
            await mix_round(engine, names, sets, requests, tokens, f"warm{sets}")
        for r in range(repeats):
            for i in range(len(configs)):
                sets, q = configs[(i + r) % len(configs)]
                # A bench of two scheduler settings on one loaded engine: the quantum is read
                # at every step, so setting it between rounds is safe.
                engine._scheduler.config.adapter_quantum = q
                runs[(sets, q)].append(
                    await mix_round(engine, names, sets, requests, tokens, f"{r}-{sets}-{q}")
                )
        engine._scheduler.config.adapter_quantum = quantum
    rows = []
    for sets, q in configs:
        row: dict[str, Any] = {
            "sets": sets,
            "quantum": q,
            "sets_used": min(max(1, sets), requests),
        }
        for field in (
            "tok_s",
            "req_s",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "switches_s",
            "tokens",
            "decode_calls",
        ):
            row[field] = statistics.median(run[field] for run in runs[(sets, q)])
        none = runs[(0, quantum)]
        row["x_none"] = statistics.median(
            run["tok_s"] / base["tok_s"] for run, base in zip(runs[(sets, q)], none, strict=True)
        )
        one = runs[(1, quantum)]
        row["x_one_set"] = statistics.median(
            run["tok_s"] / base["tok_s"] for run, base in zip(runs[(sets, q)], one, strict=True)
        )
        row["runs"] = runs[(sets, q)]
        rows.append(row)
    return rows


# -- report ------------------------------------------------------------------------------------


def mix_label(sets: int) -> str:
    return "none" if sets == 0 else f"{sets} set" + ("s" if sets > 1 else "")


def print_tables(out: dict[str, Any], requests: int, tokens: int) -> None:
    m = out["memory"]
    print(
        f"\nmemory: {m['adapters']} adapters, {m['file_mib']:.1f} MiB of files; resident "
        f"{fmt(m['rss_before_mib'], '.0f')} -> {fmt(m['rss_after_mib'], '.0f')} MiB "
        f"(+{fmt(m['rss_added_mib'], '.1f')})"
    )
    s = out["switch_ms"]
    print(f"set_adapters call: p50 {s['p50']:.4f} ms, p95 {s['p95']:.4f} ms ({s['n']} calls)")
    print(f"\ndecode step, {requests} sequences of one token")
    header = f"{'mix':<8}{'calls':>6}{'p50 ms':>9}{'p95 ms':>9}{'x none':>8}{'x 1 set':>9}"
    print(header)
    print("-" * len(header))
    for r in out["steps"]:
        print(
            f"{mix_label(r['sets']):<8}{r['decode_calls']:>6}{r['ms_p50']:>9.2f}{r['ms_p95']:>9.2f}"
            f"{fmt(r['x_none'], '.2f'):>8}{fmt(r['x_one_set'], '.2f'):>9}"
        )
    print(f"\nthroughput, {requests} concurrent requests of {tokens} tokens (medians)")
    header = (
        f"{'mix':<8}{'turns':>7}{'tokens':>7}{'tok/s':>8}{'req/s':>7}{'TTFT p50':>10}"
        f"{'TTFT p95':>10}{'switch/s':>10}{'calls':>7}{'x none':>8}{'x 1 set':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in out["throughput"]:
        turns = f"{r['quantum']}" if r["sets"] > 1 else "-"
        print(
            f"{mix_label(r['sets']):<8}{turns:>7}{r['tokens']:>7.0f}{r['tok_s']:>8.1f}"
            f"{r['req_s']:>7.2f}{r['ttft_p50_ms']:>10.0f}{r['ttft_p95_ms']:>10.0f}"
            f"{r['switches_s']:>10.1f}{r['decode_calls']:>7.0f}{r['x_none']:>8.2f}"
            f"{r['x_one_set']:>9.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--adapter", type=Path, action="append", default=[], help="GGUF LoRA")
    parser.add_argument("--rank", type=int, default=16, help="rank of the random adapters")
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help=f"projections the random adapters adapt, among {','.join(TARGETS)}",
    )
    parser.add_argument(
        "--quantum",
        type=int,
        default=EngineSettings().adapter_quantum_steps,
        help="engine.adapter_quantum_steps: steps one adapter set runs before the next takes "
        "its turn; mixes of several sets also run at 0 (every set every step) beside it",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small settings")
    args = parser.parse_args()
    targets = args.targets.split(",")
    if unknown := set(targets) - set(TARGETS):
        parser.error(f"unknown targets {sorted(unknown)}; choose among {','.join(TARGETS)}")
    if args.quick:
        args.requests, args.tokens, args.repeats = 5, 8, 1
    args.switch_trials, args.step_trials = (20, 5) if args.quick else (200, 40)

    if args.requests < max(MIXES):
        print(f"note: {args.requests} requests use only {args.requests} of {max(MIXES)} sets")
    with tempfile.TemporaryDirectory(prefix="mythic-bench-adapters-") as folder:
        run(args, targets, Path(folder))


def run(args: argparse.Namespace, targets: list[str], folder: Path) -> None:
    base = load_settings().engine
    store = ModelStore(base.models_dir)
    adapters = adapter_files(
        args.adapter, store.resolve(args.model).path, folder, args.rank, targets
    )
    settings = EngineSettings(
        **(
            base.model_dump()
            | {
                "adapters": adapters,
                "n_threads": args.threads,
                "max_sequences": max(32, args.requests + 4),
                "adapter_quantum_steps": args.quantum,
                # No prefix sharing: it is keyed by adapter set, so it would favour some mixes.
                "prefix_min_tokens": 10**6,
                # Each round's NPCs are new: earlier rounds' sessions are evicted, not parked
                # (saving them is not what this measures, and would fall on some rounds).
                "park_mb": 0,
            }
        )
    )
    print(
        f"{args.model}, {os.cpu_count()} cores, threads {args.threads or 'all'}; adapters: "
        + ", ".join(f"{n} ({p.name})" for n, p in adapters.items())
    )
    out = switch_and_steps(
        settings, args.model, adapters, args.requests, args.switch_trials, args.step_trials
    )
    out["throughput"] = asyncio.run(
        throughput(settings, args.model, list(adapters), args.requests, args.tokens, args.repeats)
    )
    print_tables(out, args.requests, args.tokens)
    write_results(
        RESULTS,
        ROOT,
        results=out,
        benchmark="adapters",
        adapter_quantum_steps=args.quantum,
        baseline="no adapter (mix 'none'), same engine, same run",
        model=args.model,
        requests=args.requests,
        tokens=args.tokens,
        repeats=args.repeats,
        threads=args.threads,
        quick=args.quick,
        adapters={
            name: "given" if path in [p.resolve() for p in args.adapter] else "random"
            for name, path in adapters.items()
        },
        random_adapters={"rank": args.rank, "targets": targets},
        switch_trials=args.switch_trials,
        step_trials=args.step_trials,
    )


if __name__ == "__main__":
    main()
