"""The parts of a replay buffer, as TorchRL composes them in ``sample()``, and what they hold.

:func:`_buffer_parts` finds the sampler, storage, writer, transform... of a buffer
(or refuses a layout it does not know); the other functions read what the report
states about them: the stored keys, where a memmap storage lives, how many
trajectories a slice sampler sees, what its boundary recovery read, and whether a
fix runs for a given object.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from tensordict import is_tensor_collection
from torchrl.data import ReplayBuffer, SliceSampler, TensorDictReplayBuffer

from torchrl_fixes._core.patching import defining_class
from torchrl_fixes._core.registry import STOCK_MARK
from torchrl_fixes.activation import registry
from torchrl_fixes.diagnose.report import DiagnoseRefused
from torchrl_fixes.fixes.slice_boundary_index import boundary_source, fallback_reason


@dataclass
class _Parts:
    buffer: Any
    sampler: Any
    storage: Any
    writer: Any
    sample_unit: Any
    transform: Any
    collate_fn: Any
    storage_index: Any
    set_dispatch: Any
    tensordict_sample: bool
    notes: list[str]


def _buffer_parts(buffer) -> _Parts:
    """The sampler, storage, transform... of ``buffer``, or DiagnoseRefused on a layout not known."""
    _refuse_unknown_layout(buffer)
    base = sys.modules[ReplayBuffer.__module__]
    storage_index = getattr(base, "_storage_index", None)
    notes = []
    if storage_index is None:
        notes.append("this TorchRL has no _storage_index: indices gathered as the sampler returns them")
        storage_index = _same_index
    set_dispatch = getattr(base, "_set_dispatch_td_nn_modules", None)
    sampler = buffer._sampler
    if getattr(buffer, "_sync", True) is False and getattr(buffer, "prioritized_sampler", None) is not None:
        sampler = buffer.prioritized_sampler
        notes.append("asynchronous priorities: the catch-up of pending priority writes is not timed")
    known = {ReplayBuffer, TensorDictReplayBuffer}
    owner = defining_class(type(buffer), "_sample")
    if owner not in known and owner.__module__.split(".")[0] == "torchrl" and "prioritized" not in owner.__module__:
        notes.append(f"{owner.__name__}._sample is timed as ReplayBuffer._sample composes its stages")
    elif owner not in known and owner.__module__.split(".")[0] != "torchrl":
        notes.append(f"{owner.__name__}._sample (yours) is timed as ReplayBuffer._sample composes its stages")
    return _Parts(
        buffer=buffer,
        sampler=sampler,
        storage=buffer._storage,
        writer=buffer._writer,
        sample_unit=vars(buffer).get("_sample_unit"),
        transform=buffer._transform,
        collate_fn=buffer._collate_fn,
        storage_index=storage_index,
        set_dispatch=set_dispatch,
        tensordict_sample=isinstance(buffer, TensorDictReplayBuffer),
        notes=notes,
    )


def _refuse_unknown_layout(buffer) -> None:
    """Raises DiagnoseRefused unless ``buffer`` is one replay buffer of a layout diagnose knows."""
    if not isinstance(buffer, ReplayBuffer):
        raise DiagnoseRefused(
            f"diagnose times a torchrl ReplayBuffer in this process; got {type(buffer).__name__}"
        )
    for name in ("ReplayBufferEnsemble", "RemoteTensorDictReplayBuffer"):
        if any(cls.__name__ == name for cls in type(buffer).__mro__):
            raise DiagnoseRefused(f"diagnose does not time a {name}: its sample() is not one buffer's")
    missing = [
        name
        for name in ("_sampler", "_storage", "_writer", "_transform", "_pin_memory", "_prefetch", "_collate_fn")
        if name not in vars(buffer)
    ]
    if getattr(buffer, "_delayed_init", False) and not getattr(buffer, "initialized", True):
        raise DiagnoseRefused("the buffer is not initialised yet (delayed_init): add data to it first")
    if missing:
        raise DiagnoseRefused(
            f"diagnose does not know this TorchRL's replay buffer layout: {type(buffer).__name__} "
            f"has no {', '.join(missing)} (known: torchrl 0.14 and TorchRL main as of 2026-10)"
        )


def _same_index(index, storage):
    return index


def _fix_state(name: str, obj: Any, noun: str = "object") -> tuple[bool, str]:
    """Whether fix ``name`` runs for ``obj``, and if not, why."""
    row = registry.status()[name]
    if not row.applied:
        return False, f"{row.state} ({row.reason})" if row.reason else row.state
    if getattr(obj, "__dict__", {}).get(STOCK_MARK, False):
        return False, f"inactive for this {noun} (built inside torchrl_fixes.disabled())"
    return True, "applied"


def _is_slice_sampler(sampler) -> bool:
    return isinstance(sampler, SliceSampler) and not getattr(sampler, "fragmented", False)


def _boundary_read(sampler, storage) -> tuple[str, Any] | None:
    """What the sampler's boundary recovery read: ("trajectory", key) or ("end", key)."""
    active, _ = _fix_state("slice_boundary_index", sampler)
    if active and fallback_reason(sampler, storage) is None:
        return boundary_source(storage)
    if "static-stop-and-length" in getattr(sampler, "_cache", {}):
        return None
    if getattr(sampler, "_fetch_traj", False):
        key = vars(sampler).get("__used_traj_key") or sampler.traj_key
        return ("trajectory", key)
    end_keys = getattr(sampler, "end_keys", None)
    return ("end", tuple(end_keys) if end_keys is not None else sampler.end_key)


def _storage_keys(storage) -> set:
    inner = getattr(storage, "_storage", None)
    if not is_tensor_collection(inner):
        return set()
    try:
        return set(inner.keys(include_nested=True))
    except Exception:
        return set()


def _memmap_dir(storage) -> str | None:
    if type(storage).__name__ != "LazyMemmapStorage" and not any(
        cls.__name__ == "LazyMemmapStorage" for cls in type(storage).__mro__
    ):
        return None
    return str(getattr(storage, "scratch_dir", None) or "a temporary directory")


def _trajectory_count(parts: _Parts):
    """How many trajectories the slice sampler sees (None when not a slice sampler)."""
    if not _is_slice_sampler(parts.sampler):
        return None
    try:
        _, _, lengths = parts.sampler._get_stop_and_length(parts.storage)
    except Exception:
        return None
    return int(lengths.numel())
