"""NPC memory (`mythic.memory`): hot reads, warm prefetch, archiver throughput, and the cost of
the archiver on a turn, each against a baseline measured in the same run.

Four parts (`--only` picks some):

- hot: `HotMemory.get` and `Memory.context` (the `## Recent Memory` section of a prompt) over
  `--pairs` NPCxplayer entries, each holding 16 turns (half of them from an earlier session, so
  the section quotes them), 5 facts, 3 summaries, 3 emotions and both cards. Each call is timed
  alone with `perf_counter_ns` in random pair order; p50/p99 in microseconds. Baseline: a plain
  `dict.get` of the same keys, timed the same way (so it is mostly the timer's own cost).
- warm: `Memory.prefetch` (warm -> hot) of pairs that are not hot yet, on Redis (`open_warm`
  with `warm_url`: Redis with the embedded store behind it, as the server runs it) and on the
  embedded SQLite store, each populated with `--warm-pairs` pairs holding what the hot part
  holds. Every round is a fresh `Memory` (empty hot) over the same store; one at a time, then
  `--concurrency` at once (each prefetch timed alone). p50/p95 in ms; baseline: the embedded
  store at the same concurrency. Target: Redis p95 < 10 ms one at a time. The Redis keys carry
  a unique prefix (`mythicbench<hex>`) and are deleted at the end (SCAN + DEL).
- archive: sustained events/s of `Archiver` into PostgreSQL (a fresh schema
  `mythicbench_<hex>`, via `?search_path=` in the DSN, dropped at the end) and into the embedded
  SQLite archive (the baseline): `--events` prebuilt turn events are submitted in chunks of
  100 with a yield to the event loop between chunks, so the archiver's task runs alongside the
  producer as it does in the server; the clock stops when the archiver has stored them all
  (its counters), and the rows are then counted. Batch size and flush interval are the
  settings' defaults (`--batch` to change the size). Any event spooled (the database judged
  down) is reported: the rate is then not the database's.
- turns: turns/s of a loop of turns with the full `Memory` (Redis warm + PostgreSQL cold, each
  replaced by the embedded store when its service is unreachable), started as the server starts
  it, with the archiver on against off in the same run. A turn is what the NPC actor does with
  memory: `record_turn` of the player's line, `context` for the prompt, `record_turn` of the
  reply, then one yield to the event loop (the model's await in a real turn), round-robin over
  `--turn-pairs` pairs. "off" is the same `Memory` whose archiver is replaced, before start,
  by one whose `submit` drops the event, so the only difference is the archive's work: its
  `submit` calls, its batching task and the PostgreSQL writes it awaits, all of which share
  the one event loop with the turns. The warm writer (Redis) and the summarizer (no model: from
  the turns) run in both. Reported: loop turns/s (what the game sees), settled turns/s (the
  same turns over the time until warm writes and the archive are all done: `Memory.settle`),
  p50/p99 of one turn's synchronous memory calls, and this process's CPU time per turn in the
  loop (every task and thread: a loop rate that drops more than the CPU rises is the machine's
  other processes, PostgreSQL and Redis, competing for its cores). Rounds alternate the
  order; medians.
  on/off should be near 1: nothing a turn calls awaits the cold tier.

Writes bench/results/memory.json.

    .venv/bin/python bench/memory.py [--quick] [--only hot,warm,archive,turns]
        [--redis-url redis://127.0.0.1:6379/0] [--pg-dsn postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from _results import fmt, latency, ratio, write_results
from mythic.config import MemorySettings
from mythic.memory import (
    Archiver,
    ColdStore,
    Emotion,
    Fact,
    FallbackWarm,
    HotMemory,
    Memory,
    MemoryEvent,
    PostgresCold,
    Quest,
    QuestCard,
    Recall,
    RelationshipCard,
    SqliteCold,
    Summary,
    SystemClock,
    WarmStore,
    open_warm,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "memory.json"
REDIS_URL = "redis://127.0.0.1:6379/0"
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
PREFETCH_P95_TARGET_MS = 10.0
PARTS = ("hot", "warm", "archive", "turns")
CHUNK = 100
"""Events the archive producer submits between two yields to the event loop."""

PLAYER_LINES = [
    "Have you seen a man in a grey cloak pass through here tonight?",
    "I brought you the herbs you asked for, fresh from the marsh.",
    "What do you know about the old mill and the lights people see there?",
    "I'll pay you back tomorrow, I swear it on my mother's grave.",
    "The bells rang at midnight again. Does that mean what I think it means?",
    "Sell me a lantern and enough oil to last until dawn.",
]
NPC_LINES = [
    "A grey cloak? Half the city wears one when the fog comes in, friend.",
    "Ah, bless you. These will keep the fever off my boy for another week.",
    "The mill? Nobody sane goes there after dark. The miller's ghost, some say.",
    "Tomorrow, is it? I've heard that before, but your face looks honest enough.",
    "It means the watch will be out in force. Keep your head down.",
    "Three silver for the lantern, two for the oil. Mind the wick, it smokes.",
]
FACTS = [
    ("brought herbs for the fever", "gift", 6),
    ("promised to repay a debt of ten silver", "promise", 7),
    ("asked about the old mill", "quest", 4),
    ("called the city watch cowards", "insult", 3),
    ("pulled her son out of the canal", "rescue", 9),
]


# -- numbers ----------------------------------------------------------------------------------


# -- what a pair remembers ----------------------------------------------------------------------


def npc_of(i: int) -> str:
    return f"npc{i % 8}"


def turn_events(npc: str, player: str, now: float, count: int = 16) -> list[MemoryEvent]:
    """`count` turns, player and NPC alternating, a minute apart, ending a minute ago; the
    first half in an earlier session."""
    events = []
    for k in range(count):
        role = "player" if k % 2 == 0 else "npc"
        lines = PLAYER_LINES if role == "player" else NPC_LINES
        session = "s-old" if k < count // 2 else "s-now"
        ts = now - 60.0 * (count - k)
        events.append(
            MemoryEvent.new(
                "turn", npc, player, ts, lines[k // 2 % len(lines)], session_id=session, role=role
            )
        )
    return events


def recall_of(npc: str, player: str, now: float) -> Recall:
    """What warm holds of one pair (and hot, once prefetched)."""
    day = 86_400.0
    summary = (
        "The player came to the shop at dusk asking about the grey cloak and the old mill. "
        "They haggled over a lantern and the oil, and the player promised to pay back the ten "
        "silver owed since the fair. She warned them about the watch and the bells at midnight "
        "and told them to keep away from the canal when the fog rolls in."
    )
    return Recall(
        turns=turn_events(npc, player, now),
        summaries=[Summary(summary, now - (3 - k) * day, f"s-{k}") for k in range(3)],
        facts=[
            Fact(text, importance, kind, now - k * day)
            for k, (text, kind, importance) in enumerate(FACTS)
        ],
        emotions=[Emotion(now - (3 - k) * day, 0.2 * k, 0.3) for k in range(3)],
        relationship=RelationshipCard(
            trust=0.4,
            affinity=0.3,
            promises=["repay ten silver", "bring herbs each week"],
            notes=["saved her son"],
            updated_at=now - day,
        ),
        quest=QuestCard(
            active=[
                Quest(id="mill-lights", title="The lights at the old mill", stage="asked around"),
                Quest(id="grey-cloak", title="The man in the grey cloak"),
            ],
            completed=["herbs"],
            updated_at=now - day,
        ),
    )


async def populate(warm: WarmStore, pairs: list[tuple[str, str]], concurrency: int = 32) -> None:
    """Write each pair's recall through the store's own writes (turns in order)."""
    now = time.time()
    gate = asyncio.Semaphore(concurrency)

    async def one(pair: tuple[str, str]) -> None:
        recall = recall_of(*pair, now)
        async with gate:
            for turn in recall.turns:
                await warm.append_turn(pair, turn)
            for summary in recall.summaries:
                await warm.add_summary(pair, summary)
            for emotion in recall.emotions:
                await warm.add_emotion(pair, emotion)
            await warm.put_facts(pair, recall.facts)
            for card in (recall.relationship, recall.quest):
                assert card is not None
                await warm.put_card(pair, card)

    async with asyncio.TaskGroup() as tasks:
        for pair in pairs:
            tasks.create_task(one(pair))


# -- services -----------------------------------------------------------------------------------


async def redis_reachable(url: str) -> str | None:
    """None when Redis answers at `url`, else why not."""
    from redis.asyncio import Redis

    client = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        await client.ping()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means: skip this part
        return f"{type(exc).__name__}: {exc}"
    finally:
        await client.aclose()


async def redis_cleanup(url: str, prefix: str) -> int:
    from redis.asyncio import Redis

    client = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10)
    deleted = 0
    try:
        keys: list[Any] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            keys.append(key)
            if len(keys) >= 1000:
                deleted += await client.delete(*keys)
                keys = []
        if keys:
            deleted += await client.delete(*keys)
    finally:
        await client.aclose()
    return deleted


def with_search_path(dsn: str, schema: str) -> str:
    """`dsn` with `search_path=schema` among its query parameters (asyncpg passes unknown
    parameters to the server as settings)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


async def pg_execute(dsn: str, sql: str) -> str | None:
    """Run `sql` on `dsn`; None when it worked, else why not."""
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn, timeout=3)
    except Exception as exc:  # noqa: BLE001 - any failure means: skip this part
        return f"{type(exc).__name__}: {exc}"
    try:
        await conn.execute(sql)
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()


class Services:
    """The Redis and PostgreSQL the run uses, with their unique key prefix and schema."""

    def __init__(self, redis_url: str, pg_dsn: str) -> None:
        tag = uuid.uuid4().hex[:10]
        self.redis_url = redis_url
        self.prefix = f"mythicbench{tag}"
        self.pg_base = pg_dsn
        self.schema = f"mythicbench_{tag}"
        self.pg_dsn = with_search_path(pg_dsn, self.schema)
        self.redis = False
        self.pg = False

    async def open(self, need_redis: bool, need_pg: bool) -> None:
        if need_redis:
            why = await redis_reachable(self.redis_url)
            self.redis = why is None
            if why:
                print(f"Redis at {self.redis_url} unreachable ({why}): skipping Redis parts")
        if need_pg:
            why = await pg_execute(self.pg_base, f"CREATE SCHEMA {self.schema}")
            self.pg = why is None
            if why:
                print(
                    f"PostgreSQL at {self.pg_base} unreachable ({why}): skipping PostgreSQL parts"
                )

    async def close(self) -> None:
        if self.redis:
            deleted = await redis_cleanup(self.redis_url, self.prefix)
            print(f"deleted {deleted} Redis keys {self.prefix}:*")
        if self.pg:
            why = await pg_execute(self.pg_base, f"DROP SCHEMA {self.schema} CASCADE")
            print(f"dropped schema {self.schema}" + (f" FAILED: {why}" if why else ""))


# -- hot ----------------------------------------------------------------------------------------


def timed_calls(keys: list[Any], call: Callable[[Any], object]) -> list[float]:
    """Nanoseconds of each `call(key)`."""
    clock = time.perf_counter_ns
    out = []
    for key in keys:
        t0 = clock()
        call(key)
        out.append(float(clock() - t0))
    return out


async def bench_hot(work: Path, n_pairs: int, samples: int) -> dict[str, Any]:
    settings = MemorySettings(data_dir=work / "hot")
    memory = Memory(settings)
    now = time.time()
    pairs = [(npc_of(i), f"player{i}") for i in range(n_pairs)]
    for pair in pairs:
        memory.hot.load(pair, recall_of(*pair, now))
    hot: HotMemory = memory.hot
    assert len(hot) == n_pairs, "the hot tier evicted entries: raise hot_max_bytes"
    plain = {pair: hot.get(pair) for pair in pairs}
    rng = random.Random(1)
    keys = [rng.choice(pairs) for _ in range(samples)]
    sample = memory.context(*pairs[0], session_id="s-now")
    assert sample, "no context rendered"

    def context(pair: tuple[str, str]) -> object:
        return memory.context(*pair, session_id="s-now")

    rows: dict[str, Any] = {}
    for name, call in (
        ("dict.get", plain.get),
        ("HotMemory.get", hot.get),
        ("Memory.context", context),
    ):
        timed_calls(keys[: samples // 10], call)  # warm up
        rows[name] = latency(timed_calls(keys, call), 1e-3)  # ns -> us
    base = rows["dict.get"]
    for row in rows.values():
        row["x_p50"] = ratio(row["p50"], base["p50"])
        row["x_p99"] = ratio(row["p99"], base["p99"])
    await memory.aclose()
    return {
        "pairs": n_pairs,
        "samples": samples,
        "hot_bytes_per_pair": hot.bytes / n_pairs,
        "context_chars": len(sample),
        "rows": rows,
    }


def print_hot(result: dict[str, Any]) -> None:
    print()
    print(
        f"hot reads: {result['pairs']} pairs x 16 turns + 5 facts + 3 summaries + cards "
        f"({result['hot_bytes_per_pair']:.0f} B each), {result['samples']} calls each, "
        f"context {result['context_chars']} chars"
    )
    header = (
        f"{'call':16} {'p50 us':>8} {'p99 us':>8} {'max us':>8} {'mean us':>8} "
        f"{'x p50':>7} {'x p99':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, r in result["rows"].items():
        print(
            f"{name:16} {r['p50']:>8.2f} {r['p99']:>8.2f} {r['max']:>8.1f} {r['mean']:>8.2f} "
            f"{fmt(r['x_p50'], '.1f'):>7} {fmt(r['x_p99'], '.1f'):>7}"
        )
    print("(each call timed alone; x = against dict.get of the same keys, timed the same way)")


# -- warm ---------------------------------------------------------------------------------------


async def prefetch_round(
    settings: MemorySettings,
    warm: WarmStore,
    cold: ColdStore,
    pairs: list[tuple[str, str]],
    concurrency: int,
) -> tuple[list[float], int, int]:
    """Prefetch every pair into a fresh Memory, `concurrency` at a time; seconds of each,
    timeouts, and pairs that did not come back whole."""
    memory = Memory(settings, warm=warm, cold=cold)
    times: list[float] = []
    incomplete = 0

    async def one(pair: tuple[str, str]) -> None:
        nonlocal incomplete
        start = time.perf_counter()
        entry = await memory.prefetch(*pair)
        times.append(time.perf_counter() - start)
        if len(entry.turns) != 16 or len(entry.facts) != 5 or not entry.quest.active:
            incomplete += 1

    for i in range(0, len(pairs), concurrency):
        await asyncio.gather(*(one(p) for p in pairs[i : i + concurrency]))
    return times, memory.stats.prefetch_timeouts, incomplete


async def bench_warm_store(
    label: str,
    settings: MemorySettings,
    n_pairs: int,
    rounds: int,
    concurrencies: list[int],
) -> dict[int, dict[str, Any]]:
    clock = SystemClock()
    warm = open_warm(settings, clock)
    cold = SqliteCold(settings.data_dir / "archive.sqlite3")  # never written: not started
    pairs = [(npc_of(i), f"warm-{label}-{i}") for i in range(n_pairs)]
    try:
        start = time.perf_counter()
        await populate(warm, pairs)
        if isinstance(warm, FallbackWarm) and not warm.up:
            raise RuntimeError(f"Redis failed while populating: the {label} numbers are void")
        print(f"  {label}: populated {n_pairs} pairs in {time.perf_counter() - start:.1f} s")
        out = {}
        rng = random.Random(2)
        for concurrency in concurrencies:
            # Warm up at this concurrency: the client's connections are open before the clock.
            warmup = pairs[: min(n_pairs, max(50, 4 * concurrency))]
            await prefetch_round(settings, warm, cold, warmup, concurrency)
            times: list[float] = []
            timeouts = incomplete = 0
            for _ in range(rounds):
                order = pairs[:]
                rng.shuffle(order)
                t, timed_out, broken = await prefetch_round(
                    settings, warm, cold, order, concurrency
                )
                times += t
                timeouts += timed_out
                incomplete += broken
            row = latency(times, 1e3)  # s -> ms
            row.update(timeouts=timeouts, incomplete=incomplete, concurrency=concurrency)
            out[concurrency] = row
            print(
                f"  {label} x{concurrency}: p50 {row['p50']:.2f} ms, p95 {row['p95']:.2f} ms, "
                f"{timeouts} timeouts"
            )
        if isinstance(warm, FallbackWarm) and not warm.up:
            raise RuntimeError(f"Redis failed while prefetching: the {label} numbers are void")
        return out
    finally:
        await warm.aclose()
        await cold.aclose()


async def bench_warm(
    work: Path, services: Services, n_pairs: int, rounds: int, concurrency: int
) -> dict[str, Any]:
    concurrencies = [1] if concurrency <= 1 else [1, concurrency]
    stores: dict[str, dict[int, dict[str, Any]]] = {}
    embedded = MemorySettings(data_dir=work / "warm-sqlite")
    stores["sqlite"] = await bench_warm_store("sqlite", embedded, n_pairs, rounds, concurrencies)
    if services.redis:
        redis = MemorySettings(
            data_dir=work / "warm-redis",
            warm_url=services.redis_url,
            warm_prefix=services.prefix,
        )
        stores["redis"] = await bench_warm_store("redis", redis, n_pairs, rounds, concurrencies)
    rows = []
    for concurrency in concurrencies:
        base = stores["sqlite"][concurrency]
        for name, by_c in stores.items():
            row = {"store": name, **by_c[concurrency]}
            row["x_p50"] = ratio(row["p50"], base["p50"])
            row["x_p95"] = ratio(row["p95"], base["p95"])
            rows.append(row)
    redis_p95 = stores["redis"][1]["p95"] if "redis" in stores else None
    return {
        "pairs": n_pairs,
        "rounds": rounds,
        "rows": rows,
        "redis_p95_ms": redis_p95,
        "target_met": None if redis_p95 is None else redis_p95 < PREFETCH_P95_TARGET_MS,
    }


def print_warm(result: dict[str, Any]) -> None:
    print()
    print(
        f"warm prefetch (Memory.prefetch of a pair not yet hot): {result['pairs']} pairs x "
        f"{result['rounds']} rounds, fresh Memory each round"
    )
    header = (
        f"{'store':8} {'conc':>4} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'timeouts':>8} {'x p50':>6} {'x p95':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        print(
            f"{r['store']:8} {r['concurrency']:>4} {r['p50']:>8.2f} {r['p95']:>8.2f} "
            f"{r['p99']:>8.2f} {r['max']:>8.2f} {r['timeouts']:>8} "
            f"{fmt(r['x_p50'], '.2f'):>6} {fmt(r['x_p95'], '.2f'):>6}"
        )
    incomplete = sum(r["incomplete"] for r in result["rows"])
    if incomplete:
        print(f"WARNING: {incomplete} prefetches did not bring back the whole pair")
    print("(conc = prefetches at once; x = against the embedded SQLite store at the same conc)")
    if result["redis_p95_ms"] is not None:
        verdict = "met" if result["target_met"] else "NOT met"
        print(
            f"Redis prefetch p95 one at a time: {result['redis_p95_ms']:.2f} ms "
            f"(target < {PREFETCH_P95_TARGET_MS:.0f} ms): {verdict}"
        )


# -- archive ------------------------------------------------------------------------------------


async def archive_run(
    cold: ColdStore, spool: Path, n_events: int, settings: MemorySettings, tag: str
) -> dict[str, Any]:
    """Submit `n_events` and time until the archiver has stored them."""
    now = time.time()
    events = [
        MemoryEvent.new(
            "turn",
            npc_of(i),
            f"arch-{tag}-{i % 500}",
            now + i * 1e-4,
            (PLAYER_LINES if i % 2 == 0 else NPC_LINES)[i % 6],
            session_id=f"s-{tag}-{i % 500}",
            role="player" if i % 2 == 0 else "npc",
        )
        for i in range(n_events)
    ]
    before = await cold.count()
    archiver = Archiver(
        cold,
        spool,
        flush_s=settings.flush_s,
        batch=settings.batch,
        timeout_s=settings.cold_timeout_s,
        retry_s=settings.retry_s,
    )
    archiver.start()
    stats = archiver.stats
    start = time.perf_counter()
    for i in range(0, n_events, CHUNK):
        for event in events[i : i + CHUNK]:
            archiver.submit(event)
        await asyncio.sleep(0)
    submitted_s = time.perf_counter() - start
    max_pending = archiver.pending
    # Polled: the archiver's own task is what is measured, and it signals nothing when done.
    while stats.written + stats.duplicates + stats.spooled < n_events:  # noqa: ASYNC110
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - start
    await archiver.aclose()
    stored = await cold.count() - before
    return {
        "events": n_events,
        "seconds": elapsed,
        "events_s": n_events / elapsed,
        "submit_s": submitted_s,
        "pending_after_submit": max_pending,
        "batches": stats.batches,
        "spooled": stats.spooled,
        "stored": stored,
    }


async def bench_archive(
    work: Path, services: Services, n_events: int, rounds: int, batch: int | None
) -> dict[str, Any]:
    settings = MemorySettings(data_dir=work / "archive")
    if batch is not None:
        settings = settings.model_copy(update={"batch": batch})
    opened: dict[str, ColdStore] = {"sqlite": SqliteCold(work / "archive" / "archive.sqlite3")}
    if services.pg:
        opened["postgres"] = PostgresCold(services.pg_dsn)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in opened}
    try:
        for cold in opened.values():
            await cold.migrate()
        for r in range(rounds):
            names = list(opened) if r % 2 == 0 else list(opened)[::-1]
            for name in names:
                run = await archive_run(
                    opened[name], work / "archive" / f"spool-{name}", n_events, settings, f"{r}"
                )
                runs[name].append(run)
                print(
                    f"  {name} round {r}: {run['events_s']:,.0f} events/s "
                    f"({run['seconds']:.2f} s, {run['batches']} batches, {run['spooled']} spooled, "
                    f"{run['stored']} stored)"
                )
    finally:
        for cold in opened.values():
            await cold.aclose()
    rows = []
    for name, done in runs.items():
        rows.append(
            {
                "store": name,
                "events_s": statistics.median(r["events_s"] for r in done),
                "seconds": statistics.median(r["seconds"] for r in done),
                "submit_s": statistics.median(r["submit_s"] for r in done),
                "spooled": sum(r["spooled"] for r in done),
                "stored": sum(r["stored"] for r in done),
                "events": sum(r["events"] for r in done),
                "runs": done,
            }
        )
    base = rows[0]
    for row in rows:
        row["x_events_s"] = ratio(row["events_s"], base["events_s"])
    return {
        "events": n_events,
        "rounds": rounds,
        "batch": settings.batch,
        "flush_s": settings.flush_s,
        "rows": rows,
    }


def print_archive(result: dict[str, Any]) -> None:
    print()
    print(
        f"archiver sustained throughput: {result['events']} events x {result['rounds']} rounds, "
        f"batch {result['batch']}, flush {result['flush_s']} s"
    )
    header = (
        f"{'archive':9} {'events/s':>10} {'s':>7} {'submit s':>8} {'stored':>8} "
        f"{'spooled':>8} {'x ev/s':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        print(
            f"{r['store']:9} {r['events_s']:>10,.0f} {r['seconds']:>7.2f} {r['submit_s']:>8.3f} "
            f"{r['stored']:>8} {r['spooled']:>8} {fmt(r['x_events_s'], '.2f'):>7}"
        )
    print("(medians over rounds; stored = rows counted after; x = against the SQLite archive)")
    for r in result["rows"]:
        if r["spooled"] or r["stored"] != r["events"]:
            print(
                f"WARNING: {r['store']}: {r['spooled']} spooled, {r['stored']} of "
                f"{r['events']} stored: the rate is not the database's"
            )


# -- turns --------------------------------------------------------------------------------------


LIVE: list[Memory] = []
"""The turns part's started `Memory`, for the watchdog's report."""


class DroppingArchiver(Archiver):
    """The archiver off: `submit` drops the event."""

    def submit(self, event: MemoryEvent) -> None:
        del event
        self.stats.submitted += 1


async def turns_run(
    settings: MemorySettings, archive: bool, n_turns: int, n_pairs: int, tag: str
) -> dict[str, Any]:
    memory = Memory(settings)
    if not archive:
        real = memory.archiver
        memory.archiver = DroppingArchiver(
            real.cold, real.spool.path.parent, flush_s=real.flush_s, batch=real.batch
        )
    await memory.start()
    LIVE[:] = [memory]
    pairs = [(npc_of(i), f"turns-{tag}-{i}") for i in range(n_pairs)]
    session = f"s-{tag}"
    per_turn: list[float] = []
    clock = time.perf_counter_ns
    try:
        start, cpu = time.perf_counter(), time.process_time()
        for t in range(n_turns):
            npc, player = pairs[t % n_pairs]
            t0 = clock()
            memory.record_turn(npc, player, session, "player", PLAYER_LINES[t % 6])
            memory.context(npc, player, session_id=session)
            memory.record_turn(npc, player, session, "npc", NPC_LINES[t % 6])
            per_turn.append(float(clock() - t0))
            await asyncio.sleep(0)
        loop_s = time.perf_counter() - start
        loop_cpu_s = time.process_time() - cpu
        backlog = {"warm": len(memory._warm_ops), "archive": memory.archiver.pending}
        await memory.settle()
        settled_s = time.perf_counter() - start
        warm_up = not isinstance(memory.warm, FallbackWarm) or memory.warm.up
        stats = memory.archiver.stats
        result = {
            "turns": n_turns,
            "loop_turns_s": n_turns / loop_s,
            "settled_turns_s": n_turns / settled_s,
            "loop_s": loop_s,
            "loop_cpu_us_per_turn": 1e6 * loop_cpu_s / n_turns,
            "settle_s": settled_s - loop_s,
            "backlog_at_loop_end": backlog,
            "turn_us": latency(per_turn, 1e-3),
            "archived": stats.written,
            "spooled": stats.spooled,
            "summaries": memory.stats.summaries,
            "warm_errors": memory.stats.warm_errors,
            "warm_store_up": warm_up,
        }
    finally:
        await memory.aclose()
        LIVE.clear()
    return result


async def bench_turns(
    work: Path, services: Services, n_turns: int, n_pairs: int, rounds: int
) -> dict[str, Any]:
    settings = MemorySettings(
        data_dir=work / "turns",
        warm_url=services.redis_url if services.redis else None,
        warm_prefix=services.prefix,
        cold_url=services.pg_dsn if services.pg else None,
    )
    warm = "redis" if services.redis else "sqlite"
    cold = "postgres" if services.pg else "sqlite"
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for r in range(rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for mode in order:
            run = await turns_run(settings, mode == "on", n_turns, n_pairs, f"{mode}{r}")
            runs[mode].append(run)
            print(
                f"  archiver {mode:3} round {r}: {run['loop_turns_s']:,.0f} turns/s in the loop, "
                f"{run['settled_turns_s']:,.0f} settled, "
                f"backlog at loop end {run['backlog_at_loop_end']}"
            )
    rows = []
    for mode, done in runs.items():
        rows.append(
            {
                "archiver": mode,
                "loop_turns_s": statistics.median(r["loop_turns_s"] for r in done),
                "settled_turns_s": statistics.median(r["settled_turns_s"] for r in done),
                "turn_p50_us": statistics.median(r["turn_us"]["p50"] for r in done),
                "turn_p99_us": statistics.median(r["turn_us"]["p99"] for r in done),
                "loop_cpu_us_per_turn": statistics.median(r["loop_cpu_us_per_turn"] for r in done),
                "archived": sum(r["archived"] for r in done),
                "spooled": sum(r["spooled"] for r in done),
                "warm_errors": sum(r["warm_errors"] for r in done),
                "runs": done,
            }
        )
    base = rows[0]
    for row in rows:
        row["x_loop"] = ratio(row["loop_turns_s"], base["loop_turns_s"])
        row["x_settled"] = ratio(row["settled_turns_s"], base["settled_turns_s"])
    return {
        "turns": n_turns,
        "pairs": n_pairs,
        "rounds": rounds,
        "warm": warm,
        "cold": cold,
        "rows": rows,
        "on_off_loop": rows[1]["x_loop"],
    }


def print_turns(result: dict[str, Any]) -> None:
    print()
    print(
        f"turns with the archiver on against off: {result['turns']} turns over "
        f"{result['pairs']} pairs x {result['rounds']} rounds, warm {result['warm']}, "
        f"cold {result['cold']}"
    )
    header = (
        f"{'archiver':8} {'loop t/s':>9} {'settled':>9} {'p50 us':>7} {'p99 us':>7} "
        f"{'cpu us':>7} {'archived':>9} {'spooled':>7} {'x loop':>7} {'x settled':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in result["rows"]:
        print(
            f"{r['archiver']:8} {r['loop_turns_s']:>9,.0f} {r['settled_turns_s']:>9,.0f} "
            f"{r['turn_p50_us']:>7.1f} {r['turn_p99_us']:>7.1f} "
            f"{r['loop_cpu_us_per_turn']:>7.1f} {r['archived']:>9} "
            f"{r['spooled']:>7} {fmt(r['x_loop'], '.2f'):>7} {fmt(r['x_settled'], '.2f'):>9}"
        )
    print(
        "(turn = record_turn + context + record_turn, then a yield; p50/p99: those calls; "
        "cpu: this process's CPU time in the loop per turn, every task and thread; "
        "settled: until warm and archive are done; x = against the archiver off; medians)"
    )


# -- main ---------------------------------------------------------------------------------------


def report_stuck(part: str, limit_s: float) -> None:
    """What every task waits on, and the state of a live Memory's background workers."""
    print(f"{part} did not finish in {limit_s:.0f} s; the tasks and where they wait:")
    for task in asyncio.all_tasks():
        print(f"-- {task.get_name()}")
        task.print_stack(limit=12, file=sys.stdout)
    for memory in LIVE:
        workers = [
            (t.get_name(), "done" if t.done() else "running")
            + ((repr(t.exception()),) if t.done() and not t.cancelled() else ())
            for t in memory._tasks
        ]
        print(
            f"memory workers: {workers}; warm idle {memory._warm_idle.is_set()} "
            f"({len(memory._warm_ops)} queued); summaries idle {memory._summary_idle.is_set()} "
            f"({len(memory._summary_queue)} queued); archiver {memory.archiver.pending} pending"
        )
    sys.stdout.flush()


async def run_part(part: str, step: Awaitable[dict[str, Any]], limit_s: float) -> dict[str, Any]:
    """`step`'s result, or {"error": ...} when it raised or ran past `limit_s` (then what it
    waits on is printed first)."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=limit_s)
    if not done:
        report_stuck(part, limit_s)
        task.cancel()
        await asyncio.wait({task}, timeout=15)
        return {"error": f"timeout: not done in {limit_s:.0f} s"}
    try:
        return task.result()
    except Exception as exc:  # noqa: BLE001 - report it and go on with the rest
        return {"error": f"{type(exc).__name__}: {exc}"}


async def bench(args: argparse.Namespace, parts: list[str]) -> dict[str, Any]:
    services = Services(args.redis_url, args.pg_dsn)
    await services.open(
        need_redis="warm" in parts or "turns" in parts,
        need_pg="archive" in parts or "turns" in parts,
    )
    results: dict[str, Any] = {}
    printers: dict[str, Callable[[dict[str, Any]], None]] = {
        "hot": print_hot,
        "warm": print_warm,
        "archive": print_archive,
        "turns": print_turns,
    }
    with tempfile.TemporaryDirectory(prefix="mythic-bench-memory-") as tmp:
        work = Path(tmp)
        steps: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            "hot": lambda: bench_hot(work, args.pairs, args.hot_samples),
            "warm": lambda: bench_warm(
                work, services, args.warm_pairs, args.warm_rounds, args.concurrency
            ),
            "archive": lambda: bench_archive(
                work, services, args.events, args.archive_rounds, args.batch
            ),
            "turns": lambda: bench_turns(
                work, services, args.turns, args.turn_pairs, args.turn_rounds
            ),
        }
        try:
            for part in parts:
                print(f"{part} ...")
                results[part] = await run_part(part, steps[part](), args.part_timeout)
                if "error" in results[part]:
                    print(f"{part} FAILED: {results[part]['error']}")
        finally:
            await services.close()
    for part in parts:
        if "error" not in results[part]:
            printers[part](results[part])
    results["services"] = {
        "redis": services.redis_url if services.redis else None,
        "postgres": services.pg_base if services.pg else None,
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(PARTS), help="parts: hot,warm,archive,turns")
    parser.add_argument("--pairs", type=int, default=1000, help="hot: NPCxplayer entries")
    parser.add_argument("--hot-samples", type=int, default=20_000, help="hot: calls timed each")
    parser.add_argument("--warm-pairs", type=int, default=1000, help="warm: pairs stored")
    parser.add_argument("--warm-rounds", type=int, default=3, help="warm: prefetches of each")
    parser.add_argument("--concurrency", type=int, default=16, help="warm: prefetches at once")
    parser.add_argument("--events", type=int, default=50_000, help="archive: events per run")
    parser.add_argument("--archive-rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, help="archive: batch size (default: the setting's)")
    parser.add_argument("--turns", type=int, default=8000, help="turns: turns per run")
    parser.add_argument("--turn-pairs", type=int, default=200, help="turns: pairs talked to")
    parser.add_argument("--turn-rounds", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("MYTHIC_TEST_REDIS_URL", REDIS_URL))
    parser.add_argument("--pg-dsn", default=os.environ.get("MYTHIC_TEST_POSTGRES_DSN", PG_DSN))
    parser.add_argument("--part-timeout", type=float, default=300.0, help="seconds a part may take")
    parser.add_argument("--quick", action="store_true", help="a smoke run of about 20 s")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.hot_samples = 300, 10_000
        args.warm_pairs, args.warm_rounds = 300, 1
        args.events, args.archive_rounds = 20_000, 1
        args.turns, args.turn_pairs, args.turn_rounds = 2000, 50, 1
        args.part_timeout = min(args.part_timeout, 90.0)
    parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}; parts are {', '.join(PARTS)}")

    start = time.perf_counter()
    results = asyncio.run(bench(args, parts))
    print(f"({time.perf_counter() - start:.0f} s in all)")
    failed = [p for p in parts if "error" in results[p]]
    write_results(
        RESULTS,
        ROOT,
        results=results,
        benchmark="memory",
        baseline={
            "hot": "dict.get of the same keys, timed the same way",
            "warm": "the embedded SQLite warm store at the same concurrency",
            "archive": "the embedded SQLite archive",
            "turns": "the same Memory with the archiver off (submit drops the event)",
        },
        quick=args.quick,
        parts=parts,
        target={"redis_prefetch_p95_ms": PREFETCH_P95_TARGET_MS, "turns_on_off": 1.0},
    )
    if failed and len(failed) == len(parts):
        sys.exit(1)


if __name__ == "__main__":
    main()
