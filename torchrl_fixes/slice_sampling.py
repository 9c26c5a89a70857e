"""Slice samples drawn from the trajectory order: nothing done per trajectory.

Stock ``SliceSampler.sample`` lists every trajectory (start, stop, length), and
``_sample_slices`` keeps those long enough, draws ``num_slices`` of them with
``torch.randint`` and reads the drawn ones: O(number of trajectories) per
sample, after the boundaries are known. :func:`_sample_from_index` makes the
same draw, from the same generator, by rank in the storage index's
:class:`~.trajectory_order.TrajectoryOrder` (:mod:`.slice_boundaries`), and hands
``_sample_slices`` the drawn trajectories only, numbered by ``traj_idx``: the
samples are the same, and a sample costs O(batch) plus a scan of the order's
chunk counts, whatever the number of trajectories.
"""
from __future__ import annotations

import functools

import torch

from torchrl_fixes.slice_boundaries import _query_index
from torchrl_fixes.trajectory_boundaries import TrajectoryBoundaries


def _sample_from_index(sampler, storage, batch_size: int):
    """What ``SliceSampler.sample`` returns, drawn from the storage's trajectory order.

    The stock sampler lists every trajectory, keeps those long enough, draws
    ``num_slices`` of them with ``torch.randint`` and hands the listing to
    ``_sample_slices`` with the draws. Here the same draw, from the same
    generator, picks the trajectories by rank in the index's
    :class:`~.trajectory_order.TrajectoryOrder`, and ``_sample_slices`` gets
    only the drawn ones (with ``traj_idx`` numbering them), plus one of the
    shortest where some are too short, so that it takes the branch it takes on
    the whole listing. Nothing is done per trajectory: O(batch) plus a scan of
    the order's chunk counts. Returns ``None`` where stock code must run.
    """
    if _classes_sampling_reason(type(sampler)) is not None:
        return None
    multiplier = getattr(sampler, "_batch_size_multiplier", None)
    if multiplier is not None:
        batch_size = batch_size * multiplier
    drawn = _query_index(
        sampler, storage, functools.partial(_draw_trajectories, sampler, batch_size)
    )
    if drawn is None:
        return None
    lengths, start_idx, stop_idx, seq_length, num_slices = drawn
    result = sampler._sample_slices(
        lengths,
        start_idx,
        stop_idx,
        seq_length,
        num_slices,
        storage_length=storage.shape[0],
        traj_idx=torch.arange(num_slices, device=lengths.device),
        storage=storage,
    )
    warn_if_short = getattr(sampler, "_warn_if_short_batch", None)
    if warn_if_short is not None:
        warn_if_short(result[0], batch_size)
    return result


def _draw_trajectories(
    sampler, batch_size: int, index: TrajectoryBoundaries, signal, *, device, **geometry
):
    """``(lengths, start, stop, seq_length, num_slices)`` of the trajectories ``sampler`` draws.

    The draw runs on ``device``, where stock's lengths are and so its draw, with
    the same generator; only the drawn ranks come to the host, and only the drawn
    trajectories go back.
    """
    order = index.trajectories(signal, **geometry)
    seq_length, num_slices = sampler._adjusted_batch_size(batch_size)
    too_short = order.shortest() < seq_length
    min_length = seq_length if too_short and sampler.strict_length else 1
    count = order.count(min_length)
    if not count:
        return None  # stock raises its own error
    traj_idx = torch.randint(count, (num_slices,), device=device, generator=sampler._rng)
    start_idx, stop_idx, lengths = order.select(traj_idx.cpu(), min_length)
    if too_short:
        # one of the shortest, never drawn: _sample_slices sees that some are too short
        shortest = order.select(torch.tensor([order.shortest_rank()]))
        start_idx, stop_idx, lengths = (
            torch.cat([drawn, extra]) for drawn, extra in zip((start_idx, stop_idx, lengths), shortest)
        )
    if device.type != "cpu":
        start_idx, stop_idx, lengths = (t.to(device) for t in (start_idx, stop_idx, lengths))
    return lengths, start_idx, stop_idx, seq_length, num_slices


@functools.cache
def _classes_sampling_reason(sampler_cls: type) -> str | None:
    """Why ``sampler_cls`` must list every trajectory to sample (None: it need not)."""
    from torchrl.data.replay_buffers.samplers import SliceSampler

    for name in ("_get_stop_and_length", "_adjusted_batch_size", "_sample_slices", "_get_index"):
        if getattr(sampler_cls, name, None) is not getattr(SliceSampler, name, None):
            return f"{sampler_cls.__name__} overrides {name}"
    return None
