"""Unit tests of the trajectory boundary index, against a from-scratch recovery.

The reference below recovers boundaries from the whole signal the way TorchRL's
slice samplers do (end flags per row, the storage state's implicit ends, then
start = previous stop + 1 within each lane); the index must return exactly the
same tensors after any sequence of writes.
"""
from __future__ import annotations

import pytest
import torch

from torchrl_fixes.trajectory_boundaries import TrajectoryBoundaries, _merge_sorted


def reference(signal: torch.Tensor, kind: str, length: int, at_capacity: bool, cursor):
    """Boundaries recovered from the whole ``[length, *lanes]`` signal."""
    signal = signal[:length]
    if kind == "trajectory":
        end = torch.cat([signal[:-1] != signal[1:], signal[-1:] != signal[:1]])
    else:
        end = signal.clone()
    if not at_capacity:
        end[length - 1] = True
    else:
        if cursor is not None:
            end[cursor] = True
        no_end = ~end.any(0)
        end[length - 1] = end[length - 1] | no_end
    stop = end.transpose(0, -1).nonzero()
    stop[:, [0, -1]] = stop[:, [-1, 0]].clone()
    after = stop.clone()
    after[:, 0] = (after[:, 0] + 1) % length
    start = after.clone()
    for i in range(stop.shape[0]):
        lane = stop[i, 1:]
        same = (stop[:, 1:] == lane).all(-1).nonzero().squeeze(-1)
        position = int((same == i).nonzero())
        start[i] = after[same[position - 1]]
    lengths = stop[:, 0] - start[:, 0] + 1
    lengths[lengths <= 0] += length
    return start, stop, lengths


def query(index, signal, length, at_capacity, cursor):
    lanes = 1 if signal.ndim == 1 else signal.shape[1]
    return index.boundaries(
        signal.__getitem__,
        capacity=signal.shape[0],
        length=length,
        at_capacity=at_capacity,
        cursor=cursor,
        lanes=lanes,
    )


def assert_same(got, expected):
    for g, e, name in zip(got, expected, ("start", "stop", "lengths")):
        assert g.dtype == e.dtype, name
        assert g.shape == e.shape, f"{name}: {g.shape} != {e.shape}"
        assert torch.equal(g, e), f"{name}: {g.tolist()} != {e.tolist()}"


def random_signal(kind, rows, generator, lanes=None):
    shape = (rows,) if lanes is None else (rows, lanes)
    if kind == "end":
        return torch.rand(shape, generator=generator) < 0.2
    # episode ids that change now and then
    steps = (torch.rand(shape, generator=generator) < 0.2).long()
    return steps.cumsum(0)


def test_merge_sorted_interleaves():
    merged = _merge_sorted(torch.tensor([1, 4, 9]), torch.tensor([0, 5, 10]))
    assert merged.tolist() == [0, 1, 4, 5, 9, 10]


def test_bad_kind_and_short_length_raise():
    with pytest.raises(ValueError, match="kind"):
        TrajectoryBoundaries("ids")
    with pytest.raises(ValueError, match="at least 2"):
        TrajectoryBoundaries("end").boundaries(
            torch.zeros(4, dtype=torch.bool).__getitem__,
            capacity=4, length=1, at_capacity=False, cursor=None,
        )


@pytest.mark.parametrize("kind", ["end", "trajectory"])
@pytest.mark.parametrize("lanes", [None, 3])
@pytest.mark.parametrize("seed", range(12))
def test_ring_buffer_writes_match_the_reference(kind, lanes, seed):
    """Fill, wrap, rewrite random rows: every query equals a from-scratch recovery."""
    generator = torch.Generator().manual_seed(seed)
    capacity = int(torch.randint(5, 60, (1,), generator=generator))
    stored = random_signal(kind, capacity, generator, lanes)
    source = random_signal(kind, 4 * capacity, generator, lanes)
    index = TrajectoryBoundaries(kind)
    length, cursor, written = 0, None, 0
    for _ in range(25):
        action = int(torch.randint(3, (1,), generator=generator))
        if action < 2 or length < 2:
            k = int(torch.randint(1, capacity + 3, (1,), generator=generator))
            rows = (torch.arange(k) + written) % capacity
            stored[rows] = source[torch.arange(k) + (written % (3 * capacity))]
            written += k
            length = min(capacity, length + k)
            cursor = int(rows[-1])
        else:
            k = int(torch.randint(1, 4, (1,), generator=generator))
            rows = torch.randint(length, (k,), generator=generator)
            stored[rows] = random_signal(kind, k, generator, lanes)
        index.mark_written(rows)
        if length < 2:
            continue
        at_capacity = length == capacity
        got = query(index, stored, length, at_capacity, cursor if at_capacity else None)
        assert_same(got, reference(stored, kind, length, at_capacity, cursor if at_capacity else None))


@pytest.mark.parametrize("kind", ["end", "trajectory"])
def test_full_storage_without_cursor_or_any_end(kind):
    """A full lane with no end at all ends at its last row; one with an end keeps it."""
    signal = torch.zeros(8, 2, dtype=torch.bool if kind == "end" else torch.long)
    if kind == "end":
        signal[3, 1] = True
    else:
        signal[4:, 1] = 1
    index = TrajectoryBoundaries(kind)
    got = query(index, signal, 8, True, None)
    assert_same(got, reference(signal, kind, 8, True, None))


def test_repeated_query_returns_the_cached_tensors():
    """No write, same storage state: the same tensors, nothing recomputed."""
    signal = torch.zeros(16, dtype=torch.bool)
    signal[[3, 9]] = True
    index = TrajectoryBoundaries("end")
    first = query(index, signal, 16, True, 5)
    assert query(index, signal, 16, True, 5) is first
    assert query(index, signal, 16, True, 6) is not first


def test_a_write_reads_only_the_written_rows():
    """After the first build, a query reads the signal at the written rows only."""
    signal = torch.zeros(1000, dtype=torch.long)
    signal[500:] = 1
    index = TrajectoryBoundaries("trajectory")
    query(index, signal, 1000, True, 999)
    reads = []

    def counting(rows):
        reads.append(rows)
        return signal[rows]

    signal[10:13] = 7
    index.mark_written(torch.arange(10, 13))
    index.boundaries(counting, capacity=1000, length=1000, at_capacity=True, cursor=12)
    read_rows = torch.cat([torch.as_tensor(r).reshape(-1) for r in reads])
    # the three rows, the row before them, and each row's successor
    assert read_rows.numel() <= 2 * 4
    assert index.num_ends() == 4


def test_too_many_pending_rows_fall_back_to_a_rebuild():
    signal = torch.zeros(64, dtype=torch.bool)
    index = TrajectoryBoundaries("end", max_pending=8)
    query(index, signal, 64, True, 0)
    index.mark_written(torch.arange(10))
    assert not index.built
    signal[[5, 40]] = True
    assert_same(query(index, signal, 64, True, 0), reference(signal, "end", 64, True, 0))


def test_reset_forgets_the_index():
    signal = torch.zeros(8, dtype=torch.bool)
    index = TrajectoryBoundaries("end")
    query(index, signal, 8, False, None)
    assert index.built
    index.reset()
    assert not index.built and index.num_ends() == 0
