"""Unit tests of the slice_boundary_index fix's wiring (the index itself: upstream/test/rb/test_trajectory_boundaries.py)."""
from __future__ import annotations

import copy
import functools
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl_fixes
from torchrl_fixes.fixes.slice_boundary_index import (
    _backports_mutation_revision,
    boundary_cache,
    fallback_reason,
    slice_boundaries,
)
from torchrl_fixes.fixes.slice_boundary_index import storage_boundaries as sbi

pytestmark = pytest.mark.skipif(
    not torchrl_fixes.status()["slice_boundary_index"].applied,
    reason="slice_boundary_index is not applied on this TorchRL",
)


@pytest.mark.parametrize(
    "cursor, rows",
    [
        (3, [3]),
        (-1, [9]),
        (np.int64(4), [4]),
        (slice(2, 5), [2, 3, 4]),
        (range(8, 12), [8, 9, 0, 1]),
        ([1, 2], [1, 2]),
        (torch.tensor([9, 10, 11]), [9, 0, 1]),
        (np.array([5, 6]), [5, 6]),
        (torch.tensor([True, False, True]), [0, 2]),
    ],
)
def test_written_rows(cursor, rows):
    assert sbi._written_rows(cursor, 10).tolist() == rows


@pytest.mark.parametrize(
    "cursor", [(slice(None), 1), torch.zeros(2, 2, dtype=torch.long), torch.tensor([0.5]), "a"]
)
def test_unknown_write_cursor_means_rebuild(cursor):
    assert sbi._written_rows(cursor, 10) is None


@pytest.mark.parametrize(
    "cursor, expected",
    [(None, None), (3, 3), (-1, 9), (range(2, 5), 4), (torch.tensor([1, 7]), 7), (np.int32(2), 2)],
)
def test_resolve_cursor(cursor, expected):
    assert sbi._resolve_cursor(cursor, 10) == expected


@pytest.mark.parametrize("cursor", [10, -11, np.array([1]), torch.tensor(3), True, range(0)])
def test_unusable_cursor_leaves_it_to_stock(cursor):
    with pytest.raises(sbi._Unsupported):
        sbi._resolve_cursor(cursor, 10)


def _storage(storage=None, *, rows=6):
    """``rows`` rows of 3-step episodes (ids and done flags) in ``storage`` (a new 10-row one)."""
    from torchrl.data import LazyTensorStorage

    storage = LazyTensorStorage(10) if storage is None else storage
    step = torch.arange(rows)
    storage.set(
        step,
        TensorDict({"episode": step // 3, ("next", "done"): (step % 3 == 2).unsqueeze(-1)}, [rows]),
    )
    return storage


def test_a_copy_starts_with_no_boundaries_and_is_marked():
    from torchrl.data import SliceSampler

    storage = _storage()
    SliceSampler(slice_len=2, traj_key="episode")._get_stop_and_length(storage)
    assert boundary_cache._storage_boundaries(storage).indexes
    assert sbi._COPIED_ATTR not in storage.__dict__
    for clone in (pickle.loads(pickle.dumps(storage)), copy.deepcopy(storage)):
        # the boundary cache is local to the process: a copy rebuilds
        assert boundary_cache._storage_boundaries(clone).indexes == {}
        assert clone.__dict__[sbi._COPIED_ATTR]
    # a memmap copy would write the same files under a revision of its own
    assert storage.__dict__[sbi._COPIED_ATTR]


@pytest.mark.skipif(not _backports_mutation_revision(), reason="TorchRL counts its storages' mutations")
def test_backported_write_count_is_shared_and_kept_by_pickling():
    from torchrl_fixes.fixes.slice_boundary_index import mutation_revision

    storage = _storage()
    count = storage.__dict__[mutation_revision._COUNT_ATTR]
    assert count.slots.is_shared() and not count.late
    assert storage._mutation_revision == 1
    clone = pickle.loads(pickle.dumps(storage))
    cloned = clone.__dict__[mutation_revision._COUNT_ATTR]
    assert cloned.slots.is_shared() and torch.equal(cloned.slots, count.slots)
    storage._empty()
    assert storage._mutation_revision == 2


def test_a_write_moves_the_entry_to_the_new_revision():
    storage = _storage()
    entry = boundary_cache._storage_boundaries(storage)
    entry["cached at this revision"] = "stale after the write"
    revision = storage._mutation_revision
    storage.set(torch.arange(6, 8), TensorDict({"episode": torch.tensor([2, 2])}, [2]))
    assert storage._mutation_revision == revision + 1 == entry.revision
    assert boundary_cache._REPLAY_BOUNDARY_CACHE[storage] == (revision + 1, entry)
    assert boundary_cache._storage_boundaries(storage) is entry
    assert dict(entry) == {}


def test_an_entry_keeps_what_was_cached_at_its_revision():
    """A storage's plain cache entry becomes its StorageBoundaries with what it held."""
    storage = _storage()
    revision = storage._mutation_revision
    boundary_cache._REPLAY_BOUNDARY_CACHE[storage] = (revision, {"key": "value"})
    entry = boundary_cache._storage_boundaries(storage)
    assert isinstance(entry, sbi.StorageBoundaries) and dict(entry) == {"key": "value"}
    assert boundary_cache._REPLAY_BOUNDARY_CACHE[storage] == (revision, entry)


def test_writes_are_recorded_in_the_index_not_read():
    from torchrl.data import SliceSampler

    storage = _storage()
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    sampler._get_stop_and_length(storage)
    (index,) = boundary_cache._storage_boundaries(storage).indexes.values()
    assert index.built and index._pending == []
    storage.set(torch.arange(6, 8), TensorDict({"episode": torch.tensor([2, 2])}, [2]))
    assert [p.tolist() for p in index._pending] == [[6, 7]]
    storage._empty()  # a mutation that records no rows
    boundary_cache._storage_boundaries(storage)
    assert not index.built


@pytest.mark.parametrize(
    "sampler_kwargs, reason",
    [
        ({"traj_key": "episode"}, None),
        ({"end_key": ("next", "done")}, None),
        ({"traj_key": "missing"}, "trajectory key 'missing' not in the storage"),
        ({"traj_key": "episode", "compile": True}, "compile=True"),
        ({"traj_key": "episode", "use_gpu": "cpu"}, None),
        ({"end_key": ("next", "done"), "use_gpu": torch.device("cpu")}, None),
        ({"traj_key": "episode", "use_gpu": True}, None),
    ],
)
def test_fallback_reason(sampler_kwargs, reason):
    from torchrl.data import SliceSampler

    sampler = SliceSampler(slice_len=2, **sampler_kwargs)
    assert fallback_reason(sampler, _storage()) == reason


def _fallback_examples() -> dict:
    """One sampler and storage of each configuration of ``slice_boundaries.FALLBACKS``."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage, SliceSampler

    class OwnRecovery(SliceSampler):
        def _find_start_stop_traj(self, *args, **kwargs):
            return super()._find_start_stop_traj(*args, **kwargs)

    def sampler(**kwargs):
        return SliceSampler(slice_len=2, **{"traj_key": "episode", **kwargs})

    three_dims = LazyTensorStorage(20, ndim=3)
    three_dims.set(torch.arange(4), TensorDict({"episode": torch.zeros(4, 2, 2)}, [4, 2, 2]))
    float_ends = LazyTensorStorage(10)
    float_ends.set(torch.arange(4), TensorDict({("next", "done"): torch.zeros(4, 1)}, [4]))
    copied = _storage(LazyMemmapStorage(20))
    copied.__getstate__()  # what pickling it takes
    fragmented = sampler()
    fragmented.fragmented = True  # a constructor argument from TorchRL 0.14 on
    ends = torch.tensor([False, False, True] * 2)
    return {
        "storages other than TensorStorage over a TensorDict, ndim > 2": [
            (sampler(), ListStorage(10)),
            (sampler(), three_dims),
        ],
        "fragmented=True": [(fragmented, _storage())],
        "compile=True": [(sampler(compile=True), _storage())],
        "a use_gpu device this machine cannot use (which raises, as before)": [
            (sampler(use_gpu=f"cuda:{torch.cuda.device_count()}"), _storage())
        ],
        "static ends/trajectories": [
            (SliceSampler(slice_len=2, cache_values=True, ends=ends), _storage())
        ],
        "samplers that override the boundary recovery": [
            (OwnRecovery(slice_len=2, traj_key="episode"), _storage())
        ],
        "boundary columns the whole-storage recovery would reject or squeeze or that lie "
        "on different devices": [
            (SliceSampler(slice_len=2, end_key=("next", "done")), float_ends)
        ],
        "fewer than 2 rows": [(sampler(), _storage(rows=1))],
        "memmap storages pickled or copied outside torch.multiprocessing": [(sampler(), copied)],
    }


def test_every_declared_fallback_is_a_checked_one():
    """``FALLBACKS`` (what status() and the README list) names exactly the configurations
    ``fallback_reason`` finds: an example of each gets a reason, and a plain one none."""
    examples = _fallback_examples()
    assert tuple(examples) == slice_boundaries.FALLBACKS
    for configuration, cases in examples.items():
        for sampler, storage in cases:
            assert fallback_reason(sampler, storage) is not None, configuration
    from torchrl.data import SliceSampler

    assert fallback_reason(SliceSampler(slice_len=2, traj_key="episode"), _storage()) is None


def test_a_use_gpu_device_that_cannot_be_used_is_left_to_stock():
    from torchrl.data import SliceSampler

    device = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or no CUDA at all
    sampler = SliceSampler(slice_len=2, traj_key="episode", use_gpu=device)
    reason = fallback_reason(sampler, _storage())
    assert reason is not None and reason.startswith(f"use_gpu device {device} cannot be used (")


def test_non_boolean_end_flags_are_left_to_stock():
    from torchrl.data import LazyTensorStorage, SliceSampler

    storage = LazyTensorStorage(10)
    storage.set(torch.arange(4), TensorDict({("next", "done"): torch.zeros(4, 1)}, [4]))
    sampler = SliceSampler(slice_len=2, end_key=("next", "done"))
    assert fallback_reason(sampler, storage) == "end flags that are not booleans"


def _read_by_a_slice_sampler(storage):
    """The storage's entry after a slice sampler that names no key has read it."""
    from torchrl.data import SliceSampler

    SliceSampler(slice_len=2).sample(storage, 2)
    return boundary_cache._storage_boundaries(storage)


def test_a_storage_no_slice_sampler_has_read_records_no_write():
    """Writes cost nothing for the index until a slice sampler reads the storage."""
    storage = _storage()
    storage.set(torch.arange(6, 8), storage[torch.arange(2)])
    cached = boundary_cache._REPLAY_BOUNDARY_CACHE.get(storage)
    assert cached is None or not isinstance(cached[1], sbi.StorageBoundaries)
    boundaries = _read_by_a_slice_sampler(storage)
    (index,) = boundaries.indexes.values()
    assert index.built and index.pending_rows == 0
    storage.set(torch.arange(8, 10), storage[torch.arange(2)])
    assert index.pending_rows == 2


def test_agreement_is_followed_for_the_id_keys_beside_done_flags():
    from torchrl.data import LazyTensorStorage

    assert list(_read_by_a_slice_sampler(_storage()).agreements) == ["episode"]
    ids_only = LazyTensorStorage(10)
    ids_only.set(torch.arange(4), TensorDict({"episode": torch.zeros(4)}, [4]))
    assert _read_by_a_slice_sampler(ids_only).agreements == {}
    collector = LazyTensorStorage(10)
    collector.set(
        torch.arange(4),
        TensorDict(
            {("collector", "traj_ids"): torch.zeros(4), ("next", "done"): torch.zeros(4, 1, dtype=torch.bool)},
            [4],
        ),
    )
    assert list(_read_by_a_slice_sampler(collector).agreements) == [("collector", "traj_ids")]


@pytest.mark.parametrize("batch, pending", [(1 << 16, 2), (2, 0)])
def test_written_rows_are_checked_in_batches(batch, pending, monkeypatch):
    monkeypatch.setattr(sbi, "_AGREEMENT_BATCH", batch)
    storage = _storage()
    agreement = _read_by_a_slice_sampler(storage).agreements["episode"]
    assert agreement.disagreements.built and agreement.disagreements.pending_rows == 0
    storage.set(
        torch.arange(6, 8),
        TensorDict({"episode": torch.tensor([2, 2]), ("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, [2]),
    )
    assert agreement.disagreements.pending_rows == pending


def test_samplers_remember_whether_their_trajectory_key_was_named():
    import inspect

    from torchrl.data import SliceSampler, SliceSamplerWithoutReplacement

    assert SliceSampler(slice_len=2, traj_key="episode").__dict__[slice_boundaries._TRAJ_KEY_NAMED]
    assert not SliceSampler(slice_len=2).__dict__[slice_boundaries._TRAJ_KEY_NAMED]
    assert not SliceSamplerWithoutReplacement(slice_len=2).__dict__[slice_boundaries._TRAJ_KEY_NAMED]
    assert "traj_key" in inspect.signature(SliceSampler.__init__).parameters


@pytest.mark.parametrize("first_reader", ["named", "unnamed"])
def test_agreement_is_dropped_when_only_named_keys_read_the_storage(first_reader):
    from torchrl.data import SliceSampler

    storage = _storage()
    state = boundary_cache._storage_boundaries(storage)
    named, unnamed = SliceSampler(slice_len=2, traj_key="episode"), SliceSampler(slice_len=2)
    readers = [named, unnamed] if first_reader == "named" else [unnamed, named]
    for sampler in readers:
        sampler._get_stop_and_length(storage)
    if first_reader == "named":
        assert state.agreements == {}
        assert slice_boundaries.boundary_source(storage) == ("trajectory", "episode")
    else:
        assert list(state.agreements) == ["episode"]
        unnamed._get_stop_and_length(storage)
        assert slice_boundaries.boundary_source(storage) == ("end", ("next", "done"))


@pytest.mark.skipif(not _backports_mutation_revision(), reason="TorchRL counts its storages' mutations")
def test_before_torchrl_014_a_storage_with_a_write_path_of_its_own_is_rebuilt_at_every_read():
    from torchrl.data import LazyTensorStorage, SliceSampler

    from torchrl_fixes.fixes.slice_boundary_index import mutation_revision

    class Writing(LazyTensorStorage):
        def set(self, cursor, data, *, set_cursor=True):
            return super().set(cursor, data, set_cursor=set_cursor)

    assert mutation_revision._uncounted_write_path(LazyTensorStorage) is None
    assert mutation_revision._uncounted_write_path(Writing) == "Writing.set"
    storage = Writing(10)
    storage.set(torch.arange(2), TensorDict({"episode": torch.zeros(2)}, [2]))
    assert storage._mutation_revision != storage._mutation_revision
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    assert "Writing.set" in fallback_reason(sampler, storage)


@pytest.mark.skipif(not _backports_mutation_revision(), reason="TorchRL has _last_cursor_index")
def test_before_torchrl_014_the_last_cursor_is_read_under_its_014_name():
    storage = _storage()
    storage.set(torch.arange(3, 5), storage[torch.arange(2)])
    assert storage._last_cursor_index is storage._last_cursor


def test_each_hook_runs_in_the_module_that_defines_what_it_calls():
    from torchrl_fixes.fixes.slice_boundary_index import (
        INLINE_HOOKS,
        SAMPLE_HOOKS,
        hook_module,
    )

    modules = {
        qualname: hook_module((*before, *after)).__name__.rpartition(".")[2]
        for (_, qualname), (before, after) in {
            **INLINE_HOOKS, **SAMPLE_HOOKS
        }.items()
        if before or after
    }
    assert modules["SliceSampler.sample"] == "slice_sampling"
    assert modules["TensorStorage.set"] == "boundary_cache"
    assert modules["Storage.__getstate__"] == "storage_boundaries"
    assert modules["SliceSampler._get_stop_and_length"] == "slice_boundaries"


def test_before_torchrl_014_the_revision_moves_before_the_write_is_recorded(monkeypatch):
    from torchrl_fixes.fixes import slice_boundary_index as fix

    monkeypatch.setattr(fix, "_backports_mutation_revision", lambda: True)
    before, after = fix._hooks()[("storages/tensor.py", "TensorStorage.set")]
    assert before == ("revision = _revision_before_write(self)",)
    assert after == ("self._bump_mutation_revision()", "_record_write(self, cursor, revision)")
    assert ("storages/tensor.py", "TensorStorage._empty") in fix._hooks()
    monkeypatch.setattr(fix, "_backports_mutation_revision", lambda: False)
    assert fix._hooks() == {**fix.INLINE_HOOKS, **fix.SAMPLE_HOOKS}


def _episodes_buffer(sampler, episodes=40, length=10):
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    step = torch.arange(episodes * length)
    rb = ReplayBuffer(storage=LazyTensorStorage(episodes * length * 2), sampler=sampler, batch_size=12)
    rb.extend(TensorDict({"episode": step // length, "obs": step.float()}, [step.numel()]))
    return rb


@pytest.mark.parametrize("strict_length", [True, False])
def test_a_slice_sample_lists_no_trajectory(strict_length, monkeypatch):
    """After the first sample, writes and samples never list every trajectory."""
    from torchrl.data import SliceSampler

    from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import TrajectoryOrder

    # one short trajectory, so that strict_length drops it and the draw counts by length
    rb = _episodes_buffer(SliceSampler(slice_len=4, traj_key="episode", strict_length=strict_length))
    rb.extend(TensorDict({"episode": torch.full((2,), 99), "obs": torch.zeros(2)}, [2]))
    rb.sample()

    def listing(self):
        raise AssertionError("every trajectory listed")

    monkeypatch.setattr(TrajectoryOrder, "materialize", listing)
    for episode in range(100, 105):
        rb.extend(TensorDict({"episode": torch.full((7,), episode), "obs": torch.zeros(7)}, [7]))
        # (a sample shorter than the batch, where TorchRL returns one, is stock's too)
        assert 0 < rb.sample().numel() <= 12


def test_a_sampler_overriding_how_it_samples_slices_lists_them(monkeypatch):
    """A subclass that overrides _sample_slices gets every trajectory, as from stock code."""
    from torchrl.data import SliceSampler

    seen = []

    class Listing(SliceSampler):
        def _sample_slices(self, lengths, *args, **kwargs):
            seen.append(lengths.numel())
            return super()._sample_slices(lengths, *args, **kwargs)

    rb = _episodes_buffer(Listing(slice_len=4, traj_key="episode"))
    rb.sample()
    assert seen == [40]
    stock = SliceSampler._sample_slices

    @functools.wraps(stock)  # SliceSampler's own method, to the index
    def spy(self, lengths, *args, **kwargs):
        seen.append(lengths.numel())
        return stock(self, lengths, *args, **kwargs)

    monkeypatch.setattr(SliceSampler, "_sample_slices", spy)
    # span: TorchRL's general path, which gets only the drawn trajectories
    rb = _episodes_buffer(SliceSampler(slice_len=4, traj_key="episode", span=True))
    rb.sample()
    assert seen[-1] == 3


def test_slices_of_one_length_skip_torchrls_general_path(monkeypatch):
    """Slices of the sampler's length inside their trajectories on the CPU: the
    index is built from the drawn rows (TorchRL 0.14 on), _sample_slices never runs."""
    from torchrl.data import SliceSampler

    from torchrl_fixes.fixes.slice_boundary_index import slice_sampling

    if slice_sampling._classes_index_reason(SliceSampler) is not None:
        pytest.skip(slice_sampling._classes_index_reason(SliceSampler))
    built = []
    fixed_length_index = slice_sampling._fixed_length_index

    def counting(*args, **kwargs):
        built.append(args[3].size)
        return fixed_length_index(*args, **kwargs)

    @functools.wraps(SliceSampler._sample_slices)  # SliceSampler's own method, to the index
    def general(self, *args, **kwargs):
        raise AssertionError("TorchRL's general path ran")

    monkeypatch.setattr(slice_sampling, "_fixed_length_index", counting)
    monkeypatch.setattr(SliceSampler, "_sample_slices", general)
    rb = _episodes_buffer(SliceSampler(slice_len=4, traj_key="episode"))
    assert rb.sample().numel() == 12
    assert built == [3]


@pytest.mark.parametrize("seq_length", [1, 4, 64])
def test_relative_starts_are_get_indexs_float32_arithmetic(seq_length):
    """The slices' starts in their trajectories, computed in numpy, are the ones
    ``_get_index`` computes in torch from the same draws, up to lengths of 2**31
    rows (float32 rounds the room there, the same way on both sides)."""
    from torchrl_fixes.fixes.slice_boundary_index.slice_sampling import _relative_starts

    generator = torch.Generator().manual_seed(seq_length)
    lengths = torch.cat(
        [
            torch.randint(seq_length, 1 << 12, (4096,), generator=generator),
            torch.randint(1 << 24, 1 << 31, (4096,), generator=generator),
            torch.tensor([seq_length, (1 << 24) + 1, (1 << 24) + 3, (1 << 31) - 1]),
        ]
    )
    uniform = torch.rand(lengths.numel(), generator=generator)
    uniform[:3] = torch.tensor([0.0, 1.0 - 2**-24, 0.5])
    stock = (uniform * (lengths - seq_length + 1)).floor().to(torch.int64)
    ours = torch.from_numpy(_relative_starts(uniform.numpy(), lengths.numpy(), seq_length))
    assert torch.equal(ours, stock)


def _sample_pair(storage, stock_storage, sampler, stock_sampler, seed):
    """Patched and stock samples of the same storage contents, from the same seed."""
    torch.manual_seed(seed)
    index, _ = sampler.sample(storage, 8)
    torch.manual_seed(seed)
    stock_index, _ = stock_sampler.sample(stock_storage, 8)
    return index, stock_index


def test_a_plan_holds_until_the_storage_changes_otherwise_than_by_recorded_writes():
    from torchrl.data import LazyTensorStorage, SliceSampler

    from torchrl_fixes.fixes.slice_boundary_index.boundary_cache import _REPLAY_BOUNDARY_CACHE

    def rows(start, n):
        step = torch.arange(start, start + n)
        done = (step % 3 == 2).unsqueeze(-1)
        return TensorDict({"episode": step // 3, ("next", "done"): done}, [n])

    with torchrl_fixes.disabled():
        stock_storage = LazyTensorStorage(40)
        stock_sampler = SliceSampler(slice_len=2, end_key=("next", "done"))
    storage, sampler = LazyTensorStorage(40), SliceSampler(slice_len=2, end_key=("next", "done"))
    written = 0

    def write(n):
        nonlocal written
        for target in (storage, stock_storage):
            target.set(torch.arange(written, written + n), rows(written, n))
        written += n

    def same_samples(seed):
        index, stock_index = _sample_pair(storage, stock_storage, sampler, stock_sampler, seed)
        return all(torch.equal(a, b) for a, b in zip(index, stock_index))

    write(9)
    assert same_samples(0)
    plan = slice_boundaries._current_plan(sampler, storage)
    assert plan is not None and plan.geometry["length"] == 9
    assert same_samples(1)
    assert slice_boundaries._current_plan(sampler, storage) is plan
    # a recorded write: the same plan, with the geometry read again
    write(6)
    assert slice_boundaries._current_plan(sampler, storage) is plan
    assert plan.geometry["length"] == 15
    assert same_samples(2)
    # a mutation that records no rows: a new plan
    storage._bump_mutation_revision()
    assert slice_boundaries._current_plan(sampler, storage) is None
    assert same_samples(3)
    plan = slice_boundaries._current_plan(sampler, storage)
    assert plan is not None
    # the storage's entry replaced by a plain one (as _ReplayBoundaryIndex files a new
    # revision's): the writes after it go to a new entry, not the plan's
    _REPLAY_BOUNDARY_CACHE[storage] = (storage._mutation_revision, {})
    write(6)
    assert slice_boundaries._current_plan(sampler, storage) is None
    assert same_samples(4)
    # another key read: a new plan
    sampler.end_key = stock_sampler.end_key = "done_elsewhere"
    sampler.traj_key = stock_sampler.traj_key = "episode"
    sampler._fetch_traj = stock_sampler._fetch_traj = True
    assert slice_boundaries._current_plan(sampler, storage) is None
    assert same_samples(5)
    assert slice_boundaries.boundary_source(storage) == ("trajectory", "episode")


def test_a_plan_does_not_keep_its_storage_alive():
    import gc
    import weakref

    from torchrl.data import SliceSampler

    storage = _storage()
    sampler = SliceSampler(slice_len=2, traj_key="episode")
    sampler.sample(storage, 4)
    assert slice_boundaries._current_plan(sampler, storage) is not None
    alive = weakref.ref(storage)
    del storage
    gc.collect()
    assert alive() is None
    assert slice_boundaries._LAST_PLANS[sampler]() is None


def test_a_plan_that_checked_the_end_flags_for_ids_is_made_again_after_a_write():
    from torchrl.data import SliceSampler

    storage = _storage()
    sampler = SliceSampler(slice_len=2)  # names no key: the done flags may stand in for the ids
    sampler.sample(storage, 4)
    assert slice_boundaries.boundary_source(storage) == ("end", ("next", "done"))
    assert slice_boundaries._current_plan(sampler, storage) is not None
    step = torch.arange(6, 8)
    done = torch.zeros(2, 1, dtype=torch.bool)
    storage.set(step, TensorDict({"episode": step // 3, ("next", "done"): done}, [2]))
    # the agreement is checked again (and the rows it follows are read) by a new plan
    assert slice_boundaries._current_plan(sampler, storage) is None
    sampler.sample(storage, 4)
    assert slice_boundaries._current_plan(sampler, storage) is not None
