"""Output processing: a sampled token folded into its request's text (detokenized, stop strings
and the length limit checked) and the text that may go out turned into a `Delta` with its
timing (vLLM's `OutputProcessor`). The engine loop decides what a finished request releases.
"""

from __future__ import annotations

import time

from mythic.engine._backend import Backend
from mythic.engine._input import ActiveRequest
from mythic.engine._request import Delta, FinishReason, Timing


def fold_token(active: ActiveRequest, token: int, backend: Backend) -> FinishReason | None:
    """Add a sampled token to the request's text; the reason the request ends, or None."""
    if backend.is_end_of_generation(token) and not active.request.sampling.ignore_eos:
        return "stop"
    active.generated += 1
    active.pending_tokens += 1
    active.last_token = token
    active.text += active.decoder.decode(backend.piece(token))
    if active.stops:
        window = max(0, active.sent - max(len(stop) for stop in active.stops))
        cut = min(
            (i for i in (active.text.find(stop, window) for stop in active.stops) if i >= 0),
            default=-1,
        )
        if cut >= 0:
            active.text = active.text[:cut]
            return "stop"
    if active.generated >= active.max_tokens:
        active.text += active.decoder.decode(b"", final=True)
        return "length"
    return None


def ready_text(active: ActiveRequest) -> str:
    """The text not sent yet, less an end that could be the start of a stop string."""
    hold = _held_back(active.text, active.stops)
    return active.text[active.sent : len(active.text) - hold]


def next_delta(active: ActiveRequest, text: str, reason: FinishReason | None) -> Delta:
    """The delta carrying `text` (the last one when `reason` is given); counts it as sent."""
    now = time.monotonic()
    since = now - (active.last_delta_at or active.submitted)
    timing = Timing(
        queue_wait_s=(active.scheduled_at or now) - active.submitted,
        first_token_s=(active.first_token_at - active.submitted if active.first_token_at else None),
        token_s=since / max(active.pending_tokens, 1),
        elapsed_s=now - active.submitted,
    )
    final = reason is not None
    delta = Delta(
        request_id=active.request.request_id,
        text=text,
        tokens=active.pending_tokens,
        timing=timing,
        finish_reason=reason,
        prompt_tokens=len(active.prompt) if final else 0,
        cached_tokens=active.cached if final else 0,
    )
    active.sent += len(text)
    active.pending_tokens = 0
    active.last_delta_at = now
    return delta


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that could be the start of a stop string."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold
