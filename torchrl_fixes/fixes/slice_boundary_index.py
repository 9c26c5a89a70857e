"""Slice boundary index: slice samplers stop scaling with the buffer.

Stock :class:`~torchrl.data.SliceSampler` (and ``SliceSamplerWithoutReplacement``,
``PrioritizedSliceSampler``) recovers the trajectory boundaries from the whole
storage on every sample: it reads the trajectory-id or done column of every
stored row, O(capacity). ``cache_values=True`` keeps them only until the next
write, so an online loop (write, sample, write, sample) pays the full cost at
every step.

With this fix every ``TensorStorage`` keeps one :class:`TrajectoryBoundaries`
per boundary signal a sampler reads from it (the ``traj_key`` ids, the
``end_key`` flags or the union of ``end_keys``). Writes through the storage
record the rows they touch, O(k); the next sample reads the signal of those rows
only and splices the result into the index; a sample costs O(batch) plus O(number
of trajectories) vector work. The boundaries are exactly those the stock code
recovers, so the samples are the same, and they are used whatever
``cache_values`` says: the flag keeps its meaning (what is returned is never
stale) and costs nothing.

The index and its bookkeeping live in :mod:`torchrl_fixes.storage_boundaries`
(the module the upstream patch adds to TorchRL as it is); this module wraps
TorchRL's methods so that they run the statements of :data:`INLINE_HOOKS`, the
lines the upstream patch writes into them.

Done flags for ids: a sampler that names no trajectory key reads the ids TorchRL
picks for it (``("collector", "traj_ids")`` or ``"episode"`` on 0.14, ``"episode"``
before). Where the storage also
holds ``("next", "done")`` flags, the fix follows, from the storage's first write,
the rows where the flags and the ids mark different ends (O(k) per write, read in
batches). While they mark the same ends, the index reads the flags: a boolean
column is 8x smaller than int64 ids, and a cold build needs no comparison of
neighbouring rows. Where they disagree (collectors writing interleaved rows),
the ids are read and this is logged once. A key the user named, ``traj_key`` or
``end_key``, is read as named; when such a sampler is the first to read a storage,
the agreement stops being followed there, as nothing would use it.
:func:`boundary_source` tells which column a storage's last sample read.

Coherence: every write path of the storage records its rows (``extend``, ``add``,
``rb[idx] = ...``, ``storage.set``, ``storage[idx] = ...``, a second buffer on the
same storage); wholesale changes (``empty``, ``load_state_dict``, ``loads``,
``set_`` / ``update_`` / ``set_at_`` on the buffer, unpickling) make the index
rebuild. A per-storage write counter lives in shared memory, so a write from
another process sharing the storage (memmap or shared memory) is detected and the
index rebuilt; on TorchRL 0.14 the storage's own mutation revision is checked too.
Writing into the storage's tensors directly (``rb.storage._storage[...] = ...``)
cannot be seen, as with stock ``cache_values=True``.

Configurations the index does not handle fall back to the stock code for that
sample; :attr:`SliceBoundaryIndex.fallbacks` lists them (``status()`` prints the
list), and :func:`fallback_reason` says which applies to a sampler and a storage.
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Callable

from packaging.specifiers import SpecifierSet

from torchrl_fixes.patching import Replacement
from torchrl_fixes.registry import Fix, TargetChanged, stock_function
from torchrl_fixes.storage_boundaries import (
    _attach_boundary_state,
    _boundary_index_boundaries,
    _classes_fallback_reason,
    _mutation_revision,
    _record_reset,
    _record_write,
    boundary_source,
    fallback_reason,
)

try:
    from torchrl.data.replay_buffers.samplers import SliceSampler
    from torchrl.data.replay_buffers.storages import LazyMemmapStorage, Storage, TensorStorage
except ImportError as err:  # a TorchRL whose layout this fix does not know
    SliceSampler = TensorStorage = Storage = LazyMemmapStorage = None
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None

# The statements the upstream patch writes into TorchRL 0.14.1's methods, by file
# (under torchrl/data/replay_buffers/) and method: (before the method's own code,
# after it). The wrappers below run the same statements around the stock methods,
# and tests/test_upstream_patches.py checks that the two stay the same.
INLINE_HOOKS = {
    ("storages/tensor.py", "TensorStorage.__init__"): ((), ("_attach_boundary_state(self)",)),
    ("storages/tensor.py", "TensorStorage.set"): (
        ("revision = _mutation_revision(self)",),
        ("_record_write(self, cursor, revision)",),
    ),
    ("storages/tensor.py", "TensorStorage._empty"): ((), ("_record_reset(self)",)),
    ("storages/tensor.py", "TensorStorage.load_state_dict"): ((), ("_record_reset(self)",)),
    ("storages/tensor.py", "LazyMemmapStorage.load_state_dict"): ((), ("_record_reset(self)",)),
    ("storages/base.py", "Storage.loads"): ((), ("_record_reset(self)",)),
    ("replay_buffers/base.py", "ReplayBuffer.set_"): ((), ("_record_reset(self._storage)",)),
    ("replay_buffers/base.py", "ReplayBuffer.set_at_"): ((), ("_record_reset(self._storage)",)),
    ("replay_buffers/base.py", "ReplayBuffer.update_"): ((), ("_record_reset(self._storage)",)),
    ("samplers/slice.py", "SliceSampler.__init__"): (
        (),
        ("self._traj_key_named = traj_key is not None",),
    ),
    ("samplers/slice.py", "SliceSampler._get_stop_and_length"): (
        (
            "boundaries = _boundary_index_boundaries(self, storage)",
            "if boundaries is not None:\n    return boundaries",
        ),
        (),
    ),
}


def _storage_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _attach_boundary_state(self)

    return __init__


def _sampler_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self, *args, traj_key=None, **kwargs):
        original(self, *args, traj_key=traj_key, **kwargs)
        self._traj_key_named = traj_key is not None

    return __init__


def _storage_set(original: Callable) -> Callable:
    def set(self, cursor, data, *, set_cursor: bool = True):  # noqa: A001
        revision = _mutation_revision(self)
        result = original(self, cursor, data, set_cursor=set_cursor)
        _record_write(self, cursor, revision)
        return result

    return set


def _storage_reset(original: Callable) -> Callable:
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _record_reset(self)
        return result

    return method


def _buffer_reset(original: Callable) -> Callable:
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _record_reset(self._storage)
        return result

    return method


def _get_stop_and_length(original: Callable) -> Callable:
    @functools.wraps(original)
    def _get_stop_and_length(self, storage, fallback=True):
        boundaries = _boundary_index_boundaries(self, storage)
        if boundaries is not None:
            return boundaries
        return original(self, storage, fallback)

    return _get_stop_and_length


# Fingerprints of the stock SliceSampler._get_stop_and_length whose boundary
# recovery this fix reproduces: 0.11.1, 0.12.0, 0.13.3, 0.14.1.
_KNOWN_GET_STOP_AND_LENGTH = {
    "014781a9a9f0841f",
    "946f619295c7bae7",
    "2a1999fced561120",
    "9cdd720409a5079d",
}


class SliceBoundaryIndex(Fix):
    """Registry entry: see the module docstring."""

    name = "slice_boundary_index"
    summary = (
        "SliceSampler boundaries kept in a per-storage index updated on each write: "
        "cached by default, never stale, O(k) writes and O(batch + trajectories) samples"
    )
    upstream_issue = "https://github.com/pytorch/rl/issues/2669"
    torchrl_versions = SpecifierSet(">=0.11")
    targets = (
        "torchrl.data.replay_buffers.samplers.SliceSampler._get_stop_and_length / __init__",
        "torchrl.data.replay_buffers.storages.TensorStorage.__init__ / set / _empty / load_state_dict",
        "torchrl.data.replay_buffers.storages.LazyMemmapStorage.load_state_dict",
        "torchrl.data.replay_buffers.storages.Storage.loads",
        "torchrl.data.ReplayBuffer.set_ / set_at_ / update_ (where they exist)",
    )
    stock_classes = ("torchrl.data.replay_buffers.samplers.SliceSampler",)
    # The one list of what runs stock code: status(), the README and the upstream
    # patch's header show this text.
    fallbacks = (
        "storages other than TensorStorage over a TensorDict on CPU, ndim > 2, "
        "fragmented=True, compile=True, use_gpu, static ends/trajectories, "
        "subclasses that override the boundary recovery or a write path, "
        "boundary columns the stock code would reject or squeeze, fewer than 2 rows, "
        "storages shared between processes but built before the fix was applied, "
        "memmap storages pickled or copied outside torch.multiprocessing"
    )

    # Fingerprints of the stock boundary recovery this fix reproduces, 0.11.1 to 0.14.1.
    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(f"cannot import TorchRL's samplers and storages ({_IMPORT_ERROR})")
        from torchrl.data import ReplayBuffer

        stock = stock_function(SliceSampler, "_get_stop_and_length", _KNOWN_GET_STOP_AND_LENGTH)
        signature = inspect.signature(stock)
        if list(signature.parameters) != ["self", "storage", "fallback"]:
            raise TargetChanged("SliceSampler._get_stop_and_length has another signature")
        set_owner = next(k for k in TensorStorage.__mro__ if "set" in vars(k))
        if set_owner is not TensorStorage:
            raise TargetChanged("TensorStorage.set is not defined on TensorStorage")
        init = vars(SliceSampler).get("__init__")
        if "traj_key" not in inspect.signature(init).parameters:
            raise TargetChanged("SliceSampler.__init__ takes no traj_key")
        replacements = [
            Replacement(SliceSampler, "_get_stop_and_length", _get_stop_and_length(stock)),
            Replacement(SliceSampler, "__init__", _sampler_init(init)),
            Replacement(TensorStorage, "__init__", _storage_init(TensorStorage.__init__)),
            Replacement(TensorStorage, "set", _storage_set(vars(TensorStorage)["set"])),
        ]
        for cls, name in (
            (TensorStorage, "_empty"),
            (TensorStorage, "load_state_dict"),
            (LazyMemmapStorage, "load_state_dict"),
            (Storage, "loads"),
        ):
            method = vars(cls).get(name)
            if not isinstance(method, types.FunctionType):
                raise TargetChanged(f"{cls.__name__}.{name} is missing")
            replacements.append(Replacement(cls, name, _storage_reset(method)))
        for name in ("set_", "set_at_", "update_"):
            method = vars(ReplayBuffer).get(name)
            if isinstance(method, types.FunctionType):
                replacements.append(Replacement(ReplayBuffer, name, _buffer_reset(method)))
        _classes_fallback_reason.cache_clear()
        return replacements


__all__ = ["INLINE_HOOKS", "SliceBoundaryIndex", "boundary_source", "fallback_reason"]
