"""Single gather: the slice samplers read only the entries they need from the sampled rows.

To build its info (truncated / done / terminated / is_init), stock
:class:`~torchrl.data.replay_buffers.SliceSampler` reads ``storage[index]``: every
entry of every sampled row is gathered, and the replay buffer then gathers them
all again to return the sample. On image data a slice sample costs 1.7-4.8x a
random sample of the same size (TorchRL 0.10.1 to 0.14.1, and main).
:class:`~torchrl.data.replay_buffers.PrioritizedSliceSampler` does the same, and
:class:`~torchrl.data.replay_buffers.SliceSamplerWithoutReplacement` inherits it.
TorchRL main (torchrl-nightly 2026.10.27) adds an ``output_layout="batch_time"``
layout, whose info (slice_end, mask, is_init) is again built from the full rows.
:class:`~torchrl.data.replay_buffers.samplers.StreamingSliceSampler` (0.14 on)
also gathers every entry of the rows of each write to find its windows.

With this fix the samplers read only the entries they use (done, terminated and
the init key when the storage has them) from a
:class:`~torchrl.data.replay_buffers.TensorStorage` that holds a
:class:`~tensordict.TensorDict`; the buffer's gather is the only full read. The
info is exactly what stock builds. The storages that keep the stock
``storage[index]`` are listed in :attr:`SingleGather.fallbacks` (``status()``
prints the list).

TorchRL 0.14 and main build the info in ``SliceSampler._finalize_index`` (main's
adds the batch_time layout in front of 0.14's code), 0.8 to 0.13 in
``SliceSampler._get_index``: the fix is the installed method's own source with its
reads of full rows edited (:func:`~torchrl_fixes._core.patching.derive_from_source`; the
edits of each release are chosen by the fingerprint of the installed code), as is
``StreamingSliceSampler.mark_update``. ``PrioritizedSliceSampler.sample``, the same in
every release, is TorchRL's function with its one read changed.
"""
from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import torch
from packaging.specifiers import SpecifierSet
from tensordict import TensorDict, unravel_key
from tensordict.utils import NestedKey

from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import derive_from_source, Replacement
from torchrl_fixes._core.registry import Fix, stock_function
from torchrl_fixes._core.source_fingerprint import source_fingerprint

try:
    from torchrl._utils import _replace_last
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSliceSampler,
        SliceSampler,
    )
    from torchrl.data.replay_buffers.storages import (
        LazyMemmapStorage,
        LazyTensorStorage,
        Storage,
        TensorStorage,
    )
except ImportError as err:  # a TorchRL whose layout this fix does not know
    _IMPORT_ERROR = err
else:
    _IMPORT_ERROR = None
try:  # TorchRL 0.14 on
    from torchrl.data.replay_buffers.samplers import StreamingSliceSampler
except ImportError:
    StreamingSliceSampler = None


def _reads_tensordict(storage: Storage) -> bool:
    """Whether ``storage[index]`` indexes a TensorDict the way ``TensorStorage.get`` does.

    True for TorchRL's tensor storages (:class:`~torchrl.data.replay_buffers.TensorStorage`,
    :class:`~torchrl.data.replay_buffers.LazyTensorStorage`,
    :class:`~torchrl.data.replay_buffers.LazyMemmapStorage` and subclasses that do
    not change how rows are read) once they hold a :class:`~tensordict.TensorDict`.
    """
    storage_cls = type(storage)
    return (
        isinstance(storage, TensorStorage)
        and storage.initialized
        and type(storage._storage) is TensorDict
        and storage_cls.get
        in (TensorStorage.get, LazyTensorStorage.get, LazyMemmapStorage.get)
        and storage_cls.__getitem__ is Storage.__getitem__
    )


def _read_entries(
    storage: Storage, index: torch.Tensor | tuple, keys: Sequence[NestedKey | None]
) -> Any:
    """Reads the entries ``keys`` of the rows ``index`` of a storage.

    The slice samplers need a few entries of the sampled rows (done, terminated,
    is_init) to build their info; the replay buffer gathers the full rows
    afterwards. From a tensor storage holding a :class:`~tensordict.TensorDict`,
    only the entries in ``keys`` are gathered: the result holds exactly what
    ``storage[index]`` holds under these keys, and leaves out the keys the storage
    does not have (``None`` keys are ignored). Any other storage returns
    ``storage[index]``.

    Args:
        storage (Storage): the storage to read from.
        index (torch.Tensor or tuple of torch.Tensor): the rows, as passed to
            ``storage[index]``.
        keys (sequence of NestedKey): the entries to read.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(range(4), TensorDict(
        ...     {"pixels": torch.zeros(4, 3, 8, 8), ("next", "done"): torch.zeros(4, 1, dtype=torch.bool)},
        ...     [4]))
        >>> entries = _read_entries(storage, (torch.tensor([0, 2]),), [("next", "done"), "is_init"])
        >>> sorted(entries.keys(include_nested=True, leaves_only=True))
        [('next', 'done')]
        >>> entries.batch_size
        torch.Size([2])
    """
    if not _reads_tensordict(storage):
        return storage[index]
    keys = [unravel_key(key) for key in keys if key is not None]
    data = storage._storage
    batch_size = _integer_index_batch_size(data.batch_size, index)
    columns = {key: data.get(key, None) for key in keys}
    if batch_size is None or not all(
        column is None or isinstance(column, torch.Tensor)
        for column in columns.values()
    ):
        # another index, or entries that are not tensors: index the selection
        data = data.select(*keys, strict=False)
        if not storage._is_full:
            data = data[: storage._len_along_dim0]
        return data[index]
    # Only the asked entries are gathered, each as TensorDict indexing gathers it,
    # and the result is built from them as indexing builds it (nested entries in
    # nested TensorDicts on the storage's device), without its checks.
    length = None if storage._is_full else storage._len_along_dim0
    source = {}
    for key, column in columns.items():
        if column is None:
            continue
        *path, name = key if isinstance(key, tuple) else (key,)
        node = source
        for part in path:
            node = node.setdefault(part, {})
        node[name] = (column if length is None else column[:length])[index]
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=data.device)


def _integer_index_batch_size(batch_size: torch.Size, index) -> torch.Size | None:
    """The batch size of ``data[index]`` for ``data`` of ``batch_size``, where ``index`` is an integer tensor or a tuple of them (what samplers return).

    ``None`` otherwise.
    """
    tensors = index if isinstance(index, tuple) else (index,)
    if not tensors or len(tensors) > len(batch_size):
        return None
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in (
            torch.long,
            torch.int,
        ):
            return None
    shape = (
        tensors[0].shape
        if len(tensors) == 1
        else torch.broadcast_shapes(*(t.shape for t in tensors))
    )
    return shape + batch_size[len(tensors) :]


def _column(data: TensorDict, key: NestedKey) -> Any:
    """``data.get(key, None)``, through the lookups it dispatches to (a sample reads a few keys)."""
    if type(key) is not str:
        key = unravel_key(key)
        if type(key) is not str:
            return data._get_tuple(key, None)
    return data._get_str(key, None)


def _fixed_length_info(
    sampler, index: torch.Tensor, num_slices: int, seq_length: int, storage: Storage
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]] | None:
    """What ``SliceSampler._finalize_index`` returns for ``num_slices`` slices of ``seq_length`` rows each, all on the CPU, without its general path.

    The info of such a sample is the done / terminated / init entries of the
    sampled rows and flags at fixed positions (the last row of each slice is
    truncated, the first starts it). The entries are gathered from the storage's
    tensors as ``_read_entries`` gathers them and the flags are written in place,
    in a few operations: on a few thousand rows, the general path's tensor
    operations and TensorDict indexing cost several times the gathers.

    Returns ``None`` (the general path runs) for other storages or entries than
    :func:`_read_entries` reads directly, or rows off the CPU.
    """
    count = index.shape[0]
    if (
        not index.is_cpu
        or count != num_slices * seq_length
        or not _reads_tensordict(storage)
    ):
        return None
    data = storage._storage
    truncated_key, init_key = sampler.truncated_key, sampler.init_key
    done = terminated = is_init = None
    if truncated_key is not None:
        done_key = _replace_last(truncated_key, "done")
        terminated_key = _replace_last(truncated_key, "terminated")
        done, terminated = _column(data, done_key), _column(data, terminated_key)
    if init_key is not None:
        is_init = _column(data, init_key)
    for column in (done, terminated, is_init):
        if column is not None and not isinstance(column, torch.Tensor):
            return None
    if index.dtype is not torch.long:
        index = index.to(torch.long)
    index = index.unbind(-1)
    # The rows are valid ones (the slices are taken modulo the storage's length):
    # the columns are indexed whole, without the view of the valid rows.
    if done is not None:
        done = done[index]
    if terminated is not None:
        terminated = terminated[index]
    if is_init is not None:
        is_init = is_init[index]
    info = {}
    if truncated_key is not None:
        truncated = torch.zeros((count, 1), dtype=torch.bool)
        truncated.numpy()[seq_length - 1 :: seq_length] = True
        info[truncated_key] = truncated
        if done is None:
            done = truncated.clone()
        elif done.dtype is torch.bool and done.shape == truncated.shape:
            # done | truncated, written into the rows just gathered
            done.numpy()[seq_length - 1 :: seq_length] = True
        else:
            done = done | truncated
        info[done_key] = done
        info[terminated_key] = (
            torch.zeros_like(truncated) if terminated is None else terminated
        )
    if is_init is not None:
        # each slice starts a sequence for recurrent modules
        init_marker = torch.zeros_like(is_init)
        init_marker[::seq_length] = True
        info[sampler.init_key] = init_marker | is_init
    return index, info


def _read_written_entries(sampler, storage: Storage, index: torch.Tensor) -> Any:
    """The rows ``StreamingSliceSampler.mark_update`` reads from a write, restricted to the entries it uses.

    The sampler reads the trajectory ids, the end flags and ``"is_init"`` of the
    rows just written. From a tensor storage holding a
    :class:`~tensordict.TensorDict`, only these entries are gathered; the
    trajectory key is resolved first, to know which entry holds the ids
    (``mark_update`` then finds it resolved). Any other storage returns
    ``storage.get(index)``.

    Args:
        sampler (StreamingSliceSampler): the sampler notified of the write.
        storage (Storage): the storage written to.
        index (torch.Tensor): the rows written.
    """
    if not _reads_tensordict(storage):
        return storage.get(index)
    if getattr(sampler, "_traj_key_auto", False):
        sampler._resolve_traj_key(storage)
    keys = [sampler.traj_key if sampler._fetch_traj else None, "is_init"]
    keys.extend(sampler.end_keys or (sampler.end_key,))
    return _read_entries(storage, index, keys)


def _streaming_mark_update(stock: types.FunctionType) -> types.FunctionType:
    """``StreamingSliceSampler.mark_update``, reading only the entries of the written rows it uses."""
    return derive_from_source(
        stock,
        [
            (
                "data = storage.get(storage_index)",
                "data = _read_written_entries(self, storage, storage_index)",
            )
        ],
        _read_written_entries=_read_written_entries,
    )


# The info builder of each release (SliceSampler._finalize_index from 0.14 on,
# _get_index before) is its own stock source with its reads of full rows
# (storage[...]) made reads of the entries the info uses (derive_from_source).
_FLAT_INIT_READ = (
    "st_index = storage[flat_index]\n",
    "st_index = _read_entries(storage, flat_index, (self.init_key,))\n",
)
_INFO_READ = (
    "st_index = storage[index]\n        done = ",
    "st_index = _read_entries(\n"
    "            storage, index, (done_key, terminated_key, self.init_key)\n"
    "        )\n"
    "        done = ",
)
_INIT_READ = (
    "st_index = storage[index]\n    self._maybe_emit_init_marker(",
    "st_index = _read_entries(storage, index, (self.init_key,))\n"
    "    self._maybe_emit_init_marker(",
)
# Slices of one length (what _get_index hands over for most samplers): the info
# without the general path, where _fixed_length_info can build it.
_FIXED_LENGTH_INFO = (
    "    if self.truncated_key is not None:\n        truncated_key = self.truncated_key\n",
    "    if target_seq_length is None and mask_flat is None and isinstance(seq_length, int):\n"
    "        finalized = _fixed_length_info(self, index, num_slices, seq_length, storage)\n"
    "        if finalized is not None:\n"
    "            return finalized\n"
    "    if self.truncated_key is not None:\n        truncated_key = self.truncated_key\n",
)
# TorchRL main (torchrl-nightly 2026.10.27): 0.14's code with the batch_time layout in front.
FINALIZE_INDEX_EDITS = (_FLAT_INIT_READ, _FIXED_LENGTH_INFO, _INFO_READ, _INIT_READ)
FINALIZE_INDEX_EDITS_0_14 = (_FIXED_LENGTH_INFO, _INFO_READ, _INIT_READ)
# 0.13 reads the init flags under their literal key.
GET_INDEX_EDITS_0_13 = tuple(
    (old, new.replace("self.init_key", '"is_init"'))
    for old, new in (_INFO_READ, _INIT_READ)
)
# 0.8 to 0.12 emit no init marker.
GET_INDEX_EDITS_0_11 = (
    (
        "st_index = storage[index]\n",
        "st_index = _read_entries(storage, index, (done_key, terminated_key))\n",
    ),
)
# PrioritizedSliceSampler.sample reads the truncation info as 0.8-0.12's _get_index does.
PRIORITIZED_SAMPLE_EDITS = GET_INDEX_EDITS_0_11


class SingleGather(Fix):
    """Registry entry: see the module docstring."""

    name = "single_gather"
    summary = (
        "the slice samplers read only done / terminated / is_init from the sampled rows; "
        "the buffer's gather is the only full read"
    )
    upstream_issue = "https://github.com/pytorch/rl/issues/2422"
    torchrl_versions = SpecifierSet(">=0.8")
    targets = (
        "torchrl.data.replay_buffers.samplers.SliceSampler._finalize_index (TorchRL 0.14, main)",
        "torchrl.data.replay_buffers.samplers.SliceSampler._get_index (TorchRL 0.8 to 0.13)",
        "torchrl.data.replay_buffers.samplers.PrioritizedSliceSampler.sample",
        "torchrl.data.replay_buffers.samplers.StreamingSliceSampler.mark_update (TorchRL 0.14, main)",
    )
    stock_classes = ("torchrl.data.replay_buffers.samplers.SliceSampler",)
    # The one list of what runs stock code: status(), the README and the upstream
    # patch's header show this text.
    fallbacks = (
        "storages other than a TensorStorage holding a TensorDict (lists, tensorclasses, "
        "storages that override get): the sampler reads the full rows"
    )

    # The method that builds the slice info, by release: (its name, its stock
    # fingerprint, the stock fingerprint of the _maybe_emit_init_marker it calls
    # or None where there is none, the edits that make the fix of its source).
    variants = (
        # torchrl-nightly 2026.10.27 (TorchRL main): the batch_time layout
        (
            "_finalize_index",
            "e4c6482012fecc92",
            "c6ecacb2f419f943",
            FINALIZE_INDEX_EDITS,
        ),
        (
            "_finalize_index",
            "dec80b91b8a93985",
            "c6ecacb2f419f943",
            FINALIZE_INDEX_EDITS_0_14,
        ),  # 0.14.1
        (
            "_get_index",
            "1a637a5ac58f793b",
            "60f5ba7223d77b67",
            GET_INDEX_EDITS_0_13,
        ),  # 0.13.3
        (
            "_get_index",
            "39dfa19478982190",
            None,
            GET_INDEX_EDITS_0_11,
        ),  # 0.8.1 to 0.12.0
    )
    # Stock code the replacements rely on without replacing it: how a tensor
    # storage reads rows. 0.11 on wait for a shared storage's initialization
    # first; before 0.11 LazyTensorStorage inherits TensorStorage.get.
    read_fingerprints = {
        "TensorStorage.get": {
            "a50cd0cd6cd897ab",  # 0.8.1 to 0.10.1
            "2861b0fdf9cf5c02",  # 0.11.1 to 0.14.1, torchrl-nightly 2026.10.27
        },
        "LazyTensorStorage.get": {"a28643a6eb0a3753"},  # 0.11.1 on
        "LazyMemmapStorage.get": {
            "3856e6653d2573b2",  # 0.8.1 to 0.10.1
            "27722ae56ca23976",  # 0.11.1 to 0.14.1, torchrl-nightly 2026.10.27
        },
    }
    # PrioritizedSliceSampler.sample, whose info weight key is "_weight" before 0.11
    # and "priority_weight" from 0.11 on.
    prioritized_fingerprints = {
        "e00622f608a4f293",  # 0.8.1 to 0.10.1
        "3575e5dafe82cf9b",  # 0.11.1 to 0.14.1, torchrl-nightly 2026.10.27
    }
    # StreamingSliceSampler.mark_update: 0.14.1, torchrl-nightly 2026.10.27 (the
    # class is new in 0.14).
    streaming_fingerprints = {"fabeecdca4cce902"}

    @classmethod
    def known_fingerprints(cls) -> dict[str, set[str]]:
        """Target path -> the stock fingerprints this fix knows, over every supported release."""
        known: dict[str, set[str]] = {}
        for name, fingerprint, marker, _ in cls.variants:
            known.setdefault(f"SliceSampler.{name}", set()).add(fingerprint)
            if marker is not None:
                known.setdefault("SliceSampler._maybe_emit_init_marker", set()).add(
                    marker
                )
        known["PrioritizedSliceSampler.sample"] = set(cls.prioritized_fingerprints)
        known["StreamingSliceSampler.mark_update"] = set(cls.streaming_fingerprints)
        for path, fingerprints in cls.read_fingerprints.items():
            known[path] = set(fingerprints)
        return known

    @staticmethod
    def _info_builder() -> str:
        # TorchRL 0.14 and main build the info in _finalize_index, 0.8 to 0.13 in _get_index.
        return (
            "_finalize_index"
            if "_finalize_index" in vars(SliceSampler)
            else "_get_index"
        )

    def stock_targets(self) -> dict[str, types.FunctionType | None]:
        """The installed functions this fix replaces or relies on, by path (``None`` where missing)."""
        if _IMPORT_ERROR is not None:
            raise TargetChanged(
                f"cannot import TorchRL's slice samplers ({_IMPORT_ERROR})"
            )
        builder = self._info_builder()
        targets = {}
        for owner, name in (
            (SliceSampler, builder),
            (SliceSampler, "_maybe_emit_init_marker"),
            (PrioritizedSliceSampler, "sample"),
            (StreamingSliceSampler, "mark_update"),
            (TensorStorage, "get"),
            (LazyTensorStorage, "get"),
            (LazyMemmapStorage, "get"),
        ):
            if owner is None:  # StreamingSliceSampler before TorchRL 0.14
                continue
            func = vars(owner).get(name)
            targets[f"{owner.__name__}.{name}"] = (
                func if isinstance(func, types.FunctionType) else None
            )
        return targets

    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(
                f"cannot import TorchRL's slice samplers ({_IMPORT_ERROR})"
            )
        for cls in (TensorStorage, LazyTensorStorage, LazyMemmapStorage):
            if cls is LazyTensorStorage and "get" not in vars(cls):
                continue  # before 0.11: TensorStorage.get, checked above
            stock_function(cls, "get", self.read_fingerprints[f"{cls.__name__}.get"])
        builder = self._info_builder()
        stock = stock_function(
            SliceSampler, builder, {v[1] for v in self.variants if v[0] == builder}
        )
        _, _, marker, edits = next(
            v
            for v in self.variants
            if v[0] == builder and v[1] == source_fingerprint(stock)
        )
        new = derive_from_source(
            stock,
            edits,
            _read_entries=_read_entries,
            _fixed_length_info=_fixed_length_info,
        )
        if marker is not None:
            stock_function(SliceSampler, "_maybe_emit_init_marker", {marker})
        prioritized = stock_function(
            PrioritizedSliceSampler, "sample", self.prioritized_fingerprints
        )
        replacements = [
            Replacement(SliceSampler, builder, new),
            Replacement(
                PrioritizedSliceSampler,
                "sample",
                derive_from_source(
                    prioritized, PRIORITIZED_SAMPLE_EDITS, _read_entries=_read_entries
                ),
            ),
        ]
        if StreamingSliceSampler is not None:
            # It reads the rows of every write to queue its windows.
            stock = stock_function(
                StreamingSliceSampler, "mark_update", self.streaming_fingerprints
            )
            replacements.append(
                Replacement(
                    StreamingSliceSampler, "mark_update", _streaming_mark_update(stock)
                )
            )
        return replacements
