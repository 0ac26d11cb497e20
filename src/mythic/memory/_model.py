"""What the memory tiers hold: events, memory cards, salient facts, summaries, emotions."""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from mythic._errors import MythicError
from mythic.memory._clock import DAY_S, GAME_MINUTES_PER_DAY

log = logging.getLogger(__name__)

CARD_MAX_BYTES = 2048
"""A relationship or quest card is at most this many bytes of JSON (design 003)."""
SUMMARY_MIN_CHARS = 300
SUMMARY_MAX_CHARS = 600
MAX_FACT_CHARS = 200

EventKind = Literal["turn", "event", "summary", "fact", "card", "emotion"]
FactKind = Literal["gift", "insult", "rescue", "promise", "betrayal", "quest", "trade", "other"]
FACT_KINDS: tuple[str, ...] = FactKind.__args__  # type: ignore[attr-defined]


_SEQUENCE = itertools.count()


class MemoryStoreError(MythicError):
    """A memory tier failed: the message says which and why."""

    retryable = True


class CardError(MythicError):
    """A memory card is malformed, or cannot be trimmed to its size limit."""


class CorruptRecordError(MythicError):
    """A stored record (a Redis value, a spool line, a table row) does not parse."""


@dataclass(frozen=True, slots=True)
class MemoryEvent:
    """One append-only record of an NPCxplayer history: the unit of the cold archive.

    `event_id` is unique and stable, so writing an event twice (a spool replayed after a
    crash) stores it once.
    """

    event_id: str
    kind: EventKind
    npc_id: str
    player_id: str
    ts: float
    text: str = ""
    session_id: str | None = None
    role: str | None = None
    """For turns: `player` or `npc`."""
    data: dict[str, Any] | None = None
    game_time: int | None = None
    """When it happened in the game's calendar, in minutes (`knowledge.Calendar.minutes`);
    None when the game has not told the NPC the date."""

    @classmethod
    def new(
        cls,
        kind: EventKind,
        npc_id: str,
        player_id: str,
        ts: float,
        text: str = "",
        *,
        session_id: str | None = None,
        role: str | None = None,
        data: dict[str, Any] | None = None,
        game_time: int | None = None,
    ) -> MemoryEvent:
        # Time-ordered ids: sorting by id sorts by creation (the counter orders events of one
        # process within a microsecond); the random part keeps processes apart.
        event_id = f"{int(ts * 1_000_000):014x}-{next(_SEQUENCE):08x}-{uuid.uuid4().hex[:12]}"
        return cls(event_id, kind, npc_id, player_id, ts, text, session_id, role, data, game_time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, raw: Any) -> MemoryEvent:
        """Raises: CorruptRecordError: `raw` is not an event."""
        try:
            if not isinstance(raw, dict):
                raise TypeError(f"expected an object, got {type(raw).__name__}")
            data = raw.get("data")
            event = cls(
                event_id=_str(raw["event_id"]),
                kind=raw["kind"],
                npc_id=_str(raw["npc_id"]),
                player_id=_str(raw["player_id"]),
                ts=float(raw["ts"]),
                text=_str(raw.get("text", "")),
                session_id=_opt_str(raw.get("session_id")),
                role=_opt_str(raw.get("role")),
                data=data if isinstance(data, dict) else None,
                game_time=_opt_int(raw.get("game_time")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(f"not a memory event: {exc}") from None
        if event.kind not in EventKind.__args__ or not math.isfinite(event.ts):  # type: ignore[attr-defined]
            raise CorruptRecordError(f"not a memory event: kind {event.kind!r}, ts {event.ts}")
        return event

    @classmethod
    def from_json(cls, text: str | bytes) -> MemoryEvent:
        """Raises: CorruptRecordError: `text` is not an event's JSON."""
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptRecordError(f"not JSON: {exc}") from None
        return cls.from_dict(raw)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, got {type(value).__name__}")
    return value


# -- memory cards -----------------------------------------------------------------------------

Note = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Unit = Annotated[float, Field(ge=-1.0, le=1.0, allow_inf_nan=False)]


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    updated_at: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    def size(self) -> int:
        return len(self.model_dump_json().encode())


class RelationshipCard(_Card):
    """How an NPC stands with a player (≤ 2 KB)."""

    trust: Unit = 0.0
    affinity: Unit = 0.0
    promises: list[Note] = Field(default_factory=list, max_length=64)
    """Promises made either way, oldest first."""
    betrayals: list[Note] = Field(default_factory=list, max_length=64)
    notes: list[Note] = Field(default_factory=list, max_length=64)


class Quest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=120)]
    stage: Annotated[str, StringConstraints(max_length=80)] = ""
    milestones: list[Note] = Field(default_factory=list, max_length=32)
    """Milestones reached, oldest first."""


class QuestCard(_Card):
    """The player's quests as this NPC knows them (≤ 2 KB)."""

    active: list[Quest] = Field(default_factory=list, max_length=8)
    completed: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=list, max_length=64
    )


CardName = Literal["relationship", "quest"]
CARD_TYPES: dict[str, type[_Card]] = {"relationship": RelationshipCard, "quest": QuestCard}


def parse_card(name: str, raw: Any) -> RelationshipCard | QuestCard:
    """Validate a card from outside (the game, a store) and fit it to `CARD_MAX_BYTES`.

    Raises:
        CardError: unknown card, a field of the wrong type or out of range, a text over 200
            characters, or a card still over 2 KB after trimming.
    """
    card_type = CARD_TYPES.get(name)
    if card_type is None:
        raise CardError(f"no card named {name!r}; cards are: {', '.join(CARD_TYPES)}")
    try:
        card = card_type.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or name}: {e['msg']}" for e in exc.errors()
        )
        raise CardError(f"invalid {name} card: {problems}") from None
    return fit_card(card)  # type: ignore[return-value]


def fit_card(card: _Card) -> _Card:
    """Trim `card` to `CARD_MAX_BYTES` by the stated policy: drop the oldest entries of its
    lists (notes, then promises, then betrayals; completed quests, then the oldest milestones),
    one at a time, until it fits. Scores and active quests are never dropped.

    Raises:
        CardError: the card is still too big with every list emptied.
    """
    if card.size() <= CARD_MAX_BYTES:
        return card
    card = card.model_copy(deep=True)
    dropped = 0
    for take in _trimmable(card):
        while card.size() > CARD_MAX_BYTES and take():
            dropped += 1
        if card.size() <= CARD_MAX_BYTES:
            log.info("trimmed %d oldest entries from a %s", dropped, type(card).__name__)
            return card
    raise CardError(
        f"{type(card).__name__} is {card.size()} bytes with every list emptied; "
        f"the limit is {CARD_MAX_BYTES}: shorten its quests"
    )


def _trimmable(card: _Card) -> list[Any]:
    def popper(items: list[Any]) -> Any:
        return lambda: bool(items) and (items.pop(0) or True)

    if isinstance(card, RelationshipCard):
        return [popper(card.notes), popper(card.promises), popper(card.betrayals)]
    if isinstance(card, QuestCard):
        milestones = [popper(q.milestones) for q in card.active]
        return [popper(card.completed), *milestones]
    return []


# -- facts, summaries, emotions ----------------------------------------------------------------


@dataclass(slots=True)
class Fact:
    """A salient memory: a gift, an insult, a rescue. Reinforced, not duplicated."""

    text: str
    importance: int
    """1 (trivia) to 9 (saved the NPC's life)."""
    kind: str = "other"
    ts: float = 0.0
    """When it last happened or was reinforced."""
    count: int = 1
    game_time: int | None = None
    """The same in the game's calendar, in minutes (None: the game never told the date)."""

    def score(self, now: float, half_life_days: float, game_now: int | None = None) -> float:
        """Importance decayed by age: halves every `half_life_days`, 9 stays above 1 for a
        month at the default week. The age is the game's days when the game tells its date
        (`game_now`, and the fact's `game_time`), else the wall clock's."""
        if game_now is not None and self.game_time is not None:
            age_days = max(0, game_now - self.game_time) / GAME_MINUTES_PER_DAY
        else:
            age_days = max(0.0, now - self.ts) / DAY_S
        return float(self.importance * 0.5 ** (age_days / half_life_days))

    @classmethod
    def from_dict(cls, raw: Any) -> Fact:
        """Raises: CorruptRecordError: `raw` is not a fact."""
        try:
            text = " ".join(_str(raw["text"]).split())[:MAX_FACT_CHARS]
            importance = min(9, max(1, int(raw.get("importance", 5))))
            kind = raw.get("kind", "other")
            fact = cls(
                text,
                importance,
                kind if kind in FACT_KINDS else "other",
                float(raw.get("ts", 0.0)),
                max(1, int(raw.get("count", 1))),
                _opt_int(raw.get("game_time")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(f"not a fact: {exc}") from None
        if not text or not math.isfinite(fact.ts):
            raise CorruptRecordError("not a fact: empty text or bad time")
        return fact

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "to",
        "of",
        "and",
        "or",
        "in",
        "on",
        "at",
        "for",
        "with",
        "from",
        "by",
        "is",
        "was",
        "were",
        "be",
        "been",
        "it",
        "its",
        "this",
        "that",
        "me",
        "my",
        "you",
        "your",
        "i",
        "he",
        "she",
        "they",
        "them",
        "his",
        "her",
        "their",
        "we",
        "our",
        "us",
        "player",
        "npc",
    ]
)


def content_words(text: str) -> frozenset[str]:
    """The words of `text` that carry meaning (lowercase, no stop words)."""
    return frozenset(w for w in re.findall(r"[a-z0-9']+", text.lower()) if w not in _STOP)


def same_fact(a: str, b: str) -> bool:
    """Two texts say the same thing: most content words shared (or one contains the other)."""
    wa, wb = content_words(a), content_words(b)
    if not wa or not wb:
        return a.strip().lower() == b.strip().lower()
    shared = len(wa & wb)
    return shared / len(wa | wb) >= 0.5 or shared == min(len(wa), len(wb))


def merge_facts(
    facts: list[Fact],
    new: list[Fact],
    *,
    now: float,
    max_facts: int,
    half_life_days: float,
    game_now: int | None = None,
) -> list[Fact]:
    """Merge `new` into `facts`: a duplicate reinforces the fact it repeats (newer wording,
    the higher importance, count + 1, time now) instead of being appended; then the
    `max_facts` with the highest decayed score are kept, most salient first. `game_now`: the
    game's time (minutes of its calendar), when it tells it."""
    merged = [Fact(f.text, f.importance, f.kind, f.ts, f.count, f.game_time) for f in facts]
    for fact in new:
        when = fact.game_time if fact.game_time is not None else game_now
        for old in merged:
            if same_fact(old.text, fact.text):
                old.text = fact.text
                old.importance = max(old.importance, fact.importance)
                old.kind = fact.kind if fact.kind != "other" else old.kind
                old.ts = max(old.ts, fact.ts or now)
                if when is not None:
                    old.game_time = max(old.game_time or when, when)
                old.count += 1
                break
        else:
            merged.append(
                Fact(fact.text, fact.importance, fact.kind, fact.ts or now, fact.count, when)
            )
    merged.sort(key=lambda f: f.score(now, half_life_days, game_now), reverse=True)
    return merged[:max_facts]


@dataclass(frozen=True, slots=True)
class Summary:
    """What happened in one session, 300-600 characters."""

    text: str
    ts: float
    session_id: str | None = None
    game_time: int | None = None
    """When, in the game's calendar (minutes; None: the game never told the date)."""

    @classmethod
    def from_dict(cls, raw: Any) -> Summary:
        try:
            summary = cls(
                _str(raw["text"]),
                float(raw["ts"]),
                _opt_str(raw.get("session_id")),
                _opt_int(raw.get("game_time")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(f"not a summary: {exc}") from None
        if not math.isfinite(summary.ts):
            raise CorruptRecordError("not a summary: bad time")
        return summary


@dataclass(frozen=True, slots=True)
class Emotion:
    """One point of the NPC's emotional trajectory toward a player."""

    ts: float
    valence: float
    """-1 (hostile, hurt) to 1 (warm, delighted)."""
    arousal: float
    """0 (calm) to 1 (agitated)."""

    @classmethod
    def from_dict(cls, raw: Any) -> Emotion:
        try:
            point = cls(float(raw["ts"]), float(raw["valence"]), float(raw["arousal"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CorruptRecordError(f"not an emotion: {exc}") from None
        if not all(map(math.isfinite, (point.ts, point.valence, point.arousal))):
            raise CorruptRecordError("not an emotion: non-finite value")
        return cls(point.ts, max(-1.0, min(1.0, point.valence)), max(0.0, min(1.0, point.arousal)))


@dataclass(slots=True)
class Recall:
    """Everything the warm tier holds about one NPCxplayer, as loaded into hot."""

    turns: list[MemoryEvent] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    emotions: list[Emotion] = field(default_factory=list)
    relationship: RelationshipCard | None = None
    quest: QuestCard | None = None

    def empty(self) -> bool:
        return not (self.turns or self.summaries or self.facts or self.emotions) and (
            self.relationship is None and self.quest is None
        )
