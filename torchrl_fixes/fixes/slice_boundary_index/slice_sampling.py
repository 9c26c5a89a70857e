"""Slice samples drawn from the trajectory order: nothing done per trajectory.

``SliceSampler.sample`` lists every trajectory and draws among them with
``torch.randint``: O(trajectories) per sample. :func:`_sample_from_index` makes the
same draw by rank in the index's ``TrajectoryOrder``, O(batch) plus a scan of its
chunk counts. Slices of the sampler's length from a CPU storage skip TorchRL's
general path (:func:`_fixed_length_index`); a storage that only grows is drawn from
its :class:`~.trajectory_table.TrajectoryTable` (:func:`_sample_from_table`), and
the sampler keeps how (:class:`_TableDraw`) while its query plan holds.
"""
from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import numpy as np
import torch

from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
    _current_plan,
    _overrides,
    _query_index,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import (
    TrajectoryBoundaries,
)
from torchrl_fixes.fixes.slice_boundary_index.trajectory_table import (
    GrowingStorageTable,
    TrajectoryTable,
)


def _sample_from_index(sampler, storage, batch_size: int):
    """What ``SliceSampler.sample`` returns, drawn from the storage's index (``None``: the listing must be made).

    ``_sample_slices`` gets the drawn trajectories only (numbered by ``traj_idx``),
    plus one of the shortest where some are too short, so that it takes the branch
    it takes on the whole listing.
    """
    if _classes_sampling_reason(type(sampler)) is not None:
        return None
    multiplier = getattr(sampler, "_batch_size_multiplier", None)
    if multiplier is not None:
        batch_size = batch_size * multiplier
    result = _sample_from_kept_table(sampler, storage, batch_size)
    if result is None:
        result = _query_index(
            sampler,
            storage,
            functools.partial(_sample_trajectories, sampler, storage, batch_size),
        )
    if result is None:
        return None
    warn_if_short = getattr(sampler, "_warn_if_short_batch", None)
    if warn_if_short is not None:
        warn_if_short(result[0], batch_size)
    return result


class _TableDraw(NamedTuple):
    """How a sampler's slices are drawn from its storage's trajectory table, kept between samples."""

    index_ref: weakref.ref  # the index whose table it is
    growing: GrowingStorageTable
    request: tuple  # what _table_request gave
    seq_length: int
    num_slices: int


# sampler -> the _TableDraw its last sample from a trajectory table made
_TABLE_DRAWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _table_request(sampler, batch_size: int) -> tuple:
    """What a :class:`_TableDraw` depends on besides the query plan: the batch and the slice options."""
    options = (sampler.num_slices, sampler.slice_len, sampler.strict_length)
    return (batch_size, *options, *sampler.span)


def _sample_from_kept_table(sampler, storage, batch_size: int):
    """A sample from the table the sampler's last sample drew from, or ``None`` (ask the index).

    Where the sampler asks for the same slices and its query plan still holds for
    the same index (``_current_plan``: no mutation but recorded writes, whose rows
    the table appends); otherwise the draw is forgotten.
    """
    try:
        draw = _TABLE_DRAWS.get(sampler)
    except TypeError:  # a sampler that cannot be referenced weakly
        return None
    if draw is None:
        return None
    same = draw.request == _table_request(sampler, batch_size)
    plan = _current_plan(sampler, storage) if same else None
    if plan is not None and plan.index is draw.index_ref():
        # the lock every recorded write holds: the table is not appended to meanwhile
        with plan.lock:
            plan.boundaries.last_source = plan.index_key
            table = draw.growing.current(plan.signal, plan.geometry)
            if table is not None:
                sampled = _sample_from_table(sampler, table, draw, storage)
                if sampled is not None:
                    return sampled
    _TABLE_DRAWS.pop(sampler, None)
    return None


def _sample_trajectories(
    sampler,
    storage,
    batch_size: int,
    index: TrajectoryBoundaries,
    signal,
    *,
    device,
    **geometry,
):
    """The index and info of a slice sample of the trajectories ``sampler`` draws from ``index``'s order (``None`` where there is none to draw: the listing's path raises its error).

    The draw runs on ``device``, where the listing's draw runs; only the drawn ranks
    come to the host, and only the drawn trajectories go back.
    """
    seq_length, num_slices = sampler._adjusted_batch_size(batch_size)
    storage_length = geometry["length"]  # the valid rows along dim 0: storage.shape[0]
    fixed_length = device.type == "cpu" and not any(sampler.span)
    fixed_length = fixed_length and _classes_index_reason(type(sampler)) is None
    if fixed_length:
        growing = GrowingStorageTable.of(index)
        table = None if growing is None else growing.table(index, signal, **geometry)
        if table is not None:
            request = _table_request(sampler, batch_size)
            draw = _TableDraw(weakref.ref(index), growing, request, seq_length, num_slices)
            sampled = _sample_from_table(sampler, table, draw, storage)
            if sampled is not None:
                try:
                    _TABLE_DRAWS[sampler] = draw
                except TypeError:  # a sampler that cannot be referenced weakly
                    pass
                return sampled
    order = index.trajectories(signal, **geometry)
    too_short = order.shortest() < seq_length
    min_length = seq_length if too_short and sampler.strict_length else 1
    count = order.count(min_length)
    if not count:
        return None
    traj_idx = torch.randint(
        count, (num_slices,), device=device, generator=sampler._rng
    )
    if fixed_length and (not too_short or sampler.strict_length):
        stops, lengths = order.select_stops(traj_idx.numpy(), min_length)
        rows, lanes = order.first_rows(stops, lengths)
        return _fixed_length_index(
            sampler,
            rows,
            lanes,
            lengths,
            seq_length,
            storage_length,
            storage,
            wraps=order.wraps(),
        )
    start_idx, stop_idx, lengths = order.select(traj_idx.cpu(), min_length)
    if too_short:
        # one of the shortest, never drawn: _sample_slices sees that some are too short
        shortest = order.select(torch.tensor([order.shortest_rank()]))
        start_idx, stop_idx, lengths = (
            torch.cat([drawn, extra])
            for drawn, extra in zip((start_idx, stop_idx, lengths), shortest)
        )
    if device.type != "cpu":
        start_idx, stop_idx, lengths = (
            t.to(device) for t in (start_idx, stop_idx, lengths)
        )
    return sampler._sample_slices(
        lengths,
        start_idx,
        stop_idx,
        seq_length,
        num_slices,
        storage_length=storage_length,
        traj_idx=torch.arange(num_slices, device=lengths.device),
        storage=storage,
    )


def _sample_from_table(sampler, table: TrajectoryTable, draw: _TableDraw, storage):
    """What ``_sample_slices`` returns for the slices of ``draw`` (``None`` where it draws otherwise).

    The listing's ``torch.randint`` draw over ``table``'s trajectories long enough,
    from the same generator, then :func:`_fixed_length_index` on the drawn ones.
    """
    seq_length, num_slices = draw.seq_length, draw.num_slices
    count, ranks = table.drawable(seq_length)
    # strict_length draws among those long enough; without it, all must be
    if not count or not (sampler.strict_length or count == table.count):
        return None
    drawn = torch.randint(count, (num_slices,), generator=sampler._rng).numpy()
    starts, lengths = table.select(drawn if ranks is None else ranks[drawn])
    return _fixed_length_index(
        sampler, starts, None, lengths, seq_length, table.length, storage, wraps=False
    )


def _fixed_length_index(
    sampler,
    rows: np.ndarray,
    lanes: np.ndarray | None,
    lengths: np.ndarray,
    seq_length: int,
    storage_length: int,
    storage,
    *,
    wraps: bool,
):
    """What ``_get_index`` returns for slices of ``seq_length`` steps inside the drawn trajectories, which start at ``rows`` (and ``lanes``, for two-dimensional storages) and hold ``lengths`` rows, all on the CPU.

    The same ``torch.rand`` draw places each slice, with ``_get_index``'s float32
    arithmetic; no slice wraps around the storage's end where no trajectory
    ``wraps`` and float32 holds every room exactly. ``_finalize_index`` adds the info.
    """
    num_slices = rows.shape[0]
    uniform = torch.rand(num_slices, generator=sampler._rng).numpy()
    starts = _relative_starts(uniform, lengths, seq_length)
    starts += rows
    # torch owns the index, as it owns _get_index's; numpy writes it
    index = torch.empty(
        (num_slices * seq_length, 1 if lanes is None else 2), dtype=torch.long
    )
    columns = index.numpy()
    steps = columns[:, 0]
    np.add(starts.repeat(seq_length), _slice_steps(seq_length, num_slices), out=steps)
    if (
        wraps or storage_length > _FLOAT32_EXACT
    ) and starts.max() > storage_length - seq_length:
        # a slice of a trajectory that wraps around the storage's end, or one row
        # past its trajectory where float32 rounded the room up
        np.remainder(steps, storage_length, out=steps)
    if lanes is not None:
        # the lane of each slice repeats along it
        columns[:, 1] = lanes.repeat(seq_length)
    return sampler._finalize_index(
        index=index,
        num_slices=num_slices,
        seq_length=seq_length,
        target_seq_length=None,
        mask_flat=None,
        storage=storage,
    )


# Up to this many rows, float32 holds every room exactly: u * room < room for u < 1.
_FLOAT32_EXACT = 1 << 24


@functools.lru_cache(maxsize=16)
def _slice_steps(seq_length: int, num_slices: int) -> np.ndarray:
    """``0, 1, ..., seq_length - 1`` for each of ``num_slices`` slices, flat (read-only)."""
    steps = np.tile(np.arange(seq_length), num_slices)
    steps.flags.writeable = False
    return steps


def _relative_starts(
    uniform: np.ndarray, lengths: np.ndarray, seq_length: int
) -> np.ndarray:
    """Where slices of ``seq_length`` steps start in trajectories of ``lengths`` rows (each at least ``seq_length``), from the float32 draws ``uniform``.

    ``_get_index``'s ``(uniform * room).floor().to(torch.int64)``, in numpy: torch
    promotes the int64 room to float32 and multiplies in float32, as the multiply
    here does, and the product is not negative (every room is at least 1), so
    truncation floors it.
    """
    room = lengths - (seq_length - 1)
    return np.multiply(uniform, room, dtype=np.float32).astype(np.int64)


@functools.cache
def _classes_index_reason(sampler_cls: type) -> str | None:
    """Why ``sampler_cls``'s index must come from ``_sample_slices`` (None: it need not)."""
    if getattr(sampler_cls, "_finalize_index", None) is None:  # TorchRL before 0.14
        return "the info is built in _get_index"
    if _overrides(sampler_cls, "_tensor_slices_from_startend"):
        return f"{sampler_cls.__name__} overrides _tensor_slices_from_startend"
    return None


@functools.cache
def _classes_sampling_reason(sampler_cls: type) -> str | None:
    """Why ``sampler_cls`` must list every trajectory to sample (None: it need not)."""
    for name in (
        "_get_stop_and_length",
        "_adjusted_batch_size",
        "_sample_slices",
        "_get_index",
    ):
        if _overrides(sampler_cls, name):
            return f"{sampler_cls.__name__} overrides {name}"
    return None
