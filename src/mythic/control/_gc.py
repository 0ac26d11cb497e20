"""Python's cyclic garbage collector kept out of frames: run between them, in their slack.

A collection runs when enough objects were allocated, in whatever code allocates the next
one: inside a frame, that frame pays for it. With the model's answers arriving (each one a few
objects), the `mythic sim` region at 1,000 NPCs met a generation-1 collection about every
13 s, 1.2-1.3 ms inside the frame that read or sent an intent; on top of a slow frame, that
is a frame over budget. `SlackGC` turns automatic collection off and runs the same
collections, youngest first, when the game calls `collect()` between frames.
"""

from __future__ import annotations

import gc
from types import TracebackType

__all__ = ["SlackGC"]

# Past this many times a generation's threshold, `collect(slack=False)` collects anyway: a
# game with no slack for a long time must not grow without bound.
_MOST_BEHIND = 8


class SlackGC:
    """Keeps Python's cyclic garbage collection out of frames while in use (a context manager).

    On entering, the heap as it is (the game's and Mythic's modules, the world, the crowd) is
    collected once and frozen (`gc.freeze`): later collections never walk it again. Automatic
    collection is off until exit. Between frames, `collect()` runs what Python would have run
    by then: generation 0 when its allocation count passed its threshold, generation 1 or 2
    when enough younger collections did. It is process-wide: use it in the game's main loop,
    not in a library.
    """

    def __init__(self, *, freeze: bool = True) -> None:
        self.freeze = freeze
        self.collections = [0, 0, 0]
        """Collections run by `collect()`, by generation."""
        self._was_enabled = False
        self._active = False

    def __enter__(self) -> SlackGC:
        self._was_enabled = gc.isenabled()
        gc.collect()
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
        if self.freeze:
            gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    def due(self) -> int | None:
        """The generation a collection is due for now, or None."""
        t0, t1, t2 = gc.get_threshold()
        c0, c1, c2 = gc.get_count()
        if t0 <= 0 or c0 < t0:
            return None
        if t2 > 0 and c2 >= t2 and c1 >= t1:
            return 2
        if t1 > 0 and c1 >= t1:
            return 1
        return 0

    def collect(self, *, slack: bool = True) -> int | None:
        """Run the collection that is due, if any (call it between frames); the generation
        collected, or None. With `slack` false (the frame ran late: no time to spare) it
        waits, unless collections are far behind."""
        if not self._active:
            return None
        generation = self.due()
        if generation is None:
            return None
        if not slack:
            t0 = gc.get_threshold()[0]
            if gc.get_count()[0] < _MOST_BEHIND * t0:
                return None
        gc.collect(generation)
        self.collections[generation] += 1
        return generation
