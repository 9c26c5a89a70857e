# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""A prioritized slice that may end early ends at its own trajectory's stop.

In a full storage, the trajectory written last may run around the storage's end:
its slices (``span`` on the right) must stop at the write cursor, wherever in it
they start.
"""
from __future__ import annotations

import argparse

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

try:  # PrioritizedSliceSampler keeps its priorities in the C++ extension's sum trees
    import torchrl._torchrl  # noqa: F401

    _has_extension = True
except ImportError:
    _has_extension = False

pytestmark = pytest.mark.skipif(
    not _has_extension, reason="the TorchRL C++ extension is not available"
)


def _sample_from_row(start, span):
    """The steps of a slice drawn from ``start`` of a full storage of 10 rows that
    holds steps 3 to 12: rows 9, 0, 1 and 2 (steps 9 to 12) are one trajectory."""
    sampler = PrioritizedSliceSampler(10, alpha=1.0, beta=0.5, slice_len=4, span=span)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(10), sampler=sampler, batch_size=4
    )
    step = torch.arange(13)
    done = (step == 5) | (step == 8)
    rb.extend(TensorDict({"step": step, ("next", "done"): done.unsqueeze(-1)}, [13]))
    priority = torch.full((10,), 1e-6)
    priority[start] = 1e6  # every draw is this row
    rb.update_priority(torch.arange(10), priority)
    return rb.sample()["step"].tolist()


@pytest.mark.parametrize(
    "span", [(0, True), (0, 2)], ids=["span to the stop", "span of 2"]
)
class TestPrioritizedSliceStops:
    @pytest.mark.parametrize("start,steps", [(0, [10, 11, 12]), (1, [11, 12])])
    def test_slice_after_the_storage_end_stops_at_the_cursor(self, span, start, steps):
        assert _sample_from_row(start, span=span) == steps

    @pytest.mark.parametrize("start,steps", [(9, [9, 10, 11, 12]), (6, [6, 7, 8])])
    def test_other_slices_keep_their_stops(self, span, start, steps):
        assert _sample_from_row(start, span=span) == steps


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
