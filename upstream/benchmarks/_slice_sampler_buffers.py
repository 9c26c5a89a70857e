# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The buffers of the slice sampler benchmarks: episodes written as an online learner writes them."""
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer


def episode_steps(start, rows, episode):
    """``rows`` transitions from step ``start`` on, in episodes of ``episode`` steps."""
    step = torch.arange(start, start + rows)
    return TensorDict(
        {
            "obs": torch.zeros(rows, 4),
            "episode": step // episode,
            ("next", "done"): (step % episode == episode - 1).unsqueeze(-1),
        },
        batch_size=[rows],
    )


class GrowingBuffer:
    """A buffer of ``size`` stored rows of ``episode``-step episodes, with room for a
    fifth more, sampled with ``sampler`` in batches of ``batch_size``; :meth:`write`
    writes the next ``rows``."""

    def __init__(self, size, sampler, batch_size, episode, rows=1_000):
        storage = LazyTensorStorage(size * 6 // 5)
        self.episode, self.rows = episode, rows
        self.writer = ReplayBuffer(storage=storage)
        self.writer.extend(episode_steps(0, size, episode))
        self.written = size
        self.rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=batch_size)
        torch.manual_seed(0)
        # the first sample after the storage is filled is not a round
        self.rb.sample()

    def write(self):
        self.writer.extend(episode_steps(self.written, self.rows, self.episode))
        self.written += self.rows
        return (), {}
