"""Memory on the real Redis and PostgreSQL: restarts, the 7- and 31-day windows, outages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from mythic.config import MemorySettings
from mythic.memory import Fact, FallbackWarm, ManualClock, Memory, RedisWarm
from tests.integration.services import (
    POSTGRES_DSN,
    REDIS_URL,
    cutoff,
    postgres_dsn,
    redis_prefix,
)

pytestmark = pytest.mark.integration
__all__ = ["postgres_dsn", "redis_prefix"]  # fixtures


def memory_settings(tmp_path: Path, prefix: str, dsn: str, **changes: object) -> MemorySettings:
    values: dict[str, object] = {
        "data_dir": tmp_path,
        "warm_url": REDIS_URL,
        "warm_prefix": prefix,
        "cold_url": dsn,
        "flush_s": 0.02,
        "retry_s": 0.1,
        "cold_timeout_s": 2.0,
        "summaries": False,
    }
    return MemorySettings(**(values | changes))


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling another task's progress
            await asyncio.sleep(0.02)


async def rows(dsn: str, player: str, kind: str | None = None) -> tuple[int, int]:
    """How many archived events `player` has, and how many distinct event ids."""
    db = await asyncpg.connect(dsn)
    try:
        row = await db.fetchrow(
            "SELECT count(*), count(DISTINCT event_id) FROM memory_events WHERE player_id = $1 "
            "AND ($2::text IS NULL OR kind = $2)",
            player,
            kind,
        )
        return int(row[0]), int(row[1])
    finally:
        await db.close()


async def test_memory_survives_a_restart_and_the_7_and_31_day_windows(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    settings = memory_settings(tmp_path, redis_prefix, postgres_dsn)
    clock = ManualClock()
    async with Memory(settings, clock=clock) as memory:
        assert isinstance(memory.warm, FallbackWarm) and isinstance(memory.warm.primary, RedisWarm)
        memory.record_turn("marla", "p7", "s1", "player", "I pulled you out of the river, Marla.")
        memory.record_turn("marla", "p7", "s1", "npc", "I owe you my life, stranger.")
        memory.record_event(
            "marla",
            "p7",
            "s1",
            "rescue",
            fact=Fact("the player saved Marla from drowning", 9, "rescue"),
        )
        memory.set_card("marla", "p7", {"trust": 0.8, "promises": ["a free room, forever"]})
        memory.summarize("marla", "p7", "s1")
        await memory.settle()
        written = await rows(postgres_dsn, "p7")
        assert written[0] == written[1] >= 7  # 2 turns, event, facts, card, summary, emotion

    # A new process a week later: hot is empty, warm (Redis) still holds the conversation.
    clock.advance(days=7)
    async with Memory(settings, clock=clock) as memory:
        assert memory.recall("marla", "p7") is None
        await memory.prefetch("marla", "p7")
        section = memory.context("marla", "p7", session_id="s2")
        assert section is not None
        for remembered in ("drowning", "a free room, forever", "7 days ago", "river"):
            assert remembered in section
        assert memory.stats.prefetches == 1

    # 31 days after: the warm window has passed; the archive still holds everything.
    clock.advance(days=24)
    async with Memory(settings, clock=clock) as memory:
        await memory.prefetch("marla", "p7")
        assert memory.context("marla", "p7", session_id="s3") is None
        shown = await memory.show("p7")
        assert shown["warm"].get("marla", {}).get("turns", []) == []
        assert shown["cold"]["events"] == written[0]
        texts = [e["text"] for e in shown["cold"]["recent"]]
        assert "I pulled you out of the river, Marla." in texts


async def test_what_one_faction_member_learns_of_a_player_its_faction_knows(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    """A salient fact one member of the Night Watch learns of a player is in every member's
    memory of that player (as the faction's, not its own), after a restart too (Redis and
    PostgreSQL keep it); an NPC outside the faction never has it."""
    settings = memory_settings(tmp_path, redis_prefix, postgres_dsn)
    watch = {"captain_strand": "night_watch", "bran": "night_watch"}
    async with Memory(settings) as memory:
        memory.factions = dict(watch)
        memory.record_event(
            "captain_strand",
            "p-f",
            "s1",
            "the player was caught at the postern gate after curfew",
            fact=Fact("the player was caught at the postern gate after curfew", 8),
        )
        bran = memory.context("bran", "p-f")
        assert bran is not None and "What your faction knows of the player" in bran
        assert "postern gate after curfew" in bran
        captain = memory.context("captain_strand", "p-f")
        assert captain is not None and "What you remember about the player" in captain
        assert "What your faction knows" not in captain  # her own, said once
        assert memory.context("marla", "p-f") is None
        await memory.settle()
    async with Memory(settings) as memory:  # a new process: hot is empty
        memory.factions = dict(watch)
        await memory.prefetch("bran", "p-f")
        bran = memory.context("bran", "p-f")
        assert bran is not None and "postern gate after curfew" in bran
        await memory.prefetch("marla", "p-f")
        assert memory.context("marla", "p-f") is None
        shown = await memory.show("p-f")
        assert "faction:night_watch" in shown["warm"]
        forgotten = await memory.forget("p-f")  # the faction's memory of them goes too
        assert forgotten["warm"] >= 2
        await memory.prefetch("bran", "p-f")
        assert memory.context("bran", "p-f") is None


async def test_postgres_cut_off_mid_conversation_loses_no_event(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    async with cutoff(POSTGRES_DSN) as proxy:
        dsn = proxy.url(postgres_dsn)
        settings = memory_settings(tmp_path, redis_prefix, dsn)
        async with Memory(settings) as memory:
            for i in range(150):
                memory.record_turn("gorrim", "p8", "s1", "player", f"before {i}")
            await memory.settle()
            # The turns, and the summaries of every 16 of them (the hot budget), are stored.
            assert memory.archiver.stats.written == memory.archiver.stats.submitted > 150
            await proxy.cut()
            for i in range(300):  # the turns go on while the database is gone
                memory.record_turn("gorrim", "p8", "s1", "player", f"during {i}")
            await until(lambda: memory.archiver.stats.spooled >= 300)
            assert memory.archiver.down
            assert memory.recall("gorrim", "p8") is not None  # hot is untouched
            await proxy.restore()
            await until(lambda: not memory.archiver.down)
            for i in range(50):
                memory.record_turn("gorrim", "p8", "s1", "player", f"after {i}")
            await memory.settle()
            stats = memory.archiver.stats
            assert stats.spooled == stats.replayed + stats.duplicates >= 300
            assert stats.outages >= 1
            submitted = stats.submitted
    stored, distinct = await rows(postgres_dsn, "p8")
    assert stored == distinct == submitted  # every event, once
    db = await asyncpg.connect(postgres_dsn)
    try:
        texts = [
            r[0]
            for r in await db.fetch(
                "SELECT text FROM memory_events WHERE player_id = 'p8' AND kind = 'turn' "
                "ORDER BY seq"
            )
        ]
    finally:
        await db.close()
    expected = [f"before {i}" for i in range(150)] + [f"during {i}" for i in range(300)]
    assert texts == [*expected, *(f"after {i}" for i in range(50))]  # in order


async def test_redis_cut_off_does_not_stall_and_catches_up(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    async with cutoff(REDIS_URL) as proxy:
        settings = memory_settings(
            tmp_path, redis_prefix, postgres_dsn, warm_url=proxy.url(REDIS_URL)
        )
        async with Memory(settings) as memory:
            warm = memory.warm
            assert isinstance(warm, FallbackWarm)
            warm.probe_s = 0.1
            memory.record_turn("ilsa", "p9", "s1", "player", "Hello before the outage")
            await memory.settle()
            await proxy.cut()
            for i in range(20):
                memory.record_turn("ilsa", "p9", "s1", "player", f"during the outage {i}")
            # A new conversation still starts: the prefetch falls back, bounded.
            await memory.prefetch("ilsa", "p10")
            await memory.settle()
            assert not warm.up and warm.outages == 1
            assert memory.stats.warm_errors == 0  # every write landed in the fallback
            await proxy.restore()
            await until(lambda: warm.up)
            assert warm.caught_up >= 1
            recall = await warm.primary.load(("ilsa", "p9"))
            texts = [t.text for t in recall.turns]
            assert texts[-1] == "during the outage 19" and "during the outage 4" in texts
        assert await rows(postgres_dsn, "p9", "turn") == (21, 21)


async def test_migrations_run_once_and_a_missing_schema_is_a_clear_error(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    settings = memory_settings(tmp_path, redis_prefix, postgres_dsn, auto_migrate=False)
    memory = Memory(settings)
    try:
        from mythic.memory import HistoryQuery, MigrationError

        with pytest.raises(MigrationError, match="mythic db migrate"):
            await memory.cold.history(HistoryQuery(player_id="x"))
        assert [m.version for m in await memory.cold.migrate()] == [1, 2]
        assert await memory.cold.migrate() == []
        assert await memory.cold.history(HistoryQuery(player_id="x")) == []
    finally:
        await memory.aclose()


async def test_an_archive_of_the_first_schema_upgrades_to_game_time_keeping_every_row(
    postgres_dsn: str,
) -> None:
    """An archive written before game time (schema 1) migrates to 2 in place: its rows stay,
    with no game time; new rows carry one."""
    from mythic.memory import HistoryQuery, MemoryEvent, PostgresCold, migrations

    first = migrations("postgres")[0]
    db = await asyncpg.connect(postgres_dsn)
    try:
        await db.execute(first.sql)
        await db.execute(
            "CREATE TABLE mythic_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        await db.execute("INSERT INTO mythic_schema (version, name) VALUES (1, $1)", first.name)
        await db.execute(
            "INSERT INTO memory_events (event_id, kind, npc_id, player_id, ts, text) "
            "VALUES ('old-1', 'turn', 'marla', 'p-old', 100.0, 'From before game time.')"
        )
    finally:
        await db.close()
    cold = PostgresCold(postgres_dsn)
    try:
        assert [m.version for m in await cold.migrate()] == [2]
        dated = MemoryEvent.new("turn", "marla", "p-old", 200.0, "Dated.", game_time=1440 * 9)
        assert await cold.append([dated]) == 1
        history = await cold.history(HistoryQuery(player_id="p-old"))
        assert [(e.text, e.game_time) for e in history] == [
            ("From before game time.", None),
            ("Dated.", 1440 * 9),
        ]
    finally:
        await cold.aclose()


async def test_corrupt_redis_values_are_reported_and_skipped(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    from redis.asyncio import Redis

    settings = memory_settings(tmp_path, redis_prefix, postgres_dsn)
    async with Memory(settings) as memory:
        memory.record_turn("marla", "p11", "s1", "player", "A good line")
        await memory.settle()
    client = Redis.from_url(REDIS_URL)
    try:
        base = f"{redis_prefix}:m:marla|p11"
        await client.rpush(f"{base}:turns", b"\xff\xfe not json", b'{"event_id": 1}')
        await client.set(f"{base}:facts", b"[{]")
        await client.set(f"{base}:card:relationship", b'{"trust": 7}')
        await client.zadd(f"{base}:summaries", {b"garbage": 1e12})
    finally:
        await client.aclose()
    async with Memory(settings) as memory:
        entry = await memory.prefetch("marla", "p11")
        assert [t.text for t in entry.turns] == ["A good line"]
        warm = memory.warm
        assert isinstance(warm, FallbackWarm) and isinstance(warm.primary, RedisWarm)
        assert warm.up and warm.primary.parser.corrupt == 5
        memory.record_turn("marla", "p11", "s2", "player", "Still talking")
        await memory.settle()
        assert memory.context("marla", "p11", session_id="s3") is not None


async def test_compaction_on_postgres_keeps_history_and_the_newest_snapshots(
    tmp_path: Path, redis_prefix: str, postgres_dsn: str
) -> None:
    clock = ManualClock()
    async with Memory(memory_settings(tmp_path, redis_prefix, postgres_dsn), clock=clock) as memory:
        memory.record_turn("marla", "p12", "s1", "player", "Hello")
        for trust in (0.1, 0.2, 0.3):
            memory.set_card("marla", "p12", {"trust": trust})
            clock.advance(days=1)
        await memory.settle()
        clock.advance(days=40)
        assert await memory.compact(older_than_days=30) == 2
        assert await rows(postgres_dsn, "p12", "card") == (1, 1)
        assert await rows(postgres_dsn, "p12", "turn") == (1, 1)
