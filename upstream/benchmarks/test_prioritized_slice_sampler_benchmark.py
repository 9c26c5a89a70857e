# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A prioritized slice sample right after a write, from a full buffer.

A LazyTensorStorage of ``size`` rows is full of 10-step episodes and wraps
around. Each round writes the next 1,000 rows through the buffer (untimed: the
sampler gives them their priorities), then samples 64 slices of 4 steps with a
``PrioritizedSliceSampler``. The PrioritizedSampler rows sample a batch of the
same size from a buffer of the same rows after the same writes: the floor a
prioritized slice sample compares with.

    pytest benchmarks/test_prioritized_slice_sampler_benchmark.py --benchmark-only

The 1M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
import torch
from _slice_sampler_buffers import episode_steps
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import PrioritizedSampler, PrioritizedSliceSampler

try:  # the prioritized samplers keep their priorities in the C++ extension's sum trees
    import torchrl._torchrl  # noqa: F401

    _has_extension = True
except ImportError:
    _has_extension = False

pytestmark = pytest.mark.skipif(
    not _has_extension, reason="the TorchRL C++ extension is not available"
)

_EPISODE = 10
_NUM_SLICES = 64
_SLICE_LEN = 4
_SIZES = [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)]


class _FullBuffer:
    """A full buffer of ``size`` rows of episodes, sampled with ``sampler``;
    :meth:`write` writes the next 1,000 rows through it."""

    def __init__(self, size, sampler):
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(size),
            sampler=sampler,
            batch_size=_NUM_SLICES * _SLICE_LEN,
        )
        self.written = 0
        while self.written < size + size // 10:  # full, and wrapped around
            self.write(rows=100_000)
        torch.manual_seed(0)
        # the first sample after the storage is filled is not a round
        self.rb.sample()

    def write(self, rows=1_000):
        self.rb.extend(episode_steps(self.written, rows, _EPISODE))
        self.written += rows
        return (), {}


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("sampler", ["prioritized slices", "prioritized"])
def test_sample_after_write(benchmark, size, sampler):
    if sampler == "prioritized":
        sampler = PrioritizedSampler(size, alpha=0.7, beta=0.5)
    else:
        sampler = PrioritizedSliceSampler(
            size,
            alpha=0.7,
            beta=0.5,
            num_slices=_NUM_SLICES,
            end_key=("next", "done"),
        )
    buffer = _FullBuffer(size, sampler)
    benchmark.pedantic(
        buffer.rb.sample, setup=buffer.write, warmup_rounds=2, rounds=20, iterations=1
    )


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
