"""A storage's trajectory index: advanced by its writes, rebuilt after any other change.

A :class:`~torchrl.data.replay_buffers.TensorStorage` that a slice sampler read
keeps a :class:`StorageTrajectoryIndex` as ``storage._trajectory_index``: one
:class:`~.trajectory_index.TrajectoryIndex` per boundary signal, the storage's
mutation revision it reflects, and the identity, memory and version counter of each
column read. ``TensorStorage.set`` records the rows of each write in the storage's
:class:`~.write_journal.WriteJournal`, in whatever process it runs; the next query
reads the rows written since its revision alone, or rebuilds where the journal cannot
tell, where a column changed otherwise (an in-place write through a view), or where
those rows are more than a quarter of the stored ones. Writes torch does not count
(through ``.data`` or numpy, or by a process that does not go through TorchRL) are
not seen unless ``storage.mark_update(index)`` tells. The index is the process's own:
never pickled or copied with its storage.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_fixes.fixes.slice_boundary_index.trajectory_index import TrajectoryIndex

logger = logging.getLogger("torchrl_fixes")

# The done flags that may stand for the ids of a sampler that names no key.
END_KEY = ("next", "done")
# Past these between two queries (runs of rows, rows where the ids and the done
# flags end differently), rebuilding costs less or following them stops.
_MAX_RUNS, _MAX_DISAGREEMENTS = 64, 64


class Unsupported(Exception):
    """A storage or a column the index does not read: the stock recovery runs instead."""


@dataclass(frozen=True)
class BoundarySignal:
    """What trajectory boundaries are read from.

    Args:
        kind (str): ``"trajectory"`` (a row ends one where the next row's id
            differs) or ``"end"`` (where one of the flags is set).
        keys (tuple of NestedKey): the id key, or the end keys OR-ed.
    """

    kind: str
    keys: tuple

    def columns(self, data: TensorDictBase, ndim: int) -> list[torch.Tensor]:
        """The columns read, checked as the stock recovery uses them."""
        columns = [data.get(key, None) for key in self.keys]
        if not columns or not all(isinstance(c, torch.Tensor) for c in columns):
            raise Unsupported(f"{self.keys} not all in the storage")
        for column in columns:
            if self.kind == "trajectory":
                if column.ndim != ndim or column.is_complex():
                    raise Unsupported("trajectory ids shaped unlike the storage")
            elif column.dtype != torch.bool:
                raise Unsupported("end flags that are not booleans")
            elif any(s == 1 for s in column.shape[1:ndim]) or any(
                s != 1 for s in column.shape[ndim:]
            ):
                raise Unsupported("end flags that squeezing would reshape")
        if any(column.device != columns[0].device for column in columns):
            raise Unsupported("boundary columns on different devices")
        if any(data.get(key) is not column for key, column in zip(self.keys, columns)):
            raise Unsupported("boundary columns made anew at each read (a lazy stack)")
        return columns

    def stops(self, columns, first: int, last: int, length: int) -> np.ndarray:
        """The keys of the rows ``first`` to ``last`` that the signal ends."""
        if self.kind == "end":
            return _end_stops(columns, first, last)
        return _id_stops(columns[0], first, last, length)


def _reader(column: torch.Tensor):
    """What ``column``'s rows are read from, ``[rows, lanes]``: a numpy view on the CPU."""
    if column.device.type == "cpu" and column.is_contiguous():
        try:
            return column.numpy().reshape(column.shape[0], -1)
        except (TypeError, RuntimeError):  # bfloat16 and the like
            pass
    return column


def _rows(column, start: int, stop: int):
    if isinstance(column, np.ndarray):
        return column[start:stop]
    rows = column[start:stop].reshape(stop - start, -1)
    return rows.numpy() if rows.device.type == "cpu" else rows


def _end_stops(columns, first: int, last: int) -> np.ndarray:
    ends = _rows(columns[0], first, last + 1)
    for column in columns[1:]:
        ends = ends | _rows(column, first, last + 1)
    return _keys(ends, first, columns[0].shape[0])


def _id_stops(column, first: int, last: int, length: int) -> np.ndarray:
    values = _rows(column, first, min(last + 2, length))
    ends = values[1:] != values[:-1]
    if last + 1 == length:  # the last valid row against row 0, around the ring
        tail = values[-1:] != _rows(column, 0, 1)
        cat = np.concatenate if isinstance(ends, np.ndarray) else torch.cat
        ends = cat([ends, tail])
    return _keys(ends, first, column.shape[0])


def _keys(ends, first: int, capacity: int) -> np.ndarray:
    """The sorted keys ``lane * capacity + row`` of the true entries of ``ends``."""
    if not isinstance(ends, np.ndarray):  # on an accelerator: only positions come
        lane, row = ends.t().nonzero().cpu().numpy().T
    elif ends.shape[1] == 1:
        return ends[:, 0].nonzero()[0] + first
    else:
        lane, row = np.nonzero(ends.T)
    return lane * capacity + (row + first)


def _merged(runs: list) -> list:
    merged = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def storage_state(storage) -> tuple:
    """``(capacity, lanes, length, at_capacity, cursor)`` as the stock recovery reads them."""
    data = getattr(storage, "_storage", None)
    if not isinstance(data, TensorDictBase) or not 1 <= storage.ndim <= 2:
        raise Unsupported("storage other than a TensorDict of one or two batch dims")
    length = storage._len_along_dim0
    if length is None or length < 2:
        raise Unsupported("fewer than two stored rows")
    at_capacity = bool(storage._is_full)
    cursor = storage._last_cursor_index if at_capacity else None
    if cursor is not None:
        if not isinstance(cursor, int) or not -length <= cursor < length:
            raise Unsupported("write cursor the index does not read")
        cursor %= length
    lanes = data.batch_size[1] if storage.ndim == 2 else 1
    return data.batch_size[0], lanes, length, at_capacity, cursor


def _version(column: torch.Tensor) -> int:
    try:
        return column._version
    except RuntimeError:  # made under torch.inference_mode
        raise Unsupported("a column with no version counter (made in inference mode)")


class StorageTrajectoryIndex:
    """The trajectory indexes of a storage, and what tells whether they still hold.

    Args:
        storage (TensorStorage): the storage; it keeps this, not the reverse.

    Attributes:
        last_signal (BoundarySignal): what the last query read.
        untold_rebuilds (int): the rebuilds after the storage changed by writes its
            journal does not hold: a process writing it without the fix, another
            mutation path, or over 1,024 writes between two queries.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(10)
        >>> done = torch.tensor([0, 0, 1, 0, 0, 0, 1, 0], dtype=torch.bool)
        >>> storage.set(torch.arange(8), TensorDict({("next", "done"): done}, [8]))
        >>> signal = BoundarySignal("end", (("next", "done"),))
        >>> index, _ = StorageTrajectoryIndex.of(storage).index(storage, signal)
        >>> index.boundaries()[1]  # stops: the last valid row ends the last trajectory
        array([2, 6, 7])
        >>> storage[:]["next", "done"][4] = True  # in place, through a view
        >>> index, _ = StorageTrajectoryIndex.of(storage).index(storage, signal)
        >>> index.boundaries()[1]
        array([2, 4, 6, 7])
    """

    def __init__(self, storage):
        self._lock = threading.RLock()  # draws hold it too (_reads_index)
        # a fork child inherits the lock as a thread of its parent may hold it
        self._pid = os.getpid()
        self._logged = False  # that the ids and the done flags disagree, once
        self.untold_rebuilds = 0
        self._reset(storage)

    @classmethod
    def of(cls, storage) -> StorageTrajectoryIndex:
        """``storage``'s index in this process, made on first use."""
        entry = existing_index(storage)
        if entry is None:
            storage.__dict__.pop("_trajectory_index", None)  # a fork parent's, if any
            # one entry, and lock, where two threads make one
            entry = storage.__dict__.setdefault("_trajectory_index", cls(storage))
        return entry

    def _reset(self, storage) -> None:
        self._revision = storage._mutation_revision
        self._state = None  # storage_state() at the last query
        # key -> (weak reference, version, memory) of each column read
        self._columns = {}
        self._readers = {}  # key -> what its rows are read from (_reader)
        self._stale = False
        # writes under way in this process, in any thread; one that raised before
        # wrote() is counted until this rebuild (it may have moved the cursor)
        self._writing = 0
        self._indexes = {}  # BoundarySignal -> (TrajectoryIndex, the columns' device)
        # id key -> keys of the rows where the ids and the done flags end differently
        self._disagreements = {}
        self.last_signal = None

    def begin_write(self) -> tuple:
        """The version of each column read, before a write :meth:`wrote` ends."""
        with self._lock:
            self._writing += 1
            return tuple(
                ref()._version if ref() is not None else -1
                for ref, _, _ in self._columns.values()
            )

    def wrote(self, versions: tuple) -> None:
        """Takes the columns' versions as a write in this process left them.

        ``versions`` are what :meth:`begin_write` read before it; where they differ
        from the ones last seen, something else wrote in place first: rebuild.
        """
        with self._lock:
            self._writing = max(self._writing - 1, 0)  # a rebuild in between zeroed it
            if versions != tuple(v for _, v, _ in self._columns.values()):
                self._stale = True
                return
            self._columns = {
                key: (ref, ref()._version if ref() is not None else -1, memory)
                for key, (ref, _, memory) in self._columns.items()
            }

    def index(self, storage, signal: BoundarySignal, may_read_end_flags=False):
        """The index of ``signal``, brought to the storage, and its columns' device.

        Args:
            storage (TensorStorage): the storage this indexes.
            signal (BoundarySignal): what the boundaries are read from.
            may_read_end_flags (bool, optional): ``signal`` is a sampler's default
                ids, and the done flags may be read instead while they end the
                same trajectories. Defaults to ``False``.

        Raises:
            Unsupported: the storage or its columns are not what the index reads.
        """
        with self._lock:
            return self._index(storage, signal, may_read_end_flags)

    def _index(self, storage, signal: BoundarySignal, may_read_end_flags: bool):
        state = self._catch_up(storage)
        if may_read_end_flags and self._end_flags_agree(storage, signal.keys[0], state):
            signal = BoundarySignal("end", (END_KEY,))
        found = self._indexes.get(signal)
        if found is None:
            capacity, lanes, length, at_capacity, cursor = state
            columns = self._watch(storage, signal)
            index = TrajectoryIndex(capacity, lanes)
            stops = signal.stops(columns, 0, length - 1, length)
            index.assign(stops, length, at_capacity, cursor)
            device = storage._storage.get(signal.keys[0]).device
            found = self._indexes[signal] = (index, device)
        else:
            found[0].update(*state[2:])
        self.last_signal = signal
        return found

    def _end_flags_agree(self, storage, id_key, state) -> bool:
        """Whether the done flags end the same trajectories as the ids of ``id_key``.

        They may differ only at the row the storage's state ends anyway (its last
        valid row or its cursor). Where more rows differ than a few, the ids are
        read until a rebuild.
        """
        if id_key not in self._disagreements:
            try:
                columns = self._watch(storage, BoundarySignal("trajectory", (id_key,)))
                columns += self._watch(storage, BoundarySignal("end", (END_KEY,)))
            except Unsupported:
                self._disagreements[id_key] = None
            else:
                rows = [(0, state[2] - 1)]
                self._disagreements[id_key] = _disagreeing(columns, rows, state, set())
        disagreements = self._disagreements[id_key]
        capacity, _, length, at_capacity, cursor = state
        row = cursor if at_capacity else length - 1
        if disagreements is not None and all(
            k % capacity == row for k in disagreements
        ):
            return True
        if not self._logged:
            self._logged = True
            logger.info(
                "SliceSampler: %r and %r mark different trajectory ends "
                "(interleaved writers?); the trajectory ids are used",
                id_key,
                END_KEY,
            )
        return False

    def _watch(self, storage, signal: BoundarySignal) -> list:
        """What the columns of ``signal`` are read from; their changes are followed."""
        columns = signal.columns(storage._storage, storage.ndim)
        for key, column in zip(signal.keys, columns):
            if key not in self._columns:
                memory = column.data_ptr()
                self._columns[key] = (weakref.ref(column), _version(column), memory)
                self._readers[key] = _reader(column)
        return [self._readers[key] for key in signal.keys]

    def _catch_up(self, storage) -> tuple:
        """Reads the rows written since the last query, or rebuilds; the storage's state."""
        runs = None
        if self._columns_unchanged(storage):
            if storage._mutation_revision == self._revision:
                return self._state  # nothing moved the revision: nor the state
            journal = storage.__dict__.get("_write_journal")
            with _held(journal) as held:  # the revision, the state and the runs as one
                revision = storage._mutation_revision
                state = storage_state(storage)
                if held:
                    runs = journal.runs_since(self._revision, revision)
            self.untold_rebuilds += runs is None
            runs = self._written_runs(state, runs)
        if runs is None:
            self._rebuild(storage)
            return self._state
        self._revision = revision
        state, length = self._state, self._state[2]
        for signal, (index, _) in self._indexes.items():
            columns = [self._readers[key] for key in signal.keys]
            rows = [(a, b, signal.stops(columns, a, b, length)) for a, b in runs]
            index.update(*state[2:], rows)
        for id_key, disagreements in self._disagreements.items():
            if disagreements is not None:
                columns = [self._readers[id_key], self._readers[END_KEY]]
                found = _disagreeing(columns, runs, state, disagreements)
                self._disagreements[id_key] = found
        return state

    def _rebuild(self, storage) -> None:
        with _held(storage.__dict__.get("_write_journal")):
            self._reset(storage)
            self._state = storage_state(storage)

    def _columns_unchanged(self, storage) -> bool:
        """Whether the columns read are the same tensors, changed by recorded writes alone."""
        if self._stale or self._writing or self._state is None:
            return False
        data = storage._storage
        for key, (ref, version, memory) in self._columns.items():
            column = data.get(key, None)
            if (
                column is not ref()
                or _version(column) != version
                or column.data_ptr() != memory  # moved (to shared memory, say)
            ):
                return False
        return True

    def _written_runs(self, state, written: list | None) -> list | None:
        """The runs of rows to read again (``written``, and rows made valid), None to rebuild."""
        previous, self._state = self._state, state
        if written is None or state[:2] != previous[:2] or state[2] < previous[2]:
            return None
        length, old_length = state[2], previous[2]
        runs = [(old_length, length - 1)] if length > old_length else []
        runs += [(first, min(last, length - 1)) for first, last in written if first < length]
        # the row before each run too: ids compare it with the next, and for flags
        # it spares the index a change where its last stop was the state's
        runs += [(length - 1, length - 1) for first, _ in runs if first == 0]
        runs = _merged([(max(first - 1, 0), last) for first, last in runs])
        if len(runs) > _MAX_RUNS or 4 * sum(b - a + 1 for a, b in runs) > length:
            return None
        return runs


def _held(journal):
    """The journal's lock held (:meth:`WriteJournal.held`); ``False`` where there is no journal."""
    return nullcontext(False) if journal is None else journal.held()


def existing_index(storage) -> StorageTrajectoryIndex | None:
    """``storage``'s index where this process made one (a fork child's copy is not its own)."""
    entry = storage.__dict__.get("_trajectory_index")
    return entry if entry is not None and entry._pid == os.getpid() else None


def _disagreeing(columns, runs: list, state: tuple, found: set) -> set | None:
    """``found`` with ``runs`` read again: the keys where ids and done flags end differently."""
    capacity, lanes, length, _, _ = state
    for first, last in runs:
        for lane in range(0, lanes * capacity, capacity):
            found = {k for k in found if not lane + first <= k <= lane + last}
        ids = _id_stops(columns[0], first, last, length)
        ends = _end_stops(columns[1:], first, last)
        differ = np.setxor1d(ids, ends)
        if len(found) + differ.size > _MAX_DISAGREEMENTS:
            return None
        found.update(differ.tolist())
    return found
