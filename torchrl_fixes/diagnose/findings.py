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
    DRAW_STAGES,
    PREFETCHED_STAGES,
    SAMPLE_STAGES,
    SERVES,
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
    ``untold_rebuilds`` (the storage index's, since it was made),
    ``patched_pin``, ``pinning`` and ``slice_index`` (pinned_sample_output's and
    slice_boundary_index's verdicts, :meth:`FixVerdict.to_dict`), ``cache_values``,
    ``boundary_read``, ``has_done``, ``traj_key_named``, ``trajectories``,
    ``write_rows`` (the rows of the write ``after_write`` follows),
    ``gathered_bytes``, ``storage`` (class name), ``memmap_dir``.

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
    found += _after_write_findings(stages, facts)
    found += _untold_write_findings(facts)
    found += _pinning_findings(stages, facts, share)
    found += _transfer_findings(stages, facts)
    found += _dominant_stage_findings(stages, facts, share)
    found.sort(key=lambda pair: -pair[0])
    return [finding for _, finding in found]


def _stock_slice_reason(facts: dict) -> str:
    verdict = facts["slice_index"]
    if verdict["state"] == SERVES:
        return (
            "the slice_boundary_index fix serves this buffer: the remaining cost grows with "
            f"the number of trajectories ({facts.get('trajectories', 'unknown')})"
        )
    return f"stock code runs ({verdict['why']}): stock recovery reads a whole column of the storage"


def _slice_boundaries(stages: dict[str, float], facts: dict, share: Callable[[str], float]) -> _Ranked:
    """``slice-boundaries``: the boundary recovery dominates; why, and what to change."""
    why = _stock_slice_reason(facts) + ("" if facts["slice_index"]["state"] == SERVES else " at every sample")
    read = facts.get("boundary_read")
    verdict = facts["slice_index"]
    serves = verdict["state"] == SERVES
    remedies = [verdict["remedy"]] if verdict.get("remedy") else []
    if verdict.get("cause") == "skipped":
        remedies.append("cache_values=True keeps stock boundaries until the next write")
    ids_for_done = (
        read is not None and read[0] == "trajectory" and facts.get("has_done")
        and (not serves or facts.get("traj_key_named"))
    )
    if ids_for_done:
        why += f"; it reads the trajectory ids {read[1]!r} where the ('next', 'done') flags would do"
        remedies.append(
            "SliceSampler(end_key=('next', 'done')) (and no traj_key): a boolean column is 8x "
            "smaller than int64 ids"
        )
    if serves and not ids_for_done:
        remedies.append("fewer, longer trajectories per stored row, or a larger batch per sample")
    return (share("boundaries"), Finding(
        "slice-boundaries",
        f"trajectory-boundary recovery takes {_format_share(share('boundaries'))} of each sample "
        f"({_format_seconds(stages['boundaries'])}): {why}",
        "; ".join(remedies),
    ))


def _after_write_findings(stages: dict[str, float], facts: dict) -> list[_Ranked]:
    """``after-write-draw``: the draw right after a write costs most of that sample, or will.

    Measured: what the draw costs more right after a write than between writes is
    at least half of that sample. Predicted, where no write was timed: a stock
    slice sampler with ``cache_values=True`` was timed on its cache, which a write
    empties.
    """
    verdict = facts.get("slice_index") or {}
    slice_stock = verdict.get("state") == "stock"
    remedy = verdict.get("remedy") if slice_stock else None
    if "after_write" not in stages:
        if not (slice_stock and facts.get("cache_values") and "boundaries" in stages):
            return []
        return [(-0.5, Finding(
            "after-write-draw",
            "the boundaries timed here come from stock's cache (cache_values=True), which every "
            "write empties: in an online loop each sample after a write finds them from the whole "
            "storage again (no write was timed)",
            remedy or "prefetch=N draws the next sample in a worker thread while the model trains",
        ))]
    draw = sum(stages.get(name, 0.0) for name in DRAW_STAGES)
    total = sum(stages.get(name, 0.0) for name in SAMPLE_STAGES) - draw + stages["after_write"]
    extra = stages["after_write"] - draw
    if total <= 0 or extra / total < DOMINANT_SHARE:
        return []
    if slice_stock:
        why = (
            f": stock code runs ({verdict['why']}), which finds the trajectory boundaries from the "
            "whole storage again after every write"
            + (" (cache_values=True keeps them only until the next write)" if facts.get("cache_values") else "")
        )
    elif verdict.get("state") == SERVES:
        why = ": the storage's trajectory index reads the rows written since the last sample"
    else:
        why = ""
    remedies = [r for r in (remedy,) if r]
    remedies.append("prefetch=N draws the next sample in a worker thread while the model trains")
    return [(extra / total, Finding(
        "after-write-draw",
        f"right after a write of {facts.get('write_rows', 0):,} rows a sample takes "
        f"{_format_seconds(total)}, the index draw {_format_seconds(stages['after_write'])} of it "
        f"against {_format_seconds(draw)} between writes{why}",
        "; ".join(remedies),
    ))]


def _untold_write_findings(facts: dict) -> list[_Ranked]:
    """``untold-writes``: the index was rebuilt after writes the storage's journal does not hold."""
    rebuilds = facts.get("untold_rebuilds", 0)
    if not rebuilds:
        return []
    return [(-0.25, Finding(
        "untold-writes",
        "the storage's trajectory index was rebuilt from the whole storage "
        f"{'once' if rebuilds == 1 else f'{rebuilds:,} times'} "
        "after writes its journal does not hold: a process that writes this storage without "
        "torchrl_fixes, another way of writing than storage.set, or over 1,024 writes between "
        "two samples",
        "import torchrl_fixes in every process that writes the storage (or start them with "
        "torchrl-fixes run); after writes through .data or numpy, call storage.mark_update(rows)",
    ))]


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
            + ("" if facts["patched_pin"] else "; where pinned_sample_output serves the buffer, it warns and carries on"),
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
    fix = (facts.get("pinning") or {}).get("remedy")
    return Finding(
        "pin-memory-unpinned",
        f"{lead} ({shown})" + (f": {'; '.join(causes)}" if causes else ""),
        (f"{fix} (pinned_sample_output pins every tensor sample() returns), or " if fix else "")
        + "have the transform return a TensorDict on device='cpu'",
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
