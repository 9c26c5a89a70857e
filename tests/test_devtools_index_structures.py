"""The plain key stores of ``python -m devtools index-structures`` serve the index as its own does.

A timing compares like with like only if each store gives the same answers: random
writes go to one :class:`TrajectoryIndex` over :class:`SortedKeys` and one over each
plain store, and every boundary and every draw must be equal.
"""
from __future__ import annotations

import numpy as np
import pytest

from devtools import index_structures
from torchrl_fixes.fixes.slice_boundary_index import trajectory_index


def _keys(ends: np.ndarray, first: int, capacity: int) -> np.ndarray:
    lane, row = np.nonzero(ends.T)
    return lane * capacity + row + first


def _play(rng, capacity: int, lanes: int):
    """Random writes, each as ``update`` hears it: ``(length, at_capacity, cursor, runs)``."""
    ends = rng.random((capacity, lanes)) < 0.3
    length = int(rng.integers(2, capacity + 1))
    yield _keys(ends[:length], 0, capacity), length
    position = length % capacity
    for _ in range(40):
        rows = (position + np.arange(int(rng.integers(1, capacity // 2)))) % capacity
        position = int(rows[-1] + 1) % capacity
        ends[rows] = rng.random((rows.size, lanes)) < 0.3
        length = max(length, int(rows.max()) + 1)
        full = length == capacity
        first, last = int(rows.min()), int(rows.max())
        runs = [(first, last, _keys(ends[first : last + 1], first, capacity))]
        yield length, full, int(rows[-1]) if full else None, runs


@pytest.mark.parametrize("store", ["FlatKeys", "BlockedKeys"])
@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_plain_store_gives_the_index_the_same_answers(store, lanes, seed, monkeypatch):
    monkeypatch.setattr(index_structures, "BLOCK", 8)  # several blocks, even here
    capacity, indexes = 60, {}
    for name in ("SortedKeys (gap)", store):
        monkeypatch.setattr(trajectory_index, "SortedKeys", index_structures.STORES[name])
        rng, index = np.random.default_rng(seed), trajectory_index.TrajectoryIndex(capacity, lanes)
        answers = []
        for step, change in enumerate(_play(rng, capacity, lanes)):
            if step == 0:
                stops, length = change
                index.assign(stops, length, length == capacity, 0 if length == capacity else None)
            else:
                index.update(*change)
            answers.append([a.tolist() if a is not None else None for a in index.boundaries()])
            for min_length in (1, 3):
                count = index.count(min_length)
                answers.append([count] + [a.tolist() for a in index.select(np.arange(count), min_length) if a is not None])
        indexes[name] = answers
    assert indexes[store] == indexes["SortedKeys (gap)"]


def test_compare_times_every_store():
    table = index_structures.compare([200], rounds=3).splitlines()
    assert table[0] == "| buffer | trajectories | " + " | ".join(index_structures.STORES) + " |"
    assert [line.split(" | ")[:2] for line in table[2:]] == [["| growing", "200"], ["| full, wrapping", "200"]]
