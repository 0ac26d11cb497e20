"""Counting and cutting text in tokens.

Budgets are counted by a `TokenCounter`: the serving model's own tokenizer when there is one
(the dialogue layer passes it), else `approx_tokens`, a tokenizer-free estimate that errs high
for English prose.
"""

from __future__ import annotations

import re
from collections.abc import Callable

TokenCounter = Callable[[str], int]
"""Tokens in a text; must count the empty text as 0."""

CHARS_PER_TOKEN = 4
"""Characters a token, where a budget in tokens must become one in characters before any
tokenizer is at hand: BPE vocabularies average about four characters of English prose a token."""

_PIECES = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """An estimate of BPE tokens: each word counts 1 plus 1 per 4 characters past the first 4
    (long or rare words split into several pieces), each punctuation mark 1."""
    count = 0
    for piece in _PIECES.findall(text):
        count += 1 + max(0, len(piece) - 4) // 4 if piece[0].isalnum() or piece[0] == "_" else 1
    return count


_CUTS = re.compile(r"\s+")


def fit_tokens(text: str, budget: int, count: TokenCounter) -> str:
    """The longest prefix of `text`, cut at a space, with at most `budget` tokens ("" if not
    even one word fits). A cut text ends with an ellipsis, counted in the budget."""
    if budget <= 0:
        return ""
    if count(text) <= budget:
        return text
    cuts = [m.start() for m in _CUTS.finditer(text)]
    lo, hi, best = 0, len(cuts) - 1, ""
    while lo <= hi:  # the largest cut whose prefix (plus the ellipsis) fits
        mid = (lo + hi) // 2
        candidate = text[: cuts[mid]].rstrip(" ,;:-") + "..."
        if count(candidate) <= budget:
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    return best
