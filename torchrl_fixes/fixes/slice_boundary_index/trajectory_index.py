"""The trajectories of a storage, kept from the rows that end them.

:class:`TrajectoryIndex` holds where a storage's trajectories stop, exactly as
:func:`~torchrl.data.replay_buffers.utils.find_start_stop_traj` finds them, and is
told which rows changed: a write of ``k`` rows costs ``O(k)``, and the ``i``-th
trajectory of a minimum length is found without listing them all.
"""
from __future__ import annotations

from collections import deque

import numpy as np

_NO_KEYS = np.empty(0, dtype=np.int64)
# The value a lane's first stop gets while written: it follows no stop of its lane.
_LANE_FIRST = np.iinfo(np.int64).max
# The changes :meth:`TrajectoryIndex.changes_since` can list; a reader further behind rebuilds.
_KEPT_CHANGES = 256


class SortedKeys:
    """Sorted unique int64 keys with an int64 value each, in arrays kept flat.

    The free room of the arrays (their gap) stays where the last change was, so that
    changes made along the keys, as a replay buffer writes, move only what they
    pass: a buffer that grows appends, one that wraps rewrites at its cursor.

    Args:
        keys (np.ndarray, optional): sorted unique keys. Defaults to none.
        values (np.ndarray, optional): their values. Defaults to zeros.

    Examples:
        >>> keys = SortedKeys(np.array([2, 5, 9]))
        >>> keys.replace(4, 6, np.array([4, 6]))  # the rank of the first new key
        1
        >>> keys.set_values(1, np.array([2, 2]))
        >>> keys.take(np.arange(4)), keys.values(np.array([1])), keys.rank(np.array([6]))
        (array([2, 4, 6, 9]), array([2]), array([2]))
    """

    def __init__(self, keys: np.ndarray = _NO_KEYS, values: np.ndarray | None = None):
        count = keys.size
        self._keys = np.empty(max(2 * count, 16), dtype=np.int64)
        self._values = np.zeros_like(self._keys)
        self._keys[:count] = keys
        if values is not None:
            self._values[:count] = values
        self._lo, self._hi = count, self._keys.size  # the gap

    def __len__(self) -> int:
        return self._keys.size - (self._hi - self._lo)

    def array(self, values: bool = False) -> np.ndarray:
        """Every key (or value), in order."""
        array = self._values if values else self._keys
        return np.concatenate([array[: self._lo], array[self._hi :]])

    def _at(self, ranks):
        if self._hi == self._keys.size:
            return ranks
        return ranks + (ranks >= self._lo) * (self._hi - self._lo)

    def take(self, ranks):
        """The keys of ``ranks``."""
        return self._keys[self._at(ranks)]

    def values(self, ranks):
        """The values of ``ranks``."""
        return self._values[self._at(ranks)]

    def set_values(self, ranks, values: np.ndarray) -> None:
        """Sets the values of ``ranks``, or of the ranks from ``ranks`` on if it is an int."""
        if isinstance(ranks, int):
            at = self._at(ranks)
            self._values[at : at + values.size] = values
        else:
            self._values[self._at(ranks)] = values

    def rank(self, keys, side: str = "left"):
        """How many keys are lower than each of ``keys`` (not higher, if ``side="right"``)."""
        rank = self._keys[: self._lo].searchsorted(keys, side)
        if self._hi < self._keys.size:
            rank = rank + self._keys[self._hi :].searchsorted(keys, side)
        return rank

    def contains(self, key: int) -> bool:
        """Whether ``key`` is one of the keys."""
        rank = self.rank(key)
        return rank < len(self) and self.take(rank) == key

    def replace(self, lo: int, hi: int, keys: np.ndarray) -> int:
        """Puts ``keys`` (sorted, in ``[lo, hi]``) in place of the keys in ``[lo, hi]``.

        Returns the rank of the first; their values are set by :meth:`set_values`.
        """
        first, last = self.rank(np.array([lo, hi + 1]))
        gap = self._hi - self._lo
        for array in (self._keys, self._values):  # the gap moves to ``first``
            if first < self._lo:
                array[first + gap : self._hi] = array[first : self._lo]
            elif first > self._lo:
                array[self._lo : first] = array[self._hi : first + gap]
        self._lo, self._hi = first, first + gap + last - first
        if keys.size > self._hi - self._lo:
            size, tail = self._keys.size, self._keys.size - self._hi
            grown = max(2 * size, size + keys.size)
            for name in ("_keys", "_values"):
                array = np.empty(grown, dtype=np.int64)
                array[: self._lo] = getattr(self, name)[: self._lo]
                array[grown - tail :] = getattr(self, name)[self._hi :]
                setattr(self, name, array)
            self._hi = grown - tail
        self._keys[self._lo : self._lo + keys.size] = keys
        self._lo += keys.size
        return int(first)


class TrajectoryIndex:
    """Where the trajectories of a storage stop, in TorchRL's order.

    A trajectory is known by its stop, the key ``lane * capacity + row`` of its last
    row, and with its length; stops are sorted by lane, then row, as
    :func:`~torchrl.data.replay_buffers.utils.find_start_stop_traj` lists them. The
    index is told the rows each lane's signal ends (:meth:`assign`, then
    :meth:`update` with the rows written) and the storage's state, and adds the stops
    that state makes: the last valid row of a storage that is not full, the write
    cursor of a full one, the last row of a full lane that nothing ends. A lane's
    first trajectory starts after the lane's last stop, around the valid rows.
    For each minimum length asked for, the stops of shorter trajectories are kept
    too, so that drawing among those long enough costs ``O(log T)`` where few are
    shorter.

    Args:
        capacity (int): the rows of a lane.
        lanes (int, optional): the storage's second batch dimension, 1 for a storage
            with one. Defaults to 1.

    Examples:
        >>> index = TrajectoryIndex(capacity=10)
        >>> # a full storage whose rows 2 and 7 end a trajectory, written last at row 4
        >>> index.assign(np.array([2, 7]), length=10, at_capacity=True, cursor=4)
        >>> index.boundaries()  # start, stop, lane, length
        (array([8, 3, 5]), array([2, 4, 7]), None, array([5, 2, 3]))
        >>> # the trajectories at least 3 rows long: two, the second of which is
        >>> index.count(3), index.select(np.array([1]), 3)
        (2, (array([5]), array([7]), None, array([3])))
        >>> # rows 5 and 6 written again, ending one at row 5; the cursor is at 6 now
        >>> index.update(10, True, 6, [(5, 6, np.array([5]))])
        >>> index.boundaries()[1]
        array([2, 5, 6, 7])
    """

    def __init__(self, capacity: int, lanes: int = 1):
        if capacity < 1 or lanes < 1:
            raise ValueError(
                f"capacity and lanes must be positive, got {capacity}, {lanes}."
            )
        self.capacity = capacity
        self.lanes = lanes
        self.state = None  # (length, at_capacity, cursor) as last told
        self._stops = SortedKeys()  # the values: their trajectories' lengths
        self._forced: list[int] = []  # the stops the state adds
        self._short: dict[int, SortedKeys] = {}  # minimum length -> shorter stops
        self._excluded: dict[int, np.ndarray] = {}  # and their ranks, until a change
        self._lane_ranks = self._lane_lengths = None
        self._boundaries = None
        self.revision = self._assigned = 0  # the changes made to the stops
        self._changes = deque(maxlen=_KEPT_CHANGES)  # their key ranges

    def __len__(self) -> int:
        return len(self._stops)

    def assign(self, stops: np.ndarray, length: int, at_capacity: bool, cursor) -> None:
        """Replaces everything by the ``stops`` (sorted keys) the signal makes.

        Args:
            stops (np.ndarray): the keys of the rows the signal ends.
            length (int): the number of valid rows of each lane.
            at_capacity (bool): whether the storage is full.
            cursor (int or None): the last row written, where the storage is full.
        """
        gaps = np.diff(stops, prepend=0)
        gaps[np.flatnonzero(np.diff(stops // self.capacity, prepend=-1))] = _LANE_FIRST
        self._stops = SortedKeys(stops, gaps)
        self.revision += 1
        self._assigned = self.revision  # changes_since knows no change before
        self._forced, self.state = [], None
        self._short.clear()
        self.update(length, at_capacity, cursor)

    def update(self, length: int, at_capacity: bool, cursor, runs=()) -> None:
        """Brings the index to the storage's state, with the rows of ``runs`` read again.

        Args:
            length (int): the number of valid rows of each lane.
            at_capacity (bool): whether the storage is full.
            cursor (int or None): the last row written, where the storage is full.
            runs (list, optional): ``(first, last, stops)`` for each run of rows
                whose signal may have changed: the keys, in every lane, of the rows
                ``first`` to ``last`` that the signal ends.
        """
        state = (length, bool(at_capacity), cursor)
        if not runs and state == self.state:
            return
        self.state = state
        row = cursor if at_capacity else length - 1  # the row the state ends
        bases = range(0, self.lanes * self.capacity, self.capacity)
        covered = [(base + a, base + b) for base in bases for a, b, _ in runs]
        forced, old = [], self._forced
        for key in old:
            if key % self.capacity != row and not _within(key, covered):
                self._rewrite(key, key, _NO_KEYS)
        for first, last, stops in runs:
            if self.lanes > 1:
                cuts = stops.searchsorted(np.arange(self.lanes + 1) * self.capacity)
            for lane, base in enumerate(bases):
                keys = stops[cuts[lane] : cuts[lane + 1]] if self.lanes > 1 else stops
                if row is not None and first <= row <= last:
                    at = int(keys.searchsorted(base + row))
                    if at == keys.size or keys[at] != base + row:
                        keys = np.concatenate((keys[:at], [base + row], keys[at:]))
                        forced.append(base + row)
                self._rewrite(base + first, base + last, keys)
        for base in bases:
            if row is None:  # a full lane that nothing ends stops at its last row
                if self._stops.rank(base) < self._stops.rank(base + length):
                    continue
                key = base + length - 1
            elif _within(base + row, covered):
                continue
            else:
                key = base + row
            if row is not None and key in old:
                forced.append(key)  # kept above
            elif not self._stops.contains(key):
                self._rewrite(key, key, np.array([key]))
                forced.append(key)
        self._forced = forced
        self._refresh()

    def _rewrite(self, lo: int, hi: int, keys: np.ndarray) -> None:
        """Puts ``keys`` in place of the stops in ``[lo, hi]``, of one lane, with their lengths."""
        stops, base = self._stops, lo - lo % self.capacity
        self.revision += 1
        self._changes.append((lo, hi))
        first = stops.replace(lo, hi, keys)
        previous = int(stops.take(first - 1)) if first else -1
        if previous < base:
            previous = None  # the lane's first stop follows none
        gaps = keys - np.concatenate(([previous or 0], keys[:-1]))
        if previous is None and keys.size:
            gaps[0] = _LANE_FIRST
        stops.set_values(first, gaps)
        self._mark(lo, hi, keys, gaps)
        after = first + keys.size  # the next stop of the lane follows another now
        if after < len(stops) and stops.take(after) < base + self.capacity:
            key = int(stops.take(after))
            last = int(keys[-1]) if keys.size else previous
            gap = np.array([_LANE_FIRST if last is None else key - last])
            stops.set_values(after, gap)
            self._mark(key, key, np.array([key]), gap)

    def _mark(self, lo: int, hi: int, keys: np.ndarray, gaps: np.ndarray) -> None:
        """Records which of ``keys``, now the stops in ``[lo, hi]``, are too short."""
        shortest = gaps.min() if gaps.size else _LANE_FIRST
        for min_length, short in self._short.items():
            found = keys[gaps < min_length] if shortest < min_length else _NO_KEYS
            if found.size or (len(short) and short.rank(lo) < short.rank(hi, "right")):
                short.replace(lo, hi, found)

    def _refresh(self) -> None:
        """Gives each lane's first stop its length, around the ring."""
        self._boundaries = None
        self._excluded.clear()
        if self.lanes == 1:
            count = len(self._stops)
            first, last = int(self._stops.take(0)), int(self._stops.take(count - 1))
            lengths = np.array([(first - last - 1) % self.state[0] + 1])
            self._stops.set_values(0, lengths)
            self._lane_ranks, self._lane_lengths = (0, count), lengths
            return
        ranks = self._stops.rank(np.arange(self.lanes + 1) * self.capacity)
        first, last = self._stops.take(ranks[:-1]), self._stops.take(ranks[1:] - 1)
        lengths = (first - last - 1) % self.state[0] + 1
        lengths[ranks[:-1] == ranks[1:]] = 0  # an empty lane
        self._stops.set_values(ranks[:-1][lengths > 0], lengths[lengths > 0])
        self._lane_ranks, self._lane_lengths = ranks, lengths

    def _shorter(self, min_length: int) -> np.ndarray:
        """The sorted ranks of the trajectories shorter than ``min_length``."""
        ranks = self._excluded.get(min_length)
        if ranks is not None:
            return ranks
        firsts = np.asarray(self._lane_ranks[:-1])[self._lane_lengths > 0]
        short = self._short.get(min_length)
        if short is None:
            if len(self._short) >= 4:
                self._short.pop(next(iter(self._short)))
            lengths = self._stops.array(values=True)
            lengths[firsts] = _LANE_FIRST  # counted below, with their lengths
            keys = self._stops.array()[lengths < min_length]
            short = self._short[min_length] = SortedKeys(keys)
        firsts = firsts[self._lane_lengths[self._lane_lengths > 0] < min_length]
        ranks = np.sort(np.concatenate([self._stops.rank(short.array()), firsts]))
        self._excluded[min_length] = ranks
        return ranks

    def count(self, min_length: int = 1) -> int:
        """How many trajectories are at least ``min_length`` rows long."""
        if min_length <= 1:
            return len(self._stops)
        short = self._short.get(min_length)
        if short is None or min_length in self._excluded:
            return len(self._stops) - self._shorter(min_length).size
        # the shorter ones without their ranks: those kept, and each lane's first
        lengths = self._lane_lengths
        first_short = np.count_nonzero((lengths > 0) & (lengths < min_length))
        return len(self._stops) - len(short) - first_short

    def select(self, ranks: np.ndarray, min_length: int = 1) -> tuple:
        """The ``ranks``-th trajectories among those at least ``min_length`` rows long.

        Args:
            ranks (np.ndarray): ranks in ``[0, count(min_length))``.
            min_length (int, optional): the minimum length. Defaults to 1.

        Returns:
            ``(start, stop, lane, length)`` int64 arrays: the first and last row of
            each, its lane (``None`` for a storage with one) and its length.
        """
        if min_length > 1:
            shorter = self._shorter(min_length)
            if shorter.size:  # each rank among all, past the shorter ones before it
                skipped = shorter - np.arange(shorter.size)
                ranks = ranks + skipped.searchsorted(ranks, "right")
        return self._rows(ranks)

    def changes_since(self, revision: int) -> list | None:
        """The ``(lo, hi)`` key ranges whose stops changed since :attr:`revision` was ``revision``.

        ``None`` where more changed than the index keeps a record of.
        """
        missed = self.revision - revision
        if missed > len(self._changes) or revision < self._assigned:
            return None
        return list(self._changes)[len(self._changes) - missed :]

    def stops_around(self, rows: np.ndarray) -> tuple:
        """The last stop before each of ``rows`` and the first at or after it.

        For the valid rows of a storage with one lane, around the ring: a stop
        past the last is the first plus the number of valid rows, one before the
        first is the last less that number.

        Examples:
            >>> index = TrajectoryIndex(capacity=10)
            >>> index.assign(np.array([2, 7]), length=10, at_capacity=True, cursor=4)
            >>> index.stops_around(np.array([0, 3, 9]))
            (array([-3,  2,  7]), array([ 2,  4, 12]))
        """
        count, length = len(self._stops), self.state[0]
        ranks = self._stops.rank(rows)
        after = self._stops.take(ranks % count) + (ranks == count) * length
        before = self._stops.take((ranks - 1) % count) - (ranks == 0) * length
        return before, after

    def boundaries(self) -> tuple:
        """:meth:`select` of every trajectory, kept until the next change."""
        if self._boundaries is None:
            self._boundaries = self._rows(np.arange(len(self._stops)))
        return self._boundaries

    def _rows(self, ranks: np.ndarray) -> tuple:
        stops, lengths = self._stops.take(ranks), self._stops.values(ranks)
        lanes = stops // self.capacity if self.lanes > 1 else None
        if lanes is not None:
            stops = stops - lanes * self.capacity
        start = stops - lengths + 1
        if self.state[1]:  # a lane's first trajectory may run around the ring
            start %= self.state[0]
        return start, stops, lanes, lengths


def _within(key: int, ranges: list) -> bool:
    return any(lo <= key <= hi for lo, hi in ranges)
