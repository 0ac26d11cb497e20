"""A uniform spatial hash over NPC positions, built from scratch each frame with NumPy.

Neighbour queries cost O(N + pairs) instead of the O(N^2) of all pairs: positions are bucketed
into square cells, sorted by cell, and each NPC is paired only with the NPCs of its own and the
adjacent cells. Building is a sort; there is no Python loop over NPCs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_OFFSET = 1 << 20  # cells: coordinates up to about a million cells from the origin
_STRIDE = 1 << 21
# Each unordered pair of adjacent cells once: the cell itself is handled separately.
_HALF_NEIGHBOURS = ((1, -1), (1, 0), (1, 1), (0, 1))
_ALL_NEIGHBOURS = tuple((dx, dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1))

Index = NDArray[np.intp]


def cell_keys(pos: NDArray[np.float32], cell: float) -> NDArray[np.int64]:
    """One integer per position naming its cell (x-major, so `key + _STRIDE` is the cell
    to the right and `key + 1` the cell above)."""
    c = np.floor(pos / np.float32(cell)).astype(np.int64)
    np.clip(c, -_OFFSET + 1, _OFFSET - 2, out=c)
    keys: NDArray[np.int64] = (c[:, 0] + _OFFSET) * _STRIDE + (c[:, 1] + _OFFSET)
    return keys


def _expand(starts: NDArray[np.intp], counts: NDArray[np.intp]) -> Index:
    """Concatenate the ranges [starts[k], starts[k] + counts[k]) without a loop."""
    total = int(counts.sum())
    shift = np.repeat(starts - np.cumsum(counts) + counts, counts)
    out: Index = shift + np.arange(total, dtype=np.intp)
    return out


def close_pairs(
    pos: NDArray[np.float32], radius: float
) -> tuple[Index, Index, NDArray[np.float32], NDArray[np.float32]]:
    """Every unordered pair of positions closer than `radius`, each once.

    Returns:
        `(i, j, delta, dist)`: rows of the pairs, `pos[j] - pos[i]` and its length.
    """
    n = len(pos)
    if n < 2:
        empty = np.zeros(0, dtype=np.intp)
        return empty, empty, np.zeros((0, 2), dtype=np.float32), np.zeros(0, dtype=np.float32)
    keys = cell_keys(pos, radius)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    first = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    first = np.concatenate(([0], first)).astype(np.intp)
    cells = sorted_keys[first]
    size = np.diff(np.append(first, n)).astype(np.intp)
    last_cell = len(cells) - 1
    cell_of = np.repeat(np.arange(len(cells), dtype=np.intp), size)
    rank = np.arange(n, dtype=np.intp)

    # Candidates in sorted order: the same cell (only the NPCs sorted after this one), then
    # the whole of each half-neighbour cell.
    starts = [rank + 1]
    counts = [(first + size)[cell_of] - rank - 1]
    for dx, dy in _HALF_NEIGHBOURS:
        wanted = cells + (dx * _STRIDE + dy)
        at = np.searchsorted(cells, wanted)
        at[at > last_cell] = last_cell
        found = cells[at] == wanted
        starts.append(first[at][cell_of])
        counts.append((size[at] * found)[cell_of])
    count = np.concatenate(counts)
    i_sorted = np.repeat(np.tile(rank, len(starts)), count)
    j_sorted = _expand(np.concatenate(starts), count)
    # Distances on contiguous sorted coordinates; back to rows only for the pairs kept.
    xs = pos[order, 0]
    ys = pos[order, 1]
    dx_all = xs[j_sorted] - xs[i_sorted]
    dy_all = ys[j_sorted] - ys[i_sorted]
    d2 = dx_all * dx_all + dy_all * dy_all
    near = np.flatnonzero(d2 < np.float32(radius * radius))
    delta = np.stack([dx_all[near], dy_all[near]], axis=1)
    dist: NDArray[np.float32] = np.sqrt(d2[near])
    return order[i_sorted[near]], order[j_sorted[near]], delta, dist


def neighbourhood_means(
    pos: NDArray[np.float32], vel: NDArray[np.float32], cell: float
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """For each position, the mean position and velocity of the others in its 3 x 3 cells.

    Coarse on purpose (a cell average, not a radius query): cohesion and alignment only need
    a direction, and this costs a sort and a few bincounts whatever the density.

    Returns:
        `(mean_pos, mean_vel)`: for a position alone in its neighbourhood, its own position
        and zero velocity.
    """
    keys = cell_keys(pos, cell)
    cells, inverse = np.unique(keys, return_inverse=True)
    m = len(cells)
    inverse = inverse.reshape(-1)
    own = np.stack(
        [
            np.bincount(inverse, minlength=m).astype(np.float64),
            np.bincount(inverse, weights=pos[:, 0], minlength=m),
            np.bincount(inverse, weights=pos[:, 1], minlength=m),
            np.bincount(inverse, weights=vel[:, 0], minlength=m),
            np.bincount(inverse, weights=vel[:, 1], minlength=m),
        ]
    )
    total = np.zeros_like(own)
    for dx, dy in _ALL_NEIGHBOURS:
        wanted = cells + (dx * _STRIDE + dy)
        at = np.minimum(np.searchsorted(cells, wanted), m - 1)
        found = cells[at] == wanted
        total += own[:, at] * found
    sums = total[:, inverse]
    others = sums[0] - 1.0
    safe = np.maximum(others, 1.0)
    mean_pos = np.stack([(sums[1] - pos[:, 0]) / safe, (sums[2] - pos[:, 1]) / safe], axis=1)
    mean_vel = np.stack([(sums[3] - vel[:, 0]) / safe, (sums[4] - vel[:, 1]) / safe], axis=1)
    alone = others < 0.5
    mean_pos[alone] = pos[alone]
    mean_vel[alone] = 0.0
    return mean_pos.astype(np.float32), mean_vel.astype(np.float32)
