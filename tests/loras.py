"""Small real LoRA adapters for a base GGUF, written with the `gguf` package.

The adapters are random but deterministic (seeded) low-rank updates of every block's query and
value projections: strong enough that greedy output visibly changes, which is what the engine's
adapter tests need to tell adapter sets apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_lora(base: Path, out: Path, *, seed: int, rank: int = 4, scale: float = 0.05) -> Path:
    """Write a GGUF LoRA adapter for the base model at `base`; returns `out`."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    for tensor in reader.tensors:
        if not tensor.name.endswith(("attn_q.weight", "attn_v.weight")):
            continue
        n_in, n_out = (int(x) for x in tensor.shape[:2])  # ggml order: ne0 = inputs
        a = rng.normal(0.0, scale, size=(rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, scale, size=(n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", a)
        writer.add_tensor(f"{tensor.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
