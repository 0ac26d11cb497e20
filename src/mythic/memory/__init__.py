"""NPC memory in three tiers (ARCHITECTURE.md: Memory; design documents 002 and 003).

- hot, in-process: the last 12-20 turns per NPCxplayer, the relationship and quest cards
  (≤ 2 KB each), recent summaries and salient facts; 30 minutes after the last interaction,
  and an LRU bound on total size. Every prompt is built from hot only.
- warm, Redis (or embedded SQLite): 30 days of session summaries, salient facts with
  importance and time decay, the emotional trajectory, the cards and the recent turns.
- cold, PostgreSQL (or embedded SQLite): the append-only lifetime archive, written behind in
  batches, spooled to a local file while the database is down, never read on a turn's path.

    async with Memory(settings.memory) as memory:
        await memory.prefetch("marla", "p-42")        # warm -> hot, once per conversation
        memory.record_turn("marla", "p-42", "s-1", "player", "Remember me?")
        section = memory.context("marla", "p-42")    # "## Recent Memory ..." from hot
"""

from mythic.memory._archiver import Archiver, ArchiverStats, Spool
from mythic.memory._clock import DAY_S, Clock, ManualClock, SystemClock
from mythic.memory._cold import (
    ColdStore,
    HistoryQuery,
    MigrationError,
    PostgresCold,
    SqliteCold,
    migrations,
    open_cold,
)
from mythic.memory._hot import HotEntry, HotMemory
from mythic.memory._memory import Memory, MemoryStats, NPCInfo, open_warm, render_context
from mythic.memory._model import (
    CARD_MAX_BYTES,
    SUMMARY_MAX_CHARS,
    SUMMARY_MIN_CHARS,
    CardError,
    CorruptRecordError,
    Emotion,
    Fact,
    MemoryEvent,
    MemoryStoreError,
    Quest,
    QuestCard,
    Recall,
    RelationshipCard,
    Summary,
    fit_card,
    merge_facts,
    parse_card,
    same_fact,
)
from mythic.memory._summarize import DIGEST_SCHEMA, Digest, Writer, digest, fit_summary
from mythic.memory._warm import FallbackWarm, RedisWarm, SqliteWarm, WarmStore

__all__ = [
    "CARD_MAX_BYTES",
    "DAY_S",
    "DIGEST_SCHEMA",
    "SUMMARY_MAX_CHARS",
    "SUMMARY_MIN_CHARS",
    "Archiver",
    "ArchiverStats",
    "CardError",
    "Clock",
    "ColdStore",
    "CorruptRecordError",
    "Digest",
    "Emotion",
    "Fact",
    "FallbackWarm",
    "HistoryQuery",
    "HotEntry",
    "HotMemory",
    "ManualClock",
    "Memory",
    "MemoryEvent",
    "MemoryStats",
    "MemoryStoreError",
    "MigrationError",
    "NPCInfo",
    "PostgresCold",
    "Quest",
    "QuestCard",
    "Recall",
    "RedisWarm",
    "RelationshipCard",
    "Spool",
    "SqliteCold",
    "SqliteWarm",
    "Summary",
    "SystemClock",
    "WarmStore",
    "Writer",
    "digest",
    "fit_card",
    "fit_summary",
    "merge_facts",
    "migrations",
    "open_cold",
    "open_warm",
    "parse_card",
    "render_context",
    "same_fact",
]
