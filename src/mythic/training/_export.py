"""PEFT LoRA -> GGUF LoRA, the adapter format llama.cpp loads.

Tensor names follow llama.cpp's: `blk.N.attn_q.weight.lora_a` / `.lora_b` for PEFT's
`model.layers.N.self_attn.q_proj.lora_A.weight` / `lora_B`. Shapes stay as PEFT stores them
(A: rank x in, B: out x rank), which the `gguf` writer turns into ggml's reversed order, as
llama.cpp expects. The scale is `adapter.lora.alpha` / rank, as in PEFT.

For the `llama` architecture, llama.cpp's converter permutes the rows of the query and key
projections (its rotary embedding pairs dimensions differently); transformers undoes that when
it loads a GGUF. A LoRA trained on the transformers layout therefore gets the same permutation
on the output rows of its B matrices for q and k, or the adapted model would attend wrongly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mythic._errors import MythicError
from mythic._extras import require

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")
PERMUTED_ARCHS = frozenset({"llama"})
"""Architectures whose GGUF conversion permutes the q/k projection rows."""


class ExportError(MythicError):
    """A PEFT adapter cannot be written as a GGUF LoRA for this base model."""


def _permute(weights: Any, heads: int) -> Any:
    """llama.cpp's convert_hf_to_gguf row permutation of a q/k projection (out x in)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def export_gguf(peft_dir: Path, base_gguf: Path, out: Path) -> Path:
    """Write the PEFT adapter in `peft_dir` as a GGUF LoRA for `base_gguf`; returns `out`.

    Raises:
        ExportError: the adapter has no weights, targets a layer llama.cpp cannot adapt,
            or does not fit the base model's shapes.
    """
    gguf = require("gguf", package="gguf", extra="train")
    np = require("numpy", package="numpy", extra="train")
    safetensors = require("safetensors.numpy", package="safetensors", extra="train")
    config_path = peft_dir / "adapter_config.json"
    weights_path = peft_dir / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise ExportError(
            f"{peft_dir} is not a PEFT adapter (adapter_config.json and "
            "adapter_model.safetensors expected)"
        )
    config = json.loads(config_path.read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ExportError("rsLoRA and DoRA adapters cannot be written for llama.cpp")
    alpha = float(config["lora_alpha"])
    reader = gguf.GGUFReader(str(base_gguf))
    arch = str(reader.fields["general.architecture"].contents())
    heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    kv_heads = int(kv_field.contents()) if kv_field is not None else heads
    shapes = {t.name: tuple(int(x) for x in t.shape[:2]) for t in reader.tensors}
    tensors = safetensors.load_file(str(weights_path))
    pairs: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        match = _PEFT_KEY.match(key)
        if match is None:
            raise ExportError(f"{key}: not a LoRA weight of a transformer block")
        layer, module, ab = match.groups()
        if module not in _NAMES:
            raise ExportError(
                f"{key}: llama.cpp cannot adapt {module}",
                fix=f"train with targets among {', '.join(n.split('.')[1] for n in _NAMES)}",
            )
        pairs.setdefault(f"blk.{layer}.{_NAMES[module]}.weight", {})[ab] = value
    if not pairs:
        raise ExportError(f"{weights_path} holds no LoRA weights")
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name in sorted(pairs, key=_order):
        pair = pairs[name]
        if set(pair) != {"A", "B"}:
            raise ExportError(f"{name}: LoRA A or B is missing")
        a = np.asarray(pair["A"], dtype=np.float32)
        b = np.asarray(pair["B"], dtype=np.float32)
        if name not in shapes:
            raise ExportError(f"{name}: the base model has no such tensor")
        n_in, n_out = shapes[name]
        if a.shape[1] != n_in or b.shape[0] != n_out or a.shape[0] != b.shape[1]:
            raise ExportError(
                f"{name}: adapter shapes A{a.shape} B{b.shape} do not fit the base's "
                f"{n_out}x{n_in}: trained on another model?"
            )
        if arch in PERMUTED_ARCHS and ".attn_q." in name:
            b = _permute(b, heads)
        elif arch in PERMUTED_ARCHS and ".attn_k." in name:
            b = _permute(b, kv_heads)
        writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a))
        writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b))
    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _order(name: str) -> tuple[int, str]:
    return int(name.split(".")[1]), name
