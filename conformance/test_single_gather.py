"""Conformance of the ``single_gather`` fix.

The slice samplers must build exactly the stock info (truncated / done /
terminated / is_init / mask) and the buffers must return exactly the stock data,
while the sampled rows are gathered once: the sampler reads only the entries it
needs. Each scenario runs on stock TorchRL and patched, and the outputs are
compared with :func:`conformance.harness.assert_identical`; the read counts are
measured on a stored entry that counts how often rows are gathered from it.
"""
from __future__ import annotations

import inspect
import itertools
import types
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torchrl.data
from tensordict import TensorDict
from torchrl.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSliceSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    TensorDictReplayBuffer,
)

import torchrl_fixes
from conformance import reference
from conformance.harness import assert_identical, run_patched, run_stock
from torchrl_fixes._core.patching import derive_from_source
from torchrl_fixes._core.registry import Registry
from torchrl_fixes._core.source_fingerprint import source_fingerprint
from torchrl_fixes.fixes import ALL_FIXES
from torchrl_fixes.fixes import single_gather as fix

_NOT_IN_EFFECT = reference.why_not_in_effect("single_gather")
pytestmark = pytest.mark.skipif(
    _NOT_IN_EFFECT is not None, reason=f"single_gather does not act here ({_NOT_IN_EFFECT})"
)

# pad_output is new in TorchRL 0.13; init_key and fragmented in 0.14; output_layout
# ("batch_time") after 0.14.1 (torchrl-nightly 2026.10.27).
SLICE_OPTIONS = set(inspect.signature(SliceSampler.__init__).parameters)
BATCH_TIME = {"output_layout": "batch_time"}
# TorchRL >= 0.13 marks slice starts in is_init, which it reads from the sampled rows.
HAS_INIT_MARKER = hasattr(SliceSampler, "_maybe_emit_init_marker")
SAMPLERS = {
    "slice": SliceSampler,
    "without_replacement": SliceSamplerWithoutReplacement,
    "prioritized": PrioritizedSliceSampler,
}
# StreamingSliceSampler (TorchRL 0.14 on) builds the info of its queued windows
# with SliceSampler._finalize_index.
STREAMING = getattr(torchrl.data, "StreamingSliceSampler", None)
BATCH = 32
NUM_SLICES = 4
SAMPLES = 3
_scratch_dirs = itertools.count()


class GatherCounter(torch.Tensor):
    """A stored entry that counts the row gathers (tensor-indexed reads) made from it.

    Slices (``x[:n]``, as storages take of their used part) are not gathers. The
    count is kept on the class, so views and results share it; :meth:`reset` sets
    it to zero.
    """

    gathers = 0

    @classmethod
    def reset(cls) -> None:
        cls.gathers = 0

    def __getitem__(self, index):
        items = index if isinstance(index, tuple) else (index,)
        if any(isinstance(item, torch.Tensor) for item in items):
            type(self).gathers += 1
        return super().__getitem__(index)


def episodes(
    n: int,
    *,
    num_envs: int | None = None,
    seed: int = 0,
    done_key: Any = ("next", "done"),
    terminated: bool = True,
    is_init: bool = True,
    pixel_side: int = 4,
) -> TensorDict:
    """Transitions of consecutive episodes of 4 to 24 steps, as a collector writes them.

    Every row carries small images (``pixels``, ``("next", "pixels")``), which
    the sampler never needs. Episodes end with ``done``; every second one is
    ``terminated``, the others ``truncated``. ``is_init`` is true at episode starts.
    With ``num_envs``, the batch has shape ``[num_envs, n]``, one stream per env.
    """
    generator = torch.Generator().manual_seed(seed)
    shape = (n,) if num_envs is None else (num_envs, n)
    episode = torch.empty(shape, dtype=torch.long)
    start = torch.zeros(shape, dtype=torch.bool)
    end = torch.zeros(shape, dtype=torch.bool)
    next_id = 0
    for env in range(num_envs or 1):
        t = 0
        while t < n:
            length = int(torch.randint(4, 25, (), generator=generator))
            stop = min(t + length, n)
            where = (slice(t, stop),) if num_envs is None else (env, slice(t, stop))
            episode[where] = next_id
            first = (t,) if num_envs is None else (env, t)
            last = (stop - 1,) if num_envs is None else (env, stop - 1)
            start[first] = True
            end[last] = True
            next_id += 1
            t = stop
    done = end.unsqueeze(-1)
    term = done & (episode % 2 == 0).unsqueeze(-1)
    data = TensorDict(
        {
            "obs": torch.randn(*shape, 3, generator=generator),
            "pixels": torch.randint(
                256, (*shape, 3, pixel_side, pixel_side), dtype=torch.uint8, generator=generator
            ),
            "action": torch.randint(4, shape, generator=generator),
            "episode": episode,
            "step": torch.arange(torch.Size(shape).numel()).view(shape),
            ("next", "obs"): torch.randn(*shape, 3, generator=generator),
            ("next", "pixels"): torch.randint(
                256, (*shape, 3, pixel_side, pixel_side), dtype=torch.uint8, generator=generator
            ),
            ("next", "reward"): torch.randn(*shape, 1, generator=generator),
            ("next", "truncated"): done & ~term,
        },
        list(shape),
    )
    data.set(done_key, done.clone())
    if terminated:
        terminated_key = (
            done_key[:-1] + ("terminated",) if isinstance(done_key, tuple) else "terminated"
        )
        data.set(terminated_key, term)
    if is_init:
        data.set("is_init", start.unsqueeze(-1))
    return data


@dataclass(frozen=True)
class Case:
    """One replay buffer to sample: its sampler, storage, data and buffer class."""

    sampler: str = "slice"
    storage: str = "tensor"  # "tensor", "memmap" or "ndim2"
    fill: str = "partial"  # "partial", "full" (exactly at capacity) or "wrapped"
    buffer: str = "tensordict"  # "tensordict" or "plain"
    options: dict = field(default_factory=dict)  # sampler keyword arguments
    data: dict = field(default_factory=dict)  # episodes() keyword arguments
    needs: tuple = ()  # sampler options this TorchRL must have

    @property
    def id(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in {**self.options, **self.data}.items())
        return f"{self.sampler}-{self.storage}-{self.fill}-{self.buffer}[{opts}]"


# Rows written, 50 at a time. An ndim=2 storage gets [NUM_ENVS, T] batches of 10
# steps (T = rows / NUM_ENVS), which it stores as [T, NUM_ENVS].
ROWS = {"partial": 152, "full": 200, "wrapped": 288}
CAPACITY = 200
NUM_ENVS = 4


def build_buffer(case: Case, scratch: Path | None):
    """The buffer of ``case``, filled with its episodes."""
    options = {"end_key": ("next", "done"), **case.options}
    if case.sampler == "prioritized":
        options = {"max_capacity": CAPACITY, "alpha": 0.7, "beta": 0.5, **options}
    if case.sampler == "streaming":
        sampler = STREAMING(slice_len=BATCH // NUM_SLICES, **options)
    else:
        sampler = SAMPLERS[case.sampler](num_slices=NUM_SLICES, **options)
    if case.storage == "ndim2":
        storage = LazyTensorStorage(CAPACITY, ndim=2)
        batches = episodes(ROWS[case.fill] // NUM_ENVS, num_envs=NUM_ENVS, **case.data).split(
            10, dim=1
        )
    else:
        if case.storage == "memmap":
            storage = LazyMemmapStorage(
                CAPACITY, scratch_dir=scratch / f"rb{next(_scratch_dirs)}"
            )
        else:
            storage = LazyTensorStorage(CAPACITY)
        batches = episodes(ROWS[case.fill], **case.data).split(50)
    buffer_cls = TensorDictReplayBuffer if case.buffer == "tensordict" else ReplayBuffer
    rb = buffer_cls(storage=storage, sampler=sampler, batch_size=BATCH)
    for batch in batches:
        rb.extend(batch)
    return rb


def update_priorities(rb, info) -> None:
    """Gives the sampled rows priorities that depend on their position only."""
    index = info["index"]
    if isinstance(index, torch.Tensor) and index.ndim == 2:  # stacked by TensorDictReplayBuffer
        index = index.unbind(-1)
    flat = index[0] if len(index) == 1 else index[0] * 1000 + index[1]
    rb.update_priority(index, 1.0 + (flat % 7).to(torch.float32))


def sample_scenario(case: Case, scratch: Path | None, prepare=None):
    """Samples the buffer of ``case`` a few times; returns every (data, info).

    ``prepare(rb)``, if given, is called on the buffer first. A sample that raises
    ends the scenario with ``("raised", type, message)``, so stock and patched must
    fail alike.
    """

    def scenario():
        rb = build_buffer(case, scratch)
        if prepare is not None:
            prepare(rb)
        out = []
        for _ in range(SAMPLES):
            try:
                sample, info = rb.sample(return_info=True)
            except Exception as err:
                out.append(("raised", type(err).__name__, str(err)))
                break
            out.append((sample, info))
            if case.sampler == "prioritized":
                update_priorities(rb, info)
        return out

    return scenario


def _cases() -> list[Case]:
    cases = []
    for sampler in SAMPLERS:
        for storage in ("tensor", "memmap", "ndim2"):
            cases.append(Case(sampler, storage))
        cases.append(Case(sampler, "tensor", fill="wrapped"))
        cases.append(Case(sampler, "memmap", fill="full"))
        cases.append(Case(sampler, "tensor", options={"strict_length": False}))
        cases.append(Case(sampler, "ndim2", options={"strict_length": False}))
        cases.append(Case(sampler, "tensor", options={"truncated_key": None}))
        cases.append(Case(sampler, "tensor", data={"terminated": False, "is_init": False}))
        cases.append(Case(sampler, "memmap", data={"is_init": False}))
        cases.append(Case(sampler, "tensor", options={"traj_key": "episode", "end_key": None}))
        cases.append(
            Case(
                sampler,
                "tensor",
                options={"truncated_key": ("agent", "truncated"), "end_key": ("agent", "done")},
                data={"done_key": ("agent", "done")},
            )
        )
        cases.append(
            Case(
                sampler,
                "ndim2",
                options={"truncated_key": "truncated", "end_key": "done"},
                data={"done_key": "done"},
            )
        )
        cases.append(Case(sampler, "tensor", buffer="plain"))
        cases.append(Case(sampler, "tensor", options={"init_key": None}, needs=("init_key",)))
        cases.append(
            Case(
                sampler,
                "tensor",
                options={"truncated_key": None, "init_key": None},
                needs=("init_key",),
            )
        )
    cases += [
        Case("slice", "tensor", options={"cache_values": True}),
        Case("slice", "tensor", options={"span": True}),
        Case("slice", "ndim2", options={"span": True, "strict_length": False}),
        Case("slice", "tensor", options={"strict_length": False, "pad_output": True}, needs=("pad_output",)),
        Case("slice", "ndim2", options={"strict_length": False, "pad_output": True}, needs=("pad_output",)),
        Case(
            "slice",
            "memmap",
            fill="wrapped",
            options={"strict_length": False, "pad_output": True},
            needs=("pad_output",),
        ),
        Case(
            "slice",
            "tensor",
            options={"truncated_key": None, "strict_length": False, "pad_output": True},
            needs=("pad_output",),
        ),
        Case(
            "slice",
            "tensor",
            options={"fragmented": True, "traj_key": "episode", "step_key": "step", "end_key": None},
            needs=("fragmented",),
        ),
    ]
    # The batch_time layout: the sampler returns [num_slices, time] and reads the
    # init flags of the sampled rows for its is_init marker.
    for sampler in ("slice", "without_replacement"):
        for storage in ("tensor", "memmap", "ndim2"):
            cases.append(Case(sampler, storage, options=BATCH_TIME, needs=("output_layout",)))
        for options in (
            {"strict_length": False},
            {"init_key": None},
            {"truncated_key": None, "init_key": None},
        ):
            cases.append(
                Case(sampler, "tensor", options={**BATCH_TIME, **options}, needs=("output_layout",))
            )
        cases.append(
            Case(sampler, "ndim2", options={**BATCH_TIME, "strict_length": False}, needs=("output_layout",))
        )
        cases.append(
            Case(sampler, "tensor", fill="wrapped", options=BATCH_TIME, needs=("output_layout",))
        )
        cases.append(
            Case(sampler, "memmap", options=BATCH_TIME, data={"is_init": False}, needs=("output_layout",))
        )
        cases.append(Case(sampler, "tensor", buffer="plain", options=BATCH_TIME, needs=("output_layout",)))
    cases += [
        Case("slice", "tensor", options={**BATCH_TIME, "cache_values": True}, needs=("output_layout",)),
        Case(
            "slice",
            "tensor",
            options={**BATCH_TIME, "strict_length": False, "pad_output": True},
            needs=("output_layout",),
        ),
        Case(
            "slice",
            "tensor",
            options={**BATCH_TIME, "span": True, "strict_length": False},
            needs=("output_layout",),
        ),
        Case(
            "slice",
            "tensor",
            options={
                **BATCH_TIME,
                "fragmented": True,
                "traj_key": "episode",
                "step_key": "step",
                "end_key": None,
            },
            needs=("output_layout",),
        ),
    ]
    # StreamingSliceSampler: fresh windows, then the uniform fallback.
    cases += [
        Case("streaming", "tensor"),
        Case("streaming", "memmap", fill="wrapped"),
        Case("streaming", "tensor", options={"truncated_key": None}),
        Case("streaming", "tensor", options={"init_key": None}, data={"is_init": False}),
        Case("streaming", "tensor", buffer="plain"),
    ]
    return cases


CASES = _cases()


def require(case: Case, request) -> None:
    """Skips a case this TorchRL cannot run; prioritized cases need the C++ extension."""
    missing = [option for option in case.needs if option not in SLICE_OPTIONS]
    if missing:
        pytest.skip(f"needs a newer TorchRL: SliceSampler has no {', '.join(missing)} here")
    if case.sampler == "streaming" and STREAMING is None:
        pytest.skip("this TorchRL has no StreamingSliceSampler")
    if case.sampler == "prioritized":
        request.getfixturevalue("torchrl_extension")


@pytest.fixture(params=["all fixes", "single_gather alone"])
def fix_set(request):
    """Runs the test with every applied fix, then with ``single_gather`` as the only one.

    The patched source holds every patch: there, only "all fixes" runs.
    """
    if request.param == "all fixes":
        yield request.param
        return
    if reference.UPSTREAM:
        pytest.skip("the patched source holds every patch; fixes cannot be turned off one by one")
    others = [row.name for row in torchrl_fixes.status() if row.applied and row.name != "single_gather"]
    torchrl_fixes.deactivate(*others)
    try:
        yield request.param
    finally:
        if others:
            torchrl_fixes.activate(*others)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_samples_match_stock(case, fix_set, tmp_path, request):
    """Data and info of every sample are exactly the stock ones."""
    require(case, request)
    scenario = sample_scenario(case, tmp_path)
    assert_identical(run_stock(scenario), run_patched(scenario), case.id)


def _count_gathers(rb, entry: Any = ("next", "pixels")) -> int:
    """How many row gathers one ``rb.sample()`` makes from the stored ``entry``."""
    stored = rb.storage._storage
    stored.set(entry, stored.get(entry).as_subclass(GatherCounter), inplace=False)
    try:
        GatherCounter.reset()
        rb.sample()
        return GatherCounter.gathers
    finally:
        stored.set(entry, stored.get(entry).as_subclass(torch.Tensor), inplace=False)


READ_CASES = [
    Case("slice", "tensor"),
    Case("slice", "ndim2"),
    Case("slice", "tensor", fill="wrapped", options={"strict_length": False}),
    Case("slice", "tensor", options={"truncated_key": None}),
    Case("without_replacement", "tensor"),
    Case("prioritized", "tensor"),
    Case("prioritized", "ndim2", options={"strict_length": False}),
    Case("slice", "tensor", options=BATCH_TIME, needs=("output_layout",)),
    Case("slice", "ndim2", options={**BATCH_TIME, "strict_length": False}, needs=("output_layout",)),
    Case("slice", "tensor", options={**BATCH_TIME, "init_key": None}, needs=("output_layout",)),
    Case("without_replacement", "tensor", options=BATCH_TIME, needs=("output_layout",)),
    Case("streaming", "tensor"),
]


@pytest.mark.parametrize("case", READ_CASES, ids=[case.id for case in READ_CASES])
def test_sampled_rows_are_gathered_once(case, request):
    """An entry the sampler does not need is gathered once per sample: by the buffer."""
    require(case, request)
    rb = build_buffer(case, None)
    rb.sample()
    assert _count_gathers(rb) == 1
    assert _count_gathers(rb, "pixels") == 1


@pytest.mark.stock_bug
@pytest.mark.parametrize("case", READ_CASES, ids=[case.id for case in READ_CASES])
def test_stock_gathers_the_sampled_rows_twice(case, request):
    """Stock: the sampler gathers every entry of the sampled rows, then the buffer again."""
    require(case, request)
    reads_rows = case.options.get("truncated_key", ()) is not None or HAS_INIT_MARKER
    if not reads_rows:
        pytest.skip("without truncated_key, this TorchRL's sampler reads no rows")
    with reference.stock():
        rb = build_buffer(case, None)
    rb.sample()
    # built while disabled, the sampler keeps running stock code after the block
    assert _count_gathers(rb) == 2


STREAMING_WRITE_CASES = [
    Case("streaming", "tensor"),
    Case("streaming", "tensor", fill="wrapped"),
    Case("streaming", "tensor", options={"traj_key": "episode", "end_key": None}),
]


def _count_write_gathers(rb, entry: Any = ("next", "pixels")) -> int:
    """How many row gathers one ``rb.extend()`` of 20 rows makes from the stored ``entry``."""
    stored = rb.storage._storage
    stored.set(entry, stored.get(entry).as_subclass(GatherCounter), inplace=False)
    try:
        GatherCounter.reset()
        rb.extend(episodes(20, seed=1))
        return GatherCounter.gathers
    finally:
        stored.set(entry, stored.get(entry).as_subclass(torch.Tensor), inplace=False)


@pytest.mark.parametrize("case", STREAMING_WRITE_CASES, ids=[case.id for case in STREAMING_WRITE_CASES])
def test_streaming_write_reads_only_the_boundary_entries(case, request):
    """StreamingSliceSampler reads the written rows' boundaries on a write, not their images."""
    require(case, request)
    rb = build_buffer(case, None)
    assert _count_write_gathers(rb) == 0
    assert _count_write_gathers(rb, "is_init") == 1
    boundary = "episode" if "traj_key" in case.options else ("next", "done")
    assert _count_write_gathers(rb, boundary) == 1


@pytest.mark.stock_bug
@pytest.mark.parametrize("case", STREAMING_WRITE_CASES, ids=[case.id for case in STREAMING_WRITE_CASES])
def test_stock_streaming_write_gathers_the_written_rows(case, request):
    """Stock: StreamingSliceSampler gathers every entry of the rows just written."""
    require(case, request)
    with reference.stock():
        rb = build_buffer(case, None)
    assert _count_write_gathers(rb) == 1


# The written rows' entries mark_update reads: the done flags (end_key, end_keys),
# the ids (traj_key, or the one it finds: "episode" here) and is_init.
STREAMING_QUEUE_CASES = [
    Case("streaming", "tensor"),
    Case("streaming", "tensor", options={"traj_key": "episode", "end_key": None}),
    Case("streaming", "tensor", options={"end_key": None}),  # the ids it finds
    Case(
        "streaming",
        "tensor",
        options={"end_key": None, "end_keys": [("next", "done"), ("next", "truncated")]},
    ),
    Case("streaming", "tensor", data={"is_init": False}),
    Case("streaming", "memmap", fill="wrapped"),
    Case("streaming", "tensor", buffer="plain"),
]


@pytest.mark.parametrize("case", STREAMING_QUEUE_CASES, ids=[case.id for case in STREAMING_QUEUE_CASES])
def test_streaming_writes_queue_the_stock_windows(case, tmp_path, request):
    """Writes interleaved with samples: the sampler's queue after each write, and the samples, are stock's.

    ``mark_update`` reads the written rows to cut them into windows; its state
    (``state_dict()``: queued windows, the pending rows of an unfinished window,
    the slots' write versions, the last trajectory id and done flag) must be
    stock's after every write. Each write ends inside an episode (its last done
    flag is cleared) and the next one starts a new episode: only ``is_init``
    (and the ids, with a trajectory key) tells the sampler not to join them;
    the wrapped buffer overwrites queued windows.
    """
    require(case, request)

    def scenario():
        rb = build_buffer(case, tmp_path)
        out = [rb._sampler.state_dict()]
        for seed in range(4):
            batch = episodes(30, seed=seed + 10, **case.data)
            batch[("next", "done")][-1] = False
            rb.extend(batch)
            out.append(rb._sampler.state_dict())
            out.append(rb.sample(return_info=True))
        return out

    assert_identical(run_stock(scenario), run_patched(scenario), case.id)


def test_entries_the_info_needs_are_still_read():
    """done, terminated (and is_init, where slice starts are marked) are gathered by the sampler and by the buffer."""
    rb = build_buffer(Case("slice", "tensor"), None)
    rb.sample()
    for entry in (("next", "done"), ("next", "terminated")):
        assert _count_gathers(rb, entry) == 2, entry
    assert _count_gathers(rb, "is_init") == (2 if HAS_INIT_MARKER else 1)


def test_batch_time_reads_only_the_init_flags(request):
    """The batch_time layout builds no done / terminated info: the sampler reads is_init alone."""
    case = Case("slice", "tensor", options=BATCH_TIME, needs=("output_layout",))
    require(case, request)
    rb = build_buffer(case, None)
    sample = rb.sample()
    assert sample.batch_size == (NUM_SLICES, BATCH // NUM_SLICES)
    assert _count_gathers(rb, "is_init") == 2
    for entry in (("next", "done"), ("next", "terminated"), "pixels"):
        assert _count_gathers(rb, entry) == 1, entry


# --- The fixed-length path (TorchRL 0.14 on) ------------------------------------------
# The fix's _finalize_index is 0.14's (main's) with its reads edited, and the
# fixed-length path (fix.FIXED_LENGTH_EDITS) in front of its general path. The
# cases above run both: the fixed-length path builds the info of slices of one
# length, the general path the others. These check that the general path alone is
# exact on every case too (what 0002's reads are without the fixed-length path), and
# which samples the fixed-length path serves.
HAS_FINALIZE_INDEX = "_finalize_index" in vars(SliceSampler)


def finalize_index_builder(fixed_length_info=fix._fixed_length_info, *, fixed_length=True):
    """The fix's ``_finalize_index``, with ``fixed_length_info`` as its fixed-length path, or without one."""
    target = next(t for t in fix.SingleGather.implements if t.path == "SliceSampler._finalize_index")
    with torchrl_fixes.disabled():
        stock = target.stock()
    edits = fix.INFO_BUILDER_EDITS[source_fingerprint(stock)]
    if not fixed_length:
        edits = tuple(edit for edit in edits if edit not in fix.FIXED_LENGTH_EDITS)
    return derive_from_source(
        stock, edits, _read_entries=fix._read_entries, _fixed_length_info=fixed_length_info
    )


def with_builder(rb, builder):
    """``rb``, its sampler building its info with ``builder`` (set on the instance)."""
    rb._sampler._finalize_index = types.MethodType(builder, rb._sampler)
    return rb


needs_finalize_index = pytest.mark.skipif(
    not HAS_FINALIZE_INDEX, reason="the fixed-length path is an edit of _finalize_index (0.14 on)"
)


@reference.runtime_only
@needs_finalize_index
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_general_path_alone_matches_stock(case, tmp_path, request):
    """Without the fixed-length path, the fix's ``_finalize_index`` builds exactly stock's info too."""
    require(case, request)
    general = finalize_index_builder(fixed_length=False)

    patched = sample_scenario(case, tmp_path, lambda rb: with_builder(rb, general))
    assert_identical(run_stock(sample_scenario(case, tmp_path)), run_patched(patched), case.id)


FIXED_LENGTH_SERVES = [
    (Case("slice", "tensor"), True),
    (Case("slice", "ndim2"), True),
    (Case("slice", "memmap", fill="wrapped"), True),
    (Case("slice", "tensor", options={"truncated_key": None}), True),
    (Case("slice", "tensor", options={"truncated_key": None, "init_key": None}), True),
    (Case("without_replacement", "tensor"), True),
    (Case("streaming", "tensor"), True),
    (Case("slice", "tensor", options={"traj_key": "episode", "end_key": None}), True),
    # slices of several lengths, padded slices: the general path
    (Case("slice", "tensor", options={"strict_length": False}), False),
    (Case("slice", "tensor", options={"strict_length": False, "pad_output": True}), False),
    (Case("slice", "tensor", options={**BATCH_TIME}, needs=("output_layout",)), False),
    # another storage than the fix reads directly: the general path
    (Case("slice", "tensor", buffer="rowdecoding"), False),
]


@reference.runtime_only
@needs_finalize_index
@pytest.mark.parametrize(
    "case,serves", FIXED_LENGTH_SERVES, ids=[case.id for case, _ in FIXED_LENGTH_SERVES]
)
def test_fixed_length_path_serves_slices_of_one_length(case, serves, tmp_path, request):
    """The fixed-length path builds the info of samples of slices of one length from a tensor storage; the general path the others."""
    require(case, request)
    built = []

    def spy(*args):
        out = fix._fixed_length_info(*args)
        built.append(out is not None)
        return out

    if case.buffer == "rowdecoding":
        rb = TensorDictReplayBuffer(
            storage=RowDecodingStorage(CAPACITY),
            sampler=SliceSampler(num_slices=NUM_SLICES, end_key=("next", "done")),
            batch_size=BATCH,
        )
        rb.extend(episodes(150))
    else:
        rb = build_buffer(case, tmp_path)
    with_builder(rb, finalize_index_builder(spy))
    for _ in range(SAMPLES):
        rb.sample()
    # served: every sample; else none (the path declines, or is not asked)
    assert (len(built) == SAMPLES and all(built)) if serves else not any(built), built


@pytest.mark.parametrize("storage", ["tensor", "memmap", "ndim2"])
@pytest.mark.parametrize("fill", ["partial", "full", "wrapped"])
def test_read_entries_is_the_full_read_restricted_to_the_keys(storage, fill, tmp_path):
    """``_read_entries`` holds exactly what ``storage[index]`` holds under the keys asked."""
    case = Case("slice", storage, fill=fill)
    rb = build_buffer(case, tmp_path)
    index, _ = rb._sampler.sample(rb.storage, BATCH)
    keys = [("next", "done"), ("next", "terminated"), "is_init", ("not", "stored"), None]
    full = rb.storage[index]
    entries = fix._read_entries(rb.storage, index, keys)
    expected = full.select(*[key for key in keys if key is not None], strict=False)
    assert_identical(expected, entries)
    assert "pixels" not in entries.keys()
    # a key that names a sub-TensorDict reads all of it
    assert_identical(full.select("next"), fix._read_entries(rb.storage, index, ["next"]))


class RowDecodingStorage(LazyTensorStorage):
    """A storage of one's own that changes how rows are read: the fix must not bypass it.

    It stores ``terminated`` inverted and inverts it back on every read, so a
    sampler reading the stored tensors directly would see other flags.
    """

    def set(self, cursor, data, *args, **kwargs):
        data = data.clone(False)
        data.set(("next", "terminated"), ~data.get(("next", "terminated")))
        return super().set(cursor, data, *args, **kwargs)

    def get(self, index):
        rows = super().get(index)
        rows.set(("next", "terminated"), ~rows.get(("next", "terminated")))
        return rows


def test_storage_that_reads_rows_its_own_way_keeps_the_stock_read(tmp_path):
    """A storage overriding ``get`` gets ``storage[index]``, so its rows match stock."""

    def scenario():
        data = episodes(150)
        rb = TensorDictReplayBuffer(
            storage=RowDecodingStorage(CAPACITY),
            sampler=SliceSampler(num_slices=NUM_SLICES, end_key=("next", "done")),
            batch_size=BATCH,
        )
        rb.extend(data)
        return [rb.sample(return_info=True) for _ in range(SAMPLES)]

    assert_identical(run_stock(scenario), run_patched(scenario))
    storage = RowDecodingStorage(CAPACITY)
    storage.set(range(10), episodes(10))
    assert not fix._reads_tensordict(storage)
    assert fix._reads_tensordict(LazyTensorStorage(CAPACITY)) is False  # not initialized
    plain = LazyTensorStorage(CAPACITY)
    plain.set(range(10), episodes(10))
    assert fix._reads_tensordict(plain)


@reference.runtime_only
def test_changed_target_is_skipped_not_half_applied(monkeypatch):
    """A slice sampler whose info code is not the stock one: skipped, nothing of the fix installed."""
    name = "_finalize_index" if "_finalize_index" in vars(SliceSampler) else "_get_index"

    def rewritten(self, *args, **kwargs):
        return "an upstream rewrite"

    with torchrl_fixes.disabled(), monkeypatch.context() as patch:
        stock_sample = vars(PrioritizedSliceSampler)["sample"]
        patch.setattr(SliceSampler, name, rewritten)
        registry = Registry(ALL_FIXES)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            registry.activate("single_gather")
        row = registry.status()["single_gather"]
        assert row.state == "skipped"
        assert row.reason.startswith(f"target changed: SliceSampler.{name} is not the code")
        assert any(issubclass(w.category, torchrl_fixes.FixSkippedWarning) for w in caught)
        assert vars(SliceSampler)[name] is rewritten
        assert vars(PrioritizedSliceSampler)["sample"] is stock_sample


@reference.runtime_only
def test_changed_storage_read_is_skipped(monkeypatch):
    """If ``TensorStorage.get`` changes, the fix no longer knows what a read returns: skipped."""
    from torchrl.data.replay_buffers.storages import TensorStorage

    def get(self, index):
        return "an upstream rewrite"

    with torchrl_fixes.disabled(), monkeypatch.context() as patch:
        patch.setattr(TensorStorage, "get", get)
        registry = Registry(ALL_FIXES)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            registry.activate("single_gather")
        row = registry.status()["single_gather"]
        assert row.state == "skipped"
        assert row.reason.startswith("target changed: TensorStorage.get")


@reference.runtime_only
def test_plan_replaces_the_release_s_info_builder():
    """The fix replaces the method that builds the info on this release, and PrioritizedSliceSampler.sample."""
    name = "_finalize_index" if "_finalize_index" in vars(SliceSampler) else "_get_index"
    assert torchrl_fixes.is_object_patched(SliceSampler, name)
    assert torchrl_fixes.is_object_patched(PrioritizedSliceSampler, "sample")
    other = {"_finalize_index": "_get_index", "_get_index": "_finalize_index"}[name]
    assert not torchrl_fixes.is_object_patched(SliceSampler, other)
    assert not torchrl_fixes.is_object_patched(SliceSampler, "_maybe_emit_init_marker")


def test_case_matrix_covers_the_issue():
    """The scenarios cover every configuration the fix must keep identical."""
    ids = " ".join(case.id for case in CASES)
    for sampler in SAMPLERS:
        assert f"{sampler}-ndim2" in ids and f"{sampler}-memmap" in ids
    for needle in (
        "output_layout=batch_time",
        "streaming-",
        "truncated_key=('agent', 'truncated')",
        "truncated_key=truncated",
        "truncated_key=None",
        "init_key=None",
        "terminated=False",
        "is_init=False",
        "pad_output=True",
        "strict_length=False",
        "-wrapped-",
        "-plain[",
    ):
        assert needle in ids, needle
