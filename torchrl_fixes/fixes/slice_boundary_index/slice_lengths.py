"""Slices of many lengths, indexed at once.

``SliceSampler._tensor_slices_from_startend`` indexes slices of one length in a few
tensor operations, but slices of different lengths (a ``span``,
``strict_length=False``, the truncated slices of ``PrioritizedSliceSampler``) one
by one, with ``_start_to_end``: a few tensor operations per slice, each a device
synchronisation on an accelerator. :func:`_slices_of_lengths` makes the same index
for all of them in a few operations (:data:`TENSOR_SLICES_EDITS`).
"""
from __future__ import annotations

import torch


def _slices_of_lengths(start: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Returns the rows of slices of ``lengths`` rows from ``start``, one slice after the other.

    The result is ``torch.cat([sampler._start_to_end(s, n) for s, n in zip(start, lengths)])``:
    each slice advances along the storage's first dimension only.

    Args:
        start (torch.Tensor): the first row of each slice, ``[num_slices, ndim]``
            (or ``[num_slices]`` for a storage with one dimension).
        lengths (torch.Tensor): the number of rows of each slice, ``[num_slices]``.

    Examples:
        >>> import torch
        >>> _slices_of_lengths(torch.tensor([[3, 0], [10, 1]]), torch.tensor([2, 3]))
        tensor([[ 3,  0],
                [ 4,  0],
                [10,  1],
                [11,  1],
                [12,  1]])
    """
    if start.ndim == 1:
        start = start.unsqueeze(-1)
    lengths = lengths.to(start.device)
    # each slice's first row, less the rows of the slices before it: the running
    # count of rows then advances it
    shifted = start.clone()
    shifted[:, 0] -= lengths.cumsum(0) - lengths
    rows = shifted.repeat_interleave(lengths, dim=0)
    rows[:, 0] += torch.arange(rows.shape[0], device=rows.device, dtype=rows.dtype)
    return rows


# SliceSampler._tensor_slices_from_startend, the same in every release: slices of
# different lengths indexed at once, where the sampler indexes them as SliceSampler does.
TENSOR_SLICES_EDITS = (
    (
        """\
        result = torch.cat(
            [
                self._start_to_end(_start, _seq_len)
                for _start, _seq_len in zip(start, seq_length)
            ]
        )
""",
        """\
        if len(start) and type(self)._start_to_end is SliceSampler._start_to_end:
            result = _slices_of_lengths(start, seq_length)
        else:  # a subclass's own slices, or none (which torch.cat rejects)
            result = torch.cat(
                [
                    self._start_to_end(_start, _seq_len)
                    for _start, _seq_len in zip(start, seq_length)
                ]
            )
""",
    ),
)
