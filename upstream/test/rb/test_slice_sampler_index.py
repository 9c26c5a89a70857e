# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Slice samplers read their trajectories from the storage's trajectory index.

A slice sample must be exactly (index, info and data) the sample a sampler
forced down the whole-storage recovery draws from the same storage with the same
generator state, whatever wrote the storage; and a write of ``k`` rows must cost
the next sample ``O(k)`` reads, not a read of the whole storage.
"""
from __future__ import annotations

import argparse
import collections
import copy
import itertools
import pickle
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp
from _slice_sampler_common import count_calls, WholeStorageRecovery
from tensordict import is_tensor_collection, TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl_fixes.fixes.slice_boundary_index.storage_index import (
    StorageTrajectoryIndex,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import TrajectoryIndex

# short batches are what strict_length=False and sampling without replacement give
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)

DONE = ("next", "done")
_KEYS = {
    "end_key": {"end_key": DONE},
    "traj_key": {"traj_key": "episode"},
    "end_keys": {"end_keys": [("next", "terminated"), ("next", "truncated")]},
    "no key": {},
}


class _StockSliceSampler(WholeStorageRecovery, SliceSampler):
    pass


class _StockSliceSamplerWithoutReplacement(
    WholeStorageRecovery, SliceSamplerWithoutReplacement
):
    pass


_STOCK = {
    SliceSampler: _StockSliceSampler,
    SliceSamplerWithoutReplacement: _StockSliceSamplerWithoutReplacement,
}


class _OwnSlicesSampler(SliceSampler):
    """Samples with main's code, which reads the index through ``_get_stop_and_length``."""

    def _sample_slices(self, *args, **kwargs):
        return super()._sample_slices(*args, **kwargs)


def _alternating(start, rows):
    """``rows`` steps from ``start``: one episode, or as many one-step episodes, in turn
    (written over a full storage, they add or remove many trajectories at once)."""
    one_episode = (start // rows) % 2
    step = torch.arange(start, start + rows)
    done = torch.ones(rows, 1, dtype=torch.bool)
    if one_episode:
        done[:-1] = False
    episode = torch.full_like(step, start) if one_episode else step
    return TensorDict({"obs": step, "episode": episode, DONE: done}, [rows])


def _stream(steps, lanes=None, seed=0):
    """``steps`` steps of episodes of random lengths; ids and done flags end them together."""
    generator = torch.Generator().manual_seed(seed)
    shape = (steps,) if lanes is None else (steps, lanes)
    done = torch.rand(shape, generator=generator) < 0.25
    terminated = done & (torch.rand(shape, generator=generator) < 0.5)
    episode = done.long().cumsum(0) - done.long()
    obs = torch.arange(done.numel()).view(shape)
    if lanes is not None:
        episode = episode * lanes + torch.arange(lanes)
    return TensorDict(
        {
            "obs": obs,
            "episode": episode + 10_000 * seed,
            ("next", "done"): done.unsqueeze(-1),
            ("next", "terminated"): terminated.unsqueeze(-1),
            ("next", "truncated"): (done & ~terminated).unsqueeze(-1),
        },
        shape,
    )


_STEPS = _stream(2_000)


def _buffers(storage, sampler_cls=SliceSampler, batch_size=24, **kwargs):
    """A buffer whose sampler reads the index, and one forced down the stock recovery,
    on the same storage."""
    return [
        ReplayBuffer(
            storage=storage, sampler=cls(**kwargs), batch_size=batch_size, dim_extend=0
        )
        for cls in (sampler_cls, _STOCK[sampler_cls])
    ]


def _assert_equal(got, expected, where="sample"):
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and torch.equal(got, expected), where
    elif is_tensor_collection(expected):
        assert set(got.keys(True, True)) == set(expected.keys(True, True)), where
        for key in expected.keys(True, True):
            _assert_equal(got.get(key), expected.get(key), f"{where}[{key}]")
    elif isinstance(expected, dict):
        assert set(got) == set(expected), where
        for key in expected:
            _assert_equal(got[key], expected[key], f"{where}[{key}]")
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_equal(g, e, f"{where}[{i}]")
    else:
        assert got == expected, where


def _assert_samples_alike(rb, other, seed=0, samples=2):
    for offset in range(samples):
        torch.manual_seed(seed + offset)
        got = rb.sample(return_info=True)
        torch.manual_seed(seed + offset)
        _assert_equal(got, other.sample(return_info=True))


def _assert_samples_like_stock(rb, stock, seed=0, samples=2):
    _assert_samples_alike(rb, stock, seed, samples)
    assert stock.sampler.recoveries, "the reference did not recover the boundaries"


def _in_place(write):
    """A write through views of the storage's boundary columns."""

    def apply(rb):
        data = rb.storage[:]
        for key in ("episode", DONE, ("next", "terminated"), ("next", "truncated")):
            write(data.get(key))

    return apply


def _load_state_dict(rb):
    source = LazyTensorStorage(rb.storage.max_size)
    source.set(torch.arange(50), _stream(50, seed=1))
    rb.storage.load_state_dict(source.state_dict())


def _refill(rb):
    rb.empty()
    rb.extend(_STEPS[600:630])


def _replace_columns(rb):
    data = rb.storage._storage
    for key in ("episode", DONE, ("next", "terminated")):
        data.set(key, data.get(key).roll(3, 0), inplace=False)


def _write_through_data(storage):
    """Rewrites the episode ids of rows 60 to 99 through ``.data``, where torch counts
    nothing: no version counter, no mutation revision moves."""
    revision = storage._mutation_revision
    storage._storage["episode"].data[60:100] = 5_000 + torch.arange(40) // 3
    assert storage._mutation_revision == revision


def _failed_write(rb):
    """A write that raises once it has moved the storage's cursor."""
    with pytest.raises(RuntimeError):
        rb.storage.set(torch.tensor([30, 31]), _STEPS[:3])


_WRITES = {
    "extend": lambda rb: rb.extend(_STEPS[300:307]),
    "add": lambda rb: rb.add(_STEPS[310]),
    "rb[index] = data": lambda rb: rb.__setitem__(
        torch.tensor([3, 4, 5]), _STEPS[20:23]
    ),
    "storage.set": lambda rb: rb.storage.set(slice(10, 14), _STEPS[40:44]),
    "storage[index] = data": lambda rb: rb.storage.__setitem__([20, 22], _STEPS[50:52]),
    "view setitem": _in_place(lambda column: column.__setitem__(slice(2, 10), 999)),
    "copy_": _in_place(
        lambda column: column[2:10].copy_(torch.full_like(column[2:10], 999))
    ),
    "zero_": _in_place(lambda column: column[2:10].zero_()),
    "index_put_": _in_place(
        lambda column: column.index_put_((torch.arange(2, 10),), column.new_tensor(999))
    ),
    "out=": _in_place(lambda column: torch.logical_not(column[2:10], out=column[2:10])),
    "load_state_dict": _load_state_dict,
    "empty and refill": _refill,
    "replaced column": _replace_columns,
    "failed write": _failed_write,
}

_SAMPLERS = {
    "slice_len": (SliceSampler, {"slice_len": 4, "traj_key": "episode"}),
    "num_slices": (SliceSampler, {"num_slices": 4, "end_key": DONE}),
    "cache_values": (SliceSampler, {"slice_len": 4, "cache_values": True}),
    "not strict": (SliceSampler, {"slice_len": 4, "strict_length": False}),
    "padded": (
        SliceSampler,
        {"slice_len": 4, "strict_length": False, "pad_output": True},
    ),
    "span": (
        SliceSampler,
        {"slice_len": 4, "span": (True, False), "traj_key": "episode"},
    ),
    "span, not strict": (
        SliceSampler,
        {"num_slices": 4, "span": True, "strict_length": False},
    ),
    "without replacement": (
        SliceSamplerWithoutReplacement,
        {"slice_len": 4, "strict_length": False, "traj_key": "episode"},
    ),
    "without replacement, end_keys": (
        SliceSamplerWithoutReplacement,
        {"num_slices": 4, "strict_length": False, **_KEYS["end_keys"]},
    ),
}


class TestSliceSamplerIndex:
    @pytest.mark.parametrize("write", list(_WRITES))
    @pytest.mark.parametrize("keys", list(_KEYS))
    @pytest.mark.parametrize("full", [False, True], ids=["growing", "full"])
    def test_sample_after_each_write(self, write, keys, full):
        rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, **_KEYS[keys])
        rb.extend(_STEPS[: 130 if full else 60])
        _assert_samples_like_stock(rb, stock)
        _WRITES[write](rb)
        _assert_samples_like_stock(rb, stock, seed=10)

    @pytest.mark.parametrize("sampler", list(_SAMPLERS))
    @pytest.mark.parametrize("storage", ["tensor", "memmap", "ndim=2"])
    def test_online_loop(self, sampler, storage, tmp_path):
        """Write, sample, write, sample: the buffer fills, then wraps around."""
        lanes = 3 if storage == "ndim=2" else None
        steps = _stream(150, lanes)
        if storage == "memmap":
            storage = LazyMemmapStorage(60, scratch_dir=tmp_path)
        else:
            storage = LazyTensorStorage(60 * (lanes or 1), ndim=2 if lanes else 1)
        sampler_cls, kwargs = _SAMPLERS[sampler]
        rb, stock = _buffers(storage, sampler_cls, **kwargs)
        for step in range(0, 150, 11):
            rb.extend(steps[step : step + 11])
            if len(rb) > 1:
                _assert_samples_like_stock(rb, stock, seed=step)

    def test_a_write_reads_only_its_rows(self):
        """After the first sample, a write of ``k`` rows makes the next sample read the
        boundary column of those rows alone (and the rows around them)."""
        rb, stock = _buffers(LazyTensorStorage(20_000), slice_len=4, end_key=DONE)
        rb.extend(_stream(10_000))
        _assert_samples_like_stock(rb, stock)
        index = getattr(rb.storage, "_trajectory_index", None)
        assert index is not None, "no trajectory index kept on the storage"
        reader = index._readers[DONE]
        for rows, write in (
            (range(10_000, 10_010), rb.extend),
            (
                range(5_000, 5_010),
                lambda data: rb.storage.__setitem__(slice(5_000, 5_010), data),
            ),
        ):
            read = index._readers[DONE] = _RowsRead(reader)
            write(_stream(10, seed=3))
            _assert_samples_like_stock(rb, stock, seed=1)
            assert index._readers[DONE] is read, "the index was rebuilt"
            # the rows written, and at most the row before them
            assert set(rows) <= set(read.rows) <= set(range(rows[0] - 1, rows[-1] + 1))
            assert len(read.rows) <= 11, f"{len(read.rows)} rows read"

    def test_no_key_reads_done_flags_while_they_agree_with_the_ids(self):
        """With no key named, the ids decide; the done flags, 8 times smaller, are read
        instead while they end the same trajectories, and no longer once two
        collectors write interleaved rows."""
        rb, stock = _buffers(LazyTensorStorage(200), slice_len=4)
        for start in range(0, 150, 10):
            rb.extend(_STEPS[start : start + 10])
            _assert_samples_like_stock(rb, stock, seed=start)
        signal = getattr(
            getattr(rb.storage, "_trajectory_index", None), "last_signal", None
        )
        assert signal is not None and (signal.kind, signal.keys) == ("end", (DONE,))
        collectors = [_stream(40, seed=seed) for seed in (1, 2)]
        for start in range(0, 40, 5):
            rb.extend(
                torch.cat([collector[start : start + 5] for collector in collectors])
            )
            _assert_samples_like_stock(rb, stock, seed=start)
        signal = rb.storage._trajectory_index.last_signal
        assert (signal.kind, signal.keys) == ("trajectory", ("episode",))

    def test_prefetch(self):
        """Samples prefetched in threads, writes in between: each slice holds one
        episode's consecutive steps, and the index is exact once they are done."""
        storage = LazyTensorStorage(200)
        rb = ReplayBuffer(
            storage=storage,
            sampler=SliceSampler(slice_len=4, traj_key="episode"),
            batch_size=32,
            prefetch=2,
        )
        for start in range(0, 400, 17):
            rb.extend(_STEPS[start : start + 17])
            sample = rb.sample().view(-1, 4)
            assert (sample["episode"] == sample["episode"][:, :1]).all()
            assert (sample["obs"].diff() == 1).all()
        rb.shutdown()
        for seed in range(3):
            samples = []
            for sampler in (
                rb.sampler,
                _StockSliceSampler(slice_len=4, traj_key="episode"),
            ):
                torch.manual_seed(seed)
                samples.append(sampler.sample(storage, 32))
            _assert_equal(*samples)

    @pytest.mark.parametrize(
        "sampler_cls",
        [SliceSampler, SliceSamplerWithoutReplacement, _OwnSlicesSampler],
        ids=["SliceSampler", "SliceSamplerWithoutReplacement", "_get_stop_and_length"],
    )
    def test_two_buffers_in_two_threads(self, sampler_cls, monkeypatch, seconds=1.0):
        """Two buffers over one storage: one thread samples the first while another
        writes and samples the second, whose catch-ups rewrite the index. No draw
        raises, and none reads the index as changed since its query: each read of the
        sampling thread yields first, to let the other thread run mid-draw."""
        sampling, changes = threading.local(), collections.Counter()

        def counted(change):
            def count(index, *args):
                changes[id(index)] += 1
                return change(index, *args)

            return count

        def recorded(read):
            def record(index, *args):
                if getattr(sampling, "seen", None) is not None:
                    time.sleep(0.0005)
                    sampling.seen.add((id(index), changes[id(index)]))
                return read(index, *args)

            return record

        def query(entry, *args, stock_query=StorageTrajectoryIndex.index):
            found = stock_query(entry, *args)
            if getattr(sampling, "seen", None) is not None:
                sampling.seen.add((id(found[0]), changes[id(found[0])]))
            return found

        reads = ("count", "select", "boundaries")
        for name in ("assign", "update", *reads):
            method = getattr(TrajectoryIndex, name)
            wrap = recorded if name in reads else counted
            monkeypatch.setattr(TrajectoryIndex, name, wrap(method))
        monkeypatch.setattr(StorageTrajectoryIndex, "index", query)
        storage = LazyTensorStorage(400)
        kwargs = {"slice_len": 4, "traj_key": "episode", "strict_length": False}
        rb, other = (
            ReplayBuffer(storage=storage, sampler=sampler_cls(**kwargs), batch_size=32)
            for _ in range(2)
        )
        other.extend(_alternating(0, 400))
        errors, draws, stop = [], [], time.monotonic() + seconds

        def sample():
            while time.monotonic() < stop:
                sampling.seen = set()
                try:
                    rb.sample()
                except Exception as err:  # noqa: B902
                    errors.append(err)
                draws.append(len(sampling.seen) > 1)

        def write_and_sample():
            for start in itertools.count(400, 50):
                if time.monotonic() > stop:
                    return
                try:
                    other.extend(_alternating(start, 50))
                    other.sample()
                except Exception as err:  # noqa: B902
                    errors.append(err)

        threads = [
            threading.Thread(target=f, daemon=True) for f in (sample, write_and_sample)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=seconds + 60)
        assert not any(
            thread.is_alive() for thread in threads
        ), "a thread never finished"
        assert [repr(err) for err in errors] == []
        assert len(draws) > 20 and sum(draws) == 0, f"{sum(draws)} of {len(draws)} torn"

    @pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
    def test_copied_buffer(self, copier):
        """A copy of the buffer samples as stock does, and leaves the source's index alone."""
        rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, traj_key="episode")
        rb.extend(_STEPS[:130])
        _assert_samples_like_stock(rb, stock)
        index = vars(rb.storage).get("_trajectory_index")
        if copier == "deepcopy":
            copied = copy.deepcopy(rb)
        else:
            copied = pickle.loads(pickle.dumps(rb))
        assert vars(copied.storage).get("_trajectory_index") is None
        assert vars(rb.storage).get("_trajectory_index") is index
        copied.extend(_STEPS[200:205])
        _assert_samples_like_stock(rb, stock, seed=5)
        rb.extend(_STEPS[300:307])
        _assert_samples_like_stock(rb, stock, seed=5)
        copied_stock = _buffers(copied.storage, slice_len=3, traj_key="episode")[1]
        _assert_samples_like_stock(copied, copied_stock, seed=5)

    def test_dumps_loads(self, tmp_path):
        """Loading a dump into the buffer rewrites its storage; a new buffer reads it too."""
        rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, end_key=DONE)
        rb.extend(_STEPS[:130])
        _assert_samples_like_stock(rb, stock)
        rb.dumps(tmp_path)
        rb.extend(_STEPS[130:137])
        _assert_samples_like_stock(rb, stock, seed=5)
        rb.loads(tmp_path)
        _assert_samples_like_stock(rb, stock, seed=10)
        loaded, loaded_stock = _buffers(
            LazyTensorStorage(100), slice_len=3, end_key=DONE
        )
        loaded.loads(tmp_path)
        _assert_samples_like_stock(loaded, loaded_stock, seed=10)

    def test_inference_mode_storage(self):
        """Tensors made in inference mode have no version counter: stock recovers them."""
        with torch.inference_mode():
            rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, end_key=DONE)
            rb.extend(_STEPS[:130])
        _assert_samples_like_stock(rb, stock)
        with torch.inference_mode():
            rb.extend(_STEPS[130:137])
        _assert_samples_like_stock(rb, stock, seed=5)

    def test_shared_storage_written_by_another_process(self):
        """The buffer is handed to a spawned process, which writes; then another
        spawned process writes, then this one. Once its columns are in shared memory
        (handing the buffer over moves them there), the index reads the rows the other
        processes wrote from the storage's write journal: it is not rebuilt."""
        rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, traj_key="episode")
        rb.share()
        rb.extend(_STEPS[:60])
        _assert_samples_like_stock(rb, stock)
        for start, stop in ((60, 67), (67, 72)):
            indexes = _trajectory_indexes(rb.storage)
            process = mp.get_context("spawn").Process(
                target=_extend, args=(rb, _STEPS[start:stop])
            )
            process.start()
            process.join()
            assert process.exitcode == 0
            assert rb.storage[:]["obs"][start:stop].tolist() == list(range(start, stop))
            _assert_samples_like_stock(rb, stock, seed=start)
        assert _trajectory_indexes(rb.storage) == indexes, "the index was rebuilt"
        rb.extend(_STEPS[72:77])
        _assert_samples_like_stock(rb, stock, seed=10)

    def test_shared_memory_storage_written_after_the_first_sample(self):
        """Moving the storage to shared memory (as handing the buffer to a spawned
        process does) after the first sample: the next writes are read where they are."""
        rb, stock = _buffers(LazyTensorStorage(100), slice_len=3, end_key=DONE)
        rb.extend(_STEPS[:60])
        _assert_samples_like_stock(rb, stock)
        rb.storage._storage.share_memory_()
        rb.extend(_STEPS[60:67])
        _assert_samples_like_stock(rb, stock, seed=5)

    def test_mark_update_after_a_write_through_data(self):
        """A write through ``.data`` moves no version counter; once
        ``storage.mark_update`` names its rows, the index reads them again: the
        boundaries and the samples are those of a ``boundary_index=False`` twin, which
        recovers them from the whole storage, written alike."""
        rb, twin = _filled(SliceSampler), _filled(SliceSampler, boundary_index=False)
        _assert_samples_alike(rb, twin)
        before = twin.sampler._get_stop_and_length(twin.storage)
        for buffer in (rb, twin):
            _write_through_data(buffer.storage)
            buffer.storage.mark_update(torch.arange(60, 100))
        expected = twin.sampler._get_stop_and_length(twin.storage)
        assert not all(torch.equal(b, e) for b, e in zip(before, expected))
        _assert_equal(rb.sampler._get_stop_and_length(rb.storage), expected)
        _assert_samples_alike(rb, twin, seed=10, samples=3)

    def test_boundary_index_false_recovers_at_every_sample(self, monkeypatch):
        """``boundary_index=False`` keeps main's whole-storage recovery at every
        sample: it sees a write through ``.data`` that nothing tells the index of,
        and its samples are those of a sampler forced down that recovery."""
        rb = _filled(SliceSampler, boundary_index=False)
        stock = _filled(_StockSliceSampler)
        _assert_samples_like_stock(rb, stock)
        before = rb.sampler._get_stop_and_length(rb.storage)
        for buffer in (rb, stock):
            _write_through_data(buffer.storage)
        after = rb.sampler._get_stop_and_length(rb.storage)
        assert not all(torch.equal(b, a) for b, a in zip(before, after))
        recoveries = count_calls(monkeypatch, SliceSampler, "_find_start_stop_traj")
        _assert_samples_like_stock(rb, stock, seed=10, samples=3)
        assert recoveries.count(SliceSampler) == 3

    def test_boundary_index_takes_a_bool(self):
        with pytest.raises(TypeError, match="boundary_index must be True or False"):
            SliceSampler(slice_len=4, boundary_index="no")

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="no cuda device")
    @pytest.mark.parametrize("keys", ["end_key", "traj_key"])
    def test_cuda_storage(self, keys):
        storage = LazyTensorStorage(100, device="cuda")
        rb, stock = _buffers(storage, slice_len=3, **_KEYS[keys])
        rb.extend(_STEPS[:60])
        _assert_samples_like_stock(rb, stock)
        rb.extend(_STEPS[60:130])
        _assert_samples_like_stock(rb, stock, seed=5)
        rb.extend(_STEPS[130:135])
        _assert_samples_like_stock(rb, stock, seed=10)


class _RowsRead:
    """A column's reader that records the rows read through it."""

    def __init__(self, reader):
        self.reader, self.rows = reader, []

    @property
    def shape(self):
        return self.reader.shape

    def __getitem__(self, rows):
        self.rows += range(*rows.indices(self.reader.shape[0]))
        return torch.as_tensor(self.reader[rows])


def _extend(rb, data):
    rb.extend(data)


def _filled(sampler_cls, **kwargs):
    """A buffer of 100 rows on a storage of its own, sampled by ``sampler_cls``."""
    kwargs = {"slice_len": 4, "traj_key": "episode", "strict_length": False, **kwargs}
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), sampler=sampler_cls(**kwargs), batch_size=24
    )
    rb.extend(_STEPS[:100])
    return rb


def _trajectory_indexes(storage):
    """The trajectory index of each boundary signal the storage's index holds."""
    entry = vars(storage).get("_trajectory_index")
    assert entry is not None, "no trajectory index kept on the storage"
    return [index for index, _ in entry._indexes.values()]


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
