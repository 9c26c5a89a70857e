"""Slice samples drawn from the trajectory order: nothing done per trajectory.

``SliceSampler.sample`` lists every trajectory (start, stop, length), and
``_sample_slices`` keeps those long enough, draws ``num_slices`` of them with
``torch.randint`` and reads the drawn ones: O(number of trajectories) per
sample, after the boundaries are known. :func:`_sample_from_index` makes the
same draw, from the same generator, by rank in the storage index's
``TrajectoryOrder`` (what the sampler's boundary index reads), and hands
``_sample_slices`` the drawn trajectories only, numbered by ``traj_idx``: the
samples are the same, and a sample costs O(batch) plus a scan of the order's
chunk counts, whatever the number of trajectories.

Where every slice has the sampler's length and lies inside its trajectory (no
``span``; no trajectory too short, or ``strict_length``), which is how slice
samplers are mostly built, and the storage is on the CPU,
:func:`_fixed_length_index` places the slices with the same ``torch.rand`` draw
and builds the index ``_get_index`` builds, in numpy on the drawn rows: TorchRL's
general path costs a dozen tensor operations, each of which weighs more than the
arithmetic on a few thousand rows. ``_finalize_index`` then adds the info.

While a one-lane storage of end flags only grows (an online buffer until it is full),
its trajectories are also kept in a :class:`~.trajectory_table.TrajectoryTable`
(:class:`~.trajectory_table.GrowingStorageTable`, which appends the rows written since
the last sample), and :func:`_sample_from_table` draws from it directly: no order,
no chunk, a handful of operations on the drawn rows.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
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
    """What ``SliceSampler.sample`` returns, drawn from the storage's trajectory order.

    ``SliceSampler.sample`` lists every trajectory, keeps those long enough, draws
    ``num_slices`` of them with ``torch.randint`` and hands the listing to
    ``_sample_slices`` with the draws. Here the same draw, from the same
    generator, picks the trajectories by rank in the index's
    ``TrajectoryOrder``, and ``_sample_slices`` gets
    only the drawn ones (with ``traj_idx`` numbering them), plus one of the
    shortest where some are too short, so that it takes the branch it takes on
    the whole listing. Nothing is done per trajectory: O(batch) plus a scan of
    the order's chunk counts, or O(batch) alone where the index's table serves.
    Returns ``None`` where the listing must be made.
    """
    if _classes_sampling_reason(type(sampler)) is not None:
        return None
    multiplier = getattr(sampler, "_batch_size_multiplier", None)
    if multiplier is not None:
        batch_size = batch_size * multiplier
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

    The draw runs on ``device``, where the listing's lengths are and so its draw,
    with the same generator; only the drawn ranks come to the host, and only the drawn
    trajectories go back.
    """
    seq_length, num_slices = sampler._adjusted_batch_size(batch_size)
    storage_length = geometry["length"]  # the valid rows along dim 0: storage.shape[0]
    fixed_length = (
        device.type == "cpu"
        and not sampler.span[0]
        and not sampler.span[1]
        and _classes_index_reason(type(sampler)) is None
    )
    if fixed_length:
        growing = GrowingStorageTable.of(index)
        table = None if growing is None else growing.table(index, signal, **geometry)
        count, ranks = (0, None) if table is None else table.drawable(seq_length)
        # strict_length draws among those long enough; without it, all must be
        if count and (sampler.strict_length or count == table.count):
            return _sample_from_table(
                sampler, table, count, ranks, seq_length, num_slices, storage
            )
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


def _sample_from_table(
    sampler,
    table: TrajectoryTable,
    count: int,
    ranks: np.ndarray | None,
    seq_length: int,
    num_slices: int,
    storage,
):
    """What ``_sample_slices`` returns for ``num_slices`` slices of ``seq_length`` steps drawn from ``table``'s ``count`` trajectories that long (the first ones, or those of ``ranks``: :meth:`TrajectoryTable.drawable`).

    The listing's ``torch.randint`` draw over the trajectories long enough, from the
    same generator, then :func:`_fixed_length_index` on the drawn ones: a handful of
    operations on the drawn rows.
    """
    traj_idx = torch.randint(count, (num_slices,), generator=sampler._rng)
    drawn = traj_idx.numpy()
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

    Where no trajectory ``wraps`` around the storage's end and float32 holds every room
    exactly, no slice does.

    The same ``torch.rand`` draw, from the same generator, places each slice in its
    trajectory, with the float32 arithmetic ``_get_index`` uses; the index is the one
    ``_tensor_slices_from_startend`` builds, and ``_finalize_index`` adds the info.
    """
    num_slices = rows.shape[0]
    uniform = torch.rand(num_slices, generator=sampler._rng).numpy()
    starts = rows + _relative_starts(uniform, lengths, seq_length)
    # torch owns the index, as it owns _get_index's; numpy writes it
    index = torch.empty(
        (num_slices * seq_length, 1 if lanes is None else 2), dtype=torch.long
    )
    slices = index.numpy().reshape(num_slices, seq_length, -1)
    steps = slices[:, :, 0]
    np.add(starts[:, None], np.arange(seq_length), out=steps)
    if (
        wraps or storage_length > _FLOAT32_EXACT
    ) and starts.max() > storage_length - seq_length:
        # a slice of a trajectory that wraps around the storage's end, or one row
        # past its trajectory where float32 rounded the room up
        np.remainder(steps, storage_length, out=steps)
    if lanes is not None:
        # the lane of each slice repeats along it
        slices[:, :, 1] = lanes[:, None]
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


def _relative_starts(
    uniform: np.ndarray, lengths: np.ndarray, seq_length: int
) -> np.ndarray:
    """Where slices of ``seq_length`` steps start in trajectories of ``lengths`` rows (each at least ``seq_length``), from the float32 draws ``uniform``.

    ``_get_index``'s ``(uniform * room).floor().to(torch.int64)``, in numpy: torch
    promotes the int64 room to float32 and multiplies in float32, as here, and the
    product is not negative (every room is at least 1), so truncation floors it.
    """
    room = (lengths - seq_length + 1).astype(np.float32)
    return (uniform * room).astype(np.int64)


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
