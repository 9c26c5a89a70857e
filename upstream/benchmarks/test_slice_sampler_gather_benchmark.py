# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A slice sample of image rows, against a random sample of the same size.

Each row holds two 3x64x64 uint8 images (the observation and the next one);
the buffer samples 2,048 rows, as 32 slices for the SliceSampler. A sample
gathers the rows it returns; building the slice sampler's info (truncated,
done, terminated, is_init) reads the rows' flags. The RandomSampler row is
the floor: the same gather, no slices.

    pytest benchmarks/test_slice_sampler_gather_benchmark.py --benchmark-only

The 200k rows (about 5 GB) are marked ``slow``: ``-m "not slow"`` leaves them out.
"""
import argparse

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers import RandomSampler, SliceSampler

_BATCH = 2_048
_NUM_SLICES = 32
_EPISODE = 500
_SIZES = [20_000, pytest.param(200_000, marks=pytest.mark.slow)]


def _image_rows(rows):
    step = torch.arange(rows)
    pixels = torch.zeros(rows, 3, 64, 64, dtype=torch.uint8)
    return TensorDict(
        {
            "pixels": pixels,
            "episode": step // _EPISODE,
            ("next", "pixels"): pixels.clone(),
            ("next", "done"): (step % _EPISODE == _EPISODE - 1).unsqueeze(-1),
        },
        batch_size=[rows],
    )


def _buffer(size, sampler):
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(size), sampler=sampler, batch_size=_BATCH
    )
    rb.extend(_image_rows(size))
    torch.manual_seed(0)
    rb.sample()
    return rb


@pytest.mark.parametrize("size", _SIZES)
def test_slice_sampler_image_sample(benchmark, size):
    rb = _buffer(
        size,
        SliceSampler(num_slices=_NUM_SLICES, traj_key="episode", cache_values=True),
    )
    benchmark.pedantic(rb.sample, warmup_rounds=2, rounds=50, iterations=1)


@pytest.mark.parametrize("size", _SIZES)
def test_random_sampler_image_sample(benchmark, size):
    rb = _buffer(size, RandomSampler())
    benchmark.pedantic(rb.sample, warmup_rounds=2, rounds=50, iterations=1)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
