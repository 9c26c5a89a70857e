"""A slice sampler's trajectory boundaries, from the storage's trajectory index.

``SliceSampler._get_stop_and_length`` recovers the boundaries from the whole
storage at every call. :func:`_stop_and_length_from_index` answers first, from the
storage's :class:`~.storage_index.StorageTrajectoryIndex`, with exactly what that
recovery finds; where the index does not apply it returns ``None``. A sampler that
names no key reads the done flags instead of the ids TorchRL picks for it, while
both end the same trajectories; a key the user named is read as named.
"""
from __future__ import annotations

import torch
from tensordict import unravel_key

from torchrl.data.replay_buffers.storages import TensorStorage

from torchrl_fixes.fixes.slice_boundary_index.storage_index import (
    BoundarySignal,
    END_KEY,
    StorageTrajectoryIndex,
    Unsupported,
)


def _overrides(sampler, *names: str) -> str | None:
    """The first of ``names`` that ``sampler``'s class defines anew.

    It is compared, by identity, with the definition of the first class of the
    sampler's MRO, from its base, to define ``_get_stop_and_length``: ``SliceSampler``.
    """
    classes = type(sampler).__mro__
    base = next(c for c in reversed(classes) if "_get_stop_and_length" in vars(c))
    for name in names:
        if getattr(type(sampler), name) is not getattr(base, name):
            return name
    return None


def _fallback_reason(sampler, storage) -> str | None:
    """Why the stock code must recover ``sampler``'s boundaries in ``storage``, if it must."""
    if not isinstance(storage, TensorStorage):
        return "storage is not a TensorStorage"
    if not getattr(sampler, "_boundary_index", True):
        return "boundary_index=False"
    if getattr(sampler, "fragmented", False):
        return "fragmented=True"
    if (
        "static-stop-and-length" in sampler._cache
        or "stop-and-length" in sampler._cache
    ):
        return "static ends or trajectories"
    overridden = _overrides(sampler, "_find_start_stop_traj", "_end_to_start_stop")
    if overridden is not None:
        return f"{type(sampler).__name__} overrides {overridden}"
    device = getattr(sampler, "_gpu_device", None)
    if device is not None and torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            return f"use_gpu device {device} cannot be used"
    return None


def _boundary_signal(sampler, storage) -> BoundarySignal:
    """What ``sampler._get_stop_and_length`` reads from ``storage``."""
    if getattr(sampler, "_traj_key_auto", False):
        sampler._resolve_traj_key(storage)
    if sampler._fetch_traj:
        if sampler._used_traj_key is None:
            raise Unsupported("no trajectory key")
        return BoundarySignal("trajectory", (unravel_key(sampler._used_traj_key),))
    end_keys = getattr(sampler, "end_keys", None)
    if end_keys is None:
        return BoundarySignal("end", (unravel_key(sampler.end_key),))
    stored = storage._storage.keys(True)  # the union of the end keys stored
    return BoundarySignal("end", tuple(unravel_key(k) for k in end_keys if k in stored))


def _current_index(sampler, storage):
    """``(index, device)`` of what ``sampler`` reads in ``storage``, or None (stock code).

    ``device`` is the columns', where the stock recovery leaves the boundaries.
    """
    if _fallback_reason(sampler, storage) is not None:
        return None
    try:
        signal = _boundary_signal(sampler, storage)
        # the done flags may stand for the ids of a sampler that names no key
        end_flags = (
            signal.kind == "trajectory"
            and getattr(sampler, "_default_boundary_keys", False)
            and getattr(sampler, "end_keys", None) is None
            and unravel_key(sampler.end_key) == END_KEY
        )
        entry = StorageTrajectoryIndex.of(storage)
        return entry.index(storage, signal, end_flags)
    except Unsupported:
        return None


def _reads_index(draw):
    """``draw(sampler, storage, ...)``, holding the storage's index: it reads one state of it."""

    def held(sampler, storage, *args):
        if _fallback_reason(sampler, storage) is not None:
            return draw(sampler, storage, *args)
        with StorageTrajectoryIndex.of(storage)._lock:  # reentrant: stock code may run
            return draw(sampler, storage, *args)

    return held


def _as_tensors(rows: tuple, device: torch.device) -> tuple:
    """``(start, stop, lengths)`` as the stock recovery returns them, on ``device``."""
    start, stop, lane, lengths = (
        None if array is None else torch.from_numpy(array) for array in rows
    )
    if lane is None:
        start, stop = start.unsqueeze(-1), stop.unsqueeze(-1)
    else:
        start, stop = torch.stack([start, lane], -1), torch.stack([stop, lane], -1)
    return tuple(t.to(device) for t in (start, stop, lengths))


@_reads_index
def _stop_and_length_from_index(sampler, storage):
    """What ``sampler._get_stop_and_length(storage)`` returns, or None (stock code)."""
    found = _current_index(sampler, storage)
    if found is None:
        return None
    index, device = found
    rows = index.boundaries()
    if not sampler.cache_values:  # stock's are made anew: a caller may write into them
        rows = tuple(None if array is None else array.copy() for array in rows)
    return _as_tensors(rows, device)
