# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Slice samples without replacement from a buffer of short episodes.

A LazyTensorStorage holds ``size`` rows of 10-step episodes (a tenth as many
trajectories). Each round samples 64 slices of 4 steps with a
SliceSamplerWithoutReplacement, which keeps its permutation of the trajectories
from one sample to the next while the storage does not change. The RandomSampler
rows sample a batch of the same size from the same storage: the floor a slice
sample compares with.

    pytest benchmarks/test_slice_sampler_without_replacement_benchmark.py --benchmark-only

The 5M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSamplerWithoutReplacement

_EPISODE = 10
_NUM_SLICES = 64
_SLICE_LEN = 4
_SIZES = [500_000, pytest.param(5_000_000, marks=pytest.mark.slow)]


def _steps(rows):
    """``rows`` transitions in episodes of ``_EPISODE`` steps."""
    step = torch.arange(rows)
    return TensorDict(
        {
            "obs": torch.zeros(rows, 4),
            ("next", "done"): (step % _EPISODE == _EPISODE - 1).unsqueeze(-1),
        },
        batch_size=[rows],
    )


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["without_replacement", "random"])
def test_sample(benchmark, size, sampler):
    if sampler == "random":
        sampler = RandomSampler()
    else:
        sampler = SliceSamplerWithoutReplacement(
            num_slices=_NUM_SLICES, end_key=("next", "done")
        )
    rb = ReplayBuffer(
        storage=LazyTensorStorage(size),
        sampler=sampler,
        batch_size=_NUM_SLICES * _SLICE_LEN,
    )
    rb.extend(_steps(size))
    torch.manual_seed(0)
    rb.sample()  # the first sample after the storage is filled is not a round
    benchmark.pedantic(rb.sample, warmup_rounds=2, rounds=100, iterations=1)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
