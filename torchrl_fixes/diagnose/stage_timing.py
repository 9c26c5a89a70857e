"""Timing each stage of a buffer's ``sample()``, run as TorchRL composes them.

:func:`_measure` runs ``samples`` samples stage by stage, with the buffer's own
sampler and storage: the index draw (a slice sampler's boundary recovery timed on
its own, by wrapping the real method), the storage gather, the transform (a
copy), pinning, the info entries ``TensorDictReplayBuffer.sample`` writes into the
sample and the host->device copy; then, given a write to follow
(:class:`~torchrl_fixes.diagnose.after_write._SameValuesWrite`), the sampler's
whole draw right after it. Each stage's times go to a :class:`_Clock`, and
what the samples showed besides times to an :class:`_Observed`.

Run it inside :func:`~torchrl_fixes.diagnose.snapshot._untouched`: it changes the
sampler's state as a sample does.
"""
from __future__ import annotations

import contextlib
import functools
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from tensordict import is_tensor_collection, is_tensorclass
from tensordict.utils import expand_as_right
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import utils as replay_buffer_utils

from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import defining_class, installed_replacement
from torchrl_fixes._core.registry import stock_function
from torchrl_fixes.diagnose.buffer_parts import _boundary_read, _is_slice_sampler, _Parts
from torchrl_fixes.fixes.pinned_sample_output import (
    PinnedSampleOutput,
    _pin_memory,
    _pin_memory_available,
)

# The ``TensorDictReplayBuffer.sample`` code whose writing of the info entries
# :func:`_write_info` reproduces: the stock variants pinned_sample_output knows
# (and edits), by fingerprint.
SAMPLE_TARGET = PinnedSampleOutput.target("TensorDictReplayBuffer.sample")


def _accelerator_available() -> bool:
    return _pin_memory_available()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        accelerator.synchronize()


class _Clock:
    def __init__(self):
        self.times: dict[str, list[float]] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.times.setdefault(stage, []).append(seconds)

    def medians(self) -> dict[str, float]:
        return {stage: statistics.median(values) for stage, values in self.times.items()}


@dataclass
class _Observed:
    """What the timed samples showed, besides times."""

    gathered_bytes: list[int] = field(default_factory=list)
    first_data: Any = None
    transformed_device_none: bool = False
    unpinned: list[str] = field(default_factory=list)
    leaves: int = 0
    boundary_read: tuple | None = None
    info_keys: set = field(default_factory=set)
    boundary_calls: int = 0  # calls of the boundary recovery between writes
    write_failed: str | None = None  # why the rows could not be written again


class _BoundaryTimer:
    """The time a slice sampler's ``_get_stop_and_length`` takes, and its calls.

    :meth:`install` shadows the method with an instance attribute that adds to
    :attr:`seconds` and :attr:`calls` (the snapshot removes the attribute).
    """

    def __init__(self):
        self.seconds = 0.0
        self.calls = 0

    def install(self, sampler) -> None:
        bound = type(sampler)._get_stop_and_length.__get__(sampler)
        depth = [0]

        @functools.wraps(bound)
        def _get_stop_and_length(*args, **kwargs):
            if depth[0]:  # the stock code calls itself again for its fallback key
                return bound(*args, **kwargs)
            depth[0] += 1
            self.calls += 1
            start = time.perf_counter()
            try:
                return bound(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                depth[0] -= 1

        vars(sampler)["_get_stop_and_length"] = _get_stop_and_length


def _leaves(obj, prefix=()) -> Iterator[tuple[tuple, torch.Tensor]]:
    if is_tensor_collection(obj):
        for key, value in obj.items(include_nested=True, leaves_only=True):
            if isinstance(value, torch.Tensor):
                yield (*prefix, *(key if isinstance(key, tuple) else (key,))), value
    elif isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            yield from _leaves(value, (*prefix, i))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, (*prefix, key))


def _name(key) -> str:
    if isinstance(key, tuple):
        return ".".join(map(str, key)) or "<sample>"
    return str(key)


def _nbytes(obj) -> int:
    return sum(tensor.numel() * tensor.element_size() for _, tensor in _leaves(obj))


def _pin(parts: _Parts, patched: bool, output):
    """The buffer's pinning of ``(data, info)``: the fixed one, or stock's."""
    if patched:
        return _pin_memory(output)
    return tuple(replay_buffer_utils._pin_memory(item) for item in output)


def _info_code_unknown(buffer) -> str | None:
    """Why the info stage of ``buffer`` cannot be timed, or None when it can.

    :func:`_write_info` reproduces what ``TensorDictReplayBuffer.sample`` does with
    the info, as the stock code does it (one of the variants whose fingerprints
    pinned_sample_output knows) or as that fix's edit of it does. A ``sample`` of
    another code (changed upstream, replaced, or a subclass's own) may write the
    info otherwise: timing the copy would measure something else, so it is not timed.
    """
    owner = defining_class(type(buffer), "sample")
    if owner is not TensorDictReplayBuffer:
        return f"{owner.__name__}.sample is not TensorDictReplayBuffer's: diagnose does not know how it writes the info"
    if installed_replacement(TensorDictReplayBuffer, "sample") is not None:
        return None  # pinned_sample_output's, built from stock code its fingerprints gate
    try:
        stock_function(TensorDictReplayBuffer, "sample", SAMPLE_TARGET.seen)
    except (TargetChanged, OSError, TypeError):  # OSError, TypeError: no source to fingerprint
        return (
            "TensorDictReplayBuffer.sample is not code diagnose knows (changed upstream, or "
            "replaced): how it writes the info is not timed"
        )
    return None


def _write_info(parts: _Parts, patched_pin: bool, data, info):
    """What ``TensorDictReplayBuffer.sample`` does with the info: set it into the sample.

    Timed only where :func:`_info_code_unknown` finds the buffer's ``sample`` is code
    this reproduces.
    """
    if not is_tensor_collection(data) or is_tensorclass(data):
        return data
    is_locked = data.is_locked
    if is_locked:
        data.unlock_()
    for key, val in info.items():
        if key == "index" and isinstance(val, tuple):
            val = torch.stack(val, -1)
        val = replay_buffer_utils._to_torch(val, data.device)
        if patched_pin:
            val = _pin_memory(val)
        if val.ndim < data.ndim:
            val = expand_as_right(val, data)
        data.set(key, val)
    if is_locked:
        data.lock_()
    return data


def _measure(parts: _Parts, batch_size: int, samples: int, device, clock: _Clock, observed: _Observed,
             pinning_fixed: tuple[bool, bool], transform, write_info: bool, index_serves: bool,
             rewrite=None) -> None:
    """Times ``samples`` samples of ``parts``' buffer stage by stage, into ``clock`` and ``observed``.

    ``transform`` is the copy of the buffer's transform to run (None: none), and
    ``write_info`` whether to time the info stage; ``device``, where to time the
    host->device copy to (None: not timed). ``pinning_fixed``: whether the fix
    pins what ``_sample`` returns, and the info entries ``sample()`` writes;
    ``index_serves``: whether the storage's trajectory index serves a slice
    sampler. Given ``rewrite`` (a
    :class:`~torchrl_fixes.diagnose.after_write._SameValuesWrite`), ``samples``
    more draws follow, each right after it writes, timed whole as ``after_write``.
    """
    sampler = parts.sampler
    slice_sampler = _is_slice_sampler(sampler)
    boundaries = _BoundaryTimer() if slice_sampler else None
    if boundaries is not None:
        boundaries.install(sampler)
    pinning = bool(parts.buffer._pin_memory) and _accelerator_available()
    for i in range(samples):
        data, info = _time_draw_and_gather(parts, batch_size, clock, boundaries)
        observed.gathered_bytes.append(_nbytes(data))
        if i == 0 and slice_sampler:
            observed.boundary_read = _boundary_read(sampler, parts.storage, index_serves)
        if transform is not None:
            data = _time_transform(parts, transform, data, clock)
            if i == 0:
                observed.transformed_device_none = is_tensor_collection(data) and data.device is None
        if pinning:
            start = time.perf_counter()
            data, info = _pin(parts, pinning_fixed[0], (data, info))
            clock.add("pin_memory", time.perf_counter() - start)
        if write_info:
            start = time.perf_counter()
            data = _write_info(parts, pinning_fixed[1] and pinning, data, info)
            clock.add("info", time.perf_counter() - start)
        if i == 0:
            observed.first_data = data
            observed.info_keys = {_name(key) for key in info}
        if device is not None and hasattr(data, "to"):
            _time_copy(data, device, clock)
    if boundaries is not None:
        observed.boundary_calls = boundaries.calls
    if rewrite is None:
        return
    after_write = _Clock()
    for _ in range(samples):
        try:
            rewrite.write()
        except RuntimeError as err:  # a storage of inference tensors, say; a failed write wrote its own values
            first_sentence = re.split(r"\.(?=\s|[A-Z])", str(err), maxsplit=1)[0]
            observed.write_failed = f"writing the rows again failed: {first_sentence}"
            return
        _time_draw_and_gather(parts, batch_size, after_write, boundaries)
    for boundary, draw in zip(after_write.times.get("boundaries", [0.0] * samples), after_write.times["sampler"]):
        clock.add("after_write", boundary + draw)


def _time_draw_and_gather(parts: _Parts, batch_size: int, clock: _Clock, boundaries: _BoundaryTimer | None):
    """One index draw and gather, as ``ReplayBuffer._sample`` runs them; returns ``(data, info)``.

    ``boundaries`` times a slice sampler's boundary recovery (None for other
    samplers): that time is its own stage, taken out of the sampler's.
    """
    sampler, storage = parts.sampler, parts.storage
    tracks_generations = getattr(parts.writer, "tracks_generations", False)
    set_names = getattr(sampler, "_set_sample_names", None)
    if boundaries is not None:
        boundaries.seconds = 0.0
    start = time.perf_counter()
    index, info = sampler.sample(storage, batch_size)
    if parts.sample_unit is not None:
        index, info = parts.sample_unit.expand(index, info, storage)
    info["index"] = index
    if tracks_generations:
        info["index_generation"] = parts.writer.generations_of(index)
    drawn = time.perf_counter()
    data = storage.get(parts.storage_index(index, storage))
    if not isinstance(index, int):
        data = parts.collate_fn(data)
    if set_names is not None:
        data = set_names(data)
    gathered = time.perf_counter()
    boundary_seconds = 0.0
    if boundaries is not None:
        boundary_seconds = boundaries.seconds
        clock.add("boundaries", boundary_seconds)
    clock.add("sampler", drawn - start - boundary_seconds)
    clock.add("gather", gathered - drawn)
    return data, info


def _time_transform(parts: _Parts, transform, data, clock: _Clock):
    """Runs ``transform`` on ``data`` as ``ReplayBuffer._sample`` does, timed; returns its output."""
    start = time.perf_counter()
    is_td = is_tensor_collection(data)
    dispatch = parts.set_dispatch(is_td) if parts.set_dispatch is not None else contextlib.nullcontext()
    with data.unlock_() if is_td else contextlib.nullcontext(), dispatch:
        data = transform(data)
    clock.add("transform", time.perf_counter() - start)
    return data


def _time_copy(data, device: torch.device, clock: _Clock) -> None:
    _synchronize(device)
    start = time.perf_counter()
    data.to(device)
    _synchronize(device)
    clock.add("to_device", time.perf_counter() - start)
    pinned = data.pin_memory() if not all(t.is_pinned() for _, t in _leaves(data)) else data
    _synchronize(device)
    start = time.perf_counter()
    pinned.to(device, non_blocking=True)
    clock.add("to_device_non_blocking", time.perf_counter() - start)
    _synchronize(device)


def _unpinned_leaves(parts: _Parts, data, pinning_fixed: tuple[bool, bool],
                     observed: _Observed) -> tuple[list[str], int, bool]:
    """Returned tensors not pinned: measured with an accelerator, predicted without one.

    ``pinning_fixed``: whether the fix pins what ``_sample`` returns, and the info
    entries ``sample()`` writes. Returns (names, number of tensors, measured).
    """
    leaves = list(_leaves(data))
    names = [_name(key) for key, _ in leaves]
    if _accelerator_available():
        return [n for n, (_, t) in zip(names, leaves) if t.device.type == "cpu" and not t.is_pinned()], len(leaves), True
    if all(pinning_fixed):
        return [], len(leaves), False
    # stock pins the output of _sample only where it has device == cpu, and stock
    # TensorDictReplayBuffer.sample never the info entries it sets afterwards
    data_pinned = pinning_fixed[0] or (is_tensor_collection(data) and data.device == torch.device("cpu")) or (
        isinstance(data, torch.Tensor) and data.device.type == "cpu"
    )
    unpinned = []
    for name in names:
        if parts.tensordict_sample and name in observed.info_keys:
            if not pinning_fixed[1]:
                unpinned.append(name)
        elif not data_pinned:
            unpinned.append(name)
    return unpinned, len(leaves), False
