"""Slice boundary index: slice samplers stop scaling with the buffer.

Stock :class:`~torchrl.data.SliceSampler` (and ``SliceSamplerWithoutReplacement``,
``PrioritizedSliceSampler``) recovers the trajectory boundaries from the whole
storage at every sample: it reads the trajectory-id or done column of every stored
row, ``O(stored rows)``. ``cache_values=True`` keeps them only until the next
write, so an online loop (write, sample, write, sample) pays the full cost at every
step.

With this fix a :class:`~torchrl.data.replay_buffers.TensorStorage` keeps a
trajectory index from the first slice sample on
(:mod:`~.storage_index`, over :mod:`~.trajectory_index`): ``TensorStorage.set``
records the cursor of each write, and the next sample reads the boundary signal of
those rows only. ``SliceSampler.sample`` draws its trajectories from the index with
stock's own draw and hands them to the sampler's code (:mod:`~.slice_sampling`):
``O(batch)`` per sample plus ``O(k)`` per ``k`` rows written.
``SliceSamplerWithoutReplacement.sample`` takes its trajectories from its own
permutation of the index's (:mod:`~.slice_without_replacement`), slices of
different lengths (a span, ``strict_length=False``) are indexed at once
(:mod:`~.slice_lengths`), and ``PrioritizedSliceSampler.sample`` draws from a sum
tree of its eligible starts that the writes keep (:mod:`~.prioritized_slices`).
``SliceSampler._get_stop_and_length`` is served from the same index. The
boundaries are exactly stock's whatever ``cache_values`` says, and never stale: any
change the index did not record (another mutation path, another process, an
in-place write through a view of a column) moves the storage's mutation revision or
a column's version counter, and the index is rebuilt. Writes torch does not count
(through ``.data`` or numpy views, or to shared memory from a process that does not
go through TorchRL) are not seen.

Configurations the index does not read run the stock code; ``status()`` prints
them (``SliceBoundaryIndex.fallbacks``). The hooks below are what the upstream
series writes into TorchRL's methods, as plain functions around the stock methods.
Before TorchRL 0.14, which has no mutation revision, :mod:`~.mutation_revision`
installs one first.
"""
from __future__ import annotations

import inspect

import torch
from packaging.specifiers import SpecifierSet

from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import (
    defining_class,
    derive_from_source,
    Replacement,
    SourceEdits,
    wrap,
)
from torchrl_fixes._core.registry import Fix, Target
from torchrl_fixes.fixes.slice_boundary_index import mutation_revision
from torchrl_fixes.fixes.slice_boundary_index.slice_lengths import (
    _slices_of_lengths,
    TENSOR_SLICES_EDITS,
)
from torchrl_fixes.fixes.slice_boundary_index.storage_index import (
    _version,
    existing_index,
    storage_state,
    Unsupported,
)
from torchrl_fixes.fixes.slice_boundary_index.write_journal import (
    capacity_of,
    journal_of,
)

try:
    from torchrl.data.replay_buffers import storages
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        PrioritizedSliceSampler,
        SliceSampler,
        SliceSamplerWithoutReplacement,
    )
    from torchrl.data.replay_buffers.storages import Storage, TensorStorage

    # these import TorchRL's storages too
    from torchrl_fixes.fixes.slice_boundary_index.prioritized_slices import (
        _sample_eligible_starts,
        prioritized_sample_edits,
        SLICE_STOP_EDITS,
    )
    from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
        _boundary_signal,
        _fallback_reason,
        _stop_and_length_from_index,
    )
    from torchrl_fixes.fixes.slice_boundary_index.slice_sampling import (
        _sample_from_index,
    )
    from torchrl_fixes.fixes.slice_boundary_index.slice_without_replacement import (
        _sample_without_replacement_from_index,
    )
except ImportError as err:  # a TorchRL whose layout this fix does not know
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None


def record_write(wrapped, instance, args, kwargs):
    """``TensorStorage.set``, recording the rows it writes in the storage's journal."""
    if torch.compiler.is_compiling():
        return wrapped(*args, **kwargs)
    index = existing_index(instance)
    versions = None if index is None else index.begin_write()
    journal = journal_of(instance)
    with journal.held() as held:  # the write and its record, as one for every reader
        result = wrapped(*args, **kwargs)
        if held:
            cursor = args[0] if args else kwargs["cursor"]
            journal.record(instance._mutation_revision, cursor, capacity_of(instance))
    if index is not None:
        index.wrote(versions)
    return result


def attach_journal(wrapped, instance, args, kwargs):
    """``TensorStorage.__init__``, giving the storage its write journal before it is shared."""
    wrapped(*args, **kwargs)
    journal_of(instance)


def mark_update(self, index) -> None:
    """Tells the storage that the rows at ``index`` changed outside :meth:`set`.

    Writes through ``.data`` or a numpy view, or in place in another process, move
    no version counter here and no mutation revision, so no trajectory index sees
    them. After such a write, this moves the revision and has every slice sampler of
    the storage, in this process or another it is shared with, read those rows again.

    Args:
        index (int, slice, sequence, array or tensor): the rows, along the first dim.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100), sampler=SliceSampler(
        ...     num_slices=2, traj_key="episode"), batch_size=8)
        >>> _ = rb.extend(TensorDict({"episode": torch.arange(20) // 10}, [20]))
        >>> _ = rb.sample()
        >>> rb.storage._storage["episode"].data[10:] = 0  # unseen: no version moves
        >>> rb.storage.mark_update(slice(10, 20))
        >>> rb.sampler._get_stop_and_length(rb.storage)[1]  # one episode now
        tensor([[19]])
    """
    journal = journal_of(self)
    with journal.held() as held:
        self._bump_mutation_revision()
        if held:
            journal.record(self._mutation_revision, index, capacity_of(self))


def take_boundary_index(wrapped, instance, args, kwargs):
    """``__init__`` of the slice samplers, taking ``boundary_index=False``: stock's recovery."""
    chosen = kwargs.pop("boundary_index", None)
    if chosen is not None and not isinstance(chosen, bool):
        raise TypeError(f"boundary_index must be True or False, got {chosen!r}")
    wrapped(*args, **kwargs)
    if chosen is not None:
        instance._boundary_index = chosen


def state_without_index(wrapped, instance, args, kwargs):
    """``Storage.__getstate__``: the trajectory index is the storage's own, never pickled."""
    state = wrapped(*args, **kwargs)
    state.pop("_trajectory_index", None)
    return state


def note_default_keys(wrapped, instance, args, kwargs):
    """``SliceSampler.__init__``, noting whether the sampler names a boundary key."""
    wrapped(*args, **kwargs)
    named = ("traj_key", "end_key", "end_keys")
    instance._default_boundary_keys = all(kwargs.get(key) is None for key in named)


def stop_and_length_from_index(wrapped, instance, args, kwargs):
    """``SliceSampler._get_stop_and_length``, answered by the storage's index first."""
    storage = args[0] if args else kwargs["storage"]
    found = None
    if _sees_every_write(storage):
        found = _stop_and_length_from_index(instance, storage)
    return wrapped(*args, **kwargs) if found is None else found


def sample_from_index(wrapped, instance, args, kwargs):
    """``SliceSampler.sample``, drawn from the storage's index first."""
    return _drawn_from_index(_sample_from_index, wrapped, instance, args, kwargs)


def sample_without_replacement_from_index(wrapped, instance, args, kwargs):
    """``SliceSamplerWithoutReplacement.sample``, drawn from the storage's index first."""
    return _drawn_from_index(
        _sample_without_replacement_from_index, wrapped, instance, args, kwargs
    )


def sample_eligible_starts(sampler, storage, batch_size: int, seq_length: int):
    """The starts drawn from the sampler's eligible starts (:func:`~.prioritized_slices._sample_eligible_starts`), where the storage's revision follows every write."""
    if not _sees_every_write(storage):
        return None
    return _sample_eligible_starts(sampler, storage, batch_size, seq_length)


def note_priorities_set(wrapped, instance, args, kwargs):
    """``PrioritizedSampler.update_priority``, noting its rows for the sampler's eligible starts."""
    result = wrapped(*args, **kwargs)
    starts = instance.__dict__.get("_eligible_starts")
    if starts is not None:
        starts.priorities_set(args[0] if args else kwargs["index"])
    return result


def forget_eligible_starts(wrapped, instance, args, kwargs):
    """``PrioritizedSliceSampler.loads``: the priorities it writes in place are read anew."""
    instance.__dict__.pop("_eligible_starts", None)
    return wrapped(*args, **kwargs)


def state_without_eligible_starts(wrapped, instance, args, kwargs):
    """``PrioritizedSliceSampler.__getstate__``: the eligible starts are the sampler's own, never pickled."""
    state = wrapped(*args, **kwargs)
    state.pop("_eligible_starts", None)
    return state


def _drawn_from_index(draw, wrapped, instance, args, kwargs):
    """What ``draw`` samples from the storage's index, or the stock ``sample`` where it cannot."""
    storage, batch_size = (
        *args,
        *(kwargs[k] for k in ("storage", "batch_size")[len(args) :]),
    )
    sampled = None
    if _sees_every_write(storage):
        sampled = draw(instance, storage, batch_size)
    return wrapped(*args, **kwargs) if sampled is None else sampled


def _sees_every_write(storage) -> bool:
    """Whether the storage's revision follows every write (before 0.14, see mutation_revision)."""
    return not (
        _backports_mutation_revision()
        and mutation_revision.unseen_writes_reason(storage)
    )


# The configurations whose boundaries the stock code recovers, as
# slice_boundaries._fallback_reason and the index's own checks decide them.
FALLBACKS = (
    "boundary_index=False (chosen)",
    "storages other than a TensorStorage over a TensorDict of one or two batch dims",
    "fewer than two stored rows",
    "fragmented=True",
    "static ends or trajectories",
    "samplers that override how the boundaries are found or the slices drawn",
    "a use_gpu device this machine cannot use (which raises, as before)",
    "boundary columns the stock recovery would reject or reshape, on different "
    "devices, made anew at each read (a lazy stack), or made in inference mode "
    "(no version counter)",
)


class SliceBoundaryIndex(Fix):
    """Registry entry: see the module docstring."""

    name = "slice_boundary_index"
    summary = (
        "SliceSampler boundaries kept in a per-storage index that writes advance: "
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
            installs="wrapped: the storage's index answers first, with what the stock "
            "recovery finds",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.SliceSampler",
            "sample",
            {
                "2a9b7ed4cbb7f5a6": "0.8.1 to 0.13.3",
                "7ec63e42812c4eef": "0.14.1",
                "4f5c124e99037786": "torchrl-nightly 2026.10.27",
            },
            installs="wrapped: the same draw, made in the storage's index",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.SliceSamplerWithoutReplacement",
            "sample",
            {
                "8219fd3244f97320": "0.8.1 to 0.14.1",
                "c03dd910716be9ab": "torchrl-nightly 2026.10.27",
            },
            installs="wrapped: the same permutation, its trajectories found in the "
            "storage's index",
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
            "torchrl.data.replay_buffers.samplers.SliceSampler",
            "_tensor_slices_from_startend",
            {"17bb2e739b8eedcd": "0.8.1 to 0.14.1, torchrl-nightly 2026.10.27"},
            installs="its own source with slices of different lengths indexed at "
            "once (TENSOR_SLICES_EDITS)",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.PrioritizedSliceSampler",
            "sample",
            {
                "e00622f608a4f293": "0.8.1 to 0.10.1",
                "3575e5dafe82cf9b": "0.11.1 to 0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="its own source, drawing from the sampler's eligible starts "
            "where they apply, each shorter slice ending at its own trajectory's stop "
            "(prioritized_sample_edits, SLICE_STOP_EDITS); single_gather's edits too",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.PrioritizedSliceSampler",
            "_preceding_stop_idx",
            {"87b0bb7961ad1a19": "0.8.1 to 0.14.1, torchrl-nightly 2026.10.27"},
            installs="relied on unchanged: the eligible starts exclude the rows it lists",
        ),
        Target(
            "torchrl.data.replay_buffers.samplers.PrioritizedSampler",
            "sample",
            {
                "7543932efa57f55f": "0.8.1 to 0.10.1",
                "ba8a0fb9be876813": "0.11.1, 0.12.0",
                "1605ceff241a0943": "0.13.3 to 0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="relied on unchanged: it draws the eligible starts, from their "
            "sum tree",
        ),
        # TensorStorage.set, Storage.__getstate__, SliceSampler.__init__,
        # PrioritizedSampler.update_priority, PrioritizedSliceSampler.loads and
        # PrioritizedSliceSampler.__getstate__ are wrapped whatever their code;
        # before 0.14 the mutation revision is backported too
        # (mutation_revision.BUMPED).
    )
    stock_classes = ("torchrl.data.replay_buffers.samplers.SliceSampler",)
    # What runs stock code, as listed beside the checks that decide it: status(), the
    # docs (docs/fixes.md) and the upstream patch's header show this text.
    fallbacks = ", ".join(FALLBACKS)
    release_fallbacks = "before TorchRL 0.14: " + ", ".join(mutation_revision.FALLBACKS)
    limits = (
        "a process that writes the storage without the fixes is seen through the storage's "
        "revision, and the index is rebuilt from the whole storage after each of its writes "
        "(apply the fixes there: import torchrl_fixes, or start it with torchrl-fixes run); "
        "writes through .data or numpy, or in place in another process, are not seen until "
        "storage.mark_update(rows) tells the index, and boundary_index=False keeps a "
        "sampler on stock's recovery from the whole storage at every sample"
    )

    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(
                f"cannot import TorchRL's samplers and storages ({_IMPORT_ERROR})"
            )
        stock = {target.path: target.stock() for target in self.implements}
        if defining_class(TensorStorage, "set") is not TensorStorage:
            raise TargetChanged("TensorStorage.set is not defined on TensorStorage")
        init = vars(SliceSampler)["__init__"]
        if "traj_key" not in inspect.signature(init).parameters:
            raise TargetChanged("SliceSampler.__init__ takes no traj_key")
        hooks = [
            (TensorStorage, "set", record_write),
            (TensorStorage, "__init__", attach_journal),
            (Storage, "__getstate__", state_without_index),
            (SliceSampler, "__init__", note_default_keys),
            (SliceSampler, "__init__", take_boundary_index),
            (SliceSamplerWithoutReplacement, "__init__", take_boundary_index),
            (PrioritizedSliceSampler, "__init__", take_boundary_index),
            (SliceSampler, "_get_stop_and_length", stop_and_length_from_index),
            (SliceSampler, "sample", sample_from_index),
            (
                SliceSamplerWithoutReplacement,
                "sample",
                sample_without_replacement_from_index,
            ),
            (PrioritizedSampler, "update_priority", note_priorities_set),
            (PrioritizedSliceSampler, "loads", forget_eligible_starts),
            (PrioritizedSliceSampler, "__getstate__", state_without_eligible_starts),
        ]
        if _backports_mutation_revision():
            # the revision moves once set has written, before its rows are recorded
            hooks[0:0] = [(TensorStorage, "set", mutation_revision.bump_after)]
            hooks += [(TensorStorage, "__init__", mutation_revision.attach_count)]
            hooks += [
                (getattr(storages, owner), name, mutation_revision.bump_after)
                for owner, name in mutation_revision.BUMPED
            ]
        if "mark_update" in vars(TensorStorage):
            raise TargetChanged("TensorStorage.mark_update exists already")
        methods = {}
        for owner, name, hook in hooks:
            method = methods.get((owner, name), vars(owner).get(name))
            if method is None:
                raise TargetChanged(f"{owner.__name__}.{name} is missing")
            methods[owner, name] = wrap(method, hook)
        replacements = [Replacement(*key, method) for key, method in methods.items()]
        replacements.append(Replacement(TensorStorage, "mark_update", mark_update))
        slices = derive_from_source(
            stock["SliceSampler._tensor_slices_from_startend"],
            TENSOR_SLICES_EDITS,
            _slices_of_lengths=_slices_of_lengths,
        )
        replacements.append(
            Replacement(SliceSampler, "_tensor_slices_from_startend", slices)
        )
        prioritized = stock["PrioritizedSliceSampler.sample"]
        replacements.append(
            SourceEdits(
                PrioritizedSliceSampler,
                "sample",
                prioritized,
                prioritized_sample_edits(prioritized) + SLICE_STOP_EDITS,
                {"_sample_eligible_starts": sample_eligible_starts},
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
        return replacements


def _backports_mutation_revision() -> bool:
    """Whether this TorchRL predates the storage mutation revision (before 0.14)."""
    revision = vars(Storage).get("_mutation_revision")
    return (
        revision is None
        or getattr(revision, "fget", None) is mutation_revision._mutation_revision
    )


def fallback_reason(sampler, storage) -> str | None:
    """Why ``sampler`` samples ``storage`` with stock boundary recovery, or ``None`` if it does not.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ListStorage, SliceSampler
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(4), TensorDict({"episode": torch.zeros(4)}, [4]))
        >>> print(fallback_reason(SliceSampler(num_slices=2, traj_key="episode"), storage))
        None
        >>> fallback_reason(SliceSampler(num_slices=2, traj_key="episode"), ListStorage(10))
        'storage is not a TensorStorage'
    """
    if _IMPORT_ERROR is not None:
        return f"cannot import TorchRL's samplers and storages ({_IMPORT_ERROR})"
    reason = _fallback_reason(sampler, storage)
    if reason is None:
        try:
            storage_state(storage)
            signal = _boundary_signal(sampler, storage)
            for column in signal.columns(storage._storage, storage.ndim):
                _version(column)
        except Unsupported as err:
            reason = str(err)
    if reason is None and _backports_mutation_revision():
        reason = mutation_revision.unseen_writes_reason(storage)
    return reason


def boundary_source(storage) -> tuple[str, tuple] | None:
    """What the last slice sample of ``storage`` read its trajectory boundaries from.

    ``("trajectory", key)`` for trajectory ids, ``("end", key)`` for end flags (a
    tuple of keys for a union of ``end_keys``), or
    ``None`` where no sampler has read the storage's index since its last rebuild.
    A sampler that names no key reads the done flags ``("next", "done")`` instead of
    the ids while both end the same trajectories.

    Examples:
        >>> import torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
        >>> step = torch.arange(100)
        >>> rb = ReplayBuffer(
        ...     storage=LazyTensorStorage(1000), sampler=SliceSampler(num_slices=4), batch_size=16)
        >>> _ = rb.extend(TensorDict(
        ...     {"episode": step // 10, ("next", "done"): (step % 10 == 9).unsqueeze(-1)}, [100]))
        >>> _ = rb.sample()
        >>> boundary_source(rb.storage)
        ('end', ('next', 'done'))
    """
    entry = getattr(storage, "__dict__", {}).get("_trajectory_index")
    signal = None if entry is None else entry.last_signal
    if signal is None:
        return None
    return signal.kind, signal.keys[0] if len(signal.keys) == 1 else signal.keys


__all__ = ["FALLBACKS", "SliceBoundaryIndex", "boundary_source", "fallback_reason"]
