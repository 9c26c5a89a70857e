"""Trajectory boundaries of a ring-buffer storage, kept up to date write by write.

Pure torch: nothing here imports TorchRL. ``storage_boundaries`` wires
:class:`TrajectoryBoundaries` into TorchRL's storages and slice samplers.

A storage holds ``capacity`` rows along its first dimension, of which the first
``length`` are valid; every row has one or more *lanes* (the storage's other batch
dimensions). A boundary signal is read per row: either trajectory ids (a row ends
a trajectory where the next row of the same lane holds another id) or end flags
(a row ends a trajectory where its flag is set). The index keeps the rows where
the signal itself marks an end, as sorted integer keys ``lane * capacity + row``
in a :class:`~.trajectory_order.TrajectoryOrder`, so its size is the number of
trajectories, never the capacity. A write of ``k`` rows is recorded in O(k); the
next query reads the signal of those rows only (plus one neighbour per row for
ids) and rewrites the chunks of the order they fall in. The rows that the storage
state marks as ends (the last valid row of a partially filled storage, the write
cursor of a full one, the last row of a lane with no end) are added at query time.

What a query returns is, value for value, what TorchRL's trajectory-boundary
recovery (``SliceSampler._find_start_stop_traj``) returns from the whole signal.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import TrajectoryOrder

Signal = Callable[[slice], torch.Tensor]

KINDS = ("trajectory", "end")
_NO_KEYS = np.empty(0, dtype=np.int64)


def _host_array(tensor: torch.Tensor) -> np.ndarray | None:
    """``tensor`` as a numpy array sharing its memory, where it is on the CPU in a dtype numpy has (``None`` otherwise)."""
    if tensor.device.type != "cpu":
        return None
    try:
        return tensor.numpy()
    except (
        TypeError,
        RuntimeError,
    ):  # bfloat16 and the like; a tensor that requires grad
        return None


def _read(signal: Signal, rows: slice) -> np.ndarray | torch.Tensor:
    """The signal of ``rows``: a slice of its numpy view (``signal.host``) where it has one, costing a fraction of a tensor read, else ``signal(rows)``."""
    host = getattr(signal, "host", None)
    return signal(rows) if host is None else host[rows]


def _next_differs(values: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Booleans shaped like ``values``.

    Whether each row differs from the next one, the last row from the first (around the
    ring). Compared in place, ``values`` are not copied: in numpy where they are on the
    CPU (several times faster than torch on a whole column, one thread), else on their
    device.
    """
    host = values if isinstance(values, np.ndarray) else _host_array(values)
    if host is not None:
        differs = np.empty(host.shape, dtype=bool)
        np.not_equal(host[:-1], host[1:], out=differs[:-1])
        np.not_equal(host[-1:], host[:1], out=differs[-1:])
        return differs
    differs = torch.empty(values.shape, dtype=torch.bool, device=values.device)
    torch.ne(values[:-1], values[1:], out=differs[:-1])
    torch.ne(values[-1:], values[:1], out=differs[-1:])
    return differs


def _contiguous_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` of each run of consecutive values in sorted unique ``rows``."""
    if not rows.size:
        return []
    breaks = np.flatnonzero(rows[1:] != rows[:-1] + 1)
    firsts = np.concatenate([rows[:1], rows[breaks + 1]]).tolist()
    lasts = np.concatenate([rows[breaks], rows[-1:]]).tolist()
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

    Attributes:
        followers (list): what else keeps a view of the signal, told of every
            write (``mark_written(rows)``) and of every :meth:`reset`.

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
        self.followers: list = []
        self.reset()

    def reset(self) -> None:
        """Forgets everything: the next query rebuilds from the whole signal."""
        with self._lock:
            # the stops: the signal's ends, plus the rows the storage state ends
            self._order: TrajectoryOrder | None = None
            self._forced: tuple[int, ...] = ()  # stops in the order for the state alone
            self._forced_key = None
            self._capacity: int | None = None
            self._lanes: int | None = None
            self._length = 0
            self._pending: list[torch.Tensor] = []
            self._pending_rows = 0
            self._result = None
            self._placed = None
            for follower in self.followers:
                follower.reset()

    @property
    def built(self) -> bool:
        """Whether the index holds boundaries (False until the first query and after a reset)."""
        return self._order is not None

    @property
    def pending_rows(self) -> int:
        """How many written rows wait for the next query (or :meth:`refresh`) to be read."""
        return self._pending_rows

    def num_ends(self) -> int:
        """How many rows the signal marks as ends (the index's size), 0 before it is built."""
        order = self._order
        return 0 if order is None else len(order) - len(self._forced)

    def mark_written(self, rows: torch.Tensor) -> None:
        """Records that ``rows`` (indices along the first dimension) were written.

        Costs O(len(rows)); nothing is read until the next :meth:`boundaries`.
        """
        with self._lock:
            for follower in self.followers:
                follower.mark_written(rows)
            if self._order is None:
                return
            self._pending_rows += rows.numel()
            if self._pending_rows > self.max_pending:
                # Recording more costs as much as the rebuild it would save; the
                # followers keep their own record.
                self._order, self._forced, self._forced_key = None, (), None
                self._pending, self._pending_rows = [], 0
                self._result = self._placed = None
                return
            self._pending.append(rows if rows.ndim == 1 else rows.reshape(-1))

    def boundaries(
        self,
        signal: Signal,
        *,
        capacity: int,
        length: int,
        at_capacity: bool,
        cursor: int | None,
        lanes: int = 1,
        device: torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``(start, stop, lengths)`` of every trajectory in the first ``length`` rows.

        Args:
            signal (callable): ``signal(rows)`` returns the boundary signal of
                ``rows``, a slice along the first dimension,
                shaped ``[len(rows)]`` for a storage with one lane and
                ``[len(rows), lanes]`` otherwise, on any device: only what the
                written rows mark comes to the host. A signal whose ``host``
                attribute is a numpy array (the whole signal, shaped so, sharing
                its memory) is read by slicing that array instead.

        Keyword Args:
            capacity (int): the number of rows the storage can hold.
            length (int): the number of valid rows, at least 2.
            at_capacity (bool): whether the storage is full (circular).
            cursor (int or None): for a full storage, the last written row in
                ``[0, length)``: it ends a trajectory, as what followed it was overwritten.
            lanes (int, optional): the number of lanes per row. Defaults to 1.
            device (torch.device, optional): the device to return the tensors on;
                they are copied there once per change of the boundaries. Defaults
                to the CPU.

        Returns:
            ``start`` and ``stop``, ``[N, 1]`` (one lane) or ``[N, 2]`` (row, lane)
            integer tensors of the first and last (inclusive) row of each
            trajectory, ordered by lane then row, and ``lengths``, ``[N]``.
        """
        with self._lock:
            self.trajectories(
                signal,
                capacity=capacity,
                length=length,
                at_capacity=at_capacity,
                cursor=cursor,
                lanes=lanes,
            )
            if self._result is None:
                self._result, self._placed = self._order.materialize(), None
            device = torch.device("cpu" if device is None else device)
            if device.type == "cpu":
                return self._result
            if self._placed is None or self._placed[0] != device:
                self._placed = (
                    device,
                    tuple(value.to(device) for value in self._result),
                )
            return self._placed[1]

    def trajectories(
        self,
        signal: Signal,
        *,
        capacity: int,
        length: int,
        at_capacity: bool,
        cursor: int | None,
        lanes: int = 1,
    ) -> TrajectoryOrder:
        """The trajectories of :meth:`boundaries`, as a :class:`TrajectoryOrder` to query.

        Takes the arguments of :meth:`boundaries`. Costs what reading the written
        rows costs, nothing per trajectory; the order stays valid until the next
        :meth:`mark_written`, :meth:`reset` or query (callers hold :attr:`lock`).
        """
        with self._lock:
            self._query(
                signal,
                capacity=capacity,
                length=length,
                at_capacity=at_capacity,
                cursor=cursor,
                lanes=lanes,
            )
            return self._order

    @property
    def lock(self) -> threading.RLock:
        """Held while the index changes."""
        return self._lock

    def _query(self, signal, *, capacity, length, at_capacity, cursor, lanes) -> bool:
        """Brings the order up to date for a query; returns whether its trajectories changed."""
        if length < 2:
            raise ValueError(f"length must be at least 2, got {length}.")
        changed = self._update(signal, capacity=capacity, length=length, lanes=lanes)
        key = (length, bool(at_capacity), cursor)
        if changed or self._forced_key != key:
            self._force_stops(length, bool(at_capacity), cursor)
            self._forced_key = key
            self._result = None
            changed = True
        return changed

    def refresh(
        self, signal: Signal, *, capacity: int, length: int, lanes: int = 1
    ) -> None:
        """Brings the index up to date with ``signal`` now, building it if it is not built.

        Takes the arguments of :meth:`boundaries`; what a later query then costs
        is the derivation of the boundaries alone.
        """
        with self._lock:
            self._update(signal, capacity=capacity, length=length, lanes=lanes)

    def _natural_all(self, signal: Signal, length: int) -> np.ndarray | torch.Tensor:
        """``[length, lanes]`` booleans.

        Whether the signal marks each valid row as an end (numpy for a signal on the
        CPU, else a tensor on its device).
        """
        values = _read(signal, slice(0, length))
        if self.kind == "end":
            return values.reshape(length, -1)
        # Each row against the next; the last valid row against the first, which
        # only matters once the storage is full and wraps.
        return _next_differs(values).reshape(length, -1)

    def _keys(self, ends: np.ndarray | torch.Tensor, first: int = 0) -> np.ndarray:
        """Sorted keys ``lane * capacity + row`` of the true entries of ``[k, lanes]`` ``ends``, the booleans of rows ``first`` to ``first + k - 1``.

        Ends on an accelerator are found there: only their positions come to the host.
        """
        host = ends if isinstance(ends, np.ndarray) else _host_array(ends)
        if self._lanes == 1:
            if host is not None:
                # numpy finds them several times faster than torch on a whole column
                at = np.flatnonzero(host)
            else:
                at = ends.reshape(-1).nonzero().squeeze(-1).cpu().numpy()
            return at + first if first else at
        if host is not None:
            lane, at = np.nonzero(host.T)
        else:
            lane, at = ends.t().nonzero().cpu().numpy().T
        return lane * self._capacity + (at + first)

    def _rebuild(self, signal: Signal, capacity: int, length: int, lanes: int) -> None:
        self._capacity, self._lanes, self._length = capacity, lanes, length
        ends = self._natural_all(signal, length)
        self._order = TrajectoryOrder(capacity, lanes)
        self._order.assign(self._keys(ends))
        self._forced, self._forced_key = (), None
        self._pending, self._pending_rows = [], 0

    def _update(
        self, signal: Signal, *, capacity: int, length: int, lanes: int
    ) -> bool:
        """Brings the stored ends up to date with the signal; returns whether they changed."""
        if (
            self._order is None
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
        self._unforce_stops()
        order = self._order
        for first, last in runs:
            keys = self._keys(self._natural_run(signal, first, last, length), first)
            if lanes == 1:
                order.replace(first, last, keys)
                continue
            lane_at = np.searchsorted(keys, np.arange(lanes + 1) * capacity)
            for lane in range(lanes):
                offset = lane * capacity
                order.replace(
                    offset + first,
                    offset + last,
                    keys[lane_at[lane] : lane_at[lane + 1]],
                )
        return True

    def _unforce_stops(self) -> None:
        """Takes the stops the storage state alone made out of the order."""
        for key in self._forced:
            self._order.replace(key, key, _NO_KEYS)
        self._forced, self._forced_key = (), None

    def _force_stops(self, length: int, at_capacity: bool, cursor: int | None) -> None:
        """Adds the stops the storage state makes.

        The last valid row of a storage that is not full, the write cursor of a full
        one, the last row of a lane with no end.
        """
        self._unforce_stops()
        order = self._order
        order.length = length
        lane_keys = [lane * self._capacity for lane in range(self._lanes)]
        if not at_capacity:
            wanted = [key + length - 1 for key in lane_keys]
        elif cursor is not None:
            wanted = [key + cursor for key in lane_keys]
        else:
            wanted = [
                key + length - 1
                for key in lane_keys
                if order._rank_of(key) == order._rank_of(key + self._capacity)
            ]
        forced = []
        for key in wanted:
            if key not in order:
                order.replace(key, key, np.array([key], dtype=np.int64))
                forced.append(key)
        self._forced = tuple(forced)

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
                lo, hi = (int(bound) for bound in torch.aminmax(rows))
                if 0 <= lo and hi < length and hi - lo < 2 * rows.numel():
                    # Rows within a range at most twice their number, as one extend
                    # writes: the range is read again, with no sort.
                    runs.append((lo, hi))
                else:
                    rows = rows.numpy()
                    rows = np.unique(rows[(rows >= 0) & (rows < length)])
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

    def _natural_run(
        self, signal: Signal, first: int, last: int, length: int
    ) -> np.ndarray | torch.Tensor:
        """``[count, lanes]`` booleans: whether the signal marks rows ``first..last`` as ends."""
        count = last - first + 1
        if self.kind == "end":
            return _read(signal, slice(first, last + 1)).reshape(count, -1)
        if last + 1 < length:
            values = _read(signal, slice(first, last + 2))
            return (values[:-1] != values[1:]).reshape(count, -1)
        # The last valid row is compared with row 0, which only matters once the
        # storage is full and wraps.
        values = _read(signal, slice(first, last + 1))
        pieces = [values[1:], _read(signal, slice(0, 1))]
        after = (
            np.concatenate(pieces)
            if isinstance(values, np.ndarray)
            else torch.cat(pieces)
        )
        return (values != after).reshape(count, -1)


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
            order = self._order
            if order is None:
                raise RuntimeError(
                    "the disagreements are not built; call refresh() first."
                )
            count = len(order)
            if not count:
                return True
            forced = length - 1 if not at_capacity else cursor
            if forced is None or count > self._lanes:
                return False
            return bool((order.stops() % self._capacity == forced).all())

    def _disagree(self, ids: torch.Tensor, next_ids: torch.Tensor, ends: torch.Tensor):
        return (ids != next_ids) != ends.reshape(ids.shape)

    def _natural_all(self, signal: Signal, length: int) -> np.ndarray | torch.Tensor:
        ids, ends = signal(slice(0, length))
        differs = _next_differs(ids)
        if isinstance(differs, np.ndarray):  # ids on the CPU, and the flags beside them
            np.not_equal(differs, ends.numpy().reshape(differs.shape), out=differs)
            return differs.reshape(length, -1)
        return (differs != ends.reshape(differs.shape)).reshape(length, -1)

    def _natural_run(
        self, signal: Signal, first: int, last: int, length: int
    ) -> torch.Tensor:
        count = last - first + 1
        if last + 1 < length:
            ids, ends = signal(slice(first, last + 2))
            ids, next_ids, ends = ids[:-1], ids[1:], ends[:-1]
        else:
            ids, ends = signal(slice(first, last + 1))
            next_ids = torch.cat([ids[1:], signal(slice(0, 1))[0]])
        return self._disagree(ids, next_ids, ends).reshape(count, -1)
