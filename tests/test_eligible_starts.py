"""_EligibleStarts holds the priorities ``PrioritizedSliceSampler.sample`` draws from, kept from the index's changes.

Every answer is checked against a brute-force one written from the rule alone: the
stops a storage's done flags and state make, the stops around each row, the key
ranges :meth:`TrajectoryIndex.changes_since` lists, and the zeroed priorities
(``_preceding_stop_idx``'s rows), built fresh and after random ring writes and
priority updates. The TorchRL sum tree is stood in for by a numpy array.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from torchrl_fixes.fixes.slice_boundary_index.prioritized_slices import _EligibleStarts
from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import TrajectoryIndex

CPU = torch.device("cpu")


class FakeTree:
    """A sum tree's item access, over a float32 array."""

    def __init__(self, capacity: int):
        self.values = np.zeros(capacity, dtype=np.float32)

    def __getitem__(self, rows):
        return self.values[np.asarray(rows)].copy()

    def __setitem__(self, rows, values):
        self.values[np.asarray(rows)] = values


def _sampler(rng, capacity: int, strict_length: bool):
    tree = FakeTree(capacity)
    tree.values[:] = rng.random(capacity, dtype=np.float32) + 0.5
    return types.SimpleNamespace(
        _sum_tree=tree, _alpha=0.7, strict_length=strict_length, _max_capacity=capacity
    )


class Ring:
    """A one-lane storage written around a ring: its done flags and state, as the index hears them."""

    def __init__(self, rng, capacity: int):
        self.rng, self.capacity = rng, capacity
        self.done = rng.uniform(0.05, 0.6)  # how often a row ends a trajectory
        self.ends = np.zeros(capacity, dtype=bool)
        self.length, self.position, self.cursor = 0, 0, None

    @property
    def full(self) -> bool:
        return self.length == self.capacity

    def state(self) -> tuple:
        return self.length, self.full, self.cursor if self.full else None

    def stops(self) -> np.ndarray:
        """The stops the index must hold: the rows the flags end, and the row the state ends."""
        stops = set(np.flatnonzero(self.ends[: self.length]).tolist())
        stops.add(self.cursor if self.full else self.length - 1)
        return np.array(sorted(stops), dtype=np.int64)

    def keys(self, first: int, last: int) -> np.ndarray:
        """The keys of the rows ``first`` to ``last`` the flags end."""
        return np.flatnonzero(self.ends[first : last + 1]).astype(np.int64) + first

    def write(self, count: int, row_before: bool, extra: bool) -> list:
        """Writes ``count`` rows at the cursor; the runs ``update`` is told."""
        rows = (self.position + np.arange(count)) % self.capacity
        self.ends[rows] = self.rng.random(count) < self.done
        self.length = max(self.length, int(rows.max()) + 1)
        self.position = int(rows[-1] + 1) % self.capacity
        self.cursor = int(rows[-1])
        first, last = int(rows[0]), int(rows[-1])
        runs = [(first, last)] if first <= last else [(first, self.capacity - 1), (0, last)]
        if row_before:  # as the storage's index reads them
            runs += [(self.length - 1, self.length - 1) for a, _ in runs if a == 0]
            runs = [(max(a - 1, 0), b) for a, b in runs]
        if extra:  # rows read again, unchanged
            a = int(self.rng.integers(0, self.length))
            runs.append((a, int(self.rng.integers(a, self.length))))
        merged = []
        for a, b in sorted(runs):
            if merged and a <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return [(a, b, self.keys(a, b)) for a, b in merged]


def _random_state(rng, capacity: int, full: bool):
    """Done flags and a state (full or not) of a storage; its index, assigned."""
    ring = Ring(rng, capacity)
    ring.ends[:] = rng.random(capacity) < ring.done
    ring.length = capacity if full else int(rng.integers(1, capacity))
    ring.cursor = int(rng.integers(0, capacity)) if full else None
    index = TrajectoryIndex(capacity)
    index.assign(np.flatnonzero(ring.ends[: ring.length]), *ring.state())
    return ring, index


def _trajectories(ring: Ring, index: TrajectoryIndex) -> list:
    """``(start, stop, length)`` of each trajectory: the index's, checked against the stops."""
    stops, length, full = ring.stops(), ring.length, ring.full
    assert np.array_equal(index.boundaries()[1], stops)
    previous = np.concatenate(([stops[-1] - length if full else -1], stops[:-1]))
    lengths = stops - previous
    starts = (previous + 1) % length
    start, stop, lane, lengths_found = index.boundaries()
    assert lane is None
    assert np.array_equal(start, starts) and np.array_equal(lengths_found, lengths)
    assert lengths.sum() == length
    return list(zip(start.tolist(), stop.tolist(), lengths_found.tolist()))


def _reference(ring: Ring, index: TrajectoryIndex, priorities: np.ndarray, tail: int, strict: bool):
    """The sampler's priorities with ``_preceding_stop_idx``'s rows at zero."""
    expected = priorities.copy()
    for start, _, length in _trajectories(ring, index):
        for i in range(length):  # i rows after the trajectory's first
            if length - 1 - i < tail and (strict or i > 0):
                expected[(start + i) % ring.length] = 0
    return expected


def _around(stops: np.ndarray, rows: np.ndarray, length: int) -> tuple:
    before, after = [], []
    for row in rows.tolist():
        earlier, later = stops[stops < row], stops[stops >= row]
        before.append(earlier[-1] if earlier.size else stops[-1] - length)
        after.append(later[0] if later.size else stops[0] + length)
    return np.array(before, dtype=np.int64), np.array(after, dtype=np.int64)


def test_stops_around_docstring_example():
    index = TrajectoryIndex(capacity=10)
    index.assign(np.array([2, 7]), length=10, at_capacity=True, cursor=4)
    before, after = index.stops_around(np.array([0, 3, 9]))
    assert np.array_equal(before, [-3, 2, 7]) and np.array_equal(after, [2, 4, 12])


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_stops_around_matches_brute_force(full, seed):
    rng = np.random.default_rng(seed)
    ring, index = _random_state(rng, int(rng.integers(2, 40)), full)
    stops = ring.stops()
    assert np.array_equal(index.boundaries()[1], stops)
    rows = np.concatenate([np.arange(ring.length), rng.integers(0, ring.length, 10)])
    before, after = index.stops_around(rows)
    expected = _around(stops, rows, ring.length)
    assert np.array_equal(before, expected[0]) and np.array_equal(after, expected[1])


@pytest.mark.parametrize("seed", range(20))
def test_changes_since_covers_every_changed_stop(seed):
    rng = np.random.default_rng(seed)
    ring = Ring(rng, int(rng.integers(12, 41)))
    index = TrajectoryIndex(ring.capacity)
    ring.write(int(rng.integers(1, ring.capacity)), False, False)
    index.assign(np.flatnonzero(ring.ends[: ring.length]), *ring.state())
    history = [(index.revision, set(ring.stops().tolist()))]
    for _ in range(30):
        count = int(rng.integers(1, ring.capacity // 2))
        runs = ring.write(count, bool(rng.integers(2)), rng.random() < 0.2)
        index.update(*ring.state(), runs)
        stops = set(ring.stops().tolist())
        assert set(index.boundaries()[1].tolist()) == stops
        history.append((index.revision, stops))
        for revision, old in history[-4:]:  # since this and each of a few before
            changes = index.changes_since(revision)
            assert len(changes) == index.revision - revision
            missed = [k for k in old ^ stops if not any(lo <= k <= hi for lo, hi in changes)]
            assert not missed, (revision, changes, old ^ stops)


def test_changes_since_is_empty_without_a_change_and_none_past_what_it_keeps():
    ring = Ring(np.random.default_rng(0), 16)
    index = TrajectoryIndex(ring.capacity)
    ring.write(16, False, False)
    index.assign(np.flatnonzero(ring.ends), *ring.state())
    start = index.revision
    assert index.changes_since(start) == []
    index.update(*ring.state())  # the same state, nothing read again
    assert index.revision == start and index.changes_since(start) == []
    while index.revision - start <= 256:
        index.update(*ring.state(), ring.write(1, False, False))
    assert index.changes_since(start) is None
    kept = index.changes_since(index.revision - 256)
    assert kept is not None and len(kept) == 256
    assert index.changes_since(index.revision) == []


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("tail", [1, 2, 3, 4])
@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_fresh_tree_zeroes_the_preceding_stops(strict, tail, full, seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(2, 40))
    ring, index = _random_state(rng, capacity, full)
    sampler = _sampler(rng, capacity, strict)
    priorities = sampler._sum_tree.values.copy()
    starts = _EligibleStarts(sampler, index, tail, CPU)
    assert np.array_equal(sampler._sum_tree.values, priorities)  # the sampler's is never written
    expected = _reference(ring, index, priorities, tail, strict)
    assert np.array_equal(starts.tree.values, expected)


def test_fresh_tree_zeroes_the_rows_stock_lists():
    # stops 2, 4 (the cursor), 7 of a full storage of 10: trajectories 8..2, 3..4, 5..7
    index = TrajectoryIndex(capacity=10)
    index.assign(np.array([2, 7]), length=10, at_capacity=True, cursor=4)
    for strict, closed in [(True, [1, 2, 3, 4, 6, 7]), (False, [1, 2, 4, 6, 7])]:
        sampler = _sampler(np.random.default_rng(0), 10, strict)
        tree = _EligibleStarts(sampler, index, 2, CPU).tree.values
        assert np.flatnonzero(tree == 0).tolist() == closed


@pytest.mark.parametrize("seed", range(50))
def test_caught_up_tree_equals_a_fresh_one(seed):
    rng = np.random.default_rng(seed)
    capacity, tail, strict = int(rng.integers(12, 41)), int(rng.integers(1, 5)), bool(seed % 2)
    ring = Ring(rng, capacity)
    index = TrajectoryIndex(capacity)
    ring.write(int(rng.integers(1, capacity // 2)), False, False)
    index.assign(np.flatnonzero(ring.ends[: ring.length]), *ring.state())
    sampler = _sampler(rng, capacity, strict)
    starts = _EligibleStarts(sampler, index, tail, CPU)
    caught = 0
    for step in range(40):
        if rng.random() < 0.8:
            count = int(rng.integers(1, capacity // 2 + 2))
            runs = ring.write(count, bool(rng.integers(2)), rng.random() < 0.2)
            index.update(*ring.state(), runs)
        elif rng.random() < 0.5:
            index.update(*ring.state())  # nothing new
        if rng.random() < 0.6:
            rows = rng.integers(0, capacity, int(rng.integers(1, 4)))
            sampler._sum_tree[rows] = rng.random(rows.size, dtype=np.float32) + 0.5
            starts.priorities_set(torch.as_tensor(rows) if step % 2 else rows.tolist())
        if starts.serves(sampler, index, tail) and starts.catch_up():
            caught += 1
        else:
            starts = _EligibleStarts(sampler, index, tail, CPU)
        fresh = _EligibleStarts(sampler, index, tail, CPU).tree.values
        expected = _reference(ring, index, sampler._sum_tree.values, tail, strict)
        assert np.array_equal(fresh, expected), step
        assert np.array_equal(starts.tree.values, expected), step
    assert caught >= 25  # the tree was caught up, not rebuilt, at most steps


def test_catch_up_refuses_past_the_changes_kept():
    ring = Ring(np.random.default_rng(1), 16)
    index = TrajectoryIndex(ring.capacity)
    ring.write(16, False, False)
    index.assign(np.flatnonzero(ring.ends), *ring.state())
    sampler = _sampler(np.random.default_rng(1), 16, True)
    starts = _EligibleStarts(sampler, index, 2, CPU)
    while index.revision - starts.revision <= 256:
        index.update(*ring.state(), ring.write(1, False, False))
    assert starts.serves(sampler, index, 2)
    assert starts.catch_up() is False


def test_serves_only_the_sampler_and_index_it_follows():
    ring, index = _random_state(np.random.default_rng(2), 16, True)
    sampler = _sampler(np.random.default_rng(2), 16, False)
    starts = _EligibleStarts(sampler, index, 2, CPU)
    assert starts.serves(sampler, index, 2)
    assert not starts.serves(sampler, index, 3)
    assert not starts.serves(sampler, TrajectoryIndex(16), 2)
    for name, value in [("_sum_tree", FakeTree(16)), ("_alpha", 0.5), ("strict_length", True)]:
        other = types.SimpleNamespace(**vars(sampler))
        setattr(other, name, value)
        assert not starts.serves(other, index, 2), name
    starts.priorities_set(torch.arange(5))  # more rows set than a catch-up is worth
    assert not starts.serves(sampler, index, 2)
