"""TorchRL 0.14's storage mutation revision and boundary cache, for the releases before it.

From TorchRL 0.14 on, a storage counts its mutations (``Storage._mutation_revision``,
moved by ``_bump_mutation_revision()`` in every write path and shared with spawned
processes) and keeps recovered trajectory boundaries in
``torchrl.data.replay_buffers.utils._REPLAY_BOUNDARY_CACHE``. The slice boundary
index is built on both (:mod:`torchrl_fixes.fixes.slice_boundary_index.storage_boundaries`). On 0.8 to 0.13
the fix installs this module's equivalents, so that the index is the same code on
every release:

- ``Storage._mutation_revision`` and ``Storage._bump_mutation_revision``, over a
  write count kept in shared memory with one slot per process (concurrent writers
  in different processes never add to the same slot), pickled with the storage;
- :data:`MUTATION_REVISION_HOOKS`: the bump in each write path, where 0.14 has it;
- ``_REPLAY_BOUNDARY_CACHE`` and its lock;
- ``Storage._last_cursor_index``, 0.14's name for the last write's cursor
  (``_last_cursor`` before).

Where writes could escape the count (a storage shared between processes but built
before the fix was applied; a ``compilable=True`` storage, whose compiled writes
run no Python; a storage class with a write path of its own, which counts
nothing), the revision differs at every read, so the index is rebuilt at
every sample as stock does; :func:`unseen_writes_reason` says why.

Nothing here is part of the upstream patches: TorchRL 0.14 has it.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
import weakref

import torch
from torch.compiler import is_compiling
from torchrl.data.replay_buffers import storages

_REPLAY_BOUNDARY_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REPLAY_BOUNDARY_CACHE_LOCK = threading.RLock()

_COUNT_ATTR = "_write_count"
_WRITE_SLOTS = 256
# Revisions of storages whose writes may escape the count: never the same twice.
_UNKNOWN_REVISIONS = itertools.count(-1, -1)

# The statements TorchRL 0.14 runs in each write path, by file and method (the
# layout of INLINE_HOOKS in torchrl_fixes.fixes.slice_boundary_index).
MUTATION_REVISION_HOOKS = {
    ("storages/tensor.py", "TensorStorage.__init__"): (
        (),
        ("_attach_write_count(self)",),
    ),
    ("storages/tensor.py", "TensorStorage.set"): (
        (),
        ("self._bump_mutation_revision()",),
    ),
    ("storages/tensor.py", "TensorStorage._empty"): (
        (),
        ("self._bump_mutation_revision()",),
    ),
    ("storages/tensor.py", "TensorStorage.load_state_dict"): (
        (),
        ("self._bump_mutation_revision()",),
    ),
    ("storages/tensor.py", "LazyMemmapStorage.load_state_dict"): (
        (),
        ("self._bump_mutation_revision()",),
    ),
    ("storages/base.py", "Storage.loads"): ((), ("self._bump_mutation_revision()",)),
    ("replay_buffers/base.py", "ReplayBuffer.set_"): (
        (),
        ("self._storage._bump_mutation_revision()",),
    ),
    ("replay_buffers/base.py", "ReplayBuffer.set_at_"): (
        (),
        ("self._storage._bump_mutation_revision()",),
    ),
    ("replay_buffers/base.py", "ReplayBuffer.update_"): (
        (),
        ("self._storage._bump_mutation_revision()",),
    ),
}


@functools.cache
def _uncounted_write_path(storage_cls: type) -> str | None:
    """A write path of ``storage_cls`` that :data:`MUTATION_REVISION_HOOKS` does not count, if any."""
    counted: dict[str, list] = {}
    for file, qualname in MUTATION_REVISION_HOOKS:
        owner, name = qualname.split(".")
        if file.startswith("storages/") and name != "__init__":
            counted.setdefault(name, []).append(
                inspect.getattr_static(getattr(storages, owner), name)
            )
    for name, definitions in counted.items():
        method = inspect.getattr_static(storage_cls, name, None)
        if not any(method is definition for definition in definitions):
            return f"{storage_cls.__name__}.{name}"
    return None


class _WriteCount:
    """The writes made to one storage, one slot per process, in shared memory.

    Args:
        late (bool): built after the storage's first writes, which it may not have seen.
    """

    def __init__(self, *, late: bool = False):
        self.slots = torch.zeros(_WRITE_SLOTS, dtype=torch.int64).share_memory_()
        self.late = late
        self._local()

    def _local(self):
        # a numpy view: a write pays microseconds, not tensor ops
        self._slots = self.slots.numpy()

    def __getstate__(self):
        return {"slots": self.slots, "late": self.late}

    def __setstate__(self, state):
        self.slots = state["slots"]
        if not self.slots.is_shared():
            self.slots.share_memory_()
        self.late = state["late"]
        self._local()

    def bump(self) -> None:
        self._slots[os.getpid() % _WRITE_SLOTS] += 1

    def total(self) -> int:
        return int(self._slots.sum())


def _attach_write_count(storage) -> None:
    """Gives a new storage its write count."""
    storage.__dict__.setdefault(_COUNT_ATTR, _WriteCount())


def _write_count(storage) -> _WriteCount:
    count = storage.__dict__.get(_COUNT_ATTR)
    if count is None:
        count = storage.__dict__[_COUNT_ATTR] = _WriteCount(late=True)
    return count


# The configurations the backported revision cannot follow every write of, as
# unseen_writes_reason decides them: their boundaries come from the whole storage.
FALLBACKS = (
    "compilable=True storages",
    "storages shared between processes but built before the fix was applied",
    "storage classes with a write path of their own",
)


def unseen_writes_reason(storage) -> str | None:
    """Why writes to ``storage`` could escape its write count, if they can.

    The reason falls under one of the configurations of :data:`FALLBACKS`.
    """
    if getattr(storage, "_compilable", False):
        return "compilable=True storage on a TorchRL that counts no mutations (before 0.14)"
    uncounted = _uncounted_write_path(type(storage))
    if uncounted is not None:
        return f"{uncounted} is a write path the backported revision does not count"
    count = storage.__dict__.get(_COUNT_ATTR)
    data = getattr(storage, "_storage", None)
    if count is not None and count.late and data is not None:
        is_memmap = getattr(data, "is_memmap", None)
        is_shared = getattr(data, "is_shared", None)
        if (is_memmap is not None and is_memmap()) or (
            is_shared is not None and is_shared()
        ):
            return "storage shared between processes, built before the fix was applied"
    return None


def _mutation_revision(self) -> int:
    """Monotonic storage-content revision shared with spawned processes."""
    count = _write_count(self)
    if unseen_writes_reason(self) is not None:
        return next(_UNKNOWN_REVISIONS)
    return count.total()


def _last_cursor_index(self):
    """The cursor of the storage's last write (TorchRL 0.14's name for ``_last_cursor``)."""
    return getattr(self, "_last_cursor", None)


def _bump_mutation_revision(self) -> None:
    """Invalidates process-local metadata derived from storage contents."""
    if is_compiling():
        return
    _write_count(self).bump()


__all__ = ["MUTATION_REVISION_HOOKS", "unseen_writes_reason"]
