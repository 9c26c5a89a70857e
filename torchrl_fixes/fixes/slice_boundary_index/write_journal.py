"""What a storage's writes covered: a bounded journal kept beside its mutation revision.

``TensorStorage.set`` records, in its storage's :class:`WriteJournal`, the revision
the write moved the storage to and the runs of rows it covered. A trajectory index in
any buffer, thread or process catches up from its own revision by reading the runs
recorded since (:meth:`WriteJournal.runs_since`), and rebuilds only where the journal
cannot tell: a revision it holds no runs for (a writer that records nothing, another
mutation path), or one its slots no longer hold.

The journal lives in shared memory and goes with its storage to the processes the
storage is sent to as they start (``spawn``, ``forkserver``; ``fork`` children inherit
it), as the storage's revision does; its lock serialises the recorded writes of every
process. A copy or a plain pickle of the storage gets a journal of its own.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
from multiprocessing.context import get_spawning_popen

import numpy as np
import torch
from tensordict import TensorDictBase

# How many runs a journal holds; a reader further behind rebuilds.
_SLOTS = 1024
# Seconds to wait for the lock: past them, a process that died holding it is assumed,
# and the write goes unrecorded (its readers rebuild) or the reader rebuilds.
_LOCK_TIMEOUT = 10.0
# The first row of a run whose rows are not known: a reader that crosses it rebuilds.
_UNKNOWN = -1
# The first row of a run kept on the writer's accelerator, in the writer's process only.
_ON_DEVICE = -2


def _written_rows(cursor, capacity: int) -> np.ndarray | None:
    """The rows ``storage.set(cursor, ...)`` wrote, modulo ``capacity`` (None where unknown)."""
    if isinstance(cursor, slice):
        return np.arange(*cursor.indices(capacity))
    if isinstance(cursor, torch.Tensor):
        cursor = cursor.numpy()
    cursor = np.asarray(cursor)
    if cursor.dtype == np.bool_ and cursor.ndim == 1:
        return np.flatnonzero(cursor)
    if cursor.dtype.kind not in "iu":
        return None
    return cursor.reshape(-1) % capacity


def _runs(rows: np.ndarray) -> list:
    """At most two ``(first, last)`` runs that cover ``rows``: a write's, or the span of all."""
    if not rows.size:
        return []
    lo, hi = int(rows.min()), int(rows.max())
    if hi - lo < 2 * rows.size:  # dense, as a write's rows are: read as one run
        return [(lo, hi)]
    rows = np.unique(rows)
    breaks = np.flatnonzero(np.diff(rows) != 1)
    if breaks.size == 1:  # a write around the end of the ring
        return [(lo, int(rows[breaks[0]])), (int(rows[breaks[0] + 1]), hi)]
    return [(lo, hi)]


class WriteJournal:
    """The runs of rows a storage's last writes covered, each with the revision it made.

    It holds the runs of the last writes, up to 1,024 runs (a write covers one run, or
    two around the end of the ring), in shared memory from ``multiprocessing``'s heap
    (no file descriptor of its own): 32 kB, whatever the number or size of the writes.
    Writers hold :attr:`lock` while they move the storage's revision and record their
    runs, and readers while they read the revision and the runs, so a reader sees every
    recorded write up to that revision.

    Examples:
        >>> import torch
        >>> journal = WriteJournal()
        >>> with journal.lock:
        ...     journal.record(1, torch.arange(8, 12) % 10, capacity=10)
        ...     journal.record(2, 3, capacity=10)
        >>> with journal.lock:
        ...     journal.runs_since(0, 2)
        [(0, 1), (8, 9), (3, 3)]
        >>> with journal.lock:  # revision 3 moved the storage unrecorded: rebuild
        ...     print(journal.runs_since(1, 3))
        None
    """

    def __init__(self):
        # row 0: [runs recorded, the revision the first record came after, 0, 0];
        # row 1 + i % _SLOTS: [revision, first row, last row, writer's pid] of run i
        self._table = multiprocessing.RawArray("q", 4 * (_SLOTS + 1))
        self._lock = multiprocessing.RLock()
        self._attach()

    def _attach(self) -> None:
        # reads and writes the shared memory
        self._rows = np.frombuffer(self._table, dtype=np.int64).reshape(_SLOTS + 1, 4)
        self._device_runs = None  # (first, last) of runs on the writer's accelerator

    @property
    def lock(self):
        """The lock of every process's recorded writes (an ``RLock``)."""
        return self._lock

    @contextlib.contextmanager
    def held(self):
        """Holds :attr:`lock`, and yields whether it could.

        ``False`` where another process kept it over 10 seconds (one that died holding
        it): the caller goes on without it, records nothing and reads no runs.
        """
        acquired = self._lock.acquire(timeout=_LOCK_TIMEOUT)
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()

    def record(self, revision: int, cursor, capacity: int | None) -> None:
        """Records that ``storage.set(cursor, ...)`` moved the storage to ``revision``.

        Reads no accelerator value: the rows of a cursor on an accelerator are kept
        there, for readers in this process. The caller holds :attr:`lock`.

        Args:
            revision (int): the storage's mutation revision after the write.
            cursor: what ``set`` was given: an int, a slice, a sequence, an array
                or a tensor of rows along the storage's first dim.
            capacity (int or None): the storage's rows along its first dim
                (``None`` where it holds no tensors: rows unknown).
        """
        head = int(self._rows[0, 0])
        if isinstance(cursor, tuple) or capacity is None:  # rows along several dims
            runs = [(_UNKNOWN, 0)]
        elif isinstance(cursor, torch.Tensor) and cursor.device.type != "cpu":
            runs = self._keep_on_device(head, cursor, capacity)
        else:
            rows = _written_rows(cursor, capacity)
            runs = [(_UNKNOWN, 0)] if rows is None else _runs(rows) or [(0, -1)]
        if head == 0:
            self._rows[0, 1] = revision - 1
        for i, (first, last) in enumerate(runs):
            self._rows[1 + (head + i) % _SLOTS] = (revision, first, last, os.getpid())
        self._rows[0, 0] = head + len(runs)

    def _keep_on_device(self, head: int, cursor: torch.Tensor, capacity: int) -> list:
        if cursor.dtype == torch.bool or cursor.is_floating_point():
            return [(_UNKNOWN, 0)]
        if not cursor.numel():
            return [(0, -1)]
        if self._device_runs is None or self._device_runs.device != cursor.device:
            self._device_runs = torch.zeros(
                (_SLOTS, 2), dtype=torch.int64, device=cursor.device
            )
        slot = head % _SLOTS
        self._device_runs[slot] = torch.stack(torch.aminmax(cursor.reshape(-1) % capacity))
        return [(_ON_DEVICE, slot)]

    def runs_since(self, revision: int, current: int) -> list | None:
        """The ``(first, last)`` runs written from ``revision`` to ``current``, in order.

        ``None`` where the journal cannot tell: a revision in between that it holds no
        runs for, or that its slots no longer hold. Runs are modulo the capacity and
        may reach past the storage's valid rows. The caller holds :attr:`lock`.
        """
        if current == revision:
            return []
        head, base = (int(v) for v in self._rows[0, :2])
        if head == 0 or revision < base:
            return None
        # the entries since: two at most per revision, and one before them
        newest = int(self._rows[1 + (head - 1) % _SLOTS, 0])
        count = min(head, _SLOTS, 2 * max(newest - revision, 0) + 1)
        entries = self._rows[1 + np.arange(head - count, head) % _SLOTS]
        if head > count and entries[0, 0] > revision:  # older runs were overwritten
            return None
        entries = entries[(entries[:, 0] > revision) & (entries[:, 0] <= current)]
        if np.unique(entries[:, 0]).size != current - revision:
            return None
        if (entries[:, 1] == _UNKNOWN).any():
            return None
        on_device = entries[:, 1] == _ON_DEVICE
        if on_device.any():
            if self._device_runs is None or (entries[on_device, 3] != os.getpid()).any():
                return None  # kept by another process's writer
            slots = torch.from_numpy(entries[on_device, 2]).to(self._device_runs.device)
            entries[on_device, 1:3] = self._device_runs[slots].cpu().numpy()
        return [(int(first), int(last)) for _, first, last, _ in entries if last >= first]

    def __getstate__(self):
        if get_spawning_popen() is None:  # a copy: it records its own writes
            return {"table": None}
        return {"table": self._table, "lock": self._lock}

    def __setstate__(self, state):
        if state["table"] is None:
            self.__init__()
        else:
            self._table, self._lock = state["table"], state["lock"]
            self._attach()


def journal_of(storage) -> WriteJournal:
    """``storage``'s journal (``storage._write_journal``), made where it has none."""
    journal = storage.__dict__.get("_write_journal")
    if journal is None:  # one journal, where two threads make one
        journal = storage.__dict__.setdefault("_write_journal", WriteJournal())
    return journal


def capacity_of(storage) -> int | None:
    """The rows of ``storage`` along its first dim, where it holds a tensor or TensorDict."""
    data = getattr(storage, "_storage", None)
    if isinstance(data, TensorDictBase):
        return data.batch_size[0] if data.batch_dims else None
    if isinstance(data, torch.Tensor):
        return data.shape[0] if data.ndim else None
    return None
