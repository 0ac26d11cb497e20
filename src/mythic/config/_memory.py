"""`memory`: what NPCs remember, hot, warm and cold."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from mythic.config._paths import default_data_dir
from mythic.config._section import Section


class MemorySettings(Section):
    """NPC memory: hot (in-process), warm (Redis or embedded SQLite), cold (PostgreSQL or
    embedded SQLite)."""

    enabled: bool = True
    """Remember players across sessions (only sessions that name a `player_id`)."""
    data_dir: Path = Field(default_factory=lambda: default_data_dir() / "memory")
    """Where the embedded stores and the archive spool live."""
    hot_turns: int = Field(default=16, ge=2, le=200)
    """Turns kept in process per NPCxplayer (design: 12-20)."""
    hot_ttl_s: float = Field(default=1800.0, gt=0)
    """A hot entry is dropped this long after its last interaction."""
    hot_max_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """LRU bound on the hot tier's total size."""
    warm_url: str | None = None
    """`redis://host:port/db`; unset: the embedded SQLite store in `data_dir`."""
    warm_days: float = Field(default=30.0, gt=0)
    """The nearline window: summaries, facts, emotions and cards older than this expire."""
    warm_prefix: str = Field(default="mythic", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Prefix of every Redis key."""
    cold_url: str | None = None
    """`postgresql://user@host/db`; unset: the embedded SQLite archive in `data_dir`."""
    auto_migrate: bool = True
    """Run the archive's migrations at start; off: `mythic db migrate` must have run."""
    flush_s: float = Field(default=0.1, gt=0, le=60)
    """The archiver writes a batch this long after its first event..."""
    batch: int = Field(default=100, ge=1, le=100_000)
    """...or as soon as this many events wait."""
    cold_timeout_s: float = Field(default=5.0, gt=0)
    """A batch write slower than this counts as an outage: the batch is spooled."""
    retry_s: float = Field(default=1.0, gt=0)
    """How often the archiver retries the database while spooling."""
    prefetch_timeout_s: float = Field(default=0.25, gt=0)
    """The first reply of a conversation waits at most this long for warm memory."""
    summaries: bool = True
    """Summarize sessions with the model (else from the turns alone)."""
    summary_max_tokens: int = Field(default=256, ge=32, le=2048)
    """Longest session summary the model writes, in tokens."""
    fact_half_life_days: float = Field(default=7.0, gt=0)
    """A salient fact's weight halves every this many days unless reinforced."""
    max_facts: int = Field(default=10, ge=1, le=100)
    """Salient facts kept per NPC and player: those with the highest decayed weight."""
    context_chars: int = Field(default=800, ge=0, le=20_000)
    """The `## Recent Memory` section's size in a prompt (about 200 tokens)."""
