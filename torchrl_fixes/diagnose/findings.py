"""What the measured stages mean: the findings, each with a remedy, and what prefetch takes off the training thread.

:func:`findings_from` turns the median seconds of each stage and the facts
:func:`~torchrl_fixes.diagnose.diagnose` observed into :class:`Finding` objects,
one kind of problem per helper below; it is a pure function, tested on
constructed stages.
"""
from __future__ import annotations

from typing import Any, Callable

from torchrl_fixes.diagnose.report import (
    DOMINANT_SHARE,
    PREFETCHED_STAGES,
    SAMPLE_STAGES,
    Finding,
    _format_seconds,
    _format_share,
)

# (share of the sample, finding): findings sort by it, largest first. Findings about
# the configuration rather than a measured share come after those, with negative keys.
_Ranked = tuple[float, Finding]


def findings_from(stages: dict[str, float], facts: dict) -> list[Finding]:
    """The findings for measured ``stages`` (median seconds) and the buffer's ``facts``.

    ``facts`` holds what :func:`diagnose` observed: ``pin_memory``, ``prefetch``,
    ``accelerator`` (bool), ``device`` (str or None), ``unpinned`` (names),
    ``tensors``, ``pinned_measured`` (bool), ``transformed_device_none``,
    ``patched_pin``, ``slice_fix`` ({"active", "why", "fallback"}), ``boundary_read``,
    ``has_done``, ``traj_key_named``, ``trajectories``, ``gathered_bytes``,
    ``storage`` (class name), ``memmap_dir``.

    Examples:
        >>> facts = {"pin_memory": False, "accelerator": True, "unpinned": []}
        >>> [f.code for f in findings_from({"sampler": 1e-4, "transform": 3e-4}, facts)]
        ['transform-dominates']
    """
    total = sum(stages.get(name, 0.0) for name in SAMPLE_STAGES)

    def share(name):
        return stages.get(name, 0.0) / total if total > 0 else 0.0

    found: list[_Ranked] = []
    if "boundaries" in stages and share("boundaries") >= DOMINANT_SHARE:
        found.append(_slice_boundaries(stages, facts, share))
    found += _pinning_findings(stages, facts, share)
    found += _transfer_findings(stages, facts)
    found += _dominant_stage_findings(stages, facts, share)
    found.sort(key=lambda pair: -pair[0])
    return [finding for _, finding in found]


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


def _slice_boundaries(stages: dict[str, float], facts: dict, share: Callable[[str], float]) -> _Ranked:
    """``slice-boundaries``: the boundary recovery dominates; why, and what to change."""
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
    return (share("boundaries"), Finding(
        "slice-boundaries",
        f"trajectory-boundary recovery takes {_format_share(share('boundaries'))} of each sample "
        f"({_format_seconds(stages['boundaries'])}): {why}",
        "; ".join(remedies),
    ))


def _pinning_findings(stages: dict[str, float], facts: dict, share: Callable[[str], float]) -> list[_Ranked]:
    """``pin-memory-no-accelerator``, ``pin-memory-unpinned``, ``pinned-on-training-thread``."""
    found: list[_Ranked] = []
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
        found.append((-2.0, _unpinned(facts)))
    if "pin_memory" in stages and not facts["prefetch"]:
        found.append((share("pin_memory"), Finding(
            "pinned-on-training-thread",
            f"pinning takes {_format_share(share('pin_memory'))} of each sample "
            f"({_format_seconds(stages['pin_memory'])}) on the training thread: the buffer has no prefetch",
            "ReplayBuffer(..., prefetch=2) samples and pins in a worker thread while the model trains",
        )))
    return found


def _unpinned(facts: dict) -> Finding:
    """``pin-memory-unpinned``: pin_memory=True, yet returned tensors are (or would be) unpinned."""
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
    return Finding(
        "pin-memory-unpinned",
        f"{lead} ({shown})" + (f": {'; '.join(causes)}" if causes else ""),
        "import torchrl_fixes (pinned_sample_output pins every tensor sample() returns), or have "
        "the transform return a TensorDict on device='cpu'",
    )


def _transfer_findings(stages: dict[str, float], facts: dict) -> list[_Ranked]:
    """``unpinned-transfer``: the host->device copy reads pageable memory."""
    if "to_device" not in stages or not facts.get("unpinned_source"):
        return []
    non_blocking = stages.get("to_device_non_blocking")
    tail = (
        f"; from pinned memory with non_blocking=True the training thread spends "
        f"{_format_seconds(non_blocking)}" if non_blocking is not None else ""
    )
    return [(-1.0, Finding(
        "unpinned-transfer",
        f"copying each sample to {facts['device']} from pageable memory takes "
        f"{_format_seconds(stages['to_device'])} (blocking){tail}",
        "pin_memory=True on the buffer (with torchrl_fixes imported) and "
        "sample.to(device, non_blocking=True)",
    ))]


def _dominant_stage_findings(stages: dict[str, float], facts: dict, share: Callable[[str], float]) -> list[_Ranked]:
    """``transform-dominates``, ``storage-gather-dominates`` (with the read bandwidth)."""
    found: list[_Ranked] = []
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
    return found


def _prefetch_summary(stages: dict[str, float], depth: int) -> dict[str, Any]:
    """What a prefetch of ``depth`` takes off the training thread, and what stays on it."""
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
