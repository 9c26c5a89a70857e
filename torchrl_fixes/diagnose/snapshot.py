"""Putting back all that timing a buffer's ``sample()`` touches, and refusing a buffer that is busy.

:func:`_untouched` snapshots the sampler's (and a sample unit's) attributes, the
storage's, writer's and buffer's attributes, every random generator they hold and
torch's, numpy's and Python's global generators, and puts them back after the
timed block; the stored values, which the block may write again as they are
(:mod:`~torchrl_fixes.diagnose.after_write`), are not copied. :func:`_quiescent` holds the buffer's futures lock while no prefetch
or priority update is running, and refuses the buffer otherwise. The transform is
timed on a copy of itself (:func:`_transform_copy`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import random
import threading
from typing import Any, Iterator

import numpy as np
import torch

from torchrl_fixes.diagnose.buffer_parts import _Parts
from torchrl_fixes.diagnose.report import DiagnoseRefused


def _is_generator(value) -> bool:
    return isinstance(value, (torch.Generator, random.Random, np.random.Generator, np.random.RandomState))


def _generator_state(gen):
    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, random.Random):
        return gen.getstate()
    if hasattr(gen, "bit_generator"):
        return copy.deepcopy(gen.bit_generator.state)
    return gen.get_state()


def _set_generator_state(gen, state) -> None:
    if isinstance(gen, torch.Generator):
        gen.set_state(state)
    elif isinstance(gen, random.Random):
        gen.setstate(state)
    elif hasattr(gen, "bit_generator"):
        gen.bit_generator.state = state
    else:
        gen.set_state(state)


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)


def _kept_by_reference(value) -> bool:
    """Objects restored by state or never changed by a sample: not copied."""
    if _is_generator(value) or isinstance(value, _LOCK_TYPES):
        return True
    name = type(value).__name__
    # TorchRL's segment trees (PrioritizedSampler): sample() only reads them.
    return "SegmentTree" in name or isinstance(value, torch.nn.Parameter)


def _version(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # inference tensors keep no version counter
        return None


class _AttributeSnapshot:
    """The attributes of one object, put back as they were.

    Top-level tensors are put back as the same objects (their content restored in
    place when a sample changed it, as ``_version`` tells); everything else is put
    back from a deep copy, except the objects in ``keep`` and generators, locks and
    TorchRL's segment trees, which are kept as they are.
    """

    def __init__(self, obj, keep: dict[int, Any]):
        self.obj = obj
        self.saved = dict(vars(obj))
        memo = dict(keep)
        for value in self.saved.values():
            if _kept_by_reference(value):
                memo[id(value)] = value
        self.tensors = {}
        self.copies = {}
        for key, value in self.saved.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                self.tensors[key] = (value, _version(value), value.detach().clone())
            elif id(value) not in memo:
                try:
                    self.copies[key] = copy.deepcopy(value, memo)
                except Exception as err:
                    raise DiagnoseRefused(
                        f"cannot keep a copy of {type(obj).__name__}.{key} "
                        f"({type(value).__name__}: {err}) to put it back after timing"
                    ) from err

    def restore(self) -> None:
        attributes = vars(self.obj)
        attributes.clear()
        attributes.update(self.saved)
        attributes.update(self.copies)
        for key, (tensor, version, content) in self.tensors.items():
            if version is None or _version(tensor) != version:
                with torch.no_grad():
                    if tensor.shape == content.shape and tensor.dtype == content.dtype:
                        tensor.copy_(content)
                    else:
                        attributes[key] = content


class _GlobalGenerators:
    """torch's (CPU, and CUDA once initialised), numpy's and Python's global generators."""

    def __init__(self):
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.numpy = np.random.get_state()
        self.python = random.getstate()

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        np.random.set_state(self.numpy)
        random.setstate(self.python)


def _generators_of(objects) -> dict[int, Any]:
    found = {}
    for obj in objects:
        for value in getattr(obj, "__dict__", {}).values():
            if _is_generator(value):
                found[id(value)] = value
    return found


@contextlib.contextmanager
def _untouched(parts: _Parts) -> Iterator[None]:
    """Runs a block that samples ``parts``' buffer, then puts back all that sampling touches."""
    owners = [parts.buffer, parts.sampler, parts.storage, parts.writer, parts.sample_unit]
    owners = [obj for obj in owners if obj is not None]
    keep = {id(obj): obj for obj in (*owners, parts.transform)}
    generators = _generators_of(owners)
    keep.update(generators)
    global_generators = _GlobalGenerators()
    generator_states = {key: _generator_state(gen) for key, gen in generators.items()}
    snapshots = [_AttributeSnapshot(obj, keep) for obj in (parts.sampler, parts.sample_unit) if obj is not None]
    # the buffer, storage and writer are only read (or written again with the values they
    # hold, without moving the storage's cursor): a shallow copy puts back any rebinding
    shallow = [(obj, dict(vars(obj))) for obj in (parts.buffer, parts.storage, parts.writer)]
    # kept outside the attributes from TorchRL 0.14 on (shared with other processes)
    length, cursor = len(parts.storage), getattr(parts.storage, "_last_cursor_index", None)
    try:
        yield
    finally:
        for snapshot in snapshots:
            snapshot.restore()
        for obj, saved in shallow:
            attributes = vars(obj)
            if attributes.keys() != saved.keys() or any(attributes[k] is not v for k, v in saved.items()):
                attributes.clear()
                attributes.update(saved)
        for key, gen in generators.items():
            _set_generator_state(gen, generator_states[key])
        global_generators.restore()
    if (len(parts.storage), getattr(parts.storage, "_last_cursor_index", None)) != (length, cursor):
        raise AssertionError("diagnose changed the storage's length or cursor")  # pragma: no cover - a bug here


@contextlib.contextmanager
def _quiescent(buffer, settle_seconds: float) -> Iterator[None]:
    """Holds the buffer's futures lock while no prefetch or update is running; refuses otherwise.

    Prefetched samples or priority updates still running are waited on for
    ``settle_seconds`` at most.
    """
    pending = [
        *getattr(buffer, "_prefetch_queue", ()),
        *getattr(buffer, "_pending_update_futures", ()),
    ]
    dependency = getattr(buffer, "_sample_dependency", None)
    if dependency is not None:
        pending.append(dependency)
    running = [future for future in pending if not future.done()]
    if running:
        concurrent.futures.wait(running, timeout=settle_seconds)
    lock = getattr(buffer, "_futures_lock", None) or contextlib.nullcontext()
    with lock:
        running = [future for future in pending if not future.done()]
        if running:
            raise DiagnoseRefused(
                f"the buffer has {len(running)} prefetched sample(s) or priority update(s) still "
                f"running in a worker thread after {settle_seconds:g} s; timing its sampler now "
                "would race with them and change what they return. Call diagnose(rb) when they "
                "are done (for example before the first rb.sample(), or between two training steps)"
            )
        yield


def _transform_copy(parts: _Parts):
    """A copy of the buffer's transform to time, or (None, why) when it has none or cannot be copied."""
    transform = parts.transform
    if transform is None or not len(transform):
        return None, "no transform"
    keep = {id(obj): obj for obj in (parts.buffer, parts.storage, parts.sampler, parts.writer)}
    for parameter in transform.parameters():
        keep[id(parameter)] = parameter  # a forward pass does not change weights
    try:
        return copy.deepcopy(transform, keep), None
    except Exception as err:
        return None, f"the transform cannot be copied ({type(err).__name__}: {err}), and it is not run on the buffer itself"
