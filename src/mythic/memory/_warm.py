"""The warm tier: 30 days of summaries, salient facts, emotions, cards and recent turns.

`RedisWarm` is the production store, `SqliteWarm` the embedded default with the same
interface, and `FallbackWarm` puts the second behind the first: while Redis is down, writes go
to the embedded store (one warning), and when Redis answers again they are copied over.

Windows are judged by the injected clock: every read drops what is older than the window, and
Redis keys also carry a real TTL of the window length.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mythic._extras import require
from mythic.memory._clock import Clock
from mythic.memory._hot import MAX_EMOTIONS, Pair
from mythic.memory._model import (
    CARD_TYPES,
    CardError,
    CorruptRecordError,
    Emotion,
    Fact,
    MemoryEvent,
    MemoryStoreError,
    QuestCard,
    Recall,
    RelationshipCard,
    Summary,
    parse_card,
)
from mythic.memory._sqlite import SqliteWorker

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_WARM_SUMMARIES = 64
"""At most this many summaries per NPCxplayer are read back (the newest)."""


class WarmStore(Protocol):
    """What the warm tier does, whichever store holds it."""

    name: str

    async def append_turn(self, pair: Pair, event: MemoryEvent) -> None: ...
    async def add_summary(self, pair: Pair, summary: Summary) -> None: ...
    async def put_facts(self, pair: Pair, facts: list[Fact]) -> None: ...
    async def add_emotion(self, pair: Pair, emotion: Emotion) -> None: ...
    async def put_card(self, pair: Pair, card: RelationshipCard | QuestCard) -> None: ...
    async def load(self, pair: Pair) -> Recall: ...
    async def pairs_of(self, player_id: str) -> list[Pair]: ...
    async def drop(self, pair: Pair) -> None: ...
    async def ping(self) -> None: ...
    async def aclose(self) -> None: ...


def card_name(card: RelationshipCard | QuestCard) -> str:
    return "relationship" if isinstance(card, RelationshipCard) else "quest"


class _Parser:
    """Parses stored values, reporting each corrupt one (once per key) and skipping it."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.corrupt = 0
        self._reported: set[str] = set()

    def each(self, key: str, values: list[Any], parse: Callable[[Any], T]) -> list[T]:
        out = []
        for value in values:
            try:
                out.append(parse(json.loads(value)))
            except (ValueError, UnicodeDecodeError, CorruptRecordError, CardError) as exc:
                self._report(key, exc)
        return out

    def one(self, key: str, value: Any, parse: Callable[[Any], T]) -> T | None:
        if value is None:
            return None
        found = self.each(key, [value], parse)
        return found[0] if found else None

    def _report(self, key: str, exc: Exception) -> None:
        self.corrupt += 1
        if key not in self._reported:
            self._reported.add(key)
            log.warning("%s: skipping a corrupt value in %s: %s", self.store, key, exc)


def _facts(raw: Any) -> list[Fact]:
    if not isinstance(raw, list):
        raise CorruptRecordError("facts are not a list")
    return [Fact.from_dict(f) for f in raw]


def _recall(
    parser: _Parser,
    key: str,
    *,
    turns: list[Any],
    summaries: list[Any],
    facts: Any,
    emotions: list[Any],
    cards: dict[str, Any],
    since: float,
) -> Recall:
    recall = Recall(
        turns=[t for t in parser.each(key, turns, MemoryEvent.from_dict) if t.ts >= since],
        summaries=[s for s in parser.each(key, summaries, Summary.from_dict) if s.ts >= since],
        facts=[f for f in parser.one(key, facts, _facts) or [] if f.ts >= since],
        emotions=[e for e in parser.each(key, emotions, Emotion.from_dict) if e.ts >= since],
    )
    # A turn copied twice (a catch-up interrupted by a second outage) is kept once.
    recall.turns = sorted({t.event_id: t for t in recall.turns}.values(), key=_turn_order)
    for name, value in cards.items():
        card = parser.one(key, value, partial(parse_card, name))
        if card is not None and card.updated_at >= since:
            setattr(recall, name, card)
    return recall


def _turn_order(turn: MemoryEvent) -> tuple[float, str]:
    return (turn.ts, turn.event_id)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _summary(summary: Summary) -> dict[str, Any]:
    value: dict[str, Any] = {
        "text": summary.text,
        "ts": summary.ts,
        "session_id": summary.session_id,
    }
    if summary.game_time is not None:
        value["game_time"] = summary.game_time
    return value


# -- Redis ------------------------------------------------------------------------------------


class RedisWarm:
    """Warm memory in Redis (redis-py asyncio). One key per kind per NPCxplayer:

    `{prefix}:m:{npc}|{player}:turns` (list), `:summaries` and `:emotions` (sorted sets scored
    by time), `:facts` and `:card:{name}` (strings); each key's TTL is the window, renewed on
    write.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        window_s: float,
        max_turns: int,
        prefix: str = "mythic",
        timeout_s: float = 0.5,
    ) -> None:
        aioredis = require("redis.asyncio", package="redis", extra="services")
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        self.url = url
        self.clock = clock
        self.window_s = window_s
        self.max_turns = max_turns
        self.prefix = prefix
        self.parser = _Parser("redis")
        self._redis: Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
        self._errors: tuple[type[BaseException], ...] = (
            RedisError,
            OSError,
            TimeoutError,
        )

    def _key(self, pair: Pair, kind: str) -> str:
        return f"{self.prefix}:m:{pair[0]}|{pair[1]}:{kind}"

    @property
    def _ttl(self) -> int:
        return max(1, int(self.window_s))

    async def _run(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except self._errors as exc:
            raise MemoryStoreError(f"Redis at {self.url}: {what} failed: {exc}") from exc

    async def append_turn(self, pair: Pair, event: MemoryEvent) -> None:
        key = self._key(pair, "turns")
        pipe = self._redis.pipeline(transaction=True)
        pipe.rpush(key, event.to_json())
        pipe.ltrim(key, -self.max_turns, -1)
        pipe.expire(key, self._ttl)
        await self._run("append turn", pipe.execute())

    async def _zadd(self, pair: Pair, kind: str, ts: float, value: str, keep: int) -> None:
        key = self._key(pair, kind)
        pipe = self._redis.pipeline(transaction=True)
        pipe.zadd(key, {value: ts})
        pipe.zremrangebyscore(key, "-inf", f"({self.clock.now() - self.window_s}")
        pipe.zremrangebyrank(key, 0, -keep - 1)
        pipe.expire(key, self._ttl)
        await self._run(f"add to {kind}", pipe.execute())

    async def add_summary(self, pair: Pair, summary: Summary) -> None:
        value = _dumps(_summary(summary))
        await self._zadd(pair, "summaries", summary.ts, value, MAX_WARM_SUMMARIES)

    async def add_emotion(self, pair: Pair, emotion: Emotion) -> None:
        value = _dumps({"ts": emotion.ts, "valence": emotion.valence, "arousal": emotion.arousal})
        await self._zadd(pair, "emotions", emotion.ts, value, MAX_EMOTIONS)

    async def put_facts(self, pair: Pair, facts: list[Fact]) -> None:
        value = _dumps([f.to_dict() for f in facts])
        await self._run("put facts", self._redis.set(self._key(pair, "facts"), value, ex=self._ttl))

    async def put_card(self, pair: Pair, card: RelationshipCard | QuestCard) -> None:
        key = self._key(pair, f"card:{card_name(card)}")
        await self._run("put card", self._redis.set(key, card.model_dump_json(), ex=self._ttl))

    async def load(self, pair: Pair) -> Recall:
        since = self.clock.now() - self.window_s
        pipe = self._redis.pipeline(transaction=False)
        pipe.lrange(self._key(pair, "turns"), 0, -1)
        pipe.zrangebyscore(self._key(pair, "summaries"), since, "+inf")
        pipe.get(self._key(pair, "facts"))
        pipe.zrangebyscore(self._key(pair, "emotions"), since, "+inf")
        for name in CARD_TYPES:
            pipe.get(self._key(pair, f"card:{name}"))
        turns, summaries, facts, emotions, *cards = await self._run("load", pipe.execute())
        return _recall(
            self.parser,
            self._key(pair, "*"),
            turns=turns,
            summaries=summaries[-MAX_WARM_SUMMARIES:],
            facts=facts,
            emotions=emotions,
            cards=dict(zip(CARD_TYPES, cards, strict=True)),
            since=since,
        )

    async def pairs_of(self, player_id: str) -> list[Pair]:
        pattern = f"{self.prefix}:m:*|{player_id}:*"
        found: set[Pair] = set()

        async def scan() -> None:
            async for key in self._redis.scan_iter(match=pattern, count=1000):
                text = key.decode() if isinstance(key, bytes) else str(key)
                npc = text[len(self.prefix) + 3 :].split("|", 1)[0]
                found.add((npc, player_id))

        await self._run("scan", scan())
        return sorted(found)

    async def drop(self, pair: Pair) -> None:
        kinds = ["turns", "summaries", "facts", "emotions", *(f"card:{n}" for n in CARD_TYPES)]
        await self._run("delete", self._redis.delete(*(self._key(pair, k) for k in kinds)))

    async def ping(self) -> None:
        await self._run("ping", self._redis.ping())

    async def aclose(self) -> None:
        await self._redis.aclose()


# -- SQLite (embedded) ------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS warm (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    npc_id TEXT NOT NULL,
    player_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    ts REAL NOT NULL,
    value TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS warm_pair ON warm (player_id, npc_id, kind, ts);
"""


def _create_schema(db: sqlite3.Connection) -> None:
    db.executescript(_SCHEMA)


def _last(values: list[str] | None) -> str | None:
    return values[-1] if values else None


class SqliteWarm:
    """Warm memory in a SQLite file, for one machine without Redis. Same interface and windows
    as `RedisWarm`; the file is used from one worker thread, never from the event loop."""

    name = "sqlite"

    def __init__(self, path: Path, *, clock: Clock, window_s: float, max_turns: int) -> None:
        self.path = path
        self.clock = clock
        self.window_s = window_s
        self.max_turns = max_turns
        self.parser = _Parser(f"warm store {path}")
        self._worker = SqliteWorker(path, "warm store", _create_schema)

    async def _run(self, what: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._worker.run(what, fn)

    def _insert(self, db: sqlite3.Connection, pair: Pair, kind: str, ts: float, value: str) -> None:
        db.execute(
            "INSERT INTO warm (npc_id, player_id, kind, ts, value) VALUES (?, ?, ?, ?, ?)",
            (*pair, kind, ts, value),
        )

    def _keep(self, db: sqlite3.Connection, pair: Pair, kind: str, keep: int) -> None:
        since = self.clock.now() - self.window_s
        db.execute(
            "DELETE FROM warm WHERE npc_id = ? AND player_id = ? AND kind = ? AND (ts < ? OR id "
            "NOT IN (SELECT id FROM warm WHERE npc_id = ? AND player_id = ? AND kind = ? "
            "ORDER BY ts DESC, id DESC LIMIT ?))",
            (*pair, kind, since, *pair, kind, keep),
        )

    def _replace(self, db: sqlite3.Connection, pair: Pair, kind: str, value: str) -> None:
        db.execute(
            "DELETE FROM warm WHERE npc_id = ? AND player_id = ? AND kind = ?", (*pair, kind)
        )
        self._insert(db, pair, kind, self.clock.now(), value)

    async def append_turn(self, pair: Pair, event: MemoryEvent) -> None:
        def work(db: sqlite3.Connection) -> None:
            self._insert(db, pair, "turns", event.ts, event.to_json())
            self._keep(db, pair, "turns", self.max_turns)

        await self._run("append turn", work)

    async def add_summary(self, pair: Pair, summary: Summary) -> None:
        value = _dumps(_summary(summary))

        def work(db: sqlite3.Connection) -> None:
            self._insert(db, pair, "summaries", summary.ts, value)
            self._keep(db, pair, "summaries", MAX_WARM_SUMMARIES)

        await self._run("add summary", work)

    async def add_emotion(self, pair: Pair, emotion: Emotion) -> None:
        value = _dumps({"ts": emotion.ts, "valence": emotion.valence, "arousal": emotion.arousal})

        def work(db: sqlite3.Connection) -> None:
            self._insert(db, pair, "emotions", emotion.ts, value)
            self._keep(db, pair, "emotions", MAX_EMOTIONS)

        await self._run("add emotion", work)

    async def put_facts(self, pair: Pair, facts: list[Fact]) -> None:
        value = _dumps([f.to_dict() for f in facts])
        await self._run("put facts", lambda db: self._replace(db, pair, "facts", value))

    async def put_card(self, pair: Pair, card: RelationshipCard | QuestCard) -> None:
        kind = f"card:{card_name(card)}"
        value = card.model_dump_json()
        await self._run("put card", lambda db: self._replace(db, pair, kind, value))

    async def load(self, pair: Pair) -> Recall:
        since = self.clock.now() - self.window_s

        def work(db: sqlite3.Connection) -> list[tuple[str, str, float]]:
            return db.execute(
                "SELECT kind, value, ts FROM warm WHERE npc_id = ? AND player_id = ? "
                "ORDER BY ts, id",
                pair,
            ).fetchall()

        rows = await self._run("load", work)
        by_kind: dict[str, list[str]] = {}
        for kind, value, ts in rows:
            # Facts and cards are judged by their own times; lists by the row's.
            if ts >= since or kind == "facts" or kind.startswith("card:"):
                by_kind.setdefault(kind, []).append(value)
        return _recall(
            self.parser,
            f"{pair[0]}|{pair[1]}",
            turns=by_kind.get("turns", []),
            summaries=by_kind.get("summaries", [])[-MAX_WARM_SUMMARIES:],
            facts=_last(by_kind.get("facts")),
            emotions=by_kind.get("emotions", []),
            cards={n: _last(by_kind.get(f"card:{n}")) for n in CARD_TYPES},
            since=since,
        )

    async def pairs_of(self, player_id: str) -> list[Pair]:
        rows = await self._run(
            "list",
            lambda db: db.execute(
                "SELECT DISTINCT npc_id FROM warm WHERE player_id = ? ORDER BY npc_id",
                (player_id,),
            ).fetchall(),
        )
        return [(npc, player_id) for (npc,) in rows]

    async def drop(self, pair: Pair) -> None:
        await self._run(
            "delete",
            lambda db: db.execute("DELETE FROM warm WHERE npc_id = ? AND player_id = ?", pair),
        )

    async def ping(self) -> None:
        await self._run("ping", lambda db: db.execute("SELECT 1").fetchall())

    async def aclose(self) -> None:
        await self._worker.aclose()


# -- Redis with the embedded store behind it --------------------------------------------------


class FallbackWarm:
    """`primary` (Redis) while it answers; `fallback` (SQLite) while it does not.

    The first failure logs one warning and marks the primary down; writes then go to the
    fallback and their NPCxplayer pairs are remembered. A probe pings the primary every
    `probe_s`; when it answers, each remembered pair is copied from the fallback to the primary
    and dropped from the fallback, and the primary is used again.
    """

    def __init__(self, primary: WarmStore, fallback: WarmStore, *, probe_s: float = 1.0) -> None:
        self.primary = primary
        self.fallback = fallback
        self.probe_s = probe_s
        self.name = f"{primary.name}+{fallback.name}"
        self.up = True
        self.outages = 0
        self.caught_up = 0
        self._dirty: set[Pair] = set()
        self._probe: asyncio.Task[None] | None = None
        self._copying = asyncio.Lock()

    def _down(self, exc: Exception) -> None:
        if self.up:
            self.up = False
            self.outages += 1
            log.warning(
                "warm memory: %s; using the embedded store until it is back (%s)",
                exc,
                self.fallback.name,
            )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._recover(), name="mythic warm probe")

    async def _write(self, pair: Pair, op: Callable[[WarmStore], Awaitable[None]]) -> None:
        if self.up:
            try:
                await op(self.primary)
                return
            except MemoryStoreError as exc:
                self._down(exc)
        async with self._copying:  # not while a catch-up copies and drops this pair
            if self.up:  # caught up while this write waited
                try:
                    await op(self.primary)
                    return
                except MemoryStoreError as exc:
                    self._down(exc)
            self._dirty.add(pair)
            await op(self.fallback)

    async def append_turn(self, pair: Pair, event: MemoryEvent) -> None:
        await self._write(pair, lambda s: s.append_turn(pair, event))

    async def add_summary(self, pair: Pair, summary: Summary) -> None:
        await self._write(pair, lambda s: s.add_summary(pair, summary))

    async def put_facts(self, pair: Pair, facts: list[Fact]) -> None:
        await self._write(pair, lambda s: s.put_facts(pair, facts))

    async def add_emotion(self, pair: Pair, emotion: Emotion) -> None:
        await self._write(pair, lambda s: s.add_emotion(pair, emotion))

    async def put_card(self, pair: Pair, card: RelationshipCard | QuestCard) -> None:
        await self._write(pair, lambda s: s.put_card(pair, card))

    async def load(self, pair: Pair) -> Recall:
        recall = Recall()
        if self.up:
            try:
                recall = await self.primary.load(pair)
            except MemoryStoreError as exc:
                self._down(exc)
        if not self.up or pair in self._dirty:
            _merge(recall, await self.fallback.load(pair))
        return recall

    async def pairs_of(self, player_id: str) -> list[Pair]:
        found = set(await self.fallback.pairs_of(player_id))
        found.update(await self.primary.pairs_of(player_id))
        return sorted(found)

    async def drop(self, pair: Pair) -> None:
        await self.fallback.drop(pair)
        await self.primary.drop(pair)
        self._dirty.discard(pair)

    async def ping(self) -> None:
        await self.primary.ping()

    async def _recover(self) -> None:
        while True:
            await asyncio.sleep(self.probe_s)
            try:
                await self.primary.ping()
                async with self._copying:
                    for pair in sorted(self._dirty):
                        await _copy(pair, self.fallback, self.primary)
                        await self.fallback.drop(pair)
                        self._dirty.discard(pair)
                        self.caught_up += 1
                    self.up = True
            except MemoryStoreError:
                continue
            log.warning("warm memory: %s is back; caught up", self.primary.name)
            return

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self.primary.aclose()
        await self.fallback.aclose()


def _merge(into: Recall, more: Recall) -> None:
    ids = {t.event_id for t in into.turns}
    into.turns = sorted(
        [*into.turns, *(t for t in more.turns if t.event_id not in ids)],
        key=lambda t: (t.ts, t.event_id),
    )
    into.summaries = sorted({*into.summaries, *more.summaries}, key=lambda s: s.ts)
    into.emotions = sorted({*into.emotions, *more.emotions}, key=lambda e: e.ts)
    if more.facts:
        into.facts = more.facts
    for name in CARD_TYPES:
        mine, theirs = getattr(into, name), getattr(more, name)
        if theirs is not None and (mine is None or theirs.updated_at >= mine.updated_at):
            setattr(into, name, theirs)


async def _copy(pair: Pair, source: WarmStore, target: WarmStore) -> None:
    recall = await source.load(pair)
    for turn in recall.turns:
        await target.append_turn(pair, turn)
    for summary in recall.summaries:
        await target.add_summary(pair, summary)
    for emotion in recall.emotions:
        await target.add_emotion(pair, emotion)
    if recall.facts:
        await target.put_facts(pair, recall.facts)
    for card in (recall.relationship, recall.quest):
        if card is not None:
            await target.put_card(pair, card)
