"""The model's threads against the machine's cores, alone and beside other work.

A voice server shares its cores: Whisper's partials run while the player speaks, Piper while
the reply is generated, the game's frame loop beside all of it. llama.cpp's threads meet at
a barrier after each operation of a token, so a token waits for the slowest of them; when
another process holds a core, a thread placed there waits for the scheduler. This bench
measures SmolLM2 (the embedded dialogue model) directly through llama-cpp-python: prompt
processing (400 tokens after 340 cached, as a line's lore after the persona) and generation
(ms a token at about 800 tokens of context), with each `--threads` count, first alone, then
with `--busy` processes spinning beside it (as Whisper or a game would keep a core busy).
Medians over `--runs`; ratios against the first row (the first thread count, alone).

Writes bench/results/threads.json.

    .venv/bin/python bench/threads.py [--threads 1,2] [--busy 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, ratio, write_results  # noqa: E402
from mythic.config import load_settings  # noqa: E402
from mythic.engine import ModelStore  # noqa: E402

MODEL = "smollm2-135m-instruct"

# Runs in a subprocess: argv = model path, threads, runs. Prints one JSON line.
_PROBE = """
import json, statistics, sys, time
import llama_cpp
path, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                      flash_attn=True, verbose=False)
text = b"The vampire countess walks the halls of her castle at night, listening. " * 80
tokens = llm.tokenize(text)[:800]
head, lore, rest = tokens[:340], tokens[340:740], tokens[740:]
prompt, step = [], []
for _ in range(runs):
    llm.reset()
    llm.eval(head)
    t = time.perf_counter()
    llm.eval(lore)
    prompt.append(len(lore) / (time.perf_counter() - t))
    t = time.perf_counter()
    for token in rest[:16]:
        llm.eval([token])
    step.append((time.perf_counter() - t) / 16 * 1000)
print(json.dumps({"prompt_tok_s": statistics.median(prompt), "step_ms": statistics.median(step)}))
"""

_SPIN = "while True: pass"


def probe(path: str, threads: int, busy: int, runs: int) -> dict[str, Any]:
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(busy)]
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, path, str(threads), str(runs)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if out.returncode:
            raise SystemExit(f"the probe failed ({out.returncode}):\n{out.stderr[-2000:]}")
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return {"threads": threads, "busy": busy, **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="model thread counts to compare")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside it")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "threads.json")
    args = parser.parse_args()
    path = str(ModelStore(load_settings().engine.models_dir).resolve(MODEL).path)
    counts = [int(n) for n in args.threads.split(",")]
    rows = [probe(path, n, busy, args.runs) for busy in sorted({0, args.busy}) for n in counts]
    base = rows[0]
    print(f"SmolLM2 on {os.cpu_count()} cores, medians of {args.runs}")
    print(f"{'threads':>7} {'busy':>4} {'prompt tok/s':>13} {'x':>6} {'ms/token':>9} {'x':>6}")
    for r in rows:
        print(
            f"{r['threads']:>7} {r['busy']:>4} {fmt(r['prompt_tok_s'], '.0f'):>13}"
            f" {fmt(ratio(r['prompt_tok_s'], base['prompt_tok_s']), '.2f'):>6}"
            f" {fmt(r['step_ms'], '.1f'):>9} {fmt(ratio(r['step_ms'], base['step_ms']), '.2f'):>6}"
        )
    write_results(args.out.resolve(), ROOT, benchmark="threads", model=MODEL, results=rows)


if __name__ == "__main__":
    main()
