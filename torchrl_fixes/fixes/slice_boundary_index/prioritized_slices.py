"""Prioritized slice starts drawn from a sum tree the writes keep.

``PrioritizedSliceSampler.sample`` lists, at every sample, the rows no slice may
start at (the last rows of every trajectory, ``_preceding_stop_idx``:
``O(stored rows)``), sets their priorities to zero in the sampler's sum tree, draws
its starts, and writes the priorities back; slices that may be shorter find their
trajectory's stop in a matrix of every stop by every start. :class:`_EligibleStarts`
keeps a second sum tree on the sampler: its priorities with those rows at zero,
brought up to date from the rows whose stops (:meth:`TrajectoryIndex.changes_since`)
or priorities (``update_priority``) changed. The tree holds the same values as the
zeroed one, and the extension's tree computes each sum from the values alone, so the
draw, the weights and ``priority_weight`` are the same; the sampler's own tree is
never written, and the stops come from the storage's index.
:func:`prioritized_sample_edits` makes ``PrioritizedSliceSampler.sample`` draw so
(:func:`_sample_eligible_starts`).
"""
from __future__ import annotations

import inspect
import textwrap

import numpy as np
import torch

from torchrl.data.replay_buffers.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
)

from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
    _current_index,
    _overrides,
    _reads_index,
)


class _EligibleStarts:
    """The sum tree a ``PrioritizedSliceSampler`` draws its slice starts from.

    It holds the sampler's priorities (its ``_sum_tree``), with zero at each row
    ``_preceding_stop_idx`` lists: one of the last ``tail`` rows of its trajectory,
    unless it starts its trajectory and slices may be shorter
    (``strict_length=False``). Rows past the valid ones keep their priorities, as
    the sampler's tree does.

    Args:
        sampler (PrioritizedSliceSampler): the sampler, with a sum tree on the CPU.
        index (TrajectoryIndex): the trajectories of the sampler's storage, of one lane.
        tail (int): how many of the last rows of a trajectory no slice starts at:
            ``seq_length - 1`` less the span on the right, 1 for ``span=True``.
        device (torch.device): where the storage's boundary columns are, and so
            the tensors the sample makes from them.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler
        >>> sampler = PrioritizedSliceSampler(100, alpha=0.7, beta=0.5, slice_len=4)
        >>> rb = TensorDictReplayBuffer(
        ...     storage=LazyTensorStorage(100), sampler=sampler, batch_size=8
        ... )
        >>> done = (torch.arange(100) % 10 == 9).unsqueeze(-1)  # 10-step trajectories
        >>> _ = rb.extend(TensorDict({("next", "done"): done}, [100]))
        >>> _ = rb.sample()  # the sampler keeps its eligible starts from now on
        >>> starts = sampler._eligible_starts
        >>> # the last 3 rows of each trajectory have no priority there, the others theirs
        >>> starts.tree[7], starts.tree[6] == sampler._sum_tree[6]
        (0.0, True)
    """

    def __init__(self, sampler, index, tail: int, device: torch.device):
        self.priorities, self.alpha = sampler._sum_tree, sampler._alpha
        self.index, self.tail, self.device = index, tail, device
        self.strict_length = sampler.strict_length
        self.at_capacity = index.state[1]
        self.revision = index.revision
        self._set_rows = []  # the rows whose priorities were set since
        self._set_count = 0
        self.capacity = sampler._max_capacity
        self.tree = type(self.priorities)(self.capacity)
        self._write(np.arange(self.capacity))

    def serves(self, sampler, index, tail: int) -> bool:
        """Whether this tree follows ``sampler``'s priorities and ``index`` (it may be behind)."""
        return (
            self.priorities is sampler._sum_tree
            and self.alpha == sampler._alpha
            and self.index is index
            and self.tail == tail
            and self.strict_length == sampler.strict_length
            and self.at_capacity == index.state[1]
            and self._set_count <= self.capacity // 4
        )

    def sample(self, sampler, storage, batch_size: int) -> tuple:
        """``PrioritizedSampler.sample`` of ``batch_size`` starts, drawn from this tree."""
        return PrioritizedSampler.sample(
            _WithSumTree(sampler, self.tree), storage, batch_size
        )

    def slice_lengths(self, starts: torch.Tensor, seq_length: int) -> torch.Tensor:
        """How long each slice from ``starts`` is: ``seq_length``, or less where its trajectory stops first."""
        rows = starts.cpu().numpy()
        _, stops = self.index.stops_around(rows)
        lengths = torch.from_numpy(stops - rows + 1).to(self.device)
        return lengths.clamp_max(seq_length)

    def priorities_set(self, index) -> None:
        """Notes the rows of ``update_priority(index, ...)``."""
        rows = torch.as_tensor(index)
        if rows.ndim > 1 or rows.dtype.is_floating_point:
            self._set_count = np.inf  # an index this tree does not read: rebuild
            return
        rows = rows.reshape(-1).cpu().numpy()
        self._set_count += rows.size
        if self._set_count > self.capacity // 4:  # rebuilt at the next sample
            self._set_rows, self._set_count = [], np.inf
        else:
            self._set_rows.append(rows)

    def catch_up(self) -> bool:
        """Writes the rows changed since; False where they are not known (rebuild)."""
        changes = self.index.changes_since(self.revision)
        if changes is None:
            return False
        self.revision = self.index.revision
        # a row's stop is the first at or after it: the rows up to tail before a
        # changed stop, and the row after it (which it may start), may change
        ranges = [(lo - self.tail, hi + 1) for lo, hi in changes]
        rows = [np.arange(first, last + 1) for first, last in ranges]
        for set_rows in self._set_rows:  # those of a written range are in it
            for first, last in ranges:
                set_rows = set_rows[(set_rows < first) | (set_rows > last)]
            rows.append(set_rows)
        self._set_rows, self._set_count = [], 0
        if rows:
            self._write(np.concatenate(rows))
        return True

    def _write(self, rows: np.ndarray) -> None:
        """Sets the value of ``rows`` (any integers: they are taken around the valid rows).

        Args:
            rows (np.ndarray): int64 rows, in any order, repeated or not.
        """
        length, at_capacity, _ = self.index.state
        if at_capacity:
            rows = rows % length
        else:
            rows = rows[(rows >= 0) & (rows < self.capacity)]
        values = np.asarray(self.priorities[rows])
        valid = np.flatnonzero(rows < length)
        before, after = self.index.stops_around(rows[valid])
        closed = after - rows[valid] < self.tail
        if not self.strict_length:  # a trajectory's first row is always eligible
            closed &= before != rows[valid] - 1
        values[valid[closed]] = 0
        self.tree[rows] = values


class _WithSumTree:
    """A sampler seen with another sum tree, for ``PrioritizedSampler.sample`` to draw from."""

    def __init__(self, sampler, sum_tree):
        self._sampler, self._sum_tree = sampler, sum_tree

    def __getattr__(self, name):
        return getattr(self._sampler, name)


@_reads_index
def _sample_eligible_starts(sampler, storage, batch_size: int, seq_length: int):
    """The slice starts ``PrioritizedSliceSampler.sample`` draws from :func:`_eligible_starts`, or None (stock code).

    Args:
        sampler (PrioritizedSliceSampler): the sampler.
        storage (Storage): the storage it samples.
        batch_size (int): the rows of the sample.
        seq_length (int): the length of the slices, from ``_adjusted_batch_size``.

    Returns:
        ``(starts, info, seq_length, device)``: the starts and the info
        ``PrioritizedSampler.sample`` draws, the length of each slice (where slices
        may be shorter, up to its trajectory's stop) and the device of the
        storage's boundary columns.
    """
    eligible_starts = _eligible_starts(sampler, storage, seq_length)
    if eligible_starts is None:
        return None
    starts, info = eligible_starts.sample(sampler, storage, batch_size // seq_length)
    if sampler.span[1] or not sampler.strict_length:
        seq_length = eligible_starts.slice_lengths(starts, seq_length)
    return starts, info, seq_length, eligible_starts.device


def _eligible_starts(sampler, storage, seq_length: int):
    """The sampler's :class:`_EligibleStarts` for slices of ``seq_length``, brought up to date.

    None where ``PrioritizedSliceSampler.sample`` zeroes the priorities itself: a
    storage the index does not read or of two batch dims, a sum tree on an
    accelerator, a sampler that caches its boundaries (``cache_values=True``) or
    overrides how the rows to exclude are found (``_preceding_stop_idx``,
    ``_get_stop_and_length``) or how priorities are set (``update_priority``), and
    slices of one row or a right span of ``seq_length - 1`` (``_preceding_stop_idx``
    excludes every row there). The eligible starts are dropped then, and built
    again when they serve again.

    Args:
        sampler (PrioritizedSliceSampler): the sampler.
        storage (Storage): the storage it samples.
        seq_length (int): the length of the slices drawn.
    """
    tail = _tail(sampler, storage, seq_length)
    found = None if tail is None else _current_index(sampler, storage)
    if found is None:
        sampler.__dict__.pop("_eligible_starts", None)
        return None
    index, device = found
    starts = sampler.__dict__.get("_eligible_starts")
    if starts is None or not starts.serves(sampler, index, tail) or not starts.catch_up():
        starts = sampler.__dict__["_eligible_starts"] = _EligibleStarts(
            sampler, index, tail, device
        )
    starts.device = device
    return starts


def _tail(sampler, storage, seq_length: int) -> int | None:
    """How many of the last rows of a trajectory no slice of ``seq_length`` starts at.

    None where the eligible starts do not serve ``sampler``.
    """
    if (
        sampler.cache_values
        or _overrides(sampler, "_get_stop_and_length")
        # the eligible starts exclude the rows _preceding_stop_idx lists, and learn
        # of set priorities from update_priority alone: PrioritizedSliceSampler's
        # own (_overrides compares with SliceSampler's)
        or any(
            getattr(type(sampler), name) is not getattr(PrioritizedSliceSampler, name)
            for name in ("_preceding_stop_idx", "update_priority")
        )
        or storage.ndim != 1
    ):
        return None
    device = getattr(sampler, "device", None)
    if device is not None and torch.device(device).type != "cpu":
        return None
    storage_device = getattr(sampler, "_tree_device_from_storage", None)
    if storage_device is not None and storage_device(storage) is not None:
        return None  # the sampler moves its trees to the storage's accelerator
    span_right = sampler.span[1]
    if span_right and isinstance(span_right, bool):
        return 1
    tail = seq_length - 1 - span_right
    return tail if tail >= 1 else None  # else _preceding_stop_idx's slicing decides


def prioritized_sample_edits(stock) -> tuple:
    """The edits of ``PrioritizedSliceSampler.sample`` (``stock``) that draw from :func:`_eligible_starts`.

    Where :func:`_sample_eligible_starts` draws from the sampler's eligible starts,
    the slices that may be shorter end at the stops the index gives
    (:meth:`_EligibleStarts.slice_lengths`); elsewhere the stock code runs, as
    written, one level down, save that it writes the priorities it zeroed back
    even where its draw raises.
    """
    source = textwrap.dedent(inspect.getsource(stock))
    head = (
        "    start_idx, stop_idx, lengths = self._get_stop_and_length(storage)\n"
        "    seq_length, num_slices = self._adjusted_batch_size(batch_size)\n"
    )
    first = source.index("    preceding_stop_idx = self._preceding_stop_idx(")
    draw = source.index("    starts, info = PrioritizedSampler.sample(")
    restored = "    self._sum_tree[preceding_stop_idx.cpu().numpy()] = vals\n"
    truncate = "    # We must truncate the seq_length if (1) not strict length or (2) span[1]\n"
    zeroing = source[first : source.index(restored) + len(restored)]
    drawn = source[draw : source.index(restored)]
    restoring = (  # a draw that raises leaves no priority at zero
        zeroing[: draw - first]
        + "    try:\n"
        + textwrap.indent(drawn, "    ", str.strip)
        + "    finally:\n"
        + textwrap.indent(restored, "    ")
    )
    return (
        (
            head,
            "    seq_length, num_slices = self._adjusted_batch_size(batch_size)\n"
            "    drawn = _sample_eligible_starts(self, storage, batch_size, seq_length)\n",
        ),
        (
            zeroing,
            "    if drawn is None:\n"
            "        start_idx, stop_idx, lengths = self._get_stop_and_length(storage)\n"
            "        device = lengths.device\n"
            + textwrap.indent(restoring, "    ", str.strip)
            + "    else:\n"
            "        starts, info, seq_length, device = drawn\n",
        ),
        (
            f"{truncate}    if self.span[1] or not self.strict_length:\n",
            f"{truncate}    if drawn is None and (self.span[1] or not self.strict_length):\n",
        ),
        ('"], device=lengths.device', '"], device=device'),
    )


# PrioritizedSliceSampler.sample's stop for each start of a slice that may be shorter:
# the first at or after it around the ring. Stock adds the ring's length to the stop
# of a trajectory that runs around it, which is right for the starts before the
# storage's end only: a start after its beginning got the next trajectory's stop, and
# its slice ran into that trajectory.
SLICE_STOP_EDITS = (
    (
        """        stop_idx_corr = stop_idx.clone()
        stop_idx_corr[:, 0] = torch.where(
            stop_idx[:, 0] < start_idx[:, 0],
            stop_idx[:, 0] + storage._len_along_dim0,
            stop_idx[:, 0],
        )
        diff = stop_idx_corr.unsqueeze(1) - starts_tensor.unsqueeze(0)
""",
        """        diff = stop_idx.unsqueeze(1) - starts_tensor.unsqueeze(0)
        # a stop before the start is one around the ring
        diff[:, :, 0] %= storage._len_along_dim0
""",
    ),
    (
        """        # We remove all neg values from consideration
        diff[diff < 0] = diff.max() + 1
        # Take the arg min along dim 0 (thereby reducing dim M)
        idx = diff.argmin(dim=0)
        stops = stop_idx_corr[idx, 0]
        # TODO: here things may not work bc we could have spanning trajs,
        #  though I cannot show that it breaks in the tests
""",
        """        stops = starts_tensor[:, 0] + diff.min(dim=0).values
""",
    ),
)
