"""The demonstration buffer of ``python -m torchrl_fixes diagnose --demo``."""
from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
from torchrl.envs.transforms import Transform

from torchrl_fixes.activation import registry

DEMO_STORED = 5_000_000


class RebuildTensorDict(Transform):
    """Returns a new TensorDict without a device: stock pin_memory skips it."""

    def forward(self, tensordict):
        return TensorDict(dict(tensordict.items()), batch_size=tensordict.batch_size)


def demo_buffer(stored: int = DEMO_STORED, episode: int = 1000, batch_size: int = 256):
    """A slow configuration: a stock slice sampler over ``stored`` rows, pin_memory with a transform that breaks it.

    The buffer and its sampler are built inside :func:`torchrl_fixes.disabled`, so
    they run stock TorchRL code whatever fixes are applied. Only small keys are
    stored (an observation, the episode ids and the done flags).
    """
    step = torch.arange(stored)
    data = TensorDict(
        {
            "observation": torch.randn(stored, 4),
            "episode": step // episode,
            ("next", "done"): (step % episode == episode - 1).unsqueeze(-1),
        },
        batch_size=[stored],
    )
    with registry.disabled():
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(stored),
            sampler=SliceSampler(num_slices=batch_size // 8),
            batch_size=batch_size,
            pin_memory=True,
        )
    rb.append_transform(RebuildTensorDict())
    rb.extend(data)
    return rb
