"""Serving archetype chains: which LoRA adapters a request of an NPC is generated with.

`ChainRouter` keeps the registry's chains in memory (`refresh` rereads them) and answers
`adapters_for` synchronously and without I/O, on the gold path. A request gets its archetype's
adapter for the task when one is registered, trained on the serving engine's base model and
resident in that engine (`ResidentAdapters`); otherwise the base model serves it. A registered
adapter that is not resident yet is loaded in the background, so the NPC's next request gets
it. Each fallback to the base model is counted by archetype, task and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from mythic.archetypes._chain import (
    DEFAULT_MAX_TOTAL_RANK,
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    InvalidAdapterError,
    RankBudgetError,
    RegistryError,
)
from mythic.archetypes._registry import ArchetypeRegistry, YamlRegistry
from mythic.engine import AdapterError, EngineError, ResidentAdapters

log = logging.getLogger(__name__)

FallbackReason = Literal[
    "unregistered", "other_base", "format", "not_resident", "load_failed", "rank_budget", "refused"
]
"""Why a request was served by the base model:

- `unregistered`: the archetype has no chain, or its chain no adapter for the task;
- `other_base`: the adapter was trained on another base model than the serving engine's;
- `format`: the adapter's files are not what the engine loads (a PEFT folder for llama.cpp);
- `not_resident`: it is being loaded in the background; the next request gets it;
- `load_failed`: its last load failed; it is tried again after a while;
- `rank_budget`: the NPC's delta would take the stack over the chain's rank budget;
- `refused`: the endpoint refused the adapter (evicted since it was chosen, or a remote server
  that does not serve it): the request was sent again without it.
"""

DELTA_TASK = "npc_delta"
"""The task label under which an NPC delta's fallbacks are counted."""

RETRY_S = 60.0
"""A failed load of an adapter is not tried again for this long."""

BUSY_RETRY_S = 2.0
"""...or for this long when it failed only because every resident adapter was in use."""


def adapter_name(archetype: str, info: AdapterInfo) -> str:
    """The name an archetype adapter is loaded under: `vampire.dialogue_style.v3`. A new
    version gets a new name, so nothing computed with the old one is ever reused."""
    return f"{archetype}.{info.task.value}.v{info.version}"


@dataclass(frozen=True, slots=True)
class NPCDelta:
    """An NPC's own adapter, stacked on its archetype's (design 002)."""

    npc_id: str
    adapter: AdapterInfo

    @property
    def name(self) -> str:
        """The name it is loaded under: `npc.<npc_id>.v<version>`."""
        return f"npc.{self.npc_id}.v{self.adapter.version}"


@dataclass(slots=True)
class ChainStats:
    """Counters for /metrics."""

    served: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(archetype, task) -> requests given the archetype's adapter."""
    fallbacks: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(archetype, task, reason) -> requests served by the base model instead."""
    loads: Counter[str] = field(default_factory=Counter)
    """Background loads by outcome: `ok`, `failed`."""
    refreshes: int = 0
    refresh_failures: int = 0
    missing_callback_errors: int = 0


class ChainRouter:
    """Maps an NPC's archetype and a task to the adapters its request is generated with.

    Args:
        registry: where the chains are kept; `aclose` closes it.
        residents: the adapters resident in each embedded engine, one per base model. A base
            model without one is a remote server's: its adapters are passed by name (the
            endpoint maps them to model names), with no residency check.
        on_missing: called once per (archetype, task) that has no adapter at all, the first
            time a request needs one (the provisioning flow hooks in here). Runs on the event
            loop and must not block.
    """

    def __init__(
        self,
        registry: ArchetypeRegistry,
        residents: Iterable[ResidentAdapters] = (),
        *,
        on_missing: Callable[[str, str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.root = registry.root if isinstance(registry, YamlRegistry) else Path.cwd()
        """Where relative adapter paths start from (the YAML registry's folder)."""
        self.on_missing = on_missing
        self.stats = ChainStats()
        self._residents: dict[str, ResidentAdapters] = {}
        for resident in residents:
            if resident.base_model in self._residents:
                log.warning(
                    "two engines serve %s: archetype adapters are loaded into the first only",
                    resident.base_model,
                )
                continue
            self._residents[resident.base_model] = resident
        self._chains: dict[str, ArchetypeChain] = {}
        self._reported: set[tuple[str, str]] = set()
        self._loading: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._retry_at: dict[tuple[str, str], float] = {}
        self._closed = False

    @property
    def chains(self) -> Mapping[str, ArchetypeChain]:
        """The chains of the last `refresh`, by archetype."""
        return MappingProxyType(self._chains)

    @property
    def residents(self) -> Mapping[str, ResidentAdapters]:
        """The resident adapters of each embedded engine, by base model."""
        return MappingProxyType(self._residents)

    async def refresh(self) -> None:
        """Reread every chain from the registry; requests see the new ones at once.

        Raises:
            RegistryError: the registry could not be read; the chains read before stay.
        """
        try:
            chains = await self.registry.list()
        except RegistryError:
            self.stats.refresh_failures += 1
            raise
        self._chains = {chain.archetype: chain for chain in chains}
        self.stats.refreshes += 1
        # A pair registered since it was reported is reported again if it goes missing again.
        self._reported = {(a, t) for a, t in self._reported if not self._registered(a, t)}

    async def follow(self, interval_s: float) -> None:
        """`refresh` every `interval_s` seconds until cancelled; failures are logged."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except RegistryError as exc:
                log.warning("archetype registry %s not reread: %s", self.registry.where, exc)

    # -- the gold path -------------------------------------------------------------------------

    def adapters_for(
        self,
        archetype: str,
        task: AdapterTask | str,
        *,
        base_model: str,
        npc_delta: NPCDelta | None = None,
    ) -> dict[str, float]:
        """The adapters (name -> scale) a request of an NPC of `archetype` for `task` applies
        on an engine serving `base_model`: the archetype's adapter, then the NPC's delta, each
        when it is registered, trained on `base_model` and resident; `{}`: the base model.

        Synchronous and free of I/O; call it on the event loop (a registered adapter that is
        not resident is loaded by a task started here).

        Raises:
            ValueError: `task` is not an adapter task.
        """
        task = AdapterTask(task)
        resident = self._residents.get(base_model)
        chain = self._chains.get(archetype)
        info = chain.adapters.get(task) if chain is not None else None
        chosen: dict[str, float] = {}
        if info is None:
            self._fallback(archetype, task.value, "unregistered")
            self._missing(archetype, task.value)
        else:
            name = adapter_name(archetype, info)
            why = self._usable(name, info, base_model, resident)
            if why is None:
                chosen[name] = 1.0
                self.stats.served[(archetype, task.value)] += 1
            else:
                self._fallback(archetype, task.value, why)
        if npc_delta is not None:
            self._add_delta(chosen, archetype, chain, task, npc_delta, base_model, resident)
        return chosen

    def note_refused(self, archetype: str, task: AdapterTask | str) -> None:
        """A request's endpoint refused the adapters `adapters_for` gave it (unloaded since, or
        a remote server without them) and the base model served it: count it, and forget the
        adapters an engine no longer holds, so that the next request loads them again."""
        self._fallback(archetype, AdapterTask(task).value, "refused")
        for resident in self._residents.values():
            gone = resident.reconcile()
            if gone:
                log.warning(
                    "adapters %s left %s behind the router's back", gone, resident.base_model
                )

    def _add_delta(
        self,
        chosen: dict[str, float],
        archetype: str,
        chain: ArchetypeChain | None,
        task: AdapterTask,
        delta: NPCDelta,
        base_model: str,
        resident: ResidentAdapters | None,
    ) -> None:
        info = delta.adapter
        try:
            if chain is not None:
                chain.stack([task] if chosen else [], info)
            elif info.rank > DEFAULT_MAX_TOTAL_RANK:
                raise RankBudgetError(archetype, [info], DEFAULT_MAX_TOTAL_RANK)
        except RankBudgetError:
            self._fallback(archetype, DELTA_TASK, "rank_budget")
            return
        except InvalidAdapterError:
            self._fallback(archetype, DELTA_TASK, "other_base")
            return
        why = self._usable(delta.name, info, base_model, resident)
        if why is None:
            chosen[delta.name] = 1.0
        else:
            self._fallback(archetype, DELTA_TASK, why)

    def _usable(
        self,
        name: str,
        info: AdapterInfo,
        base_model: str,
        resident: ResidentAdapters | None,
    ) -> FallbackReason | None:
        """None when the adapter can be applied now; else why not (loading it if it can be)."""
        if info.base_model != base_model:
            return "other_base"
        if resident is None:
            return None  # a remote server's: it serves the name, or the endpoint refuses it
        if info.format != resident.adapter_format:
            return "format"
        if name in resident:
            resident.touch(name)
            return None
        return self._load_later(resident, name, info)

    def _load_later(
        self, resident: ResidentAdapters, name: str, info: AdapterInfo
    ) -> FallbackReason:
        key = (resident.base_model, name)
        if key in self._loading or self._closed:
            return "not_resident"
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return "load_failed"
        path = info.resolve(self.root)
        task = asyncio.get_running_loop().create_task(
            self._load(resident, key, path, info.size_bytes), name=f"load adapter {name}"
        )
        self._loading[key] = task
        task.add_done_callback(lambda _: self._loading.pop(key, None))
        return "not_resident"

    async def _load(
        self, resident: ResidentAdapters, key: tuple[str, str], path: Path, size: int
    ) -> None:
        name = key[1]
        try:
            await resident.ensure(name, path, size)
        except (AdapterError, EngineError) as exc:
            log.warning("adapter %s (%s) not loaded on %s: %s", name, path, key[0], exc)
            self.stats.loads["failed"] += 1
            self._retry_at[key] = time.monotonic() + (BUSY_RETRY_S if exc.retryable else RETRY_S)
        else:
            self.stats.loads["ok"] += 1
            self._retry_at.pop(key, None)

    def _fallback(self, archetype: str, task: str, reason: FallbackReason) -> None:
        self.stats.fallbacks[(archetype, task, reason)] += 1

    def _missing(self, archetype: str, task: str) -> None:
        if self.on_missing is None or (archetype, task) in self._reported:
            return
        self._reported.add((archetype, task))
        try:
            self.on_missing(archetype, task)
        except Exception:  # a hook's failure must not fail the request that triggered it
            self.stats.missing_callback_errors += 1
            log.exception("on_missing(%s, %s) failed", archetype, task)

    def _registered(self, archetype: str, task: str) -> bool:
        chain = self._chains.get(archetype)
        return chain is not None and AdapterTask(task) in chain.adapters

    # -- lifecycle -----------------------------------------------------------------------------

    async def settle(self) -> None:
        """Wait until the background loads under way are done (warm-up, tests)."""
        while self._loading:
            await asyncio.wait(list(self._loading.values()))

    async def aclose(self) -> None:
        """Cancel the background loads, wait for them, and close the registry."""
        self._closed = True
        tasks = list(self._loading.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.registry.aclose()

    async def __aenter__(self) -> ChainRouter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
