"""TorchRL 0.14's storage mutation revision, for the releases before it.

From TorchRL 0.14 on, a storage counts its mutations (``Storage._mutation_revision``,
moved by ``_bump_mutation_revision()`` in every write path and shared with the
processes the storage is sent to). The trajectory index compares it with the
writes it recorded, so that a write made in another process is seen. On 0.8 to
0.13 the fix installs the same two names over a count kept in shared memory, moved
by the write paths TorchRL 0.14 moves it in: :data:`BUMPED`. Nothing here is part
of the upstream patches.

A storage built before the fix was applied has no shared count; where its data
is in shared memory or memory-mapped (another process may write it), its
boundaries come from the whole storage, as stock finds them
(:func:`unseen_writes_reason`).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.compiler import is_compiling

_COUNT = "_write_count"

# The write paths whose end moves the revision, as TorchRL 0.14's do (besides
# TensorStorage.set, which the index's recording wraps).
BUMPED = (
    ("TensorStorage", "_empty"),
    ("TensorStorage", "load_state_dict"),
    ("LazyMemmapStorage", "load_state_dict"),
    ("Storage", "loads"),
)

# The configurations whose writes from another process the count cannot see.
FALLBACKS = ("storages shared between processes but built before the fix was applied",)


def _shared_count(late: bool = False) -> torch.Tensor:
    count = torch.zeros((), dtype=torch.int64).share_memory_()
    count.late = late  # made after the storage, which may be shared already
    return count


def _count(storage) -> torch.Tensor:
    count = storage.__dict__.get(_COUNT)
    if count is None:
        count = storage.__dict__[_COUNT] = _shared_count(late=True)
    return count


def attach_count(wrapped, instance, args, kwargs):
    """``TensorStorage.__init__``, giving the new storage its shared write count."""
    wrapped(*args, **kwargs)
    instance.__dict__.setdefault(_COUNT, _shared_count())


def bump_after(wrapped, instance, args, kwargs):
    """A write path that moves the revision once it has written."""
    result = wrapped(*args, **kwargs)
    instance._bump_mutation_revision()
    return result


def _mutation_revision(self) -> int:
    """Monotonic storage-content revision shared with spawned processes."""
    return int(_count(self))


def _bump_mutation_revision(self) -> None:
    """Invalidates process-local metadata derived from storage contents."""
    if not is_compiling():
        _count(self).add_(1)


def _last_cursor_index(self):
    """The last row the storage's last write wrote, as TorchRL 0.14 keeps it.

    Before 0.14 the storage keeps the write's whole cursor (``_last_cursor``): its
    last element, as the stock recovery reads it; anything else stays as it is.
    """
    cursor = getattr(self, "_last_cursor", None)
    if isinstance(cursor, torch.Tensor) and cursor.numel() and cursor.ndim <= 1:
        if not cursor.is_floating_point():
            return int(cursor.reshape(-1)[-1])
    if isinstance(cursor, range) and len(cursor):
        return cursor[-1]
    if isinstance(cursor, np.integer):
        return int(cursor)
    return cursor


def unseen_writes_reason(storage) -> str | None:
    """Why writes to ``storage`` from another process could escape its count, if they can."""
    count = storage.__dict__.get(_COUNT)
    if count is None or not getattr(count, "late", False):
        return None
    data = getattr(storage, "_storage", None)
    for shared in ("is_memmap", "is_shared"):
        check = getattr(data, shared, None)
        if check is not None and check():
            return "storage shared between processes, built before the fix was applied"
    return None


__all__ = ["BUMPED", "FALLBACKS", "unseen_writes_reason"]
