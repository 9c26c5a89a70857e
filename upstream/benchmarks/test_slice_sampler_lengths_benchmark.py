# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A sample of slices cut to their trajectories, right after a write, from a buffer
that is still filling.

A LazyTensorStorage holds ``size`` rows of 10-step episodes, with room for a
fifth more. Each round writes the next 1,000 rows (untimed), then samples 64
slices of 16 steps with a ``SliceSampler(strict_length=False)``: each slice is cut
to its trajectory, and the slices of a sample have different lengths. The
RandomSampler rows sample a batch of the same size from the same storage after
the same writes: the floor a slice sample compares with.

    pytest benchmarks/test_slice_sampler_lengths_benchmark.py --benchmark-only

The 5M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
from _slice_sampler_buffers import GrowingBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

# slices cut to their trajectories make short batches
pytestmark = pytest.mark.filterwarnings(
    "ignore:SliceSampler returned a short flat batch:UserWarning"
)

_EPISODE = 10
_NUM_SLICES = 64
_SLICE_LEN = 16
_SIZES = [500_000, pytest.param(5_000_000, marks=pytest.mark.slow)]


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["not_strict", "random"])
def test_sample_after_write(benchmark, size, sampler):
    if sampler == "random":
        sampler = RandomSampler()
    else:
        sampler = SliceSampler(
            num_slices=_NUM_SLICES, end_key=("next", "done"), strict_length=False
        )
    buffer = GrowingBuffer(size, sampler, _NUM_SLICES * _SLICE_LEN, _EPISODE)
    benchmark.pedantic(
        buffer.rb.sample, setup=buffer.write, warmup_rounds=2, rounds=100, iterations=1
    )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
