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
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

_WRITE = 1_000
_EPISODE = 1_000
_NUM_SLICES = 256
_SLICE_LEN = 4
_SIZES = [1_000_000, pytest.param(10_000_000, marks=pytest.mark.slow)]


def _steps(start, rows):
    """``rows`` transitions from step ``start`` on, in episodes of ``_EPISODE`` steps."""
    step = torch.arange(start, start + rows)
    return TensorDict(
        {
            "obs": torch.zeros(rows, 4),
            "episode": step // _EPISODE,
            ("next", "done"): (step % _EPISODE == _EPISODE - 1).unsqueeze(-1),
        },
        batch_size=[rows],
    )


def _sampler(kind):
    if kind == "done":
        return SliceSampler(num_slices=_NUM_SLICES, end_key=("next", "done"))
    if kind == "episode":
        return SliceSampler(num_slices=_NUM_SLICES, traj_key="episode")
    return RandomSampler()


class _GrowingBuffer:
    """A buffer of ``size`` stored rows, sampled with ``sampler``, and the next rows to write."""

    def __init__(self, size, sampler):
        storage = LazyTensorStorage(size * 6 // 5)
        self.writer = ReplayBuffer(storage=storage)
        self.writer.extend(_steps(0, size))
        self.written = size
        self.rb = ReplayBuffer(
            storage=storage, sampler=sampler, batch_size=_NUM_SLICES * _SLICE_LEN
        )
        torch.manual_seed(0)
        # the first sample after the storage is filled is not a round
        self.rb.sample()

    def write(self):
        self.writer.extend(_steps(self.written, _WRITE))
        self.written += _WRITE
        return (), {}


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["done", "episode", "random"])
def test_sample_after_write(benchmark, size, sampler):
    buffer = _GrowingBuffer(size, _sampler(sampler))
    benchmark.pedantic(
        buffer.rb.sample, setup=buffer.write, warmup_rounds=2, rounds=100, iterations=1
    )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
