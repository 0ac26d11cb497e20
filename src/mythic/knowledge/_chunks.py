"""Documents cut into retrievable chunks: lore per zone, the world's premise, persona lines.

A markdown document is read as units (headings, paragraphs, list items, table rows); a chunk
gathers whole units up to `size` tokens and starts with the last units of the previous chunk
up to `overlap` tokens, so a fact on a boundary is whole in one of them. Every chunk begins with
its document's title (and the section it starts in), which anchors both BM25 and embeddings.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mythic.knowledge._tokens import TokenCounter, approx_tokens, fit_tokens

Source = Literal["lore", "world", "persona"]

# A sentence ends at . ! ? before a capital, but not after a title's abbreviation: "St. Veyra's
# Cathedral", "Mr. Blackwood" are one sentence (split, the fact loses its subject).
_ABBREVIATIONS = (
    "St",
    "Mr",
    "Mrs",
    "Ms",
    "Dr",
    "Mt",
    "Ft",
    "Jr",
    "Sr",
    "Sgt",
    "Capt",
    "Lt",
    "Col",
    "Gen",
    "Rev",
    "Fr",
    "Prof",
    "No",
    "Nos",
    "vs",
    "Mme",
    "Mlle",
    "Messrs",
)
_SENTENCE = re.compile(
    "".join(rf"(?<!\b{a}\.)" for a in _ABBREVIATIONS) + r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z\"'(])"
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrievable piece of knowledge."""

    id: str
    """Stable id: the source file (relative to the world) and the chunk's number."""
    source: Source
    zone: str | None
    """The lore shard: a zone id, or None for world-wide knowledge."""
    title: str
    text: str
    """The chunk as packed into a prompt: a title line, then its units, one per line."""
    tags: tuple[str, ...] = ()
    npc: str | None = None
    """For persona chunks: whose persona."""

    @property
    def digest(self) -> str:
        """Content hash: the embedding cache's key."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:32]

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _row(cells: Sequence[str], header: Sequence[str]) -> str:
    """A table row as a line that says what each cell is: "A mug of black ale, price: 3
    copper crowns" (under "| Item | Price |"). A small model reads the fact off one line;
    from a bare row among others it takes the wrong one's number."""
    # A row wider than its header keeps its extra cells, unnamed.
    names = [*header[1:], *[""] * max(0, len(cells) - len(header))]
    said = [cells[0]] + [
        f"{name.lower()}: {cell}" if name else cell
        for name, cell in zip(names, cells[1:], strict=False)
        if cell
    ]
    return ", ".join(c for c in said if c)


def _units(text: str) -> list[tuple[str, str | None]]:
    """(unit, the heading it is under) for each heading, paragraph, list item or table row
    (a row says its columns' names, `_row`; the header row itself is no unit)."""
    units: list[tuple[str, str | None]] = []
    heading: str | None = None
    paragraph: list[str] = []
    header: list[str] | None = None

    def close() -> None:
        if paragraph:
            units.append((" ".join(paragraph), heading))
            paragraph.clear()

    for raw in text.splitlines():
        line = raw.strip()
        if line and re.fullmatch(r"\|?[\s|:-]+\|?", line) and "-" in line:
            close()  # a table's |---|---| rule: the row above it is the header
            if units and units[-1][0].startswith("|") and header is None:
                header = _cells(units.pop()[0])
            continue
        if not line.startswith("|"):
            header = None
        if not line:
            close()
            continue
        if line.startswith("#"):
            close()
            heading = line.lstrip("#").strip() or heading
            units.append((line, heading))
        elif line.startswith("|") and header is not None:
            units.append((_row(_cells(line), header), heading))
        elif re.match(r"([-*+]|\d+[.)])\s|\|", line):
            close()
            units.append((line, heading))
        else:
            paragraph.append(line)
    close()
    return units


def _split_long(unit: str, size: int, count: TokenCounter) -> list[str]:
    """A unit as lines of at most `size` tokens: a paragraph one sentence per line (so a
    packer can keep the one sentence that answers), anything longer cut at words."""
    pieces: list[str] = []
    # A numbered item's number stays with its first sentence ("2. Anyone who ...").
    marker = re.match(r"\d+[.)]\s+", unit)
    head = marker.group(0) if marker else ""
    for sentence in _SENTENCE.split(unit[len(head) :]):
        sentence, head = head + sentence, ""
        rest = sentence
        while count(rest) > size:
            head = fit_tokens(rest, size, count).removesuffix("...")
            if not head:  # one "word" longer than a chunk: cut it by characters
                head = rest[: max(1, len(rest) // 2)]
            pieces.append(head)
            rest = rest[len(head) :].lstrip()
        if rest:
            pieces.append(rest)
    return pieces


def chunk_text(
    text: str,
    *,
    id_prefix: str,
    title: str,
    source: Source,
    zone: str | None,
    tags: tuple[str, ...] = (),
    npc: str | None = None,
    size: int = 256,
    overlap: int = 64,
    count: TokenCounter = approx_tokens,
) -> list[Chunk]:
    """Cut a document into chunks of at most about `size` tokens sharing `overlap` tokens."""
    header = f"# {title}"
    room = max(8, size - count(header))
    units: list[tuple[str, str | None]] = []
    for unit, heading in _units(text):
        if unit.startswith("#") and unit.lstrip("#").strip() == title:
            continue  # the document's own title heading: every chunk starts with it anyway
        units += [(piece, heading) for piece in _split_long(unit, room, count)]
    chunks: list[Chunk] = []
    start = 0
    while start < len(units):
        end, used = start, 0
        while end < len(units) and (end == start or used + count(units[end][0]) <= room):
            used += count(units[end][0])
            end += 1
        body = [u for u, _ in units[start:end]]
        heading = units[start][1]
        if heading and heading != title and not body[0].startswith("#"):
            body.insert(0, f"## {heading}")
        chunks.append(
            Chunk(
                id=f"{id_prefix}#{len(chunks)}",
                source=source,
                zone=zone,
                title=title,
                text="\n".join([header, *body]),
                tags=tags,
                npc=npc,
            )
        )
        if end >= len(units):
            break
        # The next chunk repeats the last units of this one, up to `overlap` tokens.
        back, shared = end, 0
        while back > start + 1 and shared + count(units[back - 1][0]) <= overlap:
            back -= 1
            shared += count(units[back][0])
        start = back
    return chunks
