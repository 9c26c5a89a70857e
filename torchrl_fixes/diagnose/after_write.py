"""The write that the ``after_write`` stage follows: the rows last written, written again with their own values.

In an online loop (write, sample, write, sample) every sample comes right after a
write, and what the sampler keeps between samples may not outlive a write: stock
slice samplers find the trajectory boundaries from the whole storage again, the
storage's trajectory index reads the rows written. To time that sample without
changing the user's data, :class:`_SameValuesWrite` writes the rows the storage's
last write wrote (the ``write_rows`` rows up to its last written row) back to the
same positions with the values they hold, as ``ReplayBuffer.extend`` writes: the
storage's ``set`` (which moves its mutation revision and which the trajectory
index records, as any write), then the sampler's ``extend``. Only those rows are
copied, once, whatever the storage's size.

What the write leaves behind, besides values unchanged: the storage's cursor and
length are not moved (``set_cursor=False``); its mutation revision is one higher
per write, which what follows it sees as a write of unchanged values (the
trajectory index recorded it; TorchRL's boundary cache finds the same boundaries
again at the next sample); the sampler's state is put back with the rest
(:func:`~torchrl_fixes.diagnose.snapshot._untouched`). Storages that another
process may write (memory-mapped, or in shared memory) are not written: that
process could write a row between the read and the write back, which would then
undo its write; for the same reason, where the storage's mutation revision moved
since the last write back (another buffer or thread wrote it), the rows are not
written again and the stage stops. Nor are the priorities of a prioritized sampler set, as a real
write would set them: its sum trees are not put back afterwards.
"""
from __future__ import annotations

import inspect

import torch
from tensordict import MemoryMappedTensor, TensorDictBase
from torchrl.data import PrioritizedSampler
from torchrl.data.replay_buffers import storages

from torchrl_fixes._core.patching import defining_class
from torchrl_fixes.diagnose.buffer_parts import _Parts

# The rows of the write the stage follows, unless diagnose(write_rows=...) says otherwise.
WRITE_ROWS = 1000


class _SameValuesWrite:
    """The rows last written, and writing them again with their own values.

    Args:
        parts: the buffer's parts.
        rows (torch.Tensor): the rows along the storage's first dim, oldest first.
    """

    def __init__(self, parts: _Parts, rows: torch.Tensor):
        self.storage = parts.storage
        self.rows = rows
        # read once: the values do not change, however many times they are written back
        self.values = parts.storage._storage[rows]
        self.sampler = parts.sampler if _sampler_extend_is_put_back(parts.sampler) else None
        replicate = getattr(parts.writer, "_replicate_index", None)
        self.sampler_index = replicate(rows) if replicate is not None else rows
        self.revision = getattr(parts.storage, "_mutation_revision", None)

    def write(self) -> None:
        """Writes the rows again, as ``ReplayBuffer.extend`` writes: the storage, then the sampler.

        Raises:
            RuntimeError: another writer wrote the storage since the values were read.
        """
        if getattr(self.storage, "_mutation_revision", None) != self.revision:
            raise RuntimeError(
                "another writer wrote the storage while diagnose ran, so its rows are not "
                "written back over that write"
            )
        self.storage.set(self.rows, self.values, set_cursor=False)
        self.revision = getattr(self.storage, "_mutation_revision", None)
        if self.sampler is not None:
            self.sampler.extend(self.sampler_index)


def _sampler_extend_is_put_back(sampler) -> bool:
    """Whether the sampler's ``extend`` changes only its own attributes, which diagnose puts back.

    TorchRL's samplers, but the prioritized ones: their ``extend`` writes their sum
    trees, which are not copied.
    """
    owner = defining_class(type(sampler), "extend")
    return owner.__module__.split(".")[0] == "torchrl" and not isinstance(sampler, PrioritizedSampler)


def _same_values_write(parts: _Parts, write_rows: int) -> tuple[_SameValuesWrite | None, str | None, list[str]]:
    """The write the ``after_write`` stage follows, or (None, why it is not timed); and notes.

    Args:
        parts: the buffer's parts.
        write_rows (int): the rows of the write; clipped to the rows stored.
    """
    storage = parts.storage
    if write_rows == 0:
        return None, "write_rows=0", []
    # looked up here: a TorchRL of another layout still imports this package
    tensor_storage = getattr(storages, "TensorStorage", None)
    if tensor_storage is None or not isinstance(storage, tensor_storage):
        return None, f"{type(storage).__name__} is not a TensorStorage: its rows are not written again", []
    if not isinstance(storage._storage, (torch.Tensor, TensorDictBase)):
        return None, (
            f"the storage holds a {type(storage._storage).__name__}, not a tensor or a TensorDict: "
            "its rows are not written again"
        ), []
    others = _written_by_other_processes(storage)
    if others is not None:
        return None, (
            f"the storage is {others}: another process may write its rows between diagnose's "
            "read and its write back, so they are not written again"
        ), []
    if "set_cursor" not in inspect.signature(storage.set).parameters:
        return None, f"this TorchRL's {type(storage).__name__}.set takes no set_cursor", []
    length = storage._len_along_dim0
    capacity = storage._storage.shape[0]
    # the last row written: the cursor's once the storage is full and wraps around
    last = getattr(storage, "_last_cursor_index", None) if storage._is_full else None
    if not isinstance(last, int):
        last = length - 1
    count = min(write_rows, length)
    rows = torch.arange(last - count + 1, last + 1) % capacity
    device = getattr(storage._storage, "device", None)
    if device is not None:
        rows = rows.to(device)
    notes = []
    if isinstance(parts.sampler, PrioritizedSampler):
        notes.append(
            "after a write: the priorities of the rows written are left as they are (a real "
            "write sets them)"
        )
    elif not _sampler_extend_is_put_back(parts.sampler):
        notes.append(
            f"after a write: {type(parts.sampler).__name__}.extend is not TorchRL's and is not "
            "called (diagnose could not put back what it changes)"
        )
    return _SameValuesWrite(parts, rows), None, notes


def _written_by_other_processes(storage) -> str | None:
    """``"memory-mapped"`` or ``"in shared memory"`` where another process may write the storage."""
    data = storage._storage
    if any(cls.__name__ == "LazyMemmapStorage" for cls in type(storage).__mro__):
        return "memory-mapped"
    is_memmap = getattr(data, "is_memmap", None)
    if isinstance(data, MemoryMappedTensor) or (callable(is_memmap) and is_memmap()):
        return "memory-mapped"
    device = getattr(data, "device", None)
    if (device is None or torch.device(device).type == "cpu") and data.is_shared():
        return "in shared memory"
    return None
