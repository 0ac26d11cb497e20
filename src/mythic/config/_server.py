"""`server`: the WebSocket and HTTP gateway."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mythic.config._section import Section


class ServerSettings(Section):
    """`mythic serve`: the WebSocket and HTTP gateway."""

    host: str = "127.0.0.1"
    """Interface to listen on; 0.0.0.0 for every interface."""

    port: int = Field(default=8765, ge=0, le=65535)
    """TCP port (0: any free port)."""

    max_frame_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    """Largest WebSocket frame accepted; a larger one gets `frame_too_large`."""

    rate_per_s: float = Field(default=50.0, gt=0)
    """Messages a connection may send per second, sustained; more get `rate_limited`."""

    rate_burst: int = Field(default=100, ge=1)
    """Messages a connection may send at once before the rate applies."""

    max_violations: int = Field(default=50, ge=1)
    """Bad or refused messages a connection may send before it is closed (code 1008)."""

    resume_ttl_s: float = Field(default=60.0, ge=0)
    """How long a disconnected session waits to be resumed before it is forgotten."""

    max_sessions: int = Field(default=1024, ge=1)
    """Sessions held at once, connected or waiting to be resumed."""

    outbox_size: int = Field(default=4096, ge=16)
    """Messages queued for a slow or disconnected client before it is dropped."""

    warm_npcs: int = Field(default=8, ge=0, le=256)
    """At start, once the engines are warmed (readiness does not wait for it), the prompts of
    up to this many of the world's NPCs (by id) are evaluated in the background at bronze
    priority: each one's persona and, with `dialogue.decide`, its decision prompt, kept as
    shared prefixes. A session's first line to one of them then starts from cache (4 voice
    players at once on 2 CPU cores: first lines 2.4-3.8 s instead of 5.6-12.8 s). 0: none;
    for a bigger world the game calls `POST /v1/warmup` for the NPCs near the player."""

    heap_trim_s: float = Field(default=60.0, ge=0)
    """How often the server gives the heap's freed memory back to the system (glibc's
    `malloc_trim`, in a worker thread), so that resident memory follows what is in use rather
    than the highest it has been (a burst of parked KV, a world reload). 0: never."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """What `mythic serve` logs of Mythic's own to stderr: `info` has each voice turn's
    latency trace; `debug` adds each engine request's prompt tokens (and how many were
    cached), queue wait and first-token time. Other libraries log warnings only."""
