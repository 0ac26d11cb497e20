"""Clause splitting: a phrase cut into the pieces synthesised one at a time."""

from __future__ import annotations

import re

__all__ = ["split_clauses"]

_SPACE = re.compile(r"\s+")
# A sentence ends at . ! ? or an ellipsis (and any closing quote or bracket) before a space.
_SENTENCE_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s|$)")
# A clause ends at , ; : or a dash before a space.
_CLAUSE_END = re.compile(r"(?:[,;:]|\s[\u2014\u2013-]{1,2})(?=\s)")
_SPEAKABLE = re.compile(r"[^\W_]")


def split_clauses(text: str, *, min_chars: int = 16, max_chars: int = 90) -> list[str]:
    """Split text into clauses, each synthesised and streamed on its own.

    Sentences end at `. ! ?` and ellipses. A sentence longer than `max_chars` is cut at
    `, ; :` and dashes, never into a piece shorter than `min_chars` (short pieces join their
    neighbour, so "Yes, sir, at once." stays whole); a piece still longer than `max_chars` is
    cut at the last space before it. Whitespace is collapsed; pieces with nothing to say
    (only punctuation) are dropped.

    Args:
        text: the phrase to speak.
        min_chars: shortest piece a long sentence is cut into.
        max_chars: longest piece before it is cut.

    Returns:
        The clauses in order; empty when the text has nothing to say.
    """
    if min_chars < 1 or max_chars < 2 * min_chars:
        raise ValueError("need 1 <= min_chars and 2 * min_chars <= max_chars")
    text = _SPACE.sub(" ", text).strip()
    clauses: list[str] = []
    for sentence in _cut(text, _SENTENCE_END):
        if len(sentence) <= max_chars:
            clauses.append(sentence)
            continue
        for piece in _join_short(_cut(sentence, _CLAUSE_END), min_chars):
            clauses.extend(_wrap(piece, max_chars))
    return [c for c in clauses if _SPEAKABLE.search(c)]


def _cut(text: str, boundary: re.Pattern[str]) -> list[str]:
    pieces: list[str] = []
    start = 0
    for match in boundary.finditer(text):
        pieces.append(text[start : match.end()].strip())
        start = match.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def _join_short(pieces: list[str], min_chars: int) -> list[str]:
    joined: list[str] = []
    for piece in pieces:
        if joined and (len(joined[-1]) < min_chars or len(piece) < min_chars):
            joined[-1] = f"{joined[-1]} {piece}"
        else:
            joined.append(piece)
    return joined


def _wrap(piece: str, max_chars: int) -> list[str]:
    lines: list[str] = []
    while len(piece) > max_chars:
        cut = piece.rfind(" ", 0, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        lines.append(piece[:cut].strip())
        piece = piece[cut:].strip()
    if piece:
        lines.append(piece)
    return lines
