# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""SliceSamplerWithoutReplacement takes its trajectories from the storage's index.

The sample must be exactly (index, info and data, or the error raised) the sample
of a sampler forced down the whole-storage recovery, with the same generator state
and the same permutation, leaving both as that sampler does, and it must not list
every trajectory of the storage (``_get_stop_and_length``) to take a few.
"""
from __future__ import annotations

import argparse

import pytest
import torch
from _slice_sampler_common import (
    assert_same_sample,
    count_calls,
    slice_steps,
    WholeStorageRecovery,
)
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    SliceSampler,
    SliceSamplerWithoutReplacement,
)

# short batches are what strict_length=False and sampling without replacement give
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)


class _StockSliceSamplerWithoutReplacement(
    WholeStorageRecovery, SliceSamplerWithoutReplacement
):
    """SliceSamplerWithoutReplacement as main runs it."""


class _OwnSlicesSamplerWithoutReplacement(SliceSamplerWithoutReplacement):
    """Takes its slices with a ``_sample_slices`` of its own: the stock code serves it."""

    def _sample_slices(self, *args, **kwargs):
        return super()._sample_slices(*args, **kwargs)


def _sample(rb):
    """``rb``'s sample and its info, or the message of the error it raises: where
    every trajectory it takes is too short, with ``strict_length=True``."""
    try:
        return rb.sample(return_info=True)
    except RuntimeError as err:
        return str(err)


def _same_list(got, expected):
    """Whether two samplers hold the same rest of their permutation (or none yet)."""
    if got is None or expected is None:
        return got is expected
    return torch.equal(got, expected)


def _samples_of_both(rb, stock, lanes):
    """Samples ``rb`` and ``stock`` (which share a storage) with the same generator
    state while the buffer fills, wraps around and then stays, and checks that each
    pair is the same sample, leaving the same permutation and generator state.

    Returns the samples of ``rb``.
    """
    samples = []
    rb.extend(slice_steps(0, 150, lanes))
    # the permutation is made anew when the number of trajectories changes
    # (at almost every write), and kept from one sample to the next otherwise
    for start in [*range(150, 1_000, 85), None]:  # fills, wraps, then stays
        for seed in range(3 if start else 30):
            where = f"sample {seed} before {start}"
            torch.manual_seed(seed)
            got = _sample(rb)
            got_rng = torch.get_rng_state()
            torch.manual_seed(seed)
            expected = _sample(stock)
            expected_rng = torch.get_rng_state()
            assert_same_sample(got, expected, where)
            # the permutation drawn once, where stock draws it, and kept as stock keeps it
            assert torch.equal(got_rng, expected_rng), where
            assert _same_list(
                rb.sampler._sample_list, stock.sampler._sample_list
            ), where
            assert rb.sampler.ran_out == stock.sampler.ran_out, where
            samples.append(got)
        if start:
            rb.extend(slice_steps(start, 85, lanes))
    return samples


_SAMPLERS = {
    "none too short": {"slice_len": 1, "end_key": ("next", "done")},
    "slice_len": {"slice_len": 4, "end_key": ("next", "done")},
    "num_slices, ids": {"num_slices": 12, "traj_key": "episode"},
    "too short, strict": {"slice_len": 6, "end_key": ("next", "done")},
    # 64 steps: longer than every trajectory of the storage
    "all too short, strict": {"slice_len": 64, "end_key": ("next", "done")},
    "too short, not strict": {"slice_len": 8, "strict_length": False},
    "no shuffle": {"slice_len": 4, "shuffle": False, "traj_key": "episode"},
    "drop_last": {"slice_len": 4, "drop_last": True, "traj_key": "episode"},
}


def _buffers(storage, kwargs, *classes):
    """A buffer of ``storage`` for a sampler of each of ``classes``: 48 rows a
    sample, or two slices where they are longer."""
    batch_size = max(48, 2 * kwargs.get("slice_len", 0))
    return (
        ReplayBuffer(
            storage=storage, sampler=cls(**kwargs), batch_size=batch_size, dim_extend=0
        )
        for cls in classes
    )


def _filled(sampler_cls, **kwargs):
    """A buffer of 100 rows on a storage of its own, sampled by ``sampler_cls``."""
    kwargs = {"slice_len": 4, "traj_key": "episode", "strict_length": False, **kwargs}
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100), sampler=sampler_cls(**kwargs), batch_size=48
    )
    rb.extend(slice_steps(0, 100))
    return rb


def _write_through_data(storage):
    """Rewrites the episode ids of rows 60 to 99 through ``.data``: no version
    counter and no mutation revision moves."""
    storage._storage["episode"].data[60:100] = 5_000 + torch.arange(40) // 3


def _assert_same_samples(rb, other, seeds):
    for seed in seeds:
        torch.manual_seed(seed)
        got = _sample(rb)
        torch.manual_seed(seed)
        assert_same_sample(got, _sample(other), f"sample {seed}")
        assert _same_list(rb.sampler._sample_list, other.sampler._sample_list)


class TestSliceSamplerWithoutReplacementDraw:
    @pytest.mark.parametrize("kwargs", list(_SAMPLERS.values()), ids=list(_SAMPLERS))
    @pytest.mark.parametrize("lanes", [None, 3])
    def test_takes_without_listing_the_trajectories(self, kwargs, lanes, monkeypatch):
        storage = LazyTensorStorage(600 * (lanes or 1), ndim=2 if lanes else 1)
        rb, stock = _buffers(
            storage,
            kwargs,
            SliceSamplerWithoutReplacement,
            _StockSliceSamplerWithoutReplacement,
        )
        listed = count_calls(monkeypatch, SliceSampler, "_get_stop_and_length")
        samples = _samples_of_both(rb, stock, lanes)
        pairs = len(samples)
        # the reference went down the whole-storage recovery at each sample
        assert listed.count(_StockSliceSamplerWithoutReplacement) == pairs
        assert stock.sampler.recoveries == pairs
        if kwargs.get("slice_len") == 64:
            # every trajectory is too short: the stock code raises its error
            assert all(isinstance(sample, str) for sample in samples)
            assert listed.count(SliceSamplerWithoutReplacement) == pairs
        else:
            assert set(listed) == {_StockSliceSamplerWithoutReplacement}

    @pytest.mark.parametrize("lanes", [None, 3])
    def test_own_sample_slices_keeps_the_stock_code(self, lanes, monkeypatch):
        kwargs = _SAMPLERS["too short, not strict"]
        storage = LazyTensorStorage(600 * (lanes or 1), ndim=2 if lanes else 1)
        rb, stock = _buffers(
            storage,
            kwargs,
            _OwnSlicesSamplerWithoutReplacement,
            _StockSliceSamplerWithoutReplacement,
        )
        listed = count_calls(monkeypatch, SliceSampler, "_get_stop_and_length")
        pairs = len(_samples_of_both(rb, stock, lanes))
        # the subclass lists the trajectories and hands them all to its _sample_slices
        assert listed.count(_OwnSlicesSamplerWithoutReplacement) == pairs
        assert listed.count(_StockSliceSamplerWithoutReplacement) == pairs
        assert stock.sampler.recoveries == pairs

    def test_boundary_index_false_keeps_the_stock_draw(self, monkeypatch):
        """``boundary_index=False`` keeps main's code: the trajectories are listed
        from the whole storage at each sample, before and after a write through
        ``.data``, and each sample is the one of a sampler forced down that recovery."""
        rb = _filled(SliceSamplerWithoutReplacement, boundary_index=False)
        stock = _filled(_StockSliceSamplerWithoutReplacement)
        listed = count_calls(monkeypatch, SliceSampler, "_get_stop_and_length")
        _assert_same_samples(rb, stock, range(3))
        for buffer in (rb, stock):
            _write_through_data(buffer.storage)
        _assert_same_samples(rb, stock, range(3, 6))
        assert listed.count(SliceSamplerWithoutReplacement) == 6

    def test_mark_update_after_a_write_through_data(self):
        """Once ``storage.mark_update`` names the rows written through ``.data``, the
        sampler takes its trajectories from them: each sample is the one of a
        ``boundary_index=False`` twin written alike."""
        rb = _filled(SliceSamplerWithoutReplacement)
        twin = _filled(SliceSamplerWithoutReplacement, boundary_index=False)
        _assert_same_samples(rb, twin, range(3))
        for buffer in (rb, twin):
            _write_through_data(buffer.storage)
            buffer.storage.mark_update(torch.arange(60, 100))
        _assert_same_samples(rb, twin, range(3, 9))


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
