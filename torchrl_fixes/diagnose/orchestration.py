"""The steps of one diagnosis: check the arguments, decide the stages, time them untouched, report.

:func:`run_diagnosis` is :func:`~torchrl_fixes.diagnose.diagnose` without its
defaults: it finds the buffer's parts, decides which stages can be timed (and says
why the others cannot), times them while the buffer is quiescent and its state is
put back afterwards, and builds the :class:`DiagnoseReport` from the medians and
the facts observed.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from torchrl_fixes._core.versions import installed_version
from torchrl_fixes.diagnose.buffer_parts import (
    _buffer_parts,
    _fix_state,
    _is_slice_sampler,
    _memmap_dir,
    _Parts,
    _storage_keys,
    _trajectory_count,
)
from torchrl_fixes.diagnose.findings import _prefetch_summary, findings_from
from torchrl_fixes.diagnose.report import DiagnoseRefused, DiagnoseReport
from torchrl_fixes.diagnose.snapshot import _quiescent, _transform_copy, _untouched
from torchrl_fixes.diagnose.stage_timing import (
    _accelerator_available,
    _Clock,
    _info_code_unknown,
    _leaves,
    _measure,
    _Observed,
    _unpinned_leaves,
)
from torchrl_fixes.fixes.slice_boundary_index import fallback_reason
from torchrl_fixes.fixes.slice_boundary_index.storage_index import END_KEY


@dataclass
class _Plan:
    """What to time, decided before timing."""

    batch_size: int
    samples: int
    device: torch.device | None  # where the training step sends the sample
    copy_device: torch.device | None  # where the host->device copy is timed to (None: not timed)
    accelerator: bool
    patched_pin: bool
    pin_why: str
    slice_active: bool
    slice_why: str
    not_measured: dict[str, str]


@dataclass
class _Timed:
    """What timing the stages gave."""

    stages: dict[str, float]
    observed: _Observed
    trajectories: int | None
    fallback: str | None


def run_diagnosis(buffer, *, samples: int, device, batch_size: int | None,
                  settle_seconds: float) -> DiagnoseReport:
    """:func:`~torchrl_fixes.diagnose.diagnose`, waiting ``settle_seconds`` at most for a busy buffer."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    parts = _buffer_parts(buffer)
    plan = _plan(parts, samples, device, batch_size)
    timed = _time_stages(parts, plan, settle_seconds)
    facts = _facts(parts, plan, timed)
    return DiagnoseReport(
        stages=timed.stages,
        not_measured=plan.not_measured,
        findings=findings_from(timed.stages, facts),
        buffer=_buffer_facts(parts, plan, timed, facts),
        prefetch=_prefetch_summary(timed.stages, facts["prefetch"]),
        notes=list(parts.notes),
    )


def _plan(parts: _Parts, samples: int, device, batch_size: int | None) -> _Plan:
    """The batch size, the devices, the fixes' states, and the stages not measured with why."""
    buffer = parts.buffer
    if batch_size is None:
        batch_size = getattr(buffer, "_batch_size", None)
    if batch_size is None:
        raise ValueError("the buffer has no batch_size: pass diagnose(rb, batch_size=...)")
    if device is not None:
        device = torch.device(device)
    patched_pin, pin_why = _fix_state("pinned_sample_output", buffer, "buffer")
    slice_active, slice_why = _fix_state("slice_boundary_index", parts.sampler, "sampler")
    accelerator = _accelerator_available()
    not_measured: dict[str, str] = {}
    if not _is_slice_sampler(parts.sampler):
        not_measured["boundaries"] = "not a slice sampler"
    if not buffer._pin_memory:
        not_measured["pin_memory"] = "pin_memory=False"
    elif not accelerator:
        not_measured["pin_memory"] = "no accelerator: nothing is pinned"
    if not parts.tensordict_sample:
        not_measured["info"] = "ReplayBuffer.sample returns the info apart"
    else:
        unknown = _info_code_unknown(buffer)
        if unknown is not None:
            not_measured["info"] = unknown
    copy_device, why = _copy_device(device, accelerator)
    if why is not None:
        not_measured["to_device"] = not_measured["to_device_non_blocking"] = why
    return _Plan(
        batch_size=batch_size,
        samples=samples,
        device=device,
        copy_device=copy_device,
        accelerator=accelerator,
        patched_pin=patched_pin,
        pin_why=pin_why,
        slice_active=slice_active,
        slice_why=slice_why,
        not_measured=not_measured,
    )


def _copy_device(device: torch.device | None, accelerator: bool) -> tuple[torch.device | None, str | None]:
    """Where to time the host->device copy to, or (None, why it is not timed)."""
    if device is None:
        return None, "no device given"
    if device.type in ("cpu", "meta"):
        return None, f"{device.type} is not an accelerator: no host->device copy"
    if not accelerator:
        return None, f"no accelerator: {device} is not available here"
    return device, None


def _time_stages(parts: _Parts, plan: _Plan, settle_seconds: float) -> _Timed:
    """Times the stages while the buffer is quiescent and locked, and puts back all it touches."""
    buffer = parts.buffer
    clock, observed = _Clock(), _Observed()
    with _quiescent(buffer, settle_seconds):
        if len(parts.storage) == 0:
            raise DiagnoseRefused("the buffer is empty: there is nothing to sample")
        transform, transform_why = _transform_copy(parts)
        if transform_why is not None:
            plan.not_measured["transform"] = transform_why
        fallback = None
        if plan.slice_active and _is_slice_sampler(parts.sampler):
            fallback = fallback_reason(parts.sampler, parts.storage)
        # the buffer's locks, held throughout: a write or a sample from another thread
        # waits until everything is put back (the futures lock is held already)
        replay_lock = getattr(buffer, "_replay_lock", None) or contextlib.nullcontext()
        write_lock = getattr(buffer, "_write_lock", None) or contextlib.nullcontext()
        with replay_lock, write_lock, _untouched(parts):
            _measure(parts, plan.batch_size, plan.samples, plan.copy_device, clock, observed,
                     plan.patched_pin, transform, write_info="info" not in plan.not_measured)
            trajectories = _trajectory_count(parts)
    return _Timed(stages=clock.medians(), observed=observed, trajectories=trajectories, fallback=fallback)


def _facts(parts: _Parts, plan: _Plan, timed: _Timed) -> dict[str, Any]:
    """What :func:`findings_from` reads besides the stages (its docstring lists them)."""
    buffer, storage, observed = parts.buffer, parts.storage, timed.observed
    unpinned, tensors, measured = (
        _unpinned_leaves(parts, observed.first_data, plan.patched_pin, observed)
        if buffer._pin_memory
        else ([], 0, False)
    )
    storage_keys = _storage_keys(storage)
    return {
        "pin_memory": bool(buffer._pin_memory),
        "prefetch": int(getattr(buffer, "_prefetch_cap", 0) or 0) if buffer._prefetch else 0,
        "accelerator": plan.accelerator,
        "device": str(plan.device) if plan.device is not None else None,
        "unpinned": unpinned,
        "tensors": tensors,
        "pinned_measured": measured,
        "unpinned_source": plan.copy_device is not None and observed.first_data is not None
        and not all(t.is_pinned() for _, t in _leaves(observed.first_data)),
        "transformed_device_none": observed.transformed_device_none,
        "patched_pin": plan.patched_pin,
        "slice_fix": {"active": plan.slice_active, "why": plan.slice_why, "fallback": timed.fallback},
        "boundary_read": observed.boundary_read,
        "has_done": END_KEY in storage_keys,
        "traj_key_named": bool(vars(parts.sampler).get("_traj_key_named", False)),
        "trajectories": timed.trajectories,
        "gathered_bytes": statistics.median(observed.gathered_bytes) if observed.gathered_bytes else 0,
        "storage": type(storage).__name__,
        "memmap_dir": _memmap_dir(storage),
    }


def _buffer_facts(parts: _Parts, plan: _Plan, timed: _Timed, facts: dict[str, Any]) -> dict[str, Any]:
    """What was diagnosed, for the report's header (``DiagnoseReport.buffer``)."""
    storage, boundary_read = parts.storage, timed.observed.boundary_read
    return {
        "buffer": type(parts.buffer).__name__,
        "sampler": type(parts.sampler).__name__,
        "storage": type(storage).__name__,
        "stored": len(storage),
        "capacity": int(getattr(storage, "max_size", len(storage)) or len(storage)),
        "batch_size": int(plan.batch_size),
        "samples": plan.samples,
        "device": facts["device"],
        "pin_memory": facts["pin_memory"],
        "boundary_read": list(boundary_read) if boundary_read else None,
        "torchrl": str(installed_version("torchrl") or "unknown"),
        "fixes": {"slice_boundary_index": plan.slice_why, "pinned_sample_output": plan.pin_why},
    }
