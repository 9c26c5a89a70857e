# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Trajectory boundaries of the slice samplers across writes.

An online loop (write, sample, write, sample) must not recover the trajectory
boundaries from the whole storage at every sample. The boundaries a sample is
drawn from must still be those of the storage as it is: after every write path,
a sample (index, info and data) equals that of a buffer built from scratch with
the same content, given the same generator state; and where done flags and
episode ids disagree (interleaved collectors), a sampler that names no key
follows the ids.
"""
from __future__ import annotations

import argparse
import copy

import pytest
import torch
from tensordict import is_tensor_collection, TensorDict
from torchrl.data import find_start_stop_traj
from torchrl.data.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import LazyMemmapStorage, LazyTensorStorage
from torchrl.data.replay_buffers.utils import _derive_end_flags

# short batches are what strict_length=False and sampling without replacement give
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)

_SAMPLER_KEYS = {
    "traj_key": {"traj_key": "episode"},
    "end_key": {"end_key": ("next", "done")},
    "no_key": {},
}


def _episodes(steps, lanes=None, *, seed=0, first_id=0, mean_length=5):
    """``steps`` rows of episodes whose ids and done flags mark the same ends.

    Each row holds a distinct ``obs``; with ``lanes``, every lane holds its own
    episodes (shape ``[steps, lanes]``).
    """
    generator = torch.Generator().manual_seed(seed)
    shape = (steps,) if lanes is None else (steps, lanes)
    done = torch.rand(shape, generator=generator) < 1 / mean_length
    # an episode's id counts the ends before it; lanes never share an id
    episode = done.long().cumsum(0) - done.long()
    if lanes is not None:
        episode = episode * lanes + torch.arange(lanes)
    return TensorDict(
        {
            "obs": torch.arange(done.numel()).view(shape) + first_id * 1_000,
            "episode": episode + first_id,
            ("next", "done"): done.unsqueeze(-1),
            ("next", "terminated"): done.unsqueeze(-1),
        },
        shape,
    )


def _interleaved(steps, *, chunk=6, seed=0, first_id=0):
    """Two collectors' episodes written in alternating chunks of ``chunk`` rows.

    Each collector's done flags end its own episodes, so the ids change at every
    chunk boundary where no done flag is set: flags and ids disagree.
    """
    collectors = [
        _episodes(steps, seed=seed + i, first_id=first_id + i * 10_000, mean_length=8)
        for i in range(2)
    ]
    chunks = [
        collector[start : start + chunk]
        for start in range(0, steps, chunk)
        for collector in collectors
    ]
    return torch.cat(chunks)[:steps]


class _Scenario:
    """A buffer and the write operations applied to it, replayable on a new one."""

    def __init__(
        self,
        sampler_factory,
        storage_kind,
        ndim,
        tmp_path,
        capacity,
        reference_sampler_factory=None,
    ):
        self.sampler_factory = sampler_factory
        self.reference_sampler_factory = reference_sampler_factory or sampler_factory
        self.storage_kind = storage_kind
        self.ndim = ndim
        self.tmp_path = tmp_path
        self.capacity = capacity
        self.operations = []
        self._built = 0
        self.rb = self.new_buffer()

    def new_buffer(self, sampler_factory=None):
        self._built += 1
        if self.storage_kind == "memmap":
            storage = LazyMemmapStorage(
                self.capacity,
                ndim=self.ndim,
                scratch_dir=self.tmp_path / f"storage-{self._built}",
            )
        else:
            storage = LazyTensorStorage(self.capacity, ndim=self.ndim)
        return ReplayBuffer(
            storage=storage,
            sampler=(sampler_factory or self.sampler_factory)(),
            batch_size=24,
            dim_extend=0,
        )

    def apply(self, operation):
        self.operations.append(operation)
        operation(self.rb)

    def reference(self):
        """A new buffer that went through the same writes and has never sampled."""
        rb = self.new_buffer(self.reference_sampler_factory)
        for operation in self.operations:
            operation(rb)
        rb.sampler.load_state_dict(copy.deepcopy(self.rb.sampler.state_dict()))
        return rb


def _assert_identical(got, expected, where="sample"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert got.dtype == expected.dtype, where
        assert torch.equal(got, expected), f"{where}: {got} != {expected}"
    elif is_tensor_collection(expected):
        keys = set(expected.keys(True, True))
        assert set(got.keys(True, True)) == keys, where
        assert got.batch_size == expected.batch_size, where
        for key in keys:
            _assert_identical(got.get(key), expected.get(key), f"{where}[{key}]")
    elif isinstance(expected, dict):
        assert set(got) == set(expected), where
        for key in expected:
            _assert_identical(got[key], expected[key], f"{where}[{key}]")
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), where
        for i, (g, e) in enumerate(zip(got, expected)):
            _assert_identical(g, e, f"{where}[{i}]")
    else:
        assert got == expected, where


def _assert_samples_like_reference(scenario, seed):
    """The buffer's sample equals a from-scratch buffer's, same generator state."""
    reference = scenario.reference()
    torch.manual_seed(seed)
    expected = reference.sample(return_info=True)
    torch.manual_seed(seed)
    got = scenario.rb.sample(return_info=True)
    _assert_identical(got, expected)
    return got


def _write_paths(ndim, sampler_factory, capacity):
    """Every way a buffer's storage is written, in an order that fills, wraps,
    rewrites rows in place, reloads and empties it."""
    lanes = None if ndim == 1 else 3
    stream = _episodes(200, lanes, seed=1)

    def rows(start, stop):
        return stream[start:stop]

    def load_state_dict(rb):
        source = ReplayBuffer(
            storage=LazyTensorStorage(capacity, ndim=ndim),
            sampler=sampler_factory(),
            batch_size=24,
            dim_extend=0,
        )
        source.extend(_episodes(30, lanes, seed=2, first_id=50))
        rb.load_state_dict(source.state_dict())

    def second_buffer(rb):
        ReplayBuffer(storage=rb.storage, batch_size=1, dim_extend=0).extend(
            rows(55, 62)
        )

    def setitem(rb):
        rb[torch.tensor([3, 4, 5])] = rows(50, 53)

    def storage_set(rb):
        rb.storage.set(torch.tensor([9, 10]), rows(53, 55))

    def add(rb, row):
        if ndim == 1:
            rb.add(stream[row])
        else:
            # one step of every lane
            rb.extend(rows(row, row + 1))

    return [
        ("extend", lambda rb: rb.extend(rows(0, 25))),
        ("add", lambda rb: add(rb, 25)),
        ("extend past capacity", lambda rb: rb.extend(rows(26, 50))),
        ("rb[index] = data", setitem),
        ("storage.set", storage_set),
        ("second buffer", second_buffer),
        ("wrap again", lambda rb: rb.extend(rows(62, 100))),
        ("load_state_dict", load_state_dict),
        ("extend after load", lambda rb: rb.extend(rows(100, 110))),
        ("empty", lambda rb: rb.empty()),
        ("extend after empty", lambda rb: rb.extend(rows(110, 122))),
        ("add after empty", lambda rb: add(rb, 122)),
    ]


@pytest.fixture
def whole_storage_recoveries(monkeypatch):
    """Records every call of the whole-storage boundary recovery."""
    calls = []

    def counting(*args, **kwargs):
        signal = kwargs.get("trajectory")
        calls.append(tuple((kwargs.get("end") if signal is None else signal).shape))
        return _derive_end_flags(*args, **kwargs)

    # the step of the recovery that reads a whole storage column (ids or flags)
    monkeypatch.setattr("torchrl.data.replay_buffers.utils._derive_end_flags", counting)
    # the recovery is seen where the samplers look it up
    find_start_stop_traj(end=torch.tensor([False, True]), at_capacity=False)
    assert len(calls) == 1
    calls.clear()
    return calls


_ONLINE_SAMPLERS = pytest.mark.parametrize(
    "sampler_cls,sampler_kwargs",
    [
        (SliceSampler, {}),
        (SliceSampler, {"cache_values": True}),
        # caches its values, always
        (SliceSamplerWithoutReplacement, {}),
    ],
    ids=["SliceSampler", "SliceSampler-cache_values", "SliceSamplerWithoutReplacement"],
)


class TestSliceSamplerOnlineLoop:
    @_ONLINE_SAMPLERS
    @pytest.mark.parametrize("key", list(_SAMPLER_KEYS))
    def test_boundaries_are_not_recovered_at_every_sample(
        self, sampler_cls, sampler_kwargs, key, whole_storage_recoveries
    ):
        """100 steps of extend-then-sample recover the boundaries from the whole
        storage at most once (for the first sample), whatever cache_values says."""
        rb = ReplayBuffer(
            storage=LazyTensorStorage(2_000),
            sampler=sampler_cls(slice_len=4, **sampler_kwargs, **_SAMPLER_KEYS[key]),
            batch_size=32,
        )
        stream = _episodes(5_000, seed=0)
        torch.manual_seed(0)
        for step in range(100):
            rb.extend(stream[step * 50 : (step + 1) * 50])
            rb.sample()
        assert (
            len(whole_storage_recoveries) <= 1
        ), f"{len(whole_storage_recoveries)} whole-storage boundary recoveries in 100 samples"

    @_ONLINE_SAMPLERS
    def test_sample_without_write_recovers_nothing(
        self, sampler_cls, sampler_kwargs, whole_storage_recoveries
    ):
        """Samples with no write in between reuse the boundaries of the first."""
        rb = ReplayBuffer(
            storage=LazyTensorStorage(1_000),
            sampler=sampler_cls(slice_len=4, traj_key="episode", **sampler_kwargs),
            batch_size=32,
        )
        rb.extend(_episodes(1_000))
        rb.sample()
        whole_storage_recoveries.clear()
        for _ in range(10):
            rb.sample()
        assert not whole_storage_recoveries


def _assert_samples_after_each_write_path(
    sampler_factory, storage_kind, ndim, tmp_path, samples
):
    """After each write path, ``samples`` samples equal the reference's."""
    capacity = 40 if ndim == 1 else 120
    scenario = _Scenario(sampler_factory, storage_kind, ndim, tmp_path, capacity)
    for seed, (name, operation) in enumerate(
        _write_paths(ndim, sampler_factory, capacity)
    ):
        scenario.apply(operation)
        if not len(scenario.rb):
            continue
        try:
            for sample in range(samples):
                _assert_samples_like_reference(scenario, seed + 100 * sample)
        except AssertionError as err:
            raise AssertionError(f"after {name}: {err}") from err


class TestSliceSamplerBoundariesAfterWrites:
    @pytest.mark.parametrize(
        "sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement]
    )
    @pytest.mark.parametrize("key", list(_SAMPLER_KEYS))
    @pytest.mark.parametrize("strict_length", [True, False])
    @pytest.mark.parametrize(
        "storage_kind,ndim",
        [("tensor", 1), ("memmap", 1), ("tensor", 2), ("memmap", 2)],
    )
    def test_sample_after_each_write_path(
        self, sampler_cls, key, strict_length, storage_kind, ndim, tmp_path
    ):
        def sampler_factory():
            return sampler_cls(
                slice_len=3, strict_length=strict_length, **_SAMPLER_KEYS[key]
            )

        _assert_samples_after_each_write_path(
            sampler_factory, storage_kind, ndim, tmp_path, samples=1
        )

    @pytest.mark.parametrize("key", list(_SAMPLER_KEYS))
    @pytest.mark.parametrize("ndim", [1, 2])
    def test_cached_values_after_each_write_path(self, key, ndim, tmp_path):
        def sampler_factory():
            return SliceSampler(slice_len=3, cache_values=True, **_SAMPLER_KEYS[key])

        # twice: the second sample reads what the first one cached
        _assert_samples_after_each_write_path(
            sampler_factory, "tensor", ndim, tmp_path, samples=2
        )


class TestSliceSamplerInterleavedCollectors:
    @staticmethod
    def _slices_stay_in_one_episode(sample, slice_len=4):
        episode = sample["episode"].reshape(-1, slice_len)
        return bool((episode == episode[:, :1]).all())

    @pytest.mark.parametrize(
        "sampler_cls", [SliceSampler, SliceSamplerWithoutReplacement]
    )
    def test_ids_decide_where_flags_disagree(self, sampler_cls, tmp_path):
        """With no key named, the sampler follows the episode ids; it must keep
        following them once done flags stop marking the same ends (two collectors
        writing interleaved rows), and after those rows are overwritten."""

        def no_key():
            return sampler_cls(slice_len=4, strict_length=True)

        def ids_named():
            return sampler_cls(slice_len=4, strict_length=True, traj_key="episode")

        scenario = _Scenario(
            no_key,
            "tensor",
            1,
            tmp_path,
            capacity=120,
            reference_sampler_factory=ids_named,
        )
        phases = [
            ("one collector", _episodes(80, seed=3, mean_length=8)),
            ("interleaved collectors", _interleaved(40, seed=4, first_id=500)),
            ("interleaved collectors", _interleaved(30, seed=5, first_id=900)),
            (
                "one collector again",
                _episodes(120, seed=6, first_id=2_000, mean_length=8),
            ),
        ]
        for seed, (name, data) in enumerate(phases):
            for start in range(0, data.shape[0], 10):
                scenario.apply(
                    lambda rb, rows=data[start : start + 10]: rb.extend(rows)
                )
                sample, _ = _assert_samples_like_reference(scenario, seed * 100 + start)
                assert self._slices_stay_in_one_episode(sample), name

    def test_interleaved_rows_do_disagree(self):
        """In interleaved data as above, trajectories read from the done flags
        span several episode ids: the test above can tell the two apart."""
        data = _interleaved(120, seed=4)
        rb = ReplayBuffer(
            storage=LazyTensorStorage(120),
            sampler=SliceSampler(
                slice_len=4, end_key=("next", "done"), strict_length=True
            ),
            batch_size=240,
        )
        rb.extend(data)
        torch.manual_seed(0)
        sample = rb.sample()
        assert not self._slices_stay_in_one_episode(sample)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
