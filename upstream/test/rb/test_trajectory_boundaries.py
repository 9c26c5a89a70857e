# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The incremental trajectory index of the slice samplers, against brute force.

``TrajectoryBoundaries`` and ``EndFlagDisagreements`` are compared with a recovery
of the boundaries from the whole signal, the way the slice samplers do it, after any
sequence of writes.
"""
from __future__ import annotations

import argparse

import pytest
import torch
from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import (
    EndFlagDisagreements,
    TrajectoryBoundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import TrajectoryOrder

_ORDER_MODULE = TrajectoryOrder.__module__
_BOUNDARIES_MODULE = TrajectoryBoundaries.__module__


def _assert_same(got, expected):
    for g, e, name in zip(got, expected, ("start", "stop", "lengths")):
        assert g.dtype == e.dtype, name
        assert g.shape == e.shape, f"{name}: {g.shape} != {e.shape}"
        assert torch.equal(g, e), f"{name}: {g.tolist()} != {e.tolist()}"


def _boundaries_reference(
    signal: torch.Tensor, kind: str, length: int, at_capacity: bool, cursor
):
    """Boundaries recovered from the whole ``[length, *lanes]`` signal.

    End flags per row, the storage state's implicit ends, then start = previous
    stop + 1 within each lane: what the slice samplers do.
    """
    signal = signal[:length]
    if kind == "trajectory":
        end = torch.cat([signal[:-1] != signal[1:], signal[-1:] != signal[:1]])
    else:
        end = signal.clone()
    if not at_capacity:
        end[length - 1] = True
    else:
        if cursor is not None:
            end[cursor] = True
        no_end = ~end.any(0)
        end[length - 1] = end[length - 1] | no_end
    stop = end.transpose(0, -1).nonzero()
    stop[:, [0, -1]] = stop[:, [-1, 0]].clone()
    # listed lane by lane: a trajectory starts after the previous stop of its
    # lane, the first one of a lane after the lane's last stop
    rows, lanes = stop[:, 0].tolist(), [tuple(x) for x in stop[:, 1:].tolist()]
    last_of_lane = {lane: i for i, lane in enumerate(lanes)}
    start = stop.clone()
    for i, lane in enumerate(lanes):
        previous = i - 1 if i and lanes[i - 1] == lane else last_of_lane[lane]
        start[i, 0] = (rows[previous] + 1) % length
    lengths = stop[:, 0] - start[:, 0] + 1
    lengths[lengths <= 0] += length
    return start, stop, lengths


_READ_IN_PLACE = {"on": False}


@pytest.fixture(params=[3, None], ids=["chunks-of-3", "default-chunks"])
def chunk_load(request, monkeypatch):
    """Also runs with tiny chunks, so that writes cross and merge chunks."""
    if request.param is not None:
        monkeypatch.setattr(f"{_ORDER_MODULE}.LOAD", request.param)
    return request.param


@pytest.fixture(params=["numpy", "torch", "view"])
def signal_path(request, monkeypatch):
    """Also runs with the ends found by torch, as for a signal on an accelerator
    (or in a dtype numpy lacks), instead of numpy, and with a signal read in
    place through its numpy view (``host``), as storage columns are."""
    if request.param == "torch":
        monkeypatch.setattr(f"{_BOUNDARIES_MODULE}._host_array", lambda tensor: None)
    monkeypatch.setitem(_READ_IN_PLACE, "on", request.param == "view")
    return request.param


def _reader(signal: torch.Tensor):
    """``signal`` as an index reads it: by slicing, or through its numpy view."""
    if not _READ_IN_PLACE["on"]:
        return signal.__getitem__

    def read(rows):
        raise AssertionError("a signal with a numpy view is read through it")

    read.host = signal.numpy()
    return read


def _query(index, signal, length, at_capacity, cursor):
    """The index's boundaries; its order, queried trajectory by trajectory, must agree."""
    lanes = 1 if signal.ndim == 1 else signal.shape[1]
    arguments = {
        "capacity": signal.shape[0],
        "length": length,
        "at_capacity": at_capacity,
        "cursor": cursor,
        "lanes": lanes,
    }
    # the order first: what boundaries() returns after it must be as fresh
    order = index.trajectories(_reader(signal), **arguments)
    selected = order.select(torch.arange(len(order)))
    got = index.boundaries(_reader(signal), **arguments)
    _assert_same(selected, got)
    return got


def _random_signal(kind, rows, generator, lanes=None):
    shape = (rows,) if lanes is None else (rows, lanes)
    if kind == "end":
        return torch.rand(shape, generator=generator) < 0.2
    # episode ids that change now and then
    steps = (torch.rand(shape, generator=generator) < 0.2).long()
    return steps.cumsum(0)


def _disagreeing_rows(ids, done, length):
    """Rows of the first ``length`` whose flag differs from an id change after them."""
    ids, done = ids[:length], done[:length]
    changes = ids != torch.cat([ids[1:], ids[:1]])
    return (changes != done).t().nonzero()


def _assert_index_matches(index, stored, kind, length, capacity, cursor):
    """The index's boundaries of ``stored`` are a from-scratch recovery's."""
    at_capacity = length == capacity
    cursor = cursor if at_capacity else None
    _assert_same(
        _query(index, stored, length, at_capacity, cursor),
        _boundaries_reference(stored, kind, length, at_capacity, cursor),
    )


@pytest.mark.usefixtures("chunk_load", "signal_path")
class TestTrajectoryBoundaries:
    def test_bad_kind_and_short_length_raise(self):
        with pytest.raises(ValueError, match="kind"):
            TrajectoryBoundaries("ids")
        with pytest.raises(ValueError, match="at least 2"):
            TrajectoryBoundaries("end").boundaries(
                torch.zeros(4, dtype=torch.bool).__getitem__,
                capacity=4,
                length=1,
                at_capacity=False,
                cursor=None,
            )

    @pytest.mark.parametrize("kind", ["end", "trajectory"])
    @pytest.mark.parametrize("lanes", [None, 3])
    @pytest.mark.parametrize("seed", range(12))
    def test_ring_buffer_writes_match_the_reference(self, kind, lanes, seed):
        """Fill, wrap, rewrite random rows: every query equals a from-scratch recovery."""
        generator = torch.Generator().manual_seed(seed)
        capacity = int(torch.randint(5, 60, (1,), generator=generator))
        stored = _random_signal(kind, capacity, generator, lanes)
        source = _random_signal(kind, 4 * capacity, generator, lanes)
        index = TrajectoryBoundaries(kind)
        length, cursor, written = 0, None, 0
        for _ in range(25):
            action = int(torch.randint(3, (1,), generator=generator))
            if action < 2 or length < 2:
                k = int(torch.randint(1, capacity + 3, (1,), generator=generator))
                rows = (torch.arange(k) + written) % capacity
                stored[rows] = source[torch.arange(k) + (written % (3 * capacity))]
                written += k
                length = min(capacity, length + k)
                cursor = int(rows[-1])
            else:
                k = int(torch.randint(1, 4, (1,), generator=generator))
                rows = torch.randint(length, (k,), generator=generator)
                stored[rows] = _random_signal(kind, k, generator, lanes)
            index.mark_written(rows)
            if length < 2:
                continue
            _assert_index_matches(index, stored, kind, length, capacity, cursor)

    @pytest.mark.parametrize("kind", ["end", "trajectory"])
    @pytest.mark.parametrize("lanes", [None, 2])
    @pytest.mark.parametrize("seed", range(8))
    def test_small_writes_into_a_long_ring_match_the_reference(self, kind, lanes, seed):
        """Writes far smaller than the storage: the index splices them in, never rebuilds."""
        generator = torch.Generator().manual_seed(100 + seed)
        capacity = int(torch.randint(200, 400, (1,), generator=generator))
        stored = _random_signal(kind, capacity, generator, lanes)
        index = TrajectoryBoundaries(kind)
        length = int(torch.randint(2, capacity // 2, (1,), generator=generator))
        cursor = length - 1
        _query(index, stored, length, False, None)
        for _ in range(60):
            k = int(torch.randint(1, 12, (1,), generator=generator))
            if int(torch.randint(4, (1,), generator=generator)):
                # an extend: the rows after the cursor, wrapping around the ring
                rows = (torch.arange(1, k + 1) + cursor) % capacity
                cursor = int(rows[-1])
                length = min(capacity, length + k)
            else:
                rows = torch.randint(length, (k,), generator=generator)
            new = _random_signal(kind, k, generator, lanes)
            stored[rows] = new if kind == "end" else new + int(stored.max()) + 1
            index.mark_written(rows)
            _assert_index_matches(index, stored, kind, length, capacity, cursor)

    @pytest.mark.parametrize("kind", ["end", "trajectory"])
    def test_full_storage_without_cursor_or_any_end(self, kind):
        """A full lane with no end at all ends at its last row; one with an end keeps it."""
        signal = torch.zeros(8, 2, dtype=torch.bool if kind == "end" else torch.long)
        if kind == "end":
            signal[3, 1] = True
        else:
            signal[4:, 1] = 1
        index = TrajectoryBoundaries(kind)
        got = _query(index, signal, 8, True, None)
        _assert_same(got, _boundaries_reference(signal, kind, 8, True, None))

    def test_repeated_query_returns_the_cached_tensors(self):
        """No write, same storage state: the same tensors, nothing recomputed."""
        signal = torch.zeros(16, dtype=torch.bool)
        signal[[3, 9]] = True
        index = TrajectoryBoundaries("end")
        first = _query(index, signal, 16, True, 5)
        assert _query(index, signal, 16, True, 5) is first
        assert _query(index, signal, 16, True, 6) is not first

    def test_boundaries_are_copied_to_the_device_asked_once_per_change(self):
        # the meta device stands in for an accelerator: tensors land there without values
        done = torch.zeros(10, dtype=torch.bool)
        done[[2, 7]] = True
        index = TrajectoryBoundaries("end")
        geometry = {"capacity": 10, "length": 10, "at_capacity": False, "cursor": None}
        on_cpu = index.boundaries(done.__getitem__, **geometry)
        placed = index.boundaries(done.__getitem__, device="meta", **geometry)
        assert [t.device.type for t in placed] == ["meta"] * 3
        assert [(t.shape, t.dtype) for t in placed] == [
            (t.shape, t.dtype) for t in on_cpu
        ]
        assert (
            index.boundaries(done.__getitem__, device=torch.device("meta"), **geometry)
            is placed
        )
        assert index.boundaries(done.__getitem__, device="cpu", **geometry) is on_cpu
        done[4] = True
        index.mark_written(torch.tensor([4]))
        moved = index.boundaries(done.__getitem__, device="meta", **geometry)
        assert moved is not placed
        assert moved[2].shape == (4,)
        assert index.boundaries(done.__getitem__, **geometry)[2].tolist() == [
            3,
            2,
            3,
            2,
        ]

    def test_a_write_reads_only_the_written_rows(self):
        """After the first build, a query reads the signal at the written rows only."""
        signal = torch.zeros(1000, dtype=torch.long)
        signal[500:] = 1
        index = TrajectoryBoundaries("trajectory")
        _query(index, signal, 1000, True, 999)
        reads = []

        def counting(rows):
            reads.append(torch.arange(rows.start, rows.stop))
            return signal[rows]

        signal[10:13] = 7
        index.mark_written(torch.arange(10, 13))
        index.boundaries(
            counting, capacity=1000, length=1000, at_capacity=True, cursor=12
        )
        read_rows = torch.cat(reads)
        # the three rows, the row before them, and the row after them
        assert torch.equal(read_rows, torch.arange(9, 14))
        assert index.num_ends() == 4

    def test_too_many_pending_rows_fall_back_to_a_rebuild(self):
        signal = torch.zeros(64, dtype=torch.bool)
        index = TrajectoryBoundaries("end", max_pending=8)
        _query(index, signal, 64, True, 0)
        index.mark_written(torch.arange(10))
        assert not index.built
        signal[[5, 40]] = True
        _assert_same(
            _query(index, signal, 64, True, 0),
            _boundaries_reference(signal, "end", 64, True, 0),
        )

    def test_reset_forgets_the_index(self):
        signal = torch.zeros(8, dtype=torch.bool)
        index = TrajectoryBoundaries("end")
        _query(index, signal, 8, False, None)
        assert index.built
        index.reset()
        assert not index.built
        assert index.num_ends() == 0

    def test_followers_are_told_of_writes_and_resets(self):
        """A follower sees every write and reset; a rebuild for too many pending rows
        keeps what it holds."""

        class Follower:
            def __init__(self):
                self.events = []

            def mark_written(self, rows):
                self.events.append(rows.tolist())

            def reset(self):
                self.events.append("reset")

        signal = torch.zeros(64, dtype=torch.bool)
        index = TrajectoryBoundaries("end", max_pending=8)
        follower = Follower()
        index.followers.append(follower)
        _query(index, signal, 64, True, 0)
        index.mark_written(torch.tensor([3, 4]))
        index.mark_written(torch.arange(10))
        assert not index.built
        index.reset()
        assert follower.events == [[3, 4], list(range(10)), "reset"]


@pytest.mark.usefixtures("chunk_load", "signal_path")
class TestEndFlagDisagreements:
    @pytest.mark.parametrize("lanes", [None, 2])
    @pytest.mark.parametrize("seed", range(10))
    def test_disagreements_follow_writes(self, lanes, seed):
        """After any write the disagreeing rows, and whether flags and ids agree, are exact."""
        generator = torch.Generator().manual_seed(200 + seed)
        capacity = int(torch.randint(20, 120, (1,), generator=generator))
        shape = (capacity,) if lanes is None else (capacity, lanes)
        ids = torch.zeros(shape, dtype=torch.long)
        done = torch.zeros(shape, dtype=torch.bool)
        next_id = 1

        def pair(rows):
            return ids[rows], done[rows]

        def episode_rows(k):
            # consistent ids and flags: episodes of random length, done on their last step
            nonlocal next_id
            new = (
                (torch.rand(shape[1:] + (k,), generator=generator) < 0.25)
                .long()
                .cumsum(-1)
            )
            new = new.movedim(-1, 0) + next_id
            next_id = int(new.max()) + 2
            flags = torch.cat(
                [new[1:] != new[:-1], torch.zeros_like(new[:1], dtype=torch.bool)]
            )
            return new, flags

        index = EndFlagDisagreements()
        length, cursor = 0, None
        for step in range(40):
            k = int(torch.randint(1, 15, (1,), generator=generator))
            if length < 2 or int(torch.randint(3, (1,), generator=generator)):
                previous = cursor if cursor is not None else -1
                rows = (torch.arange(1, k + 1) + previous) % capacity
                ids[rows], done[rows] = episode_rows(k)
                cursor = int(rows[-1])
                length = min(capacity, length + k)
            else:
                rows = torch.randint(length, (k,), generator=generator)
                if int(torch.randint(2, (1,), generator=generator)):
                    # an interleaved writer: ids change where no flag says so
                    ids[rows] = torch.randint(
                        next_id,
                        next_id + 3,
                        rows.shape + shape[1:],
                        generator=generator,
                    )
                else:
                    done[rows] = ~done[rows]
            index.mark_written(rows)
            lane_count = 1 if lanes is None else lanes
            index.refresh(pair, capacity=capacity, length=length, lanes=lane_count)
            expected = _disagreeing_rows(
                ids.reshape(capacity, -1), done.reshape(capacity, -1), length
            )
            keys = expected[:, 0] * capacity + expected[:, 1]
            assert torch.equal(index._order.stops(), keys), step
            if length < 2:
                continue
            at_capacity = length == capacity
            kept_cursor = cursor if at_capacity else None
            same = all(
                torch.equal(a, b)
                for a, b in zip(
                    _boundaries_reference(
                        ids, "trajectory", length, at_capacity, kept_cursor
                    ),
                    _boundaries_reference(
                        done, "end", length, at_capacity, kept_cursor
                    ),
                )
            )
            agree = index.agree(
                length=length, at_capacity=at_capacity, cursor=kept_cursor
            )
            assert agree == same, step

    def test_agree_needs_a_refresh_first(self):
        with pytest.raises(RuntimeError, match="refresh"):
            EndFlagDisagreements().agree(length=4, at_capacity=False, cursor=None)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
