"""Session summaries and salient facts, written by the model at the lowest priority."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mythic._errors import MythicError
from mythic.memory._model import (
    FACT_KINDS,
    SUMMARY_MAX_CHARS,
    SUMMARY_MIN_CHARS,
    Fact,
    MemoryEvent,
    content_words,
)

log = logging.getLogger(__name__)


class Writer(Protocol):
    """Runs one constrained generation at idle priority and returns its text (the dialogue
    layer provides one over the engine, so memory does not import the engine)."""

    def __call__(
        self, system: str, user: str, schema: dict[str, Any], max_tokens: int
    ) -> Awaitable[str]: ...


@dataclass(slots=True)
class Digest:
    """What a summarizer made of some turns."""

    summary: str
    facts: list[Fact] = field(default_factory=list)
    valence: float = 0.0
    arousal: float = 0.0
    by_model: bool = True


DIGEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "minLength": 40, "maxLength": SUMMARY_MAX_CHARS},
        "facts": {
            "type": "array",
            "maxItems": 5,
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "minLength": 3, "maxLength": 160},
                    "kind": {"enum": list(FACT_KINDS)},
                    "importance": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["text", "kind", "importance"],
                "additionalProperties": False,
            },
        },
        "valence": {"type": "integer", "minimum": -5, "maximum": 5},
        "arousal": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["summary", "facts", "valence", "arousal"],
    "additionalProperties": False,
}


def transcript(turns: list[MemoryEvent], npc_name: str) -> str:
    lines = []
    for turn in turns:
        who = "Player" if turn.role == "player" else npc_name if turn.role == "npc" else "Game"
        lines.append(f"{who}: {' '.join(turn.text.split())}")
    return "\n".join(lines)


async def digest(
    writer: Writer | None,
    turns: list[MemoryEvent],
    *,
    npc_name: str,
    npc_about: str,
    now: float,
    max_tokens: int,
) -> Digest:
    """Summarize `turns` (300-600 characters) and extract up to 5 salient facts.

    A model reply is clipped to 600 characters at a sentence end and, when shorter than 300,
    completed with the player's own words; without a writer, or when the model fails, the
    summary is made from the turns alone (`by_model` False).
    """
    if writer is not None and turns:
        system = (
            f"You keep the memory of {npc_name}, {npc_about}. Read the conversation and answer "
            "with JSON. summary: what happened, 3 to 5 sentences (300 to 600 characters), "
            f"third person, calling them 'the player' and '{npc_name}'. facts: up to 5 things "
            f"{npc_name} will remember about the player (gifts, insults, rescues, promises, "
            "betrayals, quests, trades), importance 1 (trivia) to 9 (life or death). valence: "
            f"how {npc_name} feels about the player now, -5 hostile to 5 warm. arousal: 0 calm "
            "to 9 agitated."
        )
        try:
            text = await writer(system, transcript(turns, npc_name), DIGEST_SCHEMA, max_tokens)
            return _parse(text, turns, now, npc_name)
        except (MythicError, ValueError, KeyError, TypeError) as exc:
            log.warning("summary by the model failed (%s); summarizing from the turns", exc)
    return Digest(fit_summary("", turns, npc_name), by_model=False)


def _parse(text: str, turns: list[MemoryEvent], now: float, npc_name: str) -> Digest:
    data = json.loads(text)
    facts = []
    for raw in data.get("facts") or []:
        fact = Fact.from_dict({**raw, "ts": now})
        facts.append(fact)
    return Digest(
        summary=fit_summary(str(data["summary"]), turns, npc_name),
        facts=facts,
        valence=max(-5, min(5, int(data.get("valence", 0)))) / 5,
        arousal=max(0, min(9, int(data.get("arousal", 0)))) / 9,
    )


def fit_summary(summary: str, turns: list[MemoryEvent], npc_name: str = "The NPC") -> str:
    """Fit a summary to 300-600 characters: clip at the last sentence end before 600 (else a
    word), and complete a short one with the session's own lines: the player's before the
    NPC's, those the summary covers least first (a session too short to fill 300 characters
    stays shorter)."""
    text = " ".join(summary.split())
    if len(text) < SUMMARY_MIN_CHARS:
        covered = content_words(text)

        def novelty(turn: MemoryEvent) -> tuple[bool, float]:
            words = content_words(turn.text)
            return (turn.role != "player", len(words & covered) / max(1, len(words)))

        for turn in sorted((t for t in turns if t.role in ("player", "npc")), key=novelty):
            if len(text) >= SUMMARY_MIN_CHARS:
                break
            quote = " ".join(turn.text.split())[:200]
            who = "The player" if turn.role == "player" else npc_name
            text = f'{text} {who} said: "{quote}"'.strip()
        if not text:
            text = "They met, but nothing was said."
    if len(text) > SUMMARY_MAX_CHARS:
        cut = text[:SUMMARY_MAX_CHARS]
        ends = [m.end() for m in re.finditer(r"[.!?](?=\s|$)", cut)]
        if ends and ends[-1] >= SUMMARY_MIN_CHARS // 2:
            text = cut[: ends[-1]]
        else:
            text = cut[: cut.rfind(" ")].rstrip(",;: ") + "…"
    return text
