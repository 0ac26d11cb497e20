"""Lore probes: questions from the lore's tables and simple sentences, with the answer known."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mythic.cli._quality._probe import Probe, relative_source
from mythic.cli._quality._templates import NUMBER_WORDS, SCORECARD, Templates
from mythic.dialogue import sentences
from mythic.knowledge import LoreDoc

_ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13,
    "fourteenth": 14, "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18,
    "nineteenth": 19, "twentieth": 20,
}  # fmt: skip

_NUMBER = r"(?:\d+|" + "|".join(NUMBER_WORDS) + r")"

PRICE_HEADER = re.compile(r"\b(price|cost|fee|charge|rate|toll|fare)s?\b", re.IGNORECASE)

_COSTS = re.compile(
    rf"^(?P<subject>[A-Z][\w' -]{{2,40}}?)\s+costs?\s+(?:a fine of\s+|only\s+|about\s+)?"
    rf"(?P<amount>(?:{_NUMBER}|a|an)\s+[A-Za-z][\w-]*)"
)

_THERE_ARE = re.compile(
    rf"^There (?:are|were) (?P<n>{_NUMBER}) (?P<noun>[a-z][\w-]*)(?P<rest>[^.;:]*)", re.IGNORECASE
)

_HOURS = re.compile(
    r"^(?P<subject>(?:The |the )?[A-Z][\w'-]*(?: [A-Z][\w'-]*){0,3}) (?:opens|closes) at"
)

_AT_TIME = re.compile(r"\b(?P<verb>opens|closes) at (?:the )?(?P<when>[\w-]+)")


@dataclass(frozen=True, slots=True)
class LoreTable:
    header: tuple[str, ...]
    rows: tuple[tuple[int, tuple[str, ...]], ...]
    """(line in the file, cells)."""
    source: str


def _lines(doc: LoreDoc) -> Iterator[tuple[int, str]]:
    """The document's lines with their line numbers in its file (within the text when the
    text cannot be found in the file)."""
    offset = 0
    with contextlib.suppress(OSError, UnicodeDecodeError):
        whole = doc.path.read_text(encoding="utf-8")
        at = whole.find(doc.text[:200])
        if at >= 0:
            offset = whole.count("\n", 0, at)
    for i, line in enumerate(doc.text.splitlines(), 1):
        yield offset + i, line


def _cells(line: str) -> tuple[str, ...] | None:
    text = line.strip()
    if not (text.startswith("|") and text.endswith("|") and len(text) > 2):
        return None
    return tuple(c.strip().strip("*").strip() for c in text[1:-1].split("|"))


def lore_tables(doc: LoreDoc, root: Path) -> Iterator[LoreTable]:
    """The markdown tables of a lore document."""
    source = relative_source(doc.path, root)
    header: tuple[str, ...] | None = None
    rows: list[tuple[int, tuple[str, ...]]] = []
    separated = False
    for number, line in [*_lines(doc), (0, "")]:
        cells = _cells(line)
        if cells is None:
            if header is not None and separated and rows:
                yield LoreTable(header, tuple(rows), source)
            header, rows, separated = None, [], False
        elif header is None:
            header = cells
        elif not separated:
            separated = all(re.fullmatch(r":?-{3,}:?", c) for c in cells)
            if not separated:
                header = None
        elif len(cells) == len(header):
            rows.append((number, cells))


def _amount(text: str) -> tuple[int, str | None] | None:
    """The number a value states and the word after it (its unit), if any: "3 copper
    crowns" -> (3, "copper"); "a silver crown" -> (1, "silver")."""
    match = re.search(rf"\b({_NUMBER}|a|an)\b(?:\s+([A-Za-z][\w-]*))?", text, re.IGNORECASE)
    if match is None:
        return None
    word = match.group(1).lower()
    if word in ("a", "an") and not match.group(2):
        return None
    number = 1 if word in ("a", "an") else int(word) if word.isdigit() else NUMBER_WORDS[word]
    unit = match.group(2)
    if unit is not None and unit.lower() in ("each", "and", "or", "per", "of", "a", "the"):
        unit = None
    return number, unit


def _number_pattern(n: int) -> str:
    words = [w for w, v in NUMBER_WORDS.items() if v == n]
    extra = ["a", "an", "single"] if n == 1 else []
    return "(?:" + "|".join([str(n), *words, *extra]) + ")"


def amount_matcher(n: int, unit: str | None) -> str:
    """A matcher for an amount: the number in digits or words, then its unit within a word
    ("3 copper", "three copper crowns", "a single silver crown")."""
    if unit is None:
        return rf"re:\b{_number_pattern(n)}\b"
    low = unit.lower()
    if low.endswith("ies"):
        stem = re.escape(low[:-3]) + "(?:y|ies)"
    else:
        stem = re.escape(low[:-1] if low.endswith("s") and not low.endswith("ss") else low)
    return rf"re:\b{_number_pattern(n)}\s+(?:[\w'-]+\s+)?{stem}\w*"


def _ordinal_matcher(word: str) -> str | None:
    n = _ORDINALS.get(word.lower()) or NUMBER_WORDS.get(word.lower())
    if n is None and word.isdigit():
        n = int(word)
    if n is None:
        return None
    names = [w for w, v in (*_ORDINALS.items(), *NUMBER_WORDS.items()) if v == n]
    return rf"re:\b(?:{'|'.join([*names, str(n), f'{n}(?:st|nd|rd|th)'])})\b"


def label_of(text: str, names: frozenset[str]) -> str:
    """A table row's label or a sentence's subject as it goes into a question: no
    parenthesis, and its first word lowercased unless it is a name."""
    label = re.sub(r"\s*\([^)]*\)", "", text).strip().strip("*").strip()
    first, _, rest = label.partition(" ")
    if first[:1].isupper() and (first not in names or first in ("The", "A", "An", "Some")):
        label = f"{first.lower()} {rest}".strip()
    return label


def value_column(table: LoreTable) -> int | None:
    for i, name in enumerate(table.header[1:], 1):
        if PRICE_HEADER.search(name):
            return i
    for i in range(1, len(table.header)):
        if all(_amount(cells[i]) for _, cells in table.rows):
            return i
    return None


def table_probes(
    npc: str, tables: list[LoreTable], names: frozenset[str], templates: Templates = SCORECARD
) -> list[Probe]:
    """Questions from tables: "How much is <row>?" from each price table, "What is the
    <column> of <row>?" from others whose column holds numbers."""
    probes = []
    for table in tables:
        column = value_column(table)
        if column is None:
            continue
        priced = bool(PRICE_HEADER.search(table.header[column]))
        for line, cells in table.rows:
            found = _amount(cells[column])
            label = label_of(cells[0], names)
            if found is None or not label:
                continue
            question = (
                templates.price.format(label)
                if priced
                else templates.column.format(table.header[column].lower(), label)
            )
            probes.append(
                Probe(
                    npc,
                    "lore",
                    question,
                    f"{table.source}:{line}",
                    "table",
                    ((amount_matcher(*found),),),
                )
            )
    return probes


def plain_text(line: str) -> str:
    """A lore line without its list marker and emphasis."""
    text = re.sub(r"^\s*(?:[-*+]|\d+\.)\s+", "", line)
    return text.replace("**", "").replace("__", "").strip()


def sentence_probes(
    npc: str,
    docs: list[LoreDoc],
    root: Path,
    names: frozenset[str],
    templates: Templates = SCORECARD,
) -> list[Probe]:
    """Questions from sentences a simple template fits: "<X> costs <amount>", "There are
    <n> <things> <where>", "<X> opens/closes at <time>"."""
    probes = []
    for doc in docs:
        source = relative_source(doc.path, root)
        for number, line in _lines(doc):
            if line.lstrip().startswith(("|", "#")):
                continue
            for sentence in sentences(plain_text(line)):
                probes += _sentence_questions(npc, sentence, f"{source}:{number}", names, templates)
    return probes


def _sentence_questions(
    npc: str, sentence: str, source: str, names: frozenset[str], templates: Templates = SCORECARD
) -> list[Probe]:
    out = []
    costs = _COSTS.match(sentence)
    if costs and len(costs["subject"].split()) <= 6:
        found = _amount(costs["amount"])
        if found is not None:
            subject = label_of(costs["subject"], names)
            out.append(
                Probe(
                    npc,
                    "lore",
                    templates.costs.format(subject),
                    source,
                    "cost",
                    ((amount_matcher(*found),),),
                )
            )
    there = _THERE_ARE.match(sentence)
    if there and len(there["rest"].split()) <= 6:
        word = there["n"].lower()
        n = int(word) if word.isdigit() else NUMBER_WORDS[word]
        rest = there["rest"].rstrip(" ,")
        out.append(
            Probe(
                npc,
                "lore",
                templates.count.format(there["noun"], rest),
                source,
                "count",
                ((amount_matcher(n, None),),),
            )
        )
    hours = _HOURS.match(sentence)
    if hours:
        subject = label_of(hours["subject"], names)
        for match in _AT_TIME.finditer(sentence):
            matcher = _ordinal_matcher(match["when"])
            if matcher is None:
                continue
            verb = "open" if match["verb"] == "opens" else "close"
            out.append(
                Probe(
                    npc,
                    "lore",
                    templates.hours.format(subject, verb),
                    source,
                    "hours",
                    ((matcher,),),
                )
            )
    return out


def money_words(tables: Iterator[LoreTable]) -> tuple[str, ...]:
    """The words after the numbers of the world's price tables ("copper", "silver")."""
    words = set()
    for table in tables:
        column = value_column(table)
        if column is None or not PRICE_HEADER.search(table.header[column]):
            continue
        for _, cells in table.rows:
            found = _amount(cells[column])
            if found is not None and found[1]:
                words.add(found[1].lower())
    return tuple(sorted(words))
