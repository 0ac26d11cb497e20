"""Python's cyclic garbage collector kept out of frames: run between them, in their slack.

A collection runs when enough objects were allocated, in whatever code allocates the next
one: inside a frame, that frame pays for it. With the model's answers arriving (each one a few
objects), the `mythic sim` region at 1,000 NPCs met a generation-1 collection about 13 s
into each run, 1.2-1.3 ms inside the frame that read or sent an intent; on top of a slow
frame, that is a frame over budget. `SlackGC` turns automatic collection off and runs the same
collections when the game calls `collect()` between frames, where they fit.
"""

from __future__ import annotations

import gc
import time
from types import TracebackType

__all__ = ["SlackGC"]

# Past this many times generation 0's threshold, `collect()` collects whatever the slack: a
# game with no slack for a long time must not grow without bound.
_MOST_BEHIND = 8


class SlackGC:
    """Keeps Python's cyclic garbage collection out of frames while in use (a context manager).

    On entering, the heap as it is (the game's and Mythic's modules, the world, the crowd) is
    collected once and frozen (`gc.freeze`): later collections never walk it again. Automatic
    collection is off until exit. Between frames, `collect()` runs what CPython would have run
    by then, by the same counts: generation 0 once more objects than its threshold were
    allocated, and then the oldest generation whose count passed its threshold. (CPython also
    skips most full collections while few objects have reached the oldest generation since
    the last; that count is not visible from Python, so the oldest is collected by its
    threshold alone, which costs what survived since the freeze.) It is process-wide: use it
    in the game's main loop, not in a library.
    """

    def __init__(self, *, freeze: bool = True) -> None:
        self.freeze = freeze
        self.collections = [0, 0, 0]
        """Collections run by `collect()`, by generation."""
        self.cost_s = [0.0, 0.0, 0.0]
        """How long the last collection of each generation took."""
        self._was_enabled = False
        self._froze = False
        self._active = False

    def __enter__(self) -> SlackGC:
        self._was_enabled = gc.isenabled()
        gc.collect()
        # A heap the game froze already stays frozen on exit: only a freeze of ours is undone.
        self._froze = self.freeze and gc.get_freeze_count() == 0
        if self.freeze:
            gc.freeze()
        gc.disable()
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        if self._froze:
            gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def due(self) -> int | None:
        """The generation a collection is due for now, or None."""
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if t0 <= 0 or c0 <= t0:
            return None
        if c2 > t2:
            return 2
        if c1 > t1:
            return 1
        return 0

    def collect(self, slack_s: float | None = None) -> int | None:
        """Run the collection that is due, if any, between frames; the generation collected,
        or None. `slack_s`: the time left before the next frame is due. The collection waits
        while that is shorter than the last one of its generation took (the first one of each
        runs in any slack), unless collections are far behind."""
        if not self._active:
            return None
        generation = self.due()
        if generation is None:
            return None
        behind = gc.get_count()[0] > _MOST_BEHIND * gc.get_threshold()[0]
        if slack_s is not None and self.cost_s[generation] > slack_s and not behind:
            return None
        started = time.perf_counter()
        gc.collect(generation)
        self.cost_s[generation] = time.perf_counter() - started
        self.collections[generation] += 1
        return generation
