# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""SliceSampler draws its trajectories among those of the storage's index.

The sample must be exactly (index, info and data) the sample of a sampler forced
down the whole-storage recovery, with the same generator state, and it must not
list every trajectory of the storage (``_get_stop_and_length``) to draw a few.
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
from torchrl.data.replay_buffers.samplers import SliceSampler

# short batches are what strict_length=False gives
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)


class _StockSliceSampler(WholeStorageRecovery, SliceSampler):
    """SliceSampler as main runs it."""


_SAMPLERS = {
    "slice_len": {"slice_len": 4, "end_key": ("next", "done")},
    "num_slices, ids": {"num_slices": 6, "traj_key": "episode"},
    "too short, strict": {"slice_len": 8, "end_key": ("next", "done")},
    "too short, not strict": {"slice_len": 8, "strict_length": False},
    "span": {"slice_len": 4, "span": True, "traj_key": "episode"},
    "span before": {"num_slices": 6, "span": (2, False), "end_key": ("next", "done")},
    "span after": {"slice_len": 4, "span": (0, True), "traj_key": "episode"},
}


class TestSliceSamplerDraw:
    @pytest.mark.parametrize("kwargs", list(_SAMPLERS.values()), ids=list(_SAMPLERS))
    @pytest.mark.parametrize("lanes", [None, 3])
    def test_draws_without_listing_the_trajectories(self, kwargs, lanes, monkeypatch):
        storage = LazyTensorStorage(600 * (lanes or 1), ndim=2 if lanes else 1)
        rb, stock = (
            ReplayBuffer(
                storage=storage, sampler=cls(**kwargs), batch_size=24, dim_extend=0
            )
            for cls in (SliceSampler, _StockSliceSampler)
        )
        rb.extend(slice_steps(0, 150, lanes))
        rb.sample()  # the storage's index is made at the first sample
        listed = count_calls(monkeypatch, SliceSampler, "_get_stop_and_length")
        samples = list(enumerate(range(150, 1_000, 85)))
        for seed, start in samples:  # fills, then wraps
            rb.extend(slice_steps(start, 85, lanes))
            torch.manual_seed(seed)
            got = rb.sample(return_info=True)
            torch.manual_seed(seed)
            assert_same_sample(got, stock.sample(return_info=True), f"sample {seed}")
        # only the reference listed the trajectories, down the whole-storage
        # recovery, once a sample
        assert len(listed) == len(samples)
        assert set(listed) == {_StockSliceSampler}
        assert stock.sampler.recoveries == len(listed)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
