"""Slice samples drawn from the storage's trajectory index.

``SliceSampler.sample`` lists every trajectory of the storage and draws among them
with ``torch.randint``. :func:`_sample_from_index` makes the same draw, with the same
generator on the same device, among the trajectories of the storage's index, and
hands the drawn ones alone to the sampler's code: ``O(batch)`` per sample. The slices
are placed in the drawn trajectories, spans included, without its general code
(:func:`_placed_slices`).
"""
from __future__ import annotations

import numpy as np
import torch

from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import (
    _as_tensors,
    _current_index,
    _overrides,
    _reads_index,
)


@_reads_index
def _sample_from_index(sampler, storage, batch_size: int):
    """What ``sampler.sample(storage, batch_size)`` returns, or None (stock code).

    The draw is stock's: ``torch.randint`` over the trajectories long enough (all of
    them where none is too short, or with ``strict_length=False``), then
    ``_sample_slices`` on the drawn trajectories alone.
    """
    request = _slice_request(sampler, storage, batch_size)
    if request is None:
        return None
    index, device, batch_size, seq_length, num_slices = request
    too_short = index.count(seq_length) < index.count()
    min_length = seq_length if too_short and sampler.strict_length else 1
    count = index.count(min_length)
    if not count:
        return None  # the stock code raises its error
    traj_idx = torch.randint(
        count, (num_slices,), device=device, generator=sampler._rng
    )
    rows = index.select(traj_idx.cpu().numpy(), min_length)
    clamped = too_short and not sampler.strict_length
    sampled = _slices_of_drawn(
        sampler, rows, seq_length, index, device, storage, 1 if clamped else None
    )
    _warn_if_short(sampler, sampled, batch_size)
    return sampled


def _slice_request(sampler, storage, batch_size: int):
    """What a sample of ``batch_size`` rows asks of the storage's index, or None (stock code).

    Returns:
        ``(index, device, batch_size, seq_length, num_slices)``: the index and its
        columns' device (:func:`_current_index`), the batch size as the sampler's
        multiplier makes it, and its slices (``_adjusted_batch_size``).
    """
    if _overrides(sampler, "_get_stop_and_length", "_sample_slices", "_get_index"):
        return None
    found = _current_index(sampler, storage)
    if found is None:
        return None
    if sampler._batch_size_multiplier is not None:
        batch_size = batch_size * sampler._batch_size_multiplier
    return (*found, batch_size, *sampler._adjusted_batch_size(batch_size))


def _warn_if_short(sampler, sampled, batch_size: int) -> None:
    """Warns as the sampler does where it returns fewer rows than asked (TorchRL main)."""
    warn_if_short = getattr(sampler, "_warn_if_short_batch", None)
    if warn_if_short is not None:
        warn_if_short(sampled[0], batch_size)


def _slices_of_drawn(sampler, rows, seq_length, index, device, storage, padding=None):
    """What ``_sample_slices`` returns for the drawn trajectories ``rows``, in their order.

    Args:
        sampler (SliceSampler): the sampler.
        rows (tuple): the drawn trajectories, as :meth:`TrajectoryIndex.select`
            gives them: one slice is taken from each.
        seq_length (int): the length of the slices.
        index (TrajectoryIndex): the storage's index.
        device (torch.device): where the sampler's tensors are.
        storage (Storage): the storage sampled.
        padding (int, optional): the length of one more trajectory, never drawn,
            handed to ``_sample_slices`` after the drawn ones: shorter than
            ``seq_length``, it makes ``_sample_slices`` clamp the slices to the
            drawn trajectories' lengths (``strict_length=False``); at least
            ``seq_length``, it lets ``_sample_slices`` drop the drawn ones too short
            (``strict_length=True``) as it drops them among all. Defaults to none.
    """
    if padding is None and _can_place_slices(sampler, seq_length):
        return _placed_slices(sampler, rows, seq_length, index, device, storage)
    start_idx, stop_idx, lengths = _as_tensors(rows, device)
    drawn = lengths.numel()
    if padding is not None:
        start_idx, stop_idx = (torch.cat([t, t[:1]]) for t in (start_idx, stop_idx))
        lengths = torch.cat([lengths, lengths.new_full((1,), padding)])
    return sampler._sample_slices(
        lengths,
        start_idx,
        stop_idx,
        seq_length,
        drawn,
        storage_length=index.state[0],
        traj_idx=torch.arange(drawn, device=device),
        storage=storage,
    )


def _can_place_slices(sampler, seq_length: int) -> bool:
    """Whether :func:`_placed_slices` gives what ``_get_index`` does for this sampler.

    That is, no compiled or overridden index code, an info built apart
    (``_finalize_index``, TorchRL 0.14 on) in the flat layout, and spans that
    ``_get_index`` takes (shorter than ``seq_length``, else it raises its error).
    """
    return (
        not sampler.compile
        and getattr(sampler, "output_layout", "flat") != "batch_time"
        and getattr(type(sampler), "_finalize_index", None) is not None
        and not _overrides(sampler, "_tensor_slices_from_startend", "_start_to_end")
        and all(span is True or span < seq_length for span in sampler.span)
    )


def _placed_slices(sampler, rows, seq_length, index, device, storage):
    """What ``_get_index`` returns for slices of ``seq_length`` rows in ``rows``.

    ``rows`` are the drawn trajectories, as :meth:`TrajectoryIndex.select` gives
    them, each long enough for a slice. ``_get_index``'s own draw places each slice,
    where a span lets it start before its trajectory (``span[0]``) or end after it
    (``span[1]``), and such a slice keeps only its rows in the trajectory;
    ``_finalize_index`` adds the info.
    """
    start, _, lane, lengths = rows
    before, after = sampler.span
    # each slice starts in [first, end) of its trajectory's rows
    first = 0 if not before else -seq_length + 1 if before is True else -before
    end = (
        lengths - seq_length + 1 if not after
        else lengths + 1 if after is True
        else lengths - after
    )
    room = torch.from_numpy(end - first).to(device)
    uniform = torch.rand(lengths.size, device=device, generator=sampler._rng)
    # uniform * room is not negative: the cast floors it, as _get_index does
    relative_starts = uniform.mul_(room).cpu().numpy().astype(np.int64) + first
    # a slice keeps its rows in its trajectory; _get_index makes the lengths a
    # tensor where one leaves it
    slice_lengths, clipped = seq_length, False
    if before or after:
        kept = np.maximum(relative_starts, 0)
        slice_lengths = np.minimum(relative_starts + seq_length, lengths) - kept
        relative_starts = kept
        clipped = (slice_lengths != seq_length).any()
    slice_starts = start + relative_starts
    if clipped:  # each slice's rows, after those of the slices before it
        offsets = np.cumsum(slice_lengths) - slice_lengths
        slice_rows = np.repeat(slice_starts - offsets, slice_lengths)
        slice_rows += np.arange(slice_rows.size)
    else:
        slice_rows = (slice_starts[:, None] + np.arange(seq_length)).reshape(-1)
    slice_rows = slice_rows[:, None]
    length, at_capacity, _ = index.state
    if at_capacity:  # a lane's first trajectory may run around the ring
        np.remainder(slice_rows, length, out=slice_rows)
    if lane is not None:
        lanes = np.repeat(lane, slice_lengths)[:, None]
        slice_rows = np.concatenate([slice_rows, lanes], 1)
    return sampler._finalize_index(
        index=torch.from_numpy(slice_rows).to(device),
        num_slices=lengths.size,
        seq_length=torch.from_numpy(slice_lengths).to(device) if clipped else seq_length,
        target_seq_length=None,
        mask_flat=None,
        storage=storage,
    )
