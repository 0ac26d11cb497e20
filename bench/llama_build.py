"""Raw llama.cpp speed of different llama-cpp-python builds, e.g. AVX2 against AVX-512/VNNI.

Each `--python` interpreter (a virtual environment with one build of llama-cpp-python) measures
prompt processing and single-token generation on the packaged models, in a subprocess; the
first interpreter is the baseline for the ratios. Medians over `--runs`. Writes
bench/results/llama_build.json.

    .venv/bin/python bench/llama_build.py --python /tmp/avx2/bin/python --python .venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _results import write_results
from mythic.config import load_settings
from mythic.engine import ModelStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "llama_build.json"
MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")

# Runs inside each interpreter: argv = model path, runs. Prints one JSON line.
_PROBE = """
import json, statistics, sys, time
import llama_cpp
path, runs = sys.argv[1], int(sys.argv[2])
llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=2, n_threads_batch=2, verbose=False)
tokens = llm.tokenize(b"The bells of the old cathedral ring over the river. " * 28)[:320]
prompt, gen = [], []
for _ in range(runs):
    llm.reset()
    t = time.perf_counter()
    llm.eval(tokens)
    prompt.append(len(tokens) / (time.perf_counter() - t))
    t = time.perf_counter()
    for tok in tokens[:32]:
        llm.eval([tok])
    gen.append(32 / (time.perf_counter() - t))
llm.close()
info = llama_cpp.llama_print_system_info().decode()
features = [f.split(" = ")[0].strip() for f in info.split("|") if f.strip().endswith("= 1")]
print(json.dumps({"prompt_tok_s": statistics.median(prompt), "gen_tok_s": statistics.median(gen),
                  "features": features, "prompt_tokens": len(tokens)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter of a build (repeatable)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    pythons: list[str] = args.python or [sys.executable]

    store = ModelStore(load_settings().engine.models_dir)
    rows: list[dict[str, Any]] = []
    for model in MODELS:
        path = store.resolve(model).path
        base: dict[str, float] = {}
        for python in pythons:
            out = subprocess.run(
                [python, "-c", _PROBE, str(path), str(args.runs)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            row = json.loads(out.strip().splitlines()[-1])
            base = base or {"prompt": row["prompt_tok_s"], "gen": row["gen_tok_s"]}
            row |= {
                "model": model,
                "python": python,
                "prompt_vs_baseline": row["prompt_tok_s"] / base["prompt"],
                "gen_vs_baseline": row["gen_tok_s"] / base["gen"],
            }
            rows.append(row)

    print(f"{'model':30} {'build':38} {'prompt tok/s':>12} {'x':>5} {'gen tok/s':>9} {'x':>5}")
    for r in rows:
        build = ",".join(f for f in r["features"] if f.startswith("AVX"))[:38]
        print(
            f"{r['model']:30} {build:38} {r['prompt_tok_s']:>12.0f} "
            f"{r['prompt_vs_baseline']:>5.2f} {r['gen_tok_s']:>9.1f} {r['gen_vs_baseline']:>5.2f}"
        )
    print(f"(medians of {args.runs}; ratios against the first --python, measured in this run)")
    write_results(RESULTS, ROOT, benchmark="llama_build", results=rows)


if __name__ == "__main__":
    main()
