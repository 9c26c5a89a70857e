# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The flat trajectory table of a storage that only grows, against brute force.

``TrajectoryTable`` and ``GrowingStorageTable`` are compared with the trajectories
of the valid rows listed from the whole end-flag column: a row ends a trajectory
where its flag is set, and the last valid row of a storage that is not full ends
one too.
"""
from __future__ import annotations

import pytest
import torch
from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import TrajectoryBoundaries
from torchrl_fixes.fixes.slice_boundary_index.trajectory_table import GrowingStorageTable, TrajectoryTable


def _listed(done: torch.Tensor, length: int):
    """``(start, stop, lengths)`` of the trajectories of ``done[:length]``."""
    ends = done[:length].clone()
    ends[length - 1] = True
    stop = ends.nonzero().squeeze(-1)
    start = torch.cat([stop.new_zeros(1), stop[:-1] + 1])
    return start, stop, stop - start + 1


def _assert_table_matches(table, done, length):
    start, stop, lengths = _listed(done, length)
    assert table.length == length
    assert table.count == lengths.numel()
    assert torch.equal(torch.from_numpy(table.stops()), stop)
    got_start, got_lengths = table.select(torch.arange(table.count).numpy())
    assert torch.equal(torch.from_numpy(got_start), start)
    assert torch.equal(torch.from_numpy(got_lengths), lengths)
    assert table.shortest() == int(lengths.min())
    for min_length in range(1, 8):
        count, ranks = table.drawable(min_length)
        drawn = torch.arange(count) if ranks is None else torch.from_numpy(ranks[:count])
        assert torch.equal(drawn, (lengths >= min_length).nonzero().squeeze(-1))


def _done(rows, generator):
    return torch.rand(rows, generator=generator) < 0.2


class TestTrajectoryTable:
    @pytest.mark.parametrize("seed", range(10))
    def test_appends_match_the_listing(self, seed):
        """Appends of any size, ending a trajectory or not."""
        generator = torch.Generator().manual_seed(seed)
        done = _done(600, generator)
        length = int(torch.randint(2, 20, (1,), generator=generator))
        _, stop, _ = _listed(done, length)
        table = TrajectoryTable(stop.numpy(), length, not bool(done[length - 1]))
        _assert_table_matches(table, done, length)
        while length < 550:
            k = int(torch.randint(1, 40, (1,), generator=generator))
            table.append(done[length : length + k].numpy())
            length += k
            _assert_table_matches(table, done, length)

    @pytest.mark.parametrize("rows_per_append", [3, 40, 300])
    def test_appends_closing_few_or_many_trajectories(self, rows_per_append):
        """Appends that close a handful of trajectories or a hundred, read between them."""
        generator = torch.Generator().manual_seed(rows_per_append)
        done = torch.rand(3000, generator=generator) < 0.4
        _, stop, _ = _listed(done, 10)
        table = TrajectoryTable(stop.numpy(), 10, not bool(done[9]))
        for length in range(10 + rows_per_append, 3000, rows_per_append):
            table.append(done[length - rows_per_append : length].numpy())
            _assert_table_matches(table, done, length)

    def test_the_table_grows_past_its_room(self):
        done = torch.ones(5000, dtype=torch.bool)
        table = TrajectoryTable(torch.tensor([0, 1]).numpy(), 2, False)
        table.append(done[2:5000].numpy())
        _assert_table_matches(table, done, 5000)

    def test_the_last_stop_must_be_the_last_row(self):
        with pytest.raises(ValueError, match="last stop"):
            TrajectoryTable(torch.tensor([2]).numpy(), 6, True)


def _table(index, done, length, at_capacity=False):
    return GrowingStorageTable.of(index).table(
        index,
        done.__getitem__,
        capacity=done.shape[0],
        length=length,
        at_capacity=at_capacity,
        cursor=length - 1 if at_capacity else None,
    )


class TestGrowingStorageTable:
    @pytest.mark.parametrize("seed", range(6))
    def test_appends_keep_the_table_and_the_index_exact(self, seed):
        """Writes past the valid rows are appended; the index's order sees them too."""
        generator = torch.Generator().manual_seed(seed)
        done = _done(400, generator)
        index = TrajectoryBoundaries("end")
        length = 10
        table = _table(index, done, length)
        _assert_table_matches(table, done, length)
        while length < 300:
            k = int(torch.randint(1, 30, (1,), generator=generator))
            index.mark_written(torch.arange(length, length + k))
            length += k
            assert _table(index, done, length) is table
            _assert_table_matches(table, done, length)
            if int(torch.randint(3, (1,), generator=generator)) == 0:
                start, stop, lengths = index.boundaries(
                    done.__getitem__,
                    capacity=400,
                    length=length,
                    at_capacity=False,
                    cursor=None,
                )
                expected = _listed(done, length)
                assert torch.equal(start.squeeze(-1), expected[0])
                assert torch.equal(stop.squeeze(-1), expected[1])
                assert torch.equal(lengths, expected[2])

    def test_rows_past_the_last_one_are_read_in_any_order(self):
        """Writes out of order, repeated or with holes past the table's last row are
        appended; one that also touches an earlier row drops the table."""
        done = torch.zeros(60, dtype=torch.bool)
        done[[3, 9, 20, 24, 33]] = True
        index = TrajectoryBoundaries("end")
        table = _table(index, done, 20)
        index.mark_written(torch.tensor([23, 21, 21]))
        index.mark_written(torch.tensor([25]))
        assert _table(index, done, 26) is table
        _assert_table_matches(table, done, 26)
        index.mark_written(torch.tensor([], dtype=torch.long))
        assert _table(index, done, 26) is table
        index.mark_written(torch.tensor([26, 27, 2]))
        assert _table(index, done, 28) is None

    def test_a_dropped_table_is_made_again_after_as_many_rows_as_it_had(self):
        done = torch.zeros(100, dtype=torch.bool)
        done[[3, 9, 20]] = True
        index = TrajectoryBoundaries("end")
        table = _table(index, done, 30)
        assert table.count == 4
        done[5] = True
        index.mark_written(torch.tensor([5]))
        assert _table(index, done, 30) is None
        index.mark_written(torch.arange(30, 33))
        assert _table(index, done, 33) is None
        index.mark_written(torch.arange(33, 34))
        remade = _table(index, done, 34)
        assert remade is not None and remade is not table
        _assert_table_matches(remade, done, 34)

    def test_no_table_where_it_would_not_hold(self):
        """A full storage, ids, several lanes: the index's order alone serves them."""
        done = torch.zeros(50, dtype=torch.bool)
        done[[3, 9, 20]] = True
        index = TrajectoryBoundaries("end")
        assert _table(index, done, 40) is not None
        index.mark_written(torch.arange(40, 50))
        assert _table(index, done, 50, at_capacity=True) is None
        ids = TrajectoryBoundaries("trajectory")
        assert GrowingStorageTable.of(ids) is None
        assert ids.followers == []
        lanes = TrajectoryBoundaries("end")
        flags = torch.zeros(50, 2, dtype=torch.bool)
        table = GrowingStorageTable.of(lanes).table(
            lanes,
            flags.__getitem__,
            capacity=50,
            length=40,
            at_capacity=False,
            cursor=None,
            lanes=2,
        )
        assert table is None

    def test_rows_no_write_recorded_drop_the_table(self):
        """More valid rows than the recorded writes account for: the order serves."""
        done = torch.zeros(50, dtype=torch.bool)
        done[[3, 9]] = True
        index = TrajectoryBoundaries("end")
        assert _table(index, done, 10) is not None
        assert _table(index, done, 12) is None

    def test_a_reset_of_the_index_forgets_the_table(self):
        done = torch.zeros(50, dtype=torch.bool)
        index = TrajectoryBoundaries("end")
        table = _table(index, done, 10)
        index.reset()
        assert _table(index, done, 10) is not table
        assert GrowingStorageTable.of(index) is index.followers[0]
