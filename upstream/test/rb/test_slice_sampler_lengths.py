# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Slices of different lengths are indexed at once.

``SliceSampler._tensor_slices_from_startend`` must give, for slices of different
lengths (a span, ``strict_length=False``, the truncated slices of
``PrioritizedSliceSampler``), exactly the rows of the slices indexed one by one
with ``_start_to_end``, without calling it for each slice.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from _slice_sampler_common import assert_same_sample, count_calls, slice_steps
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

# short batches are what strict_length=False gives
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)


class _SliceBySlice:
    """Indexes slices of different lengths one at a time, as main does."""

    def _tensor_slices_from_startend(self, seq_length, start, storage_length):
        if isinstance(seq_length, int):
            return super()._tensor_slices_from_startend(
                seq_length, start, storage_length
            )
        result = torch.cat(
            [self._start_to_end(st, length) for st, length in zip(start, seq_length)]
        )
        result[:, 0] = result[:, 0] % storage_length
        return result


class _SliceSamplerSliceBySlice(_SliceBySlice, SliceSampler):
    pass


class _PrioritizedSliceSamplerSliceBySlice(_SliceBySlice, PrioritizedSliceSampler):
    pass


def _seed(seed):
    """Seeds the draws of the samplers: PrioritizedSampler draws with numpy on CPU."""
    torch.manual_seed(seed)
    np.random.seed(seed)


_SAMPLERS = {
    "span": (SliceSampler, {"slice_len": 4, "span": True, "traj_key": "episode"}),
    "left span": (SliceSampler, {"slice_len": 6, "span": (True, False)}),
    "not strict": (SliceSampler, {"slice_len": 8, "strict_length": False}),
    "prioritized, not strict": (
        PrioritizedSliceSampler,
        {
            "slice_len": 8,
            "strict_length": False,
            "max_capacity": 1_800,
            "alpha": 0.7,
            "beta": 0.5,
            "end_key": ("next", "done"),
        },
    ),
}
_SLICE_BY_SLICE = {
    SliceSampler: _SliceSamplerSliceBySlice,
    PrioritizedSliceSampler: _PrioritizedSliceSamplerSliceBySlice,
}


_DEVICES = [
    pytest.param(
        pair,
        id="-".join(pair),
        marks=pytest.mark.skipif(
            "cuda" in pair and not torch.cuda.is_available(), reason="no CUDA device"
        ),
    )
    for pair in [("cpu", "cpu"), ("cpu", "cuda"), ("cuda", "cpu"), ("cuda", "cuda")]
]


class _OwnStartToEnd(SliceSampler):
    """Indexes each slice with a ``_start_to_end`` of its own, and counts the slices."""

    slices = 0

    def _start_to_end(self, st, length):
        self.slices += 1
        return super()._start_to_end(st, length)


def _starts_and_lengths(start_shape, dtype=torch.int64, devices=("cpu", "cpu")):
    """First rows (of ``start_shape``) and lengths of slices, some running around a
    storage of 97 rows, the first three of no row."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randint(100, start_shape, generator=generator, dtype=dtype)
    lengths = torch.randint(6, start_shape[:1], generator=generator)
    lengths[:3] = 0  # empty slices give no row
    return start.to(devices[0]), lengths.to(devices[1])


def _slice_by_slice(sampler, start, lengths, storage_length):
    """The rows of the slices indexed one by one, as main does."""
    expected = torch.cat(
        [sampler._start_to_end(st, length) for st, length in zip(start, lengths)]
    )
    expected[:, 0] = expected[:, 0] % storage_length
    return expected


class TestTensorSlicesFromStartend:
    @pytest.mark.parametrize(
        "start_shape",
        # PrioritizedSliceSampler passes one dimension for a storage of one
        [(50,), (50, 1), (50, 3)],
    )
    @pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
    @pytest.mark.parametrize("devices", _DEVICES)
    def test_lengths_match_slice_by_slice(
        self, start_shape, dtype, devices, monkeypatch
    ):
        sampler = SliceSampler(slice_len=4)
        start, lengths = _starts_and_lengths(start_shape, dtype, devices)
        given = start.clone(), lengths.clone()
        expected = _slice_by_slice(sampler, start, lengths, 97)
        called = count_calls(monkeypatch, SliceSampler, "_start_to_end")
        got = sampler._tensor_slices_from_startend(lengths, start, 97)
        assert (got.dtype, got.device) == (expected.dtype, expected.device)
        assert torch.equal(got, expected)
        assert not called
        # the slices' first rows and lengths are left as they were given
        assert torch.equal(start, given[0]) and torch.equal(lengths, given[1])

    @pytest.mark.parametrize("start_shape", [(50,), (50, 3)])
    def test_own_start_to_end_is_called_for_each_slice(self, start_shape):
        start, lengths = _starts_and_lengths(start_shape)
        expected = _slice_by_slice(SliceSampler(slice_len=4), start, lengths, 97)
        sampler = _OwnStartToEnd(slice_len=4)
        got = sampler._tensor_slices_from_startend(lengths, start, 97)
        assert torch.equal(got, expected)
        assert sampler.slices == len(start)

    @pytest.mark.parametrize("start_shape", [(0,), (0, 1), (0, 3)])
    def test_no_slice_raises_as_torch_cat(self, start_shape):
        start, lengths = _starts_and_lengths(start_shape)
        with pytest.raises(Exception) as main_error:  # what main's torch.cat raises
            torch.cat([])
        with pytest.raises(Exception) as error:
            SliceSampler(slice_len=4)._tensor_slices_from_startend(lengths, start, 10)
        assert type(error.value) is type(main_error.value)


class TestSlicesOfDifferentLengths:
    @pytest.mark.parametrize("name", list(_SAMPLERS))
    @pytest.mark.parametrize("lanes", [None, 3])
    def test_indexed_at_once(self, name, lanes, monkeypatch):
        cls, kwargs = _SAMPLERS[name]
        if cls is PrioritizedSliceSampler:
            pytest.importorskip("torchrl._torchrl", exc_type=ImportError)
        # one storage each: a prioritized sampler learns of the writes of its buffer
        rb, slice_by_slice = (
            ReplayBuffer(
                storage=LazyTensorStorage(600 * (lanes or 1), ndim=2 if lanes else 1),
                sampler=cls(**kwargs),
                batch_size=48,
                dim_extend=0,
            )
            for cls in (cls, _SLICE_BY_SLICE[cls])
        )
        called = count_calls(monkeypatch, SliceSampler, "_start_to_end")
        for seed, start in enumerate(range(0, 1_000, 85)):  # fills, then wraps
            rb.extend(slice_steps(start, 85, lanes))
            slice_by_slice.extend(slice_steps(start, 85, lanes))
            _seed(seed)
            got = rb.sample(return_info=True)
            _seed(seed)
            expected = slice_by_slice.sample(return_info=True)
            assert_same_sample(got, expected, f"sample {seed}")
        assert called, "no sample had slices of different lengths"
        assert set(called) == {_SLICE_BY_SLICE[cls]}


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
