# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The trajectory index of the slice samplers, against brute force.

``SortedKeys`` is checked against a sorted list, ``TrajectoryIndex`` against
``find_start_stop_traj`` over random writes.
"""
from __future__ import annotations

import argparse
import bisect

import numpy as np
import pytest
import torch
from torchrl.data.replay_buffers.utils import find_start_stop_traj
from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import (
    SortedKeys,
    TrajectoryIndex,
)


def _assert_arrays_equal(got, expected):
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
            continue
        assert g.dtype == np.int64
        assert np.array_equal(g, e), f"{g.tolist()} != {e.tolist()}"


class TestSortedKeys:
    @staticmethod
    def _check(keys, expected, rng):
        listed = sorted(expected)
        assert len(keys) == len(listed)
        assert keys.array().tolist() == listed
        assert keys.array(values=True).tolist() == [expected[k] for k in listed]
        if listed:
            ranks = rng.integers(len(listed), size=8)
            assert keys.take(ranks).tolist() == [listed[r] for r in ranks]
            assert keys.values(ranks).tolist() == [expected[listed[r]] for r in ranks]
        queries = rng.integers(-3, 250, size=8)
        for side, find in (
            ("left", bisect.bisect_left),
            ("right", bisect.bisect_right),
        ):
            assert keys.rank(queries, side).tolist() == [
                find(listed, q) for q in queries
            ]
        for query in queries.tolist():
            assert keys.contains(query) == (query in expected)

    @pytest.mark.parametrize("seed", range(8))
    def test_random_changes_match_a_sorted_list(self, seed):
        """Replacements along the keys (as writes go) or anywhere, then their values."""
        rng = np.random.default_rng(seed)
        initial = np.sort(rng.choice(200, size=int(rng.integers(0, 60)), replace=False))
        expected = dict.fromkeys(initial.tolist(), 0)
        keys = SortedKeys(initial) if seed % 2 else SortedKeys()
        if not seed % 2:
            keys.set_values(keys.replace(0, 199, initial), np.zeros_like(initial))
        lo = 0
        for _ in range(150):
            if rng.random() < 0.5:
                lo = int(rng.integers(-3, 230))
            hi = lo + int(rng.integers(0, 40 if rng.random() < 0.9 else 250))
            new = np.arange(lo, hi + 1)
            new = np.sort(
                rng.choice(new, size=int(rng.integers(new.size + 1)), replace=False)
            )
            values = rng.integers(-5, 5, size=new.size)
            first = keys.replace(lo, hi, new)
            assert first == bisect.bisect_left(sorted(expected), lo)
            keys.set_values(first, values)
            expected = {k: v for k, v in expected.items() if not lo <= k <= hi}
            expected.update(zip(new.tolist(), values.tolist()))
            self._check(keys, expected, rng)
            lo = hi + 1


def _recovered(ends, length, at_capacity, cursor):
    """``(start, stop, lane, lengths)`` from ``find_start_stop_traj`` over ``ends[:length]``."""
    end = torch.from_numpy(ends[:length])
    start, stop, lengths = find_start_stop_traj(
        end=end.squeeze(1) if end.shape[1] == 1 else end,
        at_capacity=at_capacity,
        cursor=cursor,
    )
    lane = None if stop.shape[1] == 1 else stop[:, 1].numpy()
    return start[:, 0].numpy(), stop[:, 0].numpy(), lane, lengths.numpy()


def _keys(ends, first, last):
    """The sorted keys ``lane * capacity + row`` of the rows ``first`` to ``last`` that ``ends`` ends."""
    row, lane = np.nonzero(ends[first : last + 1])
    return np.sort(lane * ends.shape[0] + row + first)


def _runs(rows):
    rows = np.unique(rows)
    breaks = np.flatnonzero(np.diff(rows) != 1)
    return list(
        zip(np.append(rows[0], rows[breaks + 1]), np.append(rows[breaks], rows[-1]))
    )


def _check_index(index, ends, length, at_capacity, cursor, rng):
    expected = _recovered(ends, length, at_capacity, cursor)
    _assert_arrays_equal(index.boundaries(), expected)
    lengths = expected[-1]
    assert index.count() == len(index) == lengths.size
    for min_length in {1, 2, 3, 4, 6, int(np.median(lengths)), lengths.max() + 1}:
        eligible = np.flatnonzero(lengths >= min_length)
        assert index.count(min_length) == eligible.size, min_length
        if eligible.size:
            ranks = np.concatenate(
                [rng.integers(eligible.size, size=6), [0, eligible.size - 1]]
            )
            rows = tuple(None if e is None else e[eligible[ranks]] for e in expected)
            _assert_arrays_equal(index.select(ranks, min_length), rows)


def _write_randomly(index, ends, rng, with_cursor, steps=40):
    """Fills, wraps, rewrites runs of rows anywhere (across the wrap too) and assigns
    anew now and then, telling ``index``; yields ``(state, assigned)`` after each."""
    capacity, lanes = ends.shape
    length = written = 0
    for step in range(steps):
        action = rng.choice(["extend", "rewrite", "assign"], p=[0.5, 0.4, 0.1])
        if action == "extend" or length < 2:
            k = int(rng.integers(1, capacity // 2 + 2))
            rows = (written + np.arange(k)) % capacity
            written += k
            length = min(capacity, length + k)
        else:
            first, k = int(rng.integers(length)), int(rng.integers(1, length + 1))
            rows = (first + np.arange(k)) % length
        ends[rows] = rng.random((rows.size, lanes)) < rng.choice([0.0, 0.1, 0.5])
        cursor = int(rows[-1])
        at_capacity = length == capacity
        state = (length, at_capacity, cursor if at_capacity and with_cursor else None)
        assigned = step == 0 or action == "assign"
        if assigned:
            index.assign(_keys(ends, 0, length - 1), *state)
        else:
            runs = [(f, la, _keys(ends, f, la)) for f, la in _runs(rows)]
            index.update(*state, runs)
        yield state, assigned


class TestTrajectoryIndex:
    @pytest.mark.parametrize("lanes", [1, 2, 3])
    @pytest.mark.parametrize("with_cursor", [True, False])
    @pytest.mark.parametrize("seed", range(6))
    def test_random_writes_match_find_start_stop_traj(self, lanes, with_cursor, seed):
        """Fill, wrap, rewrite runs of rows anywhere (across the wrap too), rebuild
        now and then: every query is what ``find_start_stop_traj`` recovers."""
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(4, 40))
        ends = np.zeros((capacity, lanes), dtype=bool)
        index = TrajectoryIndex(capacity, lanes)
        for state, _ in _write_randomly(index, ends, rng, with_cursor):
            _check_index(index, ends, *state, rng)

    def test_empty_full_lane_ends_at_its_last_row(self):
        ends = np.zeros((6, 2), dtype=bool)
        ends[2, 1] = True
        index = TrajectoryIndex(6, 2)
        index.assign(_keys(ends, 0, 5), 6, True, None)
        _check_index(index, ends, 6, True, None, np.random.default_rng(0))
        assert index.boundaries()[1].tolist() == [5, 2]

    @pytest.mark.parametrize("capacity,lanes", [(0, 1), (4, 0)])
    def test_bad_sizes_raise(self, capacity, lanes):
        with pytest.raises(ValueError, match="positive"):
            TrajectoryIndex(capacity, lanes)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
