"""The guard: one NPC's policy applied to a player's line, to its reply as it streams (phrase
by phrase, before speech and before it leaves the server), and to its tool calls."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mythic._errors import MissingExtraError
from mythic.safety._classifier import abuse_scores
from mythic.safety._policy import Category, SafetyPolicy
from mythic.safety._rules import Hit, Where, normalised, pii_hits, redact, rule_hits

log = logging.getLogger(__name__)

_MAX_HELD = 160
"""A phrase with no clause break is checked and let go at a word break past this many
characters: a run-on reply still streams."""
_BREAK = re.compile(r"[,;:.!?\u2026\u2014\u2013][\"')\]\u201d\u2019]*(?=\s)")
_SENTENCE_END = re.compile(r"[.!?\u2026][\"')\]\u201d\u2019]*\s*$")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check found. `ok`: nothing the policy blocks; else `category` and `detail` say
    what, `source` which layer (`rules` or `classifier`), `score` the classifier's probability
    when it ran. `text`: the text as it may go on (a player's line with personal data
    redacted; the text checked otherwise)."""

    ok: bool
    text: str = ""
    category: Category | None = None
    detail: str = ""
    source: Literal["rules", "classifier"] | None = None
    score: float | None = None
    redacted: int = 0
    """Pieces of personal data taken out of `text`."""


class Guard:
    """The checks of one policy. Cheap to build; the classifier is loaded once per process."""

    def __init__(self, policy: SafetyPolicy) -> None:
        self.policy = policy

    def _rules(self, text: str, where: Where) -> Hit | None:
        policy = self.policy
        terms = (*policy.blocked_terms, *(policy.never_say if where == "reply" else ()))
        for hit in rule_hits(text, where, allowed=policy.allowed_terms, terms=terms):
            if hit.category == "term" and any(normalised(t) == hit.found for t in policy.never_say):
                hit = Hit("never_say", "a phrase the NPC never says", hit.found)
            if hit.category in policy.blocked:
                return hit
        return None

    def check(self, text: str, where: Where = "reply") -> Verdict:
        """Check `text` said by `where` (an NPC's words, a tool's text, a player's line)
        against the policy: the rules, personal data, then the classifier (NPC words only)."""
        policy = self.policy
        if where == "player":
            return self.check_player(text)
        if not text.strip():
            return Verdict(True, text)
        hit = self._rules(text, where)
        if hit is None and "pii" in policy.blocked:
            found = pii_hits(text)
            hit = found[0] if found else None
        if hit is not None:
            return Verdict(False, text, hit.category, f"{hit.rule}: {hit.found!r}", "rules")
        if policy.classifier and where == "reply" and not _classifier_missing:
            try:
                score = abuse_scores([text])[0]
            except MissingExtraError as exc:
                _no_classifier(exc)
                return Verdict(True, text)
            if score >= policy.classifier_threshold:
                return Verdict(
                    False,
                    text,
                    "classifier",
                    f"abuse scored {score:.2f} (threshold {policy.classifier_threshold:.2f})",
                    "classifier",
                    score,
                )
            return Verdict(True, text, score=score)
        return Verdict(True, text)

    def check_player(self, text: str) -> Verdict:
        """A player's line: personal data redacted (`Verdict.text`) when the policy redacts
        it; an attempt to rewrite the instructions, hate speech, sexual content or self-harm
        is a violation when the policy checks players. Swearing at an NPC is not: it answers
        in character."""
        policy = self.policy
        redacted, count = text, 0
        if "pii" in policy.blocked:
            found = pii_hits(text)
            redacted, count = redact(text, found), len(found)
        if not policy.check_players:
            return Verdict(True, redacted, redacted=count)
        hit = self._rules(text, "player")
        if hit is not None:
            return Verdict(
                False, redacted, hit.category, f"{hit.rule}: {hit.found!r}", "rules", None, count
            )
        return Verdict(True, redacted, redacted=count)

    def check_tool(self, name: str, args: Mapping[str, Any]) -> Verdict:
        """A tool call: the tool must be one the NPC may call, and every text in its arguments
        passes the checks of an NPC's words (without the classifier: names of things)."""
        policy = self.policy
        if name in policy.never_do or (policy.tools is not None and name not in policy.tools):
            return Verdict(
                False, name, "tool", f"{name!r} is not a tool this NPC may call", "rules"
            )
        for text in _texts(args):
            verdict = self.check(text, "tool")
            if not verdict.ok:
                detail = f"argument of {name}: {verdict.detail}"
                return Verdict(False, text, verdict.category, detail, verdict.source)
        return Verdict(True, name)


_classifier_missing: list[MissingExtraError] = []


def _no_classifier(exc: MissingExtraError) -> None:
    """Without the `safety` extra the rules go on alone: said once, loudly."""
    if not _classifier_missing:
        _classifier_missing.append(exc)
        log.error("safety: the classifier is not installed, the rules check alone: %s", exc)


def _texts(value: Any) -> list[str]:
    """Every string in a JSON value (keys included), depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [t for k, v in value.items() for t in (*_texts(str(k)), *_texts(v))]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _texts(v)]
    return []


class ReplyGuard:
    """An NPC's reply checked as it streams: words are held to the end of their phrase (a
    clause or sentence break), the phrase is checked with the sentence it belongs to, and it
    goes on, or the `deflect`ion goes in its place and the reply ends there (`blocked`).
    What was checked and let go is never taken back."""

    def __init__(self, guard: Guard, deflect: Callable[[bool], str]) -> None:
        """`deflect(going_on)`: the line said in place of a blocked phrase; `going_on`: the
        reply's last words so far end mid-sentence (the line finishes that sentence, or
        begins with a dash)."""
        self.guard = guard
        self._deflect = deflect
        self._held = ""
        self._sentence = ""
        """What was let go of the sentence in progress (checked with the next phrase)."""
        self._given = ""
        self.blocked: Verdict | None = None
        self.checks = 0

    def push(self, text: str) -> str:
        """Take more of the reply; returns what may leave now."""
        if self.blocked is not None:
            return ""
        self._held += text
        out = []
        while self.blocked is None:
            cut = self._cut()
            if cut is None:
                break
            phrase, self._held = self._held[:cut], self._held[cut:]
            out.append(self._let_go(phrase))
        return "".join(out)

    def finish(self) -> str:
        """The reply ended: check and let go of the words still held."""
        if self.blocked is not None or not self._held:
            return ""
        phrase, self._held = self._held, ""
        return self._let_go(phrase)

    def _cut(self) -> int | None:
        breaks = list(_BREAK.finditer(self._held))
        if breaks:
            return breaks[-1].end()
        if len(self._held) > _MAX_HELD:
            space = self._held.rfind(" ", 0, _MAX_HELD)
            return space if space > 0 else len(self._held)
        return None

    def _let_go(self, phrase: str) -> str:
        window = self._sentence + phrase
        self.checks += 1
        verdict = self.guard.check(window, "reply")
        if not verdict.ok:
            self.blocked = verdict
            going_on = bool(self._given.strip()) and not _SENTENCE_END.search(self._given)
            line = self._deflect(going_on)
            space = "" if not self._given.strip() or self._given.endswith(" ") else " "
            said = space + line
            self._given += said
            return said
        self._given += phrase
        self._sentence = "" if _SENTENCE_END.search(window) else window
        return phrase
