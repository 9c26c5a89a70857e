"""Slices without replacement drawn from the storage's trajectory index.

``SliceSamplerWithoutReplacement.sample`` lists every trajectory of the storage and
hands them all to ``_sample_slices`` with the ones its permutation drew: ``O(T)`` per
sample for ``T`` trajectories, even where the permutation is kept.
:func:`_sample_without_replacement_from_index` takes the trajectories of the
storage's index from the same permutation and hands the drawn ones alone to the
sampler's code: ``O(batch)`` per sample, plus the sampler's own new permutation when
the number of trajectories changes.
"""
from __future__ import annotations

import numpy as np

from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement

from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import _reads_index
from torchrl_fixes.fixes.slice_boundary_index.slice_sampling import (
    _slice_request,
    _slices_of_drawn,
    _warn_if_short,
)


@_reads_index
def _sample_without_replacement_from_index(sampler, storage, batch_size: int):
    """What ``sampler.sample(storage, batch_size)`` returns, or None (stock code).

    ``sampler`` is a ``SliceSamplerWithoutReplacement``. The draw is stock's: the
    next trajectories of the sampler's permutation of them
    (``SamplerWithoutReplacement.sample``), then ``_sample_slices`` on those alone
    (:func:`_slices_of_drawn` says how trajectories too short are handed to it).
    """
    request = _slice_request(sampler, storage, batch_size)
    if request is None:
        return None
    index, device, batch_size, seq_length, num_slices = request
    long_enough = index.count(seq_length)
    too_short = long_enough < index.count()
    if too_short and sampler.strict_length and not long_enough:
        return None  # the stock code raises its error, before drawing
    sampler._storage_len_buffer = index.count()
    drawn, _ = SamplerWithoutReplacement.sample(sampler, storage, num_slices)
    if isinstance(drawn, tuple):  # unravelled over the storage's shape
        ranks = np.ravel_multi_index([t.cpu().numpy() for t in drawn], storage.shape)
    else:
        ranks = drawn.cpu().numpy()
    padding = None
    if too_short and sampler.strict_length:
        # _sample_slices keeps the drawn trajectories long enough in their order
        ranks, padding = np.sort(ranks), seq_length
    elif too_short:
        padding = 1
    sampled = _slices_of_drawn(
        sampler, index.select(ranks), seq_length, index, device, storage, padding
    )
    _warn_if_short(sampler, sampled, batch_size)
    return sampled
