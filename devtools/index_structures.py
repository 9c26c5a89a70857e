"""``python -m devtools index-structures``: the trajectory index's key store against the plain ones.

:class:`~torchrl_fixes.fixes.slice_boundary_index.trajectory_index.TrajectoryIndex`
keeps its stops in a :class:`SortedKeys`: one flat sorted array whose free room (a
gap) stays where the last change was. Two plainer stores serve the same calls and
are timed here in its place, on the same index code:

- :class:`FlatKeys`: a flat sorted array, rebuilt around each change
  (``np.concatenate``): ``O(T)`` per change, ``O(1)`` per lookup by rank;
- :class:`BlockedKeys`: the keys of each fixed block of rows in an array of its
  own, with a prefix count over blocks to find a rank: ``O(keys in the block)`` per
  change, a search over ``B`` block counts per lookup.

Each case times, in one process and in turn, a write of 1,000 rows into the index
followed by a draw of 256 trajectories by rank (what a slice sample after a write
asks of it), for a buffer that grows and one that is full and wraps around, at
several trajectory counts. Ratios to :class:`SortedKeys` are what hold.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from torchrl_fixes.fixes.slice_boundary_index import trajectory_index
from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import (
    SortedKeys,
    TrajectoryIndex,
)

WRITE, DRAWS = 1_000, 256
# Rows per block of BlockedKeys.
BLOCK = 1 << 16


class FlatKeys:
    """Sorted keys and values in two flat arrays, rebuilt around each change."""

    def __init__(self, keys=trajectory_index._NO_KEYS, values=None):
        self._keys = np.array(keys, dtype=np.int64)
        self._values = np.zeros_like(self._keys) if values is None else np.array(values)

    def __len__(self):
        return self._keys.size

    def array(self, values=False):
        return (self._values if values else self._keys).copy()

    def take(self, ranks):
        return self._keys[ranks]

    def values(self, ranks):
        return self._values[ranks]

    def rank(self, keys, side="left"):
        return self._keys.searchsorted(keys, side)

    def contains(self, key):
        rank = self.rank(key)
        return rank < len(self) and self._keys[rank] == key

    def replace(self, lo, hi, keys):
        first, last = self.rank(np.array([lo, hi + 1]))
        filler = np.zeros_like(keys)
        self._keys = np.concatenate([self._keys[:first], keys, self._keys[last:]])
        self._values = np.concatenate([self._values[:first], filler, self._values[last:]])
        return int(first)

    def set_values(self, ranks, values):
        if isinstance(ranks, int):
            ranks = np.arange(ranks, ranks + values.size)
        self._values[ranks] = values


class BlockedKeys:
    """The keys of each block of :data:`BLOCK` rows in an array of their own, with a
    prefix count over the blocks to find a rank."""

    def __init__(self, keys=trajectory_index._NO_KEYS, values=None):
        keys = np.array(keys, dtype=np.int64)
        values = np.zeros_like(keys) if values is None else np.array(values)
        self._keys, self._values = [], []
        self._assign(keys, values)

    def _assign(self, keys, values):
        blocks = int(keys[-1]) // BLOCK + 1 if keys.size else 1
        cuts = keys.searchsorted(np.arange(blocks + 1) * BLOCK)
        self._keys = [keys[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        self._values = [values[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        self._counts()

    def _counts(self):
        self._sizes = np.array([block.size for block in self._keys])
        self._ends = np.cumsum(self._sizes)

    def __len__(self):
        return int(self._ends[-1]) if self._ends.size else 0

    def array(self, values=False):
        return np.concatenate(self._values if values else self._keys)

    def _where(self, ranks):
        """The block of each of ``ranks`` and the position in it."""
        ranks = np.atleast_1d(ranks)
        blocks = self._ends.searchsorted(ranks, "right")
        return blocks, ranks - (self._ends - self._sizes)[blocks]

    def _gather(self, arrays, ranks):
        blocks, at = self._where(ranks)
        found = [arrays[b][i] for b, i in zip(blocks.tolist(), at.tolist())]
        return np.array(found, dtype=np.int64) if np.ndim(ranks) else found[0]

    def take(self, ranks):
        return self._gather(self._keys, ranks)

    def values(self, ranks):
        return self._gather(self._values, ranks)

    def rank(self, keys, side="left"):
        keys = np.asarray(keys)
        blocks = np.minimum(keys // BLOCK, len(self._keys) - 1)
        before = np.where(blocks > 0, self._ends[blocks - 1], 0)
        within = [self._keys[b].searchsorted(k, side) for b, k in zip(np.atleast_1d(blocks), np.atleast_1d(keys))]
        ranks = before + np.array(within)
        return ranks if keys.ndim else int(ranks[0])

    def contains(self, key):
        rank = self.rank(key)
        return rank < len(self) and self.take(rank) == key

    def replace(self, lo, hi, keys):
        first = self.rank(lo)
        while len(self._keys) <= hi // BLOCK:
            self._keys.append(trajectory_index._NO_KEYS)
            self._values.append(trajectory_index._NO_KEYS)
        for block in range(lo // BLOCK, hi // BLOCK + 1):
            base, old, values = block * BLOCK, self._keys[block], self._values[block]
            a, b = old.searchsorted(max(lo, base)), old.searchsorted(min(hi, base + BLOCK - 1), "right")
            new = keys[(keys >= base) & (keys < base + BLOCK)]
            self._keys[block] = np.concatenate([old[:a], new, old[b:]])
            self._values[block] = np.concatenate([values[:a], np.zeros_like(new), values[b:]])
        self._counts()
        return first

    def set_values(self, ranks, values):
        if isinstance(ranks, int):
            ranks = np.arange(ranks, ranks + values.size)
        blocks, at = self._where(ranks)
        for block, i, value in zip(blocks.tolist(), at.tolist(), values.tolist()):
            self._values[block][i] = value


STORES = {"SortedKeys (gap)": SortedKeys, "FlatKeys": FlatKeys, "BlockedKeys": BlockedKeys}


def _time_case(store, stored: int, episode_len: int, wraps: bool, rounds: int) -> float:
    """The median time of a 1,000-row write plus a draw of 256, with ``store`` as the keys."""
    saved = trajectory_index.SortedKeys
    trajectory_index.SortedKeys = store
    try:
        capacity = stored if wraps else 2 * stored
        index = TrajectoryIndex(capacity)
        index.assign(np.arange(episode_len - 1, stored, episode_len), stored, wraps, 0 if wraps else None)
        rng = np.random.default_rng(0)
        length, cursor, times = stored, 0, []
        for _ in range(rounds):
            start = cursor if wraps else length
            rows = np.arange(start, start + WRITE) % capacity
            stops = rows[(rows + 1) % episode_len == 0]
            begin = time.perf_counter()
            if not wraps:
                length += WRITE
            cursor = int(rows[-1])
            first = max(int(rows[0]) - 1, 0)
            index.update(length, wraps, cursor if wraps else None, [(first, int(rows[-1]), np.sort(stops[stops >= first]))])
            index.select(rng.integers(0, index.count(4), DRAWS), 4)
            times.append(time.perf_counter() - begin)
        return statistics.median(times)
    finally:
        trajectory_index.SortedKeys = saved


def compare(trajectories: list[int], rounds: int) -> str:
    """The markdown table of every store's time over :class:`SortedKeys`'s, per case."""
    lines = ["| buffer | trajectories | " + " | ".join(STORES) + " |", "| --- | ---: |" + " ---: |" * len(STORES)]
    for wraps in (False, True):
        for count in trajectories:
            times = {name: _time_case(store, count * 10, 10, wraps, rounds) for name, store in STORES.items()}
            base = times["SortedKeys (gap)"]
            cells = " | ".join(f"{t * 1e6:.0f} µs ({t / base:.2f}x)" for t in times.values())
            lines.append(f"| {'full, wrapping' if wraps else 'growing'} | {count:,} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools index-structures", description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, nargs="+", default=[5_000, 50_000, 500_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    print(compare(args.trajectories, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
