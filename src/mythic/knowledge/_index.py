"""Hybrid search: BM25 (`bm25s`) and 384-dim embeddings, blended and reranked.

Shards hold the chunks of one zone (or of the whole world, or one NPC's persona overflow) and
their vectors; an NPC's index joins the shards it knows under one BM25 and one matrix. Vectors
are cached on disk by content hash, so a restart or a reload embeds only what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import tempfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mythic._extras import require
from mythic.knowledge._chunks import Chunk

if TYPE_CHECKING:
    from mythic.knowledge._embed import Embedder, Vectors

log = logging.getLogger(__name__)

Mode = Literal["hybrid", "bm25", "dense", "off"]


_BM25S_OPTIONAL = ("jax", "numba")
"""Accelerators bm25s imports when they are installed, and Mythic never calls."""
_BM25S_LOCK = threading.Lock()


def _bm25s() -> Any:
    """Import `bm25s` without the accelerators it would pick up when installed (JAX, Numba).

    bm25s imports JAX when it can and runs a JAX operation at import, which starts JAX's
    default backend: on a CUDA machine the GPU, where JAX takes 75% of the memory, in the
    server process beside the model. On an H200 with a CUDA build of llama.cpp loaded, that
    import crashed the server twice: first starting JAX on the GPU, and, with JAX kept on the
    CPU (`JAX_PLATFORMS=cpu`), inside JAX's import itself (ml_dtypes). Numba loads LLVM. Scores
    here come from numpy (`get_scores`), so neither has anything to do: while bm25s is
    imported, a module the process has not imported yet is marked absent (bm25s falls back on
    an ImportError), then unmarked, so the game's own `import jax` works as before. During
    that import (once per process, a few hundred ms at the world's first load) another
    thread's first `import jax` or `import numba` would fail: a game imports them before it
    starts Mythic, or after.
    """
    with _BM25S_LOCK:  # one import at a time, and never a half-imported module returned
        module = sys.modules.get("bm25s")
        if module is not None:
            return module
        absent = [name for name in _BM25S_OPTIONAL if name not in sys.modules]
        for name in absent:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
        try:
            return require("bm25s", package="bm25s", extra="rag")
        finally:
            for name in absent:
                if name in sys.modules and sys.modules[name] is None:
                    sys.modules.pop(name, None)


_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "his",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "do",
        "does",
        "did",
        "can",
        "could",
        "shall",
        "should",
        "may",
        "might",
        "must",
        "how",
        "any",
        "some",
        "all",
        "about",
        "up",
        "down",
        "out",
        "over",
        "just",
    ]
)


_SUFFIXES = (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", ""), ("s", ""))


def stem(word: str) -> str:
    """A light English stemmer (plurals, -ing, -ed), enough to match "opens" with "open"."""
    for suffix, keep in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + keep
    return word


def terms(text: str) -> list[str]:
    """The search terms of a text: lowercased words, stop words out, stemmed."""
    return [stem(w.removesuffix("'s")) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


@dataclass(slots=True)
class Shard:
    """The chunks of one zone, the world, or one NPC's persona overflow, with their vectors."""

    key: str
    chunks: list[Chunk]
    vectors: Vectors | None = None
    line_vectors: list[Vectors] | None = None
    """Per chunk, the vectors of its lines after the title: the packer keeps the lines
    closest to the question when a chunk does not fit whole."""

    @property
    def version(self) -> str:
        """Changes when any chunk's content does."""
        h = hashlib.sha256()
        for chunk in self.chunks:
            h.update(chunk.id.encode() + b"\0" + chunk.digest.encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved chunk and how it scored."""

    chunk: Chunk
    score: float
    """The blended score that ranked it."""
    bm25: float
    """BM25 normalised to the best candidate and scaled by the share of the query's words the
    chunk has (0..1)."""
    cosine: float
    lines: tuple[float, ...] = ()
    """Cosine similarity of each of the chunk's lines after the title (dense modes)."""


@dataclass(frozen=True, slots=True)
class Query:
    """What is searched for: the player's line, the turn's intent and the scene's tags."""

    text: str
    intent: str | None = None
    tags: tuple[str, ...] = ()


INTENT_TERMS: dict[str, tuple[str, ...]] = {
    "trade": ("price", "cost", "buy", "sell", "coin", "pay"),
    "navigation": ("way", "road", "path", "gate"),
    "quest": ("quest", "bounty", "reward", "task"),
    "hint": ("secret", "hidden", "rumour"),
    "combat": ("danger", "weapon", "fight", "beast"),
}
"""Search terms an intent adds to the player's line (BM25 only; stemmed as the lore is)."""

INTENT_TAGS: dict[str, tuple[str, ...]] = {
    "trade": ("prices", "trade", "market", "shop"),
    "navigation": ("ways", "routes", "roads", "map", "places"),
    "quest": ("quest", "quests", "bounty"),
    "hint": ("secrets", "rumours"),
    "combat": ("danger", "dangers", "monsters"),
}
"""Lore tags an intent favours in the rerank."""

TAG_BONUS = 0.05
"""Added to a chunk's blended score per tag it shares with the query (at most two), and for
the zone the NPC is in."""
NPC_BONUS = 0.15
"""Added to a chunk tagged with the asked NPC's id: lore about the NPC itself (its tavern, its
shop) answers "your place" questions."""


class VectorCache:
    """Vectors by content hash, one file per shard and embedding model; a missing, corrupt or
    unwritable cache only costs embedding time."""

    def __init__(self, root: Path | None, embedder: Embedder) -> None:
        self.root = root / embedder.name if root is not None else None
        self.embedder = embedder
        self.embedded = 0
        """Chunks embedded (cache misses) since start: a reload of one file embeds only it."""

    def _file(self, world: str, shard: str) -> Path | None:
        if self.root is None:
            return None
        return self.root / hashlib.sha256(world.encode()).hexdigest()[:12] / f"{shard}.npz"

    def _read(self, path: Path | None) -> dict[str, Any]:
        np = require("numpy", package="numpy", extra="rag")
        if path is None or not path.is_file():
            return {}
        try:
            with np.load(path, allow_pickle=False) as data:
                digests, vectors = data["digests"], data["vectors"]
                if vectors.ndim != 2 or vectors.shape[1] != self.embedder.dim:
                    raise ValueError(f"vectors of shape {vectors.shape}")
                return {str(d): vectors[i] for i, d in enumerate(digests)}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            log.warning("ignoring the unreadable index cache %s: %s", path, exc)
            return {}

    def _write(self, path: Path | None, digests: list[str], vectors: Vectors) -> None:
        np = require("numpy", package="numpy", extra="rag")
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, digests=np.array(digests), vectors=vectors)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write the index cache %s: %s", path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def fill(self, world: str, shard: Shard) -> None:
        """Set the vectors of a shard's chunks and of their lines: from the cache, embedding
        only texts not seen before."""
        np = require("numpy", package="numpy", extra="rag")
        path = self._file(world, shard.key)
        known = self._read(path)
        texts = {_digest(c.text): c.text for c in shard.chunks}
        for chunk in shard.chunks:
            texts.update((_digest(line), line) for line in chunk.lines[1:])
        missing = [d for d in texts if d not in known]
        if missing:
            fresh = self.embedder.embed([texts[d] for d in missing])
            for row, d in enumerate(missing):
                known[d] = fresh[row]
            self.embedded += len(missing)
        dim = self.embedder.dim
        shard.vectors = np.array(
            [known[_digest(c.text)] for c in shard.chunks], dtype=np.float32
        ).reshape(-1, dim)
        shard.line_vectors = [
            np.array([known[_digest(ln)] for ln in c.lines[1:]], dtype=np.float32).reshape(-1, dim)
            for c in shard.chunks
        ]
        if missing or len(known) != len(texts):
            keys = list(texts)
            self._write(path, keys, np.array([known[d] for d in keys], dtype=np.float32))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(slots=True)
class Index:
    """Hybrid search over a set of shards."""

    shards: tuple[Shard, ...]
    mode: Mode
    embedder: Embedder | None = None
    chunks: list[Chunk] = field(default_factory=list)
    _bm25: Any = None
    _vectors: Vectors | None = None
    _lines: list[Vectors] = field(default_factory=list)
    _terms: list[frozenset[str]] = field(default_factory=list)
    _line_matrix: Vectors | None = None
    """Every line vector of every chunk, stacked; `_line_starts[i]` is chunk i's first row."""
    _line_starts: Any = None

    def __post_init__(self) -> None:
        np = require("numpy", package="numpy", extra="rag")
        self.chunks = [c for s in self.shards for c in s.chunks]
        if not self.chunks or self.mode == "off":
            return
        if self.mode in ("hybrid", "bm25"):
            bm25s = _bm25s()
            self._bm25 = bm25s.BM25()
            corpus = [terms(f"{c.text} {' '.join(c.tags)}") or ["_"] for c in self.chunks]
            self._bm25.index(corpus, show_progress=False)
            self._terms = [frozenset(words) for words in corpus]
        if self.mode in ("hybrid", "dense"):
            parts = [s.vectors for s in self.shards if s.chunks]
            if any(p is None for p in parts):
                raise ValueError("a shard of a dense index has no vectors")
            self._vectors = np.concatenate(parts) if parts else None
            self._lines = [v for s in self.shards if s.chunks for v in s.line_vectors or ()]
            if len(self._lines) == len(self.chunks) and all(len(v) for v in self._lines):
                self._line_matrix = np.concatenate(self._lines)
                self._line_starts = np.cumsum([0] + [len(v) for v in self._lines[:-1]])

    def _lexical(self, query: Query, k: int) -> dict[int, float]:
        """BM25 top `k`, normalised to the best (0..1) and scaled by the square root of the
        share of the line's words each chunk has: one rare word in common is not a match."""
        if self._bm25 is None:
            return {}
        asked = terms(query.text)
        words = asked + terms(" ".join(INTENT_TERMS.get(query.intent or "", ())))
        if not words:
            return {}
        scores = self._bm25.get_scores(words)
        np = require("numpy", package="numpy", extra="rag")
        k = min(k, len(scores))
        part = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = sorted((int(i) for i in part if scores[i] > 0), key=lambda i: -scores[i])
        best = float(scores[top[0]]) if top else 1.0
        wanted = set(asked) or set(words)
        return {
            i: float(scores[i]) / best * (len(wanted & self._terms[i]) / len(wanted)) ** 0.5
            for i in top
        }

    def _dense(self, qvec: Vectors | None, k: int) -> tuple[dict[int, float], Vectors | None]:
        if self._vectors is None or qvec is None:
            return {}, None
        np = require("numpy", package="numpy", extra="rag")
        sims = self._vectors @ qvec
        if self._line_matrix is not None:
            # A chunk is as close as its closest line: one line may answer a question that the
            # chunk's average meaning does not resemble.
            lines = np.maximum.reduceat(self._line_matrix @ qvec, self._line_starts)
            sims = np.maximum(sims, lines)
        k = min(k, len(sims))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
        return {int(i): float(sims[i]) for i in top}, sims

    def search(
        self,
        query: Query,
        *,
        qvec: Vectors | None = None,
        bm25_k: int = 20,
        dense_k: int = 20,
        top_k: int = 6,
        dense_weight: float = 0.6,
        prefer_zone: str | None = None,
        npc: str | None = None,
    ) -> list[Hit]:
        """The best `top_k` chunks for `query`: BM25 top `bm25_k` and cosine top `dense_k`,
        blended `dense_weight * cosine + (1 - dense_weight) * bm25` (normalised, see
        `_lexical`; a chunk's cosine is its own or its closest line's), plus a small
        bonus for the tags the intent and the scene favour, for `prefer_zone`, and for lore
        tagged with the asked `npc`."""
        if not self.chunks or self.mode == "off":
            return []
        lexical = self._lexical(query, bm25_k)
        dense, sims = self._dense(qvec, dense_k)
        weight = {"hybrid": dense_weight, "dense": 1.0, "bm25": 0.0}[self.mode]
        wanted = set(query.tags) | set(INTENT_TAGS.get(query.intent or "", ()))
        hits: list[tuple[int, Hit]] = []
        for i in lexical.keys() | dense.keys():
            chunk = self.chunks[i]
            bm = lexical.get(i, 0.0)
            cos = float(sims[i]) if sims is not None else 0.0
            score = weight * cos + (1 - weight) * bm
            score += TAG_BONUS * min(2, len(wanted.intersection(chunk.tags)))
            if prefer_zone is not None and chunk.zone == prefer_zone:
                score += TAG_BONUS
            if npc is not None and npc in chunk.tags:
                score += NPC_BONUS
            hits.append((i, Hit(chunk, score, bm, cos)))
        hits.sort(key=lambda ih: (-ih[1].score, ih[1].chunk.id))
        best = hits[:top_k]
        if qvec is None or not self._lines:
            return [h for _, h in best]
        return [
            Hit(h.chunk, h.score, h.bm25, h.cosine, tuple(float(x) for x in self._lines[i] @ qvec))
            for i, h in best
        ]


def build_shards(
    groups: Mapping[str, Sequence[Chunk]],
    *,
    cache: VectorCache | None,
    world: str,
) -> dict[str, Shard]:
    """Shards from chunk groups, with vectors when a cache (and its embedder) is given."""
    shards = {}
    for key, chunks in groups.items():
        shard = Shard(key, list(chunks))
        if cache is not None and shard.chunks:
            cache.fill(world, shard)
        shards[key] = shard
    return shards
