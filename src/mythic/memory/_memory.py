"""`Memory`: the three tiers behind one object, as the NPC actors use them.

Writes go to hot synchronously, to warm through an ordered background writer, and to cold
through the archiver; nothing a turn calls awaits the warm or cold tier except `prefetch`,
once per conversation and bounded by `prefetch_timeout_s`. Prompts are built from hot only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mythic.config import MemorySettings
from mythic.memory._archiver import Archiver
from mythic.memory._clock import DAY_S, Clock, SystemClock
from mythic.memory._cold import ColdStore, HistoryQuery, MigrationError, open_cold
from mythic.memory._hot import HotEntry, HotMemory, Pair
from mythic.memory._model import (
    Emotion,
    Fact,
    MemoryEvent,
    MemoryStoreError,
    QuestCard,
    RelationshipCard,
    Summary,
    fit_card,
    merge_facts,
    parse_card,
    same_fact,
)
from mythic.memory._summarize import Writer, digest
from mythic.memory._warm import FallbackWarm, RedisWarm, SqliteWarm, WarmStore

log = logging.getLogger(__name__)

_MAX_WARM_BACKLOG = 100_000
_FACTION = "faction:"
"""The NPC id of a faction's shared memory of a player: `faction:<faction id>`."""
_WARM_PAIRS_AT_ONCE = 32


@dataclass(slots=True)
class MemoryStats:
    """Counters for /metrics and the benchmark."""

    prefetches: int = 0
    prefetch_timeouts: int = 0
    prefetch_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=2048))
    warm_errors: int = 0
    warm_dropped: int = 0
    summaries: int = 0
    summaries_by_model: int = 0


@dataclass(frozen=True, slots=True)
class NPCInfo:
    """How the summarizer names an NPC."""

    name: str
    about: str


class Memory:
    """Hot, warm and cold memory of every NPCxplayer."""

    def __init__(
        self,
        settings: MemorySettings,
        *,
        clock: Clock | None = None,
        warm: WarmStore | None = None,
        cold: ColdStore | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.hot = HotMemory(
            max_turns=settings.hot_turns,
            ttl_s=settings.hot_ttl_s,
            max_bytes=settings.hot_max_bytes,
            clock=self.clock,
        )
        self.warm = warm or open_warm(settings, self.clock)
        self.cold = cold or open_cold(settings.cold_url, settings.data_dir / "archive.sqlite3")
        self.archiver = Archiver(
            self.cold,
            settings.data_dir / "spool",
            flush_s=settings.flush_s,
            batch=settings.batch,
            timeout_s=settings.cold_timeout_s,
            retry_s=settings.retry_s,
        )
        self.stats = MemoryStats()
        self.writer: Writer | None = None
        """Set by the dialogue layer: generates summaries at idle priority."""
        self.npcs: dict[str, NPCInfo] = {}
        self.game_now: dict[str, int] = {}
        """The game's time as each NPC was last told it (`set_game_time`), in minutes of the
        world's calendar: every record of the NPC carries it."""
        self.factions: dict[str, str] = {}
        """Set by the dialogue layer: each NPC's faction (its card's `faction`). What one
        member learns of a player (its salient facts) its faction knows: the others are told
        it (`faction_pair`)."""
        self.game_ago: Callable[[int, int], str] | None = None
        """Set by the dialogue layer: how long ago a game time was, in the world's calendar
        ("yesterday", "last winter": `knowledge.Calendar.ago`)."""
        self._warm_ops: deque[tuple[Pair, Callable[[], Awaitable[None]]]] = deque()
        self._warm_wake = asyncio.Event()
        self._warm_idle = asyncio.Event()
        self._warm_idle.set()
        self._summary_queue: deque[tuple[Pair, str | None]] = deque()
        self._summary_wake = asyncio.Event()
        self._summarizing: set[Pair] = set()
        self._summary_idle = asyncio.Event()
        self._summary_idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Migrate (or check) the archive and start the background writers.

        Raises:
            MigrationError: `auto_migrate` is off and the archive has no tables.
        """
        if self.settings.auto_migrate:
            try:
                applied = await self.cold.migrate()
                if applied:
                    log.info("memory archive migrated to version %d", applied[-1].version)
            except MigrationError:
                raise
            except MemoryStoreError as exc:
                # The database is down: the archiver spools until it is back.
                log.warning("memory archive not reachable at start: %s", exc)
        else:
            with contextlib.suppress(MemoryStoreError):
                await self.cold.count("_")
        self.archiver.start()
        self._tasks = [
            asyncio.create_task(self._warm_writer(), name="mythic warm writer"),
            asyncio.create_task(self._summary_worker(), name="mythic summaries"),
            asyncio.create_task(self._sweeper(), name="mythic hot sweep"),
        ]

    async def settle(self) -> None:
        """Wait until every queued warm write and summary is done and the archive flushed."""
        while True:
            await self._summary_idle.wait()
            await self._warm_idle.wait()
            await self.archiver.flush()
            if self._summary_idle.is_set() and self._warm_idle.is_set():
                return

    async def aclose(self) -> None:
        """Write what is queued (warm, archive; summaries still queued are dropped: their turns
        are in warm and cold) and close the stores."""
        self._summary_queue.clear()
        for task in self._tasks:
            if task.get_name() != "mythic warm writer":
                task.cancel()
        for task in self._tasks:
            if task.get_name() != "mythic warm writer":
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            async with asyncio.timeout(10):
                await self._warm_idle.wait()
        except TimeoutError:
            log.warning("memory: %d warm writes not done at shutdown", len(self._warm_ops))
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.archiver.aclose()
        await self.warm.aclose()
        await self.cold.aclose()

    async def __aenter__(self) -> Memory:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- writes (synchronous: never await I/O) ------------------------------------------------

    def set_game_time(self, npc_id: str, minutes: int | None) -> None:
        """The game's date and time for `npc_id` now (minutes of the world's calendar; None:
        not known): what its memories are dated with, and what their age is judged by."""
        if minutes is None:
            self.game_now.pop(npc_id, None)
        else:
            self.game_now[npc_id] = minutes

    def record_turn(
        self, npc_id: str, player_id: str, session_id: str | None, role: str, text: str
    ) -> MemoryEvent:
        """A player line (`role` "player") or an NPC reply ("npc"): to hot now, then warm and
        cold behind."""
        pair = (npc_id, player_id)
        event = MemoryEvent.new(
            "turn",
            npc_id,
            player_id,
            self.clock.now(),
            text,
            session_id=session_id,
            role=role,
            game_time=self.game_now.get(npc_id),
        )
        entry = self.hot.add_turn(pair, event)
        self._to_warm(pair, lambda: self.warm.append_turn(pair, event))
        self.archiver.submit(event)
        if len(entry.pending) >= self.settings.hot_turns:
            self.summarize(npc_id, player_id, session_id)
        return event

    def record_event(
        self,
        npc_id: str,
        player_id: str,
        session_id: str | None,
        text: str,
        *,
        data: dict[str, Any] | None = None,
        fact: Fact | None = None,
    ) -> MemoryEvent:
        """Something happened in the game (a gift, a tool call): archived, and `fact`, when
        given, merged into the salient facts."""
        pair = (npc_id, player_id)
        now = self.clock.now()
        event = MemoryEvent.new(
            "event",
            npc_id,
            player_id,
            now,
            text,
            session_id=session_id,
            data=data,
            game_time=self.game_now.get(npc_id),
        )
        self.hot.entry(pair)
        self.archiver.submit(event)
        if fact is not None:
            self._merge_facts(pair, [fact], session_id)
        return event

    def set_card(
        self,
        npc_id: str,
        player_id: str,
        card: RelationshipCard | QuestCard | dict[str, Any],
        *,
        name: str | None = None,
    ) -> RelationshipCard | QuestCard:
        """Replace a memory card (validated and fitted to 2 KB first).

        Raises:
            CardError: the card is malformed or cannot be fitted.
        """
        if isinstance(card, dict):
            card = parse_card(name or "relationship", card)
        else:
            card = fit_card(card)  # type: ignore[assignment]
        card = card.model_copy(update={"updated_at": self.clock.now()})
        pair = (npc_id, player_id)
        entry = self.hot.entry(pair)
        if isinstance(card, RelationshipCard):
            entry.relationship = card
        else:
            entry.quest = card
        self.hot.changed(pair)
        self._to_warm(pair, lambda: self.warm.put_card(pair, card))
        kind = "relationship" if isinstance(card, RelationshipCard) else "quest"
        self.archiver.submit(
            MemoryEvent.new(
                "card",
                npc_id,
                player_id,
                card.updated_at,
                data={"name": kind, "card": card.model_dump()},
                game_time=self.game_now.get(npc_id),
            )
        )
        return card

    def faction_pair(self, npc_id: str, player_id: str) -> Pair | None:
        """Where `npc_id`'s faction keeps what its members know of `player_id` (None: the NPC
        has no faction). Its own NPC id, `faction:<id>`, is no NPC's (theirs are slugs)."""
        faction = self.factions.get(npc_id)
        return None if faction is None else (f"{_FACTION}{faction}", player_id)

    def _merge_facts(
        self, pair: Pair, new: list[Fact], session_id: str | None, game_time: int | None = None
    ) -> None:
        shared = self.faction_pair(*pair)
        if shared is not None:
            # What a member learns, its faction knows: a record of its own, `faction:<id>`.
            self._merge_into(shared, new, session_id, game_time, game_npc=pair[0])
        self._merge_into(pair, new, session_id, game_time, game_npc=pair[0])

    def _merge_into(
        self,
        pair: Pair,
        new: list[Fact],
        session_id: str | None,
        game_time: int | None,
        *,
        game_npc: str,
    ) -> None:
        entry = self.hot.entry(pair)
        now = self.clock.now()
        game_now = self.game_now.get(game_npc)
        entry.facts = merge_facts(
            entry.facts,
            [f if f.game_time is not None else _dated(f, game_time) for f in new],
            now=now,
            max_facts=self.settings.max_facts,
            half_life_days=self.settings.fact_half_life_days,
            game_now=game_now,
        )
        self.hot.changed(pair)
        facts = list(entry.facts)
        self._to_warm(pair, lambda: self.warm.put_facts(pair, facts))
        self.archiver.submit(
            MemoryEvent.new(
                "fact",
                *pair,
                now,
                session_id=session_id,
                data={"name": "facts", "facts": [f.to_dict() for f in facts]},
                game_time=game_now,
            )
        )

    def _to_warm(self, pair: Pair, op: Callable[[], Awaitable[None]]) -> None:
        if len(self._warm_ops) >= _MAX_WARM_BACKLOG:
            self._warm_ops.popleft()  # the archive still has it
            self.stats.warm_dropped += 1
        self._warm_ops.append((pair, op))
        self._warm_idle.clear()
        self._warm_wake.set()

    async def _warm_writer(self) -> None:
        """Apply the queued warm writes: in order for each NPC x player, different pairs
        concurrently (up to `_WARM_PAIRS_AT_ONCE`). A failed write is logged (the archive has
        it) and the next one goes on."""
        while True:
            await self._warm_wake.wait()
            self._warm_wake.clear()
            while self._warm_ops:
                groups: dict[Pair, list[Callable[[], Awaitable[None]]]] = {}
                while self._warm_ops and (
                    len(groups) < _WARM_PAIRS_AT_ONCE or self._warm_ops[0][0] in groups
                ):
                    pair, op = self._warm_ops.popleft()
                    groups.setdefault(pair, []).append(op)
                await asyncio.gather(*(self._write_in_order(ops) for ops in groups.values()))
            self._warm_idle.set()

    async def _write_in_order(self, ops: list[Callable[[], Awaitable[None]]]) -> None:
        for op in ops:
            try:
                await op()
            except MemoryStoreError as exc:
                self.stats.warm_errors += 1
                log.warning("warm memory write failed: %s", exc)
            except Exception:  # top-level handler of a warm write: the writer must go on
                self.stats.warm_errors += 1
                log.exception("warm memory write crashed")

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(min(60.0, self.settings.hot_ttl_s / 4))
            self.hot.sweep()

    # -- reads --------------------------------------------------------------------------------

    async def prefetch(self, npc_id: str, player_id: str) -> HotEntry:
        """Move what warm holds of `npc_id`x`player_id` into hot, before a conversation's first
        reply. Waits at most `prefetch_timeout_s`; on timeout or a warm failure, hot is used as
        it is (and the load still lands when it completes)."""
        pair = (npc_id, player_id)
        shared = self.faction_pair(npc_id, player_id)
        if shared is not None and not self.hot.entry(shared).prefetched:
            # The faction's knowledge of the player, loaded beside the NPC's own, within the
            # same bound (each lands later when it is not in by then).
            own, _ = await asyncio.gather(self._prefetch(pair), self._prefetch(shared))
            return own
        return await self._prefetch(pair)

    async def _prefetch(self, pair: Pair) -> HotEntry:
        entry = self.hot.entry(pair)
        if entry.prefetched:
            return entry
        start = time.perf_counter()
        load = asyncio.ensure_future(self.warm.load(pair))
        try:
            async with asyncio.timeout(self.settings.prefetch_timeout_s):
                recall = await asyncio.shield(load)
        except TimeoutError:
            self.stats.prefetch_timeouts += 1
            log.warning("memory prefetch of %s x %s timed out; going on from hot", *pair)
            load.add_done_callback(lambda done: self._loaded(pair, done))
            return entry
        except MemoryStoreError as exc:
            log.warning("memory prefetch of %s x %s failed: %s", *pair, exc)
            return entry
        self.stats.prefetches += 1
        self.stats.prefetch_seconds.append(time.perf_counter() - start)
        entry = self.hot.load(pair, recall)
        entry.prefetched = True
        return entry

    def _loaded(self, pair: Pair, done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            self.hot.load(pair, done.result()).prefetched = True

    def recall(self, npc_id: str, player_id: str) -> HotEntry | None:
        """What hot holds of `npc_id`x`player_id` (None when nothing)."""
        return self.hot.get((npc_id, player_id))

    def context(
        self,
        npc_id: str,
        player_id: str,
        *,
        session_id: str | None = None,
        max_chars: int | None = None,
    ) -> str | None:
        """The `## Recent Memory` section for a prompt, from hot only: the relationship and
        quest cards, salient facts, recent session summaries, and the last turns of earlier
        conversations (not `session_id`'s own, which the prompt's history has). Cut to
        `max_chars` by dropping the oldest summaries, then the least salient facts."""
        entry = self.hot.get((npc_id, player_id))
        shared = self.faction_pair(npc_id, player_id)
        faction = self.hot.get(shared) if shared is not None else None
        if entry is None and faction is None:
            return None
        limit = self.settings.context_chars if max_chars is None else max_chars
        return render_context(
            entry if entry is not None else HotEntry(deque()),
            faction=faction,
            now=self.clock.now(),
            session_id=session_id,
            max_chars=limit,
            half_life_days=self.settings.fact_half_life_days,
            game_now=self.game_now.get(npc_id),
            game_ago=self.game_ago,
        )

    # -- summaries ----------------------------------------------------------------------------

    def summarize(self, npc_id: str, player_id: str, session_id: str | None) -> None:
        """Queue a summary of the turns not yet summarized (a session ended, or the history
        outgrew the hot budget). It runs in the background at idle priority."""
        pair = (npc_id, player_id)
        entry = self.hot.get(pair)
        if entry is None or not entry.pending or pair in self._summarizing:
            return
        self._summarizing.add(pair)
        self._summary_queue.append((pair, session_id))
        self._summary_idle.clear()
        self._summary_wake.set()

    async def _summary_worker(self) -> None:
        while True:
            await self._summary_wake.wait()
            self._summary_wake.clear()
            while self._summary_queue:
                pair, session_id = self._summary_queue.popleft()
                try:
                    await self._summarize(pair, session_id)
                except MemoryStoreError as exc:
                    log.warning("summary of %s x %s failed: %s", *pair, exc)
                except Exception:  # top-level handler of the summary task: the next one goes on
                    log.exception("summary of %s x %s crashed", *pair)
                finally:
                    self._summarizing.discard(pair)
            self._summary_idle.set()

    async def _summarize(self, pair: Pair, session_id: str | None) -> None:
        entry = self.hot.get(pair)
        if entry is None or not entry.pending:
            return
        turns = list(entry.pending)
        info = self.npcs.get(pair[0], NPCInfo(pair[0], "a character in a game"))
        done = await digest(
            self.writer if self.settings.summaries else None,
            turns,
            npc_name=info.name,
            npc_about=info.about,
            now=self.clock.now(),
            max_tokens=self.settings.summary_max_tokens,
        )
        now = self.clock.now()
        # Dated when its conversation was, in the game (its last dated turn), not when the
        # summary was written.
        game_time = next((t.game_time for t in reversed(turns) if t.game_time is not None), None)
        entry = self.hot.entry(pair)
        taken = {t.event_id for t in turns}
        entry.pending = [t for t in entry.pending if t.event_id not in taken]
        summary = Summary(done.summary, now, session_id, game_time)
        entry.summaries = [*entry.summaries, summary][-6:]
        emotion = Emotion(now, done.valence, done.arousal)
        entry.emotions = [*entry.emotions, emotion][-32:]
        self.hot.changed(pair)
        self._to_warm(pair, lambda: self.warm.add_summary(pair, summary))
        self._to_warm(pair, lambda: self.warm.add_emotion(pair, emotion))
        self.archiver.submit(
            MemoryEvent.new(
                "summary",
                *pair,
                now,
                done.summary,
                session_id=session_id,
                data={"turns": len(turns), "by_model": done.by_model},
                game_time=game_time,
            )
        )
        self.archiver.submit(
            MemoryEvent.new(
                "emotion",
                *pair,
                now,
                session_id=session_id,
                data={"name": "emotion", "valence": done.valence, "arousal": done.arousal},
                game_time=game_time,
            )
        )
        if done.facts:
            self._merge_facts(pair, done.facts, session_id, game_time)
        if done.by_model:
            self._update_relationship(pair, entry, done.valence, done.facts)
        self.stats.summaries += 1
        self.stats.summaries_by_model += done.by_model

    def _update_relationship(
        self, pair: Pair, entry: HotEntry, valence: float, facts: list[Fact]
    ) -> None:
        card = entry.relationship.model_copy(deep=True)
        card.affinity = round(max(-1.0, min(1.0, 0.8 * card.affinity + 0.2 * valence)), 3)
        for fact in facts:
            target = {"promise": card.promises, "betrayal": card.betrayals}.get(fact.kind)
            if target is not None and not any(same_fact(fact.text, t) for t in target):
                target.append(fact.text[:200])
            if fact.kind == "betrayal":
                card.trust = round(max(-1.0, card.trust - 0.2), 3)
            elif fact.kind in ("rescue", "gift"):
                card.trust = round(min(1.0, card.trust + 0.1), 3)
        self.set_card(*pair, card)

    # -- inspection and deletion --------------------------------------------------------------

    async def show(self, player_id: str, *, limit: int = 200) -> dict[str, Any]:
        """Everything stored about `player_id`, per tier."""
        hot = {
            npc: _entry_dict(entry)
            for (npc, player) in self.hot.pairs()
            if player == player_id and (entry := self.hot.get((npc, player))) is not None
        }
        warm: dict[str, Any] = {}
        for pair in await self.warm.pairs_of(player_id):
            recall = await self.warm.load(pair)
            warm[pair[0]] = {
                "turns": [t.to_dict() for t in recall.turns],
                "summaries": [{"text": s.text, "ts": s.ts} for s in recall.summaries],
                "facts": [f.to_dict() for f in recall.facts],
                "emotions": [
                    {"ts": e.ts, "valence": e.valence, "arousal": e.arousal}
                    for e in recall.emotions
                ],
                "relationship": recall.relationship.model_dump() if recall.relationship else None,
                "quest": recall.quest.model_dump() if recall.quest else None,
            }
        await self.archiver.flush()
        events = await self.cold.history(HistoryQuery(player_id=player_id, limit=limit))
        return {
            "player_id": player_id,
            "hot": hot,
            "warm": warm,
            "cold": {
                "events": await self.cold.count(player_id),
                "recent": [e.to_dict() for e in events[-limit:]],
            },
        }

    async def forget(self, player_id: str) -> dict[str, int]:
        """Delete everything about `player_id` in every tier (and in the spool: it is flushed
        first); the counts deleted per tier."""
        hot = self.hot.forget(player_id)
        self._summary_queue = deque(q for q in self._summary_queue if q[0][1] != player_id)
        await self._warm_idle.wait()
        pairs = await self.warm.pairs_of(player_id)
        for pair in pairs:
            await self.warm.drop(pair)
        await self.archiver.flush()
        cold = await self.cold.forget(player_id)
        return {"hot": hot, "warm": len(pairs), "cold": cold}

    async def compact(self, *, older_than_days: float = 30.0) -> int:
        """Drop superseded card, fact and emotion snapshots older than the cutoff from the
        archive (turns, events and summaries stay forever)."""
        await self.archiver.flush()
        return await self.cold.compact(self.clock.now() - older_than_days * DAY_S)


def _entry_dict(entry: HotEntry) -> dict[str, Any]:
    return {
        "turns": [t.to_dict() for t in entry.turns],
        "summaries": [{"text": s.text, "ts": s.ts} for s in entry.summaries],
        "facts": [f.to_dict() for f in entry.facts],
        "relationship": entry.relationship.model_dump(),
        "quest": entry.quest.model_dump(),
        "last_touch": entry.last_touch,
    }


def open_warm(settings: MemorySettings, clock: Clock) -> WarmStore:
    """Redis with the embedded store behind it when `warm_url` is set; else the embedded one."""
    window = settings.warm_days * DAY_S
    embedded = SqliteWarm(
        settings.data_dir / "warm.sqlite3",
        clock=clock,
        window_s=window,
        max_turns=settings.hot_turns,
    )
    url = settings.warm_url
    if url is None:
        return embedded
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise MemoryStoreError(f"memory.warm_url {url!r}: expected redis://host:port/db")
    redis = RedisWarm(
        url,
        clock=clock,
        window_s=window,
        max_turns=settings.hot_turns,
        prefix=settings.warm_prefix,
    )
    return FallbackWarm(redis, embedded)


def _dated(fact: Fact, game_time: int | None) -> Fact:
    return fact if game_time is None else dataclasses.replace(fact, game_time=game_time)


def _ago(seconds: float) -> str:
    days = int(seconds // DAY_S)
    if days <= 0:
        return "today"
    return "yesterday" if days == 1 else f"{days} days ago"


def render_context(
    entry: HotEntry,
    *,
    now: float,
    session_id: str | None,
    max_chars: int,
    half_life_days: float,
    game_now: int | None = None,
    game_ago: Callable[[int, int], str] | None = None,
    faction: HotEntry | None = None,
) -> str | None:
    """The `## Recent Memory` text of a hot entry, at most `max_chars` long. A summary the
    game dated is said as long ago in the game's calendar (`game_ago`, from `game_now`);
    facts fade by the game's days when dated (`Fact.score`). `faction`: what the NPC's
    faction knows of the player, its members' facts the NPC does not hold itself."""

    def ago(summary: Summary) -> str:
        if game_now is not None and game_ago is not None and summary.game_time is not None:
            return game_ago(summary.game_time, game_now)
        return _ago(now - summary.ts)

    rel, quest = entry.relationship, entry.quest
    head: list[str] = []
    if rel.updated_at or rel.promises or rel.betrayals:
        standing = f"trust {rel.trust:+.1f}, affinity {rel.affinity:+.1f}"
        head.append(f"How you stand with the player: {standing}.")
        if rel.promises:
            head.append("Promises: " + "; ".join(rel.promises[-3:]) + ".")
        if rel.betrayals:
            head.append("Betrayals: " + "; ".join(rel.betrayals[-3:]) + ".")
    if quest.active:
        head.append(
            "The player's quests: "
            + "; ".join(f"{q.title}" + (f" ({q.stage})" if q.stage else "") for q in quest.active)
            + "."
        )

    def dated(fact: Fact) -> str:
        if game_now is not None and game_ago is not None and fact.game_time is not None:
            return f"- {fact.text} ({game_ago(fact.game_time, game_now)})"
        return f"- {fact.text}"

    facts = [
        dated(f)
        for f in sorted(
            entry.facts, key=lambda f: f.score(now, half_life_days, game_now), reverse=True
        )
    ]
    own = [f.text for f in entry.facts]
    known = [
        dated(f)
        for f in sorted(
            faction.facts if faction is not None else [],
            key=lambda f: f.score(now, half_life_days, game_now),
            reverse=True,
        )
        if not any(same_fact(f.text, mine) for mine in own)
    ]
    summaries = [f"- {ago(s)}: {s.text}" for s in entry.summaries]
    earlier = [t for t in entry.turns if t.session_id != session_id][-4:]
    last = [
        f"- {'The player' if t.role == 'player' else 'You'}: {' '.join(t.text.split())[:200]}"
        for t in earlier
    ]
    if not (head or facts or known or summaries or last):
        return None

    def build() -> str:
        parts = ["## Recent Memory", *head]
        if facts:
            parts += ["What you remember about the player:", *facts]
        if known:
            parts += ["What your faction knows of the player (from its other members):", *known]
        if summaries:
            parts += ["Your earlier conversations:", *summaries]
        if last:
            parts += ["Last words of your previous conversation:", *last]
        return "\n".join(parts)

    text = build()
    while len(text) > max_chars and (summaries or facts or known or last):
        if len(summaries) > 1 or (summaries and not facts):
            summaries.pop(0)
        elif last:
            last.pop(0)
        elif known:
            known.pop()
        elif facts:
            facts.pop()
        text = build()
    if len(text) > max_chars:
        text = text[:max_chars].rsplit("\n", 1)[0]
    return text if text.strip() != "## Recent Memory" else None
