"""Trajectory boundaries of a ring-buffer storage, kept up to date write by write.

Pure torch: nothing here imports TorchRL. The fix ``slice_boundary_index`` wires
:class:`TrajectoryBoundaries` into TorchRL's storages and slice samplers.

A storage holds ``capacity`` rows along its first dimension, of which the first
``length`` are valid; every row has one or more *lanes* (the storage's other batch
dimensions). A boundary signal is read per row: either trajectory ids (a row ends
a trajectory where the next row of the same lane holds another id) or end flags
(a row ends a trajectory where its flag is set). The index keeps the rows where
the signal itself marks an end, as sorted integer keys ``lane * capacity + row``,
so its size is the number of trajectories, never the capacity. A write of ``k``
rows is recorded in O(k); the next query reads the signal of those rows only
(plus one neighbour per row for ids) and splices the result in. The rows that
the storage state marks as ends (the last valid row of a partially filled
storage, the write cursor of a full one, the last row of a lane with no end) are
added at query time.

What a query returns is, value for value, what TorchRL's trajectory-boundary
recovery (``SliceSampler._find_start_stop_traj``) returns from the whole signal.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

Rows = torch.Tensor | slice
Signal = Callable[[Rows], torch.Tensor]

KINDS = ("trajectory", "end")


def _merge_sorted(kept: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Merges two sorted key tensors with no key in common, in O(len(kept) + len(new) log)."""
    if not new.numel():
        return kept
    if not kept.numel():
        return new
    at = torch.searchsorted(kept, new) + torch.arange(new.numel(), device=new.device)
    out = torch.empty(kept.numel() + new.numel(), dtype=kept.dtype, device=kept.device)
    free = torch.ones(out.numel(), dtype=torch.bool, device=kept.device)
    free[at] = False
    out[at] = new
    out[free] = kept
    return out


def _contiguous_runs(rows: torch.Tensor) -> list[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive values in sorted unique ``rows``."""
    if not rows.numel():
        return []
    breaks = (rows[1:] != rows[:-1] + 1).nonzero().squeeze(-1)
    firsts = torch.cat([rows[:1], rows[breaks + 1]]).tolist()
    lasts = torch.cat([rows[breaks], rows[-1:]]).tolist()
    return list(zip(firsts, lasts))


class TrajectoryBoundaries:
    """The trajectory boundaries of one boundary signal of a storage.

    Args:
        kind (str): ``"trajectory"`` when the signal holds trajectory ids,
            ``"end"`` when it holds boolean end-of-trajectory flags.

    Keyword Args:
        max_pending (int, optional): the number of written rows past which the
            index stops recording writes one by one and rebuilds from the whole
            signal at the next query (as cheap as recording them by then).
            Defaults to 2**20.

    Examples:
        >>> import torch
        >>> done = torch.zeros(10, dtype=torch.bool)
        >>> done[[2, 7]] = True
        >>> index = TrajectoryBoundaries("end")
        >>> # a full circular storage whose write cursor sits on row 4
        >>> start, stop, lengths = index.boundaries(
        ...     done.__getitem__, capacity=10, length=10, at_capacity=True, cursor=4)
        >>> start.squeeze(-1), stop.squeeze(-1), lengths
        (tensor([8, 3, 5]), tensor([2, 4, 7]), tensor([5, 2, 3]))
        >>> # two rows are rewritten: only those rows are read again
        >>> done[[5, 6]] = torch.tensor([True, False])
        >>> index.mark_written(torch.tensor([5, 6]))
        >>> start, stop, lengths = index.boundaries(
        ...     done.__getitem__, capacity=10, length=10, at_capacity=True, cursor=6)
        >>> start.squeeze(-1), stop.squeeze(-1), lengths
        (tensor([8, 3, 6, 7]), tensor([2, 5, 6, 7]), tensor([5, 3, 1, 1]))
    """

    def __init__(self, kind: str, *, max_pending: int = 1 << 20):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
        self.kind = kind
        self.max_pending = max_pending
        self._lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        """Forgets everything: the next query rebuilds from the whole signal."""
        with self._lock:
            self._ends: torch.Tensor | None = None
            self._capacity: int | None = None
            self._lanes: int | None = None
            self._length = 0
            self._pending: list[torch.Tensor] = []
            self._pending_rows = 0
            self._result = None
            self._result_key = None

    @property
    def built(self) -> bool:
        """Whether the index holds boundaries (False until the first query and after a reset)."""
        return self._ends is not None

    def num_ends(self) -> int:
        """How many rows the signal marks as ends (the index's size), 0 before it is built."""
        ends = self._ends
        return 0 if ends is None else ends.numel()

    def mark_written(self, rows: torch.Tensor) -> None:
        """Records that ``rows`` (indices along the first dimension) were written.

        Costs O(len(rows)); nothing is read until the next :meth:`boundaries`.
        """
        with self._lock:
            if self._ends is None:
                return
            self._pending_rows += rows.numel()
            if self._pending_rows > self.max_pending:
                # Recording more costs as much as the rebuild it would save.
                self.reset()
                return
            self._pending.append(rows.reshape(-1))

    def boundaries(
        self,
        signal: Signal,
        *,
        capacity: int,
        length: int,
        at_capacity: bool,
        cursor: int | None,
        lanes: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``(start, stop, lengths)`` of every trajectory in the first ``length`` rows.

        Args:
            signal (callable): ``signal(rows)`` returns the boundary signal of
                ``rows`` (a slice or a 1d index tensor along the first dimension),
                shaped ``[len(rows)]`` for a storage with one lane and
                ``[len(rows), lanes]`` otherwise.

        Keyword Args:
            capacity (int): the number of rows the storage can hold.
            length (int): the number of valid rows, at least 2.
            at_capacity (bool): whether the storage is full (circular).
            cursor (int or None): for a full storage, the last written row in
                ``[0, length)``: it ends a trajectory, as what followed it was overwritten.
            lanes (int, optional): the number of lanes per row. Defaults to 1.

        Returns:
            ``start`` and ``stop``, ``[N, 1]`` (one lane) or ``[N, 2]`` (row, lane)
            integer tensors of the first and last (inclusive) row of each
            trajectory, ordered by lane then row, and ``lengths``, ``[N]``.
        """
        if length < 2:
            raise ValueError(f"length must be at least 2, got {length}.")
        with self._lock:
            changed = self._update(signal, capacity=capacity, length=length, lanes=lanes)
            key = (length, bool(at_capacity), cursor)
            if changed or self._result_key != key:
                self._result = self._derive(length, bool(at_capacity), cursor)
                self._result_key = key
            return self._result

    def _natural(self, signal: Signal, rows: Rows, count: int, length: int) -> torch.Tensor:
        """``[count, lanes]`` booleans: whether the signal marks each of ``rows`` as an end."""
        values = signal(rows)
        if self.kind == "end":
            ends = values
        elif isinstance(rows, slice):
            # Each row against the next; the last valid row against the first,
            # which only matters once the storage is full and wraps. Compared in
            # place: the ids are not copied.
            ends = torch.empty(values.shape, dtype=torch.bool, device=values.device)
            torch.ne(values[:-1], values[1:], out=ends[:-1])
            torch.ne(values[-1:], values[:1], out=ends[-1:])
        else:
            ends = values != signal((rows + 1) % length)
        return ends.reshape(count, -1)

    def _keys(self, ends: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """Sorted keys ``lane * capacity + row`` of the true entries of ``[k, lanes]`` ``ends``."""
        if self._lanes == 1:
            found = ends.reshape(-1).nonzero().squeeze(-1)
            return found if rows is None else rows[found]
        lane, at = ends.t().nonzero().unbind(-1)
        row = at if rows is None else rows[at]
        return lane * self._capacity + row

    def _rebuild(self, signal: Signal, capacity: int, length: int, lanes: int) -> None:
        self._capacity, self._lanes, self._length = capacity, lanes, length
        ends = self._natural(signal, slice(0, length), length, length)
        self._ends = self._keys(ends, None)
        self._pending, self._pending_rows = [], 0

    def _update(self, signal: Signal, *, capacity: int, length: int, lanes: int) -> bool:
        """Brings the stored ends up to date with the signal; returns whether they changed."""
        if (
            self._ends is None
            or self._capacity != capacity
            or self._lanes != lanes
            or length < self._length
        ):
            self._rebuild(signal, capacity, length, lanes)
            return True
        pending = self._pending
        grown = None
        if length > self._length:
            # Rows that became valid were read as ends of nothing so far; the last
            # old row compared itself with row 0 and must now see its successor.
            grown = torch.arange(max(self._length - 1, 0), length)
        if not pending and grown is None:
            return False
        rows = torch.cat(pending) if pending else grown
        self._pending, self._pending_rows = [], 0
        self._length = length
        rows = rows[(rows >= 0) & (rows < length)]
        if grown is not None and rows is not grown:
            if rows.numel() and int(rows.min()) >= grown[0]:
                rows = grown  # the writes fell in the rows that became valid
            else:
                rows = torch.cat([rows, grown])
        if not rows.numel():
            return False
        first, count = int(rows[0]), rows.numel()
        trajectory = self.kind == "trajectory"
        if (
            int(rows[-1]) == first + count - 1
            and (first > 0 or not trajectory)
            and torch.equal(rows, torch.arange(first, first + count))
        ):
            # One run of rows, as one extend writes: no sort needed. A row's
            # end flag depends on the row after it, so ids re-read the row before.
            first -= trajectory
            rows = torch.arange(first, first + count + trajectory)
            runs = [(first, first + count - 1 + trajectory)]
        else:
            if trajectory:
                rows = torch.cat([rows, (rows - 1) % length])
            rows = torch.unique(rows)
            runs = None
        if rows.numel() * 4 > length:
            self._rebuild(signal, capacity, length, lanes)
            return True
        new = self._keys(self._natural(signal, rows, rows.numel(), length), rows)
        ends = self._ends
        if runs is None:
            runs = _contiguous_runs(rows)
        if lanes == 1 and len(runs) <= 8:
            # Written rows come in runs (extends, wrapping at most once): cut each
            # run's old ends out and put its new ones in, by slicing.
            for first, last in runs:
                lo = int(torch.searchsorted(ends, first))
                hi = int(torch.searchsorted(ends, last, right=True))
                n_lo = int(torch.searchsorted(new, first))
                n_hi = int(torch.searchsorted(new, last, right=True))
                ends = torch.cat([ends[:lo], new[n_lo:n_hi], ends[hi:]])
        else:
            row = ends % capacity
            at = torch.searchsorted(rows, row).clamp_max(rows.numel() - 1)
            ends = _merge_sorted(ends[rows[at] != row], new)
        self._ends = ends
        return True

    def _derive(self, length: int, at_capacity: bool, cursor: int | None):
        capacity, lanes = self._capacity, self._lanes
        ends = self._ends
        lane_keys = torch.arange(lanes) * capacity
        forced = None
        if not at_capacity:
            forced = lane_keys + (length - 1)
        elif cursor is not None:
            forced = lane_keys + cursor
        if forced is not None:
            if ends.numel():
                at = torch.searchsorted(ends, forced).clamp_max(ends.numel() - 1)
                forced = forced[ends[at] != forced]
            ends = _merge_sorted(ends, forced)
        elif at_capacity:
            # A lane with no end at all ends at its last row.
            has_end = torch.zeros(lanes, dtype=torch.bool)
            has_end[ends // capacity] = True
            ends = _merge_sorted(ends, lane_keys[~has_end] + (length - 1))

        stop = ends % capacity if lanes > 1 else ends
        after = (stop + 1) % length
        if lanes == 1:
            start = torch.roll(after, 1)
        else:
            lane = ends // capacity
            new_lane = lane[1:] != lane[:-1]
            first = torch.cat([torch.ones(1, dtype=torch.bool), new_lane])
            last = torch.cat([new_lane, torch.ones(1, dtype=torch.bool)])
            start = torch.empty_like(after)
            start[1:] = after[:-1]
            start[first] = after[last]
        lengths = stop - start + 1
        lengths[lengths <= 0] += length
        if lanes == 1:
            return start.unsqueeze(-1), stop.unsqueeze(-1), lengths
        return torch.stack([start, lane], -1), torch.stack([stop, lane], -1), lengths
