"""The archetype chain registry on a real Redis: round trip, concurrent writers, no expiry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from mythic.archetypes import (
    AdapterInfo,
    AdapterTask,
    ArchetypeChain,
    RankBudgetError,
    RedisRegistry,
    RegistryFormatError,
    RegistryUnavailableError,
    TrainingData,
    UnknownArchetypeError,
    open_registry,
)
from tests.integration.services import REDIS_URL, redis_prefix

pytestmark = pytest.mark.integration

__all__ = ["redis_prefix"]  # fixtures


def adapter(task: str = "personality", rank: int = 8, **fields: object) -> AdapterInfo:
    values: dict[str, object] = {
        "task": task,
        "path": f"/srv/adapters/{task}.gguf",
        "format": "gguf",
        "base_model": "qwen2.5-coder-0.5b-instruct",
        "rank": rank,
    }
    return AdapterInfo.model_validate(values | fields)


@pytest.fixture
async def registry(redis_prefix: str) -> AsyncIterator[RedisRegistry]:
    store = RedisRegistry(REDIS_URL, prefix=redis_prefix)
    yield store
    await store.aclose()


async def test_redis_round_trip(registry: RedisRegistry, redis_prefix: str) -> None:
    assert await registry.list() == []
    chain = ArchetypeChain(archetype="vampire", voice="vampire", servers=("gpu-1", "gpu-2"))
    await registry.put(chain)
    info = adapter(
        trained_on=TrainingData(description="ravenmoor lore", examples=900),
        metrics={"loss": 1.2345678901234567},
    )
    first = await registry.register_adapter("vampire", info)
    second = await registry.register_adapter("vampire", adapter(rank=16))
    await registry.register_adapter("zombie", adapter("action_policy", 4))
    assert (first.version, second.version) == (1, 2)

    # Another server, another client, the same prefix: it reads what was written.
    async with open_registry(REDIS_URL, prefix=redis_prefix) as other:
        assert isinstance(other, RedisRegistry)
        assert await other.list() == await registry.list()
        assert [c.archetype for c in await other.list()] == ["vampire", "zombie"]
        stored = await other.require("vampire")
        assert stored.servers == ("gpu-1", "gpu-2") and stored.voice == "vampire"
        assert stored.adapters[AdapterTask.PERSONALITY] == second
        assert await other.history("vampire", "personality") == [first, second]
        assert await other.adapter_for("zombie", "action_policy") is not None
        assert await other.adapter_for("zombie", "personality") is None
        assert await other.get("lich") is None
        with pytest.raises(UnknownArchetypeError, match="registered: vampire, zombie"):
            await other.require("lich")

    changed = await registry.update("vampire", lambda c: c.changed(servers=("gpu-3",)))
    assert changed.servers == ("gpu-3",) and changed.adapters == stored.adapters
    with pytest.raises(RankBudgetError):
        await registry.register_adapter("vampire", adapter(rank=65))

    assert await registry.remove("vampire") is True
    assert await registry.remove("vampire") is False
    assert [c.archetype for c in await registry.list()] == ["zombie"]
    with pytest.raises(UnknownArchetypeError):
        await registry.history("vampire", "personality")


async def test_concurrent_registrations_all_land(redis_prefix: str) -> None:
    # Two servers, each with its own connection, register adapters of one archetype at once.
    one = RedisRegistry(REDIS_URL, prefix=redis_prefix)
    two = RedisRegistry(REDIS_URL, prefix=redis_prefix)
    try:
        tasks = list(AdapterTask)
        async with asyncio.timeout(30):
            await asyncio.gather(
                *(
                    (one if i % 2 else two).register_adapter("ghoul", adapter(task.value))
                    for i, task in enumerate(tasks)
                ),
                *(r.register_adapter("ghoul", adapter("personality", 4)) for r in [one, two] * 5),
            )
        chain = await one.require("ghoul")
        assert set(chain.adapters) == set(tasks)
        versions = [a.version for a in await two.history("ghoul", "personality")]
        assert versions == list(range(1, 12))  # 11 registrations, each numbered once
        assert chain.adapters[AdapterTask.PERSONALITY].version == 11
    finally:
        await one.aclose()
        await two.aclose()


async def test_keys_never_expire(registry: RedisRegistry, redis_prefix: str) -> None:
    await registry.register_adapter("lich", adapter())
    await registry.register_adapter("lich", adapter(rank=4))
    client = Redis.from_url(REDIS_URL)
    try:
        keys = sorted([k.decode() async for k in client.scan_iter(match=f"{redis_prefix}:*")])
        assert keys == [
            f"{redis_prefix}:chain:lich",
            f"{redis_prefix}:history:lich",
            f"{redis_prefix}:index",
        ]
        for key in keys:
            assert await client.ttl(key) == -1, key  # -1: no expiry
    finally:
        await client.aclose()


async def test_a_given_client_is_left_open(redis_prefix: str) -> None:
    client = Redis.from_url(REDIS_URL)
    try:
        async with RedisRegistry(client, prefix=redis_prefix) as registry:
            await registry.put(ArchetypeChain(archetype="werewolf"))
            assert "127.0.0.1" in registry.where or "localhost" in registry.where
        assert await client.ping()
    finally:
        await client.aclose()


async def test_a_corrupt_record_is_reported_with_its_key(
    registry: RedisRegistry, redis_prefix: str
) -> None:
    await registry.put(ArchetypeChain(archetype="zombie"))
    client = Redis.from_url(REDIS_URL)
    try:
        await client.set(f"{redis_prefix}:chain:zombie", '{"archetype": "zombie", "rank": 1}')
    finally:
        await client.aclose()
    with pytest.raises(RegistryFormatError) as info:
        await registry.get("zombie")
    assert info.value.problems[0].source == f"{redis_prefix}:chain:zombie"
    assert info.value.problems[0].field == "rank"
    with pytest.raises(RegistryFormatError):
        await registry.register_adapter("zombie", adapter())


async def test_unreachable_redis_is_retryable() -> None:
    async with RedisRegistry("redis://127.0.0.1:1/0", timeout_s=1.0) as registry:
        with pytest.raises(RegistryUnavailableError) as info:
            await registry.get("vampire")
        assert info.value.retryable
        with pytest.raises(RegistryUnavailableError):
            await registry.register_adapter("vampire", adapter())
        with pytest.raises(RegistryUnavailableError):
            await registry.ping()
