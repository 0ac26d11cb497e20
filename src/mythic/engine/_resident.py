"""LoRA adapters loaded into one engine on demand, under a memory budget.

More adapters can be registered than fit in memory. `ResidentAdapters` decides which ones an
engine holds: `ensure` loads one through the engine's worker (the event loop never waits on the
disk), first unloading the least recently used ones until it fits the budget; `touch` marks an
adapter used. An adapter that queued or running requests use is never unloaded (the engine
refuses, and it is not even asked). Adapters the engine loaded at start (`engine.adapters`)
are not counted and never unloaded.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mythic.engine._errors import (
    AdapterBudgetError,
    AdapterError,
    AdapterInUseError,
    EngineError,
)

if TYPE_CHECKING:
    from mythic.engine._engine import Engine

logger = logging.getLogger(__name__)


class AdapterHost(Protocol):
    """What `ResidentAdapters` drives: an `Engine`."""

    @property
    def adapters(self) -> frozenset[str]: ...

    def adapters_in_use(self) -> frozenset[str]: ...

    async def aload_adapter(self, name: str, path: str | PathLike[str]) -> None: ...

    async def aunload_adapter(self, name: str) -> None: ...


@dataclass(slots=True)
class ResidentStats:
    """Counters for /metrics."""

    hits: int = 0
    """`ensure` found the adapter loaded."""
    misses: int = 0
    """`ensure` had to load it."""
    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    """Adapters unloaded to make room."""


class ResidentAdapters:
    """The adapters one engine holds on demand, least recently used first out.

    Args:
        host: the engine.
        budget_bytes: the most bytes of adapters (their size on disk) held at once.
        base_model: the engine's model (`Backend.name`): adapters must be trained on it.
        adapter_format: what the engine loads: `gguf` or `peft` (`Backend.adapter_format`).
    """

    def __init__(
        self,
        host: AdapterHost,
        *,
        budget_bytes: int,
        base_model: str,
        adapter_format: str = "gguf",
    ) -> None:
        if budget_bytes < 1:
            raise ValueError("budget_bytes must be at least 1")
        self.host = host
        self.budget_bytes = budget_bytes
        self.base_model = base_model
        self.adapter_format = adapter_format
        self.stats = ResidentStats()
        self._pinned = frozenset(host.adapters)
        """Loaded before this existed (at start): served, never counted or unloaded."""
        self._lru: OrderedDict[str, int] = OrderedDict()
        """Name -> bytes, least recently used first."""
        self._used = 0
        self._lock = asyncio.Lock()

    @classmethod
    def for_engine(cls, engine: Engine, budget_bytes: int) -> ResidentAdapters:
        """Resident adapters of `engine`, for its model and adapter format."""
        return cls(
            engine,
            budget_bytes=budget_bytes,
            base_model=engine.backend.name,
            adapter_format=engine.backend.adapter_format,
        )

    def __contains__(self, name: object) -> bool:
        """Whether requests may name the adapter now (no I/O)."""
        return name in self._lru or name in self._pinned

    def __len__(self) -> int:
        """Adapters loaded on demand (not those pinned at start)."""
        return len(self._lru)

    @property
    def names(self) -> list[str]:
        """The adapters loaded on demand, least recently used first."""
        return list(self._lru)

    @property
    def used_bytes(self) -> int:
        return self._used

    def touch(self, name: str) -> None:
        """Mark an adapter used now: it is the last to be unloaded."""
        if name in self._lru:
            self._lru.move_to_end(name)

    def reconcile(self) -> list[str]:
        """Forget the adapters the engine no longer holds (unloaded behind this object's back);
        returns their names. The next `ensure` loads them again."""
        held = self.host.adapters
        gone = [name for name in self._lru if name not in held]
        for name in gone:
            self._used -= self._lru.pop(name)
        return gone

    async def ensure(self, name: str, path: str | PathLike[str], size_bytes: int = 0) -> None:
        """Have the engine hold adapter `name` (the file at `path`), loading it if it does not,
        after unloading least recently used adapters that no request uses until it fits.
        `size_bytes`: its size (0: read from disk).

        Raises:
            AdapterBudgetError: it is larger than the whole budget (permanent), or every
                adapter that would have to go is in use (retryable).
            AdapterError: the engine could not load it.
            EngineClosedError: the engine is closed.
        """
        if name in self:
            self.touch(name)
            self.stats.hits += 1
            return
        async with self._lock:
            if name in self:  # loaded while this call waited for the lock
                self.touch(name)
                self.stats.hits += 1
                return
            self.stats.misses += 1
            size = size_bytes or await asyncio.to_thread(_size_on_disk, Path(path))
            if name in self.host.adapters:
                # Loaded by a call that was cancelled before it could record it: adopt it.
                self._add(name, size)
                return
            if size > self.budget_bytes:
                raise AdapterBudgetError(
                    f"adapter {name!r} needs {size} bytes; the budget is {self.budget_bytes}",
                    retryable=False,
                    fix="raise engine.adapter_budget_mb, or train the adapter at a lower rank",
                )
            await self._make_room(size)
            if self._used + size > self.budget_bytes:
                raise AdapterBudgetError(
                    f"no room for adapter {name!r} ({size} bytes): the {len(self._lru)} "
                    f"resident adapters ({self._used} of {self.budget_bytes} bytes) are in use",
                    retryable=True,
                    fix="raise engine.adapter_budget_mb",
                )
            try:
                await self.host.aload_adapter(name, path)
            except (AdapterError, EngineError):
                self.stats.load_failures += 1
                raise
            self.stats.loads += 1
            self._add(name, size)

    async def _make_room(self, size: int) -> None:
        in_use = self.host.adapters_in_use()
        for victim in list(self._lru):
            if self._used + size <= self.budget_bytes:
                return
            if victim in in_use:
                continue
            try:
                await self.host.aunload_adapter(victim)
            except AdapterInUseError:
                continue  # a request took it since `adapters_in_use`
            except AdapterError as exc:
                logger.warning("adapter %s was already gone from the engine: %s", victim, exc)
            self._used -= self._lru.pop(victim)
            self.stats.evictions += 1

    def _add(self, name: str, size: int) -> None:
        self._lru[name] = size
        self._used += size


def _size_on_disk(path: Path) -> int:
    """Bytes of an adapter file, or of the files of a PEFT folder (0 when it is missing)."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return os.stat(path).st_size
    except OSError:
        return 0
