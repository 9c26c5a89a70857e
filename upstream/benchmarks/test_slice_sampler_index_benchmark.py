# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A slice sample right after a write, from a buffer that is still filling.

A LazyTensorStorage holds ``size`` rows of 1,000-step episodes, with room for a
fifth more. Each round writes the next 1,000 rows (untimed), then samples 256
slices of 4 steps with a SliceSampler that finds the trajectories from the done
flags or from the episode ids, as an online learner does until its buffer is
full. The RandomSampler rows sample a batch of the same size from the same
storage after the same writes: the floor a slice sample compares with.

    pytest benchmarks/test_slice_sampler_index_benchmark.py --benchmark-only

The 10M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
from _slice_sampler_buffers import GrowingBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

_EPISODE = 1_000
_NUM_SLICES = 256
_SLICE_LEN = 4
_SIZES = [1_000_000, pytest.param(10_000_000, marks=pytest.mark.slow)]


def _sampler(kind):
    if kind == "done":
        return SliceSampler(num_slices=_NUM_SLICES, end_key=("next", "done"))
    if kind == "episode":
        return SliceSampler(num_slices=_NUM_SLICES, traj_key="episode")
    return RandomSampler()


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["done", "episode", "random"])
def test_sample_after_write(benchmark, size, sampler):
    buffer = GrowingBuffer(size, _sampler(sampler), _NUM_SLICES * _SLICE_LEN, _EPISODE)
    benchmark.pedantic(
        buffer.rb.sample, setup=buffer.write, warmup_rounds=2, rounds=100, iterations=1
    )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
