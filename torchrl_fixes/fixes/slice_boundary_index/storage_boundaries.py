"""A storage's entry in the replay boundary cache, and the boundary signals it indexes.

``_REPLAY_BOUNDARY_CACHE`` keeps, per storage, the trajectory boundaries that
``_ReplayBoundaryIndex`` recovered at the storage's current ``_mutation_revision``;
any write moves the revision, so an online loop (write, sample, write, sample)
recovers the boundaries from the whole storage at every sample. Once a reader asks
for a storage's index, the storage's entry in that cache is a
:class:`StorageBoundaries`: a dict of those cached boundaries, as before, which also
holds one :class:`~.trajectory_boundaries.TrajectoryBoundaries` per boundary signal
read from the storage (trajectory ids, end flags, or the union of several end
flags). ``TensorStorage.set`` advances them by the rows it writes, O(k), and files
the entry under the revision the write moves to (``_record_write``); a revision
the entry did not see (a write from another process sharing the storage,
``_empty``, ``load_state_dict``, ``loads``, ``set_`` / ``update_`` / ``set_at_`` on
the buffer, a compiled write) makes it rebuild from the whole storage at the next
query. Writing into the storage's tensors directly (``rb.storage._storage[...] =
...``) moves no revision and cannot be seen, as with ``cache_values=True``.

The entry also follows, for the slice samplers that name no key, the rows where
the ``("next", "done")`` flags and the trajectory ids TorchRL reads by default
(``("collector", "traj_ids")``, ``"episode"``) mark different ends, so that such a
sampler may read the flags while they agree (the samplers' side decides).

A memmap storage pickled outside ``torch.multiprocessing`` (or copied) writes into
the same files with a revision of its own: :func:`_unseen_writes_reason` says so,
and its boundaries are recovered from the whole storage.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, unravel_key

from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import (
    _host_array,
    EndFlagDisagreements,
    TrajectoryBoundaries,
)

# Set on a storage pickled or copied outside torch.multiprocessing.
_COPIED_ATTR = "_boundary_cache_copied"
# Set on a storage once a reader asked for its index: its writes are recorded.
_READ_ATTR = "_boundary_index_read"
# The trajectory-id keys a slice sampler reads when no key is named (TorchRL's
# collectors write the first, datasets the second), and the end flags beside them.
_ID_KEYS = (("collector", "traj_ids"), "episode")
_END_KEY = ("next", "done")
# Written rows whose agreement is checked together, at the latest.
_AGREEMENT_BATCH = 1 << 16


class _Unsupported(Exception):
    """A configuration the boundary index does not handle: the whole storage is read instead."""


class StorageBoundaries(dict):
    """A storage's entry in ``_REPLAY_BOUNDARY_CACHE``: what is known of its trajectories.

    As a dict, it is what every entry of the cache is: the boundaries
    ``_ReplayBoundaryIndex`` cached at the entry's revision, by query. Its
    attributes hold what outlives the revision: the indexes, which
    ``TensorStorage.set`` advances by the rows it writes.

    Args:
        revision (int): the storage's mutation revision that the entry describes.
        cached (mapping, optional): the boundaries already cached at ``revision``.

    Attributes:
        revision (int): the storage's mutation revision that the entry describes.
        indexes (dict): boundary signal -> :class:`TrajectoryBoundaries`.
        stamps (dict): boundary signal -> the identity of the columns it was read from.
        agreements (dict): trajectory-id key -> :class:`_Agreement` with the done flags.
        pairs_decided (bool): whether the (ids, done flags) pairs to follow are known.
        unnamed_samplers (bool): whether a sampler that names no key has read the storage.
        plans (WeakKeyDictionary): sampler -> what it queries the indexes with at
            ``revision`` (``slice_boundaries._QueryPlan``).
        last_source: the boundary signal the last slice sample read.
    """

    def __init__(self, revision: int, cached=()):
        super().__init__(cached)
        self.revision = revision
        self.lock = threading.RLock()
        self.indexes: dict[Any, TrajectoryBoundaries] = {}
        self.stamps: dict[Any, tuple] = {}
        self.agreements: dict[Any, _Agreement] = {}
        self.pairs_decided = False
        self.unnamed_samplers = False
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.last_source = None

    def reset(self) -> None:
        """Forgets every row: the next query reads the whole storage."""
        self.clear()
        for index in self.indexes.values():
            index.reset()
        self.stamps.clear()
        for agreement in self.agreements.values():
            agreement.disagreements.reset()

    def mark_written(self, rows: torch.Tensor) -> None:
        """Records that ``rows`` (along the first dimension) were written, in every index."""
        for index in self.indexes.values():
            index.mark_written(rows)
        for agreement in self.agreements.values():
            agreement.disagreements.mark_written(rows)

    def index(self, key, kind: str, stamp: tuple) -> TrajectoryBoundaries:
        """The index of the boundary signal ``key``, read from the columns ``stamp`` identifies.

        Made on first use; reset where the columns were replaced, as their rows are new.
        """
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = TrajectoryBoundaries(kind)
        if self.stamps.get(key) != stamp:
            index.reset()
            self.stamps[key] = stamp
        return index


class _Agreement:
    """Where a storage's end flags disagree with its trajectory ids, and the columns read."""

    def __init__(self):
        self.disagreements = EndFlagDisagreements()
        self.stamp = None
        self.logged = False


def _written_rows(cursor, capacity: int) -> torch.Tensor | None:
    """The rows along dim 0 that ``storage.set(cursor, ...)`` writes, or None if unknown."""
    if type(cursor) is torch.Tensor and cursor.dtype is torch.long and cursor.ndim == 1:
        # what writers pass: checked first, it is on the path of every extend
        return cursor.cpu() % capacity
    if isinstance(cursor, int) and not isinstance(cursor, bool):
        return torch.tensor([cursor % capacity])
    if isinstance(cursor, slice):
        return torch.arange(*cursor.indices(capacity))
    if isinstance(cursor, range):
        return torch.arange(cursor.start, cursor.stop, cursor.step) % capacity
    if isinstance(cursor, (list, tuple)) and all(isinstance(c, int) for c in cursor):
        if isinstance(cursor, tuple):
            return None  # a multi-dimensional index
        cursor = torch.tensor(cursor, dtype=torch.long)
    if isinstance(cursor, np.integer):
        return torch.tensor([int(cursor) % capacity])
    if isinstance(cursor, np.ndarray):
        cursor = torch.as_tensor(cursor)
    if not isinstance(cursor, torch.Tensor):
        return None
    if cursor.dtype == torch.bool:
        if cursor.ndim != 1:
            return None
        return cursor.nonzero().squeeze(-1).cpu()
    if cursor.is_floating_point() or cursor.is_complex() or cursor.ndim > 1:
        return None
    return cursor.reshape(-1).to("cpu", torch.long) % capacity


def _record_copy(storage) -> None:
    """Marks ``storage`` as pickled outside ``torch.multiprocessing`` (or copied).

    The copy gets a revision of its own; a memmap copy writes into the same files.
    """
    if get_spawning_popen() is None:
        storage.__dict__[_COPIED_ATTR] = True


def _is_memmap(storage) -> bool:
    is_memmap = getattr(storage._storage, "is_memmap", None)
    return bool(is_memmap()) if is_memmap is not None else False


def _unseen_writes_reason(storage) -> str | None:
    """Why writes to ``storage`` could leave its mutation revision unmoved here, if they can."""
    if storage.__dict__.get(_COPIED_ATTR) and _is_memmap(storage):
        return "memmap storage pickled or copied outside torch.multiprocessing"
    return None


def _capacity_along_dim0(storage) -> int | None:
    data = getattr(storage, "_storage", None)
    if isinstance(data, TensorDictBase) and data.batch_dims:
        return data.batch_size[0]
    return None


def _id_column(data, key, ndim: int) -> torch.Tensor:
    column = data.get(key, None)
    if column is None:
        raise _Unsupported(f"trajectory key {key!r} not in the storage")
    if column.ndim != ndim or column.is_complex():
        raise _Unsupported("trajectory ids shaped unlike the storage")
    return column


def _end_column(data, key, ndim: int) -> torch.Tensor | None:
    column = data.get(key, None)
    if column is None:
        return None
    if column.dtype != torch.bool:
        raise _Unsupported("end flags that are not booleans")
    # the flags are squeezed before use: every batch dim must stay, extra dims must go
    if any(s == 1 for s in column.shape[1:ndim]) or any(
        s != 1 for s in column.shape[ndim:]
    ):
        raise _Unsupported("end flags that squeezing would reshape")
    return column


def _row_shape(columns, ndim: int) -> tuple[tuple, int]:
    if any(c.device != columns[0].device for c in columns[1:]):
        raise _Unsupported("boundary columns on different devices")
    lanes = columns[0].shape[1] if ndim == 2 else 1
    return ((-1,) if ndim == 1 else (-1, lanes)), lanes


def _column_signal(columns, shape) -> Callable:
    if len(columns) == 1:
        column = columns[0]

        def signal(rows):
            return column[rows].reshape(shape)

        # a column numpy can view is read in place (TrajectoryBoundaries' ``host``)
        host = _host_array(column) if column.is_contiguous() else None
        signal.host = None if host is None else host.reshape(shape)
        return signal

    def union(rows):
        out = columns[0][rows].reshape(shape)
        for other in columns[1:]:
            out = out | other[rows].reshape(shape)
        return out

    return union


def _stamp(columns) -> tuple:
    return tuple((c.data_ptr(), c.shape, c.dtype, c.stride()) for c in columns)


def _signal_of(
    storage, kind: str, key
) -> tuple[tuple, tuple, Callable, int, torch.device]:
    """What recovering ``storage``'s boundaries from ``key`` reads.

    ``kind`` is ``"trajectory"`` (``key`` names the trajectory ids) or ``"end"``
    (``key`` names the end flags; a list of keys reads the union of those present).
    Returns ``(index_key, stamp, signal, lanes, device)``: the index's key in
    :attr:`StorageBoundaries.indexes`, the identity of the columns read,
    ``signal(rows)``, the storage's lanes and the columns' device.
    """
    data, ndim = storage._storage, storage.ndim
    if ndim > 2:
        raise _Unsupported("storage with more than two batch dimensions")
    if key is None:
        raise _Unsupported("no key to read the boundaries from")
    if kind == "trajectory":
        columns = [_id_column(data, key, ndim)]
    else:
        keys = key if isinstance(key, list) else [key]
        found = [(k, _end_column(data, k, ndim)) for k in keys]
        found = [(k, c) for k, c in found if c is not None]
        if not found:
            raise _Unsupported("end key not in the storage")
        if isinstance(key, list):
            key = tuple(k for k, _ in found)
        columns = [c for _, c in found]
    shape, lanes = _row_shape(columns, ndim)
    signal = _column_signal(columns, shape)
    return (kind, key), _stamp(columns), signal, lanes, columns[0].device


def _resolve_cursor(cursor, length: int) -> int | None:
    if cursor is None:
        return None
    if isinstance(cursor, torch.Tensor):
        if cursor.ndim != 1 or not cursor.numel() or cursor.is_floating_point():
            raise _Unsupported("write cursor is not a 1d integer tensor")
        cursor = int(cursor[-1])
    elif isinstance(cursor, range):
        if not len(cursor):
            raise _Unsupported("empty cursor range")
        cursor = cursor[-1]
    elif isinstance(cursor, np.integer):
        cursor = int(cursor)
    elif isinstance(cursor, bool) or not isinstance(cursor, int):
        raise _Unsupported("write cursor of an unknown type")
    if not -length <= cursor < length:
        raise _Unsupported("write cursor outside the stored rows")
    return cursor % length


def _geometry(storage, lanes: int) -> dict:
    """What a query of ``storage``'s index is asked with, besides the signal."""
    length = storage._len_along_dim0
    if length < 2:
        raise _Unsupported("fewer than two stored rows")
    at_capacity = bool(storage._is_full)
    cursor = getattr(storage, "_last_cursor_index", None) if at_capacity else None
    return {
        "capacity": storage._storage.batch_size[0],
        "length": length,
        "at_capacity": at_capacity,
        "cursor": _resolve_cursor(cursor, length),
        "lanes": lanes,
    }


def _pair_columns(storage, id_key) -> tuple[Callable, tuple, int]:
    """``(signal, stamp, lanes)`` of the ``(ids, end flags)`` pair of ``id_key`` and ``_END_KEY``."""
    data, ndim = storage._storage, storage.ndim
    ids = _id_column(data, id_key, ndim)
    ends = _end_column(data, _END_KEY, ndim)
    if ends is None:
        raise _Unsupported("no end flags")
    shape, lanes = _row_shape([ids, ends], ndim)

    def signal(rows):
        return ids[rows].reshape(shape), ends[rows].reshape(shape)

    return signal, _stamp([ids, ends]), lanes


def _decide_pairs(storage, boundaries: StorageBoundaries) -> None:
    """Registers the (id key, end flags) pairs of ``storage`` whose agreement is followed."""
    boundaries.pairs_decided = True
    data = getattr(storage, "_storage", None)
    if not isinstance(data, TensorDictBase) or storage.ndim not in (1, 2):
        return
    for id_key in _ID_KEYS:
        try:
            _pair_columns(storage, id_key)
        except _Unsupported:
            continue
        boundaries.agreements[unravel_key(id_key)] = _Agreement()


def _check_agreements(storage, boundaries: StorageBoundaries, rows) -> None:
    """Reads the rows written since the last check once enough have gathered: O(k) per write."""
    for id_key, agreement in boundaries.agreements.items():
        disagreements = agreement.disagreements
        if disagreements.built:
            if disagreements.pending_rows >= _AGREEMENT_BATCH:
                _refresh_agreement(storage, id_key, agreement, storage._len_along_dim0)
        elif rows is not None and 4 * rows.numel() >= (
            length := storage._len_along_dim0
        ):
            # Checking every stored row costs no more than this write: start over.
            _refresh_agreement(storage, id_key, agreement, length)


def _refresh_agreement(storage, id_key, agreement: _Agreement, length: int) -> bool:
    """Brings ``agreement`` up to date with the storage; False when it cannot be known."""
    disagreements = agreement.disagreements
    try:
        signal, stamp, lanes = _pair_columns(storage, id_key)
    except _Unsupported:
        disagreements.reset()
        return False
    if stamp != agreement.stamp:
        # New columns: the rows recorded so far say nothing about them.
        built = disagreements.built
        disagreements.reset()
        agreement.stamp = stamp
        if built:
            return False
    disagreements.refresh(
        signal, capacity=_capacity_along_dim0(storage), length=length, lanes=lanes
    )
    return True
