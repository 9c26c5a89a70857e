"""The tensor-ops floor draws the slices the patched sampler draws, from the same table."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

from conformance import reference
from conformance.tensor_ops_floor import TensorOpsSampler, kept_table_draw

pytestmark = pytest.mark.skipif(
    not reference.in_effect("slice_boundary_index"),
    reason="the floor reads the trajectory table of the slice boundary index",
)

EPISODE = 50


def _rows(start: int, count: int) -> TensorDict:
    step = torch.arange(start, start + count)
    done = ((step + 1) % EPISODE == 0).unsqueeze(-1)
    return TensorDict({"obs": step.float().unsqueeze(-1), "done": done}, [count])


def _buffer(**sampler_options) -> ReplayBuffer:
    sampler = SliceSampler(
        num_slices=16, end_key="done", truncated_key=None, **sampler_options
    )
    rb = ReplayBuffer(storage=LazyTensorStorage(10_000), sampler=sampler, batch_size=64)
    rb.extend(_rows(0, 1_000))
    rb.sample()
    if kept_table_draw(sampler) is None:
        pytest.skip("this TorchRL's slice samples do not draw from a trajectory table")
    return rb


def _both(rb: ReplayBuffer) -> tuple[torch.Tensor, torch.Tensor]:
    """The patched sampler's index, then the floor's, from the same generator state."""
    state = torch.get_rng_state()
    index, _ = rb.sampler.sample(rb.storage, rb.batch_size)
    torch.set_rng_state(state)
    (floor_index,), info = TensorOpsSampler(rb.sampler).sample(rb.storage, rb.batch_size)
    assert info == {}
    return torch.stack(index, -1).reshape(-1), floor_index


@pytest.mark.parametrize("write", [0, 7, 130], ids=["static", "7-rows", "130-rows"])
def test_the_floor_draws_the_patched_samplers_slices(write):
    rb = _buffer()
    for round_ in range(3):
        if write:
            rb.extend(_rows(1_000 + round_ * write, write))
        index, floor_index = _both(rb)
        assert torch.equal(index, floor_index)


def test_the_floor_follows_the_rows_of_a_write_it_samples_first():
    rb = _buffer()
    rb.extend(_rows(1_000, 500))
    state = torch.get_rng_state()
    (floor_index,), _ = TensorOpsSampler(rb.sampler).sample(rb.storage, rb.batch_size)
    # the floor appended the written rows: 30 trajectories, 10 of them new
    table = kept_table_draw(rb.sampler).growing._table
    assert (table.count, table.length) == (30, 1_500)
    torch.set_rng_state(state)
    index, _ = rb.sampler.sample(rb.storage, rb.batch_size)
    assert torch.equal(torch.stack(index, -1).reshape(-1), floor_index)


def test_a_sampler_without_a_table_draw_is_refused():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(100),
        sampler=SliceSampler(num_slices=4, end_key="done"),
        batch_size=16,
    )
    rb.extend(_rows(0, 100))
    with pytest.raises(ValueError, match="keeps no draw from a trajectory table"):
        TensorOpsSampler(rb.sampler).sample(rb.storage, 16)


def test_trajectories_shorter_than_the_slices_are_refused():
    rb = _buffer(strict_length=True)
    # an episode of 3 steps: shorter than the slices of 4
    rows = _rows(1_000, 3)
    rows["done"][-1] = True
    rb.extend(rows)
    with pytest.raises(ValueError, match="shorter than the slices"):
        TensorOpsSampler(rb.sampler).sample(rb.storage, rb.batch_size)
