# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""What the trajectory index tells the readers that follow it: the stops around
any rows, and the key ranges whose stops changed since a revision.

Both are checked against ``find_start_stop_traj`` over random writes.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest
from test_trajectory_index import (
    _assert_arrays_equal,
    _keys,
    _recovered,
    _write_randomly,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import TrajectoryIndex


def _stop_keys(ends, length, at_capacity, cursor):
    """The keys ``lane * capacity + row`` of the stops ``find_start_stop_traj`` recovers."""
    _, stop, lane, _ = _recovered(ends, length, at_capacity, cursor)
    return set((stop if lane is None else lane * ends.shape[0] + stop).tolist())


def _within(key, ranges):
    return any(lo <= key <= hi for lo, hi in ranges)


class TestTrajectoryIndexChanges:
    @pytest.mark.parametrize("with_cursor", [True, False])
    @pytest.mark.parametrize("seed", range(6))
    def test_stops_around_match_find_start_stop_traj(self, with_cursor, seed):
        """Around every valid row, before and once full: the last stop before it and
        the first at or after it, a lap away past either end."""
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(4, 40))
        ends = np.zeros((capacity, 1), dtype=bool)
        index = TrajectoryIndex(capacity)
        full = set()
        for state, _ in _write_randomly(index, ends, rng, with_cursor):
            length = state[0]
            stops = np.sort(_recovered(ends, *state)[1]).tolist()
            rows = rng.permutation(length)
            before = [
                max((s for s in stops if s < r), default=stops[-1] - length)
                for r in rows
            ]
            after = [
                min((s for s in stops if s >= r), default=stops[0] + length)
                for r in rows
            ]
            _assert_arrays_equal(
                index.stops_around(rows), (np.array(before), np.array(after))
            )
            full.add(state[1])
        assert full == {False, True}

    @pytest.mark.parametrize("lanes", [1, 3])
    @pytest.mark.parametrize("with_cursor", [True, False])
    @pytest.mark.parametrize("seed", range(6))
    def test_changes_since_cover_every_changed_stop(self, lanes, with_cursor, seed):
        """From every earlier revision: the stops added or removed since lie in the
        ranges listed, unless an assign came after it or more than 256 changes did."""
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(4, 40))
        ends = np.zeros((capacity, lanes), dtype=bool)
        index = TrajectoryIndex(capacity, lanes)
        earlier = [(index.revision, set())]  # revisions and their stops
        for state, assigned in _write_randomly(index, ends, rng, with_cursor):
            if assigned:
                for revision, _ in earlier:
                    assert index.changes_since(revision) is None
                earlier.clear()
            assert index.changes_since(index.revision) == []
            stops = _stop_keys(ends, *state)
            for revision, before in earlier:
                ranges = index.changes_since(revision)
                if index.revision - revision > 256:
                    assert ranges is None
                    continue
                missed = [k for k in stops ^ before if not _within(k, ranges)]
                assert not missed, (missed, ranges)
            earlier.append((index.revision, stops))

    def test_changes_since_keeps_256_changes_and_none_before_an_assign(self):
        """One row written at a time, around the ring and again: the last 256
        changes are listed, one more is not, nor any change before an assign."""
        ends = np.zeros((8, 1), dtype=bool)
        ends[[2, 5]] = True
        index = TrajectoryIndex(8)
        index.assign(_keys(ends, 0, 7), 8, True, 7)
        start = index.revision
        for step in range(300):
            row = step % 8
            ends[row] = not ends[row]
            index.update(8, True, row, [(row, row, _keys(ends, row, row))])
            missed = index.revision - start
            ranges = index.changes_since(start)
            if missed > 256:
                assert ranges is None
            else:
                assert ranges is not None and len(ranges) >= 1
        assert missed > 256
        assert index.changes_since(index.revision - 256) is not None
        assert index.changes_since(index.revision - 257) is None
        before = index.revision
        index.assign(_keys(ends, 0, 7), 8, True, 3)
        assert index.changes_since(before) is None
        assert index.changes_since(index.revision) == []


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
