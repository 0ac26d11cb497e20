"""`jobs`: the durable queue of bronze jobs."""

from __future__ import annotations

from pydantic import Field

from mythic.config._section import Section


class JobSettings(Section):
    """Bronze jobs: storyteller, worldbuilding and summaries, on a durable queue."""

    url: str | None = None
    """`postgresql://user@host/db`; unset: an embedded SQLite queue in `memory.data_dir`."""
    workers: int = Field(default=1, ge=0, le=64)
    """Workers in the server (0: none; run `mythic jobs work` elsewhere)."""
    visibility_timeout_s: float = Field(default=120.0, gt=0, le=86400)
    """A claimed job not finished within this long is handed to another worker (its worker is
    presumed dead); a running worker extends it while it works."""
    max_attempts: int = Field(default=4, ge=1, le=100)
    """Deliveries before a failing job moves to the dead-letter list."""
    backoff_s: float = Field(default=2.0, gt=0, le=3600)
    """Wait before a failed job's second attempt; doubled each time."""
    poll_s: float = Field(default=1.0, gt=0, le=60)
    """How often an idle worker looks for jobs other processes queued."""
    max_tokens: int = Field(default=384, ge=16, le=8192)
    """Generated tokens per job."""
