"""Slice boundary index: slice samplers stop scaling with the buffer.

Stock :class:`~torchrl.data.SliceSampler` (and ``SliceSamplerWithoutReplacement``,
``PrioritizedSliceSampler``) recovers the trajectory boundaries from the whole
storage on every sample: it reads the trajectory-id or done column of every
stored row, O(capacity). ``cache_values=True`` keeps them only until the next
write, so an online loop (write, sample, write, sample) pays the full cost at
every step.

With this fix the entry a ``TensorStorage`` has in TorchRL's boundary cache
(``_REPLAY_BOUNDARY_CACHE``, kept per storage mutation revision) holds one
:class:`TrajectoryBoundaries` per boundary signal a sampler reads from it (the
``traj_key`` ids, the ``end_key`` flags or the union of ``end_keys``), and a write
advances it instead of emptying it: ``TensorStorage.set`` records the rows it
touches, O(k); the next sample reads the signal of those rows only and splices the
result into the index, and draws its trajectories by rank from it
(:mod:`torchrl_fixes.fixes.slice_boundary_index.slice_sampling`): a sample costs O(batch) plus one count per
chunk of 1,024 trajectories. While a storage only grows and done flags end its
trajectories, the index also keeps them in a flat table
(:mod:`torchrl_fixes.fixes.slice_boundary_index.trajectory_table`) that the next sample appends the written rows
to and draws from directly. The boundaries are exactly those the stock code recovers, so the
samples are the same, and they are used whatever ``cache_values`` says: the flag
keeps its meaning (what is returned is never stale) and costs nothing.

:mod:`torchrl_fixes.fixes.slice_boundary_index.storage_boundaries` is the storage's entry,
:mod:`torchrl_fixes.fixes.slice_boundary_index.boundary_cache` carries it across writes and serves
``_ReplayBoundaryIndex`` (which the ``Sequence`` and ``SubgoalTriplet`` sample units
ask), and :mod:`torchrl_fixes.fixes.slice_boundary_index.slice_boundaries` decides what a sampler reads (the
upstream patches add them to TorchRL as they are); this module wraps TorchRL's
methods so that they run the statements of :data:`INLINE_HOOKS`, the lines the
upstream patch writes into them (:func:`~torchrl_fixes._core.patching.wrap_with_statements`),
and edits ``_ReplayBoundaryIndex.__init__`` as :data:`BOUNDARY_INDEX_EDITS` says
(:func:`~torchrl_fixes._core.patching.derive_from_source`). Before TorchRL 0.14, which has
no mutation revision and no boundary cache, :mod:`torchrl_fixes.fixes.slice_boundary_index.mutation_revision`
installs both first.

Done flags for ids, where a sampler names no trajectory key: which column is read
is :mod:`~torchrl_fixes.fixes.slice_boundary_index.slice_boundaries`' to say, and
the rows where the flags and the ids disagree are followed by
:mod:`~torchrl_fixes.fixes.slice_boundary_index.storage_boundaries` from the
storage's first write. When a sampler that names its key is the first to read a
storage, they stop being followed there, as nothing would use them.
:func:`boundary_source` tells which column a storage's last sample read.

Devices: a storage on an accelerator, and a sampler with ``use_gpu``, get the
same index. Only the boundary signal of the written rows is read (on the
storage's device), and only which rows end a trajectory comes to the host; the
boundaries, and the draws, are on the storage's device, where stock has them.

Coherence: ``TensorStorage.set`` records its rows (``extend``, ``add``,
``rb[idx] = ...``, ``storage.set``, ``storage[idx] = ...``, a second buffer on the
same storage); any other mutation the storage counts (``empty``,
``load_state_dict``, ``loads``, ``set_`` / ``update_`` / ``set_at_`` on the buffer,
a write from another process sharing the storage, a compiled write) moves the
revision without recording rows, and the index is rebuilt at the next sample.
Writing into the storage's tensors directly (``rb.storage._storage[...] = ...``)
cannot be seen, as with stock ``cache_values=True``.

Configurations the index does not handle fall back to the stock code for that
sample; :attr:`SliceBoundaryIndex.fallbacks` lists them (``status()`` prints the
list), and :func:`fallback_reason` says which applies to a sampler and a storage.
"""
from __future__ import annotations

import inspect

from packaging.specifiers import SpecifierSet

from torchrl_fixes.fixes.slice_boundary_index import (
    boundary_cache,
    mutation_revision,
    slice_boundaries,
    slice_sampling,
    storage_boundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.mutation_revision import (
    MUTATION_REVISION_HOOKS,
)
from torchrl_fixes._core.patching import (
    defining_class,
    Replacement,
    derive_from_source,
    wrap_with_statements,
)
from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.registry import Fix, Target
from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
    _classes_fallback_reason,
    boundary_source,
)

try:
    from torchrl.data.replay_buffers.samplers import SliceSampler
    from torchrl.data.replay_buffers.storages import (
        LazyMemmapStorage,
        Storage,
        TensorStorage,
    )
except ImportError as err:  # a TorchRL whose layout this fix does not know
    SliceSampler = TensorStorage = Storage = LazyMemmapStorage = None
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None
try:
    from torchrl.data.replay_buffers.utils import _ReplayBoundaryIndex
except ImportError:  # TorchRL before 0.14
    _ReplayBoundaryIndex = None

# The statements the upstream patch writes into TorchRL's methods, by file (under
# torchrl/data/replay_buffers/) and method: (before the method's own code, after it).
# The runtime fix wraps each stock method with the same statements
# (patching.wrap_with_statements), so the two are the same code.
INLINE_HOOKS = {
    ("storages/tensor.py", "TensorStorage.set"): (
        ("revision = _revision_before_write(self)",),
        ("_record_write(self, cursor, revision)",),
    ),
    ("storages/base.py", "Storage.__getstate__"): (("_record_copy(self)",), ()),
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

# SliceSampler.sample draws its trajectories from the index's order instead of
# listing them all (the upstream series carries this as a patch of its own).
SAMPLE_HOOKS = {
    ("samplers/slice.py", "SliceSampler.sample"): (
        (
            "sampled = _sample_from_index(self, storage, batch_size)",
            "if sampled is not None:\n    return sampled",
        ),
        (),
    ),
}

# The modules whose names the statements use: the boundary cache carries a storage's
# entry across its writes, samplers read it and draw from it; before TorchRL 0.14,
# the mutation revision is backported.
HOOK_MODULES = (
    boundary_cache,
    storage_boundaries,
    slice_boundaries,
    slice_sampling,
    mutation_revision,
)


def hook_module(statements) -> object:
    """The one module of :data:`HOOK_MODULES` that defines every function ``statements`` call."""
    import ast

    called = {
        node.func.id
        for statement in statements
        for node in ast.walk(ast.parse(statement))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    for module in HOOK_MODULES:
        if all(hasattr(module, name) for name in called):
            return module
    raise TargetChanged(f"no one module defines {sorted(called)}")


# Where _ReplayBoundaryIndex finds nothing cached (the sample units Sequence and
# SubgoalTriplet always ask it), the storage's index serves the boundaries: the
# source edits (old, new) of its __init__, which the upstream patch makes to the
# same text (patching.derive_from_source; the method's source dedented).
BOUNDARY_INDEX_EDITS = {
    ("utils.py", "_ReplayBoundaryIndex.__init__"): (
        (
            "            cached = storage_cache[1].get(cache_key)\n",
            "            cached = storage_cache[1].get(cache_key)\n"
            "        if cached is None and end_to_start_stop is None:\n"
            "            cached = _indexed_boundaries(storage, source, device)\n",
        ),
    ),
}


class SliceBoundaryIndex(Fix):
    """Registry entry: see the module docstring."""

    name = "slice_boundary_index"
    summary = (
        "SliceSampler boundaries kept in a per-storage index updated on each write: "
        "cached by default, never stale, O(k) writes and O(batch) samples"
    )
    upstream_issue = "https://github.com/pytorch/rl/issues/2669"
    torchrl_versions = SpecifierSet(">=0.8")
    implements = (
        Target(
            "torchrl.data.replay_buffers.samplers.SliceSampler",
            "_get_stop_and_length",
            {
                "014781a9a9f0841f": "0.8.1 to 0.11.1",
                "946f619295c7bae7": "0.12.0",
                "2a1999fced561120": "0.13.3",
                "9cdd720409a5079d": "0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="wrapped with SAMPLE_HOOKS: the storage's index answers before "
            "the whole-storage recovery, which it reproduces",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.SliceSampler",
            "sample",
            {
                "2a9b7ed4cbb7f5a6": "0.8.1 to 0.13.3",
                "7ec63e42812c4eef": "0.14.1",
                "4f5c124e99037786": "torchrl-nightly 2026.10.27",
            },
            installs="wrapped with SAMPLE_HOOKS: slice_sampling makes its draw by rank "
            "in the index",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.SliceSampler",
            "_sample_slices",
            {
                "59d22b6902c449ff": "0.8.1 to 0.12.0",
                "d2fa288a4a89b17c": "0.13.3, 0.14.1",
                "663b6d9541cba49e": "torchrl-nightly 2026.10.27",
            },
            installs="relied on unchanged: it gets the drawn trajectories",
        ),
        Target(
            "torchrl.data.replay_buffers.utils._ReplayBoundaryIndex",
            "__init__",
            {"b68b83d4c69b22a8": "0.14.1, torchrl-nightly 2026.10.27 (new in 0.14)"},
            installs="its own source edited (BOUNDARY_INDEX_EDITS): the storage's index "
            "serves where nothing is cached",
            optional=True,
        ),
        # The write paths are wrapped with INLINE_HOOKS' statements, whatever their
        # code; before 0.14 the mutation revision is backported too
        # (mutation_revision.MUTATION_REVISION_HOOKS).
    )
    stock_classes = ("torchrl.data.replay_buffers.samplers.SliceSampler",)
    # What runs stock code, as listed beside the checks that decide it: status(), the
    # README and the upstream patch's header show this text.
    fallbacks = ", ".join(slice_boundaries.FALLBACKS)
    release_fallbacks = (
        "before TorchRL 0.14 (no mutation revision to see every write by): "
        + ", ".join(mutation_revision.FALLBACKS)
    )

    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(
                f"cannot import TorchRL's samplers and storages ({_IMPORT_ERROR})"
            )
        from torchrl.data import ReplayBuffer

        stock = {target.path: target.stock() for target in self.implements}
        stop_and_length = stock["SliceSampler._get_stop_and_length"]
        signature = inspect.signature(stop_and_length)
        if list(signature.parameters) != ["self", "storage", "fallback"]:
            raise TargetChanged(
                "SliceSampler._get_stop_and_length has another signature"
            )
        if defining_class(TensorStorage, "set") is not TensorStorage:
            raise TargetChanged("TensorStorage.set is not defined on TensorStorage")
        if (
            "traj_key"
            not in inspect.signature(vars(SliceSampler)["__init__"]).parameters
        ):
            raise TargetChanged("SliceSampler.__init__ takes no traj_key")
        owners = {
            cls.__name__: cls
            for cls in (
                SliceSampler,
                TensorStorage,
                LazyMemmapStorage,
                Storage,
                ReplayBuffer,
            )
        }
        replacements = []
        for (_, qualname), (before, after) in _hooks().items():
            owner_name, name = qualname.split(".")
            owner = owners[owner_name]
            method = vars(owner).get(name)
            # TensorStorage.set is a callable object (torch-version dispatch), not a function
            if not callable(method) or isinstance(method, (staticmethod, classmethod)):
                if owner is ReplayBuffer:
                    continue  # set_ / set_at_ / update_ exist from 0.13 on
                raise TargetChanged(f"{qualname} is missing")
            namespace = vars(hook_module((*before, *after)))
            replacements.append(
                Replacement(
                    owner, name, wrap_with_statements(method, before, after, namespace)
                )
            )
        if _backports_mutation_revision():
            replacements += [
                Replacement(
                    Storage,
                    "_mutation_revision",
                    property(mutation_revision._mutation_revision),
                ),
                Replacement(
                    Storage,
                    "_bump_mutation_revision",
                    mutation_revision._bump_mutation_revision,
                ),
                Replacement(
                    Storage,
                    "_last_cursor_index",
                    property(mutation_revision._last_cursor_index),
                ),
            ]
        replacements += _boundary_index_replacements(
            stock["_ReplayBoundaryIndex.__init__"]
        )
        _classes_fallback_reason.cache_clear()
        slice_sampling._classes_sampling_reason.cache_clear()
        return replacements


def _backports_mutation_revision() -> bool:
    """Whether this TorchRL predates the storage mutation revision (before 0.14)."""
    revision = vars(Storage).get("_mutation_revision")
    return (
        revision is None
        or getattr(revision, "fget", None) is mutation_revision._mutation_revision
    )


def _hooks() -> dict:
    """INLINE_HOOKS and SAMPLE_HOOKS, with the mutation revision's bumps around them
    before TorchRL 0.14."""
    inline = {**INLINE_HOOKS, **SAMPLE_HOOKS}
    if not _backports_mutation_revision():
        return inline
    hooks = dict(MUTATION_REVISION_HOOKS)
    for key, (before, after) in inline.items():
        bump_before, bump_after = hooks.get(key, ((), ()))
        # the revision moves with the write, before the write's rows are recorded
        hooks[key] = ((*before, *bump_before), (*bump_after, *after))
    return hooks


def _boundary_index_replacements(stock_init) -> list[Replacement]:
    """``_ReplayBoundaryIndex`` reading the storage's index, where TorchRL has it (0.14 on).

    ``stock_init`` is its checked ``__init__``, ``None`` before 0.14.
    """
    if stock_init is None:
        return []
    (((_, qualname), edits),) = BOUNDARY_INDEX_EDITS.items()
    new = derive_from_source(
        stock_init, edits, _indexed_boundaries=boundary_cache._indexed_boundaries
    )
    return [Replacement(_ReplayBoundaryIndex, qualname.split(".")[1], new)]


def fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` samples ``storage`` with stock boundary recovery, or ``None`` if it does not.

    :func:`torchrl_fixes.fixes.slice_boundary_index.slice_boundaries.fallback_reason` (its examples show both
    answers), and before TorchRL 0.14 also why the backported mutation revision could
    miss writes to ``storage`` (:func:`torchrl_fixes.fixes.slice_boundary_index.mutation_revision.unseen_writes_reason`).
    """
    reason = slice_boundaries.fallback_reason(sampler, storage)
    if reason is None and _IMPORT_ERROR is None and _backports_mutation_revision():
        reason = mutation_revision.unseen_writes_reason(storage)
    return reason


__all__ = ["INLINE_HOOKS", "SliceBoundaryIndex", "boundary_source", "fallback_reason"]
