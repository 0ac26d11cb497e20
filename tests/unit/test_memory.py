"""The memory tiers on their embedded stores (SQLite), with a manual clock."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mythic.config import MemorySettings
from mythic.memory import (
    CARD_MAX_BYTES,
    DAY_S,
    SUMMARY_MAX_CHARS,
    SUMMARY_MIN_CHARS,
    Archiver,
    CardError,
    Fact,
    HistoryQuery,
    HotMemory,
    ManualClock,
    Memory,
    MemoryEvent,
    QuestCard,
    RelationshipCard,
    Spool,
    SqliteCold,
    SqliteWarm,
    fit_summary,
    merge_facts,
    parse_card,
    render_context,
)

pytestmark = pytest.mark.unit


def turn(text: str, ts: float, role: str = "player", session: str = "s1") -> MemoryEvent:
    return MemoryEvent.new("turn", "marla", "p1", ts, text, session_id=session, role=role)


# -- cards --------------------------------------------------------------------------------------


def test_cards_are_validated_with_clear_errors() -> None:
    with pytest.raises(CardError, match="trust"):
        parse_card("relationship", {"trust": 2.0})
    with pytest.raises(CardError, match=r"(?i)extra"):
        parse_card("relationship", {"trust": 0.1, "mood": "grumpy"})
    with pytest.raises(CardError, match="promises"):
        parse_card("relationship", {"promises": ["x" * 201]})
    with pytest.raises(CardError, match="no card named"):
        parse_card("inventory", {})
    with pytest.raises(CardError, match="trust"):
        parse_card("relationship", {"trust": float("nan")})


def test_an_oversized_card_loses_its_oldest_entries_until_it_fits() -> None:
    promises = [f"promise {i}: " + "x" * 150 for i in range(40)]
    card = parse_card("relationship", {"trust": 0.5, "promises": promises, "notes": ["n"] * 5})
    assert isinstance(card, RelationshipCard)
    assert card.size() <= CARD_MAX_BYTES
    assert card.trust == 0.5
    assert card.notes == []  # notes go first
    assert card.promises == promises[-len(card.promises) :]  # the newest promises stay
    assert len(card.promises) >= 8


def test_a_card_that_cannot_fit_is_rejected() -> None:
    quests = [{"id": f"q{i}" + "x" * 60, "title": "t" * 120, "stage": "s" * 80} for i in range(8)]
    with pytest.raises(CardError, match=r"2048|limit"):
        parse_card("quest", {"active": quests})
    small = parse_card("quest", {"active": quests[:2], "completed": ["old"] * 60})
    assert isinstance(small, QuestCard) and small.size() <= CARD_MAX_BYTES


# -- facts and summaries ------------------------------------------------------------------------


def test_duplicate_facts_are_merged_not_appended() -> None:
    now = 100 * DAY_S
    facts = [Fact("Marla gave the player a silver ring", 5, "gift", now - DAY_S)]
    merged = merge_facts(
        facts,
        [Fact("gave the player a silver ring as a gift", 7, "gift", now)],
        now=now,
        max_facts=10,
        half_life_days=7,
    )
    assert len(merged) == 1
    assert merged[0].count == 2 and merged[0].importance == 7 and merged[0].ts == now
    other = merge_facts(
        merged,
        [Fact("the player insulted her cooking", 4, "insult", now)],
        now=now,
        max_facts=10,
        half_life_days=7,
    )
    assert len(other) == 2


def test_facts_decay_with_time_and_only_the_most_salient_are_kept() -> None:
    now = 100 * DAY_S
    old_big = Fact("the player saved her life", 9, "rescue", now - 30 * DAY_S)
    new_small = Fact("the player likes stew", 3, "other", now)
    assert old_big.score(now, 7) < new_small.score(now, 7)  # 9 / 2^(30/7) < 3
    many = [Fact(f"unrelated thing number {i} zq{i}", 1 + i % 9, "other", now) for i in range(20)]
    kept = merge_facts([], many, now=now, max_facts=10, half_life_days=7)
    assert len(kept) == 10
    assert [f.importance for f in kept] == sorted((f.importance for f in kept), reverse=True)


def test_summaries_are_fitted_to_300_600_characters() -> None:
    turns = [turn("I brought you a silver ring from the capital, Marla.", 1.0)]
    short = fit_summary("They talked.", turns)
    assert SUMMARY_MIN_CHARS <= len(short) <= SUMMARY_MAX_CHARS or "silver ring" in short
    assert "silver ring" in short
    long = fit_summary("The player came in from the rain. " * 40, turns)
    assert SUMMARY_MIN_CHARS // 2 <= len(long) <= SUMMARY_MAX_CHARS
    assert long.endswith(".")


# -- hot ----------------------------------------------------------------------------------------


def test_hot_keeps_the_last_turns_and_expires_after_the_ttl() -> None:
    clock = ManualClock(1000.0)
    hot = HotMemory(max_turns=12, ttl_s=1800, max_bytes=1 << 20, clock=clock)
    for i in range(30):
        hot.add_turn(("marla", "p1"), turn(f"line {i}", clock.now()))
    entry = hot.get(("marla", "p1"))
    assert entry is not None
    assert [t.text for t in entry.turns] == [f"line {i}" for i in range(18, 30)]
    clock.advance(1799)
    assert ("marla", "p1") in hot
    clock.advance(1801)
    assert hot.get(("marla", "p1")) is None
    assert hot.bytes == 0


def test_hot_evicts_the_least_recently_used_over_its_size_bound() -> None:
    clock = ManualClock(1000.0)
    hot = HotMemory(max_turns=16, ttl_s=1800, max_bytes=64 * 1024, clock=clock)
    for player in range(40):
        for _ in range(8):
            hot.add_turn(("marla", f"p{player}"), turn("x" * 300, clock.now()))
        hot.get(("marla", "p0"))  # p0 stays in use
    assert hot.bytes <= 64 * 1024
    assert hot.evictions > 0
    assert ("marla", "p0") in hot and ("marla", "p39") in hot
    assert ("marla", "p1") not in hot


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(min_value=0, max_value=2000),
    texts=st.lists(st.text(min_size=1, max_size=300), min_size=0, max_size=12),
    promises=st.lists(st.text(min_size=1, max_size=200).filter(str.strip), max_size=5),
)
def test_the_memory_section_never_exceeds_its_budget(
    budget: int, texts: list[str], promises: list[str]
) -> None:
    clock = ManualClock(50 * DAY_S)
    hot = HotMemory(max_turns=16, ttl_s=1800, max_bytes=1 << 24, clock=clock)
    entry = hot.entry(("marla", "p1"))
    for i, text in enumerate(texts):
        entry.turns.append(turn(text, clock.now(), session="old"))
        entry.facts.append(Fact(text[:200] or "x", 1 + i % 9, "other", clock.now()))
    entry.relationship = RelationshipCard(promises=[p.strip() for p in promises], updated_at=1)
    text = render_context(
        entry, now=clock.now(), session_id="new", max_chars=budget, half_life_days=7
    )
    assert text is None or len(text) <= budget


# -- the embedded warm store --------------------------------------------------------------------


async def test_sqlite_warm_expires_by_the_window_and_skips_corrupt_rows(tmp_path: Path) -> None:
    clock = ManualClock(100 * DAY_S)
    warm = SqliteWarm(tmp_path / "warm.sqlite3", clock=clock, window_s=30 * DAY_S, max_turns=4)
    pair = ("marla", "p1")
    try:
        for i in range(6):
            await warm.append_turn(pair, turn(f"line {i}", clock.now()))
        await warm.put_card(pair, RelationshipCard(trust=0.4, updated_at=clock.now()))
        await warm.put_facts(pair, [Fact("the player saved her", 9, "rescue", clock.now())])
        recall = await warm.load(pair)
        assert [t.text for t in recall.turns] == ["line 2", "line 3", "line 4", "line 5"]
        assert recall.relationship is not None and recall.relationship.trust == 0.4
        with sqlite3.connect(tmp_path / "warm.sqlite3") as db:
            db.execute(
                "INSERT INTO warm (npc_id, player_id, kind, ts, value) VALUES (?,?,?,?,?)",
                (*pair, "turns", clock.now(), "{not json"),
            )
        recall = await warm.load(pair)
        assert len(recall.turns) == 4 and warm.parser.corrupt == 1
        clock.advance(days=7)
        assert len((await warm.load(pair)).turns) == 4
        clock.advance(days=24)
        recall = await warm.load(pair)
        assert recall.empty()
        assert await warm.pairs_of("p1") == [pair]
        await warm.drop(pair)
        assert await warm.pairs_of("p1") == []
    finally:
        await warm.aclose()


# -- the embedded archive and the spool ---------------------------------------------------------


async def test_the_archive_stores_each_event_once_and_migrates_idempotently(
    tmp_path: Path,
) -> None:
    cold = SqliteCold(tmp_path / "archive.sqlite3")
    try:
        assert [m.version for m in await cold.migrate()] == [1, 2]
        assert await cold.migrate() == []
        events = [turn(f"line {i}", float(i)) for i in range(250)]
        assert await cold.append(events[:100]) == 100
        assert await cold.append(events) == 150  # the first 100 are already there
        assert await cold.count("p1") == 250
        history = await cold.history(HistoryQuery(player_id="p1", since=10, until=20))
        assert [e.text for e in history] == [f"line {i}" for i in range(10, 20)]
        assert history[0] == events[10]
    finally:
        await cold.aclose()


def test_the_spool_skips_a_torn_line_and_keeps_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    first = [turn(f"a{i}", float(i)) for i in range(3)]
    spool.append(first)
    with spool.path.open("ab") as f:
        f.write(b'{"event_id": "torn", "ki')  # a crash in the middle of a write
    second = [turn(f"b{i}", float(10 + i)) for i in range(2)]
    spool.append(second)
    events, end = spool.read(0, 100)
    assert [e.text for e in events] == ["a0", "a1", "a2", "b0", "b1"]
    assert spool.corrupt == 1
    spool.commit(end)
    assert spool.backlog() == 0 and not spool.path.exists()


async def test_a_spool_left_by_a_crash_is_replayed_exactly_once(tmp_path: Path) -> None:
    cold = SqliteCold(tmp_path / "archive.sqlite3")
    await cold.migrate()
    events = [turn(f"line {i}", float(i)) for i in range(230)]
    # The crash came after the first 50 reached the archive but before the offset moved.
    await cold.append(events[:50])
    Spool(tmp_path / "spool").append(events)
    archiver = Archiver(cold, tmp_path / "spool", flush_s=0.01, batch=100, retry_s=0.01)
    try:
        archiver.start()
        archiver.submit(turn("after restart", 999.0))
        await archiver.flush()
        assert not archiver.down
        # The new event queued behind the old spool, to keep order: everything is replayed.
        assert archiver.stats.spooled == 1
        assert archiver.stats.replayed == 181
        assert archiver.stats.duplicates == 50
        assert await cold.count("p1") == 231
        history = await cold.history(HistoryQuery(player_id="p1", limit=1000))
        assert [e.text for e in history][-2:] == ["line 229", "after restart"]
    finally:
        await archiver.aclose()
        await cold.aclose()


# -- the whole memory, embedded -----------------------------------------------------------------


def _settings(tmp_path: Path) -> MemorySettings:
    return MemorySettings(data_dir=tmp_path, flush_s=0.01, summaries=False)


async def test_memory_survives_a_restart_and_expires_from_warm_after_the_window(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1_000 * DAY_S)
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        memory.record_turn("marla", "p1", "s1", "player", "I brought you a silver ring, Marla.")
        memory.record_turn("marla", "p1", "s1", "npc", "Oh! It's lovely. Thank you, traveller.")
        memory.record_event(
            "marla",
            "p1",
            "s1",
            "give_item ok",
            fact=Fact("the player gave Marla a silver ring", 7, "gift"),
        )
        memory.set_card("marla", "p1", {"trust": 0.3, "promises": ["bring wine"]})
        memory.summarize("marla", "p1", "s1")
        await memory.settle()
        assert memory.stats.summaries == 1
    clock.advance(days=7)
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        assert memory.recall("marla", "p1") is None  # a new process: hot is empty
        await memory.prefetch("marla", "p1")
        text = memory.context("marla", "p1", session_id="s2")
        assert text is not None and text.startswith("## Recent Memory")
        assert "silver ring" in text and "bring wine" in text and "7 days ago" in text
        assert len(text) <= memory.settings.context_chars
    clock.advance(days=24)  # 31 days after the conversation
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        await memory.prefetch("marla", "p1")
        assert memory.context("marla", "p1", session_id="s3") is None
        shown = await memory.show("p1")
        expired = shown["warm"].get("marla", {})
        for kind in ("turns", "summaries", "facts", "emotions"):
            assert expired.get(kind, []) == [], kind
        assert expired.get("relationship") is None
        kinds = [e["kind"] for e in shown["cold"]["recent"]]
        assert shown["cold"]["events"] == len(kinds) >= 6
        assert {"turn", "event", "fact", "card", "summary", "emotion"} <= set(kinds)
        json.dumps(shown)  # printable by `mythic memory show --json`


async def test_memories_are_dated_and_fade_by_the_games_calendar_not_the_wall_clock(
    tmp_path: Path,
) -> None:
    """The game tells each NPC its date (SceneUpdate.date): every record carries it, the
    summary of a conversation held yesterday in the game is "yesterday" though only minutes
    passed for the player, and a fact fades by the game's days."""
    from mythic.knowledge import Calendar

    calendar = Calendar()
    clock = ManualClock(1_000 * DAY_S)
    day1 = calendar.minutes("12-3-14", "20:00")
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        memory.game_ago = calendar.ago
        memory.set_game_time("marla", day1)
        said = memory.record_turn("marla", "p1", "s1", "player", "I brought you a silver ring.")
        memory.record_turn("marla", "p1", "s1", "npc", "Oh! It's lovely. Thank you.")
        memory.record_event(
            "marla", "p1", "s1", "give_item ok", fact=Fact("the player gave Marla a ring", 7)
        )
        memory.summarize("marla", "p1", "s1")
        await memory.settle()
        assert said.game_time == day1
        clock.advance(600)  # ten minutes for the player; a night and a day in the game
        memory.set_game_time("marla", calendar.minutes("12-3-15", "21:00"))
        text = memory.context("marla", "p1", session_id="s2")
        assert text is not None
        assert "- yesterday: " in text and "the player gave Marla a ring (yesterday)" in text
        stored = await memory.cold.history(HistoryQuery(player_id="p1"))
        assert stored and {e.game_time for e in stored} == {day1}
    # A new process: warm gives the dates back, and two game weeks on, the summary is said
    # as the game's "2 weeks ago" and the fact has faded (half-life: a week of game days).
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        memory.game_ago = calendar.ago
        await memory.prefetch("marla", "p1")
        later = calendar.minutes("12-3-28", "09:00")
        memory.set_game_time("marla", later)
        text = memory.context("marla", "p1", session_id="s3")
        assert text is not None and "- 2 weeks ago: " in text
        entry = memory.recall("marla", "p1")
        assert entry is not None and entry.facts[0].game_time == day1
        fact = entry.facts[0]
        faded = fact.score(clock.now(), memory.settings.fact_half_life_days, later)
        fresh = fact.score(clock.now(), memory.settings.fact_half_life_days)  # wall clock
        assert faded < fresh / 3
    # An NPC the game never told the date: wall-clock ages, as before.
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        await memory.prefetch("marla", "p1")
        text = memory.context("marla", "p1", session_id="s4")
        assert text is not None and "- today: " in text


def test_a_stored_game_time_that_is_not_a_whole_number_is_a_corrupt_record() -> None:
    from mythic.memory import CorruptRecordError, Summary

    event = turn("hello", 5.0).to_dict()
    for bad in ("yesterday", 1.5, True, [3]):
        with pytest.raises(CorruptRecordError, match="whole number"):
            MemoryEvent.from_dict(event | {"game_time": bad})
        with pytest.raises(CorruptRecordError):
            Fact.from_dict({"text": "a gift", "importance": 5, "game_time": bad})
        with pytest.raises(CorruptRecordError):
            Summary.from_dict({"text": "we spoke", "ts": 1.0, "game_time": bad})
    assert MemoryEvent.from_dict(event | {"game_time": 1440}).game_time == 1440
    assert MemoryEvent.from_dict(event).game_time is None  # written before game time


async def test_forget_removes_a_player_from_every_tier(tmp_path: Path) -> None:
    async with Memory(_settings(tmp_path), clock=ManualClock(10 * DAY_S)) as memory:
        for player in ("p1", "p2"):
            memory.record_turn("marla", player, "s", "player", f"I am {player}")
            memory.record_turn("gorrim", player, "s", "player", f"I am {player} too")
        await memory.settle()
        deleted = await memory.forget("p1")
        assert deleted == {"hot": 2, "warm": 2, "cold": 2}
        shown = await memory.show("p1")
        assert shown["hot"] == {} and shown["warm"] == {} and shown["cold"]["events"] == 0
        assert (await memory.show("p2"))["cold"]["events"] == 2


async def test_compaction_drops_only_superseded_snapshots(tmp_path: Path) -> None:
    clock = ManualClock(1_000 * DAY_S)
    async with Memory(_settings(tmp_path), clock=clock) as memory:
        memory.record_turn("marla", "p1", "s1", "player", "Hello")
        for trust in (0.1, 0.2, 0.3):
            memory.set_card("marla", "p1", {"trust": trust})
            memory.set_card(
                "marla", "p1", {"active": [{"id": "q1", "title": "Rats"}]}, name="quest"
            )
            clock.advance(days=1)
        await memory.settle()
        clock.advance(days=40)
        removed = await memory.compact(older_than_days=30)
        assert removed == 4  # two older versions of each card; the newest of each stays
        events = await memory.cold.history(HistoryQuery(player_id="p1"))
        cards = [e.data for e in events if e.kind == "card" and e.data]
        assert [(c["name"], c["card"].get("trust")) for c in cards] == [
            ("relationship", 0.3),
            ("quest", None),
        ]
        assert [e.text for e in events if e.kind == "turn"] == ["Hello"]
        assert await memory.compact(older_than_days=30) == 0
