"""What an adapter's own files say about it: a GGUF LoRA file or a PEFT folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mythic._extras import require
from mythic.archetypes._chain import InvalidAdapterError

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class AdapterFile:
    """What an adapter's own files say about it."""

    path: Path
    format: Literal["gguf", "peft"]
    rank: int
    alpha: float
    size_bytes: int
    base_model: str | None
    """The base model the file names, if it names one."""
    target_modules: tuple[str, ...]


def inspect_adapter(path: str | Path) -> AdapterFile:
    """Read rank, alpha, size and modules from a GGUF LoRA file or a PEFT folder.

    Raises:
        InvalidAdapterError: missing, unreadable, or not a LoRA adapter.
        MissingExtraError: a GGUF file and the `gguf` package is not installed.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return _inspect_peft(p)
    if p.is_file():
        return _inspect_gguf(p)
    raise InvalidAdapterError(f"no adapter at {p}: neither a GGUF file nor a PEFT folder")


def _inspect_gguf(path: Path) -> AdapterFile:
    gguf = require("gguf", package="gguf", extra="train")
    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError, IndexError, KeyError, TypeError) as exc:
        raise InvalidAdapterError(f"{path} is not a readable GGUF file: {exc}") from exc

    def value(key: str) -> Any:
        found = reader.fields.get(key)
        return found.contents() if found is not None else None

    kind, adapter = value("general.type"), value("adapter.type")
    if kind != "adapter" or adapter != "lora":
        raise InvalidAdapterError(
            f"{path} is a GGUF {kind or 'model'} file, not a LoRA adapter "
            f"(general.type {kind!r}, adapter.type {adapter!r})",
            fix="convert a PEFT adapter with llama.cpp's convert_lora_to_gguf.py",
        )
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in reader.tensors}
    ranks, modules = [], set()
    for name, a in shapes.items():
        if not name.endswith(".lora_a"):
            continue
        b = shapes.get(name[: -len("a")] + "b")
        if b is None or len(a) != 2 or len(b) != 2:
            raise InvalidAdapterError(f"{path}: {name} has no matching 2-D lora_b")
        # ggml order: lora_a is (n_in, rank), lora_b is (rank, n_out); the shared side is rank.
        ranks.append(a[1] if a[1] == b[0] else min(a))
        module = name[: -len(".lora_a")].removesuffix(".weight")
        modules.add(module.split(".", 2)[2] if module.startswith("blk.") else module)
    if not ranks:
        raise InvalidAdapterError(f"{path}: no *.lora_a / *.lora_b tensors")
    rank = max(ranks)
    alpha = value("adapter.lora.alpha")
    base = value("general.base_model.0.name")
    return AdapterFile(
        path=path,
        format="gguf",
        rank=rank,
        alpha=float(alpha) if alpha else float(rank),
        size_bytes=path.stat().st_size,
        base_model=str(base) if base else None,
        target_modules=tuple(sorted(modules)),
    )


def _inspect_peft(folder: Path) -> AdapterFile:
    config_path = folder / "adapter_config.json"
    try:
        with config_path.open("rb") as fh:
            config = json.loads(fh.read(1024 * 1024))
    except FileNotFoundError:
        raise InvalidAdapterError(f"{folder} is a folder without adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise InvalidAdapterError(f"cannot read {config_path}: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidAdapterError(f"{config_path} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise InvalidAdapterError(f"{folder} is a {config['peft_type']} adapter, not a LoRA")
    rank = config.get("r")
    patterns = config.get("rank_pattern") or {}
    if not isinstance(rank, int) or not isinstance(patterns, dict):
        raise InvalidAdapterError(f"{config_path}: `r` is not an integer")
    rank = max([rank, *(r for r in patterns.values() if isinstance(r, int))])
    alpha = config.get("lora_alpha")
    targets = config.get("target_modules") or ()
    weights = [folder / n for n in ("adapter_model.safetensors", "adapter_model.bin")]
    found = next((w for w in weights if w.is_file()), None)
    if found is None:
        raise InvalidAdapterError(f"{folder} has no adapter_model.safetensors")
    base = config.get("base_model_name_or_path")
    return AdapterFile(
        path=folder,
        format="peft",
        rank=rank,
        alpha=float(alpha) if isinstance(alpha, int | float) and alpha > 0 else float(rank),
        size_bytes=found.stat().st_size,
        base_model=base if isinstance(base, str) and base else None,
        target_modules=(targets,) if isinstance(targets, str) else tuple(sorted(map(str, targets))),
    )
