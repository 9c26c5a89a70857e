# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""PrioritizedSliceSampler draws its slice starts from a sum tree the writes keep.

Every sample must be exactly (index, weights and data) the sample of a sampler that
runs main's code (the priorities of the rows no slice starts at set to zero in its
own sum tree, then written back), from the same priorities with the same torch and
numpy generator states, whatever was written and whatever priorities were set; and
the sampler's own priorities are never written by a sample.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from _slice_sampler_common import assert_same_sample, slice_steps, WholeStorageRecovery
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
)

try:  # PrioritizedSliceSampler keeps its priorities in the C++ extension's sum trees
    import torchrl._torchrl  # noqa: F401

    _has_extension = True
except ImportError:
    _has_extension = False

pytestmark = [
    pytest.mark.skipif(
        not _has_extension, reason="the TorchRL C++ extension is not available"
    ),
    # short batches are what strict_length=False and span give
    pytest.mark.filterwarnings(
        "ignore:SliceSampler returned a short flat batch:UserWarning"
    ),
]


class _ZeroingPrioritizedSliceSampler(PrioritizedSliceSampler):
    """Zeroes the priorities of the rows no slice starts at, then draws, as main
    does: overriding how those rows are found keeps a sampler on main's code."""

    def _preceding_stop_idx(self, *args, **kwargs):
        return super()._preceding_stop_idx(*args, **kwargs)


class _StockPrioritizedSliceSampler(
    WholeStorageRecovery, _ZeroingPrioritizedSliceSampler
):
    """Main's code throughout: the boundaries recovered from the whole storage too."""


_SAMPLERS = {
    "strict": {"slice_len": 4},
    "not strict": {"slice_len": 8, "strict_length": False},
    "span to the stop": {"slice_len": 4, "span": (0, True)},
    "span": {"slice_len": 6, "span": (1, 2)},
    "ids": {"slice_len": 4, "traj_key": "episode"},
}


def _buffers(capacity, kwargs):
    """A buffer of the sampler, and one of the sampler that runs main's code."""
    return [
        TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity),
            sampler=cls(max_capacity=capacity, alpha=0.7, beta=0.5, **kwargs),
            batch_size=48,
        )
        for cls in (PrioritizedSliceSampler, _ZeroingPrioritizedSliceSampler)
    ]


def _seed(seed):
    """Seeds the draws: PrioritizedSampler draws with numpy on CPU."""
    torch.manual_seed(seed)
    np.random.seed(seed)


def _filled(sampler_cls, **kwargs):
    """A buffer of 200 rows of episodes, on a storage of its own."""
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(200),
        sampler=sampler_cls(
            200, alpha=0.7, beta=0.5, slice_len=4, traj_key="episode", **kwargs
        ),
        batch_size=48,
    )
    rb.extend(slice_steps(3, 200))
    return rb


def _write_through_data(storage):
    """Rewrites the episode ids of rows 100 to 199 through ``.data``: no version
    counter and no mutation revision moves."""
    storage._storage["episode"].data[100:] = 5_000 + torch.arange(100) // 7


def _sample(rb, seed):
    _seed(seed)
    try:
        return rb.sample(return_info=True)
    except RuntimeError as err:
        return str(err)


class TestEligibleStarts:
    @pytest.mark.parametrize("name", list(_SAMPLERS))
    def test_samples_equal_the_zeroing_samplers(self, name):
        """While the buffers fill, wrap around and have priorities set (few rows and
        many, where trajectories changed and elsewhere), each sample is main's."""
        rb, ref = _buffers(400, _SAMPLERS[name])
        generator = torch.Generator().manual_seed(0)
        for step in range(24):
            steps = slice_steps(
                step, int(torch.randint(1, 90, (), generator=generator))
            )
            rb.extend(steps)
            ref.extend(steps)
            if step % 3 == 1:
                count = 300 if step % 6 == 1 else 5
                index = torch.randint(len(rb), (count,), generator=generator)
                priority = torch.rand(count, generator=generator) * 10
                rb.update_priority(index, priority)
                ref.update_priority(index, priority)
            got, expected = _sample(rb, step), _sample(ref, step)
            assert_same_sample(got, expected, f"sample {step}")
        assert "_eligible_starts" in vars(rb.sampler)
        assert "_eligible_starts" not in vars(ref.sampler)

    # cache_values=True: the rows to exclude are zeroed in the sampler's own tree
    @pytest.mark.parametrize("cache_values", [False, True])
    def test_priorities_are_not_written_by_a_sample(self, cache_values):
        """A sample that finds no row to start at raises, and leaves the priorities
        as they were (main's leaves those rows at zero)."""
        sampler = PrioritizedSliceSampler(
            10, alpha=0.7, beta=0.5, slice_len=4, cache_values=cache_values
        )
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(10), sampler=sampler, batch_size=8
        )
        done = torch.tensor([0, 1, 0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
        rb.extend(slice_steps(0, 7).set(("next", "done"), done))  # none of 4 rows
        before = torch.as_tensor(sampler._sum_tree[range(7)])
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            rb.sample()
        assert torch.equal(torch.as_tensor(sampler._sum_tree[range(7)]), before)

    def test_update_priority_is_seen(self):
        """Once a row's priority is set far above the others', every slice starts there."""
        rb, ref = _buffers(200, {"slice_len": 4})
        steps = slice_steps(1, 200)
        steps.set(("next", "done"), torch.zeros(200, 1, dtype=torch.bool))
        for buffer in (rb, ref):
            buffer.extend(steps)
        _sample(rb, 0)  # the eligible starts are kept from now on
        for row, before in ((17, 0), (150, 17)):  # the row before it back to 1
            for buffer in (rb, ref):
                buffer.update_priority(
                    torch.tensor([before, row]), torch.tensor([1.0, 1e9])
                )
            got = _sample(rb, row)
            assert_same_sample(got, _sample(ref, row), f"row {row}")
            assert got[1]["index"][0].view(-1, 4)[:, 0].eq(row).all()

    def test_update_priority_of_a_subclass_is_seen(self):
        """A subclass that sets its priorities without PrioritizedSliceSampler's
        update_priority draws from them all the same."""

        class Sampler(PrioritizedSliceSampler):
            def update_priority(self, index, priority, *, storage=None):
                PrioritizedSampler.update_priority(
                    self, index, priority, storage=storage
                )

        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=Sampler(200, alpha=0.7, beta=0.5, slice_len=4),
            batch_size=48,
        )
        steps = slice_steps(1, 200)
        steps.set(("next", "done"), torch.zeros(200, 1, dtype=torch.bool))
        rb.extend(steps)
        rb.sample()  # where the eligible starts served it, they would be kept from now on
        rb.update_priority(torch.tensor([17]), torch.tensor([1e9]))
        _seed(17)
        _, info = rb.sample(return_info=True)
        assert info["index"][0].view(-1, 4)[:, 0].eq(17).all()
        assert "_eligible_starts" not in vars(rb.sampler)

    def test_pickled_state_drops_the_eligible_starts(self):
        rb, _ = _buffers(100, {"slice_len": 4})
        rb.extend(slice_steps(2, 100))
        rb.sample()
        assert "_eligible_starts" in vars(rb.sampler)
        assert "_eligible_starts" not in rb.sampler.__getstate__()

    def test_boundary_index_false_keeps_main_s_code(self):
        """``boundary_index=False`` keeps main's code, before and after a write
        through ``.data`` that nothing tells the index of: each sample is the one of
        a sampler that recovers the boundaries from the whole storage and zeroes."""
        rb = _filled(PrioritizedSliceSampler, boundary_index=False)
        ref = _filled(_StockPrioritizedSliceSampler)
        for seed in range(6):
            if seed == 3:
                for buffer in (rb, ref):
                    _write_through_data(buffer.storage)
            assert_same_sample(_sample(rb, seed), _sample(ref, seed), f"sample {seed}")
        assert ref.sampler.recoveries == 6
        assert "_eligible_starts" not in vars(rb.sampler)

    def test_mark_update_after_a_write_through_data(self):
        """Once ``storage.mark_update`` names the rows written through ``.data``, the
        starts are drawn from them: each sample is the one of a
        ``boundary_index=False`` twin written alike."""
        rb = _filled(PrioritizedSliceSampler)
        twin = _filled(PrioritizedSliceSampler, boundary_index=False)
        for seed in range(6):
            if seed == 3:
                for buffer in (rb, twin):
                    _write_through_data(buffer.storage)
                    buffer.storage.mark_update(torch.arange(100, 200))
            got = _sample(rb, seed)
            assert_same_sample(got, _sample(twin, seed), f"sample {seed}")
        assert "_eligible_starts" in vars(rb.sampler)


if __name__ == "__main__":
    args, unknown = argparse.ArgumentParser().parse_known_args()
    pytest.main([__file__, "--capture", "no", "--exitfirst"] + unknown)
