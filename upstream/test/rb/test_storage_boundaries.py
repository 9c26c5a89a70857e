# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl_fixes.fixes.slice_boundary_index.boundary_cache import (
    _indexed_boundaries,
    _REPLAY_BOUNDARY_CACHE,
    _storage_boundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.storage_boundaries import _written_rows, StorageBoundaries

CAPACITY = 10
DONE = ("next", "done")


def _rows(n, start=0, length=3):
    step = torch.arange(start, start + n)
    return TensorDict(
        {"obs": step.float(), DONE: (step % length == length - 1).unsqueeze(-1)}, [n]
    )


def _read_storage(n=6):
    """A storage whose index a reader asked for, and that index."""
    storage = LazyTensorStorage(CAPACITY)
    storage.set(torch.arange(n), _rows(n))
    assert _indexed_boundaries(storage, ("end", DONE), None) is not None
    (index,) = _storage_boundaries(storage).indexes.values()
    return storage, index


class TestWrittenRows:
    @pytest.mark.parametrize(
        "cursor",
        [
            3,
            np.int64(12),
            slice(2, 9, 3),
            range(8, 13),
            [1, 4, 11],
            torch.tensor([0, 9, 10]),
            np.array([5, 15]),
            torch.tensor([True, False] * 5),
        ],
    )
    def test_rows_of_every_cursor_type(self, cursor):
        # what data[cursor] writes along dim 0 of a ring of CAPACITY rows
        marks = torch.zeros(CAPACITY, dtype=torch.long)
        if isinstance(cursor, (int, np.integer)):
            marks[int(cursor) % CAPACITY] = 1
        elif isinstance(cursor, slice):
            marks[cursor] = 1
        elif isinstance(cursor, torch.Tensor) and cursor.dtype == torch.bool:
            marks[cursor] = 1
        else:
            marks[torch.as_tensor(list(cursor)) % CAPACITY] = 1
        rows = _written_rows(cursor, CAPACITY)
        # a row written twice may be listed twice
        assert torch.equal(rows.unique(), marks.nonzero().squeeze(-1))

    @pytest.mark.parametrize(
        "cursor", [(1, 2), torch.zeros(2, 2, dtype=torch.long), torch.tensor([0.5])]
    )
    def test_unknown_rows(self, cursor):
        assert _written_rows(cursor, CAPACITY) is None


class TestStorageBoundaries:
    def test_storage_nobody_reads_keeps_a_plain_entry(self):
        rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY))
        rb.extend(_rows(6))
        rb.extend(_rows(3))
        rb.sample(2)
        cached = _REPLAY_BOUNDARY_CACHE.get(rb.storage)
        assert cached is None or not isinstance(cached[1], StorageBoundaries)

    @pytest.mark.parametrize("write", ["extend", "add", "setitem", "set"])
    def test_write_is_recorded_under_the_new_revision(self, write):
        storage, index = _read_storage()
        assert index.built and index.pending_rows == 0
        rb = ReplayBuffer(storage=storage)
        if write == "extend":
            rb.extend(_rows(2))
        elif write == "add":
            rb.add(_rows(1)[0])
        elif write == "setitem":
            rb[torch.tensor([0, 1])] = _rows(2)
        else:
            storage.set(torch.tensor([3, 4]), _rows(2))
        revision, entry = _REPLAY_BOUNDARY_CACHE[storage]
        assert revision == entry.revision == int(storage._mutation_revision)
        assert entry.indexes[("end", DONE)] is index
        assert index.built
        assert index.pending_rows == (1 if write == "add" else 2)

    @pytest.mark.parametrize("mutation", ["empty", "load_state_dict"])
    def test_unrecorded_mutation_resets_the_index(self, mutation):
        storage, index = _read_storage()
        assert index.built
        if mutation == "empty":
            storage._empty()
        else:
            storage.load_state_dict(storage.state_dict())
        _storage_boundaries(storage)
        assert not index.built
