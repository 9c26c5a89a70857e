"""The parts of a replay buffer, as TorchRL composes them in ``sample()``, and what they hold.

:func:`_buffer_parts` finds the sampler, storage, writer, transform... of a buffer
(or refuses a layout it does not know); the other functions read what the report
states about them: the stored keys, where a memmap storage lives, how many
trajectories a slice sampler sees, what its boundary recovery read, and whether
each fix serves the buffer (:func:`_fix_verdicts`).
"""
from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

from tensordict import is_tensor_collection
from torchrl.data import ReplayBuffer, SliceSampler, TensorDictReplayBuffer
from torchrl.data.replay_buffers import utils as replay_buffer_utils

from torchrl_fixes._core.patching import defining_class, get_original
from torchrl_fixes._core.registry import STOCK_MARK
from torchrl_fixes.activation import registry
from torchrl_fixes.diagnose.report import NOT_RELEVANT, SERVES, STOCK, DiagnoseRefused, FixVerdict
from torchrl_fixes.fixes.single_gather import _reads_tensordict
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


def _fix_state(name: str, obj: Any, noun: str = "object") -> FixVerdict | None:
    """The stock verdict where fix ``name`` does not run for ``obj`` at all, else None.

    It does not where it is not applied in this process, or where ``obj`` was
    built inside ``torchrl_fixes.disabled()``.
    """
    row = registry.status()[name]
    if row.state == "skipped":
        # nothing makes it serve: it cannot apply to this TorchRL
        return FixVerdict(STOCK, f"the fix is skipped in this process ({row.reason})", "skipped")
    if not row.applied:
        return FixVerdict(
            STOCK, f"the fix is {row.state} in this process ({row.reason})", "inactive",
            f"apply it (TORCHRL_FIXES unset or naming {name}, or torchrl_fixes.activate()): "
            f"applied at any time before the sample, it serves this {noun} too",
        )
    if getattr(obj, "__dict__", {}).get(STOCK_MARK, False):
        return FixVerdict(
            STOCK, f"this {noun} was built inside torchrl_fixes.disabled()", "built disabled",
            f"build the {noun} outside torchrl_fixes.disabled()",
        )
    return None


def _slice_fix_state(name: str, sampler) -> FixVerdict | None:
    """:func:`_fix_state` of a fix that serves slice samplers alone: not relevant to others."""
    if not isinstance(sampler, SliceSampler):
        return FixVerdict(NOT_RELEVANT, f"{type(sampler).__name__} is not a slice sampler")
    return _fix_state(name, sampler, "sampler")


def _slice_index_verdict(parts: _Parts) -> FixVerdict:
    """slice_boundary_index: the storage's trajectory index, or stock boundary recovery and why."""
    sampler = parts.sampler
    stock = _slice_fix_state("slice_boundary_index", sampler)
    if stock is not None:
        return stock
    reason = fallback_reason(sampler, parts.storage)
    if reason is not None:
        return FixVerdict(
            STOCK, f"a configuration the fix leaves to stock code: {reason}", "configuration",
            "a configuration the fix reads (python -m torchrl_fixes status lists those it does not)",
        )
    return FixVerdict(SERVES)


def _single_gather_verdict(parts: _Parts) -> FixVerdict:
    """single_gather: the slice sampler reads a few entries of the sampled rows, or the full rows and why."""
    sampler = parts.sampler
    stock = _slice_fix_state("single_gather", sampler)
    if stock is not None:
        return stock
    # the fix edits the method that builds the info: 0.14 on, _finalize_index; before, _get_index
    builder = "_finalize_index" if hasattr(SliceSampler, "_finalize_index") else "_get_index"
    owner = defining_class(type(sampler), builder)
    if owner.__module__.split(".")[0] != "torchrl":
        return FixVerdict(
            STOCK, f"{owner.__name__} overrides {builder}: its own code reads the sampled rows", "configuration"
        )
    if not _reads_tensordict(parts.storage):
        return FixVerdict(
            STOCK,
            "a configuration the fix leaves to stock code: the storage is not a TensorStorage "
            "holding a TensorDict, so the sampler reads the full rows",
            "configuration",
            "a LazyTensorStorage or LazyMemmapStorage holding a TensorDict",
        )
    return FixVerdict(SERVES)


def _pinning_verdict(parts: _Parts) -> FixVerdict:
    """pinned_sample_output: every returned tensor pinned, or stock pinning and why."""
    buffer = parts.buffer
    if not buffer._pin_memory:
        return FixVerdict(NOT_RELEVANT, "pin_memory=False")
    stock = _fix_state("pinned_sample_output", buffer, "buffer")
    if stock is not None:
        return stock
    owner = _stock_decorated_sample(type(buffer))
    if owner is not None:
        return FixVerdict(
            STOCK,
            f"{owner.__name__}._sample was decorated with TorchRL's pin_memory_output before "
            "torchrl_fixes was imported",
            "stock decorator",
            f"define {owner.__name__} after import torchrl_fixes (TorchRL's own buffer classes "
            "are served whenever it is imported)",
        )
    return FixVerdict(SERVES)


def _stock_decorated_sample(cls: type) -> type | None:
    """The class whose ``_sample`` TorchRL's own ``pin_memory_output`` decorates, if one does.

    The fix decorates TorchRL's classes again when it is applied; a class defined
    before (or decorated with the function taken before) keeps the stock decorator.
    """
    stock_decorator = get_original(replay_buffer_utils, "pin_memory_output")
    stock_code = stock_decorator(lambda self: None).__code__
    owner = defining_class(cls, "_sample")
    method, seen = vars(owner)["_sample"], set()
    while isinstance(method, types.FunctionType) and id(method) not in seen:
        if method.__code__ is stock_code:
            return owner
        seen.add(id(method))
        method = getattr(method, "__wrapped__", None)  # through functools.wraps decorators
    return None


# The verdict of each fix, by name; a fix not listed is judged by _fix_state alone.
_VERDICTS = {
    "slice_boundary_index": _slice_index_verdict,
    "single_gather": _single_gather_verdict,
    "pinned_sample_output": _pinning_verdict,
}


def _fix_verdicts(parts: _Parts) -> dict[str, FixVerdict]:
    """Whether each fix of the registry serves ``parts``' buffer, and if not, why.

    Run it where the sampler's state is put back afterwards: finding a slice
    sampler's boundary signal resolves its trajectory key, as its first sample would.
    """
    verdicts = {}
    for name in registry.names:
        judge = _VERDICTS.get(name)
        if judge is not None:
            verdicts[name] = judge(parts)
        else:
            verdicts[name] = _fix_state(name, parts.buffer, "buffer") or FixVerdict(SERVES)
    return verdicts


def _built_before_the_fix(sampler) -> bool:
    """Whether a slice sampler was built before slice_boundary_index was applied.

    Its ``__init__`` notes whether the sampler names a boundary key; one built
    before has no note, and reads the key TorchRL picks, never the done flags for it.
    """
    return isinstance(sampler, SliceSampler) and "_default_boundary_keys" not in vars(sampler)


def _is_slice_sampler(sampler) -> bool:
    return isinstance(sampler, SliceSampler) and not getattr(sampler, "fragmented", False)


def _boundary_read(sampler, storage, index_serves: bool) -> tuple[str, Any] | None:
    """What the sampler's boundary recovery read: ("trajectory", key) or ("end", key).

    ``index_serves``: the storage's trajectory index serves the sampler (its verdict).
    """
    if index_serves:
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
