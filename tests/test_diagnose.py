"""``torchrl_fixes.diagnose``: the stages it times, whether each fix serves the buffer, the
findings it makes, and that it changes nothing.

No test here asserts a duration. Findings that depend on a dominant share are
built with a wide margin (a transform sleeping 20 ms against stages of
microseconds, a stock boundary recovery over millions of rows against a
16-row batch), and the logic that turns shares into findings is also tested on
constructed stages (:func:`findings_from`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

import torchrl_fixes
from conformance.fake_pinning import forget_pin_memory_answer, install_fake_pinning
from conformance.reference import skip_without_extension
from torchrl_fixes import diagnose as diagnose_function
from torchrl_fixes.diagnose import (
    SAMPLE_STAGES,
    STAGES,
    DiagnoseRefused,
    findings_from,
)

ROWS, CAPACITY, EPISODE, BATCH = 200, 256, 10, 16


def _needs_fix(name: str):
    state = torchrl_fixes.status()[name]
    return pytest.mark.skipif(not state.applied, reason=f"{name} is {state.state} here: {state.reason}")


def _episodes(rows: int = ROWS, episode: int = EPISODE, seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    step = torch.arange(rows)
    return TensorDict(
        {
            "obs": torch.randn(rows, 3, generator=generator),
            "episode": step // episode,
            ("next", "done"): (step % episode == episode - 1).unsqueeze(-1),
        },
        batch_size=[rows],
    )


def _noisy(td):
    """A transform drawing from torch's, numpy's and Python's global generators."""
    td["noise"] = torch.rand(td.shape)
    td["np_noise"] = torch.as_tensor(np.random.rand(*td.shape))
    td["py_noise"] = torch.full(td.shape, random.random())
    return td


def _prioritized(**slices):
    """A PrioritizedSampler, or a PrioritizedSliceSampler given its slice arguments."""
    from torchrl.data import PrioritizedSampler, PrioritizedSliceSampler

    try:
        if slices:
            return PrioritizedSliceSampler(CAPACITY, alpha=0.7, beta=0.5, **slices)
        return PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5)
    except (RuntimeError, ImportError):
        skip_without_extension()
        raise


def _stock_cached():
    """A stock SliceSampler whose boundaries are cached until the next write."""
    with torchrl_fixes.disabled():
        return SliceSampler(num_slices=4, cache_values=True)


SAMPLERS = {
    "random": RandomSampler,
    "without_replacement": SamplerWithoutReplacement,
    "slice": lambda: SliceSampler(num_slices=4),
    "slice_traj_key": lambda: SliceSampler(num_slices=4, traj_key="episode", cache_values=True),
    "slice_without_replacement": lambda: SliceSamplerWithoutReplacement(num_slices=4),
    "slice_stock_cached": _stock_cached,
    "prioritized": _prioritized,
    "prioritized_slice": lambda: _prioritized(num_slices=4),
}


def _buffer(sampler: str, *, transform=False, pin_memory=False, prefetch=None, generator=False,
            cls=TensorDictReplayBuffer):
    rb = cls(
        storage=LazyTensorStorage(CAPACITY),
        sampler=SAMPLERS[sampler](),
        batch_size=BATCH,
        pin_memory=pin_memory,
        prefetch=prefetch,
        generator=torch.Generator().manual_seed(7) if generator else None,
    )
    if transform:
        rb.append_transform(_noisy)
    rb.extend(_episodes())
    return rb


def _settle(rb) -> None:
    """Waits for prefetched samples, so that the order of random draws is fixed."""
    concurrent.futures.wait(list(getattr(rb, "_prefetch_queue", ())))


def _draw(rb, n: int) -> list:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchrl_fixes.PinMemoryUnavailableWarning)
        for _ in range(n):
            out.append(rb.sample(return_info=True))
            _settle(rb)
    return out


def _assert_equal(a, b, where="") -> None:
    if isinstance(a, TensorDict) or hasattr(a, "keys") and hasattr(a, "batch_size"):
        keys_a = sorted(a.keys(True, True), key=str)
        assert keys_a == sorted(b.keys(True, True), key=str), where
        for key in keys_a:
            assert torch.equal(a[key], b[key]), f"{where}{key}"
    elif isinstance(a, dict):
        assert sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}{key}.")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}{i}.")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def _global_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _assert_same_states(before, after) -> None:
    assert torch.equal(before[0], after[0])
    assert before[1][0] == after[1][0]
    assert np.array_equal(before[1][1], after[1][1]) and before[1][2:] == after[1][2:]
    assert before[2] == after[2]


CASES = [
    pytest.param(sampler, transform, pin, id=f"{sampler}-{'transform' if transform else 'plain'}"
                 f"{'-pin' if pin else ''}")
    for sampler in SAMPLERS
    for transform, pin in ((False, False), (True, False), (True, True))
]


def _storage_state(storage) -> dict:
    """What a write changes in a storage, besides its mutation revision: values, cursor, length."""
    return {
        "values": storage._storage[: len(storage)].clone(),  # the rows past it are uninitialised
        "len": len(storage),
        "last_cursor": storage._last_cursor,
        "last_cursor_index": storage._last_cursor_index,
        "is_full": storage._is_full,
    }


@pytest.mark.parametrize("sampler, transform, pin_memory", CASES)
def test_buffer_samples_what_it_would_have_sampled(sampler, transform, pin_memory):
    """Two identical buffers, one diagnosed (16 rows written again): their next samples are equal
    (indices, info, data), and again after the same later write."""
    diagnosed = _buffer(sampler, transform=transform, pin_memory=pin_memory)
    untouched = _buffer(sampler, transform=transform, pin_memory=pin_memory)
    # part of an epoch first: the without-replacement samplers are diagnosed mid-epoch
    for rb in (diagnosed, untouched):
        _seed(0)
        _draw(rb, 3)
    _seed(1)
    states = _global_states()
    stored = _storage_state(diagnosed.storage)
    report = diagnose_function(diagnosed, samples=7, write_rows=16)
    assert set(SAMPLE_STAGES) >= set(report.stages) - {"to_device", "to_device_non_blocking", "after_write"}
    assert report.stages["after_write"] > 0 and report.buffer["write_rows"] == 16
    _assert_same_states(states, _global_states())
    _assert_equal(_storage_state(diagnosed.storage), stored)
    # 12 draws cross the epochs of the without-replacement samplers (5 slice batches)
    after_diagnose = _draw(diagnosed, 12)
    _seed(1)
    _assert_equal(after_diagnose, _draw(untouched, 12))
    # a later write wraps around the storage: what the index caught up on meets a real write
    for rb in (diagnosed, untouched):
        rb.extend(_episodes(100, seed=3))
    _seed(2)
    after_write = _draw(diagnosed, 6)
    _seed(2)
    _assert_equal(after_write, _draw(untouched, 6))


@pytest.mark.parametrize("sampler", ["random", "slice_without_replacement"])
def test_buffer_generator_and_prefetch_queue_are_untouched(sampler):
    """A buffer with its own generator and a prefetch queue: same queue, same samples after."""
    diagnosed = _buffer(sampler, transform=True, prefetch=1, generator=True)
    untouched = _buffer(sampler, transform=True, prefetch=1, generator=True)
    for rb in (diagnosed, untouched):
        _seed(0)
        _draw(rb, 2)
    queue = list(diagnosed._prefetch_queue)
    assert queue and all(future.done() for future in queue)
    generator_state = diagnosed._sampler._rng.get_state()
    _seed(1)
    report = diagnose_function(diagnosed, samples=5)
    assert list(diagnosed._prefetch_queue) == queue
    assert torch.equal(diagnosed._sampler._rng.get_state(), generator_state)
    assert report.prefetch["depth"] == 1
    assert "worker thread" in report.prefetch["summary"]
    after_diagnose = _draw(diagnosed, 8)
    _seed(1)
    _assert_equal(after_diagnose, _draw(untouched, 8))


def test_plain_replay_buffer_with_return_info():
    diagnosed, untouched = (_buffer("slice", transform=True, cls=ReplayBuffer) for _ in range(2))
    _seed(3)
    report = diagnose_function(diagnosed, samples=4)
    assert "info" in report.not_measured and "after_write" in report.stages
    after_diagnose = _draw(diagnosed, 5)
    _seed(3)
    _assert_equal(after_diagnose, _draw(untouched, 5))


def test_prefetch_in_flight_is_refused_and_left_alone(monkeypatch):
    """A prefetch worker still drawing: refused with a clear message; the queue is as it was."""
    # the package attribute torchrl_fixes.diagnose is the function; the module is in sys.modules
    monkeypatch.setattr(sys.modules["torchrl_fixes.diagnose"], "SETTLE_SECONDS", 0.05)
    gate, waiting, calls = threading.Event(), threading.Event(), [0]

    def held_back(td):
        calls[0] += 1
        if calls[0] >= 2:  # the first sample runs on this thread, the prefetched ones wait
            waiting.set()
            gate.wait(30)
        return td

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY), batch_size=BATCH, prefetch=1)
    rb.append_transform(held_back)
    rb.extend(_episodes())
    rb.sample()
    queue = list(rb._prefetch_queue)
    assert len(queue) == 1 and not queue[0].done()
    # the worker has drawn its index (from the global generator) once it reaches the transform
    assert waiting.wait(30)
    states = _global_states()
    try:
        with pytest.raises(DiagnoseRefused, match="prefetched sample.*still running"):
            diagnose_function(rb)
        assert list(rb._prefetch_queue) == queue and not queue[0].done()
        _assert_same_states(states, _global_states())
    finally:
        gate.set()
    assert queue[0].result(timeout=30)[0].batch_size == torch.Size([BATCH])


# ---------------------------------------------------------------------------
# Stages and report structure


def test_stages_of_a_slice_sampler_and_report_shape():
    rb = _buffer("slice", transform=True)
    report = diagnose_function(rb, samples=3, device="cpu")
    # the storage's index answers inside the draw: its boundaries are no stage of their own
    served = report.fixes["slice_boundary_index"].state == "serves"
    assert set(report.stages) == {"sampler", "gather", "transform", "info", "after_write"} | (
        set() if served else {"boundaries"}
    )
    assert all(isinstance(v, float) and v >= 0 for v in report.stages.values())
    assert report.not_measured["to_device"] == "cpu is not an accelerator: no host->device copy"
    assert report.not_measured["pin_memory"] == "pin_memory=False"
    data = report.to_dict()
    assert {"stages", "findings", "not_measured", "buffer", "prefetch", "sample_seconds"} <= set(data)
    assert data["buffer"]["sampler"] == "SliceSampler" and data["buffer"]["stored"] == ROWS
    json.dumps(data)  # plain data
    text = str(report)
    for name, label in STAGES:
        assert (label in text) == (name != "after_write")  # the draw after a write: in its own row
    assert "sample() total" in text and "prefetch: off" in text
    assert f"sample() right after a write of {ROWS} rows" in text


def test_random_sampler_has_no_boundary_stage():
    report = diagnose_function(_buffer("random"), samples=2)
    assert "boundaries" not in report.stages
    assert report.not_measured["boundaries"] == "not a slice sampler"
    assert report.not_measured["transform"] == "no transform"


# ---------------------------------------------------------------------------
# Whether each fix serves the buffer


def _verdicts(report) -> dict:
    return {name: (verdict.state, verdict.cause) for name, verdict in report.fixes.items()}


@_needs_fix("slice_boundary_index")
@_needs_fix("single_gather")
@_needs_fix("pinned_sample_output")
def test_every_fix_serves_a_fixed_buffer():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchrl_fixes.PinMemoryUnavailableWarning)
        report = diagnose_function(_buffer("slice", pin_memory=True), samples=2)
    assert set(report.fixes) == set(torchrl_fixes.fix_names())
    assert _verdicts(report) == {name: ("serves", "") for name in torchrl_fixes.fix_names()}
    text = str(report)
    for name in torchrl_fixes.fix_names():
        assert f"  {name}  " in text and text.count("serves this buffer") == len(report.fixes)
    assert report.to_dict()["fixes"]["slice_boundary_index"] == {
        "state": "serves", "cause": "", "why": "", "remedy": "", "text": "serves this buffer"
    }
    # the index answers inside the draw: no boundary stage of 0 µs
    assert "boundaries" not in report.stages
    assert report.not_measured["boundaries"] == "in the index draw: read from the storage's trajectory index"


def test_a_buffer_built_inside_disabled_runs_stock_code_for_every_fix():
    with torchrl_fixes.disabled():
        rb = _buffer("slice", pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torchrl_fixes.PinMemoryUnavailableWarning)
        report = diagnose_function(rb, samples=2)
    assert _verdicts(report) == {name: ("stock", "built disabled") for name in torchrl_fixes.fix_names()}
    assert str(report.fixes["slice_boundary_index"]) == (
        "stock code runs: this sampler was built inside torchrl_fixes.disabled()"
    )
    assert str(report.fixes["pinned_sample_output"]) == (
        "stock code runs: this buffer was built inside torchrl_fixes.disabled()"
    )
    assert report.fixes["pinned_sample_output"].remedy == "build the buffer outside torchrl_fixes.disabled()"
    assert "  single_gather         stock code runs: this sampler was built inside" in str(report)
    assert report.stages["boundaries"] > 0  # stock recovery, timed on its own


def test_fixes_a_buffer_does_not_use_are_not_relevant():
    report = diagnose_function(_buffer("random"), samples=1)
    assert _verdicts(report) == {name: ("not relevant", "") for name in torchrl_fixes.fix_names()}
    assert str(report.fixes["slice_boundary_index"]) == "not relevant: RandomSampler is not a slice sampler"
    assert str(report.fixes["single_gather"]) == "not relevant: RandomSampler is not a slice sampler"
    assert str(report.fixes["pinned_sample_output"]) == "not relevant: pin_memory=False"


@_needs_fix("single_gather")
def test_a_fix_not_applied_in_this_process():
    torchrl_fixes.deactivate("single_gather")
    try:
        report = diagnose_function(_buffer("slice"), samples=1)
    finally:
        torchrl_fixes.activate("single_gather")
    assert str(report.fixes["single_gather"]) == (
        "stock code runs: the fix is inactive in this process (deactivated)"
    )
    assert report.fixes["slice_boundary_index"].state == "serves"


@_needs_fix("slice_boundary_index")
def test_a_sampler_built_before_the_fix_reads_ids_for_flags():
    """Built before the fix was applied (as before `import torchrl_fixes`), a sampler naming no
    key is still served, but reads the trajectory ids where one built after reads the done flags."""
    torchrl_fixes.deactivate("slice_boundary_index")
    try:
        before = SliceSampler(num_slices=4)
    finally:
        torchrl_fixes.activate("slice_boundary_index")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(CAPACITY), sampler=before, batch_size=BATCH)
    rb.extend(_episodes())
    verdict = diagnose_function(rb, samples=2).fixes["slice_boundary_index"]
    assert str(verdict) == (
        "serves this buffer; built before the fix was applied (before import torchrl_fixes), the "
        "sampler reads the trajectory ids 'episode' where one built after reads the ('next', 'done') flags"
    )
    after = diagnose_function(_buffer("slice"), samples=2)
    assert str(after.fixes["slice_boundary_index"]) == "serves this buffer"
    assert after.buffer["boundary_read"] == ["end", ("next", "done")]


@_needs_fix("pinned_sample_output")
def test_a_buffer_class_decorated_with_stock_pinning_keeps_it(fake_accelerator):
    """A class decorated with TorchRL's pin_memory_output taken before the fix was applied (as
    before `import torchrl_fixes`) keeps stock pinning; one decorated after is served."""
    from torchrl.data.replay_buffers import utils

    stock_decorator = torchrl_fixes.get_original(utils, "pin_memory_output")

    def sample_rows(self, batch_size):
        index, info = self._sampler.sample(self._storage, batch_size)
        info["index"] = index
        return self._transform(self._storage.get(index)), info

    class Before(TensorDictReplayBuffer):
        _sample = stock_decorator(sample_rows)

    class After(TensorDictReplayBuffer):
        _sample = utils.pin_memory_output(sample_rows)

    before, after = (_buffer("random", pin_memory=True, cls=cls) for cls in (Before, After))
    for rb in (before, after):
        rb.append_transform(_rebuild)
    report = diagnose_function(before, samples=2)
    verdict = report.fixes["pinned_sample_output"]
    assert (verdict.state, verdict.cause) == ("stock", "stock decorator")
    assert verdict.why == (
        "Before._sample was decorated with TorchRL's pin_memory_output before torchrl_fixes was imported"
    )
    unpinned = report.findings[report.codes.index("pin-memory-unpinned")]
    assert "(obs, episode" in unpinned.message and "index" not in unpinned.message  # sample() pins the info
    assert unpinned.remedy.startswith("define Before after import torchrl_fixes (TorchRL's own buffer")
    assert diagnose_function(after, samples=2).fixes["pinned_sample_output"].state == "serves"


# ---------------------------------------------------------------------------
# The sample right after a write


def test_after_write_stage_in_the_report():
    report = diagnose_function(_buffer("slice"), samples=3)
    assert report.buffer["write_rows"] == ROWS  # 1,000 by default, clipped to the rows stored
    assert report.stages["after_write"] > 0
    after = report.after_write_seconds
    assert after == report.sample_seconds - report.draw_seconds + report.stages["after_write"]
    assert report.to_dict()["after_write_sample_seconds"] == after
    assert f"sample() right after a write of {ROWS:,} rows" in str(report)
    assert "after_write" in report.stages
    assert diagnose_function(_buffer("slice"), samples=1, write_rows=5).buffer["write_rows"] == 5


@_needs_fix("slice_boundary_index")
def test_the_writes_leave_the_trajectory_index_in_step():
    """Each write moves the storage's mutation revision, and the storage's index recorded it: the
    next sample reads no row again and rebuilds nothing."""
    rb = _buffer("slice")
    rb.sample()
    index = rb.storage.__dict__["_trajectory_index"]
    revision = rb.storage._mutation_revision
    diagnose_function(rb, samples=4, write_rows=16)
    assert rb.storage.__dict__["_trajectory_index"] is index
    assert rb.storage._mutation_revision == revision + 4  # one write per timed sample
    assert (index._revision, index._stale) == (revision + 4, False)


@_needs_fix("slice_boundary_index")
def test_writes_the_journal_does_not_hold_are_named():
    """The revision moved with no record (as a writer without the fix moves it): the index
    rebuilds, and the report names it with the way to avoid it."""
    rb = _buffer("slice")
    rb.sample()
    assert "untold-writes" not in diagnose_function(rb, samples=2).codes
    rb.storage._bump_mutation_revision()
    report = diagnose_function(rb, samples=2)
    assert "untold-writes" in report.codes, str(report)
    finding = report.findings[report.codes.index("untold-writes")]
    assert finding.message.startswith("the storage's trajectory index was rebuilt from the whole storage once ")
    assert "import torchrl_fixes in every process that writes the storage" in finding.remedy


def test_stock_boundaries_cached_until_a_write():
    """Stock SliceSampler(cache_values=True) over 4M rows: cheap between writes, the whole
    recovery right after one."""
    data = _big_episodes(4_000_000)
    with torchrl_fixes.disabled():
        sampler = SliceSampler(num_slices=2, cache_values=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(len(data)), sampler=sampler, batch_size=16)
    rb.extend(data)
    report = diagnose_function(rb, samples=5)
    assert "slice-boundaries" not in report.codes, str(report)  # cached between writes
    assert report.codes[0] == "after-write-draw", str(report)
    message = report.findings[0].message
    assert message.startswith("right after a write of 1,000 rows a sample takes ")
    assert "(this sampler was built inside torchrl_fixes.disabled())" in message
    assert "cache_values=True keeps them only until the next write" in message
    predicted = diagnose_function(rb, samples=2, write_rows=0)
    assert predicted.not_measured["after_write"] == "write_rows=0"
    assert "after_write" not in predicted.stages and predicted.after_write_seconds is None
    assert "(no write was timed)" in predicted.findings[predicted.codes.index("after-write-draw")].message


def test_storages_another_process_may_write_are_not_written(tmp_path):
    memmap = TensorDictReplayBuffer(storage=LazyMemmapStorage(CAPACITY, scratch_dir=tmp_path), batch_size=BATCH)
    memmap.extend(_episodes())
    shared = _buffer("slice")
    shared.storage._storage.share_memory_()
    listed = ReplayBuffer(storage=ListStorage(CAPACITY), batch_size=BATCH)
    listed.extend(torch.arange(ROWS))
    held = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), batch_size=BATCH)
    held.extend({"a": torch.arange(ROWS), "b": torch.ones(ROWS)})
    for rb, why in (
        (memmap, "the storage is memory-mapped: another process may write its rows"),
        (shared, "the storage is in shared memory: another process may write its rows"),
        (listed, "ListStorage is not a TensorStorage: its rows are not written again"),
        (held, "the storage holds a dict, not a tensor or a TensorDict: its rows are not written"),
    ):
        report = diagnose_function(rb, samples=1)
        assert "after_write" not in report.stages
        assert report.not_measured["after_write"].startswith(why)
        assert why in str(report)


def test_transform_that_sleeps_dominates():
    rb = _buffer("random")
    rb.append_transform(lambda td: (time.sleep(0.02), td)[1])
    report = diagnose_function(rb, samples=3)
    assert report.codes[0] == "transform-dominates"
    finding = report.findings[0]
    assert "% of each sample" in finding.message and finding.remedy
    assert report.to_dict()["findings"][0] == finding.to_dict()


@pytest.mark.skipif(torch.accelerator.is_available(), reason="an accelerator is available")
@_needs_fix("pinned_sample_output")
@pytest.mark.parametrize("stock", [False, True])
def test_pin_memory_without_accelerator(stock):
    if stock:
        with torchrl_fixes.disabled():
            rb = _buffer("random", pin_memory=True)
    else:
        rb = _buffer("random", pin_memory=True)
    report = diagnose_function(rb, samples=2)
    assert "pin-memory-no-accelerator" in report.codes
    message = report.findings[report.codes.index("pin-memory-no-accelerator")].message
    assert ("raises RuntimeError" in message) == stock
    assert "no accelerator" in report.not_measured["pin_memory"]


def _big_episodes(rows: int) -> TensorDict:
    """Episode ids and done flags only, in 1,000-step episodes."""
    step = torch.arange(rows)
    return TensorDict(
        {"episode": step // 1000, ("next", "done"): (step % 1000 == 999).unsqueeze(-1)},
        batch_size=[rows],
    )


@_needs_fix("slice_boundary_index")
def test_stock_slice_sampler_with_the_fix_inactive():
    """Deactivated fix, stock recovery over 4M rows against a 16-row batch: slice-boundaries, inactive."""
    data = _big_episodes(4_000_000)
    torchrl_fixes.deactivate("slice_boundary_index")
    try:
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(len(data)), sampler=SliceSampler(num_slices=2), batch_size=16
        )
        rb.extend(data)
        report = diagnose_function(rb, samples=5)
    finally:
        torchrl_fixes.activate("slice_boundary_index")
    assert report.codes[0] == "slice-boundaries", str(report)
    message = report.findings[0].message
    assert "stock code runs (the fix is inactive in this process (deactivated))" in message
    assert "reads the trajectory ids 'episode' where the ('next', 'done') flags would do" in message
    remedy = report.findings[0].remedy
    assert "end_key=('next', 'done')" in remedy
    assert "applied at any time before the sample, it serves this sampler too" in remedy
    verdict = report.fixes["slice_boundary_index"]
    assert (verdict.state, verdict.cause) == ("stock", "inactive")
    assert str(verdict) == "stock code runs: the fix is inactive in this process (deactivated)"


@_needs_fix("slice_boundary_index")
def test_applied_fix_whose_configuration_falls_back():
    class OwnSampler(SliceSampler):
        def _end_to_start_stop(self, end, length):
            return super()._end_to_start_stop(end, length)

    data = _big_episodes(4_000_000)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(len(data)),
        sampler=OwnSampler(num_slices=2, end_key=("next", "done")),
        batch_size=16,
    )
    rb.extend(data)
    report = diagnose_function(rb, samples=5)
    assert report.codes[0] == "slice-boundaries", str(report)
    assert (
        "stock code runs (a configuration the fix leaves to stock code: "
        "OwnSampler overrides _end_to_start_stop)" in report.findings[0].message
    )
    assert "would do" not in report.findings[0].message  # it reads the done flags already
    assert report.fixes["slice_boundary_index"].cause == "configuration"
    assert report.fixes["single_gather"].state == "serves"


def test_memmap_gather_dominates(tmp_path):
    """Rows of 110 kB read from a memmap storage, 256 at a time: the gather dominates."""
    rb = TensorDictReplayBuffer(
        storage=LazyMemmapStorage(512, scratch_dir=tmp_path), batch_size=256
    )
    rb.extend(TensorDict({"pixels": torch.rand(512, 3, 96, 96)}, [512]))
    report = diagnose_function(rb, samples=3)
    assert report.codes[0] == "storage-gather-dominates", str(report)
    message = report.findings[0].message
    assert "MB/s read from LazyMemmapStorage at " in message and str(tmp_path) in message


def test_unknown_layouts_and_bad_arguments_are_refused():
    with pytest.raises(DiagnoseRefused, match="ReplayBuffer"):
        diagnose_function(object())
    rb = _buffer("random")
    del rb.__dict__["_collate_fn"]
    with pytest.raises(DiagnoseRefused, match="does not know this TorchRL's replay buffer layout.*_collate_fn"):
        diagnose_function(rb)
    empty = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
    empty.extend(_episodes(4))
    empty.empty()
    with pytest.raises(DiagnoseRefused, match="empty"):
        diagnose_function(empty)
    with pytest.raises(ValueError, match="samples"):
        diagnose_function(_buffer("random"), samples=0)
    with pytest.raises(ValueError, match=r"write_rows must be an int >= 0 \(0: no write timed\), got -1"):
        diagnose_function(_buffer("random"), write_rows=-1)
    no_batch = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    no_batch.extend(_episodes(4))
    with pytest.raises(ValueError, match="batch_size"):
        diagnose_function(no_batch)
    assert diagnose_function(no_batch, batch_size=2, samples=1).buffer["batch_size"] == 2


@pytest.mark.parametrize("fixes", ["applied", "disabled"])
def test_info_stage_of_a_sample_not_known_is_not_measured(monkeypatch, fixes):
    """A TensorDictReplayBuffer.sample of other code may write the info otherwise: not timed, and said why."""
    rb = _buffer("random")
    original = TensorDictReplayBuffer.sample

    def sample(self, *args, **kwargs):  # not TorchRL's code, nor the fix's edit of it
        return original(self, *args, **kwargs)

    # the fix's own replacement is left in place outside this block
    with torchrl_fixes.disabled() if fixes == "disabled" else contextlib.nullcontext():
        assert "info" in diagnose_function(rb, samples=1).stages
        with monkeypatch.context() as patch:
            patch.setattr(TensorDictReplayBuffer, "sample", sample)
            report = diagnose_function(rb, samples=1)
    assert "info" not in report.stages
    reason = report.not_measured["info"]
    assert reason.startswith("TensorDictReplayBuffer.sample is not code diagnose knows")
    assert reason in str(report)

    class OwnSample(TensorDictReplayBuffer):
        def sample(self, *args, **kwargs):
            return super().sample(*args, **kwargs)

    report = diagnose_function(_buffer("random", cls=OwnSample), samples=1)
    assert "info" not in report.stages
    assert report.not_measured["info"].startswith("OwnSample.sample is not TensorDictReplayBuffer's")


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    report = diagnose_function(_buffer("slice"), samples=2)
    path = report.save_png(tmp_path / "stages.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_rows_another_writer_wrote_are_not_written_back():
    """A write by another buffer over the storage while diagnose runs: the write backs stop there."""
    rb = _buffer("slice")
    other = TensorDictReplayBuffer(storage=rb.storage, batch_size=BATCH)
    extend = rb.sampler.extend

    def extend_and_another_write(index):
        extend(index)
        row = torch.tensor([0])
        other.storage.set(row, other.storage[row], set_cursor=False)  # the revision moves

    rb.sampler.extend = extend_and_another_write
    report = diagnose_function(rb, samples=3)
    assert report.not_measured["after_write"] == (
        "writing the rows again failed: another writer wrote the storage while diagnose ran, "
        "so its rows are not written back over that write"
    )
    assert "after_write" not in report.stages


def test_rows_that_cannot_be_written_again():
    """Stored in inference mode: the write fails (with the values it had), the stage says why."""
    with torch.inference_mode():
        diagnosed, untouched = (_buffer("slice") for _ in range(2))
    report = diagnose_function(diagnosed, samples=2)
    assert report.not_measured["after_write"] == (
        "writing the rows again failed: Inplace update to inference tensor outside InferenceMode is not allowed"
    )
    assert "after_write" not in report.stages and report.buffer["write_rows"] == 0
    _seed(4)
    after_diagnose = _draw(diagnosed, 4)
    _seed(4)
    _assert_equal(after_diagnose, _draw(untouched, 4))


# ---------------------------------------------------------------------------
# Pinning through a stand-in accelerator (pinned copies recorded, not page-locked)


@pytest.fixture
def fake_accelerator(monkeypatch):
    if torch.accelerator.is_available():
        pytest.skip("a real accelerator is present")
    yield install_fake_pinning(monkeypatch)
    forget_pin_memory_answer()


def _rebuild(td):
    """A transform that returns a new TensorDict, with device=None."""
    return TensorDict(dict(td.items()), batch_size=td.batch_size)


@_needs_fix("pinned_sample_output")
def test_pinning_on_the_training_thread(fake_accelerator):
    rb = _buffer("random", pin_memory=True)
    report = diagnose_function(rb, samples=3)
    assert "pin_memory" in report.stages
    assert "pinned-on-training-thread" in report.codes
    assert "pin-memory-unpinned" not in report.codes  # the fix pins every returned tensor
    prefetched = _buffer("random", pin_memory=True, prefetch=1)
    assert "pinned-on-training-thread" not in diagnose_function(prefetched, samples=3).codes


def test_stock_pinning_skips_a_transform_output(fake_accelerator):
    with torchrl_fixes.disabled():
        rb = _buffer("random", pin_memory=True)
    rb.append_transform(_rebuild)
    report = diagnose_function(rb, samples=2)
    finding = report.findings[report.codes.index("pin-memory-unpinned")]
    assert finding.message.startswith("pin_memory=True, but ")
    assert "returned tensors are not pinned" in finding.message
    assert "device=None" in finding.message and "info entries" in finding.message


@pytest.mark.skipif(torch.accelerator.is_available(), reason="an accelerator is available")
def test_stock_pinning_predicted_without_an_accelerator():
    with torchrl_fixes.disabled():
        rb = _buffer("random", pin_memory=True)
    rb.append_transform(_rebuild)
    report = diagnose_function(rb, samples=2)
    message = report.findings[report.codes.index("pin-memory-unpinned")].message
    assert "even with an accelerator" in message and "device=None" in message


# ---------------------------------------------------------------------------
# findings_from, on constructed stages


SERVED = {"state": "serves", "cause": "", "why": ""}
STOCK_CACHED = {"state": "stock", "cause": "built disabled",
                "why": "this sampler was built inside torchrl_fixes.disabled()",
                "remedy": "build the sampler outside torchrl_fixes.disabled()"}


def _facts(**overrides):
    facts = {
        "pin_memory": False, "prefetch": 0, "accelerator": True, "device": None, "unpinned": [],
        "tensors": 0, "pinned_measured": True, "unpinned_source": False,
        "transformed_device_none": False, "patched_pin": True, "slice_index": SERVED,
        "cache_values": False, "boundary_read": None, "has_done": False, "traj_key_named": False,
        "trajectories": None, "write_rows": 1000, "gathered_bytes": 0, "storage": "LazyTensorStorage",
        "memmap_dir": None,
    }
    facts.update(overrides)
    return facts


def test_findings_thresholds():
    assert findings_from({"sampler": 1e-4, "transform": 0.9e-4}, _facts()) == []
    codes = [f.code for f in findings_from({"sampler": 1e-4, "transform": 1.1e-4}, _facts())]
    assert codes == ["transform-dominates"]


def test_findings_unpinned_transfer_and_pinning_thread():
    stages = {"sampler": 1e-4, "gather": 1e-4, "pin_memory": 5e-4, "to_device": 2e-3,
              "to_device_non_blocking": 1e-5}
    found = findings_from(stages, _facts(pin_memory=True, unpinned_source=True, device="cuda:0"))
    codes = [f.code for f in found]
    assert codes == ["pinned-on-training-thread", "unpinned-transfer"]
    assert "to cuda:0 from pageable memory" in found[1].message
    assert "non_blocking=True" in found[1].remedy
    assert "pinned-on-training-thread" not in [
        f.code for f in findings_from(stages, _facts(pin_memory=True, prefetch=2))
    ]


def test_findings_gather_bandwidth_and_ids_named():
    found = findings_from(
        {"sampler": 1e-4, "gather": 1e-2},
        _facts(gathered_bytes=50e6, storage="LazyMemmapStorage", memmap_dir="/slow/disk"),
    )
    assert "5,000 MB/s read from LazyMemmapStorage at /slow/disk" in found[0].message
    found = findings_from(
        {"boundaries": 1e-2, "sampler": 1e-4},
        _facts(boundary_read=("trajectory", "episode"), has_done=True, traj_key_named=True),
    )
    assert "where the ('next', 'done') flags would do" in found[0].message
    # ids read by the applied fix without a named key: the flags disagree, nothing to suggest
    found = findings_from(
        {"boundaries": 1e-2, "sampler": 1e-4},
        _facts(boundary_read=("trajectory", "episode"), has_done=True),
    )
    assert "would do" not in found[0].message and "fix serves this buffer" in found[0].message


def test_findings_after_write():
    """The draw right after a write: a finding where its extra cost is half that sample or more."""
    between = {"sampler": 1e-4, "gather": 5e-5, "info": 5e-5}
    assert findings_from({**between, "after_write": 2e-4}, _facts()) == []
    found = findings_from({**between, "after_write": 2e-3}, _facts(write_rows=500))
    assert [f.code for f in found] == ["after-write-draw"]
    assert found[0].message.startswith("right after a write of 500 rows a sample takes 2.1 ms")
    assert found[0].message.endswith("the storage's trajectory index reads the rows written since the last sample")
    found = findings_from(
        {**between, "boundaries": 1e-5, "after_write": 2e-2},
        _facts(slice_index=STOCK_CACHED, cache_values=True),
    )
    assert "finds the trajectory boundaries from the whole storage again after every write" in found[0].message
    assert "cache_values=True keeps them only until the next write" in found[0].message
    assert found[0].remedy.startswith("build the sampler outside torchrl_fixes.disabled()")
    # no write timed: predicted from the configuration alone
    predicted = findings_from({**between, "boundaries": 1e-5}, _facts(slice_index=STOCK_CACHED, cache_values=True))
    assert [f.code for f in predicted] == ["after-write-draw"]
    assert "(no write was timed)" in predicted[0].message
    assert findings_from({**between, "boundaries": 1e-5}, _facts(slice_index=STOCK_CACHED)) == []


# ---------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def cli_runs(spawn_python, finish_process):
    started = {
        "demo": spawn_python("-m", "torchrl_fixes", "diagnose", "--demo", "--json", "--samples", "3"),
        "no buffer": spawn_python("-m", "torchrl_fixes", "diagnose"),
        "bad samples": spawn_python("-m", "torchrl_fixes", "diagnose", "--demo", "--samples", "0"),
        "bogus option": spawn_python("-m", "torchrl_fixes", "diagnose", "--bogus"),
        "import": spawn_python(
            "-c", "import sys, torchrl_fixes; print(callable(torchrl_fixes.diagnose), "
            "'matplotlib' in sys.modules)"
        ),
    }
    return {case: finish_process(process, timeout=300) for case, process in started.items()}


def test_cli_demo(cli_runs):
    run = cli_runs["demo"]
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    codes = [f["code"] for f in report["findings"]]
    assert "slice-boundaries" in codes and "pin-memory-unpinned" in codes
    slice_message = report["findings"][codes.index("slice-boundaries")]["message"]
    assert "this sampler was built inside torchrl_fixes.disabled()" in slice_message
    assert report["fixes"]["pinned_sample_output"]["cause"] == "built disabled"
    assert report["buffer"]["write_rows"] == 1000 and report["after_write_sample_seconds"] > 0
    assert report["buffer"]["stored"] == 5_000_000
    assert set(report["stages"]) >= {"boundaries", "sampler", "gather", "transform", "info"}


def test_cli_without_a_buffer_says_how_in_one_line(cli_runs):
    run = cli_runs["no buffer"]
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "python -m torchrl_fixes diagnose: diagnose needs a replay buffer from Python: "
        "`torchrl_fixes.diagnose(rb)` (or `diagnose --demo` for a built-in example)"
    ]


@pytest.mark.parametrize("case, bad", [("bad samples", "'0'"), ("bogus option", "--bogus")])
def test_cli_bad_arguments(cli_runs, case, bad):
    run = cli_runs[case]
    assert run.returncode == 2 and run.stdout == ""
    assert bad in run.stderr and "usage: python -m torchrl_fixes" in run.stderr
    assert "Traceback" not in run.stderr


def test_import_stays_light(cli_runs):
    run = cli_runs["import"]
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"]
