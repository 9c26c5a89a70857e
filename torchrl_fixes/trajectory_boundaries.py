"""Trajectory boundaries of a ring-buffer storage, kept up to date write by write.

Pure torch: nothing here imports TorchRL. ``storage_boundaries`` wires
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

Signal = Callable[[slice], torch.Tensor]

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
        # an id row ends a trajectory or not depending on the row after it
        self._reads_next_row = kind == "trajectory"
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

    @property
    def pending_rows(self) -> int:
        """How many written rows wait for the next query (or :meth:`refresh`) to be read."""
        return self._pending_rows

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
                ``rows``, a slice along the first dimension,
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

    def refresh(self, signal: Signal, *, capacity: int, length: int, lanes: int = 1) -> None:
        """Brings the index up to date with ``signal`` now, building it if it is not built.

        Takes the arguments of :meth:`boundaries`; what a later query then costs
        is the derivation of the boundaries alone.
        """
        with self._lock:
            self._update(signal, capacity=capacity, length=length, lanes=lanes)

    def _natural_all(self, signal: Signal, length: int) -> torch.Tensor:
        """``[length, lanes]`` booleans: whether the signal marks each valid row as an end."""
        values = signal(slice(0, length))
        if self.kind == "end":
            return values.reshape(length, -1)
        # Each row against the next; the last valid row against the first, which
        # only matters once the storage is full and wraps. Compared in place: the
        # ids are not copied.
        ends = torch.empty(values.shape, dtype=torch.bool, device=values.device)
        torch.ne(values[:-1], values[1:], out=ends[:-1])
        torch.ne(values[-1:], values[:1], out=ends[-1:])
        return ends.reshape(length, -1)

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
        ends = self._natural_all(signal, length)
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
        old_length = self._length
        if not pending and length == old_length:
            return False
        self._pending, self._pending_rows = [], 0
        self._length = length
        runs = self._stale_runs(pending, old_length, length)
        if not runs:
            return False
        if sum(last - first + 1 for first, last in runs) * 4 > length:
            self._rebuild(signal, capacity, length, lanes)
            return True
        if lanes == 1:
            # Cut each run's old ends out and put its new ones in: one copy of
            # the ends, however many runs.
            ends = self._ends
            bounds = torch.tensor([b for first, last in runs for b in (first, last + 1)])
            cuts = torch.searchsorted(ends, bounds).tolist()
            pieces, kept_from = [], 0
            for i, (first, last) in enumerate(runs):
                pieces.append(ends[kept_from : cuts[2 * i]])
                found = self._natural_run(signal, first, last, length).reshape(-1).nonzero()
                pieces.append(found.squeeze(-1) + first)
                kept_from = cuts[2 * i + 1]
            pieces.append(ends[kept_from:])
            self._ends = torch.cat(pieces)
            return True
        rows = torch.cat([torch.arange(first, last + 1) for first, last in runs])
        ends = torch.cat([self._natural_run(signal, first, last, length) for first, last in runs])
        new = self._keys(ends, rows)
        ends = self._ends
        row = ends % capacity
        at = torch.searchsorted(rows, row).clamp_max(rows.numel() - 1)
        self._ends = _merge_sorted(ends[rows[at] != row], new)
        return True

    def _stale_runs(
        self, pending: list[torch.Tensor], old_length: int, length: int
    ) -> list[tuple[int, int]]:
        """Sorted, disjoint ``(first, last)`` runs of the rows whose end flag may have changed.

        Those are the written rows, the rows that became valid and, for ids, the
        row before each of them (its end depends on the row after it); row 0's
        predecessor is the last valid row, which wraps onto it.
        """
        runs = []
        if length > old_length:
            # Rows that became valid were read as ends of nothing so far; the last
            # old row compared itself with row 0 and must now see its successor.
            runs.append((max(old_length - 1, 0), length - 1))
        if pending:
            rows = pending[0] if len(pending) == 1 else torch.cat(pending)
            if rows.numel():
                lo, hi = (int(v) for v in rows.aminmax())
                if (
                    hi - lo + 1 == rows.numel()
                    and 0 <= lo
                    and hi < length
                    and torch.equal(rows, torch.arange(lo, hi + 1))
                ):
                    # One run of rows, as one extend writes: no sort needed.
                    runs.append((lo, hi))
                else:
                    rows = torch.unique(rows[(rows >= 0) & (rows < length)])
                    runs.extend(_contiguous_runs(rows))
        if self._reads_next_row:
            widened = []
            for first, last in runs:
                if first == 0:
                    widened.append((length - 1, length - 1))
                widened.append((max(first - 1, 0), last))
            runs = widened
        runs.sort()
        merged = []
        for first, last in runs:
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return merged

    def _natural_run(self, signal: Signal, first: int, last: int, length: int) -> torch.Tensor:
        """``[count, lanes]`` booleans: whether the signal marks rows ``first..last`` as ends."""
        count = last - first + 1
        if self.kind == "end":
            return signal(slice(first, last + 1)).reshape(count, -1)
        if last + 1 < length:
            values = signal(slice(first, last + 2))
            return (values[:-1] != values[1:]).reshape(count, -1)
        # The last valid row is compared with row 0, which only matters once the
        # storage is full and wraps.
        values = signal(slice(first, last + 1))
        after = torch.cat([values[1:], signal(slice(0, 1))])
        return (values != after).reshape(count, -1)

    def _derive(self, length: int, at_capacity: bool, cursor: int | None):
        if self._lanes == 1:
            return self._derive_one_lane(length, at_capacity, cursor)
        return self._derive_lanes(length, at_capacity, cursor)

    def _derive_one_lane(self, length: int, at_capacity: bool, cursor: int | None):
        stop = self._ends
        forced = length - 1 if not at_capacity else cursor
        if forced is not None:
            at = int(torch.searchsorted(stop, forced))
            if at == stop.numel() or int(stop[at]) != forced:
                stop = torch.cat([stop[:at], stop.new_full((1,), forced), stop[at:]])
        elif not stop.numel():
            stop = torch.tensor([length - 1])
        # Each trajectory starts after the previous one stops; the first starts
        # after the last one, around the ring.
        count = stop.numel()
        first_stop, last_stop = stop[[0, -1]].tolist()
        first_start = (last_stop + 1) % length
        start = torch.empty(count, 1, dtype=stop.dtype)
        torch.add(stop[:-1], 1, out=start[1:, 0])
        start[0, 0] = first_start
        lengths = torch.empty(count, dtype=stop.dtype)
        torch.sub(stop[1:], stop[:-1], out=lengths[1:])
        first_length = first_stop - first_start + 1
        lengths[0] = first_length if first_length > 0 else first_length + length
        return start, stop.unsqueeze(-1), lengths

    def _derive_lanes(self, length: int, at_capacity: bool, cursor: int | None):
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
        else:
            # A lane with no end at all ends at its last row.
            has_end = torch.zeros(lanes, dtype=torch.bool)
            has_end[ends // capacity] = True
            ends = _merge_sorted(ends, lane_keys[~has_end] + (length - 1))

        stop = ends % capacity
        after = (stop + 1) % length
        lane = ends // capacity
        new_lane = lane[1:] != lane[:-1]
        first = torch.cat([torch.ones(1, dtype=torch.bool), new_lane])
        last = torch.cat([new_lane, torch.ones(1, dtype=torch.bool)])
        start = torch.empty_like(after)
        start[1:] = after[:-1]
        start[first] = after[last]
        lengths = stop - start + 1
        lengths[lengths <= 0] += length
        return torch.stack([start, lane], -1), torch.stack([stop, lane], -1), lengths


class EndFlagDisagreements(TrajectoryBoundaries):
    """The rows where end flags and trajectory ids of a storage mark different ends.

    Where a storage holds both, the end flags give the same boundaries as the ids
    as long as every row is flagged exactly when the next row of its lane holds
    another id. This index keeps the rows where that fails, written row by written
    row as :class:`TrajectoryBoundaries` keeps ends, so that checking the agreement
    costs O(k) per write of ``k`` rows. Its ``signal(rows)`` returns the pair
    ``(ids, end_flags)`` of ``rows``. Written rows are never dropped for a rebuild
    (``max_pending`` is unbounded): a rebuild would have to read every stored id,
    which is the cost the agreement exists to avoid.

    Examples:
        >>> import torch
        >>> ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
        >>> done = torch.tensor([False, False, True, False, True, False, False, False])
        >>> pair = lambda rows: (ids[rows], done[rows])
        >>> disagreements = EndFlagDisagreements()
        >>> disagreements.refresh(pair, capacity=8, length=8)
        >>> # row 7 is the last valid row of a storage that is not full: it ends a
        >>> # trajectory whatever either signal says
        >>> disagreements.agree(length=8, at_capacity=False, cursor=None)
        True
        >>> # two collectors write rows in turn: the ids change without a flag
        >>> ids[5:] = torch.tensor([3, 2, 3])
        >>> disagreements.mark_written(torch.arange(5, 8))
        >>> disagreements.refresh(pair, capacity=8, length=8)
        >>> disagreements.agree(length=8, at_capacity=False, cursor=None)
        False
    """

    def __init__(self):
        super().__init__("end", max_pending=1 << 62)
        self.kind = "disagreement"
        self._reads_next_row = True

    def agree(self, *, length: int, at_capacity: bool, cursor: int | None) -> bool:
        """Whether the end flags give exactly the boundaries the ids give.

        They may differ only at the rows the storage state ends anyway (the last
        valid row of a storage that is not full, the write cursor of a full one).
        Must follow a :meth:`refresh` that saw every write.
        """
        with self._lock:
            rows = self._ends
            if rows is None:
                raise RuntimeError("the disagreements are not built; call refresh() first.")
            if not rows.numel():
                return True
            forced = length - 1 if not at_capacity else cursor
            if forced is None or rows.numel() > self._lanes:
                return False
            return bool((rows % self._capacity == forced).all())

    def _disagree(self, ids: torch.Tensor, next_ids: torch.Tensor, ends: torch.Tensor):
        return (ids != next_ids) != ends.reshape(ids.shape)

    def _natural_all(self, signal: Signal, length: int) -> torch.Tensor:
        ids, ends = signal(slice(0, length))
        next_ids = torch.cat([ids[1:], ids[:1]])
        return self._disagree(ids, next_ids, ends).reshape(length, -1)

    def _natural_run(self, signal: Signal, first: int, last: int, length: int) -> torch.Tensor:
        count = last - first + 1
        if last + 1 < length:
            ids, ends = signal(slice(first, last + 2))
            ids, next_ids, ends = ids[:-1], ids[1:], ends[:-1]
        else:
            ids, ends = signal(slice(first, last + 1))
            next_ids = torch.cat([ids[1:], signal(slice(0, 1))[0]])
        return self._disagree(ids, next_ids, ends).reshape(count, -1)
