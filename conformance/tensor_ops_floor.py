"""The slice sample reduced to its tensor operations, a floor for the speed benchmarks.

While a storage only grows and done flags end its trajectories, the patched
:class:`~torchrl.data.SliceSampler` draws its slices from the storage's trajectory
table. Such a sample is a handful of tensor operations: ``randint`` over the
trajectories, their first rows and lengths, ``rand`` for where each slice starts,
the index as first row + offset + ``arange``. Around them the sampler also checks
that what it kept from its last sample still holds (its query plan, its draw) and
builds the info with ``_finalize_index``.

:class:`TensorOpsSampler` runs only those operations, on the table a patched
sampler draws from: the same generator draws, so the same index. A replay buffer
with it, over the patched buffer's storage, times the sample with nothing but the
draw's operations, so that the patched median over it is what the checks and the
info cost. A write's rows are appended to the table first, as the patched sample
appends them.
"""
from __future__ import annotations

import functools

import torch
from torchrl.data import RandomSampler

from conformance import reference


class TensorOpsSampler(RandomSampler):
    """The slices ``sliced`` draws from its storage's trajectory table, with the tensor operations alone.

    ``sliced`` must have drawn from the table already (its last sample did): this
    sampler reads the table and the query plan that sample kept.

    Args:
        sliced (SliceSampler): a patched sampler whose last sample drew from the
            trajectory table of the storage this sampler is given.

    Raises:
        ValueError: when ``sliced`` keeps no draw from a trajectory table, or when
            a trajectory is shorter than a slice (the draw is among all of them).

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> done = (torch.arange(1000) % 100 == 99).unsqueeze(-1)
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(2000), batch_size=64,
        ...     sampler=SliceSampler(num_slices=16, end_key="done", truncated_key=None))
        >>> _ = rb.extend(TensorDict({"done": done}, [1000]))
        >>> _ = rb.sample()  # the patched sampler draws from the table
        >>> state = torch.get_rng_state()
        >>> (index,), _ = rb.sampler.sample(rb.storage, 64)
        >>> torch.set_rng_state(state)
        >>> (same,), info = TensorOpsSampler(rb.sampler).sample(rb.storage, 64)
        >>> torch.equal(index, same), info
        (True, {})
    """

    def __init__(self, sliced):
        super().__init__()
        self._sliced = sliced

    def sample(self, storage, batch_size: int) -> tuple[tuple[torch.Tensor], dict]:
        sliced = self._sliced
        _, boundaries, storage_boundaries = _modules()
        draw = kept_table_draw(sliced)
        reference_to_plan = boundaries._LAST_PLANS.get(sliced)
        plan = None if reference_to_plan is None else reference_to_plan()
        if draw is None or plan is None:
            raise ValueError(
                "the slice sampler keeps no draw from a trajectory table: sample it "
                "once from a storage that only grows, with done flags"
            )
        with plan.lock:
            table = draw.growing.current(
                plan.signal, storage_boundaries._geometry(storage, 1)
            )
        seq_length, num_slices = draw.seq_length, draw.num_slices
        count, ranks = table.drawable(seq_length)
        if ranks is not None or count != table.count:
            raise ValueError(
                f"a trajectory is shorter than the slices ({seq_length} steps)"
            )
        drawn = torch.randint(count, (num_slices,), generator=sliced._rng)
        starts = torch.from_numpy(table._bounds)[drawn]
        lengths = torch.from_numpy(table._lengths)[drawn]
        uniform = torch.rand(num_slices, generator=sliced._rng)
        starts += (uniform * (lengths - (seq_length - 1))).long()
        index = (starts.unsqueeze(1) + _steps(seq_length)).view(-1)
        return (index,), {}


def kept_table_draw(sliced):
    """How ``sliced``'s last sample drew from a trajectory table, or ``None`` where it did not
    (trajectory ids, a storage that does not only grow, a TorchRL before 0.14)."""
    sampling, _, _ = _modules()
    return sampling._TABLE_DRAWS.get(sliced)


@functools.cache
def _steps(seq_length: int) -> torch.Tensor:
    return torch.arange(seq_length)


@functools.cache
def _modules():
    """The modules of the boundary index holding the kept draws, the query plans and the geometry."""
    return (
        reference.boundary_index_module("sampling"),
        reference.boundary_index_module("slice"),
        reference.boundary_index_module("storage"),
    )
