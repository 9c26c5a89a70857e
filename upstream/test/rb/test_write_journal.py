# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A storage's write journal: the rows each write covered, beside its revision.

``TensorStorage.set`` records in the storage's ``WriteJournal`` the revision each
write moves it to and the rows it covered, in whatever process it runs;
``TensorStorage.mark_update`` does the same for rows written where torch counts
nothing (through ``.data`` or numpy).
"""
from __future__ import annotations

import argparse
import copy
import pickle

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler
from torchrl_fixes.fixes.slice_boundary_index.write_journal import WriteJournal

CAPACITY = 100


def _covered(runs, capacity=CAPACITY):
    """The rows ``(first, last)`` runs cover."""
    rows = set()
    for first, last in runs:
        assert 0 <= first <= last < capacity
        rows.update(range(first, last + 1))
    return rows


def _steps(start, n):
    """``n`` steps from ``start`` on, in episodes of 10 steps."""
    step = torch.arange(start, start + n)
    return TensorDict({"obs": step, "episode": step // 10}, [n])


def _runs_since(storage, revision):
    journal = storage._write_journal
    with journal.lock:
        return journal.runs_since(revision, storage._mutation_revision)


_CURSORS = {
    "int": (7, {7}),
    "slice": (slice(10, 20), set(range(10, 20))),
    "tensor": (torch.arange(30, 45), set(range(30, 45))),
    "around the ring": (
        torch.arange(95, 105) % CAPACITY,
        {95, 96, 97, 98, 99, 0, 1, 2, 3, 4},
    ),
    "scattered": (torch.tensor([1, 50, 99]), {1, 50, 99}),
    "mask": (torch.arange(CAPACITY) % 10 == 3, set(range(3, CAPACITY, 10))),
    "list": ([5, 6, 8], {5, 6, 8}),
    "array": (np.arange(60, 64), set(range(60, 64))),
}


class TestWriteJournal:
    @pytest.mark.parametrize("cursor", list(_CURSORS))
    def test_a_write_is_read_back_as_runs_that_cover_its_rows(self, cursor):
        cursor, rows = _CURSORS[cursor]
        journal = WriteJournal()
        with journal.lock:
            journal.record(1, cursor, CAPACITY)
            runs = journal.runs_since(0, 1)
        assert rows <= _covered(runs)
        assert len(runs) <= 2  # one run, or two around the end of the ring

    def test_runs_since_gives_the_writes_in_between_or_none(self):
        """Each reader gets the runs recorded since its revision; ``None`` where a
        revision in between was made without a record, or with rows it cannot tell."""
        journal = WriteJournal()
        with journal.lock:
            journal.record(1, 3, CAPACITY)
            journal.record(2, slice(10, 12), CAPACITY)
            # revision 3 moved the storage without a record
            journal.record(4, 50, CAPACITY)
            journal.record(5, (torch.tensor([0]), torch.tensor([1])), CAPACITY)
            assert journal.runs_since(0, 2) == [(3, 3), (10, 11)]
            assert journal.runs_since(1, 2) == [(10, 11)]
            assert journal.runs_since(2, 2) == []
            assert journal.runs_since(2, 4) is None
            assert journal.runs_since(3, 4) == [(50, 50)]
            assert journal.runs_since(3, 5) is None  # rows along two dims

    def test_it_holds_the_last_writes_in_a_table_of_fixed_size(self):
        """Whatever the number of writes, the journal is one table of a few
        kilobytes; a reader behind the runs it still holds gets ``None``."""
        journal = WriteJournal()
        table = (journal._rows.ctypes.data, journal._rows.nbytes)
        with journal.lock:
            for revision in range(1, 3_001):
                journal.record(revision, revision % CAPACITY, CAPACITY)
            assert journal.runs_since(0, 3_000) is None
            assert journal.runs_since(2_990, 3_000) == [
                (r % CAPACITY,) * 2 for r in range(2_991, 3_001)
            ]
        assert (journal._rows.ctypes.data, journal._rows.nbytes) == table
        assert table[1] < 40 * 1024

    @pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
    def test_a_copy_records_its_own_writes(self, copier):
        journal = WriteJournal()
        with journal.lock:
            journal.record(1, 3, CAPACITY)
        if copier == "deepcopy":
            twin = copy.deepcopy(journal)
        else:
            twin = pickle.loads(pickle.dumps(journal))
        with twin.lock:
            twin.record(2, 7, CAPACITY)
            assert twin.runs_since(1, 2) == [(7, 7)]
        with journal.lock:
            assert journal.runs_since(0, 1) == [(3, 3)]
            assert journal.runs_since(1, 2) is None


_WRITES = {
    "extend": lambda rb: rb.extend(_steps(300, 7)),
    "extend around the ring": lambda rb: rb.extend(_steps(400, 25)),
    "add": lambda rb: rb.add(_steps(310, 1)[0]),
    "rb[index] = data": lambda rb: rb.__setitem__(
        torch.tensor([3, 4, 5]), _steps(320, 3)
    ),
    "storage.set": lambda rb: rb.storage.set(slice(10, 14), _steps(330, 4)),
    "storage[index] = data": lambda rb: rb.storage.__setitem__(
        [20, 22], _steps(340, 2)
    ),
}


class TestStorageWriteJournal:
    @pytest.mark.parametrize("write", list(_WRITES))
    def test_each_write_is_recorded(self, write):
        """The runs recorded since a revision cover every row written since."""
        rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
        rb.extend(_steps(0, 90))
        column = rb.storage._storage["obs"]  # every row, written or not
        revision, before = rb.storage._mutation_revision, column.clone()
        _WRITES[write](rb)
        changed = set(np.flatnonzero((column != before).numpy()).tolist())
        assert rb.storage._mutation_revision > revision
        assert changed and changed <= _covered(_runs_since(rb.storage, revision))

    def test_mark_update_tells_of_a_write_through_data(self):
        """A write through ``.data`` moves no version counter and no revision: a sampler
        that caches its boundaries keeps them. Once ``storage.mark_update`` names the
        rows, the revision moves, the journal holds them, and the sample is the one of a
        buffer filled with the same rows."""
        step = torch.arange(200)
        rb = ReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=SliceSampler(slice_len=4, traj_key="episode", cache_values=True),
            batch_size=32,
        )
        rb.extend(TensorDict({"obs": step, "episode": step // 20}, [200]))
        rb.sample()
        revision = rb.storage._mutation_revision
        rb.storage._storage["episode"].data[100:] = 100 + torch.arange(100) // 7
        assert rb.storage._mutation_revision == revision
        rb.storage.mark_update(torch.arange(100, 200))
        assert rb.storage._mutation_revision == revision + 1
        assert set(range(100, 200)) <= _covered(_runs_since(rb.storage, revision), 200)
        fresh = ReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=SliceSampler(slice_len=4, traj_key="episode"),
            batch_size=32,
        )
        fresh.extend(rb.storage[:].clone())
        for seed in range(3):
            torch.manual_seed(seed)
            data, info = rb.sample(return_info=True)
            torch.manual_seed(seed)
            expected, expected_info = fresh.sample(return_info=True)
            assert (data["episode"] >= 100).any()
            for key in ("obs", "episode"):
                assert torch.equal(data[key], expected[key]), (seed, key)
            for got, want in zip(info["index"], expected_info["index"], strict=True):
                assert torch.equal(got, want), seed

    def test_a_spawned_process_records_its_writes_in_the_same_journal(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
        rb.share()
        rb.extend(_steps(0, 60))
        revision = rb.storage._mutation_revision
        process = mp.get_context("spawn").Process(
            target=_extend, args=(rb, _steps(60, 7))
        )
        process.start()
        process.join()
        assert process.exitcode == 0
        assert rb.storage._mutation_revision == revision + 1
        assert set(range(60, 67)) <= _covered(_runs_since(rb.storage, revision))

    @pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
    def test_a_copied_storage_has_its_own_journal(self, copier):
        storage = LazyTensorStorage(CAPACITY)
        storage.set(torch.arange(40), _steps(0, 40))
        if copier == "deepcopy":
            copied = copy.deepcopy(storage)
        else:
            copied = pickle.loads(pickle.dumps(storage))
        assert copied._write_journal is not storage._write_journal
        revision = storage._mutation_revision
        copied.set(torch.arange(40, 44), _steps(40, 4))
        assert _runs_since(storage, revision) == []
        written = _runs_since(copied, copied._mutation_revision - 1)
        assert _covered(written) == set(range(40, 44))


def _extend(rb, data):
    rb.extend(data)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
