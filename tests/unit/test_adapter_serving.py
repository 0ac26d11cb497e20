"""Serving archetype adapters without a model: `ResidentAdapters` (the LRU under a byte budget)
and `ChainRouter` (which adapters a request gets, and the fallback to the base model).

The engine is the other side of the boundary here: `FakeEngine` loads and unloads names and
refuses to unload one in use, as `Engine` does. tests/integration/test_adapter_serving.py runs
the same on the real engine.
"""

from __future__ import annotations

import asyncio
import builtins
from os import PathLike
from pathlib import Path
from typing import Any

import pytest

from mythic.archetypes import (
    AdapterInfo,
    ArchetypeChain,
    ArchetypeRegistry,
    ChainRouter,
    NPCDelta,
    RegistryUnavailableError,
    adapter_name,
)
from mythic.engine import AdapterBudgetError, AdapterError, AdapterInUseError, ResidentAdapters

pytestmark = pytest.mark.unit

BASE = "smollm2-135m-instruct"
WAIT = 5  # seconds: a bound on every wait; everything here is in-process


class FakeEngine:
    """Loads and unloads adapter names; refuses to unload one that requests use."""

    def __init__(self, pinned: tuple[str, ...] = ()) -> None:
        self.loaded: set[str] = set(pinned)
        self.in_use: set[str] = set()
        self.taken_meanwhile: set[str] = set()
        """Reported free by `adapters_in_use`, but taken by a request before the unload ran."""
        self.log: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None
        """When set, loads wait for it (to hold a load in flight)."""

    @property
    def adapters(self) -> frozenset[str]:
        return frozenset(self.loaded)

    def adapters_in_use(self) -> frozenset[str]:
        return frozenset(self.in_use)

    async def aload_adapter(self, name: str, path: str | PathLike[str]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if "broken" in str(path):
            raise AdapterError(f"LoRA adapter {name!r} at {path} could not be loaded")
        if name in self.loaded:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        self.loaded.add(name)
        self.log.append(("load", name))

    async def aunload_adapter(self, name: str) -> None:
        if name in self.in_use or name in self.taken_meanwhile:
            raise AdapterInUseError(f"adapter {name!r} is in use")
        self.loaded.remove(name)
        self.log.append(("unload", name))


def resident(engine: FakeEngine, budget: int, fmt: str = "gguf") -> ResidentAdapters:
    return ResidentAdapters(engine, budget_bytes=budget, base_model=BASE, adapter_format=fmt)


# -- ResidentAdapters ------------------------------------------------------------------------------


async def test_the_least_recently_used_adapter_goes_first_and_the_budget_holds() -> None:
    engine = FakeEngine()
    lru = resident(engine, budget=300)
    for name in ("a", "b", "c"):
        await lru.ensure(name, f"/adapters/{name}.gguf", 100)
    lru.touch("a")  # used: now b is the least recently used
    await lru.ensure("d", "/adapters/d.gguf", 100)
    assert lru.names == ["c", "a", "d"]
    assert "b" not in lru and "b" not in engine.loaded
    await lru.ensure("e", "/adapters/e.gguf", 200)  # needs two to go: c, then a
    assert lru.names == ["d", "e"]
    assert lru.used_bytes == 300 <= lru.budget_bytes
    assert engine.log[-3:] == [("unload", "c"), ("unload", "a"), ("load", "e")]
    assert (lru.stats.loads, lru.stats.evictions, lru.stats.misses) == (5, 3, 5)
    await lru.ensure("d", "/adapters/d.gguf", 100)  # resident: a hit, nothing loaded
    assert lru.stats.hits == 1 and lru.names == ["e", "d"]
    assert len(engine.log) == 8


async def test_an_adapter_in_use_is_never_evicted() -> None:
    engine = FakeEngine()
    lru = resident(engine, budget=300)
    for name in ("a", "b", "c"):
        await lru.ensure(name, f"/adapters/{name}.gguf", 100)
    engine.in_use = {"a", "b"}
    await lru.ensure("d", "/adapters/d.gguf", 100)
    assert lru.names == ["a", "b", "d"]  # c went although a and b were older
    engine.in_use = {"a", "b", "d"}
    with pytest.raises(AdapterBudgetError) as refused:
        await lru.ensure("e", "/adapters/e.gguf", 100)
    assert refused.value.retryable  # once a request finishes there is room
    assert lru.names == ["a", "b", "d"] and "e" not in engine.loaded
    # Taken by a request between the check and the unload: the engine refuses, the next goes.
    engine.in_use = set()
    engine.taken_meanwhile = {"a"}
    await lru.ensure("e", "/adapters/e.gguf", 100)
    assert lru.names == ["a", "d", "e"]
    assert engine.loaded == {"a", "d", "e"}


async def test_an_adapter_larger_than_the_budget_is_refused_for_good() -> None:
    lru = resident(FakeEngine(), budget=100)
    with pytest.raises(AdapterBudgetError) as refused:
        await lru.ensure("huge", "/adapters/huge.gguf", 101)
    assert not refused.value.retryable


async def test_adapters_loaded_at_start_are_served_but_neither_counted_nor_evicted() -> None:
    engine = FakeEngine(pinned=("settings",))
    lru = resident(engine, budget=100)
    assert "settings" in lru and len(lru) == 0
    await lru.ensure("a", "/adapters/a.gguf", 100)
    await lru.ensure("b", "/adapters/b.gguf", 100)
    assert engine.loaded == {"settings", "b"}
    assert lru.used_bytes == 100


async def test_concurrent_ensures_of_one_adapter_load_it_once(tmp_path: Path) -> None:
    file = tmp_path / "a.gguf"
    file.write_bytes(b"x" * 42)
    engine = FakeEngine()
    lru = resident(engine, budget=1000)
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*(lru.ensure("a", file) for _ in range(3)))
    assert engine.log == [("load", "a")]
    assert lru.used_bytes == 42  # no size given: read from disk
    assert (lru.stats.misses, lru.stats.hits) == (1, 2)


async def test_a_failed_load_is_counted_and_raised() -> None:
    lru = resident(FakeEngine(), budget=1000)
    with pytest.raises(AdapterError):
        await lru.ensure("a", "/adapters/broken.gguf", 10)
    assert lru.stats.load_failures == 1 and "a" not in lru


# -- ChainRouter -----------------------------------------------------------------------------------


class MemoryRegistry(ArchetypeRegistry):
    """A registry in a dict: the registry's own rules (versions, history), no storage."""

    where = "memory"

    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}
        self.down = False

    async def _read(self, archetype: str) -> Any:
        return self.entries.get(archetype)

    async def _chains(self) -> builtins.list[ArchetypeChain]:
        if self.down:
            raise RegistryUnavailableError("redis is down")
        return [entry.chain for entry in self.entries.values()]

    async def _transact(self, archetype: str, change: Any) -> Any:
        new = change(self.entries.get(archetype))
        if new is None:
            self.entries.pop(archetype, None)
        else:
            self.entries[archetype] = new
        return new


def info(task: str = "dialogue_style", rank: int = 8, **fields: object) -> AdapterInfo:
    values: dict[str, object] = {
        "task": task,
        "path": f"/adapters/{task}-{rank}.gguf",
        "format": "gguf",
        "base_model": BASE,
        "rank": rank,
        "size_bytes": 100,
    }
    return AdapterInfo.model_validate(values | fields)


async def served(
    registry: MemoryRegistry,
    engine: FakeEngine | None = None,
    *,
    budget: int = 10_000,
    missing: list[tuple[str, str]] | None = None,
) -> ChainRouter:
    residents = [resident(engine, budget)] if engine is not None else []
    router = ChainRouter(
        registry,
        residents,
        on_missing=(lambda a, t: missing.append((a, t))) if missing is not None else None,
    )
    await router.refresh()
    return router


async def test_an_archetype_without_an_adapter_falls_back_to_the_base_model() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info())
    missing: list[tuple[str, str]] = []
    async with await served(registry, FakeEngine(), missing=missing) as chains:
        for _ in range(3):
            assert chains.adapters_for("zombie", "dialogue_style", base_model=BASE) == {}
            assert chains.adapters_for("vampire", "action_policy", base_model=BASE) == {}
    assert chains.stats.fallbacks == {
        ("zombie", "dialogue_style", "unregistered"): 3,
        ("vampire", "action_policy", "unregistered"): 3,
    }
    # Reported once per (archetype, task), however many requests needed it.
    assert missing == [("zombie", "dialogue_style"), ("vampire", "action_policy")]


async def test_an_adapter_trained_on_another_base_is_not_applied() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info(base_model="qwen2.5-coder-0.5b-instruct"))
    await registry.register_adapter("lich", info(format="peft", path="/adapters/lich"))
    missing: list[tuple[str, str]] = []
    engine = FakeEngine()
    async with await served(registry, engine, missing=missing) as chains:
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        assert chains.adapters_for("lich", "dialogue_style", base_model=BASE) == {}
        await chains.settle()
    assert chains.stats.fallbacks == {
        ("vampire", "dialogue_style", "other_base"): 1,
        ("lich", "dialogue_style", "format"): 1,
    }
    assert missing == [] and engine.log == []  # registered: nothing to provision, or load


async def test_a_registered_adapter_loads_in_the_background_for_the_next_request() -> None:
    registry = MemoryRegistry()
    registered = await registry.register_adapter("vampire", info())
    engine = FakeEngine()
    engine.gate = asyncio.Event()
    async with await served(registry, engine) as chains:
        name = adapter_name("vampire", registered)
        assert name == "vampire.dialogue_style.v1"
        # Not resident: the base model serves these, and one load is under way for all.
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        engine.gate.set()
        async with asyncio.timeout(WAIT):
            await chains.settle()
        assert engine.log == [("load", name)]
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {name: 1.0}
    assert chains.stats.fallbacks == {("vampire", "dialogue_style", "not_resident"): 2}
    assert chains.stats.served == {("vampire", "dialogue_style"): 1}
    assert chains.stats.loads == {"ok": 1}


async def test_a_new_version_is_served_after_a_refresh() -> None:
    registry = MemoryRegistry()
    engine = FakeEngine()
    async with await served(registry, engine) as chains:
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        await registry.register_adapter("vampire", info())
        await registry.register_adapter("vampire", info(path="/adapters/retrained.gguf"))
        await chains.refresh()
        chains.adapters_for("vampire", "dialogue_style", base_model=BASE)
        await chains.settle()
        got = chains.adapters_for("vampire", "dialogue_style", base_model=BASE)
    assert got == {"vampire.dialogue_style.v2": 1.0}


async def test_a_failed_load_is_logged_counted_and_not_retried_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info(path="/adapters/broken.gguf"))
    engine = FakeEngine()
    async with await served(registry, engine) as chains:
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        await chains.settle()
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        await chains.settle()
    assert chains.stats.loads == {"failed": 1}
    assert chains.stats.fallbacks == {
        ("vampire", "dialogue_style", "not_resident"): 1,
        ("vampire", "dialogue_style", "load_failed"): 1,
    }
    assert "could not be loaded" in caplog.text


async def test_an_npc_delta_is_stacked_within_the_rank_budget() -> None:
    registry = MemoryRegistry()
    await registry.put(ArchetypeChain(archetype="vampire", max_total_rank=24))
    await registry.register_adapter("vampire", info(rank=16))
    engine = FakeEngine()
    small = NPCDelta("countess", info("personality", rank=8, path="/adapters/countess.gguf"))
    large = NPCDelta("bran", info("personality", rank=16, path="/adapters/bran.gguf"))
    async with await served(registry, engine) as chains:
        chains.adapters_for("vampire", "dialogue_style", base_model=BASE, npc_delta=small)
        await chains.settle()
        both = chains.adapters_for("vampire", "dialogue_style", base_model=BASE, npc_delta=small)
        over = chains.adapters_for("vampire", "dialogue_style", base_model=BASE, npc_delta=large)
    assert both == {"vampire.dialogue_style.v1": 1.0, "npc.countess.v1": 1.0}
    # 16 + 16 is over the chain's 24: the archetype's adapter alone.
    assert over == {"vampire.dialogue_style.v1": 1.0}
    assert chains.stats.fallbacks[("vampire", "npc_delta", "rank_budget")] == 1
    assert "npc.bran.v1" not in engine.loaded


async def test_a_remote_server_gets_the_adapter_name_without_a_residency_check() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info(base_model="qwen-remote"))
    async with await served(registry, FakeEngine()) as chains:
        got = chains.adapters_for("vampire", "dialogue_style", base_model="qwen-remote")
        chains.note_refused("vampire", "dialogue_style")
    assert got == {"vampire.dialogue_style.v1": 1.0}
    assert chains.stats.fallbacks == {("vampire", "dialogue_style", "refused"): 1}


async def test_an_adapter_the_engine_refused_is_forgotten_and_loaded_again() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info())
    engine = FakeEngine()
    async with await served(registry, engine) as chains:
        chains.adapters_for("vampire", "dialogue_style", base_model=BASE)
        await chains.settle()
        name = "vampire.dialogue_style.v1"
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {name: 1.0}
        engine.loaded.remove(name)  # gone from the engine behind the router's back
        chains.note_refused("vampire", "dialogue_style")
        assert name not in chains.residents[BASE]
        assert chains.residents[BASE].used_bytes == 0
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}
        await chains.settle()
        assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {name: 1.0}
    assert engine.log == [("load", name), ("load", name)]
    assert chains.stats.fallbacks[("vampire", "dialogue_style", "refused")] == 1


async def test_a_registry_that_cannot_be_read_keeps_the_chains_read_before() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info())
    async with await served(registry, FakeEngine()) as chains:
        registry.down = True
        with pytest.raises(RegistryUnavailableError):
            await chains.refresh()
        assert "vampire" in chains.chains
    assert (chains.stats.refreshes, chains.stats.refresh_failures) == (1, 1)


async def test_closing_cancels_the_loads_under_way() -> None:
    registry = MemoryRegistry()
    await registry.register_adapter("vampire", info())
    engine = FakeEngine()
    engine.gate = asyncio.Event()  # never set: the load hangs
    chains = await served(registry, engine)
    chains.adapters_for("vampire", "dialogue_style", base_model=BASE)
    async with asyncio.timeout(WAIT):
        await chains.aclose()
    assert engine.log == []
    # Closed: no new load starts.
    assert chains.adapters_for("vampire", "dialogue_style", base_model=BASE) == {}


def test_an_unknown_task_is_a_value_error() -> None:
    chains = ChainRouter(MemoryRegistry())
    with pytest.raises(ValueError, match="no_such_task"):
        chains.adapters_for("vampire", "no_such_task", base_model=BASE)
