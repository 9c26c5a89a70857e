"""Incremental trajectory boundaries in the replay boundary cache.

``_REPLAY_BOUNDARY_CACHE`` keeps, per storage, the trajectory boundaries recovered
at the storage's current ``_mutation_revision``; any write moves the revision and
empties the entry, so an online loop (write, sample, write, sample) recovers the
boundaries from the whole storage at every sample. Here the entry of a
``TensorStorage`` also holds a :class:`StorageBoundaries`: one
:class:`~.trajectory_boundaries.TrajectoryBoundaries` per boundary signal that a
slice sampler reads (the ``traj_key`` ids, the ``end_key`` flags or the union of
``end_keys``), which ``TensorStorage.set`` advances by the rows it writes, O(k)
(:func:`_record_write`), instead of emptying it. A revision the entry did not see
(a write from another process sharing the storage, ``_empty``,
``load_state_dict``, ``loads``, ``set_`` / ``update_`` / ``set_at_`` on the
buffer, a compiled write) makes it rebuild from the whole storage at the next
query, as before. Writing into the storage's tensors directly
(``rb.storage._storage[...] = ...``) moves no revision and cannot be seen, as with
``cache_values=True``.

The entry also follows, from the storage's first write, the rows where the
``("next", "done")`` flags and the trajectory ids TorchRL reads by default
(``("collector", "traj_ids")``, ``"episode"``) mark different ends, so that a
sampler may read the flags while they agree (:mod:`.slice_boundaries` decides).

A memmap storage pickled outside ``torch.multiprocessing`` (or copied) writes into
the same files with a revision of its own: :func:`_unseen_writes_reason` says so,
and the samplers recover its boundaries from the whole storage.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase, unravel_key
from torch.compiler import is_compiling

try:
    from torchrl.data.replay_buffers.utils import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
except ImportError:  # TorchRL before 0.14
    from torchrl_fixes.mutation_revision import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
from torchrl_fixes.trajectory_boundaries import (
    _host_array,
    EndFlagDisagreements,
    TrajectoryBoundaries,
)

# The key of the incremental entry in a storage's boundary cache.
_INCREMENTAL = "incremental"
# Set on a storage pickled or copied outside torch.multiprocessing.
_COPIED_ATTR = "_boundary_cache_copied"
# Set on a storage once it has an entry (a slice sampler read it).
_READ_ATTR = "_boundary_index_read"
# The trajectory-id keys a slice sampler reads when no key is named (TorchRL's
# collectors write the first, datasets the second), and the end flags beside them.
_ID_KEYS = (("collector", "traj_ids"), "episode")
_END_KEY = ("next", "done")
# Written rows whose agreement is checked together, at the latest.
_AGREEMENT_BATCH = 1 << 16


class _Unsupported(Exception):
    """A configuration the boundary index does not handle; stock code runs instead."""


class StorageBoundaries:
    """What the boundary cache of one storage keeps across writes.

    Attributes:
        revision (int): the storage's mutation revision that the indexes describe.
        indexes (dict): boundary signal -> :class:`TrajectoryBoundaries`.
        stamps (dict): boundary signal -> the identity of the columns it was read from.
        agreements (dict): trajectory-id key -> :class:`_Agreement` with the done flags.
        pairs_decided (bool): whether the (ids, done flags) pairs to follow are known.
        unnamed_samplers (bool): whether a sampler that names no key has read the storage.
        samplers (dict): key -> a sampler kept to query the storage with (sample units).
        plans (WeakKeyDictionary): sampler -> what it queries the indexes with at
            ``revision`` (:class:`~.slice_boundaries._QueryPlan`).
        last_source: the boundary signal the last slice sample read.
    """

    def __init__(self, revision: int):
        self.revision = revision
        self.lock = threading.RLock()
        self.indexes: dict[Any, TrajectoryBoundaries] = {}
        self.stamps: dict[Any, tuple] = {}
        self.agreements: dict[Any, _Agreement] = {}
        self.pairs_decided = False
        self.unnamed_samplers = False
        self.samplers: dict[Any, Any] = {}
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.last_source = None

    def reset(self) -> None:
        """Forgets every row: the next query reads the whole storage."""
        for index in self.indexes.values():
            index.reset()
        self.stamps.clear()
        for agreement in self.agreements.values():
            agreement.disagreements.reset()

    def mark_written(self, rows: torch.Tensor) -> None:
        for index in self.indexes.values():
            index.mark_written(rows)
        for agreement in self.agreements.values():
            agreement.disagreements.mark_written(rows)


class _Agreement:
    """Where a storage's end flags disagree with its trajectory ids, and the columns read."""

    def __init__(self):
        self.disagreements = EndFlagDisagreements()
        self.stamp = None
        self.logged = False


def _mutation_revision(storage) -> int | None:
    # Nothing Python-side may be traced: a compiled write records no rows, and the
    # revision it moves makes the next query rebuild.
    if is_compiling():
        return None
    return int(storage._mutation_revision)


def _revision_before_write(storage) -> int | None:
    """The mutation revision a write starts from, where the write is to be recorded.

    ``None`` for a storage no slice sampler has read: its writes record nothing, and
    the first sampler to read it builds its index from the whole storage.
    """
    # a compiled write is not traced here (see _mutation_revision)
    if is_compiling() or not storage.__dict__.get(_READ_ATTR, False):
        return None
    return int(storage._mutation_revision)


def _cached_boundaries(storage, revision: int) -> StorageBoundaries:
    """The incremental entry of ``storage``'s boundary cache, filed under ``revision``.

    Must be called with ``_REPLAY_BOUNDARY_CACHE_LOCK`` held. An entry that last saw
    another revision is reset: writes it did not record happened since.
    """
    cached = _REPLAY_BOUNDARY_CACHE.get(storage)
    boundaries = cached[1].get(_INCREMENTAL) if cached is not None else None
    if boundaries is None:
        boundaries = StorageBoundaries(revision)
        storage.__dict__[_READ_ATTR] = True  # its writes are recorded from now on
    elif boundaries.revision != revision:
        boundaries.reset()
        boundaries.revision = revision
    if cached is None or cached[0] != revision:
        # what was cached for an older revision is stale
        _REPLAY_BOUNDARY_CACHE[storage] = (revision, {_INCREMENTAL: boundaries})
    else:
        cached[1][_INCREMENTAL] = boundaries
    return boundaries


def _storage_boundaries(storage) -> StorageBoundaries:
    """The incremental entry of ``storage``, brought to its current revision."""
    revision = _mutation_revision(storage)
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        return _cached_boundaries(storage, revision)


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


def _record_write(storage, cursor, revision_before: int | None) -> None:
    """Advances the boundary cache of ``storage`` by the rows ``storage.set(cursor, ...)`` wrote.

    ``revision_before`` is the storage's mutation revision before the write
    (:func:`_revision_before_write`). Where another mutation happened in between, the
    entry is reset instead.
    """
    if revision_before is None or is_compiling():
        return  # a storage no slice sampler has read, or a compiled write
    revision = _mutation_revision(storage)
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        cached = _REPLAY_BOUNDARY_CACHE.get(storage)
        if cached is None or _INCREMENTAL not in cached[1]:
            # No slice sampler has read this storage: nothing to advance, and the
            # first one to read it builds its index from the whole storage.
            return
        boundaries = _cached_boundaries(storage, revision_before)
        # a sample reading the entry finishes before it changes
        with boundaries.lock:
            boundaries.revision = revision
            if revision != revision_before + 1:
                boundaries.reset()  # another write interleaved with this one
                return
            rows = None
            if (
                boundaries.indexes
                or boundaries.agreements
                or not boundaries.pairs_decided
            ):
                capacity = _capacity_along_dim0(storage)
                rows = _written_rows(cursor, capacity) if capacity else None
            if rows is None:
                boundaries.reset()
            else:
                boundaries.mark_written(rows)
            if not boundaries.pairs_decided:
                _decide_pairs(storage, boundaries)
            if boundaries.agreements:
                _check_agreements(storage, boundaries, rows)
        # file the entry under the new revision: what stock cached before is stale
        _cached_boundaries(storage, revision)


def _record_copy(storage) -> None:
    """Marks ``storage`` as pickled outside ``torch.multiprocessing`` (or copied).

    The copy gets a revision of its own; a memmap copy writes into the same files.
    """
    from multiprocessing.context import get_spawning_popen

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
    # stock squeezes the flags: every batch dim must stay, extra dims must go
    if any(s == 1 for s in column.shape[1:ndim]) or any(
        s != 1 for s in column.shape[ndim:]
    ):
        raise _Unsupported("end flags the stock code squeezes to another shape")
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
