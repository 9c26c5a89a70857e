# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A slice sample from a buffer that is still filling, beside a random sample.

A LazyTensorStorage holds 5/6 of its capacity in 1,000-step episodes marked by
done flags. Each round samples 256 slices of 4 steps with a SliceSampler, either
from the buffer as it is or right after a write of 1,000 rows past the stored
ones (the write itself untimed), as an online learner does until its buffer is
full. The RandomSampler rows sample the same storage with a random sample of the
same size, after the same writes: the floor a slice sample compares with.

    pytest benchmarks/test_slice_sampler_growing_benchmark.py --benchmark-only

The 5M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
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
_ROUNDS = 100
_SIZES = [1_000_000, pytest.param(5_000_000, marks=pytest.mark.slow)]


def _episodes(start, rows):
    """``rows`` transitions from step ``start`` on, in episodes of ``_EPISODE`` steps."""
    step = torch.arange(start, start + rows)
    done = (step % _EPISODE == _EPISODE - 1).unsqueeze(-1)
    return TensorDict({"obs": torch.zeros(rows, 1), ("next", "done"): done}, [rows])


class _GrowingBuffer:
    """A buffer filled with ``size`` rows and room for a sixth more, and the next rows to write."""

    def __init__(self, size, sampler):
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(size * 6 // 5),
            sampler=sampler,
            batch_size=_NUM_SLICES * _SLICE_LEN,
        )
        self.rb.extend(_episodes(0, size))
        self.written = size
        torch.manual_seed(0)
        # the first sample after the storage is filled is not a round
        self.rb.sample()

    def write(self):
        self.rb.extend(_episodes(self.written, _WRITE))
        self.written += _WRITE
        return (), {}


def _sampler(kind):
    if kind == "slice":
        return SliceSampler(
            num_slices=_NUM_SLICES, end_key=("next", "done"), truncated_key=None
        )
    return RandomSampler()


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["slice", "random"])
def test_growing_buffer_sample(benchmark, size, sampler):
    buffer = _GrowingBuffer(size, _sampler(sampler))
    benchmark.pedantic(buffer.rb.sample, warmup_rounds=2, rounds=_ROUNDS, iterations=1)


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["slice", "random"])
def test_growing_buffer_sample_after_write(benchmark, size, sampler):
    buffer = _GrowingBuffer(size, _sampler(sampler))
    benchmark.pedantic(
        buffer.rb.sample,
        setup=buffer.write,
        warmup_rounds=2,
        rounds=_ROUNDS,
        iterations=1,
    )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
