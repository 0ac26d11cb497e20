"""The hot tier: in-process, synchronous, what every prompt is built from."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from mythic.memory._clock import Clock
from mythic.memory._model import (
    Emotion,
    Fact,
    MemoryEvent,
    QuestCard,
    Recall,
    RelationshipCard,
    Summary,
)

Pair = tuple[str, str]
"""(npc_id, player_id)"""

_OVERHEAD = 160
"""Bytes counted per stored item on top of its text: a rough cost of the Python objects."""
MAX_SUMMARIES = 6
MAX_EMOTIONS = 32


@dataclass(slots=True)
class HotEntry:
    """What one NPC remembers of one player right now."""

    turns: deque[MemoryEvent]
    """The last 12-20 turns (player lines and NPC replies), oldest first."""
    relationship: RelationshipCard = field(default_factory=RelationshipCard)
    quest: QuestCard = field(default_factory=QuestCard)
    summaries: list[Summary] = field(default_factory=list)
    """The most recent session summaries, oldest first."""
    facts: list[Fact] = field(default_factory=list)
    """Salient facts, most salient first."""
    emotions: list[Emotion] = field(default_factory=list)
    last_touch: float = 0.0
    pending: list[MemoryEvent] = field(default_factory=list)
    """Turns not yet in a summary, for the summarizer."""
    size: int = 0
    prefetched: bool = False
    """Warm has been loaded into this entry since it was created."""

    def measure(self) -> int:
        texts = sum(len(t.text) for t in self.turns) + sum(len(t.text) for t in self.pending)
        texts += sum(len(s.text) for s in self.summaries) + sum(len(f.text) for f in self.facts)
        items = len(self.turns) + len(self.pending) + len(self.summaries) + len(self.facts)
        items += len(self.emotions)
        self.size = texts + _OVERHEAD * items + self.relationship.size() + self.quest.size()
        return self.size


class HotMemory:
    """Per NPCxplayer entries under a TTL after the last interaction and an LRU bound on their
    total size. Every method is synchronous and never touches I/O."""

    def __init__(self, *, max_turns: int, ttl_s: float, max_bytes: int, clock: Clock) -> None:
        self.max_turns = max_turns
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._entries: OrderedDict[Pair, HotEntry] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self.expirations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, pair: Pair) -> bool:
        return self.get(pair) is not None

    def pairs(self) -> list[Pair]:
        return list(self._entries)

    def get(self, pair: Pair) -> HotEntry | None:
        """The entry of `pair`, or None when absent or idle for longer than the TTL."""
        entry = self._entries.get(pair)
        if entry is None:
            return None
        if self.clock.now() - entry.last_touch > self.ttl_s:
            self._drop(pair)
            self.expirations += 1
            return None
        self._entries.move_to_end(pair)
        return entry

    def entry(self, pair: Pair) -> HotEntry:
        """The entry of `pair`, created empty when missing; touched (its TTL restarts)."""
        entry = self.get(pair)
        if entry is None:
            entry = HotEntry(deque(maxlen=self.max_turns))
            self._entries[pair] = entry
        entry.last_touch = self.clock.now()
        return entry

    def add_turn(self, pair: Pair, event: MemoryEvent) -> HotEntry:
        entry = self.entry(pair)
        entry.turns.append(event)
        entry.pending.append(event)
        if len(entry.pending) > 4 * self.max_turns:
            del entry.pending[: -4 * self.max_turns]  # no summarizer kept up: warm has them
        self._resized(pair, entry)
        return entry

    def load(self, pair: Pair, recall: Recall) -> HotEntry:
        """Fill `pair` from what the warm tier returned; turns already here are kept once."""
        entry = self.entry(pair)
        have = {t.event_id for t in entry.turns}
        older = [t for t in recall.turns if t.event_id not in have]
        merged = sorted([*older, *entry.turns], key=lambda t: (t.ts, t.event_id))
        entry.turns = deque(merged[-self.max_turns :], maxlen=self.max_turns)
        if recall.relationship is not None and (
            recall.relationship.updated_at >= entry.relationship.updated_at
        ):
            entry.relationship = recall.relationship
        if recall.quest is not None and recall.quest.updated_at >= entry.quest.updated_at:
            entry.quest = recall.quest
        summaries = {(s.ts, s.text): s for s in [*recall.summaries, *entry.summaries]}
        entry.summaries = sorted(summaries.values(), key=lambda s: s.ts)[-MAX_SUMMARIES:]
        if recall.facts:
            entry.facts = recall.facts
        emotions = {e.ts: e for e in [*recall.emotions, *entry.emotions]}
        entry.emotions = sorted(emotions.values(), key=lambda e: e.ts)[-MAX_EMOTIONS:]
        self._resized(pair, entry)
        return entry

    def changed(self, pair: Pair) -> None:
        """Call after changing an entry's cards, facts or summaries in place."""
        entry = self._entries.get(pair)
        if entry is not None:
            self._resized(pair, entry)

    def sweep(self) -> int:
        """Drop every entry idle for longer than the TTL; how many."""
        now = self.clock.now()
        stale = [p for p, e in self._entries.items() if now - e.last_touch > self.ttl_s]
        for pair in stale:
            self._drop(pair)
        self.expirations += len(stale)
        return len(stale)

    def forget(self, player_id: str) -> int:
        pairs = [p for p in self._entries if p[1] == player_id]
        for pair in pairs:
            self._drop(pair)
        return len(pairs)

    def _drop(self, pair: Pair) -> None:
        entry = self._entries.pop(pair)
        self.bytes -= entry.size

    def _resized(self, pair: Pair, entry: HotEntry) -> None:
        before = entry.size
        self.bytes += entry.measure() - before
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            if oldest == pair:
                self._entries.move_to_end(pair)
                oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1
