"""The trajectories of a storage in TorchRL's order, with order statistics over their lengths.

Pure numpy and torch: nothing here imports TorchRL. ``trajectory_boundaries``
keeps a storage's trajectory stops in a :class:`TrajectoryOrder`, and a slice
sampler draws from it without listing every trajectory.

A trajectory is named by its *stop*, the key ``lane * capacity + row`` of its
last row. Stops are kept sorted (TorchRL's order: lane, then row) in chunks of
about ``load`` keys, as ``sortedcontainers.SortedList`` keeps them: a write of
``k`` rows replaces ``O(k + load)`` keys. Each chunk caches its trajectories'
lengths and, per minimum length, how many are that long, so that the ``i``-th
trajectory of a minimum length is found in ``O(T / load + load)``. The first
trajectory of a lane starts after the lane's last stop, around the ring of
``length`` valid rows: it is computed at query time.
"""
from __future__ import annotations

import numpy as np
import torch

# Stops per chunk: a query scans one count per chunk, a write rewrites one chunk.
LOAD = 1024
# The per-chunk minimum of a chunk whose trajectories all start a lane.
_NO_LENGTH = np.iinfo(np.int64).max


class TrajectoryOrder:
    """The stops of a storage's trajectories, sorted, with their lengths.

    Args:
        capacity (int): the number of rows of a lane (the key stride).
        lanes (int, optional): the number of lanes (the storage's second batch
            dimension, 1 for a storage with one). Defaults to 1.

    Keyword Args:
        load (int, optional): the number of stops per chunk. Defaults to :data:`LOAD`.

    Examples:
        >>> import numpy as np, torch
        >>> order = TrajectoryOrder(capacity=10)
        >>> order.assign(np.array([2, 4, 7]))
        >>> order.length = 10  # a full storage of 10 rows: the first one wraps
        >>> order.lengths()
        tensor([5, 2, 3])
        >>> # the trajectories at least 3 rows long, and the second of them
        >>> order.count(min_length=3)
        2
        >>> start, stop, lengths = order.select(torch.tensor([1]), min_length=3)
        >>> start.squeeze(-1), stop.squeeze(-1), lengths
        (tensor([5]), tensor([7]), tensor([3]))
        >>> # rows 5 and 6 are rewritten: their stops change, nothing else is copied
        >>> order.replace(5, 6, np.array([5]))
        >>> order.stops()
        tensor([2, 4, 5, 7])
    """

    def __init__(self, capacity: int, lanes: int = 1, *, load: int | None = None):
        load = LOAD if load is None else load
        if capacity < 1 or lanes < 1 or load < 2:
            got = f"{capacity}, {lanes} and {load}"
            raise ValueError(
                f"capacity, lanes and load (>= 2) must be positive: {got}."
            )
        self.capacity = capacity
        self.lanes = lanes
        self.load = load
        self._length: int | None = None
        self.assign(np.empty(0, dtype=np.int64))

    def assign(self, stops: np.ndarray) -> None:
        """Replaces every stop by ``stops``, sorted unique int64 keys."""
        stops = np.ascontiguousarray(stops, dtype=np.int64)
        pieces = -(-stops.size // self.load)
        # Each chunk lives in a row of two arenas, its keys and its lengths, so that
        # a sample reads the drawn trajectories with one fancy index.
        self._key_arena = np.empty((pieces, self.load), dtype=np.int64)
        self._length_arena = np.empty((pieces, self.load), dtype=np.int64)
        self._free: list[int] = []
        self._slots = np.arange(pieces, dtype=np.int64)
        chunks = []
        for slot, piece in enumerate(np.array_split(stops, pieces) if pieces else []):
            self._key_arena[slot, : piece.size] = piece
            chunks.append(self._key_arena[slot, : piece.size])
        self._chunks: list[np.ndarray] = chunks
        self._firsts = np.array([c[0] for c in chunks], dtype=np.int64)
        self._lasts = np.array([c[-1] for c in chunks], dtype=np.int64)
        self._sizes = np.array([c.size for c in chunks], dtype=np.int64)
        self._count = stops.size
        self._chunk_lengths: list[np.ndarray | None] = [None] * len(chunks)
        self._chunk_positions: list[dict | None] = [None] * len(chunks)
        self._stale = np.ones(len(chunks), dtype=bool)
        self._any_stale = bool(chunks)
        self._mins = np.zeros(len(chunks), dtype=np.int64)
        # minimum length -> per chunk, how many of its trajectories are that long
        self._eligible: dict[int, np.ndarray] = {}
        self._lane_starts = None
        self._wraps = False
        # minimum length -> what select() needs that only a write changes
        self._selections: dict[int, tuple] = {}
        self._places: tuple | None = None  # where each chunk ends, in ranks and arenas
        self._shortest: int | None = None

    def __len__(self) -> int:
        return self._count

    @property
    def length(self) -> int | None:
        """The number of valid rows of a lane, around which first trajectories wrap."""
        return self._length

    @length.setter
    def length(self, length: int) -> None:
        if length != self._length:
            self._length = length
            self._lane_starts = None
            self._selections.clear()
            self._shortest = None

    def stops(self) -> torch.Tensor:
        """Every stop key, sorted."""
        if not self._chunks:
            return torch.empty(0, dtype=torch.long)
        return torch.from_numpy(np.concatenate(self._chunks))

    def __contains__(self, key: int) -> bool:
        c = int(self._lasts.searchsorted(key))
        if c == len(self._chunks):
            return False
        chunk = self._chunks[c]
        at = int(chunk.searchsorted(key))
        return at < chunk.size and int(chunk[at]) == key

    def replace(self, lo: int, hi: int, stops: np.ndarray) -> None:
        """Removes the stops in ``[lo, hi]`` and inserts ``stops`` (sorted, all in ``[lo, hi]``).

        Rewrites the chunks that hold ``[lo, hi]``: ``O(len(stops) + load)`` keys,
        plus one entry per chunk in the chunk tables.
        """
        stops = np.asarray(stops, dtype=np.int64)
        n = len(self._chunks)
        # the first chunk reaching lo, the last starting by hi
        first = int(self._lasts.searchsorted(lo))
        last = int(self._firsts.searchsorted(hi, side="right")) - 1
        if first == last:
            # within one chunk (most writes): that chunk alone is rewritten
            chunk = self._chunks[first]
            cut_lo, cut_hi = chunk.searchsorted(lo), chunk.searchsorted(hi, "right")
            keys = np.concatenate([chunk[:cut_lo], stops, chunk[cut_hi:]])
            fits = keys.size <= self.load
            if fits and (keys.size >= self.load // 2 or (n == 1 and keys.size)):
                self._rewrite(first, keys)
                return
        if first > last:
            # no stop in [lo, hi]: the new ones join a neighbouring chunk
            if not stops.size:
                return
            if n == 0:
                first, last = 0, -1
            else:
                first = last = min(first, n - 1)
        keys = np.concatenate(self._chunks[first : last + 1] or [stops[:0]])
        cut_lo = int(keys.searchsorted(lo))
        cut_hi = int(keys.searchsorted(hi, side="right"))
        keys = np.concatenate([keys[:cut_lo], stops, keys[cut_hi:]])
        if keys.size < self.load // 2 and n > last - first + 1:
            # too small to stand alone: merged with a neighbour
            if last + 1 < n:
                last += 1
                keys = np.concatenate([keys, self._chunks[last]])
            else:
                first -= 1
                keys = np.concatenate([self._chunks[first], keys])
        pieces = -(-keys.size // self.load)
        chunks = np.array_split(keys, pieces) if pieces else []
        self._splice(first, last + 1, chunks)

    def _rewrite(self, c: int, keys: np.ndarray) -> None:
        """Puts ``keys`` (a new array) in place of chunk ``c``'s, in its arena row.

        :meth:`_splice` of one chunk by one.
        """
        slot = self._slots[c]
        chunk = self._key_arena[slot, : keys.size]
        chunk[:] = keys
        self._chunks[c] = chunk
        self._chunk_lengths[c] = self._chunk_positions[c] = None
        self._count += keys.size - int(self._sizes[c])
        self._firsts[c], self._lasts[c], self._sizes[c] = keys[0], keys[-1], keys.size
        # the chunk after too: its first trajectory starts after another stop now
        self._stale[c : c + 2] = True
        self._stale_chunks_changed()

    def _stale_chunks_changed(self) -> None:
        """Forgets what depended on the chunks marked stale."""
        self._any_stale = True
        self._lane_starts = None
        self._selections.clear()
        self._places = None
        self._shortest = None

    def _splice(self, begin: int, end: int, chunks: list[np.ndarray]) -> None:
        """Puts ``chunks`` in place of chunks ``begin:end`` and marks what they change stale."""
        count = len(chunks)
        self._free.extend(self._slots[begin:end].tolist())
        slots = [self._store(chunk) for chunk in chunks]
        chunks = [
            self._key_arena[slot, : chunk.size] for slot, chunk in zip(slots, chunks)
        ]
        self._chunks[begin:end] = chunks
        self._chunk_lengths[begin:end] = [None] * count
        self._chunk_positions[begin:end] = [None] * count
        firsts = [c[0] for c in chunks]
        lasts = [c[-1] for c in chunks]
        sizes = [c.size for c in chunks]
        self._count += sum(sizes) - int(self._sizes[begin:end].sum())
        if count == end - begin:
            # as many chunks as before (most writes): the tables are updated in place
            self._slots[begin:end] = slots
            self._firsts[begin:end] = firsts
            self._lasts[begin:end] = lasts
            self._sizes[begin:end] = sizes
            self._stale[begin:end] = True
        else:

            def spliced(table, values):
                values = np.asarray(values, dtype=table.dtype)
                return np.concatenate([table[:begin], values, table[end:]])

            self._slots = spliced(self._slots, slots)
            self._firsts = spliced(self._firsts, firsts)
            self._lasts = spliced(self._lasts, lasts)
            self._sizes = spliced(self._sizes, sizes)
            self._stale = spliced(self._stale, [True] * count)
            self._mins = spliced(self._mins, [0] * count)
            for min_length, eligible in self._eligible.items():
                self._eligible[min_length] = spliced(eligible, [0] * count)
        # the chunk after: its first trajectory starts after another stop now
        if begin + count < len(self._chunks):
            self._stale[begin + count] = True
        self._stale_chunks_changed()

    def _store(self, keys: np.ndarray) -> int:
        """Writes ``keys`` (at most ``load``) into a free row of the key arena; its index."""
        if not self._free:
            rows = self._key_arena.shape[0]
            grown = max(2 * rows, 8)
            more = np.empty((grown - rows, self.load), dtype=np.int64)
            self._key_arena = np.concatenate([self._key_arena, more])
            self._length_arena = np.concatenate([self._length_arena, more])
            self._free.extend(range(grown - 1, rows - 1, -1))
            # the chunks are views of the old arenas
            self._chunks = [
                self._key_arena[slot, : chunk.size]
                for slot, chunk in zip(self._slots.tolist(), self._chunks)
            ]
            self._chunk_lengths = [
                None if lengths is None else self._length_arena[slot, : lengths.size]
                for slot, lengths in zip(self._slots.tolist(), self._chunk_lengths)
            ]
        slot = self._free.pop()
        self._key_arena[slot, : keys.size] = keys
        return slot

    def _lengths_of(self, keys: np.ndarray, previous: int | None) -> np.ndarray:
        """The lengths of the trajectories stopping at ``keys`` (sorted), ``previous`` the stop before them.

        A lane's first trajectory gets 0 (see :meth:`_lanes`).
        """
        lengths = np.empty_like(keys)
        np.subtract(keys[1:], keys[:-1], out=lengths[1:])
        lengths[0] = keys[0] - previous if previous is not None else 0
        if self.lanes > 1:
            lane = keys // self.capacity
            starts_lane = np.empty(keys.size, dtype=bool)
            np.not_equal(lane[1:], lane[:-1], out=starts_lane[1:])
            starts_lane[0] = previous is None or previous // self.capacity != lane[0]
            lengths[starts_lane] = 0
        return lengths

    def _refresh(self) -> None:
        """Computes the lengths of the chunks whose keys or predecessor changed."""
        if not self._any_stale:
            return
        self._any_stale = False
        stale = self._stale.nonzero()[0]
        if stale.size > 64 and stale.size * 2 > self._stale.size:
            self._refresh_all()
            return
        for c in stale.tolist():
            lengths = self._length_arena[self._slots[c], : self._sizes[c]]
            lengths[:] = self._lengths_of(
                self._chunks[c], int(self._lasts[c - 1]) if c else None
            )
            self._chunk_lengths[c] = lengths
            self._chunk_positions[c] = None
            if lengths[0] and self.lanes == 1:
                self._mins[c] = lengths.min()  # no first trajectory of a lane in it
            else:
                positive = lengths[lengths > 0]
                self._mins[c] = positive.min() if positive.size else _NO_LENGTH
            for min_length, eligible in self._eligible.items():
                eligible[c] = np.count_nonzero(lengths >= min_length)
            self._stale[c] = False

    def _refresh_all(self) -> None:
        """:meth:`_refresh` of every chunk at once, in whole-array passes (a new order)."""
        offsets = np.cumsum(self._sizes)[:-1]
        lengths = self._lengths_of(np.concatenate(self._chunks), None)
        self._chunk_lengths = []
        for slot, piece in zip(self._slots.tolist(), np.split(lengths, offsets)):
            self._length_arena[slot, : piece.size] = piece
            self._chunk_lengths.append(self._length_arena[slot, : piece.size])
        self._chunk_positions = [None] * len(self._chunks)
        starts = np.concatenate([[0], offsets])
        positive = np.where(lengths > 0, lengths, _NO_LENGTH)
        self._mins = np.minimum.reduceat(positive, starts)
        for min_length in self._eligible:
            self._eligible[min_length] = np.add.reduceat(lengths >= min_length, starts)
        self._stale[:] = False

    def _eligible_counts(self, min_length: int) -> np.ndarray:
        """Per chunk, how many of its trajectories (not first of a lane) are ``min_length`` long."""
        self._refresh()
        eligible = self._eligible.get(min_length)
        if eligible is None:
            if len(self._eligible) >= 8:
                self._eligible.pop(next(iter(self._eligible)))
            if self._chunks:
                long_enough = np.concatenate(self._chunk_lengths) >= min_length
                eligible = np.add.reduceat(
                    long_enough, np.cumsum(self._sizes) - self._sizes
                )
            else:
                eligible = np.zeros(0, dtype=np.int64)
            self._eligible[min_length] = eligible
        return eligible

    def _rank_of(self, key: int) -> int:
        """How many stops are lower than ``key``."""
        c = int(self._lasts.searchsorted(key))
        if c == len(self._chunks):
            return self._count
        return int(self._sizes[:c].sum()) + int(self._chunks[c].searchsorted(key))

    def _rank_places(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ends, bases)``, kept until a write.

        The rank after each chunk's last stop, and what turns a rank in a chunk into the
        position of its stop in the flat arenas (``slot * load`` less the rank of the
        chunk's first stop).
        """
        if self._places is None:
            ends = self._sizes.cumsum()
            self._places = (ends, self._slots * self.load - (ends - self._sizes))
        return self._places

    def _at_rank(self, rank: int) -> tuple[int, int]:
        """``(chunk, position)`` of the stop of rank ``rank``."""
        ends, _ = self._rank_places()
        c = int(ends.searchsorted(rank, side="right"))
        return c, rank - int(ends[c] - self._sizes[c])

    def _require_length(self) -> None:
        if self._length is None:
            raise RuntimeError("set the number of valid rows (length) before a query.")

    def _lanes(self):
        """``(rank, length)`` arrays of each non-empty lane's first trajectory, in lane order."""
        if self._lane_starts is None:
            self._require_length()
            # (rank, first stop row, last stop row) of each non-empty lane
            lanes = []
            if self.lanes == 1 and self._chunks:
                lanes.append((0, int(self._chunks[0][0]), int(self._chunks[-1][-1])))
            for lane in range(self.lanes if self.lanes > 1 else 0):
                rank = self._rank_of(lane * self.capacity)
                end = self._rank_of((lane + 1) * self.capacity)
                if end == rank:
                    continue
                c, at = self._at_rank(rank)
                first = int(self._chunks[c][at]) - lane * self.capacity
                c, at = self._at_rank(end - 1)
                last = int(self._chunks[c][at]) - lane * self.capacity
                lanes.append((rank, first, last))
            ranks, lengths = [], []
            self._wraps = False
            for rank, first, last in lanes:
                # from the row after the lane's last stop to its first one, around the ring
                length = first - (last + 1) % self._length + 1
                self._wraps = self._wraps or length <= 0  # it starts after its stop
                ranks.append(rank)
                lengths.append(length if length > 0 else length + self._length)
            self._lane_starts = (
                np.array(ranks, dtype=np.int64),
                np.array(lengths, dtype=np.int64),
            )
        return self._lane_starts

    def wraps(self) -> bool:
        """Whether a trajectory runs across the end of the valid rows onto the first ones (the first of a lane, in a full storage).

        Where none does, every trajectory starts at ``stop - length + 1``.
        """
        self._lanes()
        return self._wraps

    def count(self, min_length: int = 1) -> int:
        """How many trajectories are at least ``min_length`` rows long."""
        if min_length <= 1:
            self._require_length()
            return len(self)  # every trajectory: one per stop
        _, ends, lane_ranks, _, _ = self._selection(min_length)
        return int(ends[-1] if ends.size else 0) + lane_ranks.size

    def shortest(self) -> int:
        """The length of the shortest trajectory (there must be one)."""
        if self._shortest is None:
            self._refresh()
            lane_min = self._lanes()[1].min(initial=_NO_LENGTH)
            self._shortest = int(min(self._mins.min(initial=_NO_LENGTH), lane_min))
        if self._shortest == _NO_LENGTH:
            raise RuntimeError("no trajectory.")
        return self._shortest

    def shortest_rank(self) -> int:
        """The rank, among all trajectories, of one of the shortest."""
        self._refresh()
        lane_ranks, lane_lengths = self._lanes()
        shortest_chunk = self._mins.min(initial=_NO_LENGTH)
        if lane_lengths.size and lane_lengths.min() <= shortest_chunk:
            return int(lane_ranks[lane_lengths.argmin()])
        c = int(self._mins.argmin())
        lengths = self._chunk_lengths[c]
        at = int(np.flatnonzero(lengths == self._mins[c])[0])
        return int(self._sizes[:c].sum()) + at

    def select(
        self, ranks: torch.Tensor, min_length: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``ranks``-th trajectories among those at least ``min_length`` rows long.

        Args:
            ranks (Tensor): 1d integer ranks in ``[0, count(min_length))``, in
                TorchRL's order (lane, then row).
            min_length (int, optional): the minimum length. Defaults to 1 (every
                trajectory).

        Returns:
            ``start`` and ``stop``, ``[n, 1]`` (one lane) or ``[n, 2]`` (row, lane)
            int64 tensors of the first and last (inclusive) row of each, and
            ``lengths``, ``[n]``.
        """
        ranks = ranks.numpy() if isinstance(ranks, torch.Tensor) else np.asarray(ranks)
        return self._rows(*self.select_stops(ranks, min_length))

    def select_stops(
        self, ranks: np.ndarray, min_length: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`select` as numpy arrays: stop keys and lengths (see :meth:`first_rows`)."""
        ranks = ranks.astype(np.int64, copy=False)
        if min_length <= 1 and self.lanes == 1:
            return self._select_all(ranks)
        eligible, ends, lane_ranks, lane_stops, lane_lengths = self._selection(
            max(min_length, 1)
        )
        # the number of lane firsts before each rank; a rank equal to one's is that one
        at = lane_ranks.searchsorted(ranks)
        wanted = ranks - at
        # the others: the chunk by counts, then the position in the chunk
        chunk_of = ends.searchsorted(wanted, side="right")
        if lane_ranks.size:
            # read from the chunks below, then replaced: any valid place will do
            is_lane_first = lane_ranks[np.minimum(at, lane_ranks.size - 1)] == ranks
            chunk_of[is_lane_first] = 0
            wanted[is_lane_first] = ends[0] - eligible[0]
        mixed = eligible[chunk_of] != self._sizes[chunk_of]
        if lane_ranks.size:
            mixed &= ~is_lane_first
        within = wanted - (ends[chunk_of] - eligible[chunk_of])
        # in a chunk with trajectories too short (or first of a lane), the
        # position among the long enough ones
        if min_length <= 1 and self.lanes == 1:
            # only the very first trajectory is left out, at position 0
            within[mixed] += 1
        else:
            for i in mixed.nonzero()[0].tolist():
                within[i] = self._positions(int(chunk_of[i]), min_length)[within[i]]
        slots = self._slots[chunk_of]
        stops = self._key_arena[slots, within]
        lengths = self._length_arena[slots, within]
        if lane_ranks.size:
            stops[is_lane_first] = lane_stops[at[is_lane_first]]
            lengths[is_lane_first] = lane_lengths[at[is_lane_first]]
        return stops, lengths

    def _select_all(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`select_stops` among every trajectory of one lane.

        The rank is the stop's position, and the first one's length wraps around the
        ring.
        """
        self._refresh()
        ends, bases = self._rank_places()
        at = ranks + bases[ends.searchsorted(ranks, side="right")]
        stops = np.take(self._key_arena, at)
        lengths = np.take(self._length_arena, at)
        if not ranks.all():
            lengths[ranks == 0] = self._lanes()[1][0]
        return stops, lengths

    def _selection(self, min_length: int) -> tuple:
        """``(eligible, cumulated eligible, lane ranks, lane stops, lane lengths)`` for ``min_length``.

        Per chunk, how many trajectories (not first of a lane) are long enough, and each
        long enough first of a lane with its rank among them all.
        """
        cached = self._selections.get(min_length)
        if cached is not None:
            return cached
        eligible = self._eligible_counts(min_length)
        lane_ranks, lane_lengths = self._lanes()
        kept = lane_lengths >= min_length
        lane_ranks, lane_lengths = lane_ranks[kept], lane_lengths[kept]
        places = [(0, 0)] * lane_ranks.size  # one lane: its first stop
        if self.lanes > 1:
            places = [self._at_rank(rank) for rank in lane_ranks.tolist()]
        lane_stops = np.array([self._chunks[c][at] for c, at in places], np.int64)
        if min_length > 1:
            ranks = lane_ranks.tolist()
            before = [self._eligible_before(r, min_length, eligible) for r in ranks]
            lane_ranks = np.array(before, dtype=np.int64) + np.arange(lane_ranks.size)
        cached = (eligible, eligible.cumsum(), lane_ranks, lane_stops, lane_lengths)
        self._selections[min_length] = cached
        return cached

    def _positions(self, c: int, min_length: int) -> np.ndarray:
        """The positions in chunk ``c`` of its trajectories at least ``min_length`` long."""
        cached = self._chunk_positions[c]
        if cached is None:
            cached = self._chunk_positions[c] = {}
        positions = cached.get(min_length)
        if positions is None:
            positions = cached[min_length] = np.flatnonzero(
                self._chunk_lengths[c] >= min_length
            )
        return positions

    def _eligible_before(self, rank: int, min_length: int, eligible: np.ndarray) -> int:
        """How many trajectories of rank below ``rank`` (not first of a lane) are long enough."""
        c, at = self._at_rank(rank)
        return int(eligible[:c].sum()) + int(
            np.count_nonzero(self._chunk_lengths[c][:at] >= min_length)
        )

    def lengths(self) -> torch.Tensor:
        """The length of every trajectory, in order."""
        return self.materialize()[2]

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(start, stop, lengths)`` of every trajectory, as :meth:`select` returns them."""
        self._refresh()
        lane_ranks, lane_lengths = self._lanes()
        if not self._chunks:
            return self._rows(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        stops = np.concatenate(self._chunks)
        lengths = np.concatenate(self._chunk_lengths)
        lengths[lane_ranks] = lane_lengths
        return self._rows(stops, lengths)

    def first_rows(
        self, stops: np.ndarray, lengths: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(row, lane)`` where the trajectories stopping at keys ``stops`` with ``lengths`` start.

        Numpy arrays, ``lane`` ``None`` for one lane.
        """
        lane, stop = (
            np.divmod(stops, self.capacity) if self.lanes > 1 else (None, stops)
        )
        rows = stop - lengths + 1
        return (rows % self._length if self.wraps() else rows), lane

    def _rows(self, stops: np.ndarray, lengths: np.ndarray):
        start, lane = self.first_rows(stops, lengths)
        lengths = torch.from_numpy(lengths)
        if lane is None:
            start, stops = torch.from_numpy(start), torch.from_numpy(stops)
            return start.reshape(-1, 1), stops.reshape(-1, 1), lengths
        lane = torch.from_numpy(lane)
        start = torch.stack([torch.from_numpy(start), lane], -1)
        stop = torch.stack([torch.from_numpy(stops % self.capacity), lane], -1)
        return start, stop, lengths
