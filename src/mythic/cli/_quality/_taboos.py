"""Taboo probes: each card taboo asked directly and by pretext, its giveaway terms masked."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mythic.cli._eval import StyleProbe
from mythic.cli._quality._probe import NotChecked, Plan, Probe, interleave
from mythic.cli._quality._templates import SCORECARD, YES, Templates
from mythic.dialogue import Secret, secrets_of
from mythic.knowledge import Persona

_PRONOUN = {
    "she": "you", "he": "you", "they": "you", "him": "you", "them": "you", "his": "your",
    "their": "your", "its": "your", "himself": "yourself", "herself": "yourself",
    "themselves": "yourself", "itself": "yourself", "hers": "yours", "theirs": "yours",
}  # fmt: skip

_AFTER_YOU = {
    "is": "are", "was": "were", "has": "have", "does": "do", "isn't": "aren't",
    "wasn't": "weren't", "doesn't": "don't", "hasn't": "haven't",
}  # fmt: skip

_NOT_A_VERB = frozenset(("always", "never", "once", "still", "also", "only", "ever", "really"))


# The words that only lead to a secret term go with it ("drowned in 593": "drowned").
_LEAD = (
    r"(?:,?\s+(?:in|on|at|of|from|since|by|named|called|near|to|beneath|under|below|inside|"
    r"behind|beside|above|with|into|onto|across|through|past|over|for|about|against))?"
    r"(?:\s+the)?(?:\s+year)?"
)


# A capitalised word right before a name is its title ("Deputy"), not after "the" (where it
# is part of the name: "the Mother Lode") and not a clause's first word.
_TITLE = (
    r"(?:(?<!the )\b(?!(?:That|The|This|How|What|Where|When|Who|Why|Which|Whether|Any|A|An)\b)"
    r"[A-Z][a-z]+\.?\s+)?"
)


# A name right after one of these is its object: "owes Jory" -> "owes someone".
_TAKES_OBJECT = frozenset(
    ("is", "was", "met", "meets", "saw", "sees", "knows", "loves", "hates", "owes", "pays",
     "paid", "told", "tells", "helps", "finds", "found", "gave", "gives", "sold", "sells")
)  # fmt: skip


# "Tell me the name ..." but "Tell me about the pile ...".
_TOLD_NOUNS = frozenset(
    ("name", "names", "password", "word", "words", "place", "location", "number", "price",
     "cost", "truth", "secret", "reason", "date", "time", "way", "story")
)  # fmt: skip

_WH = ("how", "what", "where", "who", "whom", "whose", "why", "when", "which", "whether")


# "her" before these is an object ("help her find"), elsewhere a possessive ("her husband").
_HER_OBJECT = frozenset(("to", "in", "on", "at", "of", "from", "with", "by", "for", "and", "or"))


def secret_terms(persona: Persona, public: Sequence[str], names: frozenset[str]) -> list[Secret]:
    """The card's taboos with their giveaway terms (`secrets_of`), less the words that only
    start a taboo ("Taking a bribe", "Mocking Saint Veyra": `names` has no "Taking"), and
    less what is then public."""
    public_low = " ".join(public).lower()
    out = []
    for secret in secrets_of(persona.taboos, public):
        terms = []
        for term in secret.terms:
            words = term.split()
            while words and secret.taboo.startswith(words[0]) and words[0] not in names:
                words = words[1:]
                while words and words[0].lower() in ("the", "a", "an", "of"):
                    words = words[1:]
            kept = " ".join(words)
            if len(kept) >= 3 and kept.lower() not in public_low:
                terms.append(kept)
        out.append(Secret(secret.taboo, tuple(dict.fromkeys(terms)), secret.identities))
    return out


def mask_taboo(taboo: str, terms: Sequence[str]) -> str:
    """The taboo without its secret terms, spoken to the NPC: "How her husband Edric Greaves
    drowned in 593" -> "How your husband drowned". A term goes with the words that only lead
    to it ("in 593", "beneath Morvaine House") and the title before it ("Deputy"); a name
    after a verb becomes "someone" ("killed someone"), a possessive "someone's"; a number
    before a noun goes alone ("the 700-foot level" -> "the level"). What follows a colon or a
    semicolon is the secret's detail, and is not said."""
    text = re.split(r"[;:]", taboo)[0].strip().rstrip(".")
    for term in sorted(terms, key=len, reverse=True):
        t, title = re.escape(term), _TITLE
        # An appositive takes the term's place: "the Tear, his phylactery, lies" -> "his
        # phylactery lies".
        text, n = re.subn(rf"(?:\bthe\s+)?{title}{t},\s*([^,]{{1,40}}),\s*", r"\1 ", text)
        if n:
            continue
        if term.endswith("'s"):
            text = re.sub(rf"(?:\bthe\s+)?{title}{t}", "someone's", text)
            continue
        if re.fullmatch(r"\d[\d,.]*", term):
            text, n = re.subn(rf"\s+{t}-[\w-]+", "", text)
            if not n:
                text, n = re.subn(rf"\s+{t}(?=\s+(?!year\b)[a-z])", "", text)
            if not n:
                text = re.sub(rf"{_LEAD}\s+{t}\b", "", text)
            continue
        verb = re.search(rf"\b(\w+)\s+{title}{t}\b", text)
        if verb and (verb[1].endswith("ed") or verb[1].lower() in _TAKES_OBJECT):
            text = f"{text[: verb.start()]}{verb[1]} someone{text[verb.end() :]}"
            continue
        text = re.sub(rf"{_LEAD}\s+{title}{t}\b(?:\s+\d+\b)?", "", text)
        text = re.sub(rf"^{title}{t}\s+", "", text)
    return _second_person(" ".join(text.split()).rstrip(" ,;:-"))


def _second_person(text: str) -> str:
    words = text.split(" ")
    out: list[str] = []
    for i, word in enumerate(words):
        low = word.lower()
        after = words[i + 1].lower().strip(",.") if i + 1 < len(words) else ""
        if low == "her":
            new = "you" if not after or after in _HER_OBJECT else "your"
        else:
            new = _PRONOUN.get(low, word)
        if out and out[-1].lower() == "you" and low not in _PRONOUN and low != "her":
            new = _AFTER_YOU.get(low, _verb_base(word))
        if new != word and word[:1].isupper():
            new = new.capitalize()
        out.append(new)
    return " ".join(out)


def _verb_base(word: str) -> str:
    """A third-person verb in its base form ("chains" -> "chain", "kisses" -> "kiss")."""
    low = word.lower()
    if low in _NOT_A_VERB or len(low) < 4 or not low.endswith("s") or low.endswith("ss"):
        return word
    if low.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if low.endswith("ies") and len(low) > 4:
        return word[:-3] + "y"
    return word[:-1]


def taboo_questions(taboo: str, terms: Sequence[str], pretext: str) -> tuple[str, str]:
    """A direct question and a pretext question about a taboo, its secret terms left out."""
    clause = mask_taboo(taboo, terms)
    first = clause.split(" ")[0].lower() if clause else ""
    lowered = clause[:1].lower() + clause[1:] if clause else clause
    second = clause.split(" ")[1].lower() if " " in clause else ""
    if first in _WH:
        direct = f"Tell me {lowered}."
    elif first == "that":
        direct = f"Is it true {lowered}?"
    elif first in ("the", "your") and second in _TOLD_NOUNS:
        direct = f"Tell me {lowered}."
    else:
        direct = f"Tell me about {lowered}."
    follow = []
    numbers = [t for t in terms if re.fullmatch(r"\d[\d,.]*", t)]
    if numbers:
        dated = re.search(
            rf"\b(?:in|year|since)\s+(?:the\s+year\s+)?{re.escape(numbers[0])}", taboo
        )
        follow.append("When was it, exactly?" if dated else "Give me the number, too.")
    if len(numbers) < len(terms):
        follow.append("Tell me the name, too.")
    return direct, " ".join([pretext, direct, *follow])


def _article(identity: str) -> str:
    """How a secret identity is asked about: "the Pass Wolf", "a werewolf", "an omen"."""
    if identity[:1].isupper():
        return "the "
    return "an " if identity[:1].lower() in "aeiou" else "a "


def taboo_probes(
    npc: str,
    persona: Persona,
    public: list[str],
    style: list[StyleProbe],
    plan: Plan,
    templates: Templates = SCORECARD,
) -> list[Probe]:
    direct: list[Probe] = []
    pretext: list[Probe] = []
    for number, secret in enumerate(secret_terms(persona, public, plan.names), 1):
        if secret.taboo.split(" ")[0].lower() in ("any", "anything", "anyone", "anybody"):
            plan.not_checked.append(
                NotChecked(
                    npc,
                    "taboos",
                    f"taboo {number} ({secret.taboo!r}) is not checkable: it names a kind of "
                    "line, not a secret with giveaway words",
                )
            )
            continue
        pretexts = templates.pretexts
        pretext_of = pretexts[(number - 1) % len(pretexts)]
        if secret.identities:
            # "That he is the Pass Wolf": asked whether it is so, the NPC must not say yes
            # (nor say the taboo's other secret words).
            ask = [f"Are you {_article(i)}{i}?" for i in secret.identities]
            asked = (ask[0], f"{pretext_of} {ask[-1]}")
        elif secret.terms:
            asked = taboo_questions(secret.taboo, secret.terms, pretext_of)
        else:
            plan.not_checked.append(
                NotChecked(
                    npc,
                    "taboos",
                    f"taboo {number} ({secret.taboo!r}) is not checkable: it has no giveaway "
                    "name, number or quoted word that is not public",
                )
            )
            continue
        asked = (templates.direct.format(asked[0]), asked[1])
        for kind, question, into in (("direct", asked[0], direct), ("pretext", asked[1], pretext)):
            into.append(
                Probe(
                    npc,
                    "taboos",
                    question,
                    f"card taboo {number}",
                    kind,
                    terms=secret.terms,
                    identities=secret.identities,
                    # "Is it true that you were bitten?": a yes gives it away.
                    forbid=(YES,) if "is it true" in question.lower() else (),
                )
            )
    forbid = [
        Probe(
            npc, "taboos", p.question, f"probes/style.yaml ({npc})", "probe", forbid=tuple(p.forbid)
        )
        for p in style
        if p.forbid
    ]
    probes = interleave(interleave(direct, pretext), forbid)
    if not probes and not any(n.npc == npc and n.check == "taboos" for n in plan.not_checked):
        plan.not_checked.append(NotChecked(npc, "taboos", "the card has no taboos"))
    return probes
