# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A storage's trajectory index, against a recovery from the whole storage.

``StorageTrajectoryIndex`` must give the boundaries ``find_start_stop_traj``
recovers from the whole storage after every way its rows change.
"""
from __future__ import annotations

import argparse
import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.utils import find_start_stop_traj
from torchrl_fixes.fixes.slice_boundary_index.storage_index import (
    BoundarySignal,
    StorageTrajectoryIndex,
    Unsupported,
)


def _assert_same_boundaries(got, expected):
    """``(start, stop, lane, lengths)`` equal, as int64 arrays (or both ``None``)."""
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e, strict=True)


DONE = ("next", "done")
_SIGNALS = {
    "done": BoundarySignal("end", (DONE,)),
    "episode": BoundarySignal("trajectory", ("episode",)),
    "end_keys": BoundarySignal("end", (("next", "terminated"), ("next", "truncated"))),
}


def _rows(start, n):
    """``n`` steps from ``start`` on: episodes of 1 to 6 steps, ended by termination
    or truncation."""
    generator = torch.Generator().manual_seed(start)
    done = torch.rand(n, 1, generator=generator) < 0.3
    terminated = done & (torch.rand(n, 1, generator=generator) < 0.5)
    episode = done.squeeze(-1).long().cumsum(0) - done.squeeze(-1).long()
    return TensorDict(
        {
            "obs": torch.arange(start, start + n),
            "episode": episode + 1_000 * start,
            ("next", "done"): done,
            ("next", "terminated"): terminated,
            ("next", "truncated"): done & ~terminated,
        },
        [n],
    )


def _in_place(write):
    """A write through views of the storage's boundary columns, torch's version
    counters the only trace of it."""

    def apply(rb):
        data = rb.storage[:]
        for key in ("episode", *_SIGNALS["done"].keys, *_SIGNALS["end_keys"].keys):
            write(data.get(key))

    return apply


def _replace_columns(rb):
    data = rb.storage._storage
    for key in ("episode", DONE, ("next", "terminated")):
        data.set(key, data.get(key).roll(3, 0), inplace=False)


def _load_state_dict(rb):
    source = LazyTensorStorage(rb.storage.max_size)
    source.set(torch.arange(50), _rows(500, 50))
    rb.storage.load_state_dict(source.state_dict())


def _refill(rb):
    rb.empty()
    rb.extend(_rows(600, 30))


_WRITES = {
    "extend": lambda rb: rb.extend(_rows(300, 7)),
    "add": lambda rb: rb.add(_rows(310, 1)[0]),
    "rb[index] = data": lambda rb: rb.__setitem__(
        torch.tensor([3, 4, 5]), _rows(320, 3)
    ),
    "storage.set": lambda rb: rb.storage.set(slice(10, 14), _rows(330, 4)),
    "storage[index] = data": lambda rb: rb.storage.__setitem__([20, 22], _rows(340, 2)),
    "view setitem": _in_place(lambda column: column.__setitem__(slice(2, 10), 9_999)),
    "copy_": _in_place(
        lambda column: column[2:10].copy_(torch.full_like(column[2:10], 9_999))
    ),
    "zero_": _in_place(lambda column: column[2:10].zero_()),
    "index_put_": _in_place(
        lambda column: column.index_put_(
            (torch.arange(2, 10),), column.new_tensor(9_999)
        )
    ),
    "out=": _in_place(lambda column: torch.logical_not(column[2:10], out=column[2:10])),
    "load_state_dict": _load_state_dict,
    "empty and refill": _refill,
    "replaced column": _replace_columns,
}
# writes TensorStorage.set records: the index reads their rows, it is not rebuilt
_RECORDED = (
    "extend",
    "add",
    "rb[index] = data",
    "storage.set",
    "storage[index] = data",
)


def _recovered_from_storage(storage, signal):
    """``(start, stop, lane, lengths)`` recovered from the whole storage, as the slice samplers do."""
    data = storage[:]
    if signal.kind == "trajectory":
        kwargs = {"trajectory": data[signal.keys[0]]}
    else:
        kwargs = {
            "end": torch.stack([data[key] for key in signal.keys]).any(0).squeeze(-1)
        }
    start, stop, lengths = find_start_stop_traj(
        **kwargs, at_capacity=storage._is_full, cursor=storage._last_cursor_index
    )
    return start[:, 0].numpy(), stop[:, 0].numpy(), None, lengths.numpy()


def _indexed(storage, signal):
    return StorageTrajectoryIndex.of(storage).index(storage, signal)[0]


class TestStorageTrajectoryIndex:
    @pytest.mark.parametrize("write", list(_WRITES))
    @pytest.mark.parametrize("signal", list(_SIGNALS))
    @pytest.mark.parametrize("full", [False, True], ids=["growing", "full"])
    def test_every_write_path_gives_a_fresh_recovery(self, write, signal, full):
        """After any change, the index is a whole-storage recovery; the writes
        ``TensorStorage.set`` records are read into the same index."""
        rb = ReplayBuffer(storage=LazyTensorStorage(100))
        rb.extend(_rows(0, 130 if full else 60))
        signal = _SIGNALS[signal]
        index = _indexed(rb.storage, signal)
        before = _recovered_from_storage(rb.storage, signal)
        _assert_same_boundaries(index.boundaries(), before)
        _WRITES[write](rb)
        expected = _recovered_from_storage(rb.storage, signal)
        assert any(
            not np.array_equal(b, e) for b, e in zip(before, expected) if e is not None
        )
        _assert_same_boundaries(_indexed(rb.storage, signal).boundaries(), expected)
        if write in _RECORDED:
            assert _indexed(rb.storage, signal) is index

    def test_inference_mode_columns_are_unsupported(self):
        """A tensor made in inference mode has no version counter to follow."""
        with torch.inference_mode():
            storage = LazyTensorStorage(10)
            storage.set(torch.arange(8), _rows(0, 8))
        with pytest.raises(Unsupported, match="inference mode"):
            _indexed(storage, _SIGNALS["done"])

    def test_writes_between_two_queries_keep_no_more_than_the_journal(self):
        """What is kept of the writes since the last query is the storage's write
        journal, whose size does not depend on the writes: 40 writes of the whole
        storage leave it the same table, and the next query is a fresh recovery."""
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
        rb.extend(_rows(0, 1_000))
        _indexed(rb.storage, _SIGNALS["done"])
        journal = rb.storage._write_journal
        table = (journal._rows.ctypes.data, journal._rows.nbytes)
        for start in range(1_000, 41_000, 1_000):
            rb.extend(_rows(start, 1_000))
            assert rb.storage._write_journal is journal
            assert (journal._rows.ctypes.data, journal._rows.nbytes) == table
        assert table[1] < 40 * 1024
        expected = _recovered_from_storage(rb.storage, _SIGNALS["done"])
        _assert_same_boundaries(
            _indexed(rb.storage, _SIGNALS["done"]).boundaries(), expected
        )

    def test_writes_the_journal_cannot_tell_rebuild_the_index(self):
        """A revision the journal holds no rows for (moved by a mutation path that
        records nothing) makes the next query rebuild the index; the recorded writes
        after it are read into the rebuilt one."""
        rb = ReplayBuffer(storage=LazyTensorStorage(100))
        rb.extend(_rows(0, 60))
        signal = _SIGNALS["episode"]
        index = _indexed(rb.storage, signal)
        rb.storage._bump_mutation_revision()
        assert _indexed(rb.storage, signal) is not index
        index = _indexed(rb.storage, signal)
        rb.extend(_rows(60, 5))
        assert _indexed(rb.storage, signal) is index
        _assert_same_boundaries(
            index.boundaries(), _recovered_from_storage(rb.storage, signal)
        )

    @pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
    def test_copies_leave_the_index_behind(self, copier):
        """The index is its storage's own: a copy has none, the source keeps its own."""
        storage = LazyTensorStorage(50)
        storage.set(torch.arange(40), _rows(0, 40))
        entry = StorageTrajectoryIndex.of(storage)
        index = _indexed(storage, _SIGNALS["done"])
        if copier == "deepcopy":
            copied = copy.deepcopy(storage)
        else:
            copied = pickle.loads(pickle.dumps(storage))
        assert "_trajectory_index" not in vars(copied)
        assert vars(storage)["_trajectory_index"] is entry
        assert _indexed(storage, _SIGNALS["done"]) is index
        copied.set(torch.arange(40, 44), _rows(40, 4))
        assert _indexed(storage, _SIGNALS["done"]) is index
        for source in (storage, copied):
            expected = _recovered_from_storage(source, _SIGNALS["done"])
            _assert_same_boundaries(
                _indexed(source, _SIGNALS["done"]).boundaries(), expected
            )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
