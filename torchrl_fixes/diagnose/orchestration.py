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
from torchrl_fixes.diagnose.after_write import _same_values_write
from torchrl_fixes.diagnose.buffer_parts import (
    _buffer_parts,
    _built_before_the_fix,
    _fix_state,
    _fix_verdicts,
    _is_slice_sampler,
    _memmap_dir,
    _Parts,
    _storage_keys,
    _trajectory_count,
)
from torchrl_fixes.diagnose.findings import _prefetch_summary, findings_from
from torchrl_fixes.diagnose.report import SERVES, DiagnoseRefused, DiagnoseReport, FixVerdict
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
from torchrl_fixes.fixes.slice_boundary_index.storage_index import END_KEY


@dataclass
class _Plan:
    """What to time, decided before timing."""

    batch_size: int
    samples: int
    write_rows: int  # asked for; the write timed is clipped to the rows stored
    device: torch.device | None  # where the training step sends the sample
    copy_device: torch.device | None  # where the host->device copy is timed to (None: not timed)
    accelerator: bool
    not_measured: dict[str, str]


@dataclass
class _Timed:
    """What timing the stages gave."""

    stages: dict[str, float]
    observed: _Observed
    trajectories: int | None
    verdicts: dict[str, FixVerdict]
    pinning_fixed: tuple[bool, bool]  # _pinning_fixed's, as the stages were timed with it
    write_rows: int  # the rows of the write the after_write stage follows (0: none)


def run_diagnosis(buffer, *, samples: int, device, batch_size: int | None, write_rows: int,
                  settle_seconds: float) -> DiagnoseReport:
    """:func:`~torchrl_fixes.diagnose.diagnose`, waiting ``settle_seconds`` at most for a busy buffer."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    if isinstance(write_rows, bool) or not isinstance(write_rows, int) or write_rows < 0:
        raise ValueError(f"write_rows must be an int >= 0 (0: no write timed), got {write_rows!r}")
    parts = _buffer_parts(buffer)
    plan = _plan(parts, samples, device, batch_size, write_rows)
    timed = _time_stages(parts, plan, settle_seconds)
    facts = _facts(parts, plan, timed)
    return DiagnoseReport(
        stages=timed.stages,
        not_measured=plan.not_measured,
        findings=findings_from(timed.stages, facts),
        buffer=_buffer_facts(parts, plan, timed, facts),
        prefetch=_prefetch_summary(timed.stages, facts["prefetch"]),
        notes=list(parts.notes),
        fixes=timed.verdicts,
    )


def _plan(parts: _Parts, samples: int, device, batch_size: int | None, write_rows: int) -> _Plan:
    """The batch size, the devices, and the stages not measured with why."""
    buffer = parts.buffer
    if batch_size is None:
        batch_size = getattr(buffer, "_batch_size", None)
    if batch_size is None:
        raise ValueError("the buffer has no batch_size: pass diagnose(rb, batch_size=...)")
    if device is not None:
        device = torch.device(device)
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
        write_rows=write_rows,
        device=device,
        copy_device=copy_device,
        accelerator=accelerator,
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
    """Judges the fixes and times the stages while the buffer is quiescent and locked; puts back all it touches."""
    buffer = parts.buffer
    clock, observed = _Clock(), _Observed()
    with _quiescent(buffer, settle_seconds):
        if len(parts.storage) == 0:
            raise DiagnoseRefused("the buffer is empty: there is nothing to sample")
        transform, transform_why = _transform_copy(parts)
        if transform_why is not None:
            plan.not_measured["transform"] = transform_why
        # the buffer's locks, held throughout: a write or a sample from another thread
        # waits until everything is put back (the futures lock is held already)
        replay_lock = getattr(buffer, "_replay_lock", None) or contextlib.nullcontext()
        write_lock = getattr(buffer, "_write_lock", None) or contextlib.nullcontext()
        with replay_lock, write_lock, _untouched(parts):
            verdicts = _fix_verdicts(parts)
            rewrite, why, notes = _same_values_write(parts, plan.write_rows)
            if why is not None:
                plan.not_measured["after_write"] = why
            parts.notes.extend(notes)
            index_serves = verdicts["slice_boundary_index"].state == SERVES
            pinning_fixed = _pinning_fixed(parts, verdicts)
            _measure(parts, plan.batch_size, plan.samples, plan.copy_device, clock, observed,
                     pinning_fixed, transform,
                     write_info="info" not in plan.not_measured, index_serves=index_serves, rewrite=rewrite)
            trajectories = _trajectory_count(parts)
    stages = clock.medians()
    if observed.write_failed is not None:
        plan.not_measured["after_write"], rewrite = observed.write_failed, None
    if _is_slice_sampler(parts.sampler) and not observed.boundary_calls:
        # the draw never asked for the boundaries: 0 µs would say they cost nothing
        del stages["boundaries"]
        plan.not_measured["boundaries"] = (
            "in the index draw: read from the storage's trajectory index" if index_serves
            else "this sampler's draw does not call _get_stop_and_length"
        )
    verdicts["slice_boundary_index"] = _ids_read_for_flags(parts, verdicts["slice_boundary_index"], observed)
    return _Timed(stages=stages, observed=observed, trajectories=trajectories, verdicts=verdicts,
                  pinning_fixed=pinning_fixed, write_rows=len(rewrite.rows) if rewrite is not None else 0)


def _pinning_fixed(parts: _Parts, verdicts: dict[str, FixVerdict]) -> tuple[bool, bool]:
    """Whether the fix pins what ``_sample`` returns, and the info entries ``sample()`` writes.

    A buffer class whose ``_sample`` keeps TorchRL's decorator still runs the fix's
    ``sample()``, which pins the info entries.
    """
    verdict = verdicts["pinned_sample_output"]
    if verdict.state == SERVES:
        return True, True
    info_fixed = _fix_state("pinned_sample_output", parts.buffer) is None and parts.buffer._pin_memory
    return False, bool(info_fixed)


def _ids_read_for_flags(parts: _Parts, verdict: FixVerdict, observed: _Observed) -> FixVerdict:
    """The index's verdict, noting a sampler built before the fix that reads ids where it would read flags.

    A slice sampler that names no key reads the done flags instead of the
    trajectory ids TorchRL picks for it, where both end the same trajectories;
    one built before the fix was applied cannot tell it names no key.
    """
    read = observed.boundary_read
    if (
        verdict.state != SERVES
        or not _built_before_the_fix(parts.sampler)
        or not getattr(parts.sampler, "_traj_key_auto", False)
        or read is None
        or read[0] != "trajectory"
        or END_KEY not in _storage_keys(parts.storage)
    ):
        return verdict
    return FixVerdict(
        SERVES,
        f"built before the fix was applied (before import torchrl_fixes), the sampler reads the "
        f"trajectory ids {read[1]!r} where one built after reads the {END_KEY} flags",
    )


def _facts(parts: _Parts, plan: _Plan, timed: _Timed) -> dict[str, Any]:
    """What :func:`findings_from` reads besides the stages (its docstring lists them)."""
    buffer, storage, observed = parts.buffer, parts.storage, timed.observed
    unpinned, tensors, measured = (
        _unpinned_leaves(parts, observed.first_data, timed.pinning_fixed, observed)
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
        "patched_pin": timed.pinning_fixed[0],
        "pinning": timed.verdicts["pinned_sample_output"].to_dict(),
        "slice_index": timed.verdicts["slice_boundary_index"].to_dict(),
        "cache_values": bool(getattr(parts.sampler, "cache_values", False)),
        "boundary_read": observed.boundary_read,
        "has_done": END_KEY in storage_keys,
        # the fix's SliceSampler.__init__ notes whether a key was named (absent: built before it)
        "traj_key_named": vars(parts.sampler).get("_default_boundary_keys") is False,
        "trajectories": timed.trajectories,
        "untold_rebuilds": getattr(vars(storage).get("_trajectory_index"), "untold_rebuilds", 0),
        "write_rows": timed.write_rows,
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
        "write_rows": timed.write_rows,
        "boundary_read": list(boundary_read) if boundary_read else None,
        "torchrl": str(installed_version("torchrl") or "unknown"),
    }
