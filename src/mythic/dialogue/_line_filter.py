"""The line filter: each clause of a streamed reply is held until it is checked (assistant
phrasing, self-narration, a taboo's secret, a repeat or an echo of the prompt), then released."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from mythic.dialogue._naturalness import (
    CLAUSE_END,
    SENTENCE_END,
    Finding,
    Secret,
    addressed_as_self,
    admitted,
    affirmed,
    assistant_phrases,
    begins_as,
    echoes,
    leaked,
    narrates_self,
    normalise,
    opening,
    real_world,
    repeats,
    says_back,
    speaks_as,
    stepped_out,
    strange_name,
    touched,
)


def said_of(text: str, phrases: Sequence[str]) -> list[str]:
    """The `phrases` (catchphrases) that `text` says, whole words, in any case."""
    said = f" {normalise(text)} "
    return [p for p in phrases if normalise(p) and f" {normalise(p)} " in said]


def _twice(text: str, phrases: Sequence[str]) -> bool:
    said = f" {normalise(text)} "
    return any(said.count(f" {normalise(p)} ") > 1 for p in phrases)


def _without(text: str, own: Sequence[str]) -> str:
    for line in own:
        if normalise(line):
            text = re.sub(rf"(?<!\w){re.escape(line.strip())}(?!\w)", " ", text, flags=re.I)
    return text


_LINE_END = re.compile(rf"{SENTENCE_END.pattern}|\n")
"""Where a sentence (or a line) ends: the unit `LineFilter.whole_sentences` releases."""

_APOLOGY = re.compile(
    r"\s*(I apologi[sz]e|I'?m (so |very |truly )?sorry|sorry|my apologies|I'?m afraid)\b",
    re.IGNORECASE,
)
"""An apology opening a reply: held until its next clause (`LineFilter._reading`)."""


@dataclass(slots=True)
class LineFilter:
    """Holds each clause of a streamed reply until it is checked, then releases it.

    `push` takes the model's text and returns the text that may leave now, plus a `Finding`
    when a clause is not a character's line (the clause and anything after it are never
    released; the caller regenerates the reply, or ends it, or cuts it there). A clause is
    released as soon as its end is known (a comma or a full stop and the space after it, which
    goes out with it), the moment a phrase buffer would hand it to speech: a clean reply's
    first phrase is not delayed. A clause that runs past `hold_words` words is checked and
    released up to its last whole word while the first sentence lasts, so the first phrase of
    a long first sentence is not held past `dialogue.first_phrase_words` either (later ones
    wait for their clause's end, as a phrase buffer does); checks then also run over the
    sentence so far, so a phrase cut by a release is still caught (what was released stays
    said), and a sentence that begins as an earlier one did is caught at its first words.
    """

    forms: Sequence[str] = ()
    secrets: Sequence[Secret] = ()
    heard: str = ""
    """What the player said in this conversation: their words are not a leak."""
    earlier: Sequence[str] = ()
    """Sentences the NPC said earlier in the conversation: not to be said again."""
    instructions: Sequence[str] = ()
    """The card's rules, taboos and style: followed, never read back (`echoes`)."""
    openings: Sequence[str] = ()
    """The first clauses of the NPC's earlier replies (`opening`): a reply that begins as
    one of them did ("Salt and silence, ...", then again "Salt and silence, ...") is a
    repeat, from three words; shorter ones ("Aye,", "Of course,") may recur."""
    own: Sequence[str] = ()
    """The card's catchphrases: the NPC's own words, said as they are (one may name the NPC
    in the third person, "Grisk has just the thing"), so not narration or an echo."""
    asked: str = ""
    """The player's line this reply answers: a yes to "are you <a secret identity>?" gives it
    away (`affirmed`)."""
    known: frozenset[str] = frozenset()
    """The words of the NPC's world (`world_words`): real-world words among them are its own."""
    plain: Sequence[str] = ()
    """What the persona prompt calls the NPC ("a ghoul of Ravenmoor", `introduction`): read
    back, an echo, though it holds names."""
    others: Sequence[str] = ()
    """The names of the world's other characters: a reply that begins as one's line
    ("Marla: ...") speaks for them (`speaks_as`)."""
    repeat_words: int = 4
    """Sentences this short or longer must not repeat an earlier one (`repeats`); shorter
    ones ("Aye.") may recur. 1 among NPCs talking ambiently, where "No, no." said back and
    forth is a loop."""
    whole_sentences: bool = False
    """Release whole sentences only (among NPCs talking ambiently, where no player waits for
    the first phrase): a sentence caught never leaves its first clause said ("No," "Silas
    Marrow, a prospector,") as a line of its own. A line break ends a sentence too."""
    min_words: int = 0
    """A reply of fewer words is not said at all (among NPCs, "Yes." or "Thank you." back
    and forth adds nothing): its words are held until it is longer, and dropped if it ends
    first."""
    hold_words: int = 6
    released: str = ""
    _held: str = ""
    _sentence: str = ""
    _said: list[str] = field(default_factory=list)
    _passed: str = ""
    """Every clause checked so far (released, or about to be)."""
    _pending: str = ""
    """Clauses checked but not released: the sentence so far ends as an instruction's words
    begin ("I know nothing of computers,"), and the next clause tells whether it reads it."""
    _grams: frozenset[tuple[str, ...]] | None = None
    _asked: list[str] | None = None
    _offside: bool = False

    def push(self, text: str) -> tuple[str, Finding | None]:
        self._held += text
        out: list[str] = []
        while True:
            end = self._boundary()
            if end is None:
                break
            piece, self._held = self._held[:end], self._held[end:]
            finding = self._check(piece)
            if finding is not None:
                self._held = self._pending = ""
                return self._release("".join(out)), finding
            self._passed += piece
            self._pending += piece
            if not self._reading():
                out.append(self._pending)
                self._pending = ""
        return self._release("".join(out)), None

    def finish(self) -> tuple[str, Finding | None]:
        """The reply has ended: check and release what is still held (nothing, when the
        reply is shorter than `min_words`)."""
        piece, self._held = self._held, ""
        pending, self._pending = self._pending, ""
        if self.min_words and len((self._passed + piece).split()) < self.min_words:
            return "", None
        if not piece:
            return self._release(pending), None
        finding = self._check(piece, final=True)
        return ("", finding) if finding is not None else (self._release(pending + piece), None)

    def _reading(self) -> bool:
        """Whether the reply so far is an apology of four words or fewer ("I'm sorry,"), or
        the sentence so far ends with words in a row of an instruction: three or
        more, one of five letters or longer (not "of the world"), or two of three letters
        or more, one of six ("wry, concise"). It may be reading it out, so it waits for its
        next clause. A sentence that says back three words in a row of a player's line that
        names the real world waits for its end: it may go on to answer it. A reply shorter
        than `min_words` so far waits to be longer."""
        if self.min_words and len(self._passed.split()) < self.min_words:
            return True
        if (
            not self.released
            and len(self._sentence.split()) <= 4
            and _APOLOGY.match(self._sentence)
        ):
            # "I apologize," opening a reply is how an assistant's refusal begins: it waits
            # for its next clause, so a caught refusal does not leave its apology spoken.
            return True
        if self._grams is None:
            grams: set[tuple[str, ...]] = set()
            for line in (*self.instructions, *self.plain):
                prompt = normalise(line).split()
                for n in (2, 3, 4):
                    grams.update(tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1))
            self._grams = frozenset(grams)
        if self._off_topic() and self._sentence:
            # The player's off-topic line said back ("The last football World Cup was won"):
            # the sentence may go on to answer it, so it waits for its end.
            said, words = normalise(self._sentence).split(), self._asked or []
            asked = {
                run
                for run in zip(*(words[i:] for i in range(3)), strict=False)
                if max(map(len, run)) >= 5
            }
            if any(run in asked for run in zip(*(said[i:] for i in range(3)), strict=False)):
                return True
        tail = normalise(self._sentence).split()[-4:]
        for n in (4, 3, 2):
            run = tuple(tail[-n:])
            if len(tail) < n or run not in self._grams:
                continue
            if n > 2 and any(len(w) >= 5 for w in run):
                return True
            if n == 2 and min(map(len, run)) >= 3 and max(map(len, run)) >= 6:
                return True
        return False

    def _off_topic(self) -> bool:
        """Whether the player's line names the real world ("the World Cup", "Bitcoin")."""
        if self._asked is None:
            self._asked = normalise(self.asked).split()
            self._offside = real_world(self.asked, self.known) is not None
        return self._offside

    def _release(self, text: str) -> str:
        self.released += text
        return text

    def _boundary(self) -> int | None:
        match = (_LINE_END if self.whole_sentences else CLAUSE_END).search(self._held)
        if match is not None:
            rest = self._held[match.end() :]
            return match.end() + len(rest) - len(rest.lstrip())
        words = list(re.finditer(r"\S+\s+", self._held))
        if (
            self.hold_words
            and not self.whole_sentences
            and not self._said
            and len(words) > self.hold_words
        ):
            return words[-1].end()  # every whole word, the last one still held
        return None

    def _check(self, piece: str, *, final: bool = False) -> Finding | None:
        sentence = self._sentence + piece
        labels = assistant_phrases(sentence)
        if labels:
            return Finding("assistant", labels[0])
        # The real world named, a sum worked, or (in the reply's first sentence) a yes to
        # "are you an AI?": the player's request done, not answered in character.
        out = stepped_out(sentence, self.asked, self.heard, self.known, first=not self._said)
        if out is None and self.known and self._off_topic():
            name = strange_name(sentence, self.known, self.heard or self.asked)
            out = f"the real world: {name}" if name is not None else None
        if out is not None:
            return Finding("assistant", out)
        spoken = _without(sentence, self.own) if self.own else sentence
        narration = narrates_self(spoken, self.forms)
        if narration is None and (not self._sentence or self._passed.endswith("\n")):
            # Each sentence, and each line of the reply, may begin as another's line: the
            # NPC writing the scene's script ("...\nSheriff Tate: Sorry.").
            narration = speaks_as(piece, self.others)
        if narration is not None:
            return Finding("narration", narration)
        leaks = (
            leaked(sentence, self.secrets, self.heard)
            or admitted(sentence, self.secrets)
            or touched(sentence, self.secrets, self.heard)
        )
        if not leaks and not self._said and self.asked:  # the reply's first sentence
            leaks = affirmed(sentence, self.asked, self.secrets)
        if leaks:
            return Finding("taboo", leaks[0])
        listed = said_of(self._passed + piece, self.own)
        if len(listed) > 2 or _twice(self._passed + piece, listed):
            # "Tobacco, knock three, dark down here", "A sound investment, a sound
            # investment": the card read out. Two may go together ("Sugar, what'll it be?").
            return Finding("echo", " / ".join(listed))
        echo = addressed_as_self(spoken, self.forms) or echoes(
            spoken, [*self.instructions, *self.plain], plain=self.plain
        )
        if echo is not None:
            return Finding("echo", echo)
        if not self.released and not self._sentence and not self._said:
            first = opening(piece)
            if len(first.split()) > 2 and first in self.openings:
                return Finding("repeat", first)
        before = [*self.earlier, *self._said]
        # A sentence is released clause by clause: one that has begun as an earlier one did,
        # word for word, is caught at its first clause rather than once it is all out.
        said = begins_as(sentence, before)
        if said is None and self.whole_sentences:
            # Whole sentences are checked at once, not clause by clause: one that says an
            # earlier one again and goes on is caught as `begins_as` would catch its clause.
            said = says_back(sentence, before)
        if final or SENTENCE_END.search(piece + " ") is not None:
            said = said or repeats(sentence, before, min_words=self.repeat_words)
            if said is None:
                self._said.append(sentence)
                self._sentence = ""
        else:
            self._sentence = sentence
        return None if said is None else Finding("repeat", said)
