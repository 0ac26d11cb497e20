"""How the engine uses its backend: one config class, built from the settings and the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mythic.config import EngineSettings
from mythic.engine._backend import Backend
from mythic.engine._scheduler import SchedulerConfig


@dataclass(slots=True)
class EngineConfig:
    """How the engine uses its backend."""

    scheduler: SchedulerConfig
    overflow: Literal["error", "truncate"] = "error"
    prefix_min_tokens: int = 32
    shift_min_tokens: int = 32
    seed: int = -1
    gold_preempts: bool = True
    park_bytes: int = 0
    trace_steps: int = 0
    """Steps the engine's trace keeps (`Engine.trace`); 0: no trace."""

    @classmethod
    def for_backend(cls, backend: Backend, settings: EngineSettings | None = None) -> EngineConfig:
        s = settings or EngineSettings()
        return cls(
            scheduler=SchedulerConfig(
                max_batch_tokens=backend.n_batch,
                max_batch_seqs=min(64, backend.n_batch),
                prefill_chunk=min(s.prefill_chunk, backend.n_batch),
                prefill_beside_gold=s.prefill_beside_gold,
                max_seq_chunk=backend.max_seq_chunk,
                burst_tokens=s.burst_tokens,
                max_running=max(2, backend.n_seq_max - 2),
                max_waiting=s.max_waiting,
                kv_capacity=backend.n_ctx,
                gold_kv_reserve=min(256, backend.n_ctx // 8),
                mixed_adapters=backend.mixed_adapters,
                adapter_quantum=s.adapter_quantum_steps,
            ),
            overflow=s.overflow,
            prefix_min_tokens=s.prefix_min_tokens,
            shift_min_tokens=s.shift_min_tokens,
            seed=s.seed,
            gold_preempts=s.gold_preempts,
            park_bytes=s.park_mb * 2**20,
            trace_steps=s.trace_steps,
        )
