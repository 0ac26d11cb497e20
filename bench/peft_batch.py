"""The transformers + PEFT backend: per-token latency of a decode step at batch 1, 8 and 32.

A model of random weights built from a config (nothing is downloaded): `qwen2.5-3b` (the
3B-class model the tiers issue names, for a GPU), `qwen2.5-0.5b`, or `tiny` (seconds on a
CPU, to check the script). Each of `--batches` sequences is prefilled with `--context` tokens,
then `--steps` decode steps are timed: every sequence gets one token per step, so a step's
time is the per-token latency every NPC in the batch sees. Rows, in one run:

- `base`: no adapter loaded (the baseline);
- `mixed LoRA`: `--adapters` random rank-16 LoRA adapters loaded, the batch's rows cycling
  over them and the base model, all in one forward pass (PEFT `adapter_names`).

Columns: p50/p95 ms per token; x base: against the base row at the same batch size; x 16ms:
against the gold target of the design (under 1 meets it); tokens/s: batch / step time.

Writes bench/results/peft_batch-<model>-<device>.json.

    .venv/bin/python bench/peft_batch.py [--model tiny] [--device auto] [--steps 40]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _results import fmt, latency, ratio, write_results  # noqa: E402
from mythic.engine import Sampling, SequenceChunk, TransformersBackend  # noqa: E402

GOLD_TARGET_MS = 16.0
CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen2.5-3B's published config.json (architecture only; the weights here are random).
    "qwen2.5-3b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "vocab_size": 4096,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapters(config: Any, count: int, folder: Path, device: Any) -> list[Path]:
    """`count` random rank-16 LoRA adapters for the config, saved as PEFT saves them."""
    import peft
    import torch
    import transformers

    paths = []
    base = transformers.AutoModelForCausalLM.from_config(config).to(device)
    for i in range(count):
        torch.manual_seed(1000 + i)
        lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False)
        model = peft.get_peft_model(base, lora)
        paths.append(folder / f"adapter{i}")
        model.save_pretrained(str(paths[-1]))
        base = model.unload()
    del base
    return paths


def run_row(backend: TransformersBackend, batch: int, context: int, steps: int) -> list[float]:
    """Seconds per decode step for `batch` sequences after a `context`-token prefill each."""
    import torch

    names = sorted(backend.adapters)
    sets = [()] + [((n, 1.0),) for n in names]
    sampler = backend.make_sampler(Sampling(temperature=0.0, repeat_penalty=1.0), 0, None)
    generator = torch.Generator().manual_seed(batch)
    last = []
    for seq in range(batch):
        prompt = torch.randint(0, backend.n_vocab, (context,), generator=generator).tolist()
        key = sets[seq % len(sets)]
        index = backend.decode([SequenceChunk(seq, prompt, 0, True, key)])[0]
        last.append(backend.sample(sampler, index))
    times = []
    for step in range(steps):
        chunks = [
            SequenceChunk(seq, [last[seq]], context + step, True, sets[seq % len(sets)])
            for seq in range(batch)
        ]
        if backend.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        outputs = backend.decode(chunks)
        last = [backend.sample(sampler, i) for i in outputs]
        if backend.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    for seq in range(batch):
        backend.seq_remove(seq)
    return times[2:]  # the first steps warm kernels and allocators up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--adapters", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)

    import torch
    import transformers

    config = transformers.Qwen2Config(**CONFIGS[args.model])
    batches = [int(b) for b in args.batches.split(",")]
    backend = TransformersBackend.from_config(
        config,
        None,
        name=args.model,
        device=args.device,
        n_ctx=args.context + args.steps + 8,
        n_seq_max=max(batches) + 1,
        n_batch=max(args.context, max(batches)),
    )
    device = backend.device
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("base", "mixed LoRA"):
            if mode == "mixed LoRA":
                for i, path in enumerate(save_adapters(config, args.adapters, Path(tmp), device)):
                    backend.load_adapter(f"adapter{i}", str(path))
            for batch in batches:
                stats = latency(run_row(backend, batch, args.context, args.steps), 1000)
                rows.append({"mode": mode, "batch": batch, "ms_per_token": stats})
    base = {r["batch"]: r["ms_per_token"]["p50"] for r in rows if r["mode"] == "base"}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{args.model} (random weights, {backend.dtype}) on {name}; context {args.context}")
    header = ("row", "batch", "p50 ms", "p95 ms", "x base", "x 16ms", "tok/s")
    print("".join(f"{h:<12}" if i == 0 else f"{h:>8}" for i, h in enumerate(header)))
    for r in rows:
        s = r["ms_per_token"]
        r["x_base"] = ratio(s["p50"], base[r["batch"]])
        r["x_gold_target"] = ratio(s["p50"], GOLD_TARGET_MS)
        r["tokens_per_s"] = r["batch"] * 1000 / s["p50"] if s["p50"] else None
        print(
            f"{r['mode']:<12}{r['batch']:>8}{fmt(s['p50'], '.2f'):>8}{fmt(s['p95'], '.2f'):>8}"
            f"{fmt(r['x_base'], '.2f'):>8}{fmt(r['x_gold_target'], '.2f'):>8}"
            f"{fmt(r['tokens_per_s'], '.0f'):>8}"
        )
    write_results(
        ROOT / "bench" / "results" / f"peft_batch-{args.model}-{device.type}.json",
        ROOT,
        benchmark="peft_batch",
        model=args.model,
        device=name,
        dtype=str(backend.dtype),
        context=args.context,
        adapters=args.adapters,
        gold_target_ms=GOLD_TARGET_MS,
        torch=torch.__version__,
        transformers=transformers.__version__,
        results=rows,
    )


if __name__ == "__main__":
    main()
