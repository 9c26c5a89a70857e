"""Conformance of the ``slice_boundary_index`` fix.

The fix keeps the trajectory boundaries of slice samplers (what
``SliceSampler._get_stop_and_length(storage)`` returns) in an index that every
storage write updates, instead of recomputing them from the whole storage at each
sample. It must not change anything a buffer returns: every test here runs one
scenario on stock TorchRL and once patched, from the same generator state, and
asserts that each sample (indices, the info the sampler writes, the data), each
value a write returns and each exception are identical. A scenario writes and
samples in turn, so the index is checked after every kind of write.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import itertools
import pickle
import random
import textwrap
import threading
import zlib

import numpy as np
import pytest
import torch
import torch.multiprocessing
from tensordict import TensorDict
from torchrl.data import SliceSampler
from torchrl.data.replay_buffers import utils as replay_buffer_utils

from conformance import harness, reference
from conformance.harness import assert_identical, run_patched
from conformance.slice_scenarios import (
    EPISODE_KEY,
    KEY_KINDS,
    PRIORITIZED_SAMPLER,
    SAMPLER_CLASSES,
    STORAGE_KINDS,
    Recording,
    SliceSetup,
    extend_in_child,
    new_scratch_dir,
    record_sample,
    record_write,
    safe_build,
    sample_step,
    write_on_request,
    write_rows,
)
from torchrl_fixes._core.patching import derive_from_source

FIX = "slice_boundary_index"


_NOT_IN_EFFECT = reference.why_not_in_effect(FIX)
pytestmark = [
    pytest.mark.skipif(_NOT_IN_EFFECT is not None, reason=f"{FIX} does not act here ({_NOT_IN_EFFECT})"),
    # Stock PrioritizedSliceSampler converts tensors with np.asarray(copy=False) at every sample.
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword"),
]


def assert_same_as_stock(scenario, seed: int = 0, *, fresh_stock: bool = False):
    """Runs ``scenario`` stock and patched and asserts identical records; returns stock's.

    With ``fresh_stock``, stock recovers the boundaries from the whole storage at
    every sample even where its ``cache_values`` cache would serve them: on TorchRL
    0.8 to 0.13 that cache outlives writes that do not go through the sampler
    (see :func:`test_stock_cache_goes_stale`), and the fix is meant to return what
    stock returns when it is right.
    """

    def stock_scenario():
        if not fresh_stock:
            return scenario()
        with stock_boundaries_from_scratch():
            return scenario()

    stock = run_stock(stock_scenario, seed)
    patched = run_patched(scenario, seed)
    assert_identical(stock, patched)
    return stock


def run_stock(scenario, seed: int = 0):
    """:func:`conformance.harness.run_stock`, with the prioritized sampler's stock bugs
    the fix answers corrected (:func:`stock_restores_priorities`)."""

    def corrected():
        with stock_restores_priorities():
            return scenario()

    return harness.run_stock(corrected, seed)


@contextlib.contextmanager
def stock_boundaries_from_scratch():
    """Inside ``disabled()``: stock SliceSamplers drop their cached boundaries before each use."""
    from torchrl.data.replay_buffers.samplers import SliceSampler

    stock = SliceSampler._get_stop_and_length

    def from_scratch(self, storage, fallback=True):
        self._cache.pop("stop-and-length", None)
        # TorchRL 0.14 on: the boundaries cached per storage revision, which
        # in-place writes through views do not move
        cache = getattr(replay_buffer_utils, "_REPLAY_BOUNDARY_CACHE", None)
        if cache is not None:
            with replay_buffer_utils._REPLAY_BOUNDARY_CACHE_LOCK:
                cache.pop(storage, None)
        return stock(self, storage, fallback)

    SliceSampler._get_stop_and_length = from_scratch
    try:
        yield
    finally:
        SliceSampler._get_stop_and_length = stock


# Stock PrioritizedSliceSampler.sample sets the priorities of the rows no slice may start
# at to zero, draws, and writes them back: a draw that raises (no row left to start at)
# leaves them at zero. The fix never writes the sampler's priorities.
_RESTORED = (
    "    starts, info = PrioritizedSampler.sample(\n"
    "        self, storage=storage, batch_size=batch_size // seq_length\n"
    "    )\n"
    "    self._sum_tree[preceding_stop_idx.cpu().numpy()] = vals\n"
)
# Its slices that may be shorter (span, strict_length=False) end at the stop the stock
# code finds for their start; for a start after the beginning of a full storage, in the
# trajectory that runs around its end, that is the next trajectory's stop.
_STOP_FOUND = (
    "        idx = diff.argmin(dim=0)\n"
    "        stops = stop_idx_corr[idx, 0]\n"
)


def _stops_after(starts: torch.Tensor, stop_idx: torch.Tensor, storage) -> torch.Tensor:
    """The first stop of ``stop_idx`` at or after each start of its lane, around the ring."""
    ring = storage._len_along_dim0
    stops = []
    for start in starts.tolist():
        lane = [stop for stop in stop_idx.tolist() if stop[1:] == start[1:]]
        stops.append(start[0] + min((stop[0] - start[0]) % ring for stop in lane))
    return torch.tensor(stops, dtype=stop_idx.dtype, device=stop_idx.device)


# Where the fix keeps the prioritized sampler's eligible starts (the runtime fix; the
# patched source once its series holds that change), stock is compared without these
# two bugs.
PRIORITIZED_STARTS_KEPT = (
    reference.in_effect(FIX) if not reference.UPSTREAM
    else hasattr(importlib.import_module(
        "torchrl.data.replay_buffers.samplers.prioritized_slice"), "_eligible_starts")
)


@contextlib.contextmanager
def stock_restores_priorities():
    """Inside stock's run: PrioritizedSliceSampler writes its priorities back when its
    draw raises too, and ends each shorter slice at its own trajectory's stop."""
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

    if not PRIORITIZED_STARTS_KEPT:
        yield
        return
    current = vars(PrioritizedSliceSampler)["sample"]
    # stock's own source (on a patched TorchRL source, what the stock run compiles)
    stock = reference.stock_attribute(PrioritizedSliceSampler, "sample")
    restored = "    try:\n" + textwrap.indent(_RESTORED, "    ").replace(
        "        self._sum_tree", "    finally:\n        self._sum_tree"
    )
    found = "        stops = _stops_after(starts_tensor, stop_idx, storage)\n"
    PrioritizedSliceSampler.sample = derive_from_source(
        stock, [(_RESTORED, restored), (_STOP_FOUND, found)], _stops_after=_stops_after
    )
    try:
        yield
    finally:
        PrioritizedSliceSampler.sample = current


@pytest.mark.stock_bug
@pytest.mark.torchrl_extension
@pytest.mark.skipif(not PRIORITIZED_STARTS_KEPT, reason="the eligible starts are not kept here")
# the eligible starts, and stock's zeroing where they do not serve (cache_values)
@pytest.mark.parametrize("cache_values", [False, True])
def test_stock_loses_priorities_when_its_draw_raises(cache_values, torchrl_extension):
    """Stock: a sample that finds no row to start at leaves those rows' priorities at zero."""
    from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, TensorDictReplayBuffer

    def scenario():
        sampler = PrioritizedSliceSampler(
            10, alpha=0.7, beta=0.5, slice_len=4, cache_values=cache_values
        )
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=8)
        done = torch.tensor([0, 1, 0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(-1)
        rb.extend(TensorDict({("next", "done"): done}, [7]))  # no trajectory of 4 rows
        before = torch.as_tensor(sampler._sum_tree[range(7)])
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            rb.sample()
        return before, torch.as_tensor(sampler._sum_tree[range(7)])

    stock_before, stock_after = harness.run_stock(scenario)
    patched_before, patched_after = run_patched(scenario)
    assert stock_before.gt(0).all() and stock_after.eq(0).all()  # lost
    assert torch.equal(patched_after, patched_before)


@pytest.mark.torchrl_extension
@pytest.mark.skipif(not PRIORITIZED_STARTS_KEPT, reason="the eligible starts are not kept here")
def test_subclass_update_priority_keeps_stock_zeroing(torchrl_extension):
    """A subclass with its own update_priority (which need not call
    PrioritizedSliceSampler's) draws from stock's zeroed tree: the same slices as stock
    after its priorities are set, and no eligible starts kept."""
    from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler

    def scenario():
        class Sampler(PrioritizedSliceSampler):
            def update_priority(self, index, priority, *, storage=None):
                PrioritizedSampler.update_priority(self, index, priority, storage=storage)

        sampler = Sampler(100, alpha=0.7, beta=0.5, slice_len=4)
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=16)
        done = (torch.arange(100) % 10 == 9).unsqueeze(-1)
        rb.extend(TensorDict({("next", "done"): done}, [100]))
        rb.sample()
        rb.update_priority(torch.tensor([17, 52]), torch.tensor([1e9, 1e9]))
        torch.manual_seed(0)
        np.random.seed(0)
        return rb.sample(return_info=True)[1]["index"], "_eligible_starts" in vars(sampler)

    (stock_index, _), (patched_index, kept) = harness.run_stock(scenario), run_patched(scenario)
    assert all(map(torch.equal, stock_index, patched_index))
    assert {int(row) for row in patched_index[0].view(-1, 4)[:, 0]} <= {17, 52}
    assert not kept


@pytest.mark.stock_bug
@pytest.mark.torchrl_extension
@pytest.mark.skipif(not PRIORITIZED_STARTS_KEPT, reason="the eligible starts are not kept here")
def test_stock_slice_runs_past_its_stop_around_the_ring(torchrl_extension):
    """Stock, span: a slice from the start of a full storage, in the trajectory that runs
    around its end, ends at the next trajectory's stop (from the newest row to the oldest)."""
    from torchrl.data import LazyTensorStorage, PrioritizedSliceSampler, TensorDictReplayBuffer

    def scenario():
        sampler = PrioritizedSliceSampler(10, alpha=1.0, beta=0.5, slice_len=4, span=(0, True))
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=sampler, batch_size=4)
        step = torch.arange(13)  # rows 0-2 hold steps 10-12; 9, 0, 1, 2 is one trajectory
        done = (step == 5) | (step == 8)
        rb.extend(TensorDict({"step": step, ("next", "done"): done.unsqueeze(-1)}, [13]))
        rb.update_priority(torch.arange(10), torch.tensor([1e6] + [1e-6] * 9))
        return rb.sample()["step"]

    assert harness.run_stock(scenario).tolist() == [10, 11, 12, 3]  # across the write cursor
    assert run_patched(scenario).tolist() == [10, 11, 12]


STOCK_CACHE_GOES_STALE = '"stop-and-length"' in inspect.getsource(
    reference.stock_attribute(
        __import__("torchrl.data.replay_buffers.samplers", fromlist=["SliceSampler"]).SliceSampler,
        "_get_stop_and_length",
    )
)


@pytest.mark.stock_bug
@pytest.mark.skipif(not STOCK_CACHE_GOES_STALE, reason="stock keys its cache on a storage revision here")
def test_stock_cache_goes_stale():
    """Stock 0.8-0.13, cache_values=True: a write through storage.set keeps the old boundaries."""
    from torchrl.data import LazyTensorStorage, SliceSampler

    def scenario():
        storage = LazyTensorStorage(20)
        step = torch.arange(20)
        storage.set(step, TensorDict({"episode": step // 5}, [20]))
        sampler = SliceSampler(slice_len=2, traj_key="episode", cache_values=True)
        before = sampler._get_stop_and_length(storage)
        storage.set(torch.arange(3), TensorDict({"episode": torch.tensor([7, 8, 9])}, [3]))
        return before, sampler._get_stop_and_length(storage)

    stock_before, stock_after = run_stock(scenario)
    _, patched_after = run_patched(scenario)
    assert all(torch.equal(a, b) for a, b in zip(stock_before, stock_after))  # stale
    assert patched_after[2].numel() == stock_after[2].numel() + 3  # the three new episodes


@pytest.mark.stock_bug
@pytest.mark.skipif(STOCK_CACHE_GOES_STALE, reason="stock's cache here goes stale at any write")
def test_stock_cache_misses_in_place_writes():
    """Stock 0.14 and main, cache_values=True: an in-place write through a view of the
    storage moves no revision, and the cached boundaries stay; the index sees it."""
    from torchrl.data import LazyTensorStorage, SliceSampler

    def scenario():
        storage = LazyTensorStorage(20)
        done = (torch.arange(20) % 5 == 4).unsqueeze(-1)
        storage.set(torch.arange(20), TensorDict({("next", "done"): done}, [20]))
        sampler = SliceSampler(slice_len=2, end_key=("next", "done"), cache_values=True)
        before = sampler._get_stop_and_length(storage)
        storage[:]["next", "done"][1::5] = True  # one more end in each episode
        return before, sampler._get_stop_and_length(storage)

    stock_before, stock_after = run_stock(scenario)
    _, patched_after = run_patched(scenario)
    assert all(torch.equal(a, b) for a, b in zip(stock_before, stock_after))  # stale
    assert patched_after[2].numel() == 2 * stock_after[2].numel()


def setup_params(setups) -> list:
    """``setups`` as pytest parameters named after them; prioritized ones and those with
    storages on a CUDA device marked."""
    return [
        pytest.param(
            s,
            id=str(s),
            marks=[pytest.mark.torchrl_extension] * s.prioritized
            + [pytest.mark.cuda] * (s.device != "cpu"),
        )
        for s in setups
    ]


def require(setup: SliceSetup, request) -> None:
    """Skips where this TorchRL cannot build ``setup``'s sampler as asked."""
    if setup.prioritized:
        request.getfixturevalue("torchrl_extension")
    missing = setup.missing_arguments()
    if missing:
        pytest.skip(f"{setup.sampler} takes no {', '.join(missing)} on this TorchRL")


# ---------------------------------------------------------------------------
# The matrix: sampler x storage x keys x fill state x strict_length x options.
# ---------------------------------------------------------------------------

FILL_STATES = ("partial", "full", "wrapped")

# Sampler options beyond the keys, each with a batch size they divide.
OPTIONS = {
    "num_slices": ((("num_slices", 4),), 24),
    "slice_len": ((("slice_len", 5),), 20),
    "span": ((("slice_len", 5), ("span", True)), 20),
    "span(1,2)": ((("num_slices", 4), ("span", (1, 2))), 24),
    "pad_output": ((("slice_len", 5), ("pad_output", True)), 20),
    "cache_values": ((("num_slices", 4), ("cache_values", True)), 24),
}

# The options each sampler class takes (in some release; missing ones are skipped).
SAMPLER_OPTIONS = {
    "SliceSampler": list(OPTIONS),
    "SliceSamplerWithoutReplacement": ["num_slices", "slice_len"],
    "PrioritizedSliceSampler": ["num_slices", "slice_len", "span", "span(1,2)", "cache_values"],
}


def _matrix():
    """Every sampler x storage x key kind x fill state x strict_length, with options in turn.

    The options are not crossed with everything: each case takes one or two of its
    sampler's options, rotated so that every option meets every fill state and
    strict_length value, and every storage and key kind. About half the cases store
    no ``is_init`` entry (chosen by a hash of the case), as data written without
    ``InitTracker`` has none.
    """
    cases = []
    for sampler in SAMPLER_CLASSES:
        options = SAMPLER_OPTIONS[sampler]
        picks = 2 if len(options) >= 4 else 1
        pairs = itertools.product(STORAGE_KINDS, KEY_KINDS)
        for rotation, (storage, keys) in enumerate(pairs):
            combos = itertools.product(FILL_STATES, (True, False))
            for combo, (fill, strict) in enumerate(combos):
                for pick in range(picks):
                    turn = combo + rotation + pick * len(options) // picks
                    option = options[turn % len(options)]
                    cases.append(_case(sampler, storage, keys, fill, strict, option))
    return cases


def _case(sampler, storage, keys, fill, strict, option):
    label = "-".join([sampler, storage, keys, fill, "strict" if strict else "loose", option])
    seed = zlib.crc32(label.encode())
    with_is_init = seed % 2 == 0
    options, batch_size = OPTIONS[option]
    setup = SliceSetup(
        sampler=sampler,
        storage=storage,
        keys=keys,
        strict_length=strict,
        options=options,
        batch_size=batch_size,
        with_is_init=with_is_init,
    )
    marks = [pytest.mark.torchrl_extension] if setup.prioritized else []
    label += "" if with_is_init else "-no_is_init"
    return pytest.param(setup, fill, seed, id=label, marks=marks)


def interleaved_scenario(setup: SliceSetup, fill: str, seed: int, scratch):
    """Fills a buffer to ``fill``, then samples and writes in turn, recording everything.

    ``partial`` writes two thirds of the capacity, ``full`` exactly the capacity,
    ``wrapped`` past it, stopping in the middle of an episode. Then come four
    samples, with writes between them: a few rows, a single row, and more than
    half the capacity (the ring wraps).
    """

    def scenario():
        records = []
        rb = safe_build(setup, scratch, records)
        if rb is None:
            return records
        stream = setup.stream(seed)
        steps = setup.time_capacity
        if fill == "partial":
            first_writes = [steps // 3, steps // 3]
        elif fill == "full":
            first_writes = [steps - 7, 7]
        else:
            total = stream.rows_to_episode_middle(steps + steps // 2)
            first_writes = [steps - 5, total - (steps - 5)]
        for rows in first_writes:
            records.append(record_write(write_rows, rb, setup, stream.take(rows)))
        for rows in (7, setup.single_write, steps // 2 + 3):
            sample_step(rb, setup, records)
            records.append(record_write(write_rows, rb, setup, stream.take(rows)))
        sample_step(rb, setup, records)
        return records

    return scenario


@pytest.mark.parametrize(("setup", "fill", "seed"), _matrix())
def test_matrix_samples_match_stock(setup, fill, seed, tmp_path, request):
    """Each sampler, storage, key kind, fill state and option samples exactly as stock."""
    require(setup, request)
    assert_same_as_stock(interleaved_scenario(setup, fill, seed, tmp_path), seed)


# ---------------------------------------------------------------------------
# Random interleaving of writes and samples.
# ---------------------------------------------------------------------------

RANDOM_SETUPS = [
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="traj_key"),
    SliceSetup(
        sampler="SliceSampler",
        storage="memmap",
        keys="end_key",
        strict_length=False,
        options=(("slice_len", 5),),
        batch_size=20,
    ),
    SliceSetup(sampler="SliceSamplerWithoutReplacement", storage="ndim2", keys="auto"),
    SliceSetup(
        sampler="SliceSampler",
        storage="ndim2",
        keys="end_key",
        strict_length=False,
        options=(("num_slices", 4), ("cache_values", True)),
        buffer="ReplayBuffer",
    ),
    SliceSetup(sampler="PrioritizedSliceSampler", storage="tensor", keys="end_key"),
    # spans on one side: slices that start before their trajectory, or end after it
    SliceSetup(
        sampler="SliceSampler",
        storage="ndim2",
        keys="traj_key",
        options=(("slice_len", 5), ("span", (True, 2))),
        batch_size=20,
    ),
    SliceSetup(
        sampler="SliceSampler",
        storage="memmap",
        keys="end_key",
        options=(("num_slices", 4), ("span", (2, False))),
    ),
    # trajectories too short for some slices: kept out (strict) or clamped (not strict)
    SliceSetup(
        sampler="SliceSamplerWithoutReplacement",
        storage="tensor",
        keys="end_key",
        options=(("slice_len", 5),),
        batch_size=20,
    ),
    SliceSetup(
        sampler="SliceSamplerWithoutReplacement",
        storage="ndim2",
        keys="traj_key",
        strict_length=False,
        options=(("slice_len", 5),),
        batch_size=20,
    ),
    SliceSetup(
        sampler="SliceSampler",
        storage="tensor",
        keys="end_key",
        options=(("slice_len", 5), ("span", True)),
        batch_size=20,
    ),
    # the eligible starts of the prioritized sampler, kept by the writes
    SliceSetup(
        sampler="PrioritizedSliceSampler",
        storage="memmap",
        keys="traj_key",
        strict_length=False,
        options=(("slice_len", 5),),
        batch_size=20,
    ),
    SliceSetup(
        sampler="PrioritizedSliceSampler",
        storage="tensor",
        keys="auto",
        options=(("num_slices", 4), ("span", (0, 2))),
        generator_seed=3,
    ),
    SliceSetup(
        sampler="PrioritizedSliceSampler",
        storage="tensor",
        keys="end_key",
        strict_length=False,
        options=(("slice_len", 5), ("span", True), ("cache_values", True)),
        batch_size=20,
        buffer="ReplayBuffer",
    ),
    SliceSetup(sampler="PrioritizedSliceSampler", storage="ndim2", keys="end_key"),
    # stock's stops of shorter slices, lane by lane (one slice: a start past its lane's
    # last stop is often the only one)
    SliceSetup(
        sampler="PrioritizedSliceSampler",
        storage="ndim2",
        keys="end_key",
        options=(("num_slices", 1), ("span", (0, True))),
        batch_size=6,
    ),
]


def random_plan(setup: SliceSetup, seed: int, steps: int = 16) -> list[tuple[str, int]]:
    """Random steps: sample, a single-row write, or a write of up to the whole capacity."""
    rng = random.Random(seed)
    plan = []
    for _ in range(steps):
        kind = rng.choices(["sample", "single", "extend"], weights=[4, 2, 4])[0]
        if kind == "single":
            plan.append(("write", setup.single_write))
        elif kind == "extend":
            plan.append(("write", rng.randint(2, setup.time_capacity)))
        else:
            plan.append(("sample", 0))
    return plan


def random_scenario(setup: SliceSetup, seed: int, scratch):
    """Writes a third of the capacity, then follows :func:`random_plan`, recording each step."""
    plan = random_plan(setup, seed)

    def scenario():
        run = Recording(setup, seed, scratch)
        run.write(setup.time_capacity // 3)
        for kind, rows in plan:
            if kind == "write":
                run.write(rows)
            else:
                run.sample()
        return run.records

    return scenario


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("setup", setup_params(RANDOM_SETUPS))
def test_random_interleaving_matches_stock(setup, seed, tmp_path, request):
    """Random single-row and multi-row writes (wrapping the ring) and samples: identical at every step."""
    require(setup, request)
    assert_same_as_stock(random_scenario(setup, seed, tmp_path), seed)


# Samplers whose slices the index places in the drawn trajectories itself (TorchRL
# 0.14 on, where _finalize_index adds the info): spans included; a span as long as the
# slices reaches stock's error.
PLACED_SLICES = [
    ((("slice_len", 5),), True),
    ((("slice_len", 5), ("span", True)), True),
    ((("num_slices", 4), ("span", (2, 1))), True),
    ((("num_slices", 4), ("span", (0, True))), True),
    ((("slice_len", 5), ("span", (5, 0))), False),
]


@reference.runtime_only
@pytest.mark.skipif(
    "_finalize_index" not in vars(SliceSampler),
    reason="the slices are placed before _finalize_index, which this TorchRL has not",
)
@pytest.mark.parametrize("options,placed", PLACED_SLICES, ids=[str(o) for o, _ in PLACED_SLICES])
def test_slices_are_placed_in_the_drawn_trajectories(options, placed, monkeypatch, request):
    """The index places the slices of a sampler with no spans, or spans shorter than its
    slices, itself; the others go to the sampler's own code."""
    from torchrl_fixes.fixes.slice_boundary_index import slice_sampling

    setup = SliceSetup(keys="end_key", options=options, batch_size=20)
    require(setup, request)
    calls, place = [], slice_sampling._placed_slices
    monkeypatch.setattr(
        slice_sampling, "_placed_slices", lambda *args: calls.append(1) or place(*args)
    )
    run = Recording(setup, seed=0)
    run.write(setup.time_capacity // 2)
    torch.manual_seed(0)
    run.sample(3)
    assert len(calls) == (3 if placed else 0)
    if not placed:  # stock's error, at each sample
        assert [record[:2] for record in run.records[1:]] == [("raised", "ValueError")] * 3


# ---------------------------------------------------------------------------
# The online append: small writes past the stored rows, samples in between, until
# the storage fills and wraps (where the trajectory table gives way to the order).
# ---------------------------------------------------------------------------

APPEND_SETUPS = [
    SliceSetup(keys="end_key", capacity=300, batch_size=12),
    SliceSetup(keys="end_key", capacity=300, strict_length=False, batch_size=12),
    SliceSetup(
        keys="auto", capacity=300, options=(("slice_len", 3),), buffer="ReplayBuffer"
    ),
    SliceSetup(keys="end_key", storage="memmap", capacity=300, with_is_init=False),
    SliceSetup(
        sampler="PrioritizedSliceSampler", keys="end_key", capacity=300, batch_size=12
    ),
    SliceSetup(
        sampler="PrioritizedSliceSampler",
        keys="traj_key",
        capacity=300,
        strict_length=False,
        options=(("slice_len", 3),),
        batch_size=12,
    ),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("setup", setup_params(APPEND_SETUPS))
def test_online_appends_match_stock(setup, seed, tmp_path, request):
    """Writes of 1 to 24 rows past the stored ones, each followed by a sample: identical at every step."""
    require(setup, request)
    rng = random.Random(seed)
    sizes = [rng.randint(1, 24) for _ in range(30)]

    def scenario():
        run = Recording(setup, seed, tmp_path)
        run.write(12)
        for rows in sizes:
            run.write(rows)
            run.sample()
        return run.records

    assert_same_as_stock(scenario, seed)


# ---------------------------------------------------------------------------
# Write paths: every way data reaches the storage, then samples.
# ---------------------------------------------------------------------------

WRITE_SETUPS = [
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="traj_key", strict_length=False),
    SliceSetup(sampler="SliceSampler", storage="memmap", keys="end_key"),
    SliceSetup(
        sampler="SliceSampler",
        storage="tensor",
        keys="auto",
        options=(("num_slices", 4), ("cache_values", True)),
    ),
    SliceSetup(sampler="SliceSamplerWithoutReplacement", storage="tensor", keys="end_key"),
    SliceSetup(sampler="PrioritizedSliceSampler", storage="tensor", keys="traj_key"),
    # storages on the GPU: the same coherence, boundaries and draws on the device
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="unnamed", device="cuda"),
    SliceSetup(
        sampler="SliceSamplerWithoutReplacement", storage="tensor", keys="end_key", device="cuda"
    ),
]

write_setups = pytest.mark.parametrize("setup", setup_params(WRITE_SETUPS))


def stored_rows(rb, index) -> TensorDict:
    """A copy of the rows the storage holds at ``index``."""
    return rb._storage[index].clone()


def relabel(rows: TensorDict, trajectory_id: int) -> TensorDict:
    """Gives ``rows`` one trajectory id, under every id key they carry."""
    ids = torch.full(rows.shape, trajectory_id, dtype=torch.int64)
    rows[("collector", "traj_ids")] = ids
    if EPISODE_KEY in rows.keys():
        rows[EPISODE_KEY] = ids
    return rows


def set_end_flags(rows: TensorDict, ends: torch.Tensor) -> TensorDict:
    """Sets ``done`` and ``truncated`` to ``ends`` and clears ``terminated``."""
    ends = ends.reshape(*rows.shape, 1)
    rows[("next", "done")] = ends.clone()
    rows[("next", "truncated")] = ends.clone()
    rows[("next", "terminated")] = torch.zeros_like(ends)
    return rows


def stored_ends(rb) -> torch.Tensor:
    """Positions of the stored rows whose ``done`` flag is set."""
    return rb._storage[:][("next", "done")].reshape(-1).nonzero().squeeze(-1)


def write_path_test(setup, seed, tmp_path, request, write):
    """Fills past capacity, samples, applies ``write(run)``, and compares every record."""
    require(setup, request)

    def scenario():
        run = Recording(setup, seed, tmp_path)
        run.fill_wrapped()
        run.sample()
        write(run)
        run.sample(2)
        return run.records

    stock = assert_same_as_stock(scenario, seed, fresh_stock=True)
    assert any(record[0] == "sample" for record in stock), "stock never sampled"


@write_setups
def test_extend_matches_stock(setup, tmp_path, request):
    """extend() of a few rows, a third of the capacity, and all but one row, sampled in between."""

    def write(run):
        for rows in (3, setup.time_capacity // 3, setup.time_capacity - 1):
            run.write(rows)
            run.sample()

    write_path_test(setup, 1, tmp_path, request, write)


@write_setups
def test_add_matches_stock(setup, tmp_path, request):
    """add() of single rows, sampled after every third row."""

    def write(run):
        for i in range(15):
            run.call(run.rb.add, run.stream.take(1)[0])
            if i % 3 == 2:
                run.sample()

    write_path_test(setup, 2, tmp_path, request, write)


@write_setups
def test_setitem_matches_stock(setup, tmp_path, request):
    """rb[idx] = td with int, slice, list and tensor indices that split, merge and relabel episodes."""

    def write(run):
        rb = run.rb
        # An end flag in the middle of an episode splits it.
        row = stored_rows(rb, 12)
        run.call(rb.__setitem__, 12, set_end_flags(row, torch.tensor(True)))
        run.sample()
        # The next episode takes the id of the previous one, whose end flag goes: they merge.
        ends = stored_ends(rb)
        first_end, second_end = int(ends[1]), int(ends[2])
        merged = torch.arange(first_end, second_end + 1)
        rows = stored_rows(rb, merged)
        relabel(rows, int(rows[("collector", "traj_ids")][0]))
        rows[("next", "done")][0] = rows[("next", "truncated")][0] = False
        run.call(rb.__setitem__, merged, rows)
        run.sample()
        # A new episode in the middle of the storage, written through a slice.
        rows = relabel(stored_rows(rb, slice(20, 26)), 10_000)
        run.call(rb.__setitem__, slice(20, 26), set_end_flags(rows, torch.arange(6) == 5))
        run.sample()
        # Fresh rows at scattered positions, through a list.
        fresh = run.stream.take(3)
        if "index" in rb._storage[:].keys():
            fresh["index"] = torch.tensor([3, 7, 8])
        run.call(rb.__setitem__, [3, 7, 8], fresh)
        run.sample()
        # Every end flag cleared: only the trajectory ids (or the cursor) separate episodes.
        rows = stored_rows(rb, slice(None))
        run.call(rb.__setitem__, slice(None), set_end_flags(rows, torch.zeros(rows.shape, dtype=torch.bool)))

    write_path_test(setup, 3, tmp_path, request, write)


@write_setups
def test_in_place_buffer_setters_match_stock(setup, tmp_path, request):
    """rb.set_at_, rb.set_ and rb.update_ (TorchRL >= 0.12) rewrite ids and end flags in place."""
    if not hasattr(setup.buffer_class(), "set_at_"):
        pytest.skip("this TorchRL has no ReplayBuffer.set_at_ / set_ / update_")

    def write(run):
        rb = run.rb
        index = torch.tensor([4, 5, 9])
        run.call(rb.set_at_, ("next", "done"), torch.ones(3, 1, dtype=torch.bool), index)
        run.sample()
        ids = rb._storage[:][("collector", "traj_ids")] // 2
        for key in (EPISODE_KEY, ("collector", "traj_ids")):
            if key in rb._storage[:].keys(include_nested=True):
                run.call(rb.set_, key, ids)
        done = rb._storage[:][("next", "done")]
        run.call(rb.set_, ("next", "done"), done & (torch.arange(done.shape[0], device=done.device) % 3 == 0).unsqueeze(-1))
        run.sample()
        stored = rb._storage[:]
        update = TensorDict(
            {("next", "done"): stored[("next", "truncated")] | stored[("next", "terminated")]},
            stored.shape,
        )
        run.call(rb.update_, update)

    write_path_test(setup, 4, tmp_path, request, write)


@write_setups
def test_storage_set_matches_stock(setup, tmp_path, request):
    """storage.set(cursor, data) bypassing the buffer: at the writer's cursor, one row, and a range."""

    def write(run):
        storage = run.rb._storage
        cursor = run.rb._writer._cursor
        rows = torch.arange(cursor, cursor + 5) % setup.capacity
        run.call(storage.set, rows, run.stream.take(5))
        run.sample()
        run.call(storage.set, 0, run.stream.take(1)[0])
        run.sample()
        run.call(storage.set, range(30, 38), run.stream.take(8))

    write_path_test(setup, 5, tmp_path, request, write)


@write_setups
def test_storage_set_past_length_matches_stock(setup, tmp_path, request):
    """storage.set() on a partly filled storage, from its length on: the length grows.

    The buffer's writer does not see these rows, so its next write lands on them
    and the storage counts them twice: the rows past the true end would then be
    uninitialized memory, which no two runs read alike. The scenario stops before.
    """
    require(setup, request)

    def scenario():
        run = Recording(setup, 6, tmp_path)
        run.write(20)
        run.sample()
        run.call(run.rb._storage.set, torch.arange(20, 26), run.stream.take(6))
        run.sample(2)
        run.call(run.rb._storage.set, 26, run.stream.take(1)[0])
        run.sample(2)
        return run.records

    assert_same_as_stock(scenario, 6, fresh_stock=True)


@write_setups
def test_storage_setitem_matches_stock(setup, tmp_path, request):
    """storage[idx] = data (no cursor, no length update) with a slice and a tensor index."""

    def write(run):
        storage = run.rb._storage
        run.call(storage.__setitem__, slice(10, 16), run.stream.take(6))
        run.sample()
        index = torch.tensor([1, 2, 40, 41])
        rows = set_end_flags(stored_rows(run.rb, index), torch.tensor([False, True, False, True]))
        run.call(storage.__setitem__, index, relabel(rows, 20_000))

    write_path_test(setup, 7, tmp_path, request, write)


@write_setups
def test_second_buffer_on_the_same_storage_matches_stock(setup, tmp_path, request):
    """A second buffer on the same storage object writes (with its own cursor) while the first samples."""

    def write(run):
        second = setup.build_buffer(storage=run.rb._storage)
        for rows in (6, 1, 11):
            run.write(rows, rb=second)
            run.sample()
            run.sample(rb=second)

    write_path_test(setup, 8, tmp_path, request, write)


@write_setups
def test_empty_then_refill_matches_stock(setup, tmp_path, request):
    """rb.empty(), a sample of the empty buffer, then refills past capacity."""

    def write(run):
        run.call(run.rb.empty)
        run.sample()
        run.write(setup.time_capacity // 2)
        run.sample()
        run.fill_wrapped()

    write_path_test(setup, 9, tmp_path, request, write)


def restore_twice(run, fresh, restore, saved) -> None:
    """Restores ``saved`` into ``fresh`` (then samples and writes there), and into
    ``run.rb`` after more writes; ``restore(rb)`` is the buffer's restoring method."""
    run.call(restore(fresh), saved)
    run.sample(2, rb=fresh)
    run.write(9, rb=fresh)
    run.sample(rb=fresh)
    run.write(13)
    run.sample()
    run.call(restore(run.rb), saved)


def _in_place(run, key, write) -> None:
    """Applies ``write(column)`` to the stored ``key`` column through a view of the
    storage (``rb.storage[:]``), where the stored rows carry ``key``."""
    view = run.rb._storage[:]
    if key in view.keys(include_nested=True):
        run.call(write, view.get(key))


@write_setups
def test_in_place_writes_through_views_match_stock(setup, tmp_path, request):
    """Writes torch sees but no buffer method makes: in place, through views of the
    stored columns (hindsight relabelling, reward or done rewriting). Torch counts
    them in each tensor's version counter, shared by its views."""
    flag = ("next", "done")

    def write(run):
        _in_place(run, flag, lambda done: done.view(-1)[4::10].fill_(True))
        run.sample()
        _in_place(run, flag, lambda done: done.__setitem__(slice(2, 9), True))
        run.sample()
        for key in (EPISODE_KEY, ("collector", "traj_ids")):
            _in_place(run, key, lambda ids: ids.copy_(ids.flip(0)))
        run.sample()
        _in_place(run, flag, lambda done: done.zero_())
        run.sample()
        rows = torch.arange(3, 30, 7)
        _in_place(run, flag, lambda done: done.index_put_((rows,), torch.tensor(True)))
        run.sample()
        for key in (EPISODE_KEY, ("collector", "traj_ids")):
            _in_place(run, key, lambda ids: torch.add(ids, 1, out=ids))
        run.sample()
        # the storage's own TensorDict, written into directly
        run.call(run.rb._storage._storage.get(flag).__setitem__, slice(0, 5), True)

    write_path_test(setup, 14, tmp_path, request, write)


@write_setups
def test_replaced_columns_match_stock(setup, tmp_path, request):
    """A column of the storage replaced by another tensor (not written in place)."""
    flag = ("next", "done")

    def write(run):
        data = run.rb._storage._storage
        done = data.get(flag)
        flipped = done.flip(0).clone()
        run.call(data.set, flag, flipped)
        run.sample()
        run.call(data.set, flag, done)

    write_path_test(setup, 15, tmp_path, request, write)


@write_setups
def test_state_dict_round_trip_matches_stock(setup, tmp_path, request):
    """load_state_dict() of a snapshot: into a fresh buffer, and into the same one after more writes."""

    def write(run):
        snapshot = copy.deepcopy(run.rb.state_dict())
        fresh = setup.build_buffer(tmp_path)
        restore_twice(run, fresh, lambda rb: rb.load_state_dict, snapshot)

    write_path_test(setup, 10, tmp_path, request, write)


@write_setups
def test_dumps_loads_matches_stock(setup, tmp_path, request):
    """rb.dumps(path) then loads(path): into a fresh buffer, and into the same one after more writes."""

    def write(run):
        path = new_scratch_dir(tmp_path)
        run.call(run.rb.dumps, path)
        fresh = setup.build_buffer(tmp_path)
        restore_twice(run, fresh, lambda rb: rb.loads, path)

    write_path_test(setup, 11, tmp_path, request, write)


def _pickle_round_trip(obj):
    return pickle.loads(pickle.dumps(obj))


@write_setups
def test_pickled_buffer_matches_stock(setup, tmp_path, request):
    """A buffer through pickle.dumps/loads samples and takes writes as the original would,
    and pickling leaves the original's index as it was.

    A memory-mapped copy writes into the original's files under a revision of its
    own: the original is sampled after the copy's writes only where the copy has
    memory of its own (see :func:`test_memmap_copy_writes_are_not_seen`).
    """
    reference.skip_where_stock_cannot_copy(_pickle_round_trip)
    require(setup, request)

    def scenario():
        run = Recording(setup, 12, tmp_path)
        run.fill_wrapped()
        run.sample()
        entry = run.rb._storage.__dict__.get("_trajectory_index")
        clone = _pickle_round_trip(run.rb)
        assert run.rb._storage.__dict__.get("_trajectory_index") is entry
        assert "_trajectory_index" not in clone._storage.__dict__
        run.sample(2)  # the original, after pickling: its index still serves
        run.sample(2, rb=clone)
        run.write(9, rb=clone)
        run.sample(rb=clone)
        if setup.storage != "memmap":
            run.write(5)
            run.sample(2)
        return run.records

    assert_same_as_stock(scenario, 12, fresh_stock=True)


def test_memmap_copy_writes_are_not_seen(tmp_path):
    """The one write path the index does not follow, as TorchRL's own boundary cache: a
    memory-mapped storage pickled outside torch.multiprocessing shares its files with
    its copy, whose writes move a revision of the copy's own. Stock recovers the
    boundaries from the files at every sample and sees them; the original's index does
    not.
    """
    setup = SliceSetup(sampler="SliceSampler", storage="memmap", keys="end_key")
    reference.skip_where_stock_cannot_copy(_pickle_round_trip)

    def scenario():
        run = Recording(setup, 12, tmp_path)
        run.fill_wrapped()
        run.sample()
        clone = _pickle_round_trip(run.rb)
        run.write(9, rb=clone)
        run.sample(4)
        return run.records

    stock = run_stock(scenario, 12)
    patched = run_patched(scenario, 12)
    with pytest.raises(AssertionError, match="values differ"):
        assert_identical(stock, patched)


@write_setups
def test_deepcopied_buffer_matches_stock(setup, tmp_path, request):
    """A copy.deepcopy of a buffer samples and takes writes independently of the original."""
    reference.skip_where_stock_cannot_copy(copy.deepcopy)

    def write(run):
        clone = copy.deepcopy(run.rb)
        run.sample(2, rb=clone)
        run.write(9, rb=clone)
        run.sample(rb=clone)
        run.write(5)

    write_path_test(setup, 13, tmp_path, request, write)


def test_rows_written_in_inference_mode_match_stock(tmp_path):
    """Tensors made under torch.inference_mode have no version counter: such a storage
    takes the stock recovery, and says so."""
    setup = SliceSetup(sampler="SliceSampler", storage="tensor", keys="end_key")

    def scenario():
        with torch.inference_mode():
            run = Recording(setup, 16, tmp_path)
            run.fill_wrapped()
            run.sample(2)
            run.write(7)
            run.sample(2)
        return run.records

    assert_same_as_stock(scenario, 16)
    with torch.inference_mode():
        run = Recording(setup, 16, tmp_path)
        run.write(20)
    reason = reference.fallback_reason(run.rb._sampler, run.rb._storage)
    assert reason is not None and "version counter" in reason


def _samples_around_a_failed_write():
    """A write that fails after moving the storage's cursor, then a sample."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    step = torch.arange(80)
    data = TensorDict({"obs": step, ("next", "done"): (step % 7 == 6).unsqueeze(-1)}, [80])
    sampler = SliceSampler(num_slices=4, end_key=("next", "done"))
    rb = ReplayBuffer(storage=LazyTensorStorage(60), sampler=sampler, batch_size=16)
    rb.extend(data[:70])
    torch.manual_seed(0)
    out = [rb.sample(return_info=True)]
    try:
        rb.storage.set(torch.tensor([30, 31]), data[:3])  # two rows, three given
    except Exception as err:
        out.append(type(err).__name__)
    out.append(int(torch.as_tensor(rb.storage._last_cursor).reshape(-1)[-1]))  # every release
    torch.manual_seed(1)
    out.append(rb.sample(return_info=True))
    return out


def test_a_failed_write_matches_stock():
    """A write that raises may already have moved the cursor (the end of the last
    trajectory of a full storage): the next sample reads it, as stock's does."""
    stock = run_stock(_samples_around_a_failed_write)
    assert isinstance(stock[1], str) and stock[2] == 31, stock[1:3]  # raised, cursor moved
    assert_identical(stock, run_patched(_samples_around_a_failed_write))


# The reads of a trajectory index a draw makes after the query that brings it up to
# date; each records which state of which index it finds, and yields to the other
# threads first (the draw is slow).
_INDEX_READS = ("count", "select", "boundaries", "stops_around", "changes_since")


def _alternating_episodes(start: int, rows: int) -> TensorDict:
    """``rows`` steps from ``start``: one episode, or as many one-step episodes, in turn.

    Written over a full storage, they add or remove many trajectories at once.
    """
    one_episode = (start // rows) % 2
    step = torch.arange(start, start + rows)
    done = torch.ones(rows, 1, dtype=torch.bool)
    if one_episode:
        done[:-1] = False
    episode = torch.full_like(step, start) if one_episode else step
    return TensorDict({"obs": step, EPISODE_KEY: episode, ("next", "done"): done}, [rows])


def draws_of_two_buffers(sampler, seconds: float, monkeypatch) -> tuple:
    """Two buffers over one storage for ``seconds``: one thread samples the first,
    another extends and samples the second (whose catch-ups rewrite the index).

    Every read of the index the sampling thread makes yields first, so that the other
    thread runs in the middle of its draws; the query that brings the index up to date
    records the state it leaves too.

    Args:
        sampler (callable): makes each buffer's sampler.
        seconds (float): how long the threads run.
        monkeypatch: pytest's, to instrument the index's reads.

    Returns:
        ``(errors, torn, draws)``: the exceptions either thread raised, the draws of
        the sampling thread that read more than one state of the index, and its draws.
    """
    import threading
    import time

    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    StorageTrajectoryIndex = reference.boundary_index_module("storage_index").StorageTrajectoryIndex
    TrajectoryIndex = reference.boundary_index_module("trajectory_index").TrajectoryIndex
    sampling = threading.local()  # the states the sampling thread's draw read

    def instrumented(read):
        def recorded(index, *args):
            seen = getattr(sampling, "seen", None)
            if seen is not None:
                time.sleep(0.0005)
                seen.add((id(index), index.revision))
            return read(index, *args)

        return recorded

    def query(entry, *args, stock_query=StorageTrajectoryIndex.index):
        index, _ = found = stock_query(entry, *args)
        seen = getattr(sampling, "seen", None)
        if seen is not None:
            seen.add((id(index), index.revision))
        return found

    for name in _INDEX_READS:
        monkeypatch.setattr(TrajectoryIndex, name, instrumented(getattr(TrajectoryIndex, name)))
    monkeypatch.setattr(StorageTrajectoryIndex, "index", query)
    storage = LazyTensorStorage(400)
    first, second = (
        TensorDictReplayBuffer(storage=storage, sampler=sampler(), batch_size=32) for _ in range(2)
    )
    second.extend(_alternating_episodes(0, 400))
    first.sample()
    errors, torn, draws, stop = [], [0], [0], time.monotonic() + seconds

    def sample_first():
        while time.monotonic() < stop:
            sampling.seen = set()
            try:
                first.sample()
            except Exception as err:  # noqa: BLE001 (counted)
                errors.append(err)
            torn[0] += len(sampling.seen) > 1
            draws[0] += 1

    def write_and_sample_second():
        start = 400
        while time.monotonic() < stop:
            try:
                second.extend(_alternating_episodes(start, 50))
                second.sample()
            except Exception as err:  # noqa: BLE001 (counted)
                errors.append(err)
            start += 50

    threads = [
        threading.Thread(target=body, daemon=True)
        for body in (sample_first, write_and_sample_second)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 60)  # a deadlock fails the test, not the run
    assert not any(thread.is_alive() for thread in threads), "a thread never finished"
    return errors, torn[0], draws[0]


class _SliceSamplerOwnSlices(SliceSampler):
    """Samples with stock code, which reads the index through ``_get_stop_and_length``."""

    def _sample_slices(self, *args, **kwargs):
        return super()._sample_slices(*args, **kwargs)


@pytest.mark.parametrize(
    "sampler",
    ["SliceSampler", "SliceSamplerWithoutReplacement", "_get_stop_and_length", PRIORITIZED_SAMPLER],
)
def test_two_buffers_on_one_storage_draw_from_one_state_of_the_index(sampler, monkeypatch, request):
    """A thread samples one buffer while another writes and samples a second buffer over
    the same storage: no draw raises, and none reads the index as the other thread's
    catch-up rewrites it (without the lock, most draws would; some raised IndexError)."""
    from torchrl.data.replay_buffers import samplers

    options = {"slice_len": 4, "traj_key": EPISODE_KEY, "strict_length": False}
    if sampler == PRIORITIZED_SAMPLER:
        request.getfixturevalue("torchrl_extension")
        make = functools.partial(
            samplers.PrioritizedSliceSampler, 400, alpha=0.7, beta=0.5, **options
        )
    elif sampler == "_get_stop_and_length":
        make = functools.partial(_SliceSamplerOwnSlices, **options)
    else:
        make = functools.partial(getattr(samplers, sampler), **options)
    errors, torn, draws = draws_of_two_buffers(make, 1.0, monkeypatch)
    assert draws > 20, "the sampling thread hardly ran"
    assert [repr(err) for err in errors] == []
    assert torn == 0, f"{torn} of {draws} draws read more than one state of the index"


def test_writes_between_two_samples_keep_no_more_than_the_journal():
    """What is kept of the writes between two queries is the storage's journal, whose
    size does not depend on the writes: after 40 writes of the whole storage it is the
    same tensor of the same size, the index kept nothing of them, and the next sample
    is stock's."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    def scenario():
        rb = ReplayBuffer(
            storage=LazyTensorStorage(1_000),
            sampler=SliceSampler(slice_len=4, traj_key=EPISODE_KEY),
            batch_size=32,
        )
        step = torch.arange(41_000)
        rows = TensorDict(
            {"obs": step, EPISODE_KEY: step // 10, ("next", "done"): (step % 10 == 9)[:, None]},
            [41_000],
        )
        rb.extend(rows[:1_000])
        samples = [rb.sample(return_info=True)]
        journal = vars(rb.storage).get("_write_journal")
        kept = [None if journal is None else (journal._rows.ctypes.data, journal._rows.nbytes)]
        for start in range(1_000, 41_000, 1_000):
            rb.extend(rows[start : start + 1_000])
            journal = vars(rb.storage).get("_write_journal")
            kept.append(None if journal is None else (journal._rows.ctypes.data, journal._rows.nbytes))
        index = vars(rb.storage).get("_trajectory_index")
        index_state = sorted(vars(index)) if index is not None else []
        samples.append(rb.sample(return_info=True))
        return samples, (kept, index_state)

    stock, _ = run_stock(scenario)
    patched, (kept, index_state) = run_patched(scenario)
    assert_identical(stock, patched)
    if reference.in_effect(FIX):
        assert len(kept) == 41 and len(set(kept)) == 1 and kept[0][1] < 40 * 1024, kept
        assert not {"_written", "_kept"} & set(index_state), index_state


def _lazily_stacked_samples():
    """Samples of an ndim=2 TensorStorage over a lazy stack of three lanes."""
    from tensordict import LazyStackedTensorDict
    from torchrl.data import ReplayBuffer, SliceSampler, TensorStorage

    step = torch.arange(60)
    lanes = [
        TensorDict({"obs": step + 100 * lane, "episode": step // (5 + lane) + 100 * lane}, [60])
        for lane in range(3)
    ]
    storage = TensorStorage(LazyStackedTensorDict.lazy_stack(lanes, dim=1), ndim=2)
    rb = ReplayBuffer(storage=storage, sampler=SliceSampler(num_slices=4, traj_key="episode"), batch_size=16)
    torch.manual_seed(0)
    return [rb.sample(return_info=True) for _ in range(3)], rb


def test_lazily_stacked_storage_matches_stock():
    """A lazy stack makes its columns anew at each read, so no version counter follows them:
    such a storage takes the stock recovery, and says so."""
    stock, _ = run_stock(_lazily_stacked_samples)
    patched, rb = run_patched(_lazily_stacked_samples)
    assert_identical(stock, patched)
    if reference.in_effect(FIX):
        reason = reference.fallback_reason(rb.sampler, rb.storage)
        assert reason == "boundary columns made anew at each read (a lazy stack)"


def test_ndim2_storage_setitem_matches_stock(tmp_path, request):
    """An ndim=2 storage written along time through storage[idx] = data, flipping end flags."""
    setup = SliceSetup(sampler="SliceSampler", storage="ndim2", keys="end_key", strict_length=False)

    def write(run):
        storage = run.rb._storage
        steps = slice(2, 6)
        rows = stored_rows(run.rb, steps)
        ends = torch.zeros(rows.shape, dtype=torch.bool)
        ends[:, 1] = True
        run.call(storage.__setitem__, steps, set_end_flags(rows, ends))
        run.sample()
        run.call(storage.set, torch.tensor([0, 1]), stored_rows(run.rb, torch.tensor([8, 9])))

    write_path_test(setup, 14, tmp_path, request, write)


# ---------------------------------------------------------------------------
# Edge cases of the boundaries themselves.
# ---------------------------------------------------------------------------

def _sampler_and_cache():
    """Each sampler with cache_values off and on; SliceSamplerWithoutReplacement always caches."""
    params = []
    for sampler, cache in itertools.product(SAMPLER_CLASSES, (False, True)):
        if sampler == "SliceSamplerWithoutReplacement" and cache:
            continue
        marks = [pytest.mark.torchrl_extension] if sampler == PRIORITIZED_SAMPLER else []
        label = sampler if sampler == "SliceSamplerWithoutReplacement" else f"{sampler}-cache={cache}"
        params.append(pytest.param(sampler, cache, id=label, marks=marks))
    return params


sampler_and_cache = pytest.mark.parametrize(("sampler", "cache"), _sampler_and_cache())


def edge_setup(sampler, cache, **fields) -> SliceSetup:
    """A setup of ``sampler`` taking 4 slices, with ``cache_values=True`` when ``cache``."""
    options = (("num_slices", 4),) + ((("cache_values", True),) if cache else ())
    return SliceSetup(sampler=sampler, options=options, **fields)


def through_fill_states(setup, seed, scratch, stream_options, final_rows=None):
    """A scenario writing half the capacity, then exactly full, then wrapped.

    After each write it records the boundaries and two samples. ``final_rows(stream,
    steps)`` chooses the size of the wrapping write (half the capacity by default).
    """

    def scenario():
        run = Recording(setup, seed, scratch, stream=setup.stream(seed, **stream_options))
        steps = setup.time_capacity
        for rows in (steps // 2, steps - steps // 2, None):
            if rows is None:
                rows = steps // 2 if final_rows is None else final_rows(run.stream, steps)
            run.write(rows)
            run.boundaries()
            run.sample(2)
        return run.records

    return scenario


@pytest.mark.parametrize("keys", ["traj_key", "end_key", "auto"])
@sampler_and_cache
def test_single_trajectory_without_end_flags(sampler, cache, keys, tmp_path, request):
    """One trajectory that never ends (no done flag anywhere), partial, full and wrapped."""
    setup = edge_setup(sampler, cache, keys=keys, strict_length=False)
    require(setup, request)
    no_end = {"min_episode_len": 10_000, "max_episode_len": 10_000}
    assert_same_as_stock(through_fill_states(setup, 21, tmp_path, no_end))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "loose"])
@sampler_and_cache
def test_every_row_an_episode_end(sampler, cache, strict, tmp_path, request):
    """Every row is done (one-step episodes); strict_length=True makes stock raise, and patched too."""
    setup = edge_setup(sampler, cache, keys="end_key", strict_length=strict)
    require(setup, request)
    one_step = {"max_episode_len": 1, "truncated_only_every": 0}
    assert_same_as_stock(through_fill_states(setup, 22, tmp_path, one_step))


@pytest.mark.parametrize("storage", ["tensor", "ndim2"])
@sampler_and_cache
def test_write_cursor_on_an_episode_end(sampler, cache, storage, tmp_path, request):
    """The ring wraps and the last row written ends an episode."""
    setup = edge_setup(sampler, cache, storage=storage, keys="traj_key", strict_length=False)
    require(setup, request)

    def to_an_end(stream, steps):
        return stream.rows_to_episode_end(steps // 2 + 3)

    assert_same_as_stock(through_fill_states(setup, 23, tmp_path, {}, to_an_end))


@pytest.mark.parametrize("keys", ["traj_key", "end_key"])
@sampler_and_cache
def test_episode_across_the_wrap_point(sampler, cache, keys, tmp_path, request):
    """An episode starts before the last storage row and goes on at row 0."""
    setup = edge_setup(sampler, cache, keys=keys, strict_length=True)
    require(setup, request)

    def scenario():
        run = Recording(setup, 24, tmp_path, stream=setup.stream(24, min_episode_len=6))
        steps = setup.time_capacity
        # Skip stream rows so that the last storage row falls inside an episode.
        run.stream.take(run.stream.rows_to_episode_middle(steps) - steps)
        run.write(steps - 5)
        run.write(5)
        run.boundaries()
        run.sample(2)
        run.write(2)
        run.boundaries()
        run.sample(2)
        return run.records

    assert_same_as_stock(scenario)


@sampler_and_cache
def test_buffer_with_its_own_generator(sampler, cache, tmp_path, request):
    """The buffer's own torch.Generator, seeded identically in both runs, drives the samples."""
    setup = edge_setup(sampler, cache, keys="end_key", generator_seed=1234)
    require(setup, request)

    def scenario():
        run = Recording(setup, 25, tmp_path)
        run.fill_wrapped()
        for _ in range(3):
            run.sample()
            torch.rand(3)  # other code drawing from the global generator between samples
            run.write(4)
        return run.records

    assert_same_as_stock(scenario)


# ---------------------------------------------------------------------------
# Done flags for ids: a sampler whose trajectory key is not named reads the
# ("next", "done") flags instead of the ids while both mark the same ends.
# ---------------------------------------------------------------------------

END_FLAGS = ("end", ("next", "done"))


def read_sources(rb, sources: list) -> None:
    """Appends what the last sample read its boundaries from (None on stock)."""
    sources.append(reference.boundary_source(rb._storage))


def patched_sources(scenario_factory, seed: int = 0, *, fresh_stock: bool = False) -> list:
    """Runs ``scenario_factory(sources)`` stock and patched, asserts them identical, and
    returns the sources the patched run read."""
    stock_sources, sources = [], []
    stock_scenario, patched_scenario = scenario_factory(stock_sources), scenario_factory(sources)

    def stock_run():
        if not fresh_stock:
            return stock_scenario()
        with stock_boundaries_from_scratch():
            return stock_scenario()

    assert_identical(run_stock(stock_run, seed), run_patched(patched_scenario, seed))
    assert stock_sources and not any(stock_sources)  # stock storages carry no index
    return sources


def unnamed_setups():
    params = []
    for sampler, storage in itertools.product(SAMPLER_CLASSES, STORAGE_KINDS):
        setup = SliceSetup(sampler=sampler, storage=storage, keys="unnamed", strict_length=False)
        marks = [pytest.mark.torchrl_extension] if setup.prioritized else []
        params.append(pytest.param(setup, id=f"{sampler}-{storage}", marks=marks))
    return params


@pytest.mark.parametrize("fill", FILL_STATES)
@pytest.mark.parametrize("setup", unnamed_setups())
def test_unnamed_key_reads_agreeing_end_flags(setup, fill, tmp_path, request):
    """Ids and done flags mark the same ends: the flags are read, and samples match stock."""
    require(setup, request)

    def interleaved_with_buffer(sources):
        def run():
            recording = Recording(setup, 31, tmp_path)
            steps = setup.time_capacity
            first = {"partial": [steps // 3], "full": [steps - 7, 7], "wrapped": [steps, 13]}[fill]
            for rows in first:
                recording.write(rows)
            for rows in (7, setup.single_write, steps // 2 + 3):
                recording.sample()
                read_sources(recording.rb, sources)
                recording.write(rows)
            recording.sample()
            read_sources(recording.rb, sources)
            return recording.records

        return run

    sources = patched_sources(interleaved_with_buffer, 31)
    assert sources == [END_FLAGS] * 4


def interleaved_collectors(stream_a, stream_b, rows: int) -> TensorDict:
    """``rows`` rows taken from two streams in turn, as two collectors writing one buffer."""
    a, b = stream_a.take(rows // 2), stream_b.take(rows - rows // 2)
    b = b.clone()
    for key in (EPISODE_KEY, ("collector", "traj_ids")):
        b[key] = b[key] + 1_000_000
    merged = torch.cat([a, b])
    order = torch.stack([torch.arange(rows // 2), torch.arange(rows // 2) + rows // 2], -1)
    order = torch.cat([order.reshape(-1), torch.arange(2 * (rows // 2), rows)])
    return merged[order]


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
@sampler_and_cache
def test_agreement_follows_the_writes(sampler, cache, storage, tmp_path, request, caplog):
    """Interleaved collectors break the agreement (ids read, logged once); rewriting
    every row with agreeing data brings the flags back."""
    setup = edge_setup(sampler, cache, storage=storage, keys="unnamed", strict_length=False)
    require(setup, request)

    def factory(sources):
        def run():
            recording = Recording(setup, 32, tmp_path)
            other = setup.stream(33)
            steps = setup.time_capacity
            recording.write(steps // 2)
            recording.sample()
            read_sources(recording.rb, sources)
            recording.call(recording.rb.extend, interleaved_collectors(recording.stream, other, 12))
            for _ in range(2):
                recording.sample()
                read_sources(recording.rb, sources)
            recording.write(steps + 5)  # every row rewritten by one collector
            recording.sample()
            read_sources(recording.rb, sources)
            return recording.records

        return run

    with caplog.at_level("INFO", logger=reference.INDEX_LOGGER):
        sources = patched_sources(factory, 32)
    assert sources[0] == sources[3] == END_FLAGS
    assert sources[1] == sources[2] and sources[1][0] == "trajectory"
    disagreement = [r for r in caplog.records if "mark different trajectory ends" in r.getMessage()]
    assert len(disagreement) == 1


@pytest.mark.parametrize("keys", ["traj_key", "end_key"])
def test_named_keys_are_read_as_named(keys, tmp_path):
    """With agreeing flags, a named traj_key still reads the ids, a named end_key the flags."""
    setup = SliceSetup(keys=keys)

    def factory(sources):
        def run():
            recording = Recording(setup, 34, tmp_path, stream=setup.stream(34, truncated_only_every=0))
            recording.write(setup.time_capacity // 2)
            recording.sample()
            read_sources(recording.rb, sources)
            return recording.records

        return run

    expected = ("trajectory", EPISODE_KEY) if keys == "traj_key" else END_FLAGS
    assert patched_sources(factory, 34) == [expected]


def test_loaded_storage_reads_end_flags_checked_at_its_first_sample(tmp_path):
    """Rows loaded with load_state_dict are checked at the first sample, as after a write."""
    setup = SliceSetup(keys="unnamed")

    def factory(sources):
        def run():
            source = Recording(setup, 35, tmp_path)
            source.write(setup.time_capacity - 3)
            recording = Recording(setup, 36, tmp_path)
            recording.call(recording.rb.load_state_dict, source.rb.state_dict())
            recording.sample()
            read_sources(recording.rb, sources)
            recording.call(recording.rb.empty)
            recording.write(setup.time_capacity // 2)
            recording.sample()
            read_sources(recording.rb, sources)
            return source.records + recording.records

        return run

    sources = patched_sources(factory, 35, fresh_stock=True)
    assert sources == [END_FLAGS, END_FLAGS]


# ---------------------------------------------------------------------------
# A writer in another process.
# ---------------------------------------------------------------------------

MULTIPROCESS_SETUPS = [
    SliceSetup(sampler="SliceSampler", storage="memmap", keys="traj_key"),
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="end_key", strict_length=False),
]
ROWS_FROM_THE_CHILD = 17


def newest_row(rb) -> int:
    """The number of the newest stream row the storage holds."""
    return int(rb._storage[:]["obs"][..., 0].max())


def multiprocess_scenario(tmp_path, apply_fixes_in_child: bool):
    """Shared buffers filled here, extended by a spawned child process, then sampled here.

    The memory-mapped storage shares its files, the tensor storage is moved to
    shared memory when the buffer is sent to the child. The child imports
    ``torchrl_fixes`` only with ``apply_fixes_in_child``.
    """

    def scenario():
        runs = [Recording(setup, 26, tmp_path, shared=True) for setup in MULTIPROCESS_SETUPS]
        for run in runs:
            run.fill_wrapped()
            run.sample()
        batches = [run.stream.take(ROWS_FROM_THE_CHILD) for run in runs]
        before = [newest_row(run.rb) for run in runs]
        context = torch.multiprocessing.get_context("spawn")
        child = context.Process(
            target=extend_in_child, args=([run.rb for run in runs], batches, apply_fixes_in_child)
        )
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
        after = [newest_row(run.rb) for run in runs]
        records = [("child exit code", child.exitcode), ("newest rows", before, after)]
        for run in runs:
            run.sample(3)
            run.write(5)
            run.sample()
            records.extend(run.records)
        return records

    return scenario


def test_multiprocess_writer_matches_stock(tmp_path):
    """A child process extends shared buffers (memmap, shared memory); the parent then samples.

    Two spawned children (one per run) take a few seconds each: select or
    deselect this test with ``-k multiprocess``.
    """
    stock = run_stock(multiprocess_scenario(tmp_path, apply_fixes_in_child=False), 26)
    patched = run_patched(multiprocess_scenario(tmp_path, apply_fixes_in_child=True), 26)
    assert stock[0] == ("child exit code", 0)
    _, before, after = stock[1]
    assert [b + ROWS_FROM_THE_CHILD for b in before] == after, "the parent did not see the child's rows"
    assert_identical(stock, patched)


def foreign_writes_scenario(ndim: int):
    """A spawned child extends a shared buffer at each request; the parent samples after each write.

    The child is handed the buffer and imports nothing itself. The buffer holds episodes
    of 50 steps (written as ``[4 envs, time]`` batches for ``ndim=2``, as a collector
    writes them) and wraps around during the writes. The scenario returns the records, and beside them
    whether the fix was applied in the child and each trajectory index the parent read.
    """

    def scenario():
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        steps = 1_000 if ndim == 1 else 250  # the time steps the storage holds
        step = torch.arange(2 * steps)
        if ndim == 2:
            step = step.expand(4, -1)
        lane = torch.zeros_like(step) if ndim == 1 else torch.arange(4)[:, None].expand_as(step)
        data = TensorDict(
            {"obs": step * 10 + lane, EPISODE_KEY: step // 50 + 1_000 * lane,
             ("next", "done"): (step % 50 == 49).unsqueeze(-1)},
            list(step.shape),
        )
        rb = ReplayBuffer(
            storage=LazyTensorStorage(1_000, ndim=ndim),
            sampler=SliceSampler(slice_len=8, traj_key=EPISODE_KEY, strict_length=False),
            batch_size=64,
        )
        written, batch = steps * 3 // 4, steps // 10
        rb.extend(data[..., :written])
        batches = [data[..., start : start + batch] for start in range(written, 2 * steps, batch)][:10]
        context = torch.multiprocessing.get_context("spawn")
        requests, lengths = context.Queue(), context.Queue()
        child = context.Process(target=write_on_request, args=(rb, batches, requests, lengths))
        child.start()
        try:
            applied = lengths.get(timeout=60)
            records, indexes = [record_sample(rb)], []
            for _ in batches:
                requests.put(True)
                records.append(("length", lengths.get(timeout=60)))
                records += [record_sample(rb) for _ in range(4)]
                index = vars(rb.storage).get("_trajectory_index")
                indexes.append(None if index is None else [i for i, _ in index._indexes.values()])
        finally:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
        return records, (applied, child.exitcode, indexes)

    return scenario


@pytest.mark.parametrize("ndim", [1, 2])
def test_foreign_writes_are_read_not_rebuilt(ndim):
    """A process handed a shared buffer writes into it 10 times; the parent samples 4
    times after each write. Every sample is stock's, the fix is applied in the child
    though it never imports ``torchrl_fixes`` (unpickling the storage's journal does),
    and the parent's index reads the child's rows instead of rebuilding: it is the same
    index after every write."""
    stock, (applied, exitcode, _) = run_stock(foreign_writes_scenario(ndim))
    assert (applied, exitcode) == (False, 0)
    patched, (applied, exitcode, indexes) = run_patched(foreign_writes_scenario(ndim))
    assert exitcode == 0
    assert [record[0] for record in patched].count("sample") == 41
    assert_identical(stock, patched)
    if reference.in_effect(FIX):
        assert applied or reference.UPSTREAM, "the child was handed the buffer but runs stock code"
        first = indexes[0]
        assert first and all(
            len(index) == len(first) and all(a is b for a, b in zip(index, first)) for index in indexes
        ), "the index was rebuilt after a write of the child"


def _collector(make_env, replay_buffer, frames: int):
    """TorchRL's asynchronous collector of two processes writing into ``replay_buffer``."""
    collectors = pytest.importorskip("torchrl.collectors")
    options = {"replay_buffer": replay_buffer, "frames_per_batch": 100, "total_frames": frames}
    if hasattr(collectors, "Collector") and "num_collectors" in inspect.signature(collectors.Collector).parameters:
        return collectors.Collector(make_env, policy=None, num_collectors=2, sync=False, **options)
    # named MultiAsyncCollector from 0.12 on, MultiaSyncDataCollector before
    multi = getattr(collectors, "MultiAsyncCollector", None) or collectors.MultiaSyncDataCollector
    inits = [vars(cls)["__init__"] for cls in multi.__mro__ if "__init__" in vars(cls)]
    if not any("replay_buffer" in inspect.signature(init).parameters for init in inits):
        pytest.skip("this TorchRL's collectors take no replay buffer")
    return multi([make_env] * 2, policy=None, **options)


@pytest.mark.filterwarnings("ignore:A SliceSampler is used with a multi-process collector")
def test_collector_processes_write_while_the_trainer_samples():
    """TorchRL's asynchronous collector, two processes, writes into a shared buffer that
    the main process samples after each batch, from its index and, with the same seed,
    from a twin sampler on stock's whole-storage recovery (``boundary_index=False``).
    Where no write came between the two, the samples are equal."""
    if not reference.in_effect(FIX):
        pytest.skip("compares the index with stock's recovery: needs the fix")
    mocking = pytest.importorskip("torchrl.testing.mocking_classes")
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    options = {"slice_len": 4, "traj_key": ("collector", "traj_ids"), "strict_length": False}
    rb = ReplayBuffer(
        storage=LazyTensorStorage(4_000), sampler=SliceSampler(**options), batch_size=32, shared=True
    )
    twin = SliceSampler(**options, boundary_index=False)
    collector = _collector(functools.partial(mocking.CountingEnv, max_steps=20), rb, 6_000)
    compared = 0
    try:
        for step, _ in enumerate(collector):
            if len(rb) < 64:
                continue
            revision = rb.storage._mutation_revision
            torch.manual_seed(step)
            drawn = rb.sampler.sample(rb.storage, 32)
            torch.manual_seed(step)
            expected = twin.sample(rb.storage, 32)
            if rb.storage._mutation_revision != revision:
                continue  # a worker wrote between the two
            compared += 1
            assert_identical(expected, drawn, f"sample {step}")
    finally:
        collector.shutdown()
    assert len(rb) == 4_000, "the collector did not fill the buffer"
    assert compared >= 20, f"only {compared} samples came without a write in between"


def _unseen_write_scenario(tell: str | None, sampler_class: str = "SliceSampler", **sampler_kwargs):
    """Samples, writes episode ids through ``.data`` (no version moves), samples again.

    ``tell="mark_update"`` then calls ``storage.mark_update`` on those rows where the
    storage has it (with the fix).
    """

    def scenario():
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers import samplers

        step = torch.arange(200)
        make = getattr(samplers, sampler_class)
        extra = {"max_capacity": 200, "alpha": 0.7, "beta": 0.5} if sampler_class == PRIORITIZED_SAMPLER else {}
        rb = ReplayBuffer(
            storage=LazyTensorStorage(200),
            sampler=make(slice_len=4, traj_key=EPISODE_KEY, **extra, **sampler_kwargs),
            batch_size=32,
        )
        rb.extend(TensorDict({"obs": step, EPISODE_KEY: step // 20}, [200]))
        records = [record_sample(rb)]
        rb.storage._storage[EPISODE_KEY].data[100:] = 100 + torch.arange(100) // 7
        if tell == "mark_update" and hasattr(rb.storage, "mark_update"):
            rb.storage.mark_update(torch.arange(100, 200))
        records += [record_sample(rb) for _ in range(3)]
        return records

    return scenario


def test_mark_update_tells_the_index_of_writes_torch_does_not_count():
    """A write through ``.data`` moves no version counter: stock's recovery sees it, the
    index does not, until ``storage.mark_update(rows)`` tells it; then every sample is
    stock's again."""
    stock = run_stock(_unseen_write_scenario(None))
    assert_identical(stock, run_patched(_unseen_write_scenario("mark_update")))
    if reference.in_effect(FIX):
        with pytest.raises(AssertionError):
            assert_identical(stock, run_patched(_unseen_write_scenario(None)))


@pytest.mark.parametrize("sampler", SAMPLER_CLASSES)
def test_boundary_index_false_keeps_stock_recovery(sampler, request):
    """``boundary_index=False`` gives one sampler stock's whole-storage recovery at every
    sample: it sees the write through ``.data`` with no ``mark_update``, as stock does."""
    if sampler == PRIORITIZED_SAMPLER:
        request.getfixturevalue("torchrl_extension")
    if not reference.in_effect(FIX):
        pytest.skip("boundary_index is an argument of the fix")
    stock = run_stock(_unseen_write_scenario(None, sampler))
    assert_identical(stock, run_patched(_unseen_write_scenario(None, sampler, boundary_index=False)))


def test_boundary_index_takes_a_bool():
    if not reference.in_effect(FIX):
        pytest.skip("boundary_index is an argument of the fix")
    with pytest.raises(TypeError, match="boundary_index must be True or False, got 'no'"):
        SliceSampler(slice_len=4, boundary_index="no")


def _sample_and_exit(rb) -> None:
    rb.sample()


def test_a_fork_child_samples_while_a_parent_thread_holds_the_index():
    """A ``fork`` child inherits the storage's index with its lock held by a thread of the
    parent that it does not inherit: the child makes an index of its own and samples."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    step = torch.arange(200)
    rb = ReplayBuffer(
        storage=LazyTensorStorage(200), sampler=SliceSampler(slice_len=4, traj_key=EPISODE_KEY), batch_size=16
    )
    rb.extend(TensorDict({"obs": step, EPISODE_KEY: step // 20}, [200]))
    rb.sample()
    index = vars(rb.storage).get("_trajectory_index")
    if index is None:
        pytest.skip("no index: the fix is not in effect")
    held, release = threading.Event(), threading.Event()

    def hold():
        with index._lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(60)
        child = torch.multiprocessing.get_context("fork").Process(target=_sample_and_exit, args=(rb,))
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
    finally:
        release.set()
        holder.join(60)
    assert child.exitcode == 0, "the fork child hung or failed on the index its parent held"
