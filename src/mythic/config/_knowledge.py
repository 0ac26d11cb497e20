"""`knowledge`: persona, lore retrieval, memory and scene in the prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mythic.config._paths import default_cache_dir
from mythic.config._section import Section


class KnowledgeSettings(Section):
    """What NPCs know at each turn: persona, lore retrieval, memory and scene, packed into
    prompt sections with token budgets."""

    retrieval: Literal["hybrid", "bm25", "dense", "off"] = "hybrid"
    """How lore is found for a player's line: BM25 and 384-dim embeddings blended (`hybrid`),
    one of them alone, or `off` (no `## Lore` section)."""
    persona_tokens: int = Field(default=200, ge=0, le=8192)
    """Budget of the `## Persona` section; persona lines beyond it become retrievable lore."""
    lore_tokens: int = Field(default=400, ge=0, le=8192)
    """Budget of the `## Lore` section."""
    memory_tokens: int = Field(default=200, ge=0, le=8192)
    """Budget of the `## Recent Memory` section."""
    scene_tokens: int = Field(default=150, ge=0, le=8192)
    """Budget of the `## Scene` section."""
    max_context_tokens: int = Field(default=900, ge=0, le=65536)
    """Hard cap on the four sections together; over it, the least relevant scene objects are
    dropped first, then lore is trimmed, then memory."""
    chunk_tokens: int = Field(default=256, ge=32, le=2048)
    """Lore is split into chunks of about this many tokens (design: 256-512; the embedding
    model reads at most 256 word pieces)..."""
    chunk_overlap: int = Field(default=64, ge=0, le=1024)
    """...with this many tokens shared by neighbouring chunks."""
    bm25_k: int = Field(default=20, ge=1, le=1000)
    """Candidates from BM25."""
    dense_k: int = Field(default=20, ge=1, le=1000)
    """Candidates from the embeddings."""
    top_k: int = Field(default=6, ge=1, le=100)
    """Chunks kept after the blended rerank."""
    dense_weight: float = Field(default=0.6, ge=0.0, le=1.0)
    """Weight of the cosine similarity in the blend (the rest: normalised BM25)."""
    max_lore_bytes: int = Field(default=256 * 1024, ge=1024, le=1024 * 1024 * 1024)
    """Lore files larger than this are reported and skipped."""
    cache_dir: Path = Field(default_factory=lambda: default_cache_dir() / "knowledge")
    """Index cache: embeddings by content hash, so a restart or a reload embeds only what
    changed."""
    watch: bool = True
    """Reload the world when its files change (also: `POST /v1/world/reload`)."""
    watch_interval_s: float = Field(default=1.0, gt=0, le=3600)
    """How often the world's files are checked for changes."""

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> KnowledgeSettings:
        if self.chunk_overlap >= self.chunk_tokens:
            raise ValueError(
                f"chunk_overlap ({self.chunk_overlap}) must be smaller than chunk_tokens "
                f"({self.chunk_tokens})"
            )
        return self
