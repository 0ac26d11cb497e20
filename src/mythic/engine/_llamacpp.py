"""A model loaded in-process by llama.cpp, serving one request at a time.

This is the thin first path (one NPC, one stream). The shared multi-NPC engine with continuous
batching replaces the generation loop; loading and the checks before it stay.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mythic._extras import require
from mythic.config import EngineSettings
from mythic.engine._errors import ModelLoadError
from mythic.engine.models import ModelStore, ResolvedModel


@dataclass(slots=True)
class Sampling:
    """How to pick tokens for one request."""

    max_tokens: int = 200
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    repeat_penalty: float = 1.1
    seed: int | None = None
    """None: the model's configured seed (`engine.seed`), random when that is -1."""
    stop: tuple[str, ...] = field(default_factory=tuple)


class LlamaCppModel:
    """A GGUF model loaded by llama-cpp-python. Not thread-safe: one stream at a time."""

    def __init__(self, resolved: ResolvedModel, llama: Any, *, seed: int = -1) -> None:
        self.resolved = resolved
        self._llama = llama
        self._seed = seed

    @classmethod
    def load(
        cls,
        resolved: ResolvedModel,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        seed: int = -1,
    ) -> LlamaCppModel:
        """Load a resolved model file.

        Raises:
            MissingExtraError: llama-cpp-python is not installed (the `llm` extra).
            ModelLoadError: llama.cpp could not load the file.
        """
        llama_cpp = require("llama_cpp", package="llama-cpp-python", extra="llm")
        if resolved.context_length:
            n_ctx = min(n_ctx, resolved.context_length)
        threads = n_threads or os.cpu_count() or 1
        kwargs: dict[str, Any] = {
            "model_path": str(resolved.path),
            "n_ctx": n_ctx,
            "n_threads": threads,
            "n_threads_batch": threads,
            "n_gpu_layers": n_gpu_layers,
            "verbose": False,
        }
        try:
            llama = llama_cpp.Llama(**kwargs)
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(
                f"llama.cpp could not load {resolved.path}: {exc}",
                fix="check that the file is a complete GGUF model of an architecture this "
                "llama-cpp-python supports",
            ) from exc
        return cls(resolved, llama, seed=seed)

    @property
    def n_ctx(self) -> int:
        return int(self._llama.n_ctx())

    def count_tokens(self, text: str) -> int:
        """Tokens that `text` takes in a prompt (special tokens included)."""
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def stream(self, prompt: str, sampling: Sampling) -> Iterator[str]:
        """Generate a completion of `prompt`, yielding text pieces as they are decoded."""
        kwargs: dict[str, Any] = {
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repeat_penalty": sampling.repeat_penalty,
            "stop": list(sampling.stop),
            "stream": True,
        }
        # A request without a seed gets the model's seed, or a fresh random one when that is -1:
        # llama.cpp would otherwise reuse one fixed seed, and every run would say the same thing.
        seed = sampling.seed if sampling.seed is not None else self._seed
        kwargs["seed"] = seed if seed >= 0 else random.getrandbits(31)
        for chunk in self._llama.create_completion(prompt, **kwargs):
            text = chunk["choices"][0]["text"]
            if text:
                yield text

    def reset(self) -> None:
        """Forget the evaluated prompt, so the next request reuses no cached prefix."""
        self._llama.reset()

    def close(self) -> None:
        """Free the model's memory now rather than at garbage collection."""
        self._llama.close()


def load_model(model: str, settings: EngineSettings) -> LlamaCppModel:
    """Resolve `model` (a packaged name or a GGUF path), check it, and load it.

    Raises:
        ModelError: unknown, not installed, corrupt, not a GGUF, or refused by llama.cpp;
            the message names the command that fixes it.
        MissingExtraError: llama-cpp-python is not installed.
    """
    resolved = ModelStore(settings.models_dir).resolve(model, chat_format=settings.chat_format)
    return LlamaCppModel.load(
        resolved,
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_gpu_layers=settings.n_gpu_layers,
        seed=settings.seed,
    )
