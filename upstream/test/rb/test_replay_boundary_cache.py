# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""The storage's boundary cache across writes, through the public API.

Sample units (``Sequence``) recover episode boundaries through
``_ReplayBoundaryIndex``, which keeps them per storage in the replay boundary
cache. Writes recorded by ``TensorStorage.set`` carry them over instead of
dropping them; these tests run unchanged before and after that change.
"""
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers import utils
from torchrl.data.replay_buffers.sample_units import Sequence
from torchrl.data.replay_buffers.samplers import RandomSampler

DONE = ("next", "done")


def _rows(n, start=0, length=3):
    step = torch.arange(start, start + n)
    return TensorDict(
        {"obs": step.float(), DONE: (step % length == length - 1).unsqueeze(-1)}, [n]
    )


def _sequence_buffer(capacity):
    return ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=RandomSampler(),
        sample_unit=Sequence(length=4, episode_boundary="stop"),
        batch_size=8,
    )


class TestBoundariesAcrossWrites:
    def test_episode_boundaries_outlive_writes(self, monkeypatch):
        # a sample unit's episode boundaries outlive the writes: at most the first
        # sample recovers them from the whole storage, a write costs its own rows
        calls = []
        derive_end_flags = utils._derive_end_flags

        def counting(*args, **kwargs):
            calls.append(None)
            return derive_end_flags(*args, **kwargs)

        monkeypatch.setattr(utils, "_derive_end_flags", counting)
        rb = _sequence_buffer(1000)
        rb.extend(_rows(300, length=17))
        for step in range(20):
            rb.sample()
            rb.extend(_rows(7, start=300 + 7 * step, length=17))
        rb.sample()
        assert len(calls) <= 1

    def test_samples_are_those_of_recovered_boundaries(self):
        # the same writes into two buffers; the second's boundaries are recovered
        # from its whole storage before each sample (load_state_dict drops them)
        rb, recovered = _sequence_buffer(64), _sequence_buffer(64)
        written = 0
        for count in (40, 3, 17, 30, 1, 50, 7):
            for buffer in (rb, recovered):
                buffer.extend(_rows(count, start=written, length=9))
            written += count
            recovered.storage.load_state_dict(recovered.storage.state_dict())
            torch.manual_seed(written)
            sample = rb.sample()
            torch.manual_seed(written)
            expected = recovered.sample()
            assert (sample == expected).all()
