"""Where a replay buffer's ``sample()`` spends its time, and what to do about it.

:func:`diagnose` times, on the user's own buffer, each stage that
``ReplayBuffer._sample`` and ``TensorDictReplayBuffer.sample`` compose: the
sampler's index draw (with a slice sampler's trajectory-boundary recovery on its
own), the storage gather, the transform, pinning, the info entries written into
the sample and, given an accelerator ``device``, the host->device copy. It then
names the problems it sees (:class:`Finding`), each with the share of the sample
it costs and a remedy.

It changes nothing: after :func:`diagnose` the buffer samples exactly what it
would have sampled without it. The stages run the buffer's own sampler and
storage, so everything they touch is put back afterwards: the sampler's (and a
sample unit's) attributes, the storage's and the buffer's attributes, every
random generator they hold, and torch's, numpy's and Python's global generators.
The transform runs on a copy of itself. A buffer whose prefetch worker or
priority updates are still running is refused (:class:`DiagnoseRefused`), not
waited on for long and not disturbed.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

# A stage "dominates" from this share of the sample on.
DOMINANT_SHARE = 0.5
# How long diagnose waits for prefetched samples or priority updates still running.
SETTLE_SECONDS = 2.0

# (name, label): the order of the table. The first six are what ``sample()`` runs.
STAGES = (
    ("boundaries", "sampler: trajectory boundaries"),
    ("sampler", "sampler: index draw"),
    ("gather", "storage gather"),
    ("transform", "transform"),
    ("pin_memory", "pin memory"),
    ("info", "info entries into the sample"),
    ("to_device", "host->device copy, blocking"),
    ("to_device_non_blocking", "host->device, non_blocking from pinned"),
)
SAMPLE_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory", "info")
# Stages a prefetch worker runs; TensorDictReplayBuffer.sample writes the info
# entries on the caller's thread.
PREFETCHED_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory")
_LABELS = dict(STAGES)


class DiagnoseRefused(RuntimeError):
    """:func:`diagnose` cannot time this buffer without disturbing it (or does not know its layout)."""


@dataclass(frozen=True)
class Finding:
    """A problem :func:`diagnose` found.

    Attributes:
        code (str): a short stable identifier (``"slice-boundaries"``, ...).
        message (str): one line, with the measured share where there is one.
        remedy (str): what to change.
    """

    code: str
    message: str
    remedy: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "remedy": self.remedy}


@dataclass
class DiagnoseReport:
    """What :func:`diagnose` measured and found.

    Attributes:
        stages (dict): stage name -> median seconds per sample, for the stages measured.
        not_measured (dict): stage name -> why it was not measured.
        findings (list of Finding): the problems found, largest share first.
        buffer (dict): what was diagnosed (classes, sizes, batch size, samples).
        prefetch (dict): the prefetch depth and what it takes off the training thread.
        notes (list of str): what the timing left out or approximated.
    """

    stages: dict[str, float]
    not_measured: dict[str, str]
    findings: list[Finding]
    buffer: dict[str, Any]
    prefetch: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def sample_seconds(self) -> float:
        """The median seconds of one ``sample()``: the sum of the sample stages measured."""
        return sum(self.stages.get(name, 0.0) for name in SAMPLE_STAGES)

    def share(self, stage: str) -> float:
        """The share of one ``sample()`` that ``stage`` takes (0 when not measured)."""
        total = self.sample_seconds
        return self.stages.get(stage, 0.0) / total if total > 0 else 0.0

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": dict(self.stages),
            "not_measured": dict(self.not_measured),
            "sample_seconds": self.sample_seconds,
            "findings": [finding.to_dict() for finding in self.findings],
            "buffer": dict(self.buffer),
            "prefetch": dict(self.prefetch),
            "notes": list(self.notes),
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        buf = self.buffer
        lines = [
            f"replay buffer: {buf['buffer']}, {buf['sampler']}, {buf['storage']} "
            f"({buf['stored']:,} of {buf['capacity']:,} rows), batch {buf['batch_size']}, "
            f"median of {buf['samples']} samples",
            f"torchrl {buf['torchrl']}; " + "; ".join(f"{k}: {v}" for k, v in buf["fixes"].items()),
            "",
        ]
        header = ("stage", "median/sample", "share", "")
        rows = []
        for name, label in STAGES:
            if name in self.stages:
                seconds = self.stages[name]
                if name in SAMPLE_STAGES:
                    share = self.share(name)
                    rows.append((label, _format_seconds(seconds), f"{share:.1%}", "#" * round(share * 30)))
                else:
                    rows.append((label, _format_seconds(seconds), "", ""))
            else:
                rows.append((label, "-", "", self.not_measured.get(name, "")))
        rows.append(("sample() total", _format_seconds(self.sample_seconds), "100.0%", ""))
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
        for row in (header, *rows):
            lines.append(
                f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  "
                f"{row[2].rjust(widths[2])}  {row[3]}".rstrip()
            )
        lines.append(f"prefetch: {self.prefetch['summary']}")
        lines += [f"note: {note}" for note in self.notes]
        lines.append("")
        if not self.findings:
            lines.append("findings: none")
        else:
            lines.append("findings:")
            for finding in self.findings:
                lines.append(f"  [{finding.code}] {finding.message}")
                lines.append(f"      remedy: {finding.remedy}")
        return "\n".join(lines)

    def save_png(self, path) -> str:
        """Writes a bar chart of the stages to ``path`` (needs matplotlib); returns the path.

        Raises:
            ImportError: matplotlib is not installed.
        """
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        names = [name for name, _ in STAGES if name in self.stages]
        values = [self.stages[name] * 1e3 for name in names]
        colors = ["tab:red" if name in SAMPLE_STAGES and self.share(name) >= DOMINANT_SHARE
                  else "tab:blue" for name in names]
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
        ax.barh([_LABELS[name] for name in names][::-1], values[::-1], color=colors[::-1])
        ax.set_xlabel("median ms per sample")
        buf = self.buffer
        ax.set_title(f"{buf['sampler']}, {buf['storage']} ({buf['stored']:,} rows), batch {buf['batch_size']}",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return str(path)


def _format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _format_share(share: float) -> str:
    return f"{share:.0%}"


def _accelerator_available() -> bool:
    from torchrl_fixes.fixes.pinned_sample_output import _pin_memory_available

    return _pin_memory_available()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        accelerator.synchronize()


# ---------------------------------------------------------------------------
# The buffer's parts, as TorchRL composes them.


@dataclass
class _Parts:
    buffer: Any
    sampler: Any
    storage: Any
    writer: Any
    sample_unit: Any
    transform: Any
    collate_fn: Any
    storage_index: Any
    set_dispatch: Any
    tensordict_sample: bool
    notes: list[str]


def _buffer_parts(buffer) -> _Parts:
    """The sampler, storage, transform... of ``buffer``, or DiagnoseRefused on a layout not known."""
    try:
        from torchrl.data import ReplayBuffer, TensorDictReplayBuffer
    except ImportError as err:  # pragma: no cover - torchrl is a requirement
        raise DiagnoseRefused(f"diagnose needs torchrl ({err})") from err
    if not isinstance(buffer, ReplayBuffer):
        raise DiagnoseRefused(
            f"diagnose times a torchrl ReplayBuffer in this process; got {type(buffer).__name__}"
        )
    for name in ("ReplayBufferEnsemble", "RemoteTensorDictReplayBuffer"):
        if any(cls.__name__ == name for cls in type(buffer).__mro__):
            raise DiagnoseRefused(f"diagnose does not time a {name}: its sample() is not one buffer's")
    missing = [
        name
        for name in ("_sampler", "_storage", "_writer", "_transform", "_pin_memory", "_prefetch", "_collate_fn")
        if name not in vars(buffer)
    ]
    if getattr(buffer, "_delayed_init", False) and not getattr(buffer, "initialized", True):
        raise DiagnoseRefused("the buffer is not initialised yet (delayed_init): add data to it first")
    if missing:
        raise DiagnoseRefused(
            f"diagnose does not know this TorchRL's replay buffer layout: {type(buffer).__name__} "
            f"has no {', '.join(missing)} (known: torchrl 0.14 and TorchRL main as of 2026-10)"
        )
    base = sys.modules[ReplayBuffer.__module__]
    storage_index = getattr(base, "_storage_index", None)
    notes = []
    if storage_index is None:
        notes.append("this TorchRL has no _storage_index: indices gathered as the sampler returns them")
        storage_index = _same_index
    set_dispatch = getattr(base, "_set_dispatch_td_nn_modules", None)
    sampler = buffer._sampler
    if getattr(buffer, "_sync", True) is False and getattr(buffer, "prioritized_sampler", None) is not None:
        sampler = buffer.prioritized_sampler
        notes.append("asynchronous priorities: the catch-up of pending priority writes is not timed")
    known = {ReplayBuffer, TensorDictReplayBuffer}
    owner = next(cls for cls in type(buffer).__mro__ if "_sample" in vars(cls))
    if owner not in known and owner.__module__.split(".")[0] == "torchrl" and "prioritized" not in owner.__module__:
        notes.append(f"{owner.__name__}._sample is timed as ReplayBuffer._sample composes its stages")
    elif owner not in known and owner.__module__.split(".")[0] != "torchrl":
        notes.append(f"{owner.__name__}._sample (yours) is timed as ReplayBuffer._sample composes its stages")
    return _Parts(
        buffer=buffer,
        sampler=sampler,
        storage=buffer._storage,
        writer=buffer._writer,
        sample_unit=vars(buffer).get("_sample_unit"),
        transform=buffer._transform,
        collate_fn=buffer._collate_fn,
        storage_index=storage_index,
        set_dispatch=set_dispatch,
        tensordict_sample=isinstance(buffer, TensorDictReplayBuffer),
        notes=notes,
    )


def _same_index(index, storage):
    return index


def _fix_state(name: str, obj: Any, noun: str = "object") -> tuple[bool, str]:
    """Whether fix ``name`` runs for ``obj``, and if not, why."""
    import torchrl_fixes
    from torchrl_fixes._core.registry import STOCK_MARK

    row = torchrl_fixes.status()[name]
    if not row.applied:
        return False, f"{row.state} ({row.reason})" if row.reason else row.state
    if getattr(obj, "__dict__", {}).get(STOCK_MARK, False):
        return False, f"inactive for this {noun} (built inside torchrl_fixes.disabled())"
    return True, "applied"


# ---------------------------------------------------------------------------
# Putting back what timing touches.


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
    # the buffer, storage and writer are only read: a shallow copy puts back any rebinding
    shallow = [(obj, dict(vars(obj))) for obj in (parts.buffer, parts.storage, parts.writer)]
    length = len(parts.storage)
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
    if len(parts.storage) != length:  # pragma: no cover - a bug of this module
        raise AssertionError("diagnose changed the storage's length")


@contextlib.contextmanager
def _quiescent(buffer) -> Iterator[None]:
    """Holds the buffer's futures lock while no prefetch or update is running; refuses otherwise."""
    pending = [
        *getattr(buffer, "_prefetch_queue", ()),
        *getattr(buffer, "_pending_update_futures", ()),
    ]
    dependency = getattr(buffer, "_sample_dependency", None)
    if dependency is not None:
        pending.append(dependency)
    running = [future for future in pending if not future.done()]
    if running:
        concurrent.futures.wait(running, timeout=SETTLE_SECONDS)
    lock = getattr(buffer, "_futures_lock", None) or contextlib.nullcontext()
    with lock:
        running = [future for future in pending if not future.done()]
        if running:
            raise DiagnoseRefused(
                f"the buffer has {len(running)} prefetched sample(s) or priority update(s) still "
                f"running in a worker thread after {SETTLE_SECONDS:g} s; timing its sampler now "
                "would race with them and change what they return. Call diagnose(rb) when they "
                "are done (for example before the first rb.sample(), or between two training steps)"
            )
        yield


# ---------------------------------------------------------------------------
# Timing.


class _Clock:
    def __init__(self):
        self.times: dict[str, list[float]] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.times.setdefault(stage, []).append(seconds)

    def medians(self) -> dict[str, float]:
        return {stage: statistics.median(values) for stage, values in self.times.items()}


def _is_slice_sampler(sampler) -> bool:
    try:
        from torchrl.data.replay_buffers.samplers import SliceSampler
    except ImportError:  # pragma: no cover
        return False
    return isinstance(sampler, SliceSampler) and not getattr(sampler, "fragmented", False)


def _timed_boundaries(sampler, elapsed: list[float]):
    """An instance attribute shadowing ``sampler._get_stop_and_length`` that adds its time to ``elapsed``."""
    bound = type(sampler)._get_stop_and_length.__get__(sampler)
    depth = [0]

    @functools.wraps(bound)
    def _get_stop_and_length(*args, **kwargs):
        if depth[0]:  # the stock code calls itself again for its fallback key
            return bound(*args, **kwargs)
        depth[0] += 1
        start = time.perf_counter()
        try:
            return bound(*args, **kwargs)
        finally:
            elapsed[0] += time.perf_counter() - start
            depth[0] -= 1

    return _get_stop_and_length


def _leaves(obj, prefix=()) -> Iterator[tuple[tuple, torch.Tensor]]:
    from tensordict import is_tensor_collection

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


def _pin(parts: _Parts, patched: bool, output):
    """The buffer's pinning of ``(data, info)``: the fixed one, or stock's."""
    if patched:
        from torchrl_fixes.fixes.pinned_sample_output import _pin_memory

        return _pin_memory(output)
    from torchrl.data.replay_buffers import utils

    return tuple(utils._pin_memory(item) for item in output)


def _write_info(parts: _Parts, patched_pin: bool, data, info):
    """What ``TensorDictReplayBuffer.sample`` does with the info: set it into the sample."""
    from tensordict import is_tensor_collection, is_tensorclass
    from tensordict.utils import expand_as_right
    from torchrl.data.replay_buffers.utils import _to_torch

    if not is_tensor_collection(data) or is_tensorclass(data):
        return data
    from torchrl_fixes.fixes.pinned_sample_output import _pin_memory

    is_locked = data.is_locked
    if is_locked:
        data.unlock_()
    for key, val in info.items():
        if key == "index" and isinstance(val, tuple):
            val = torch.stack(val, -1)
        val = _to_torch(val, data.device)
        if patched_pin:
            val = _pin_memory(val)
        if val.ndim < data.ndim:
            val = expand_as_right(val, data)
        data.set(key, val)
    if is_locked:
        data.lock_()
    return data


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


def _measure(parts: _Parts, batch_size: int, samples: int, device, clock: _Clock, observed: _Observed,
             patched_pin: bool, transform) -> None:
    from tensordict import is_tensor_collection

    buffer, sampler, storage = parts.buffer, parts.sampler, parts.storage
    slice_sampler = _is_slice_sampler(sampler)
    elapsed = [0.0]
    if slice_sampler:
        vars(sampler)["_get_stop_and_length"] = _timed_boundaries(sampler, elapsed)
    pinning = bool(buffer._pin_memory) and _accelerator_available()
    tracks_generations = getattr(parts.writer, "tracks_generations", False)
    set_names = getattr(sampler, "_set_sample_names", None)
    for i in range(samples):
        elapsed[0] = 0.0
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
        if slice_sampler:
            clock.add("boundaries", elapsed[0])
        clock.add("sampler", drawn - start - elapsed[0])
        clock.add("gather", gathered - drawn)
        observed.gathered_bytes.append(_nbytes(data))
        if i == 0 and slice_sampler:
            observed.boundary_read = _boundary_read(sampler, storage)
        if transform is not None:
            start = time.perf_counter()
            is_td = is_tensor_collection(data)
            dispatch = parts.set_dispatch(is_td) if parts.set_dispatch is not None else contextlib.nullcontext()
            with data.unlock_() if is_td else contextlib.nullcontext(), dispatch:
                data = transform(data)
            clock.add("transform", time.perf_counter() - start)
            if i == 0:
                observed.transformed_device_none = is_tensor_collection(data) and data.device is None
        if pinning:
            start = time.perf_counter()
            data, info = _pin(parts, patched_pin, (data, info))
            clock.add("pin_memory", time.perf_counter() - start)
        if parts.tensordict_sample:
            start = time.perf_counter()
            data = _write_info(parts, patched_pin and pinning, data, info)
            clock.add("info", time.perf_counter() - start)
        if i == 0:
            observed.first_data = data
            observed.info_keys = {_name(key) for key in info}
        if device is not None and hasattr(data, "to"):
            _time_copy(data, device, clock)


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


def _boundary_read(sampler, storage) -> tuple[str, Any] | None:
    """What the sampler's boundary recovery read: ("trajectory", key) or ("end", key)."""
    from torchrl_fixes.fixes.slice_boundary_index import boundary_source

    active, _ = _fix_state("slice_boundary_index", sampler)
    if active:
        from torchrl_fixes.fixes.slice_boundary_index import fallback_reason

        if fallback_reason(sampler, storage) is None:
            return boundary_source(storage)
    if "static-stop-and-length" in getattr(sampler, "_cache", {}):
        return None
    if getattr(sampler, "_fetch_traj", False):
        key = vars(sampler).get("__used_traj_key") or sampler.traj_key
        return ("trajectory", key)
    end_keys = getattr(sampler, "end_keys", None)
    return ("end", tuple(end_keys) if end_keys is not None else sampler.end_key)


def _unpinned_leaves(parts: _Parts, data, patched_pin: bool, observed: _Observed) -> tuple[list[str], int, bool]:
    """Returned tensors not pinned: measured with an accelerator, predicted without one.

    Returns (names, number of tensors, measured).
    """
    from tensordict import is_tensor_collection

    leaves = list(_leaves(data))
    names = [_name(key) for key, _ in leaves]
    if _accelerator_available():
        return [n for n, (_, t) in zip(names, leaves) if t.device.type == "cpu" and not t.is_pinned()], len(leaves), True
    if patched_pin:
        return [], len(leaves), False
    # stock pins the output of _sample only where it has device == cpu, and never the
    # info entries TensorDictReplayBuffer.sample sets afterwards
    data_pinned = (is_tensor_collection(data) and data.device == torch.device("cpu")) or (
        isinstance(data, torch.Tensor) and data.device.type == "cpu"
    )
    unpinned = []
    for name in names:
        is_info = parts.tensordict_sample and name in observed.info_keys
        if is_info or not data_pinned:
            unpinned.append(name)
    return unpinned, len(leaves), False


# ---------------------------------------------------------------------------
# Findings.


def _stock_slice_reason(report_facts: dict) -> str:
    state = report_facts["slice_fix"]
    if state["active"] and state["fallback"] is None:
        return (
            "the slice_boundary_index fix is applied and used: the remaining cost grows with "
            f"the number of trajectories ({report_facts.get('trajectories', 'unknown')})"
        )
    if state["active"]:
        return f"the slice_boundary_index fix is applied, but this configuration falls back to stock code: {state['fallback']}"
    return f"the slice_boundary_index fix is {state['why']}: stock recovery reads a whole column of the storage at every sample"


def findings_from(stages: dict[str, float], facts: dict) -> list[Finding]:
    """The findings for measured ``stages`` (median seconds) and the buffer's ``facts``.

    ``facts`` holds what :func:`diagnose` observed: ``pin_memory``, ``prefetch``,
    ``accelerator`` (bool), ``device`` (str or None), ``unpinned`` (names),
    ``tensors``, ``pinned_measured`` (bool), ``transformed_device_none``,
    ``patched_pin``, ``slice_fix`` ({"active", "why", "fallback"}), ``boundary_read``,
    ``has_done``, ``traj_key_named``, ``trajectories``, ``gathered_bytes``,
    ``storage`` (class name), ``memmap_dir``.
    """
    total = sum(stages.get(name, 0.0) for name in SAMPLE_STAGES)

    def share(name):
        return stages.get(name, 0.0) / total if total > 0 else 0.0

    # (share of the sample, finding); findings about the configuration rather than a
    # measured share come after those, with negative keys
    found: list[tuple[float, Finding]] = []
    if "boundaries" in stages and share("boundaries") >= DOMINANT_SHARE:
        why = _stock_slice_reason(facts)
        read = facts.get("boundary_read")
        fix = facts["slice_fix"]
        remedies = []
        if not fix["active"]:
            remedies.append(
                "import torchrl_fixes before building the buffer (without TORCHRL_FIXES=0, "
                "outside torchrl_fixes.disabled())"
                if "skipped" not in fix["why"]
                else "the fix cannot apply to this TorchRL (see python -m torchrl_fixes); "
                "cache_values=True keeps stock boundaries between writes"
            )
        elif fix["fallback"] is not None:
            remedies.append(f"change what falls back ({fix['fallback']}), see torchrl_fixes.status()")
        ids_for_done = (
            read is not None and read[0] == "trajectory" and facts.get("has_done")
            and (not fix["active"] or fix["fallback"] is not None or facts.get("traj_key_named"))
        )
        if ids_for_done:
            why += f"; it reads the trajectory ids {read[1]!r} where the ('next', 'done') flags would do"
            remedies.append(
                "SliceSampler(end_key=('next', 'done')) (and no traj_key): a boolean column is 8x "
                "smaller than int64 ids"
            )
        if fix["active"] and fix["fallback"] is None and not ids_for_done:
            remedies.append("fewer, longer trajectories per stored row, or a larger batch per sample")
        found.append((share("boundaries"), Finding(
            "slice-boundaries",
            f"trajectory-boundary recovery takes {_format_share(share('boundaries'))} of each sample "
            f"({_format_seconds(stages['boundaries'])}): {why}",
            "; ".join(remedies),
        )))
    if facts["pin_memory"] and not facts["accelerator"]:
        behaviour = (
            "samples come back unpinned, with one warning"
            if facts["patched_pin"]
            else "stock TorchRL raises RuntimeError at the first sample()"
        )
        found.append((-3.0, Finding(
            "pin-memory-no-accelerator",
            f"pin_memory=True, but no accelerator is available: {behaviour}",
            "pass pin_memory=torch.cuda.is_available() (or False here); pinned memory only "
            "serves copies to an accelerator"
            + ("" if facts["patched_pin"] else "; with torchrl_fixes imported the buffer warns and carries on"),
        )))
    if facts["pin_memory"] and facts["unpinned"]:
        unpinned = facts["unpinned"]
        causes = []
        if facts.get("transformed_device_none") and not facts["patched_pin"]:
            causes.append("the transform returns a TensorDict with device=None, which stock pinning skips")
        if not facts["patched_pin"] and any(n in ("index", "index_generation") for n in unpinned):
            causes.append("TensorDictReplayBuffer.sample writes the info entries after pinning")
        shown = ", ".join(unpinned[:4]) + (", ..." if len(unpinned) > 4 else "")
        lead = (
            f"pin_memory=True, but {len(unpinned)} of {facts['tensors']} returned tensors are not pinned"
            if facts["pinned_measured"]
            else f"pin_memory=True, but even with an accelerator {len(unpinned)} of "
            f"{facts['tensors']} returned tensors would not be pinned"
        )
        found.append((-2.0, Finding(
            "pin-memory-unpinned",
            f"{lead} ({shown})" + (f": {'; '.join(causes)}" if causes else ""),
            "import torchrl_fixes (pinned_sample_output pins every tensor sample() returns), or have "
            "the transform return a TensorDict on device='cpu'",
        )))
    if "pin_memory" in stages and not facts["prefetch"]:
        found.append((share("pin_memory"), Finding(
            "pinned-on-training-thread",
            f"pinning takes {_format_share(share('pin_memory'))} of each sample "
            f"({_format_seconds(stages['pin_memory'])}) on the training thread: the buffer has no prefetch",
            "ReplayBuffer(..., prefetch=2) samples and pins in a worker thread while the model trains",
        )))
    if "to_device" in stages and facts.get("unpinned_source"):
        non_blocking = stages.get("to_device_non_blocking")
        tail = (
            f"; from pinned memory with non_blocking=True the training thread spends "
            f"{_format_seconds(non_blocking)}" if non_blocking is not None else ""
        )
        found.append((-1.0, Finding(
            "unpinned-transfer",
            f"copying each sample to {facts['device']} from pageable memory takes "
            f"{_format_seconds(stages['to_device'])} (blocking){tail}",
            "pin_memory=True on the buffer (with torchrl_fixes imported) and "
            "sample.to(device, non_blocking=True)",
        )))
    if "transform" in stages and share("transform") >= DOMINANT_SHARE:
        found.append((share("transform"), Finding(
            "transform-dominates",
            f"the transform takes {_format_share(share('transform'))} of each sample "
            f"({_format_seconds(stages['transform'])})",
            "run it on the device after the copy, batch or vectorise it, or take it off the "
            "training thread with prefetch",
        )))
    if "gather" in stages and share("gather") >= DOMINANT_SHARE:
        seconds = stages["gather"]
        bandwidth = facts.get("gathered_bytes", 0) / seconds if seconds > 0 else 0.0
        where = f" at {facts['memmap_dir']}" if facts.get("memmap_dir") else ""
        found.append((share("gather"), Finding(
            "storage-gather-dominates",
            f"the storage gather takes {_format_share(share('gather'))} of each sample "
            f"({_format_seconds(seconds)}, {bandwidth / 1e6:,.0f} MB/s read from "
            f"{facts.get('storage', 'the storage')}{where})",
            "a memmap storage on a faster disk (local SSD, tmpfs), LazyTensorStorage in RAM if it "
            "fits, fewer or smaller stored keys, or prefetch to overlap the reads",
        )))
    found.sort(key=lambda pair: -pair[0])
    return [finding for _, finding in found]


# ---------------------------------------------------------------------------


def diagnose(buffer, *, samples: int = 20, device=None, batch_size: int | None = None) -> DiagnoseReport:
    """Times each stage of ``buffer.sample()`` and says what slows it down, changing nothing.

    The stages, each a median over ``samples`` samples: the sampler's index draw
    (``boundaries``: a slice sampler's trajectory-boundary recovery, on its own;
    ``sampler``: the rest), the storage ``gather``, the ``transform``,
    ``pin_memory``, the ``info`` entries ``TensorDictReplayBuffer.sample`` writes
    into the sample, and, for an accelerator ``device``, the host->device copy
    (``to_device``, blocking; ``to_device_non_blocking``, the training thread's
    time to issue it from pinned memory). The report also says whether
    ``prefetch`` takes the sampling off the training thread, and lists its
    findings with a remedy each.

    After it returns, ``buffer`` samples exactly what it would have sampled
    without it: the sampler's and storage's state, the prefetch queue, the
    buffer's generators and torch's, numpy's and Python's global generators are
    as they were.

    Args:
        buffer (ReplayBuffer): the buffer to time, with data in it.

    Keyword Args:
        samples (int, optional): samples to time. Defaults to ``20``.
        device (torch.device or str, optional): where the training step sends the
            sample; an accelerator device adds the host->device stages. Defaults to
            ``None`` (no copy timed).
        batch_size (int, optional): the batch size to sample; defaults to the buffer's.

    Returns:
        DiagnoseReport: ``str(report)`` is the table and the findings;
        ``report.to_dict()`` the same as data; ``report.save_png(path)`` a bar chart.

    Raises:
        DiagnoseRefused: the buffer cannot be timed without disturbing it (prefetch
            or priority updates still running), is empty, or has a layout this
            module does not know.

    Examples:
        >>> import time, torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(100, 3)}, [100]))
        >>> def slow(td):
        ...     time.sleep(0.02)
        ...     return td
        >>> _ = rb.append_transform(slow)
        >>> report = torchrl_fixes.diagnose(rb, samples=3)
        >>> sorted(report.to_dict()["stages"])
        ['gather', 'info', 'sampler', 'transform']
        >>> report.codes
        ['transform-dominates']
        >>> print(report)  # doctest: +SKIP
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    parts = _buffer_parts(buffer)
    if batch_size is None:
        batch_size = getattr(buffer, "_batch_size", None)
    if batch_size is None:
        raise ValueError("the buffer has no batch_size: pass diagnose(rb, batch_size=...)")
    if device is not None:
        device = torch.device(device)
    patched_pin, pin_why = _fix_state("pinned_sample_output", buffer, "buffer")
    slice_active, slice_why = _fix_state("slice_boundary_index", parts.sampler, "sampler")
    not_measured: dict[str, str] = {}
    if not _is_slice_sampler(parts.sampler):
        not_measured["boundaries"] = "not a slice sampler"
    accelerator = _accelerator_available()
    if not buffer._pin_memory:
        not_measured["pin_memory"] = "pin_memory=False"
    elif not accelerator:
        not_measured["pin_memory"] = "no accelerator: nothing is pinned"
    if not parts.tensordict_sample:
        not_measured["info"] = "ReplayBuffer.sample returns the info apart"
    copy_device = None
    if device is None:
        why = "no device given"
    elif device.type in ("cpu", "meta"):
        why = f"{device.type} is not an accelerator: no host->device copy"
    elif not accelerator:
        why = f"no accelerator: {device} is not available here"
    else:
        copy_device, why = device, None
    if why is not None:
        not_measured["to_device"] = not_measured["to_device_non_blocking"] = why

    clock, observed = _Clock(), _Observed()
    with _quiescent(buffer):
        if len(parts.storage) == 0:
            raise DiagnoseRefused("the buffer is empty: there is nothing to sample")
        transform, transform_why = _transform_copy(parts)
        if transform_why is not None:
            not_measured["transform"] = transform_why
        fallback = None
        if slice_active and _is_slice_sampler(parts.sampler):
            from torchrl_fixes.fixes.slice_boundary_index import fallback_reason

            fallback = fallback_reason(parts.sampler, parts.storage)
        # the buffer's locks, held throughout: a write or a sample from another thread
        # waits until everything is put back (the futures lock is held already)
        replay_lock = getattr(buffer, "_replay_lock", None) or contextlib.nullcontext()
        write_lock = getattr(buffer, "_write_lock", None) or contextlib.nullcontext()
        with replay_lock, write_lock, _untouched(parts):
            _measure(parts, batch_size, samples, copy_device, clock, observed, patched_pin, transform)
            trajectories = _trajectory_count(parts)
    stages = clock.medians()
    unpinned, tensors, measured = (
        _unpinned_leaves(parts, observed.first_data, patched_pin, observed)
        if buffer._pin_memory
        else ([], 0, False)
    )
    storage = parts.storage
    storage_keys = _storage_keys(storage)
    facts = {
        "pin_memory": bool(buffer._pin_memory),
        "prefetch": int(getattr(buffer, "_prefetch_cap", 0) or 0) if buffer._prefetch else 0,
        "accelerator": accelerator,
        "device": str(device) if device is not None else None,
        "unpinned": unpinned,
        "tensors": tensors,
        "pinned_measured": measured,
        "unpinned_source": copy_device is not None and observed.first_data is not None
        and not all(t.is_pinned() for _, t in _leaves(observed.first_data)),
        "transformed_device_none": observed.transformed_device_none,
        "patched_pin": patched_pin,
        "slice_fix": {"active": slice_active, "why": slice_why, "fallback": fallback},
        "boundary_read": observed.boundary_read,
        "has_done": ("next", "done") in storage_keys,
        "traj_key_named": bool(vars(parts.sampler).get("_traj_key_named", False)),
        "trajectories": trajectories,
        "gathered_bytes": statistics.median(observed.gathered_bytes) if observed.gathered_bytes else 0,
        "storage": type(storage).__name__,
        "memmap_dir": _memmap_dir(storage),
    }
    buffer_facts = {
        "buffer": type(buffer).__name__,
        "sampler": type(parts.sampler).__name__,
        "storage": type(storage).__name__,
        "stored": len(storage),
        "capacity": int(getattr(storage, "max_size", len(storage)) or len(storage)),
        "batch_size": int(batch_size),
        "samples": samples,
        "device": facts["device"],
        "pin_memory": facts["pin_memory"],
        "boundary_read": list(observed.boundary_read) if observed.boundary_read else None,
        "torchrl": _torchrl_version(),
        "fixes": {"slice_boundary_index": slice_why, "pinned_sample_output": pin_why},
    }
    report = DiagnoseReport(
        stages=stages,
        not_measured=not_measured,
        findings=findings_from(stages, facts),
        buffer=buffer_facts,
        prefetch=_prefetch_summary(stages, facts["prefetch"]),
        notes=list(parts.notes),
    )
    return report


def _prefetch_summary(stages: dict[str, float], depth: int) -> dict[str, Any]:
    on_thread = [name for name in SAMPLE_STAGES if name in stages]
    if depth:
        off = [name for name in PREFETCHED_STAGES if name in stages]
        on_thread = [name for name in on_thread if name not in off]
        hidden = sum(stages[name] for name in off)
        stays = sum(stages[name] for name in on_thread)
        summary = (
            f"prefetch={depth}: {', '.join(off)} run in a worker thread "
            f"({_format_seconds(hidden)} per sample, hidden while a training step lasts longer; "
            "Python code in the worker still competes for the GIL)"
            + (f"; {', '.join(on_thread)} ({_format_seconds(stays)}) stay on the training thread" if on_thread else "")
        )
    else:
        off = []
        summary = "off: every stage above runs on the training thread (ReplayBuffer(..., prefetch=N) moves sampling to a worker)"
    if "to_device" in stages:
        summary += "; the host->device copy is always on the training thread"
    return {
        "depth": depth,
        "off_training_thread": off,
        "on_training_thread": on_thread + [n for n in ("to_device",) if n in stages],
        "all_off_training_thread": bool(depth) and not on_thread,
        "summary": summary,
    }


def _storage_keys(storage) -> set:
    from tensordict import is_tensor_collection

    inner = getattr(storage, "_storage", None)
    if not is_tensor_collection(inner):
        return set()
    try:
        return set(inner.keys(include_nested=True))
    except Exception:
        return set()


def _memmap_dir(storage) -> str | None:
    if type(storage).__name__ != "LazyMemmapStorage" and not any(
        cls.__name__ == "LazyMemmapStorage" for cls in type(storage).__mro__
    ):
        return None
    return str(getattr(storage, "scratch_dir", None) or "a temporary directory")


def _trajectory_count(parts: _Parts):
    """How many trajectories the slice sampler sees (None when not a slice sampler)."""
    if not _is_slice_sampler(parts.sampler):
        return None
    try:
        _, _, lengths = parts.sampler._get_stop_and_length(parts.storage)
    except Exception:
        return None
    return int(lengths.numel())


def _torchrl_version() -> str:
    from torchrl_fixes._core.versions import installed_version

    return str(installed_version("torchrl") or "unknown")


# ---------------------------------------------------------------------------
# The demonstration buffer of ``python -m torchrl_fixes diagnose --demo``.

DEMO_STORED = 5_000_000


def demo_buffer(stored: int = DEMO_STORED, episode: int = 1000, batch_size: int = 256):
    """A slow configuration: a stock slice sampler over ``stored`` rows, pin_memory with a transform that breaks it.

    The buffer and its sampler are built inside :func:`torchrl_fixes.disabled`, so
    they run stock TorchRL code whatever fixes are applied. Only small keys are
    stored (an observation, the episode ids and the done flags).
    """
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer
    from torchrl.envs.transforms import Transform

    import torchrl_fixes

    class RebuildTensorDict(Transform):
        """Returns a new TensorDict without a device: stock pin_memory skips it."""

        def forward(self, tensordict):
            return TensorDict(dict(tensordict.items()), batch_size=tensordict.batch_size)

    step = torch.arange(stored)
    data = TensorDict(
        {
            "observation": torch.randn(stored, 4),
            "episode": step // episode,
            ("next", "done"): (step % episode == episode - 1).unsqueeze(-1),
        },
        batch_size=[stored],
    )
    with torchrl_fixes.disabled():
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(stored),
            sampler=SliceSampler(num_slices=batch_size // 8),
            batch_size=batch_size,
            pin_memory=True,
        )
    rb.append_transform(RebuildTensorDict())
    rb.extend(data)
    return rb


__all__ = [
    "DOMINANT_SHARE",
    "DiagnoseRefused",
    "DiagnoseReport",
    "Finding",
    "STAGES",
    "demo_buffer",
    "diagnose",
    "findings_from",
]
