# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""An online replay step: write a batch of transitions, then sample slices.

This is the loop of an online learner (write, sample, write, sample). Each
step writes 1,000 rows into a full LazyTensorStorage (wrapping around it) and
samples 256 slices of 4 steps with a SliceSampler that finds trajectories from
the done flags or from episode ids. The RandomSampler rows time the same step
with a random sample of the same size, the floor a slice sample compares with.

    pytest benchmarks/test_slice_sampler_online_benchmark.py --benchmark-only

The 5M rows are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

_WRITE = 1_000
_NUM_SLICES = 256
_SLICE_LEN = 4
_SIZES = [100_000, 1_000_000, pytest.param(5_000_000, marks=pytest.mark.slow)]


def _episodes(start, rows, episode_length):
    """``rows`` transitions from step ``start`` on, in episodes of ``episode_length``."""
    step = torch.arange(start, start + rows)
    return TensorDict(
        {
            "obs": torch.zeros(rows, 4),
            "episode": step // episode_length,
            ("next", "done"): (step % episode_length == episode_length - 1).unsqueeze(
                -1
            ),
        },
        batch_size=[rows],
    )


class _OnlineStep:
    """Writes the next ``_WRITE`` transitions into a full buffer, then samples it."""

    def __init__(self, size, episode_length, sampler):
        if _WRITE % episode_length:
            raise ValueError("the episode length must divide the write size")
        self.rb = ReplayBuffer(
            storage=LazyTensorStorage(size),
            sampler=sampler,
            batch_size=_NUM_SLICES * _SLICE_LEN,
        )
        self.rb.extend(_episodes(0, size, episode_length))
        self.batch = _episodes(size, _WRITE, episode_length)
        self.episodes_per_write = _WRITE // episode_length
        torch.manual_seed(0)
        # the first sample after the storage is filled is not a step of the loop
        self.rb.sample()

    def __call__(self):
        self.rb.extend(self.batch)
        self.batch["episode"] += self.episodes_per_write
        return self.rb.sample()


@pytest.mark.parametrize("size", _SIZES)
@pytest.mark.parametrize("episode_length", [100, 1_000])
@pytest.mark.parametrize("boundary", ["done", "episode"])
def test_slice_sampler_online_step(benchmark, size, episode_length, boundary):
    if boundary == "done":
        sampler = SliceSampler(num_slices=_NUM_SLICES, end_key=("next", "done"))
    else:
        sampler = SliceSampler(num_slices=_NUM_SLICES, traj_key="episode")
    step = _OnlineStep(size, episode_length, sampler)
    benchmark.pedantic(step, warmup_rounds=2, rounds=100, iterations=1)


@pytest.mark.parametrize("size", _SIZES)
def test_random_sampler_online_step(benchmark, size):
    step = _OnlineStep(size, 1_000, RandomSampler())
    benchmark.pedantic(step, warmup_rounds=2, rounds=100, iterations=1)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
