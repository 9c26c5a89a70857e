"""The trajectory boundaries a storage keeps for the slice samplers.

A :class:`~torchrl.data.replay_buffers.TensorStorage` carries one
:class:`~.trajectory_boundaries.TrajectoryBoundaries` per boundary signal that a
slice sampler reads from it (the ``traj_key`` ids, the ``end_key`` flags or the
union of ``end_keys``). ``TensorStorage.set`` records the rows it writes, O(k)
(:func:`_record_write`); ``SliceSampler._get_stop_and_length`` asks
:func:`_boundary_index_boundaries`, which reads the signal of the rows written
since the last sample only and splices them into the index: a sample costs
O(batch) plus O(number of trajectories), whatever the capacity. The boundaries
are exactly those the whole-storage recovery finds, so the samples are the same,
and they are used whatever ``cache_values`` says: nothing returned is ever stale.

Done flags for ids: a sampler that names no trajectory key reads the ids TorchRL
picks for it (``("collector", "traj_ids")`` or ``"episode"``). Where the storage
also holds ``("next", "done")`` flags, the rows where the flags and the ids mark
different ends are followed from the storage's first write (O(k) per write, read
in batches). While they mark the same ends the index reads the flags, a column 8x
smaller than int64 ids; where they disagree (collectors writing interleaved rows)
it reads the ids, and says so once in the log. A key the user named,
``traj_key`` or ``end_key``, is read as named.

Wholesale changes (``_empty``, ``load_state_dict``, ``loads``, ``set_`` /
``update_`` / ``set_at_`` on the buffer) make the index rebuild
(:func:`_record_reset`). A write counter per storage lives in shared memory, so
a write from another process sharing the storage is seen and the index rebuilt;
where the storage counts its mutations (``_mutation_revision``), that count is
checked too. Writing into the storage's tensors directly
(``rb.storage._storage[...] = ...``) cannot be seen, as with ``cache_values=True``.

Configurations the index does not handle return ``None`` from
:func:`_boundary_index_boundaries`, and the sampler recovers the boundaries from
the whole storage as before; :func:`fallback_reason` says which one applies to a
sampler and a storage.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDictBase, unravel_key
from torch.compiler import is_compiling

from torchrl_fixes.trajectory_boundaries import EndFlagDisagreements, TrajectoryBoundaries

logger = logging.getLogger("torchrl_fixes")

_STATE_ATTR = "_trajectory_boundary_state"
# Write counters: one slot per process (by pid), so that concurrent writers in
# different processes never add to the same slot.
_WRITE_SLOTS = 256

# The trajectory-id keys a slice sampler reads when no key is named (TorchRL's
# collectors write the first, datasets the second), and the end flags beside them.
_ID_KEYS = (("collector", "traj_ids"), "episode")
_END_KEY = ("next", "done")
_TRAJ_KEY_NAMED = "_traj_key_named"
# Written rows whose agreement is checked together, at the latest.
_AGREEMENT_BATCH = 1 << 16

class _StorageBoundaryState:
    """What a storage carries for the boundary index.

    ``writes`` counts the writes made through the storage, one slot per process,
    in shared memory so that every process sharing the storage sees every write.
    The indexes themselves (``indexes``, one per boundary signal) are local to
    the process: they are rebuilt after unpickling.
    """

    def __init__(self, *, late: bool = False):
        self.writes = torch.zeros(_WRITE_SLOTS, dtype=torch.int64).share_memory_()
        # built after the storage's first writes, which it may not have seen
        self.late = late
        # pickled or copied outside torch.multiprocessing: a memmap copy writes
        # into the same files without sharing this counter
        self.copied = False
        self._local()

    def _local(self):
        self.indexes: dict[Any, TrajectoryBoundaries] = {}
        self.lock = threading.RLock()
        # numpy views of the counters: a write pays microseconds, not tensor ops
        self._writes = self.writes.numpy()
        self.seen_writes = self._writes.copy()
        self.seen_revision = None
        self.stamps: dict[Any, tuple] = {}
        # id key -> rows where its ids and the ("next", "done") flags disagree,
        # followed from the storage's first write on
        self.agreements: dict[Any, _Agreement] = {}
        self.pairs_decided = False
        # whether a sampler that names no key has read this storage
        self.unnamed_samplers = False
        # done key -> the slice sampler that reads it for TorchRL's sample units
        self.unit_samplers: dict[Any, Any] = {}
        self.last_source = None

    def __getstate__(self):
        if get_spawning_popen() is None:
            self.copied = True
        return {"writes": self.writes, "late": self.late, "copied": self.copied}

    def __setstate__(self, state):
        self.writes = state["writes"]
        if not self.writes.is_shared():
            self.writes.share_memory_()
        self.late = state["late"]
        self.copied = state["copied"]
        self._local()

    def written_elsewhere(self) -> bool:
        """Whether a write this process did not record happened since the last sync."""
        return not np.array_equal(self._writes, self.seen_writes)

    def sync(self) -> None:
        self.seen_writes = self._writes.copy()

    def reset(self) -> None:
        with self.lock:
            for index in self.indexes.values():
                index.reset()
            self.stamps.clear()
            for agreement in self.agreements.values():
                agreement.disagreements.reset()

    def record_write(self, rows: torch.Tensor | None) -> None:
        """Records a write of ``rows`` along dim 0 (``None``: rows unknown, rebuild)."""
        slot = os.getpid() % _WRITE_SLOTS
        self._writes[slot] += 1
        self.seen_writes[slot] += 1
        for index in self.indexes.values():
            if rows is None:
                index.reset()
            else:
                index.mark_written(rows)
        for agreement in self.agreements.values():
            if rows is None:
                agreement.disagreements.reset()
            else:
                agreement.disagreements.mark_written(rows)


class _Agreement:
    """Where a storage's end flags disagree with its trajectory ids, and the columns read."""

    def __init__(self):
        self.disagreements = EndFlagDisagreements()
        self.stamp = None
        self.logged = False


def _boundary_state(storage) -> _StorageBoundaryState:
    state = storage.__dict__.get(_STATE_ATTR)
    if state is None:
        state = storage.__dict__[_STATE_ATTR] = _StorageBoundaryState(late=True)
    return state


def _mutation_revision(storage) -> int | None:
    # TorchRL 0.14 counts every storage mutation (shared between processes).
    if is_compiling() or not hasattr(type(storage), "_mutation_revision"):
        return None
    return int(storage._mutation_revision)


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
    """Records that ``storage.set(cursor, ...)`` wrote its rows.

    ``revision_before`` is the storage's mutation revision before the write
    (:func:`_mutation_revision`), ``None`` where it keeps none.
    """
    if is_compiling():
        # Nothing Python-side may be traced (a lock, numpy counters): a compiled
        # write goes unrecorded, and the storage's mutation revision, which the
        # compiled code bumps, makes the next sample rebuild the index.
        return
    state = storage.__dict__.get(_STATE_ATTR)
    if state is None:
        return
    rows = None
    if state.indexes or state.agreements or not state.pairs_decided:
        capacity = _capacity_along_dim0(storage)
        rows = _written_rows(cursor, capacity) if capacity else None
    with state.lock:
        state.record_write(rows)
        if not state.pairs_decided:
            _decide_pairs(storage, state)
        if state.agreements:
            _check_agreements(storage, state, rows)
        revision = _mutation_revision(storage)
        # Only this write happened since the last sync: the index stays in sync.
        if revision_before is not None and revision_before == state.seen_revision:
            if revision == revision_before + 1:
                state.seen_revision = revision


def _record_reset(storage) -> None:
    """Makes the index of ``storage`` rebuild: its rows changed wholesale."""
    if is_compiling():
        return
    state = getattr(storage, "__dict__", {}).get(_STATE_ATTR)
    if state is None:
        return
    with state.lock:
        state.record_write(None)
        state.reset()
        revision = _mutation_revision(storage)
        if revision is not None:
            state.seen_revision = revision


def _attach_boundary_state(storage) -> None:
    """Gives a new storage the state its boundary indexes live in."""
    state = storage.__dict__.setdefault(_STATE_ATTR, _StorageBoundaryState())
    state.seen_revision = _mutation_revision(storage)


def _capacity_along_dim0(storage) -> int | None:
    data = getattr(storage, "_storage", None)
    if isinstance(data, TensorDictBase) and data.batch_dims:
        return data.batch_size[0]
    return None


class _Unsupported(Exception):
    """A configuration the boundary index does not handle; stock code runs instead."""


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
    if any(s == 1 for s in column.shape[1:ndim]) or any(s != 1 for s in column.shape[ndim:]):
        raise _Unsupported("end flags the stock code squeezes to another shape")
    return column


def _row_shape(columns, ndim: int) -> tuple[tuple, int]:
    if any(c.device.type != "cpu" for c in columns):
        raise _Unsupported("boundary signal not on CPU")
    lanes = columns[0].shape[1] if ndim == 2 else 1
    return ((-1,) if ndim == 1 else (-1, lanes)), lanes


def _column_signal(columns, shape) -> Callable:
    if len(columns) == 1:
        column = columns[0]

        def signal(rows):
            return column[rows].reshape(shape)

        return signal

    def union(rows):
        out = columns[0][rows].reshape(shape)
        for other in columns[1:]:
            out = out | other[rows].reshape(shape)
        return out

    return union


def _stamp(columns) -> tuple:
    return tuple((c.data_ptr(), c.shape, c.dtype, c.stride()) for c in columns)


def _signal(sampler, storage) -> tuple[str, Any, Callable, int]:
    """What the stock code would read: ``(kind, key, signal(rows), lanes)``."""
    data = storage._storage
    ndim = storage.ndim
    if ndim > 2:
        raise _Unsupported("storage with more than two batch dimensions")
    if sampler._fetch_traj:
        from torchrl.data.replay_buffers.storages import TensorStorage

        if isinstance(storage, TensorStorage) and "_used_traj_key" in dir(type(sampler)):
            key = sampler._used_traj_key
        else:
            key = sampler.traj_key
        if key is None:
            raise _Unsupported("no trajectory key")
        columns = [_id_column(data, key, ndim)]
        kind = "trajectory"
    else:
        end_keys = getattr(sampler, "end_keys", None)
        keys = tuple(end_keys) if end_keys is not None else (sampler.end_key,)
        found = [(k, _end_column(data, k, ndim)) for k in keys]
        found = [(k, c) for k, c in found if c is not None]
        if not found:
            raise _Unsupported("end key not in the storage")
        key = keys[0] if end_keys is None else tuple(k for k, _ in found)
        columns = [c for _, c in found]
        kind = "end"
    shape, lanes = _row_shape(columns, ndim)
    return kind, (kind, key, _stamp(columns)), _column_signal(columns, shape), lanes


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


def _decide_pairs(storage, state) -> None:
    """Registers the (id key, end flags) pairs of ``storage`` whose agreement is followed."""
    state.pairs_decided = True
    data = getattr(storage, "_storage", None)
    if not isinstance(data, TensorDictBase) or storage.ndim not in (1, 2):
        return
    for id_key in _ID_KEYS:
        try:
            _pair_columns(storage, id_key)
        except _Unsupported:
            continue
        state.agreements[unravel_key(id_key)] = _Agreement()


def _check_agreements(storage, state, rows) -> None:
    """Reads the rows written since the last check once enough have gathered: O(k) per write.

    The written rows are recorded by ``state.record_write``; reading them in batches
    keeps the cost per write to a few microseconds.
    """
    for id_key, agreement in state.agreements.items():
        disagreements = agreement.disagreements
        if disagreements.built:
            if disagreements.pending_rows >= _AGREEMENT_BATCH:
                _refresh_agreement(storage, id_key, agreement, storage._len_along_dim0)
        elif rows is not None and 4 * rows.numel() >= (length := storage._len_along_dim0):
            # Checking every stored row costs no more than this write: start over.
            _refresh_agreement(storage, id_key, agreement, length)


def _refresh_agreement(storage, id_key, agreement, length: int) -> bool:
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


def _may_read_end_flags(sampler) -> bool:
    """Whether ``sampler`` names no key, so that the done flags may stand in for its ids."""
    if sampler.__dict__.get(_TRAJ_KEY_NAMED, True) or getattr(sampler, "end_keys", None):
        return False
    return sampler.end_key is not None and unravel_key(sampler.end_key) == _END_KEY


def _agreeing_end_flags(sampler, storage, state, id_key, length, at_capacity, cursor):
    """``(key, signal)`` of end flags that give the same boundaries as ``id_key``, or None.

    Asked only for samplers that name no key (:func:`_may_read_end_flags`): a key
    the user named is read as named.
    """
    agreement = state.agreements.get(unravel_key(id_key))
    if agreement is None or not agreement.disagreements.built:
        return None
    if not _refresh_agreement(storage, id_key, agreement, length):
        return None
    if not agreement.disagreements.agree(length=length, at_capacity=at_capacity, cursor=cursor):
        if not agreement.logged:
            agreement.logged = True
            logger.info(
                "slice_boundary_index: %r and %r mark different trajectory ends "
                "(interleaved writers?); the trajectory ids are used",
                id_key,
                _END_KEY,
            )
        return None
    ends = _end_column(storage._storage, _END_KEY, storage.ndim)
    shape, _ = _row_shape([ends], storage.ndim)
    return ("end", _END_KEY, _stamp([ends])), _column_signal([ends], shape)


def _fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` cannot use the boundary index on ``storage`` (None: it can)."""
    from torchrl.data.replay_buffers.storages import TensorStorage

    if not isinstance(storage, TensorStorage):
        return "storage is not a TensorStorage"
    if not isinstance(getattr(storage, "_storage", None), TensorDictBase):
        return "storage does not hold a TensorDict"
    if getattr(sampler, "fragmented", False):
        return "fragmented=True"
    if getattr(sampler, "compile", False):
        return "compile=True"
    if getattr(sampler, "use_gpu", False):
        return "use_gpu"
    if getattr(storage, "_compilable", False) and not hasattr(type(storage), "_mutation_revision"):
        # compiled writes are not recorded, and nothing else would tell
        return "compilable=True storage on a TorchRL that counts no mutations (before 0.14)"
    cache = getattr(sampler, "_cache", {})
    if "static-stop-and-length" in cache or "stop-and-length" in cache:
        return "static ends or trajectories"
    return _classes_fallback_reason(type(sampler), type(storage))


@functools.cache
def _classes_fallback_reason(sampler_cls: type, storage_cls: type) -> str | None:
    """The part of :func:`_fallback_reason` that depends on the classes alone."""
    from torchrl.data.replay_buffers.samplers import SliceSampler

    for name in ("_find_start_stop_traj", "_end_to_start_stop"):
        if getattr(sampler_cls, name, None) is not getattr(SliceSampler, name, None):
            return f"{sampler_cls.__name__} overrides {name}"
    for name in ("set", "_empty", "load_state_dict", "loads"):
        owner = next((k for k in storage_cls.__mro__ if name in vars(k)), None)
        if owner not in _hooked_owners().get(name, ()):
            return f"{storage_cls.__name__}.{name} is not one the index follows"
    return None


@functools.cache
def _hooked_owners() -> dict[str, tuple[type, ...]]:
    """Method name -> the classes whose definition of it records its writes in the index."""
    from torchrl.data.replay_buffers.storages import LazyMemmapStorage, Storage, TensorStorage

    return {
        "set": (TensorStorage,),
        "_empty": (TensorStorage,),
        "load_state_dict": (TensorStorage, LazyMemmapStorage),
        "loads": (Storage,),
    }


_fallbacks_logged: set = set()


def _log_fallback(reason: str) -> None:
    if reason not in _fallbacks_logged:
        _fallbacks_logged.add(reason)
        logger.info("slice_boundary_index: stock boundary recovery used (%s)", reason)


def _boundary_index_boundaries(sampler, storage):
    """The boundaries from the storage's index, or ``None`` where stock code must run."""
    reason = _fallback_reason(sampler, storage)
    length = storage._len_along_dim0 if reason is None else 0
    if reason is None and length < 2:
        reason = "fewer than two stored rows"
    if reason is None:
        if getattr(sampler, "_traj_key_auto", False):
            sampler._resolve_traj_key(storage)
        try:
            kind, key, signal, lanes = _signal(sampler, storage)
            cursor_name = (
                "_last_cursor_index"
                if hasattr(type(storage), "_last_cursor_index")
                else "_last_cursor"
            )
            at_capacity = bool(storage._is_full)
            cursor = getattr(storage, cursor_name, None) if at_capacity else None
            cursor = _resolve_cursor(cursor, length)
        except _Unsupported as err:
            reason = str(err)
    if reason is not None:
        _log_fallback(reason)
        return None
    state = _boundary_state(storage)
    with state.lock:
        reason = _unseen_writers_reason(state, storage)
        if reason is not None:
            # Another copy may write into the same data without counting it here.
            _log_fallback(reason)
            return None
        revision = _mutation_revision(storage)
        if state.written_elsewhere() or (
            revision is not None and revision != state.seen_revision
        ):
            # Written elsewhere (another process, or a path that records no rows).
            state.reset()
            state.sync()
            state.seen_revision = revision
        if not _may_read_end_flags(sampler):
            if not state.unnamed_samplers and state.agreements:
                # Only samplers that name their keys read this storage so far:
                # following the agreement would cost every write for nothing.
                state.agreements.clear()
        elif kind == "trajectory":
            state.unnamed_samplers = True
            flags = _agreeing_end_flags(sampler, storage, state, key[1], length, at_capacity, cursor)
            if flags is not None:
                # the end flags give the same boundaries from a column 8x smaller
                key, signal = flags
                kind = "end"
        index_key = key[:2]
        state.last_source = index_key
        index = state.indexes.get(index_key)
        if index is None:
            index = state.indexes[index_key] = TrajectoryBoundaries(kind)
        if state.stamps.get(index_key) != key[2]:
            # The column was replaced (or first seen): its rows are new.
            index.reset()
            state.stamps[index_key] = key[2]
        return index.boundaries(
            signal,
            capacity=storage._storage.batch_size[0],
            length=length,
            at_capacity=at_capacity,
            cursor=cursor,
            lanes=lanes,
        )


def _is_memmap(storage) -> bool:
    is_memmap = getattr(storage._storage, "is_memmap", None)
    return bool(is_memmap()) if is_memmap is not None else False


def fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` samples ``storage`` with stock boundary recovery, or ``None`` if it does not.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ListStorage, SliceSampler
        >>> from torchrl_fixes.storage_boundaries import fallback_reason
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(4), TensorDict({"episode": torch.zeros(4)}, [4]))
        >>> print(fallback_reason(SliceSampler(num_slices=2, traj_key="episode"), storage))
        None
        >>> fallback_reason(SliceSampler(num_slices=2, traj_key="episode"), ListStorage(10))
        'storage is not a TensorStorage'
    """
    reason = _fallback_reason(sampler, storage)
    if reason is None:
        try:
            _signal(sampler, storage)
        except _Unsupported as err:
            reason = str(err)
    state = storage.__dict__.get(_STATE_ATTR)
    if reason is None and state is not None:
        reason = _unseen_writers_reason(state, storage)
    return reason


def boundary_source(storage) -> tuple[str, Any] | None:
    """What the last slice sample of ``storage`` read its trajectory boundaries from.

    Returns ``("trajectory", key)`` for trajectory ids, ``("end", key)`` for end
    flags (``key`` a tuple for a union of ``end_keys``), or ``None`` when no slice
    sampler has used the boundary index on ``storage`` yet. A sampler whose
    trajectory key was not named reads the end flags ``("next", "done")`` instead
    of the ids as long as both mark the same trajectory ends.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> from torchrl_fixes.storage_boundaries import boundary_source
        >>> step = torch.arange(100)
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(1000), sampler=SliceSampler(num_slices=4), batch_size=16)
        >>> _ = rb.extend(TensorDict(
        ...     {"episode": step // 10, ("next", "done"): (step % 10 == 9).unsqueeze(-1)}, [100]))
        >>> _ = rb.sample()
        >>> boundary_source(rb.storage)
        ('end', ('next', 'done'))
    """
    state = storage.__dict__.get(_STATE_ATTR)
    return None if state is None else state.last_source


def _unseen_writers_reason(state, storage) -> str | None:
    """Why writes to ``storage`` could escape the write counter, if they can."""
    if state.copied and _is_memmap(storage):
        return "memmap storage pickled or copied outside torch.multiprocessing"
    if state.late and (storage._storage.is_shared() or _is_memmap(storage)):
        return "storage shared between processes, built before the fix was applied"
    return None




def _unit_sampler(state, done_key):
    """A slice sampler that reads ``done_key`` as named: what a sample unit's boundaries are."""
    from torchrl.data.replay_buffers.samplers import SliceSampler

    sampler = state.unit_samplers.get(done_key)
    if sampler is None:
        sampler = SliceSampler(num_slices=1, end_key=done_key)
        sampler._traj_key_auto = False
        sampler._fetch_traj = False
        sampler.__dict__[_TRAJ_KEY_NAMED] = True
        state.unit_samplers[done_key] = sampler
    return sampler


def _seed_episode_boundaries(storage, done_key, device) -> None:
    """Puts the index's episode boundaries where ``_ReplayBoundaryIndex`` looks first.

    TorchRL's sample units (``Sequence``, ``SubgoalTriplet``) recover episode
    boundaries from the ``done_key`` flags of the whole storage through
    ``_ReplayBoundaryIndex``, whose cache lives until the next write. The boundaries
    of the storage's index are the same, so they are stored in that cache for the
    storage's current revision: the unit reads them instead of the whole column.
    """
    from torchrl.data.replay_buffers import utils
    from torchrl.data.replay_buffers.storages import TensorStorage

    if done_key is None or device is None or torch.device(device).type != "cpu":
        return
    if not isinstance(storage, TensorStorage):
        return
    state = _boundary_state(storage)
    boundaries = _boundary_index_boundaries(_unit_sampler(state, done_key), storage)
    if boundaries is None:
        return
    shape = tuple(storage.shape)
    key = (
        utils._freeze_boundary_cache_key(("end", done_key)),
        shape,
        len(storage),
        bool(storage._is_full),
        utils._boundary_cursor_cache_key(getattr(storage, "_last_cursor_index", None)),
        str(device),
    )
    with utils._REPLAY_BOUNDARY_CACHE_LOCK:
        revision = storage._mutation_revision
        cached = utils._REPLAY_BOUNDARY_CACHE.get(storage)
        if cached is None or cached[0] != revision:
            cached = utils._REPLAY_BOUNDARY_CACHE[storage] = (revision, {})
        cached[1].setdefault(key, (shape[0], boundaries, None))
