"""What a slice sampler reads its trajectory boundaries from, and when it may use the index.

``SliceSampler._get_stop_and_length`` asks :func:`_boundary_index_boundaries`
first: it finds the boundary signal the sampler reads, takes the index of that
signal in the storage's boundary-cache entry (``storage_boundaries``), and
returns its start, stop and lengths, O(batch) plus O(number of trajectories) per
sample whatever the capacity. They are exactly those the whole-storage recovery
finds, so the samples are the same, and they are used whatever ``cache_values``
says: nothing returned is ever stale. Configurations the index does not handle
return ``None`` and the sampler recovers the boundaries from the whole storage as
before; :func:`fallback_reason` says which one applies.

What a sampler asks the index with (the signal, the index, the storage's
length and cursor) is kept per sampler in a :class:`_QueryPlan` until the
storage changes otherwise than by writes the index records, or the sampler's
keys or options change: a sample with no write since the last one looks up
nothing, and one after a write reads the storage's length and cursor alone.

Devices: the whole-storage recovery finds the boundaries where the storage's
boundary column lives (moved to ``use_gpu``'s device and back when ``use_gpu`` is
set) and leaves them on the column's device, where the sampler then draws its
slices. The index reads the written rows of the column on its device and brings
to the host only which of them end a trajectory; it returns the boundaries on the
column's device, and ``slice_sampling`` draws there, with the sampler's
generator. ``use_gpu`` over a CPU storage thus costs no transfer at all.

Done flags for ids: a sampler that names no trajectory key reads the ids TorchRL
picks for it (``("collector", "traj_ids")`` or ``"episode"``). While the storage's
``("next", "done")`` flags mark the same ends, the index reads the flags, a column
8x smaller than int64 ids; where they disagree (collectors writing interleaved
rows) it reads the ids, and says so once in the log. A key the user named,
``traj_key`` or ``end_key``, is read as named.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase, unravel_key

from torchrl.data.replay_buffers.storages import TensorStorage
from torchrl_fixes.fixes.slice_boundary_index.boundary_cache import (
    _mutation_revision,
    _REPLAY_BOUNDARY_CACHE,
    _REPLAY_BOUNDARY_CACHE_LOCK,
    _storage_boundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.storage_boundaries import (
    _decide_pairs,
    _END_KEY,
    _geometry,
    _refresh_agreement,
    _signal_of,
    _unseen_writes_reason,
    _Unsupported,
    StorageBoundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import (
    TrajectoryBoundaries,
)

logger = logging.getLogger("torchrl_fixes")

_TRAJ_KEY_NAMED = "_traj_key_named"


def _signal(sampler, storage) -> tuple[str, tuple, tuple, Callable, int, torch.device]:
    """What the sampler reads: ``(kind, index_key, stamp, signal(rows), lanes, device)``.

    ``device`` is the columns' device, where the whole-storage recovery finds the
    boundaries and leaves them, whatever ``use_gpu`` says (it moves them back from there).
    """
    if sampler._fetch_traj:
        key = sampler._used_traj_key
        if key is None:
            raise _Unsupported("no trajectory key")
        return ("trajectory", *_signal_of(storage, "trajectory", key))
    end_keys = getattr(sampler, "end_keys", None)
    keys = sampler.end_key if end_keys is None else list(end_keys)
    return ("end", *_signal_of(storage, "end", keys))


def _may_read_end_flags(sampler) -> bool:
    """Whether ``sampler`` names no key, so that the done flags may stand in for its ids."""
    if sampler.__dict__.get(_TRAJ_KEY_NAMED, True) or getattr(
        sampler, "end_keys", None
    ):
        return False
    return sampler.end_key is not None and unravel_key(sampler.end_key) == _END_KEY


def _agreeing_end_flags(
    sampler, storage, boundaries, id_key, length, at_capacity, cursor
):
    """``(key, signal)`` of end flags that give the same boundaries as ``id_key``, or None.

    Asked only for samplers that name no key (:func:`_may_read_end_flags`): a key
    the user named is read as named.
    """
    agreement = boundaries.agreements.get(unravel_key(id_key))
    # not built yet (the first sample, or after a wholesale change): built here, from
    # the whole storage, as the index is
    if agreement is None or not _refresh_agreement(storage, id_key, agreement, length):
        return None
    if not agreement.disagreements.agree(
        length=length, at_capacity=at_capacity, cursor=cursor
    ):
        if not agreement.logged:
            agreement.logged = True
            logger.info(
                "SliceSampler: %r and %r mark different trajectory ends "
                "(interleaved writers?); the trajectory ids are used",
                id_key,
                _END_KEY,
            )
        return None
    index_key, stamp, signal, _, _ = _signal_of(storage, "end", _END_KEY)
    return index_key, stamp, signal


# The configurations whose boundaries are recovered from the whole storage, as the
# checks below (and ``_signal_of``'s, and the first sample's row count) decide them.
FALLBACKS = (
    "storages other than TensorStorage over a TensorDict, ndim > 2",
    "fragmented=True",
    "compile=True",
    "a use_gpu device this machine cannot use (which raises, as before)",
    "static ends/trajectories",
    "samplers that override the boundary recovery",
    "boundary columns the whole-storage recovery would reject or squeeze or that lie "
    "on different devices",
    "fewer than 2 rows",
    "memmap storages pickled or copied outside torch.multiprocessing",
)


def _fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` cannot use the boundary index on ``storage`` (None: it can).

    The reason falls under one of the configurations of :data:`FALLBACKS`.
    """
    if not isinstance(storage, TensorStorage):
        return "storage is not a TensorStorage"
    if not isinstance(getattr(storage, "_storage", None), TensorDictBase):
        return "storage does not hold a TensorDict"
    if getattr(sampler, "fragmented", False):
        return "fragmented=True"
    if getattr(sampler, "compile", False):
        return "compile=True"
    if getattr(sampler, "use_gpu", False):
        reason = _unusable_device_reason(getattr(sampler, "_gpu_device", None))
        if reason is not None:
            return reason
    cache = getattr(sampler, "_cache", {})
    if "static-stop-and-length" in cache or "stop-and-length" in cache:
        return "static ends or trajectories"
    reason = _classes_fallback_reason(type(sampler))
    return reason if reason is not None else _unseen_writes_reason(storage)


@functools.cache
def _unusable_device_reason(device) -> str | None:
    """Why the boundary signal could not be moved to ``use_gpu``'s ``device``.

    ``use_gpu`` only says where the whole-storage recovery finds the boundaries:
    they come back on the storage's device, where the index returns them. Where the
    device cannot be used, that recovery runs and raises its own error.
    """
    if device is None:
        return None
    try:
        device = torch.device(device)
        if device.type == "meta":
            raise RuntimeError("no data on the meta device")
        torch.empty(0, device=device)
    except Exception as err:  # torch raises AssertionError or RuntimeError, by backend
        return f"use_gpu device {device} cannot be used ({type(err).__name__})"
    return None


def _overrides(sampler_cls: type, name: str) -> bool:
    """Whether ``sampler_cls`` has a ``name`` method of its own, not ``SliceSampler``'s."""
    method = getattr(sampler_cls, name, None)
    return method is not None and method.__qualname__ != f"SliceSampler.{name}"


@functools.cache
def _classes_fallback_reason(sampler_cls: type) -> str | None:
    """The part of :func:`_fallback_reason` that depends on the sampler's class alone."""
    for name in ("_find_start_stop_traj", "_end_to_start_stop"):
        if _overrides(sampler_cls, name):
            return f"{sampler_cls.__name__} overrides {name}"
    return None


_fallbacks_logged: set = set()


def _log_fallback(reason: str) -> None:
    if reason not in _fallbacks_logged:
        _fallbacks_logged.add(reason)
        logger.info(
            "SliceSampler: trajectory boundaries recovered from the whole storage (%s)",
            reason,
        )


def _boundary_index_boundaries(sampler, storage):
    """The boundaries from the storage's index, or ``None`` where the whole storage must be read."""
    return _query_index(sampler, storage, TrajectoryBoundaries.boundaries)


def _query_index(sampler, storage, query: Callable):
    """``query(index, signal, device=device, **geometry)`` on the storage's index for ``sampler``, under its lock.

    ``device`` is where the whole-storage recovery leaves the boundaries.

    What the query is asked with (the signal, the index, the geometry) is found
    once and kept in a :class:`_QueryPlan`: until the storage changes otherwise
    than by the writes the index records, a sample reads the geometry at most and
    goes to its query. Returns ``None`` where the whole storage must be read.
    """
    plan = _current_plan(sampler, storage)
    if plan is None:
        return _plan_and_query(sampler, storage, query)
    with plan.lock:
        plan.boundaries.last_source = plan.index_key
        return query(plan.index, plan.signal, device=plan.device, **plan.geometry)


class _WeakReferenceable:
    # The __weakref__ slot a slotted dataclass inherits: dataclass(weakref_slot=True)
    # is Python 3.11+, and slots=True refuses a class that sets __slots__ itself.
    __slots__ = ("__weakref__",)


@dataclasses.dataclass(slots=True)
class _QueryPlan(_WeakReferenceable):
    """What :func:`_query_index` finds for a sampler on a storage.

    The index, the signal it reads, the geometry it is asked with and the mutation
    revision that geometry was read at.

    The storage's :class:`StorageBoundaries` holds it, so that it lives no longer
    than the storage; the sampler finds it through :data:`_LAST_PLANS`.
    """

    storage: weakref.ref
    boundaries: StorageBoundaries
    revision: int
    sampler_state: tuple
    index_key: tuple
    # the trajectory-id key whose agreement with the end flags was checked, if any:
    # that check is made again at the next revision, by a new plan
    agreement: Any
    index: TrajectoryBoundaries
    signal: Callable
    device: torch.device
    geometry: dict

    @property
    def lock(self):
        return self.boundaries.lock


# sampler -> a weak reference to the last plan it made
_LAST_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# The sampler attributes a plan depends on: what _fallback_reason, _signal and
# _may_read_end_flags read (names in the sampler's __dict__).
_PLAN_ATTRIBUTES = (
    "fragmented",
    "compile",
    "use_gpu",
    "_gpu_device",
    "_traj_key_auto",
    "_fetch_traj",
    "traj_key",
    "__used_traj_key",
    "end_key",
    "end_keys",
    _TRAJ_KEY_NAMED,
)


def _sampler_state(sampler) -> tuple:
    attributes = sampler.__dict__
    cache = attributes.get("_cache") or ()
    return (
        type(sampler),
        *map(attributes.get, _PLAN_ATTRIBUTES),
        "static-stop-and-length" in cache or "stop-and-length" in cache,
    )


def _current_plan(sampler, storage) -> _QueryPlan | None:
    """``sampler``'s last plan, if it holds for ``storage`` as it is now.

    At the plan's revision it holds as it is. After writes that the index
    recorded (the plan's storage entry is the live one and saw every revision
    since), it holds once the geometry is read again, unless it checked whether
    end flags may stand in for the ids: a new plan checks that again.
    """
    try:
        reference = _LAST_PLANS.get(sampler)
    except TypeError:  # a sampler that cannot be referenced weakly
        return None
    plan = None if reference is None else reference()
    if (
        plan is None
        or plan.storage() is not storage
        or plan.sampler_state != _sampler_state(sampler)
        # a memmap copy writes the same files under a revision of its own
        or _unseen_writes_reason(storage) is not None
    ):
        return None
    revision = _mutation_revision(storage)
    if plan.revision == revision:
        return plan
    boundaries = plan.boundaries
    if (
        revision is None
        or boundaries.revision != revision
        or plan.agreement is not None
        or plan.index_key not in boundaries.stamps
    ):
        return None
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        cached = _REPLAY_BOUNDARY_CACHE.get(storage)
    if cached is None or cached[1] is not boundaries:
        return None
    try:
        plan.geometry = _geometry(storage, plan.geometry["lanes"])
    except _Unsupported:
        return None
    plan.revision = revision
    return plan


def _plan_and_query(sampler, storage, query: Callable):
    """:func:`_query_index` without a plan: finds what to ask, keeps it, asks."""
    reason = _fallback_reason(sampler, storage)
    if reason is None and storage._len_along_dim0 < 2:
        reason = "fewer than two stored rows"
    if reason is None:
        # read before the geometry: a write after it makes the plan stale
        revision = _mutation_revision(storage)
        if getattr(sampler, "_traj_key_auto", False):
            sampler._resolve_traj_key(storage)
        try:
            kind, index_key, stamp, signal, lanes, device = _signal(sampler, storage)
            geometry = _geometry(storage, lanes)
        except _Unsupported as err:
            reason = str(err)
    if reason is not None:
        _log_fallback(reason)
        return None
    length, at_capacity, cursor = (
        geometry["length"],
        geometry["at_capacity"],
        geometry["cursor"],
    )
    boundaries = _storage_boundaries(storage)
    agreement = None
    with boundaries.lock:
        if not boundaries.pairs_decided:
            _decide_pairs(storage, boundaries)
        if not _may_read_end_flags(sampler):
            if not boundaries.unnamed_samplers and boundaries.agreements:
                # Only samplers that name their keys read this storage so far:
                # following the agreement would cost every write for nothing.
                boundaries.agreements.clear()
        elif kind == "trajectory":
            boundaries.unnamed_samplers = True
            agreement = index_key[1]
            flags = _agreeing_end_flags(
                sampler, storage, boundaries, agreement, length, at_capacity, cursor
            )
            if flags is not None:
                # the end flags give the same boundaries from a column 8x smaller
                index_key, stamp, signal = flags
                kind = "end"
        boundaries.last_source = index_key
        index = boundaries.index(index_key, kind, stamp)
        if revision is not None:
            plan = _QueryPlan(
                storage=weakref.ref(storage),
                boundaries=boundaries,
                revision=revision,
                sampler_state=_sampler_state(sampler),
                index_key=index_key,
                agreement=agreement,
                index=index,
                signal=signal,
                device=device,
                geometry=geometry,
            )
            try:
                boundaries.plans[sampler] = plan
                _LAST_PLANS[sampler] = weakref.ref(plan)
            except TypeError:  # a sampler that cannot be referenced weakly
                pass
        return query(index, signal, device=device, **geometry)


def fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` recovers the boundaries of ``storage`` from the whole storage, or ``None`` if it does not.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ListStorage, SliceSampler
        >>> from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import fallback_reason
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
            _geometry(storage, _signal(sampler, storage)[4])
        except _Unsupported as err:
            reason = str(err)
    return reason


def boundary_source(storage) -> tuple[str, Any] | None:
    """What the last slice sample of ``storage`` read its trajectory boundaries from.

    Returns ``("trajectory", key)`` for trajectory ids, ``("end", key)`` for end
    flags (``key`` a tuple for a union of ``end_keys``), or ``None`` when no slice
    sampler has used the boundary index on ``storage`` since its last wholesale change.
    A sampler whose trajectory key was not named reads the end flags
    ``("next", "done")`` instead of the ids as long as both mark the same trajectory ends.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import boundary_source
        >>> step = torch.arange(100)
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(1000), sampler=SliceSampler(num_slices=4), batch_size=16)
        >>> _ = rb.extend(TensorDict(
        ...     {"episode": step // 10, ("next", "done"): (step % 10 == 9).unsqueeze(-1)}, [100]))
        >>> _ = rb.sample()
        >>> boundary_source(rb.storage)
        ('end', ('next', 'done'))
    """
    with _REPLAY_BOUNDARY_CACHE_LOCK:
        cached = _REPLAY_BOUNDARY_CACHE.get(storage)
    entry = None if cached is None else cached[1]
    return entry.last_source if isinstance(entry, StorageBoundaries) else None
