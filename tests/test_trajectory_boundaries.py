"""Unit tests of the trajectory boundary index, against a from-scratch recovery.

The reference below recovers boundaries from the whole signal the way TorchRL's
slice samplers do (end flags per row, the storage state's implicit ends, then
start = previous stop + 1 within each lane); the index must return exactly the
same tensors after any sequence of writes.
"""
from __future__ import annotations

import pytest
import torch

from torchrl_fixes import trajectory_boundaries, trajectory_order
from torchrl_fixes.trajectory_boundaries import (
    EndFlagDisagreements,
    TrajectoryBoundaries,
)


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


@pytest.fixture(autouse=True, params=[3, None], ids=["chunks-of-3", "default-chunks"])
def chunk_load(request, monkeypatch):
    """Every test also runs with tiny chunks, so that writes cross and merge chunks."""
    if request.param is not None:
        monkeypatch.setattr(trajectory_order, "LOAD", request.param)
    return request.param


_READ_IN_PLACE = {"on": False}


@pytest.fixture(autouse=True, params=["numpy", "torch", "view"])
def signal_path(request, monkeypatch):
    """Every test also runs with the ends found by torch, as for a signal on an
    accelerator (or in a dtype numpy lacks), instead of numpy, and with a signal
    read in place through its numpy view (``host``), as storage columns are."""
    if request.param == "torch":
        monkeypatch.setattr(trajectory_boundaries, "_host_array", lambda tensor: None)
    monkeypatch.setitem(_READ_IN_PLACE, "on", request.param == "view")
    return request.param


def reader(signal: torch.Tensor):
    """``signal`` as an index reads it: by slicing, or through its numpy view."""
    if not _READ_IN_PLACE["on"]:
        return signal.__getitem__

    def read(rows):
        raise AssertionError("a signal with a numpy view is read through it")

    read.host = signal.numpy()
    return read


def query(index, signal, length, at_capacity, cursor):
    """The index's boundaries; its order, queried trajectory by trajectory, must agree."""
    lanes = 1 if signal.ndim == 1 else signal.shape[1]
    arguments = dict(
        capacity=signal.shape[0], length=length, at_capacity=at_capacity, cursor=cursor, lanes=lanes
    )
    # the order first: what boundaries() returns after it must be as fresh
    order = index.trajectories(reader(signal), **arguments)
    selected = order.select(torch.arange(len(order)))
    got = index.boundaries(reader(signal), **arguments)
    assert_same(selected, got)
    return got


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
@pytest.mark.parametrize("lanes", [None, 2])
@pytest.mark.parametrize("seed", range(8))
def test_small_writes_into_a_long_ring_match_the_reference(kind, lanes, seed):
    """Writes far smaller than the storage: the index splices them in, never rebuilds."""
    generator = torch.Generator().manual_seed(100 + seed)
    capacity = int(torch.randint(200, 400, (1,), generator=generator))
    stored = random_signal(kind, capacity, generator, lanes)
    index = TrajectoryBoundaries(kind)
    length = int(torch.randint(2, capacity // 2, (1,), generator=generator))
    cursor = length - 1
    query(index, stored, length, False, None)
    for _ in range(60):
        k = int(torch.randint(1, 12, (1,), generator=generator))
        if int(torch.randint(4, (1,), generator=generator)):
            # an extend: the rows after the cursor, wrapping around the ring
            rows = (torch.arange(1, k + 1) + cursor) % capacity
            cursor = int(rows[-1])
            length = min(capacity, length + k)
        else:
            rows = torch.randint(length, (k,), generator=generator)
        new = random_signal(kind, k, generator, lanes)
        stored[rows] = new if kind == "end" else new + int(stored.max()) + 1
        index.mark_written(rows)
        at_capacity = length == capacity
        got = query(index, stored, length, at_capacity, cursor if at_capacity else None)
        assert_same(got, reference(stored, kind, length, at_capacity, cursor if at_capacity else None))


def disagreeing_rows(ids, done, length):
    """Rows of the first ``length`` whose flag differs from an id change after them."""
    ids, done = ids[:length], done[:length]
    changes = ids != torch.cat([ids[1:], ids[:1]])
    return (changes != done).t().nonzero()


@pytest.mark.parametrize("lanes", [None, 2])
@pytest.mark.parametrize("seed", range(10))
def test_disagreements_follow_writes(lanes, seed):
    """After any write the disagreeing rows, and whether flags and ids agree, are exact."""
    generator = torch.Generator().manual_seed(200 + seed)
    capacity = int(torch.randint(20, 120, (1,), generator=generator))
    shape = (capacity,) if lanes is None else (capacity, lanes)
    ids = torch.zeros(shape, dtype=torch.long)
    done = torch.zeros(shape, dtype=torch.bool)
    next_id = 1

    def pair(rows):
        return ids[rows], done[rows]

    def episode_rows(k):
        # consistent ids and flags: episodes of random length, done on their last step
        nonlocal next_id
        new = (torch.rand(shape[1:] + (k,), generator=generator) < 0.25).long().cumsum(-1)
        new = new.movedim(-1, 0) + next_id
        next_id = int(new.max()) + 2
        flags = torch.cat([new[1:] != new[:-1], torch.zeros_like(new[:1], dtype=torch.bool)])
        return new, flags

    index = EndFlagDisagreements()
    length, cursor = 0, None
    for step in range(40):
        k = int(torch.randint(1, 15, (1,), generator=generator))
        if length < 2 or int(torch.randint(3, (1,), generator=generator)):
            rows = (torch.arange(1, k + 1) + (cursor if cursor is not None else -1)) % capacity
            ids[rows], done[rows] = episode_rows(k)
            cursor = int(rows[-1])
            length = min(capacity, length + k)
        else:
            rows = torch.randint(length, (k,), generator=generator)
            if int(torch.randint(2, (1,), generator=generator)):
                # an interleaved writer: ids change where no flag says so
                ids[rows] = torch.randint(next_id, next_id + 3, rows.shape + shape[1:], generator=generator)
            else:
                done[rows] = ~done[rows]
        index.mark_written(rows)
        lane_count = 1 if lanes is None else lanes
        index.refresh(pair, capacity=capacity, length=length, lanes=lane_count)
        expected = disagreeing_rows(ids.reshape(capacity, -1), done.reshape(capacity, -1), length)
        keys = expected[:, 0] * capacity + expected[:, 1]
        assert torch.equal(index._order.stops(), keys), step
        if length < 2:
            continue
        at_capacity = length == capacity
        kept_cursor = cursor if at_capacity else None
        same = all(
            torch.equal(a, b)
            for a, b in zip(
                reference(ids, "trajectory", length, at_capacity, kept_cursor),
                reference(done, "end", length, at_capacity, kept_cursor),
            )
        )
        assert index.agree(length=length, at_capacity=at_capacity, cursor=kept_cursor) == same, step


def test_agree_needs_a_refresh_first():
    with pytest.raises(RuntimeError, match="refresh"):
        EndFlagDisagreements().agree(length=4, at_capacity=False, cursor=None)


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


def test_boundaries_are_copied_to_the_device_asked_once_per_change():
    # the meta device stands in for an accelerator: tensors land there without values
    done = torch.zeros(10, dtype=torch.bool)
    done[[2, 7]] = True
    index = TrajectoryBoundaries("end")
    geometry = dict(capacity=10, length=10, at_capacity=False, cursor=None)
    on_cpu = index.boundaries(done.__getitem__, **geometry)
    placed = index.boundaries(done.__getitem__, device="meta", **geometry)
    assert [t.device.type for t in placed] == ["meta"] * 3
    assert [(t.shape, t.dtype) for t in placed] == [(t.shape, t.dtype) for t in on_cpu]
    assert index.boundaries(done.__getitem__, device=torch.device("meta"), **geometry) is placed
    assert index.boundaries(done.__getitem__, device="cpu", **geometry) is on_cpu
    done[4] = True
    index.mark_written(torch.tensor([4]))
    moved = index.boundaries(done.__getitem__, device="meta", **geometry)
    assert moved is not placed and moved[2].shape == (4,)
    assert index.boundaries(done.__getitem__, **geometry)[2].tolist() == [3, 2, 3, 2]


def test_a_write_reads_only_the_written_rows():
    """After the first build, a query reads the signal at the written rows only."""
    signal = torch.zeros(1000, dtype=torch.long)
    signal[500:] = 1
    index = TrajectoryBoundaries("trajectory")
    query(index, signal, 1000, True, 999)
    reads = []

    def counting(rows):
        reads.append(torch.arange(rows.start, rows.stop))
        return signal[rows]

    signal[10:13] = 7
    index.mark_written(torch.arange(10, 13))
    index.boundaries(counting, capacity=1000, length=1000, at_capacity=True, cursor=12)
    read_rows = torch.cat(reads)
    # the three rows, the row before them, and the row after them
    assert torch.equal(read_rows, torch.arange(9, 14))
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
