"""How the replay boundary cache keeps a storage's entry across the writes it records.

The functions that ``_REPLAY_BOUNDARY_CACHE`` is read and written with, beside it
(in TorchRL, ``torchrl/data/replay_buffers/utils.py``): a reader makes a storage's
entry a :class:`~.storage_boundaries.StorageBoundaries`
(:func:`_storage_boundaries`), ``TensorStorage.set`` carries that entry to the
revision it moves to (:func:`_revision_before_write`, :func:`_record_write`), and
``_ReplayBoundaryIndex`` asks the entry's index for what it has not cached
(:func:`_indexed_boundaries`). Before TorchRL 0.14 the cache and its lock are the
backport's (:mod:`torchrl_fixes.fixes.slice_boundary_index.mutation_revision`).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

try:
    from torchrl.data.replay_buffers.utils import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
except ImportError:  # TorchRL before 0.14
    from torchrl_fixes.fixes.slice_boundary_index.mutation_revision import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
from torchrl_fixes.fixes.slice_boundary_index.storage_boundaries import (
    _capacity_along_dim0,
    _check_agreements,
    _geometry,
    _READ_ATTR,
    _signal_of,
    _unseen_writes_reason,
    _Unsupported,
    _written_rows,
    StorageBoundaries,
)


def _mutation_revision(storage) -> int | None:
    """``storage``'s mutation revision, ``None`` while compiling.

    Nothing Python-side may be traced: a compiled write records no rows, and the
    revision it moves makes the next query rebuild.
    """
    if torch.compiler.is_compiling():
        return None
    return int(storage._mutation_revision)


def _revision_before_write(storage) -> int | None:
    """The mutation revision a write of ``storage`` starts from, where the write is recorded.

    ``None`` for a storage whose index no reader has asked for: its writes record
    nothing, and the first reader builds the index from the whole storage.
    """
    if not storage.__dict__.get(_READ_ATTR, False):
        return None
    return _mutation_revision(storage)


def _boundary_cache_entry(storage, revision: int) -> StorageBoundaries:
    """``storage``'s entry in the boundary cache at ``revision``, as a :class:`StorageBoundaries`.

    Must be called with ``_REPLAY_BOUNDARY_CACHE_LOCK`` held. What is cached at
    ``revision`` is kept; an entry that last saw another revision forgets every row,
    as writes it did not record happened since.
    """
    cached = _REPLAY_BOUNDARY_CACHE.get(storage)
    entry = None if cached is None else cached[1]
    if isinstance(entry, StorageBoundaries):
        if entry.revision != revision:
            entry.reset()
            entry.revision = revision
    else:
        current = cached is not None and cached[0] == revision
        entry = StorageBoundaries(revision, entry if current else ())
        storage.__dict__[_READ_ATTR] = True  # its writes are recorded from now on
    if cached is None or cached[0] != revision or cached[1] is not entry:
        _REPLAY_BOUNDARY_CACHE[storage] = (revision, entry)
    return entry


def _storage_boundaries(storage) -> StorageBoundaries:
    """``storage``'s entry in the boundary cache, at the storage's current revision."""
    revision = _mutation_revision(storage)
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        return _boundary_cache_entry(storage, revision)


def _record_write(storage, cursor, revision_before: int | None) -> None:
    """Advances ``storage``'s boundary-cache entry by the rows ``storage.set(cursor, ...)`` wrote.

    ``revision_before`` is the storage's mutation revision before the write
    (:func:`_revision_before_write`). The entry's indexes read the written rows at
    their next query, and the entry is filed under the revision the write moved
    to; where a mutation it did not record came before or with the write, it
    forgets every row instead.
    """
    if revision_before is None:
        return  # a storage whose index nobody reads, or a compiled write
    # not compiling: the write began outside compiled code (revision_before is known)
    revision = int(storage._mutation_revision)
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        cached = _REPLAY_BOUNDARY_CACHE.get(storage)
        entry = None if cached is None else cached[1]
        if not isinstance(entry, StorageBoundaries):
            return  # dropped by an unrecorded mutation: the next reader rebuilds it
        # a sample reading the entry finishes before it changes
        with entry.lock:
            rows = None
            if (
                entry.revision == revision_before
                and revision == revision_before + 1
                and (entry.indexes or entry.agreements)
            ):
                capacity = _capacity_along_dim0(storage)
                rows = _written_rows(cursor, capacity) if capacity else None
            if rows is None:
                entry.reset()
            else:
                entry.clear()  # the boundaries cached at the old revision
                entry.mark_written(rows)
                if entry.agreements:
                    _check_agreements(storage, entry, rows)
            entry.revision = revision
            _REPLAY_BOUNDARY_CACHE[storage] = (revision, entry)


def _indexed_boundaries(storage, source, device) -> tuple | None:
    """What ``_ReplayBoundaryIndex`` caches for ``source``, from ``storage``'s index.

    ``(length, (start, stop, lengths), None)`` for the trajectory ids
    (``source = ("trajectory", key)``) or end flags (``("end", key)``) of a
    ``TensorStorage`` over a TensorDict, exactly what the whole-column recovery
    finds, on ``device`` (the column's when ``None``); after a write of k rows it
    reads those rows only. ``None`` where the index cannot serve: other storages,
    keys or shapes it does not read, fewer than two rows.
    """
    if not isinstance(getattr(storage, "_storage", None), TensorDictBase):
        return None
    if _unseen_writes_reason(storage) is not None:
        return None
    kind, key = source
    try:
        index_key, stamp, signal, lanes, column_device = _signal_of(storage, kind, key)
        geometry = _geometry(storage, lanes)
    except _Unsupported:
        return None
    entry = _storage_boundaries(storage)
    with entry.lock:
        index = entry.index(index_key, kind, stamp)
        boundaries = index.boundaries(
            signal,
            device=column_device if device is None else torch.device(device),
            **geometry,
        )
    return geometry["length"], boundaries, None
