# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""``TrajectoryOrder``, against a listing of every trajectory built from a sorted array of stops."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import TrajectoryOrder

_ORDER_MODULE = TrajectoryOrder.__module__


def _assert_same(got, expected):
    for g, e, name in zip(got, expected, ("start", "stop", "lengths")):
        assert g.dtype == e.dtype, name
        assert g.shape == e.shape, f"{name}: {g.shape} != {e.shape}"
        assert torch.equal(g, e), f"{name}: {g.tolist()} != {e.tolist()}"


def _order_reference(stops: np.ndarray, capacity: int, lanes: int, length: int):
    """``(start, stop, lengths)`` of every trajectory, listed one by one.

    Start = previous stop of the lane + 1, the first of a lane after the lane's
    last stop, around the ring: what the slice sampler does with materialised
    boundaries.
    """
    starts, lengths = [], []
    for key in stops.tolist():
        lane, row = divmod(key, capacity)
        same_lane = [k for k in stops.tolist() if k // capacity == lane]
        position = same_lane.index(key)
        previous_row = same_lane[position - 1] % capacity  # the last one for the first
        start = (previous_row + 1) % length
        size = row - start + 1
        starts.append(start)
        lengths.append(size if size > 0 else size + length)
    stop_rows = [k % capacity for k in stops.tolist()]
    lane_of = [k // capacity for k in stops.tolist()]
    if lanes == 1:
        start = torch.tensor(starts, dtype=torch.long).reshape(-1, 1)
        stop = torch.tensor(stop_rows, dtype=torch.long).reshape(-1, 1)
    else:
        start = torch.tensor(list(zip(starts, lane_of)), dtype=torch.long).reshape(
            -1, 2
        )
        stop = torch.tensor(list(zip(stop_rows, lane_of)), dtype=torch.long).reshape(
            -1, 2
        )
    return start, stop, torch.tensor(lengths, dtype=torch.long)


def _random_stops(rng, capacity, lanes, length, density):
    keys = [
        lane * capacity + row
        for lane in range(lanes)
        for row in range(length)
        if rng.random() < density
    ]
    return np.array(sorted(keys), dtype=np.int64)


def _check_order(order, stops, capacity, lanes, length, rng):
    expected = _order_reference(stops, capacity, lanes, length)
    assert len(order) == stops.size
    assert torch.equal(order.stops(), torch.from_numpy(stops))
    _assert_same(order.materialize(), expected)
    if not stops.size:
        return
    start, stop, lengths = expected
    # a trajectory wraps where it starts after its stop: then, and only then, the
    # first rows are taken around the ring
    assert order.wraps() == bool((start[:, 0] > stop[:, 0]).any())
    rows, lane = order.first_rows(stops, lengths.numpy())
    assert torch.equal(torch.from_numpy(rows), start[:, 0])
    if lanes == 1:
        assert lane is None
    else:
        assert torch.equal(torch.from_numpy(lane), start[:, 1])
    assert order.shortest() == int(lengths.min())
    assert int(lengths[order.shortest_rank()]) == int(lengths.min())
    for min_length in {
        1,
        2,
        3,
        int(lengths.median()),
        int(lengths.max()),
        int(lengths.max()) + 1,
    }:
        eligible = (lengths >= min_length).nonzero().squeeze(-1)
        assert order.count(min_length) == eligible.numel(), min_length
        if not eligible.numel():
            continue
        ranks = torch.from_numpy(rng.integers(0, eligible.numel(), size=7))
        picked = eligible[ranks]
        _assert_same(
            order.select(ranks, min_length), tuple(t[picked] for t in expected)
        )


@pytest.fixture(params=[3, None], ids=["chunks-of-3", "default-chunks"])
def chunk_load(request, monkeypatch):
    """Also runs with tiny chunks, so that writes cross and merge chunks."""
    if request.param is not None:
        monkeypatch.setattr(f"{_ORDER_MODULE}.LOAD", request.param)
    return request.param


class TestTrajectoryOrder:
    @pytest.mark.parametrize("lanes", [1, 3])
    @pytest.mark.parametrize("load", [2, 3, 5, 64])
    @pytest.mark.parametrize("seed", range(10))
    def test_random_replacements_match_the_reference(self, lanes, load, seed):
        """Replace random key ranges (writes), change the valid length: every query agrees."""
        rng = np.random.default_rng(seed)
        capacity = int(rng.integers(8, 80))
        length = int(rng.integers(2, capacity + 1))
        stops = _random_stops(rng, capacity, lanes, length, rng.uniform(0.05, 0.6))
        order = TrajectoryOrder(capacity, lanes, load=load)
        order.assign(stops)
        order.length = length
        _check_order(order, stops, capacity, lanes, length, rng)
        for _ in range(30):
            lane = int(rng.integers(lanes))
            first = int(rng.integers(length))
            last = min(length - 1, first + int(rng.integers(0, 12)))
            lo, hi = lane * capacity + first, lane * capacity + last
            density = rng.choice([0.0, 0.1, 0.5, 1.0])
            new = np.array(
                [k for k in range(lo, hi + 1) if rng.random() < density],
                dtype=np.int64,
            )
            order.replace(lo, hi, new)
            stops = np.union1d(stops[(stops < lo) | (stops > hi)], new).astype(np.int64)
            if rng.random() < 0.2:
                # the storage grows: rows past the old length hold no stop yet
                length = min(capacity, length + int(rng.integers(1, 5)))
                order.length = length
            _check_order(order, stops, capacity, lanes, length, rng)

    def test_emptied_and_refilled(self):
        order = TrajectoryOrder(10, load=2)
        order.assign(np.array([1, 3, 5, 7, 9]))
        order.length = 10
        order.replace(0, 9, np.empty(0, dtype=np.int64))
        assert len(order) == 0
        assert order.stops().tolist() == []
        assert order.count() == 0
        with pytest.raises(RuntimeError, match="no trajectory"):
            order.shortest()
        order.replace(4, 4, np.array([4]))
        _assert_same(order.materialize(), _order_reference(np.array([4]), 10, 1, 10))

    def test_contains(self):
        order = TrajectoryOrder(100, load=2)
        order.assign(np.array([3, 10, 20, 30, 40]))
        for stop in (3, 30, 40):
            assert stop in order
        for row in (0, 31, 99):
            assert row not in order

    def test_a_query_needs_the_length(self):
        order = TrajectoryOrder(10)
        order.assign(np.array([4]))
        with pytest.raises(RuntimeError, match="length"):
            order.count()

    @pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"capacity": 10, "load": 1}])
    def test_bad_arguments_raise(self, kwargs):
        with pytest.raises(ValueError, match="positive"):
            TrajectoryOrder(**kwargs)

    def test_a_write_rewrites_only_the_chunks_it_touches(self):
        """Replacing a few keys leaves every other chunk the same object: nothing else is copied."""
        order = TrajectoryOrder(10_000, load=4)
        order.assign(np.arange(0, 10_000, 10))
        order.length = 10_000
        order.count(5)
        before = list(order._chunks)
        order.replace(5_000, 5_025, np.array([5_005, 5_015]))
        after = order._chunks
        kept = sum(any(a is b for b in before) for a in after)
        assert kept >= len(after) - 2
        assert order.count(5) == 999

    @pytest.mark.parametrize("lanes", [1, 2])
    def test_a_new_order_is_measured_at_once(self, lanes):
        """Hundreds of new chunks are measured in whole-array passes: same results."""
        rng = np.random.default_rng(7)
        capacity = 600
        stops = _random_stops(rng, capacity, lanes, capacity, 0.4)
        order = TrajectoryOrder(capacity, lanes, load=2)
        order.assign(stops)
        order.length = capacity
        assert order._stale.sum() > 64
        _check_order(order, stops, capacity, lanes, capacity, rng)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
