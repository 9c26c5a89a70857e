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

From 0.14 on, ``_finalize_index`` gets one more edit, kept apart from the reads: the
fixed-length path (:func:`_fixed_length_info`, :data:`FIXED_LENGTH_EDITS`), a second
builder of the same info for slices of one length on the CPU, which saves about a
tenth of a whole ``rb.sample()`` (see its section below for the measurements).
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
from torchrl_fixes._core.patching import derive_from_source, Replacement, SourceEdits
from torchrl_fixes._core.registry import Fix, Target
from torchrl_fixes._core.source_fingerprint import source_fingerprint

_SAMPLERS = "torchrl.data.replay_buffers.samplers"
_STORAGES = "torchrl.data.replay_buffers.storages"

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


# --- Reading only the entries the samplers use --------------------------------------


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


def _read_written_entries(sampler, storage: Storage, index: torch.Tensor) -> Any:
    """The rows ``StreamingSliceSampler.mark_update`` reads from a write, restricted to the entries it uses.

    The trajectory ids (its key resolved first), the end flags and ``"is_init"``;
    storages :func:`_read_entries` does not read directly return ``storage.get(index)``.

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
# TorchRL main (torchrl-nightly 2026.10.27): 0.14's code with the batch_time layout in front.
FINALIZE_INDEX_READ_EDITS = (_FLAT_INIT_READ, _INFO_READ, _INIT_READ)
FINALIZE_INDEX_READ_EDITS_0_14 = (_INFO_READ, _INIT_READ)
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


# --- The fixed-length path ----------------------------------------------------------
# A second builder of _finalize_index's info, for slices of one length on the CPU (what
# SliceSampler's strict-length samples and StreamingSliceSampler's fresh windows are):
# the entries gathered from the storage's columns, the slice ends and starts written
# at fixed positions, without the general path's tensor operations and TensorDict
# indexing. Without FIXED_LENGTH_EDITS, _finalize_index builds the same info on its
# general path; conformance/test_single_gather.py compares both with stock's.
# It is kept while it saves a tenth of a whole rb.sample() on a row users run
# (conformance/test_speed_single_gather.py::test_fixed_length_path, one torch thread,
# the builders in turn on one buffer; fixed-length / general, 0.14.1 and main):
#   32 slices of 64 from 2M rows of obs[4] + done + terminated: rb.sample() 0.84-0.90x
#     (_finalize_index 0.45-0.55x);
#   256 slices of 4 from 5M rows of obs[1] + done, truncated_key=None: rb.sample()
#     0.90-0.93x (_finalize_index 0.26-0.37x).


def _fixed_length_info(
    sampler: SliceSampler,
    index: torch.Tensor,
    num_slices: int,
    seq_length: int,
    storage: Storage,
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]] | None:
    """The fixed-length path of ``SliceSampler._finalize_index``: its result for slices of one length, on the CPU.

    A sample of ``num_slices`` slices of ``seq_length`` rows each has its info at
    fixed positions: the last row of each slice is truncated (and done), the
    first starts a sequence (the init key). This builds exactly what the general
    path builds, with the entries gathered from the storage's tensors and the
    flags written in place, without its per-slice tensor operations.

    Args:
        sampler (SliceSampler): the sampler whose info is built (its
            ``truncated_key`` and ``init_key``).
        index (torch.Tensor): the sampled rows, one row of storage indices per
            sampled step, as ``_finalize_index`` receives them.
        num_slices (int): the number of slices.
        seq_length (int): the length of every slice.
        storage (Storage): the storage sampled.

    Returns:
        what ``_finalize_index`` returns, or ``None`` where its general path must
        build it (rows or entries off the CPU or not tensors, other storages).
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
        done, terminated = data.get(done_key, None), data.get(terminated_key, None)
    if init_key is not None:
        is_init = data.get(init_key, None)
    for column in (done, terminated, is_init):
        if column is not None and (
            not isinstance(column, torch.Tensor) or not column.is_cpu
        ):
            return None
    if index.dtype is not torch.long:
        index = index.to(torch.long)
    # unbind(-1), as _finalize_index does; one column is the index itself
    index = (index.squeeze(-1),) if index.shape[-1] == 1 else index.unbind(-1)
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
        truncated[seq_length - 1 :: seq_length] = True
        info[truncated_key] = truncated
        if done is None:
            done = truncated.clone()
        elif done.dtype is torch.bool and done.shape == truncated.shape:
            # done | truncated, written into the rows just gathered
            done[seq_length - 1 :: seq_length] = True
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
        info[init_key] = init_marker | is_init
    return index, info


# The fixed-length path's one edit of _finalize_index (0.14 on): before the general
# path, after main's batch_time layout.
_FIXED_LENGTH_INFO = (
    "    if self.truncated_key is not None:\n        truncated_key = self.truncated_key\n",
    "    # The fixed-length path (slices of one length on the CPU): _fixed_length_info\n"
    "    # builds the same info as the general path below, in a few operations.\n"
    "    if (\n"
    "        target_seq_length is None\n"
    "        and mask_flat is None\n"
    "        and isinstance(seq_length, int)\n"
    "    ):\n"
    "        finalized = _fixed_length_info(self, index, num_slices, seq_length, storage)\n"
    "        if finalized is not None:\n"
    "            return finalized\n"
    "    if self.truncated_key is not None:\n        truncated_key = self.truncated_key\n",
)
FIXED_LENGTH_EDITS = (_FIXED_LENGTH_INFO,)


# --- The edits of each release ------------------------------------------------------
# TorchRL 0.14 and main: the reads, then the fixed-length path.
FINALIZE_INDEX_EDITS = FINALIZE_INDEX_READ_EDITS + FIXED_LENGTH_EDITS
FINALIZE_INDEX_EDITS_0_14 = FINALIZE_INDEX_READ_EDITS_0_14 + FIXED_LENGTH_EDITS
# The edits that make the fix of each stock info builder (SingleGather.implements), by
# its fingerprint.
INFO_BUILDER_EDITS = {
    "e4c6482012fecc92": FINALIZE_INDEX_EDITS,
    "dec80b91b8a93985": FINALIZE_INDEX_EDITS_0_14,
    "1a637a5ac58f793b": GET_INDEX_EDITS_0_13,
    "39dfa19478982190": GET_INDEX_EDITS_0_11,
}


class SingleGather(Fix):
    """Registry entry: see the module docstring."""

    name = "single_gather"
    summary = (
        "the slice samplers read only done / terminated / is_init from the sampled rows; "
        "the buffer's gather is the only full read"
    )
    upstream_issue = "https://github.com/pytorch/rl/issues/2422"
    torchrl_versions = SpecifierSet(">=0.8")
    stock_classes = ("torchrl.data.replay_buffers.samplers.SliceSampler",)
    # The one list of what runs stock code: status(), docs/fixes.md and the upstream
    # patch's header show this text.
    fallbacks = (
        "storages other than a TensorStorage holding a TensorDict (lists, tensorclasses, "
        "storages that override get): the sampler reads the full rows"
    )
    implements = (
        Target(
            _SAMPLERS + ".SliceSampler",
            "_finalize_index",
            {
                "e4c6482012fecc92": "torchrl-nightly 2026.10.27 (the batch_time layout)",
                "dec80b91b8a93985": "0.14.1",
            },
            installs="its own source with its reads of full rows edited "
            "(FINALIZE_INDEX_EDITS): the info builder from 0.14 on",
            optional=True,
        ),
        Target(
            _SAMPLERS + ".SliceSampler",
            "_get_index",
            {
                "39dfa19478982190": "0.8.1 to 0.12.0",
                "1a637a5ac58f793b": "0.13.3",
                "10c186eaae9cadc6": "0.14.1",
                "b7df82aa70400609": "torchrl-nightly 2026.10.27",
            },
            installs="before 0.14 the info builder, its own source with its reads of "
            "full rows edited (GET_INDEX_EDITS_*); from 0.14 on relied on unchanged "
            "(it hands the index to _finalize_index)",
        ),
        Target(
            _SAMPLERS + ".SliceSampler",
            "_maybe_emit_init_marker",
            {
                "60f5ba7223d77b67": "0.13.3",
                "c6ecacb2f419f943": "0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="relied on unchanged: the info builder calls it (from 0.13 on)",
            optional=True,
        ),
        Target(
            _SAMPLERS + ".PrioritizedSliceSampler",
            "sample",
            {
                "e00622f608a4f293": "0.8.1 to 0.10.1 (the weight under _weight)",
                "3575e5dafe82cf9b": "0.11.1 to 0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="its own source with its one read of full rows edited "
            "(PRIORITIZED_SAMPLE_EDITS)",
        ),
        Target(
            _SAMPLERS + ".StreamingSliceSampler",
            "mark_update",
            {"fabeecdca4cce902": "0.14.1, torchrl-nightly 2026.10.27 (new in 0.14)"},
            installs="its own source reading only the entries of the written rows it uses",
            optional=True,
        ),
        # How a tensor storage reads rows, which the replacements rely on unchanged.
        Target(
            _STORAGES + ".TensorStorage",
            "get",
            {
                "a50cd0cd6cd897ab": "0.8.1 to 0.10.1",
                "2861b0fdf9cf5c02": "0.11.1 to 0.14.1, torchrl-nightly 2026.10.27 "
                "(a shared storage's initialization awaited first)",
            },
            installs="relied on unchanged: _read_entries reads as it does",
        ),
        Target(
            _STORAGES + ".LazyTensorStorage",
            "get",
            {"a28643a6eb0a3753": "0.11.1 to 0.14.1, torchrl-nightly 2026.10.27"},
            installs="relied on unchanged (inherited from TensorStorage before 0.11)",
            optional=True,
        ),
        Target(
            _STORAGES + ".LazyMemmapStorage",
            "get",
            {
                "3856e6653d2573b2": "0.8.1 to 0.10.1",
                "27722ae56ca23976": "0.11.1 to 0.14.1, torchrl-nightly 2026.10.27",
            },
            installs="relied on unchanged: _read_entries reads as it does",
        ),
    )

    def plan(self) -> list[Replacement]:
        if _IMPORT_ERROR is not None:
            raise TargetChanged(
                f"cannot import TorchRL's slice samplers ({_IMPORT_ERROR})"
            )
        stock = {target.path: target.stock() for target in self.implements}
        # TorchRL 0.14 and main build the info in _finalize_index, 0.8 to 0.13 in _get_index.
        builder = (
            stock["SliceSampler._finalize_index"] or stock["SliceSampler._get_index"]
        )
        new = derive_from_source(
            builder,
            INFO_BUILDER_EDITS[source_fingerprint(builder)],
            _read_entries=_read_entries,
            _fixed_length_info=_fixed_length_info,
        )
        replacements = [
            Replacement(SliceSampler, builder.__name__, new),
            SourceEdits(
                PrioritizedSliceSampler,
                "sample",
                stock["PrioritizedSliceSampler.sample"],
                PRIORITIZED_SAMPLE_EDITS,
                {"_read_entries": _read_entries},
            ),
        ]
        streaming = stock["StreamingSliceSampler.mark_update"]
        if streaming is not None:
            # It reads the rows of every write to queue its windows.
            replacements.append(
                Replacement(
                    StreamingSliceSampler,
                    "mark_update",
                    _streaming_mark_update(streaming),
                )
            )
        return replacements
