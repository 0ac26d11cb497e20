"""LoRA training on CPU: PEFT over the base GGUF loaded (dequantised) by transformers.

The examples are rendered with the base model's chat template; the loss is taken on the
NPC's reply only (the system prompt and the player's line are context). After training the
adapter is scored on the held-out examples twice in the same run, with the adapter and with
it disabled, so the metrics say what the adapter bought.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mythic._errors import MythicError
from mythic._extras import require
from mythic.engine import ChatFormat, ResolvedModel
from mythic.training._curate import Dataset, Example

log = logging.getLogger(__name__)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers a LoRA adapts by default: attention and MLP of every block."""


class TrainingError(MythicError):
    """Training cannot start or did not produce a usable adapter."""


class TrainSettings(BaseModel):
    """How an adapter is trained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(default=16, ge=1, le=64)
    """LoRA rank: 8-32 for an archetype; an NPC delta stacked on it keeps the total <= 64."""
    alpha: float = Field(default=32.0, gt=0)
    """LoRA alpha; the update is scaled by alpha / rank."""
    targets: tuple[str, ...] = TARGETS
    """Linear layers to adapt (transformers names)."""
    steps: int = Field(default=40, ge=1, le=100_000)
    """Optimiser steps."""
    batch_size: int = Field(default=4, ge=1, le=512)
    learning_rate: float = Field(default=2e-3, gt=0, le=1.0)
    max_tokens: int = Field(default=768, ge=16, le=8192)
    """Longest example (prompt + reply) in tokens; longer ones lose the start of the prompt."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    seed: int = 0
    threads: int | None = Field(default=None, ge=1)
    """CPU threads for PyTorch; None: all cores but one. A training step is many small
    operations, each a barrier for its threads: with one core busy elsewhere (the server, a
    test run), two threads on a 2-core machine measured 4 times slower than one."""


@dataclass(slots=True)
class TrainResult:
    """What a training run produced."""

    peft_dir: Path
    losses: list[float]
    metrics: dict[str, float]
    seconds: float
    examples: int
    tokens: int
    trainable_params: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Encoded:
    ids: list[int]
    labels: list[int]


def keep_freed_memory() -> None:
    """Ask glibc to keep freed blocks instead of returning them to the kernel.

    A training step allocates and frees gigabytes of activations; by default glibc serves the
    large ones with fresh mmaps and unmaps them on free, so every step faults all of them in
    again. Inside a VM those page faults cost more than the arithmetic: a step measured 2 to 4
    times slower. Keeping them (mmap threshold at its maximum, no trimming) makes the freed
    memory reusable. No-op where glibc's mallopt is not available.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    mallopt(m_trim_threshold, 2**30)


def load_base(resolved: ResolvedModel, *, threads: int | None = None) -> tuple[Any, Any]:
    """The base GGUF as a float32 transformers model (on CPU) and its tokenizer.

    Raises:
        MissingExtraError: torch, transformers, peft or gguf is missing (the `train` extra).
        TrainingError: transformers cannot read this GGUF's architecture.
    """
    torch = require("torch", package="torch", extra="train")
    transformers = require("transformers", package="transformers", extra="train")
    require("gguf", package="gguf", extra="train")
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) - 1))
    folder, file = str(resolved.path.parent), resolved.path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=file, dtype=torch.float32
        )
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
        raise TrainingError(f"transformers could not load {resolved.path}: {exc}") from exc
    return model, tokenizer


def encode(example: Example, tokenizer: Any, chat_format: ChatFormat, max_tokens: int) -> _Encoded:
    """Token ids of the rendered chat; labels are -100 except on the reply and its end."""
    prompt = chat_format.render(example.messages[:-1], add_generation_prompt=True)
    reply = example.messages[-1].content + chat_format.stop_strings[0]
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(reply, add_special_tokens=False)["input_ids"]
    keep = max(0, max_tokens - len(r))
    p = p[len(p) - keep :] if keep else []
    return _Encoded([*p, *r], [-100] * len(p) + list(r))


def _batches(
    items: Sequence[_Encoded], size: int, rng: random.Random
) -> Callable[[], list[_Encoded]]:
    order: list[int] = []

    def take() -> list[_Encoded]:
        nonlocal order
        out: list[_Encoded] = []
        while len(out) < size:
            if not order:
                order = list(range(len(items)))
                rng.shuffle(order)
            out.append(items[order.pop()])
        return out

    return take


def _collate(torch: Any, batch: Sequence[_Encoded], pad: int) -> dict[str, Any]:
    width = max(len(b.ids) for b in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, b in enumerate(batch):
        n = len(b.ids)
        ids[i, :n] = torch.tensor(b.ids)
        labels[i, :n] = torch.tensor(b.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _reply_loss(torch: Any, model: Any, batch: dict[str, Any], *, reduction: str) -> Any:
    """Cross-entropy on the reply tokens only. The vocabulary projection runs on those
    positions alone: on a prompt-heavy batch it is a fifth of the compute and most of the
    memory when run on every position."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = inner.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
    ).last_hidden_state
    target = batch["labels"][:, 1:]
    keep = target != -100
    logits = inner.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), target[keep], reduction=reduction)


def _mean_loss(torch: Any, model: Any, items: Sequence[_Encoded], pad: int, size: int) -> float:
    """Token-weighted mean loss over `items`."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(items), size):
            batch = _collate(torch, items[start : start + size], pad)
            total += float(_reply_loss(torch, model, batch, reduction="sum"))
            count += int((batch["labels"][:, 1:] != -100).sum())
    return total / max(1, count)


def train_adapter(
    resolved: ResolvedModel,
    dataset: Dataset,
    out_dir: Path,
    settings: TrainSettings | None = None,
    *,
    progress: Callable[[int, int, float], None] | None = None,
    loaded: tuple[Any, Any] | None = None,
) -> TrainResult:
    """Train a LoRA adapter on `dataset` and save it (PEFT format) in `out_dir`.

    `progress(step, steps, loss)` is called after every step. `loaded`: a base model and
    tokenizer from `load_base`, to train several adapters without reloading; the model is
    returned unchanged (the adapter is removed from it).

    Raises:
        TrainingError: the base has no chat format, no example fits, or the loss diverged.
    """
    settings = settings or TrainSettings()
    torch = require("torch", package="torch", extra="train")
    peft = require("peft", package="peft", extra="train")
    if resolved.chat_format is None:
        raise TrainingError(
            f"{resolved.name} has no chat template to format training examples with",
            fix="train on an instruct model (a GGUF with a chat template), or pass chat_format",
        )
    if not dataset.train:
        raise TrainingError(f"no training examples for {dataset.archetype}/{dataset.task}")
    started = time.perf_counter()
    keep_freed_memory()
    model, tokenizer = loaded or load_base(resolved, threads=settings.threads)
    torch.manual_seed(settings.seed)
    fmt = resolved.chat_format
    train = [encode(ex, tokenizer, fmt, settings.max_tokens) for ex in dataset.train]
    held = [encode(ex, tokenizer, fmt, settings.max_tokens) for ex in dataset.held_out]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 reads an alias transformers 5 deprecates; nothing for a user to do.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        peft_model = peft.get_peft_model(model, config)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    optimiser = torch.optim.AdamW(
        [p for p in peft_model.parameters() if p.requires_grad], lr=settings.learning_rate
    )
    warmup = max(1, settings.steps // 10)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, settings.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lr_at)
    take = _batches(train, settings.batch_size, random.Random(settings.seed))
    losses: list[float] = []
    peft_model.train()
    try:
        for step in range(settings.steps):
            batch = _collate(torch, take(), pad)
            loss = _reply_loss(torch, peft_model, batch, reduction="mean")
            value = loss.item()
            if not math.isfinite(value):
                raise TrainingError(
                    f"the loss diverged at step {step + 1} ({value})",
                    fix="lower the learning rate",
                )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                [p for p in peft_model.parameters() if p.requires_grad], 1.0
            )
            optimiser.step()
            scheduler.step()
            optimiser.zero_grad(set_to_none=True)
            losses.append(value)
            if progress is not None:
                progress(step + 1, settings.steps, value)
        peft_model.eval()
        metrics = {"train_loss": sum(losses[-10:]) / len(losses[-10:])}
        if held:
            metrics["held_out_loss"] = _mean_loss(torch, peft_model, held, pad, settings.batch_size)
            with peft_model.disable_adapter():
                metrics["base_held_out_loss"] = _mean_loss(
                    torch, peft_model, held, pad, settings.batch_size
                )
        out_dir.mkdir(parents=True, exist_ok=True)
        # No embedding layer is adapted; "auto" would look the base model up on the hub.
        peft_model.save_pretrained(str(out_dir), save_embedding_layers=False)
        _name_base(out_dir, resolved.name)
    finally:
        # Give the caller its base model back without the adapter's layers.
        peft_model.unload()
    return TrainResult(
        peft_dir=out_dir,
        losses=losses,
        metrics=metrics,
        seconds=time.perf_counter() - started,
        examples=len(train),
        tokens=sum(len(e.ids) for e in train),
        trainable_params=int(trainable),
    )


def _name_base(out_dir: Path, base: str) -> None:
    """Record the base model's Mythic name in adapter_config.json (PEFT writes a hub id or
    a local path there, which means nothing on another machine)."""
    path = out_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = base
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@dataclass(slots=True)
class BuiltAdapter:
    """An adapter trained, exported and described on disk (`manifest.json`)."""

    archetype: str
    task: str
    base: str
    version: int
    folder: Path
    peft_dir: Path
    gguf: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int
    data: dict[str, Any]
    metrics: dict[str, float]
    result: TrainResult

    def manifest(self) -> dict[str, Any]:
        return {
            "archetype": self.archetype,
            "task": self.task,
            "base": self.base,
            "version": self.version,
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "size_bytes": self.size_bytes,
            "files": {"peft": str(self.peft_dir), "gguf": str(self.gguf)},
            "data": self.data,
            "metrics": self.metrics,
            "training": {
                "steps": len(self.result.losses),
                "seconds": round(self.result.seconds, 1),
                "examples": self.result.examples,
                "tokens": self.result.tokens,
                "trainable_params": self.result.trainable_params,
                "losses": [round(x, 4) for x in self.result.losses],
            },
        }


def next_version(root: Path) -> int:
    """One more than the highest `v<N>` folder under `root` (1 when there is none)."""
    found = [int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit()]
    return max(found, default=0) + 1


def build_adapter(
    resolved: ResolvedModel,
    dataset: Dataset,
    out_root: Path,
    settings: TrainSettings | None = None,
    *,
    progress: Callable[[int, int, float], None] | None = None,
    loaded: tuple[Any, Any] | None = None,
) -> BuiltAdapter:
    """Train `dataset`'s adapter and write it in both formats with its manifest, under
    `out_root/<archetype>/<task>/<base>/v<N>/` (a new version each time)."""
    from mythic.training._export import export_gguf

    settings = settings or TrainSettings()
    root = out_root / dataset.archetype / dataset.task / resolved.name
    version = next_version(root)
    folder = root / f"v{version}"
    result = train_adapter(
        resolved, dataset, folder / "peft", settings, progress=progress, loaded=loaded
    )
    gguf = export_gguf(result.peft_dir, resolved.path, folder / "adapter.gguf")
    dataset.write_jsonl(folder / "data.jsonl")
    built = BuiltAdapter(
        archetype=dataset.archetype,
        task=dataset.task,
        base=resolved.name,
        version=version,
        folder=folder,
        peft_dir=result.peft_dir,
        gguf=gguf,
        rank=settings.rank,
        alpha=settings.alpha,
        targets=settings.targets,
        size_bytes=gguf.stat().st_size,
        data={
            "sha256": dataset.digest,
            "sources": dataset.sources,
            "train": len(dataset.train),
            "held_out": len(dataset.held_out),
        },
        metrics=result.metrics,
        result=result,
    )
    (folder / "manifest.json").write_text(json.dumps(built.manifest(), indent=2) + "\n")
    return built
