"""The trajectories of a storage that only grows, as a flat table writes append to.

Pure numpy and torch: nothing here imports TorchRL. While a one-lane storage is not
full and every write lands past its valid rows (an online buffer until it fills),
:class:`TrajectoryTable` keeps its trajectories flat, each one's first row and
length: ``k`` written rows are appended in O(k), and a sample reads the
trajectories it draws with two fancy indices. :class:`GrowingStorageTable`
keeps one for an index of end flags, as one of its followers.
"""
from __future__ import annotations

import numpy as np
import torch

from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import (
    Signal,
    TrajectoryBoundaries,
    _read,
)

# The length of the shortest closed trajectory while there is none.
_NO_LENGTH = np.iinfo(np.int64).max
# The lowest row written while none is.
_NO_ROW = np.iinfo(np.int64).max
# Up to this many trajectories closed by one append are added row by row.
_FEW_STOPS = 64


class TrajectoryTable:
    """The trajectories of rows ``0`` to ``length - 1`` of one lane, in order, flat.

    Row 0 starts the first trajectory and every stop is followed by the start of the
    next one: nothing wraps around the storage's end, as nothing does before the
    storage is full. The last valid row is a stop: where its flag does not end a
    trajectory, the trajectory is *open* (it grows with the next write).

    Args:
        stops (np.ndarray): the sorted stops of the rows, the last one
            ``length - 1``.
        length (int): the number of rows the stops cover.
        last_open (bool): whether the last stop is ``length - 1`` only because it
            is the last valid row.

    Examples:
        >>> import numpy as np
        >>> table = TrajectoryTable(np.array([2, 5]), length=6, last_open=True)
        >>> table.count, table.shortest()
        (2, 3)
        >>> # four rows written after them; the third one ends a trajectory
        >>> table.append(np.array([False, False, True, False]))
        >>> table.stops(), table.shortest()
        (array([2, 8, 9]), 1)
        >>> starts, lengths = table.select(np.array([0, 1]))
        >>> starts, lengths
        (array([0, 3]), array([3, 6]))
        >>> # slices of 3 steps: the first two trajectories (the open one is shorter)
        >>> table.drawable(3)
        (2, None)
    """

    def __init__(self, stops: np.ndarray, length: int, last_open: bool):
        count = stops.size
        if not count or stops[-1] != length - 1:
            raise ValueError("the last stop must be the last of the length rows.")
        # bounds[i] is the first row of trajectory i, bounds[count] the row after the
        # last one: trajectory i holds rows bounds[i] to bounds[i + 1] - 1
        room = _room(count + 1)
        self._bounds = np.empty(room, dtype=np.int64)
        self._bounds[0] = 0
        # the length of each trajectory, kept so that a sample reads it at once
        self._lengths = np.empty(room, dtype=np.int64)
        self._close(stops, 0)
        self.count = count
        self.length = length
        self.last_open = last_open
        # min_length -> [ranks of the closed trajectories that long (with room), how many]
        self._long_enough: dict[int, list] = {}
        closed = self._lengths[: count - last_open]
        self._shortest_closed = int(closed.min()) if closed.size else _NO_LENGTH

    def stops(self) -> np.ndarray:
        """The stop (last row) of every trajectory, in order."""
        return self._bounds[1 : self.count + 1] - 1

    def shortest(self) -> int:
        """The length of the shortest trajectory."""
        if not self.last_open:
            return self._shortest_closed
        return min(self._shortest_closed, int(self._lengths[self.count - 1]))

    def drawable(self, min_length: int) -> tuple[int, np.ndarray | None]:
        """``(count, ranks)``: the trajectories at least ``min_length`` rows long.

        The first ``count`` trajectories where ``ranks`` is ``None``, else those of
        ``ranks[:count]``, kept per ``min_length``: a sample never scans the table.
        """
        last_long = not self.last_open or self._lengths[self.count - 1] >= min_length
        if self._shortest_closed >= min_length:
            return self.count - (not last_long), None
        kept = self._long_enough.get(min_length)
        if kept is None:
            if len(self._long_enough) >= 4:
                self._long_enough.pop(next(iter(self._long_enough)))
            closed = self.count - self.last_open
            ranks = (self._lengths[:closed] >= min_length).nonzero()[0]
            kept = [_with_room(ranks, ranks.size + 1), ranks.size]
            self._long_enough[min_length] = kept
        ranks, count = kept
        if not (self.last_open and last_long):
            return count, ranks
        ranks[count] = self.count - 1  # the open one, long enough so far
        return count + 1, ranks

    def append(self, ends: np.ndarray) -> None:
        """Adds the rows after the last one, whose end flags are ``ends`` (booleans).

        The open trajectory, if any, continues into them; O(len(ends)).
        """
        first, flags = self.length, ends.tobytes()
        # the last row was a stop for being last only: it goes
        count, closed = self.count - self.last_open, flags.count(1)
        self.last_open = not flags[-1]
        total = count + closed + self.last_open
        if total + 1 > self._bounds.size:
            self._bounds, self._lengths = (
                _with_room(kept[: count + 1], total + 1)
                for kept in (self._bounds, self._lengths)
            )
        # for Python's scalar reads and writes: a few cost less than one numpy call,
        # whose code is out of the cache between samples
        bounds, lengths = memoryview(self._bounds), memoryview(self._lengths)
        if closed > _FEW_STOPS:
            new_lengths = self._close(ends.nonzero()[0] + first, count)
            self._shortest_closed = min(self._shortest_closed, int(new_lengths.min()))
        else:
            stop = -1
            for rank in range(count, count + closed):
                stop = flags.find(1, stop + 1)
                bounds[rank + 1] = first + stop + 1
                lengths[rank] = bounds[rank + 1] - bounds[rank]
                self._shortest_closed = min(self._shortest_closed, lengths[rank])
        if self.last_open:
            bounds[total] = first + len(flags)
            lengths[total - 1] = bounds[total] - bounds[total - 1]
        if closed and self._long_enough:
            new_lengths = self._lengths[count : count + closed]
            for min_length, kept in self._long_enough.items():
                ranks = (new_lengths >= min_length).nonzero()[0] + count
                if kept[1] + ranks.size + 1 > kept[0].size:
                    kept[0] = _with_room(kept[0][: kept[1]], kept[1] + ranks.size + 1)
                kept[0][kept[1] : kept[1] + ranks.size] = ranks
                kept[1] += ranks.size
        self.count = total
        self.length = first + len(flags)

    def _close(self, stops: np.ndarray, count: int) -> np.ndarray:
        """Ends trajectory ``count`` and those after it at ``stops``: their bounds and lengths."""
        bounds = self._bounds[count : count + stops.size + 1]
        np.add(stops, 1, out=bounds[1:])
        lengths = self._lengths[count : count + stops.size]
        return np.subtract(bounds[1:], bounds[:-1], out=lengths)

    def select(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start, length)`` of the trajectories of ``ranks`` (int64 arrays)."""
        return self._bounds[ranks], self._lengths[ranks]


class GrowingStorageTable:
    """A :class:`TrajectoryTable` of an index's end flags, kept while its storage only grows.

    One of the index's followers: it keeps the lowest row each write touches, and a
    query appends the rows from the table's last one on where no write landed
    before it, or drops the table, made again from the index's order once as many
    rows as it had trajectories have been written.

    Examples:
        >>> import torch
        >>> from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import TrajectoryBoundaries
        >>> done = torch.zeros(20, dtype=torch.bool)
        >>> done[[2, 7]] = True
        >>> index = TrajectoryBoundaries("end")
        >>> geometry = {"capacity": 20, "length": 10, "at_capacity": False, "cursor": None}
        >>> table = GrowingStorageTable.of(index).table(index, done.__getitem__, **geometry)
        >>> table.stops()
        array([2, 7, 9])
        >>> # five rows written past the stored ones: the next query appends them
        >>> done[12] = True
        >>> index.mark_written(torch.arange(10, 15))
        >>> geometry["length"] = 15
        >>> GrowingStorageTable.of(index).table(index, done.__getitem__, **geometry).stops()
        array([ 2,  7, 12, 14])
    """

    def __init__(self):
        self._written_since_drop = 0
        self.reset()

    @classmethod
    def of(cls, index: TrajectoryBoundaries) -> GrowingStorageTable | None:
        """The one that follows ``index``, made on first use (``None`` for trajectory ids: no table serves them)."""
        if index.kind != "end":
            return None
        for follower in index.followers:
            if type(follower) is cls:
                return follower
        follower = cls()
        index.followers.append(follower)
        return follower

    def reset(self) -> None:
        """Forgets the table: the next :meth:`table` makes it from the index's order."""
        self._table: TrajectoryTable | None = None
        self._lowest = _NO_ROW  # the lowest row written since the table's last query
        self._remake_after = 0

    def mark_written(self, rows: torch.Tensor) -> None:
        """Records that ``rows`` were written: the lowest of them, read at once."""
        count = rows.numel()
        self._written_since_drop += count
        if self._table is None or not count:
            return
        lowest = int(rows.min())
        if lowest < self._lowest:
            self._lowest = lowest

    def table(
        self, index: TrajectoryBoundaries, signal: Signal, **geometry
    ) -> TrajectoryTable | None:
        """``index``'s trajectories as a :class:`TrajectoryTable`, or ``None`` (ask the index).

        Takes :meth:`TrajectoryBoundaries.boundaries`' arguments but ``device``. There is
        one while a one-lane storage is not full and every write lands past its rows.
        """
        geometry.setdefault("lanes", 1)
        with index.lock:
            table = self.current(signal, geometry)
            if table is not None:
                return table
            if geometry["at_capacity"] or geometry["lanes"] != 1:
                return None
            if self._written_since_drop < self._remake_after:
                return None
            length = geometry["length"]
            stops = index.trajectories(signal, **geometry).stops().numpy()
            last = _read(signal, slice(length - 1, length))
            self._table = TrajectoryTable(stops, length, not bool(last.reshape(-1)[0]))
            self._lowest = _NO_ROW
            return self._table

    def current(self, signal: Signal, geometry: dict) -> TrajectoryTable | None:
        """The table with the rows written since the last query appended, or ``None``.

        It is dropped where the storage is full or a write landed before its last
        row; the rows from its last one on are read whatever was written there (any
        order, repeats, holes). Callers hold the lock the index's writes take.
        """
        table = self._table
        if table is None:
            return None
        first, length = table.length, geometry["length"]
        lowest, self._lowest = self._lowest, _NO_ROW
        if lowest == _NO_ROW and length == first and not geometry["at_capacity"]:
            return table
        # full, a write before the table's last row, or rows valid that no write recorded
        if geometry["at_capacity"] or length <= first or not first <= lowest < _NO_ROW:
            self._drop()
            return None
        ends = _read(signal, slice(first, length))
        if not isinstance(ends, np.ndarray):
            ends = ends.cpu().numpy()
        table.append(ends.reshape(-1))
        return table

    def _drop(self) -> None:
        self._remake_after = self._table.count
        self._written_since_drop = 0
        self._table, self._lowest = None, _NO_ROW


def _room(size: int) -> int:
    """The room an array that grows to ``size`` gets: half as much again, for the appends to come."""
    return size + size // 2 + 1024


def _with_room(values: np.ndarray, size: int) -> np.ndarray:
    """``values`` at the start of a new int64 array with room for ``size`` (see :func:`_room`)."""
    grown = np.empty(_room(size), dtype=np.int64)
    grown[: values.size] = values
    return grown
