"""Phrase buffering: streamed reply text coalesced into phrases a speech synthesiser can say
with stable prosody (technical design, section 5.4)."""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*(?=\s)")
_CLAUSE_END = re.compile(r"[,;:\u2014\u2013]+(?=\s)")
_WORD = re.compile(r"\S+")
# Where a long first sentence is cut (`first_words`): before a word that opens a clause, or
# else after a word a sentence can stop on (not an article, a preposition, a conjunction or
# an auxiliary), so that the first phrase still sounds like a phrase. English, like the ASR.
# fmt: off
_OPENS_CLAUSE = frozenset([
    "and", "but", "or", "because", "where", "when", "which", "who", "whom", "whose", "while",
    "if", "though", "although", "unless", "until", "since", "before", "after", "then",
])
_NO_END = frozenset([
    "a", "an", "the", "of", "to", "in", "on", "at", "by", "for", "from", "with", "into", "onto",
    "over", "under", "about", "and", "but", "or", "nor", "so", "my", "your", "his", "her", "its",
    "our", "their", "this", "that", "these", "those", "is", "are", "was", "were", "be", "been",
    "am", "has", "have", "had", "do", "does", "did", "will", "would", "shall", "should", "can",
    "could", "may", "might", "must", "not", "no", "very",
])
# fmt: on
_FIRST_MIN_WORDS = 3
_STRIP = "\"'()[]*\u201c\u201d\u2018\u2019\u2014\u2013-"
_ENDS_SENTENCE = re.compile(r"[.!?…]+[\"')\]]*\s*$")


def sentences_end(text: str, count: int) -> int | None:
    """Where the `count`-th sentence of `text` ends, once the text goes on after it (a
    sentence's end is known when what follows the full stop is); None before that."""
    if count < 1:
        return None
    for n, match in enumerate(_SENTENCE_END.finditer(text), 1):
        if n == count:
            return match.end()
    return None


class PhraseBuffer:
    """Collects deltas and hands out phrases.

    A phrase ends at a sentence boundary once `min_s` of text has built up, or at a clause
    boundary once `max_s` has; one to two sentences are coalesced. The reply's first phrase
    goes out at its first sentence or clause boundary (`eager_first`), so the NPC starts
    speaking as soon as it can say something whole: the player waits for the first audio,
    not for the later ones, which synthesis keeps ahead of playback. With `eager_first`, a
    first sentence that runs past `first_words` words with no such boundary is cut there
    (0: never; a short first sentence and a whole line pushed at once are not), at a word
    where a phrase can end (`_first_words_cut`): Piper took 325 ms for an 18-word sentence
    and 134 ms for 7 words on one core, and the model generates the whole sentence before
    synthesis can start. A very short first sentence ("Mm-hm.") goes out at once so a
    backchannel is not held back. `flush` returns the rest at the end of the reply. Time is
    passed in (`now`, seconds) so the buffer stays I/O-free and testable.
    """

    def __init__(
        self,
        *,
        min_s: float = 0.2,
        max_s: float = 0.4,
        max_chars: int = 240,
        short_words: int = 3,
        eager_first: bool = True,
        first_words: int = 0,
    ) -> None:
        if first_words < 0 or (first_words and first_words < _FIRST_MIN_WORDS):
            raise ValueError(f"first_words must be 0 (off) or at least {_FIRST_MIN_WORDS}")
        self.first_words = first_words
        self.min_s = min_s
        self.eager_first = eager_first
        self.max_s = max_s
        self.max_chars = max_chars
        self.short_words = short_words
        self._text = ""
        self._since: float | None = None
        self._emitted = 0

    def push(self, text: str, now: float) -> list[str]:
        """Add a delta received at `now`; the phrases now complete (often none)."""
        if not text:
            return []
        if self._since is None:
            self._since = now
        self._text += text
        phrases: list[str] = []
        while (cut := self._cut(now)) is not None:
            phrase, self._text = self._text[:cut].strip(), self._text[cut:].lstrip()
            self._since = now if self._text else None
            if phrase:
                phrases.append(phrase)
                self._emitted += 1
        return phrases

    def flush(self) -> str | None:
        """The text left at the end of the reply, if any; the buffer is reset."""
        rest, self._text, self._since, self._emitted = self._text.strip(), "", None, 0
        return rest or None

    def _first_words_cut(self) -> int | None:
        """Where a first sentence longer than `first_words` words, with no boundary yet, is
        cut: once the word after them is complete (the stream may be inside a word), before
        the last clause-opening word among words 3 to `first_words`, else after the last
        word a phrase can end on, else after `first_words` words. None before that."""
        if _ENDS_SENTENCE.search(self._text):
            return None  # a whole sentence so far (a line pushed at once): it goes whole
        # A word is complete when whitespace follows it.
        words = [m for m in _WORD.finditer(self._text) if m.end() < len(self._text)]
        if len(words) <= self.first_words:
            return None
        bare = [m.group().strip(_STRIP).lower() for m in words]
        spans = range(self.first_words, _FIRST_MIN_WORDS - 1, -1)  # words in the phrase
        for n in spans:
            if bare[n] in _OPENS_CLAUSE:
                return words[n].start()
        for n in spans:
            if bare[n - 1] and bare[n - 1] not in _NO_END:
                return words[n].start()
        return words[self.first_words].start()

    def _cut(self, now: float) -> int | None:
        """Where the next phrase ends, or None to keep buffering."""
        if not self._text or self._since is None:
            return None
        waited = now - self._since
        if self._emitted == 0 and self.eager_first:
            ends = _SENTENCE_END.finditer(self._text), _CLAUSE_END.finditer(self._text)
            for end in sorted(m.end() for found in ends for m in found):
                if len(self._text[:end].split()) >= 2:  # "Well," alone is no phrase
                    return end
        sentences = [m.end() for m in _SENTENCE_END.finditer(self._text)]
        if sentences:
            first = self._text[: sentences[0]]
            if self._emitted == 0 and len(first.split()) <= self.short_words:
                return sentences[0]
            if waited >= self.min_s or len(sentences) >= 2:
                # One or two sentences per phrase, never more.
                return sentences[min(len(sentences), 2) - 1]
        if self._emitted == 0 and self.eager_first and self.first_words:
            cut = self._first_words_cut()
            if cut is not None:
                return cut
        if waited >= self.max_s:
            clauses = [m.end() for m in _CLAUSE_END.finditer(self._text)]
            if clauses:
                return clauses[-1]
        if len(self._text) >= self.max_chars:
            space = self._text.rfind(" ", 0, self.max_chars)
            return space if space > 0 else self.max_chars
        return None
