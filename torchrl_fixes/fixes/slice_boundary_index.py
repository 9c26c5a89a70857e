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
lines the upstream patch writes into them (:func:`~torchrl_fixes.patching.wrap_with_statements`).

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

import inspect

from packaging.specifiers import SpecifierSet

from torchrl_fixes import storage_boundaries
from torchrl_fixes.patching import Replacement, wrap_with_statements
from torchrl_fixes.registry import Fix, TargetChanged, stock_function
from torchrl_fixes.storage_boundaries import (
    _classes_fallback_reason,
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

# The statements the upstream patch writes into TorchRL's methods, by file (under
# torchrl/data/replay_buffers/) and method: (before the method's own code, after it).
# The runtime fix wraps each stock method with the same statements
# (patching.wrap_with_statements), so the two are the same code.
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


# TorchRL's sample units (Sequence, SubgoalTriplet; TorchRL main, not in a release yet)
# read episode boundaries through one static method: it first puts the index's
# boundaries in the cache it reads. Same shape as INLINE_HOOKS.
SAMPLE_UNIT_HOOKS = {
    ("sample_units.py", "SampleUnit._episode_boundaries"): (
        ("_seed_episode_boundaries(storage, done_key, device)",),
        (),
    ),
}
# Fingerprints of the stock SampleUnit._episode_boundaries: torchrl-nightly 2026.10.27.
_KNOWN_EPISODE_BOUNDARIES = {"01892c957be6fac6"}

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
        "memmap storages pickled or copied outside torch.multiprocessing, "
        "compilable=True storages before TorchRL 0.14 (no mutation revision to see "
        "compiled writes by)"
    )

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
        if "traj_key" not in inspect.signature(vars(SliceSampler)["__init__"]).parameters:
            raise TargetChanged("SliceSampler.__init__ takes no traj_key")
        owners = {
            cls.__name__: cls
            for cls in (SliceSampler, TensorStorage, LazyMemmapStorage, Storage, ReplayBuffer)
        }
        replacements = []
        for (_, qualname), (before, after) in INLINE_HOOKS.items():
            owner_name, name = qualname.split(".")
            owner = owners[owner_name]
            method = vars(owner).get(name)
            # TensorStorage.set is a callable object (torch-version dispatch), not a function
            if not callable(method) or isinstance(method, (staticmethod, classmethod)):
                if owner is ReplayBuffer:
                    continue  # set_ / set_at_ / update_ exist from 0.13 on
                raise TargetChanged(f"{qualname} is missing")
            replacements.append(
                Replacement(owner, name, wrap_with_statements(method, before, after, vars(storage_boundaries)))
            )
        replacements += _sample_unit_replacements()
        _classes_fallback_reason.cache_clear()
        return replacements


def _sample_unit_replacements() -> list[Replacement]:
    """The sample units' boundary hook, where TorchRL has sample units."""
    try:
        from torchrl.data.replay_buffers.sample_units import SampleUnit
    except ImportError:
        return []  # releases before 0.14
    replacements = []
    for (_, qualname), (before, after) in SAMPLE_UNIT_HOOKS.items():
        name = qualname.split(".")[1]
        if name not in vars(SampleUnit):
            continue  # 0.14's sample units read no episode boundaries
        stock = stock_function(SampleUnit, name, _KNOWN_EPISODE_BOUNDARIES)
        wrapper = wrap_with_statements(stock, before, after, vars(storage_boundaries))
        replacements.append(Replacement(SampleUnit, name, staticmethod(wrapper)))
    return replacements


__all__ = ["INLINE_HOOKS", "SliceBoundaryIndex", "boundary_source", "fallback_reason"]
