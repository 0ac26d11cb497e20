"""Neighbour search over NPC positions without a Python loop, and a neighbour list kept
across frames.

Finding the pairs closer than a radius costs O(N log N + pairs) instead of the O(N^2) of all
pairs: positions are cut into columns one radius wide and sorted by column, then height, so
each NPC's possible partners are two runs of the sorted order (above it in its own column;
beside it in the next). A sort and a few binary searches, whatever the layout.

That is still dear at thousands of NPCs, and NPCs move centimetres per frame, so
`NeighbourList` keeps the pairs within the radius *plus a skin* and reuses them for as long as
no pair can have closed by more than the skin (a Verlet list): measuring only the listed
pairs again finds exactly the pairs a new search would. The next search runs in the
background, a slice per frame, so that no frame pays for a whole one. Bodies only need the
pairs about to touch: `NeighbourList.touching` gives a band of the list, cut by the gaps
taken at the search, that holds them all, so a frame measures a fraction of the list.

Positions are read as complex numbers (`complex_positions`): the delta of a pair is two
gathers instead of four, with the same float32 arithmetic on x and y.

Horde cohesion and alignment average over coarse square cells (`neighbourhood_means`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

_OFFSET = 1 << 20  # cells: coordinates up to about a million cells from the origin
_STRIDE = 1 << 21
_ALL_NEIGHBOURS = tuple((dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1))
_SKIN_ROUNDING = 1e-3  # this fraction of the skin is kept for float32 rounding
_MOST_SLICES = 32  # a search in the background is spread over at most this many frames
_RATE_DECAY = 0.95  # a frame's share of the closing rate that is kept from the one before
# A search in the background looks where the NPCs will be this far into the frames it is
# given. Not at their end: it usually finishes early (its slices shrink as the list closes)
# and NPCs turn. Predicted to the end, the lists at 10,000 NPCs of the `mythic sim` region
# were taken over a third or more closed already (p90 0.35 m of a 0.5 m skin); the next
# search then ran out of frames and was done at once, 2-4 ms in one frame, about once every
# 2 s. Halfway: none after the first frames, the same mean cost.
_AHEAD_SHARE = 0.5
_BAND_M = 0.1  # metres: `NeighbourList.touching` cuts its bands in steps this wide

Index = NDArray[np.intp]
F32 = NDArray[np.float32]
C64 = NDArray[np.complex64]


def _cells(x: F32, y: F32, cell: float) -> tuple[Index, Index]:
    """Each position's cell column and row (clipped to about a million cells from the
    origin, so that far-off positions cannot overflow)."""
    scale = np.float32(1 / cell)
    out = []
    for v in (x, y):
        c = np.floor(v * scale)
        np.clip(c, -_OFFSET + 1, _OFFSET - 2, out=c)
        out.append(c.astype(np.intp))
    return out[0], out[1]


def _table(cx: Index, cy: Index) -> tuple[Index, int, int] | None:
    """Cells numbered x-major on a table over the bounding box with one empty cell all
    round, or None when that table would be much larger than the number of positions (a
    crowd spread far and wide). Returns `(cell, columns, rows)`."""
    x0, y0 = int(cx.min()), int(cy.min())
    columns = int(cx.max()) - x0 + 3
    rows = int(cy.max()) - y0 + 3
    if columns * rows > 6 * len(cx) + 4096:
        return None
    cell: Index = (cx - (x0 - 1)) * rows + (cy - (y0 - 1))
    return cell, columns, rows


def _expand(starts: Index, counts: Index) -> Index:
    """Concatenate the ranges [starts[k], starts[k] + counts[k]) without a loop."""
    total = int(counts.sum())
    out: Index = np.repeat(starts - np.cumsum(counts) + counts, counts)
    out += np.arange(total, dtype=np.intp)
    return out


@dataclass(frozen=True, slots=True)
class Pairs:
    """Unordered pairs of rows, each once, with `pos[j] - pos[i]` and its squared length."""

    i: Index
    j: Index
    delta: C64
    """`pos[j] - pos[i]` as `dx + i dy` (see `complex_positions`)."""
    d2: F32

    @property
    def dx(self) -> F32:
        out: F32 = self.delta.real
        return out

    @property
    def dy(self) -> F32:
        out: F32 = self.delta.imag
        return out

    def __len__(self) -> int:
        return len(self.i)


_NO_ROWS = np.zeros(0, dtype=np.intp)
_NO_VALUES = np.zeros(0, dtype=np.float32)
_NO_COMPLEX = np.zeros(0, dtype=np.complex64)
NO_PAIRS = Pairs(_NO_ROWS, _NO_ROWS, _NO_COMPLEX, _NO_VALUES)


def complex_positions(pos: F32) -> C64:
    """Positions (N x 2 float32) as N complex numbers `x + iy`: a pair's delta is then two
    gathers and one subtraction, with the same float32 arithmetic on each part."""
    out: C64 = np.ascontiguousarray(pos, dtype=np.float32).view(np.complex64)[:, 0]
    return out


def squared_norm(z: C64) -> F32:
    """`x * x + y * y` of complex numbers `x + iy`, in float32."""
    parts = z.view(np.float32)
    squares = parts * parts
    out: F32 = squares[0::2] + squares[1::2]
    return out


def _measure(z: C64, i: Index, j: Index, radius: float) -> Pairs:
    """The pairs among (i, j) closer than `radius` at positions `z` (see `complex_positions`)."""
    dz = z.take(j)
    dz -= z.take(i)
    d2 = squared_norm(dz)
    near = (d2 < np.float32(radius * radius)).nonzero()[0]
    return Pairs(i.take(near), j.take(near), dz.take(near), d2.take(near))


def _sort(key: NDArray[np.float64], hint: Index | None) -> Index:
    """A stable order of `key`; `hint` is a previous order of nearly the same keys (sorting
    what is almost sorted already is cheaper)."""
    if hint is not None and len(hint) == len(key):
        return hint[np.argsort(key[hint], kind="stable")]
    order: Index = np.argsort(key, kind="stable")
    return order


class _Search:
    """A search for every unordered pair of positions closer than `radius`, each once, that
    can be done in parts (over several frames).

    Positions are cut into columns `radius` wide and sorted by column, then by height. Each
    is compared only with the run of positions above it in its own column (up to `radius`
    higher) and the run in the column to its right (within `radius` of its height): two
    binary searches per run, and a third less area than the 3 x 3 cells of a square grid.
    Positions that are not finite have no pairs.
    """

    def __init__(self, pos: F32, radius: float, hint: Index | None = None) -> None:
        self.radius = radius
        self.z: C64 = complex_positions(pos).copy()
        """The positions searched (see `complex_positions`)."""
        self.order: Index | None = None
        """The sorted order of the rows (a hint for the next search), None when some
        positions were left out."""
        self._rows: Index | None = None  # the rows searched, when not all
        self._found: list[tuple[Index, Index, F32]] = []
        self._done = 0  # sorted ranks searched
        z = self.z
        x, y = z.real, z.imag
        if not all(math.isfinite(float(v)) for v in (x.min(), x.max(), y.min(), y.max())):
            self._rows = (np.isfinite(x) & np.isfinite(y)).nonzero()[0]
            z = z.take(self._rows)
            x, y = z.real, z.imag
            hint = None
        bottom = float(y.min()) if len(y) else 0.0
        top = float(y.max()) if len(y) else 0.0
        column = np.floor(x * np.float32(1 / radius)).astype(np.float64)
        np.clip(column, -_OFFSET, _OFFSET, out=column)
        span = top - bottom + 2 * radius + 1.0  # one column's stretch of the key
        key = column * span + (y.astype(np.float64) - bottom)
        order = _sort(key, hint)
        if self._rows is None:
            self.order = order
        self._sorted = order
        self._keys = key[order]
        self._span = span
        self._zs = z.take(order)
        # Slack for the rounding of the keys: a run may hold a few too many, never too few.
        end = max(abs(key.min()), abs(key.max())) if len(key) else 0.0
        self._slack = 4 * float(np.spacing(end))
        # Each position's two runs: three binary searches of every key, one per frame when
        # the search is spread over frames.
        self._runs_left = 3
        self._up = self._right_at = self._right = self._work = _NO_ROWS

    def _find_runs(self) -> None:
        """The next of the three binary searches that find each position's two runs."""
        sk = self._keys
        run = self.radius * (1 + 1e-6) + self._slack
        if self._runs_left == 3:
            rank = np.arange(len(sk), dtype=np.intp)
            self._up = np.searchsorted(sk, sk + run, side="right") - rank - 1
        elif self._runs_left == 2:
            self._right_at = np.searchsorted(sk, sk + (self._span - run), side="left")
        else:
            right = np.searchsorted(sk, sk + (self._span + run), side="right")
            self._right = right - self._right_at
            self._work = np.cumsum(self._up + self._right)  # candidates up to each rank
        self._runs_left -= 1

    @property
    def finished(self) -> bool:
        return self._done == len(self._sorted)

    def advance(self, parts: int = 1) -> None:
        """Search the next of `parts` equal shares of what is left (all of it for 1; while
        more shares are left than binary searches to find the runs, a share is one of
        those)."""
        lo = self._done
        if lo == len(self._sorted):
            return
        if self._runs_left:
            if parts > self._runs_left:
                self._find_runs()
                return
            while self._runs_left:
                self._find_runs()
        if parts <= 1:
            hi = len(self._sorted)
        else:
            before = int(self._work[lo - 1]) if lo else 0
            share = before + (int(self._work[-1]) - before) / parts
            hi = max(lo + 1, int(np.searchsorted(self._work, share, side="right")))
            hi = min(hi, len(self._sorted))
        rank = np.arange(lo, hi, dtype=np.intp)
        count = np.concatenate([self._up[lo:hi], self._right[lo:hi]])
        i_sorted = np.repeat(np.concatenate([rank, rank]), count)
        j_sorted = _expand(np.concatenate([rank + 1, self._right_at[lo:hi]]), count)
        # Distances on contiguous sorted coordinates; back to rows only for the pairs kept.
        dz = self._zs.take(j_sorted)
        dz -= self._zs.take(i_sorted)
        d2 = squared_norm(dz)
        near = (d2 < np.float32(self.radius * self.radius)).nonzero()[0]
        i = self._sorted.take(i_sorted.take(near))
        j = self._sorted.take(j_sorted.take(near))
        if self._rows is not None:
            i, j = self._rows.take(i), self._rows.take(j)
        self._found.append((i, j, d2.take(near)))
        self._done = hi
        if hi == len(self._sorted):  # done: let go of what only the slices read
            self._zs = _NO_COMPLEX
            self._up = self._right_at = self._right = self._work = _NO_ROWS

    def pairs(self) -> tuple[Index, Index, F32]:
        """Rows `(i, j)` of the pairs found (all of them once finished), and their squared
        distances at the positions searched."""
        if len(self._found) != 1:
            found = self._found or [(_NO_ROWS, _NO_ROWS, _NO_VALUES)]
            i = np.concatenate([i for i, _, _ in found])
            j = np.concatenate([j for _, j, _ in found])
            d2 = np.concatenate([d2 for _, _, d2 in found])
            self._found = [(i, j, d2)]
        return self._found[0]


def close_pairs(pos: F32, radius: float) -> tuple[Index, Index, F32, F32]:
    """Every unordered pair of positions closer than `radius`, each once.

    Returns:
        `(i, j, delta, dist)`: rows of the pairs, `pos[j] - pos[i]` and its length.
    """
    if len(pos) < 2:
        return _NO_ROWS, _NO_ROWS, np.zeros((0, 2), dtype=np.float32), _NO_VALUES
    search = _Search(pos, radius)
    search.advance()
    i, j, _ = search.pairs()
    pairs = _measure(complex_positions(pos), i, j, radius)
    dist: F32 = np.sqrt(pairs.d2)
    return pairs.i, pairs.j, pairs.delta.view(np.float32).reshape(-1, 2), dist


class NeighbourList:
    """The pairs of NPCs closer than `radius`, frame after frame, from a list of the pairs
    within `radius + skin` that is searched again in the background before it goes stale.

    A pair outside the list was at least `radius + skin` apart when it was searched; it can
    only have come within `radius` if its two NPCs moved more than `skin` relative to each
    other. Every frame the two largest moves since (less the crowd's mean move) are added up:
    while they stay within the skin, only the listed pairs are measured again, which finds
    the same pairs a new search would for a fraction of the cost. Once they pass `early` of
    the skin, a new search starts and is done a slice per frame, paced to finish before the
    list would go stale at the rate it is closing; it then takes over. Past the whole skin,
    or when the rows changed, the list is searched again at once (over just the radius while
    pairs close by more than the skin a frame, when no list could last). A larger skin
    searches less often and measures more pairs each frame.

    `update` keeps the list and `measure` measures it; a caller that needs the close pairs
    only now and then (separation steering) updates every frame and measures when it needs
    them. `touching` narrows the list to the pairs whose bodies may touch, from distances
    kept since the search, without measuring the whole list.
    """

    def __init__(self, radius: float, skin: float, *, early: float = 0.3) -> None:
        self.radius = radius
        self.skin = skin
        self.early = early
        self.builds = 0
        """Times the list was replaced by a new search."""
        self.waits = 0
        """Times a search had to be done at once, holding up the frame."""
        self._budget = 0.0  # how far the list's pairs may close (its skin, but for rounding)
        self._version: object = None
        self._frame = 0
        self._since = 0  # the frame the list's positions are for (at most the current one)
        self._closed = 0.0  # how far any pair may have moved since then, as of `update`
        # How fast the lists have been closing, metres a frame: the largest recent step, let
        # go of slowly. A background search is paced by it. (A list taken over from a search
        # in the background starts some way closed already, at its prediction's error: the
        # closing since the list's frame would overstate the rate and rush the next search
        # into one frame.)
        self._rate = 0.0
        self._z = _NO_COMPLEX  # the positions the list was searched at
        self._i = _NO_ROWS
        self._j = _NO_ROWS
        self._d2 = _NO_VALUES  # the listed pairs' squared distances at `_z`
        self._order: Index | None = None
        self._next: tuple[_Search, int] | None = None  # a search under way, and its frame
        self._gaps: F32 | None = None  # the listed pairs' gaps between bodies at `_z`
        self._gap_bodies = _NO_VALUES  # the body radii those gaps are for
        self._reach = _NO_VALUES  # the listed pairs' sums of body radii, with `_gaps`
        # The last band `touching` cut, and its width in `_BAND_M` steps.
        self._band: tuple[int, tuple[Index, Index, F32]] | None = None

    def pairs(self, pos: F32, version: object, vel: F32 | None = None, dt: float = 0.0) -> Pairs:
        """The pairs closer than `radius` at `pos` (N x 2): `update`, then `measure`."""
        self.update(pos, version, vel, dt)
        return self.measure(pos)

    def update(self, pos: F32, version: object, vel: F32 | None = None, dt: float = 0.0) -> None:
        """Keep the list right for the positions `pos` (N x 2), once a frame. `version` names
        the rows: the list is searched again when it differs from the last call's (NPCs
        added, removed or reordered). With the velocities `vel` and the frame time `dt`, a
        search in the background looks where the NPCs will be while it runs (halfway through
        the frames it is given), so its list lasts longer."""
        self._frame += 1
        if len(pos) < 2:
            self._version = None
            self._next = None
            self._i = self._j = _NO_ROWS
            self._d2 = _NO_VALUES
            self._gaps = None
            self._band = None
            return
        z = complex_positions(pos)
        same = version == self._version
        closing = self._closing(z, self._z) if same else math.inf
        if not closing <= self._budget:  # stale (NaN included)
            self._next = None
            # Closing by more than the skin a frame (bodies flung apart, a crowd spawned on
            # top of itself), no list would last: search just the radius until it calms.
            rushed = closing / max(self._frame - self._since, 1) > self.skin
            skin = 0.0 if same and rushed else self.skin
            search = _Search(pos, self.radius + skin, self._order if same else None)
            search.advance()
            self._adopt(search, self._frame, version, skin)
            self._closed = 0.0
            self.waits += 1
            return
        if math.isfinite(closing - self._closed):
            self._rate = max(closing - self._closed, self._rate * _RATE_DECAY)
        self._closed = closing
        if self._next is not None:
            search, due = self._next
            search.advance(self._slices(closing))
            if search.finished:
                self._next = None
                # It stands in for the list if nothing moved too far while it ran.
                moved = self._closing(z, search.z)
                if moved <= self.skin * (1 - _SKIN_ROUNDING):
                    self._adopt(search, min(due, self._frame), version, self.skin)
                    self._closed = moved
        elif closing > self._budget * self.early:
            slices = self._slices(closing)
            ahead = pos if vel is None else pos + vel * np.float32(slices * dt * _AHEAD_SHARE)
            self._next = _Search(ahead, self.radius + self.skin, self._order), self._frame + slices

    def measure(self, pos: F32) -> Pairs:
        """The pairs closer than `radius` at `pos`, the positions last passed to `update`."""
        if len(pos) < 2:
            return NO_PAIRS
        return _measure(complex_positions(pos), self._i, self._j, self.radius)

    def touching(self, body: F32, gap: float) -> tuple[Index, Index, F32]:
        """Rows `(i, j)` of the listed pairs, in list order, whose bodies may be less than
        `gap` apart (their distance less both `body` radii) at the positions last passed to
        `update`: all of those, and some further apart; and the sum of their radii.

        The gaps are taken once per list, where it was searched; since then no pair can have
        moved nearer or further by more than the closing `update` found, so a band of the
        list within the gap plus that holds every pair that may touch. Bands are cut in
        steps of `_BAND_M`; the last one stands in for any narrower one (the list closes
        further, frame after frame, so a band is cut every few frames) until the list is
        replaced.
        """
        if len(self._i) == 0:
            return _NO_ROWS, _NO_ROWS, _NO_VALUES
        if self._gaps is None or not np.array_equal(body, self._gap_bodies):
            self._reach = body.take(self._i) + body.take(self._j)
            self._gaps = np.sqrt(self._d2) - self._reach
            self._gap_bodies = body.copy()
            self._band = None
        step = math.ceil((gap + self._closed) * (1 + _SKIN_ROUNDING) / _BAND_M + _SKIN_ROUNDING)
        if self._band is not None and self._band[0] >= step:
            return self._band[1]
        keep = (self._gaps < np.float32(step * _BAND_M)).nonzero()[0]
        band = self._i.take(keep), self._j.take(keep), self._reach.take(keep)
        self._band = step, band
        return band

    def _slices(self, closing: float) -> int:
        """Frames to spread the rest of a search over: most of those left before the list
        would go stale, at the rate it has been closing."""
        rate = self._rate
        left = (self._budget - closing) / rate if rate > 0 else math.inf
        return int(min(max(0.8 * left, 1), _MOST_SLICES))

    def _closing(self, z: C64, z0: C64) -> float:
        """How much some pair may have closed since the positions were `z0`: the two largest
        moves, after taking off the mean move (a pair closes by at most the difference of
        its two moves, the same from any common drift: a crowd marching together keeps its
        list for as long as it keeps its shape). No pair can have moved apart by more
        either."""
        with np.errstate(invalid="ignore", over="ignore"):  # a position written NaN or inf
            move = z - z0
            move -= move.mean()
            moved = squared_norm(move)
        k = int(moved.argmax())
        first = float(moved[k])
        moved[k] = 0
        return math.sqrt(first) + math.sqrt(float(moved.max()))

    def _adopt(self, search: _Search, frame: int, version: object, skin: float) -> None:
        self._budget = skin * (1 - _SKIN_ROUNDING)
        self._i, self._j, self._d2 = search.pairs()
        self._z = search.z
        self._order = search.order
        self._since = frame
        self._version = version
        self._gaps = None
        self._band = None
        self.builds += 1


def neighbourhood_means(x: F32, y: F32, vx: F32, vy: F32, cell: float) -> tuple[F32, F32, F32, F32]:
    """For each position, the mean position and velocity of the others in its 3 x 3 cells.

    Coarse on purpose (a cell average, not a radius query): cohesion and alignment only need
    a direction, and this costs a few bincounts (and, for a crowd spread far and wide, a
    sort) whatever the density.

    Returns:
        `(x, y, vx, vy)` of the means: for a position alone in its neighbourhood, its own
        position and zero velocity.
    """
    cx, cy = _cells(x, y, cell)
    quantities = (None, x, y, vx, vy)
    table = _table(cx, cy)
    if table is not None:
        # Sum each quantity per cell on the table, then over every 3 x 3 block of it.
        own, columns, rows = table
        sums = []
        block = np.zeros((columns, rows))
        for q in quantities:
            grid = np.bincount(own, weights=q, minlength=columns * rows).reshape(columns, rows)
            across = grid[:-2] + grid[1:-1] + grid[2:]
            block[1:-1, 1:-1] = across[:, :-2] + across[:, 1:-1] + across[:, 2:]
            sums.append(block.ravel()[own])
    else:
        keys = (cx + _OFFSET).astype(np.int64) * _STRIDE + (cy + _OFFSET)
        cells, inverse = np.unique(keys, return_inverse=True)
        m = len(cells)
        inverse = inverse.reshape(-1)
        per_cell = np.stack([np.bincount(inverse, weights=q, minlength=m) for q in quantities])
        total = np.zeros_like(per_cell)
        for dx, dy in _ALL_NEIGHBOURS:
            wanted = cells + (dx * _STRIDE + dy)
            found = np.minimum(np.searchsorted(cells, wanted), m - 1)
            total += per_cell[:, found] * (cells[found] == wanted)
        sums = list(total[:, inverse])
    count, sx, sy, svx, svy = sums
    others = count - 1.0
    alone = others < 0.5
    inv = 1.0 / np.maximum(others, 1.0)
    mean_x = np.where(alone, x, (sx - x) * inv).astype(np.float32)
    mean_y = np.where(alone, y, (sy - y) * inv).astype(np.float32)
    mean_vx = np.where(alone, 0.0, (svx - vx) * inv).astype(np.float32)
    mean_vy = np.where(alone, 0.0, (svy - vy) * inv).astype(np.float32)
    return mean_x, mean_y, mean_vx, mean_vy
