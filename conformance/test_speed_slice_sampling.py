"""Speed of ``SliceSampler``: stock TorchRL against ``torchrl_fixes``, on the same data.

Every scenario is one benchmark that times stock and patched TorchRL in turn: the
stock buffer is built inside :func:`conformance.reference.stock` (so it stays a stock
buffer), the patched one with the fixes active, both are filled with the same rows
and live side by side, and each round times the operation the benchmark names on
one, then the other, in alternating order, so that a load that comes and goes on
the machine hits both alike. The two medians are in the benchmark's ``extra_info``
(``stock_median_s``, ``patched_median_s``, ``variant`` ``"pair"``); their ratio,
not the absolute times, is what the project quotes.

Groups:

- ``seed_table``: one ``rb.sample()`` of 256 slices of length 4 without the value
  cache, on a buffer holding only what the sampler reads (the issue's table), with
  its floors; ``seed_table sample-after-write`` is the same sample right after a
  1,000-row write.
- ``online step`` / ``online sample-after-write`` / ``online extend``: the online
  loop (write 1,000 rows, sample 2,048 as 32 slices, value cache on);
  ``online sample-without-write`` is the same sample with no write before it.
- ``tdmpc2 loop``: TD-MPC2's buffer, 50 samples then one 500-step episode written.
- ``cold first sample``: the first sample of a buffer just filled; ``unnamed`` rows
  store ids and done flags and the sampler names no key.
- ``extend room`` / ``extend wrap``: one write of 1,000 rows, into free room or over
  the oldest rows of a full buffer.
- ``sweep sample-after-write``: a sample of 2,048 online rows as 64 slices of 32
  right after a write, at one stored size, in 3,200-, 320- and 32-step episodes
  (100x more trajectories), with its floors.
- ``use_gpu sample-after-write``: the online sample after a write by a
  ``SliceSampler(use_gpu=True)`` (the CPU where there is no accelerator, a GPU
  over this CPU storage where there is one), with its floors.
- ``without_replacement``, ``span sample-after-write``, ``not_strict
  sample-after-write``: SliceSampler's siblings (64 slices of 4, done flags, 10-step
  episodes), with their floors: ``SliceSamplerWithoutReplacement`` on a static
  buffer, ``SliceSampler(span=True)`` and ``SliceSampler(strict_length=False)``
  right after a write.
- ``prioritized sample-after-write``: ``PrioritizedSliceSampler`` (64 slices of 4,
  done flags) right after a write, in a full buffer of 1,000- and 100-step episodes,
  where TorchRL's C++ extension loads; its floor is a ``PrioritizedSampler`` sample of
  the same batch (``floor_median_s``).

The floors, timed in the same rounds as the two variants, on the patched buffer's
storage: a ``RandomSampler`` sample of the same batch (``floor_median_s``: what
TorchRL's sampling costs with no trajectory to find), and the gather of the sample's
own rows, ``storage[index]`` with an index the patched sampler drew
(``gather_floor_median_s``: what reading the rows costs, so that the patched median
over it is what the sampler adds). Where the sample follows a write, each floor
follows a write of its own too. Stock opens each round, and patched and the floors
take turns right after it (``conformance/timing_in_turn.py``): stock's pass over the
whole storage leaves the caches cold for whatever comes next, and each of them
meets that as often as the others.

Sizes come from ``--slice-scale`` (``ci``, ``report``, ``full``); the cases of each
scale, and the memory it needs, are in ``conformance/speed_sizes.py``. Every test here is
marked ``speed``; deselect them with ``-m "not speed"``. With ``--benchmark-disable``
each timed operation runs once. ``conformance/speed_report.py`` turns the
``--benchmark-json`` output into a stock / patched table.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Mapping

import pytest
import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    Storage,
    TensorDictReplayBuffer,
)

import torchrl_fixes
from conformance import reference, timing_in_turn
from conformance.host_memory import available_memory
from conformance.slice_scenarios import tdmpc2_buffer
from conformance.speed_rows import case_rows
from conformance.speed_sizes import (
    COLD,
    EXTEND,
    FAMILY,
    FAMILY_OPERATIONS,
    ONLINE,
    SEED_TABLE,
    SWEEP,
    TDMPC2,
    USE_GPU,
    Case,
    GiB,
    cases_at,
)
from conformance.timing_in_turn import Floor

pytestmark = [pytest.mark.speed, pytest.mark.usefixtures("slice_threads")]

VARIANTS = timing_in_turn.VARIANTS
FILL_CHUNK = 5_000_000
WRITE = 1_000
TDMPC2_SAMPLES_PER_EPISODE = 50


def _params(cases: list[Case]) -> list:
    return [pytest.param(case, id=case.id) for case in cases]


def pytest_generate_tests(metafunc):
    scale = metafunc.config.getoption("--slice-scale")
    for name, cases in (
        ("seed_table_pair", SEED_TABLE),
        ("online_pair", ONLINE),
        ("tdmpc2_pair", TDMPC2),
        ("extend_pair", EXTEND),
        ("cold_case", COLD),
        ("sweep_pair", SWEEP),
        ("use_gpu_pair", USE_GPU),
        ("family_pair", FAMILY),
    ):
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, _params(cases_at(cases, scale)), indirect=True)


# --- data -------------------------------------------------------------------------


def _key_kwargs(case: Case) -> dict:
    if case.key == "unnamed":
        return {}
    if case.key == "episode":
        return {"traj_key": "episode"}
    return {"end_key": ("next", "done")}


def _make_buffer(case: Case, device: torch.device):
    if case.layout == "seed":
        sampler = SliceSampler(
            num_slices=256, truncated_key=None, cache_values=False, **_key_kwargs(case)
        )
        return ReplayBuffer(
            storage=LazyTensorStorage(case.capacity), sampler=sampler, batch_size=1024
        )
    if case.layout == "online":
        if case.mode == "use_gpu":
            sampler = SliceSampler(
                num_slices=32, cache_values=True, use_gpu=True, **_key_kwargs(case)
            )
        else:
            sampler = SliceSampler(num_slices=32, cache_values=True, **_key_kwargs(case))
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(case.capacity, device=device),
            sampler=sampler,
            batch_size=2048,
        )
    if case.layout == "sweep":
        sampler = SliceSampler(num_slices=64, cache_values=True, **_key_kwargs(case))
        return TensorDictReplayBuffer(
            storage=LazyTensorStorage(case.capacity, device=device),
            sampler=sampler,
            batch_size=2048,
        )
    if case.layout == "tdmpc2":
        return tdmpc2_buffer(case.capacity)
    if case.layout == "family":
        return ReplayBuffer(
            storage=LazyTensorStorage(case.capacity), sampler=_family_sampler(case), batch_size=256
        )
    raise ValueError(case.layout)


def _family_sampler(case: Case):
    """The sibling of ``SliceSampler`` that ``case.mode`` names, drawing 64 slices."""
    kwargs = {"num_slices": 64, "truncated_key": None, **_key_kwargs(case)}
    if case.mode == "without_replacement":
        return SliceSamplerWithoutReplacement(**kwargs)
    if case.mode == "span":
        return SliceSampler(span=True, **kwargs)
    if case.mode == "not_strict":
        return SliceSampler(strict_length=False, **kwargs)
    if case.mode == "prioritized":
        return PrioritizedSliceSampler(case.capacity, alpha=0.7, beta=0.5, **kwargs)
    raise ValueError(case.mode)


def _require_memory(case: Case, buffers: int = 1) -> None:
    needed = case.memory_needed(buffers)
    available = available_memory()
    if available is not None and available < needed:
        pytest.skip(
            f"{case.scenario('buffer')} needs about {needed / GiB:.1f} GiB of memory "
            f"for {buffers} buffer(s), {available / GiB:.1f} GiB is available"
        )


class Filled:
    """A buffer of one variant filled with ``case.stored`` rows, and where the stream is.

    ``device`` is the storage's device in the online and sweep layouts.
    """

    def __init__(self, case: Case, variant: str, device: torch.device):
        self.case = case
        self.variant = variant
        self.device = device
        if variant == "stock":
            with reference.stock():
                self.rb = _make_buffer(case, device)
        else:
            self.rb = _make_buffer(case, device)
        self.pos = 0
        while self.pos < case.stored:
            self.rb.extend(self.next_rows(min(FILL_CHUNK, case.stored - self.pos)))
        if case.mode == "wrap":
            # Half an episode more than the buffer holds: the write cursor then sits
            # mid-episode, and every later write overwrites parts of two old episodes.
            self.rb.extend(self.next_rows(case.episode_len // 2))

    def next_rows(self, n: int) -> TensorDict:
        rows = case_rows(self.case, self.pos, n)
        self.pos += n
        return rows

    def sample(self):
        """``rb.sample()``, finished on the device: the time a sample takes."""
        return _on_device(self.rb.sample, self.device)()


def _on_device(operation: Callable, device: torch.device) -> Callable:
    """``operation`` that waits for ``device`` to finish what it queued."""
    if device.type != "cuda":
        return operation

    def synchronized(*args, **kwargs):
        out = operation(*args, **kwargs)
        torch.cuda.synchronize(device)
        return out

    return synchronized


def _filled_pair(request):
    """Both variants' buffers of ``request.param``, filled and sampled once."""
    case = request.param
    _require_memory(case, buffers=len(VARIANTS))
    device = torch.device(request.config.getoption("--slice-device"))
    pair = {}
    try:
        for variant in VARIANTS:
            pair[variant] = Filled(case, variant, device)
            pair[variant].rb.sample()
        yield pair
    finally:
        pair.clear()
        gc.collect()


@pytest.fixture(scope="module")
def seed_table_pair(request):
    """Seed-table buffers, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def online_pair(request):
    """Online-loop buffers, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def tdmpc2_pair(request):
    """TD-MPC2-shaped buffers, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def extend_pair(request):
    """Buffers for the write benchmarks, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def sweep_pair(request):
    """Buffers of the episode-length sweep, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def use_gpu_pair(request):
    """Online buffers whose sampler has ``use_gpu=True``, stock and patched, filled and sampled once."""
    yield from _filled_pair(request)


@pytest.fixture(scope="module")
def family_pair(request):
    """Buffers whose sampler is one of SliceSampler's siblings, stock and patched, filled
    and sampled once."""
    if request.param.mode == "prioritized":
        request.getfixturevalue("torchrl_extension")
    yield from _filled_pair(request)


@pytest.fixture
def cold_case(request):
    """A case whose benchmark builds a fresh buffer of each variant every round."""
    return request.param


def _describe(benchmark, case: Case, operation: str) -> None:
    benchmark.group = case.scenario(operation)
    benchmark.extra_info.update(
        scenario=case.scenario(operation),
        operation=operation,
        stored=case.stored,
        capacity=case.capacity,
        key=case.key,
        episode_len=case.episode_len,
        torch=torch.__version__,
        torchrl=torchrl.__version__,
        applied=list(_applied()),
    )


def _applied():
    if reference.UPSTREAM:
        return (name for name in reference.FIX_NAMES if reference.in_effect(name))
    return (row.name for row in torchrl_fixes.status() if row.state == "applied")


def time_in_turn(
    benchmark,
    case: Case,
    operation: str,
    timed: Callable[[str], None],
    *,
    setup: Callable[[str], None] | None = None,
    warmup_rounds: int = 1,
    floors: Mapping[str, Floor | Callable[[], None]] | None = None,
) -> dict[str, float]:
    """:func:`conformance.timing_in_turn.time_in_turn` for ``case``, described for the report."""
    _describe(benchmark, case, operation)
    return timing_in_turn.time_in_turn(
        benchmark, timed, rounds=case.rounds, setup=setup, warmup_rounds=warmup_rounds,
        floors=floors,
    )


# --- 1. seed table ---------------------------------------------------------------


def test_seed_table_sample(benchmark, seed_table_pair):
    """One ``rb.sample()`` (256 slices of 4, no value cache) on a static filled buffer.

    The issue's table: stock rebuilds the trajectory boundaries from every stored row
    on each call, so its time grows with the stored size (and, for episode ids, with
    the capacity); the index keeps the patched time flat. The floors, timed in the
    same rounds on the patched buffer's storage: a ``RandomSampler`` sample of the
    same 1,024 rows, and the gather of the 1,024 rows the patched sampler drew.
    """
    _time_static_sample_with_floors(benchmark, seed_table_pair, "seed_table")


def test_seed_table_sample_after_write(benchmark, seed_table_pair):
    """The seed table's sample right after a write of 1,000 rows (untimed), and its floors."""
    _time_sample_after_write_with_floors(benchmark, seed_table_pair, "seed_table sample-after-write")


# --- 2. online loop ----------------------------------------------------------------


def _write(pair):
    def write(variant):
        filled = pair[variant]
        filled.rb.extend(filled.next_rows(WRITE))

    return write


def test_online_step(benchmark, online_pair):
    """One online step: ``extend`` 1,000 new rows, then ``sample`` 2,048 rows as 32 slices.

    The value cache is on; stock drops it on every write, so each step pays a full
    boundary rebuild. The rows to write are made before the timer starts.
    """
    pair = online_pair
    rows = {}

    def make_rows(variant):
        rows[variant] = pair[variant].next_rows(WRITE)

    def step(variant):
        pair[variant].rb.extend(rows.pop(variant))
        pair[variant].rb.sample()

    time_in_turn(benchmark, pair["stock"].case, "online step", step, setup=make_rows)


def test_online_sample_after_write(benchmark, online_pair):
    """The ``sample`` of an online step alone: 1,000 rows are written (untimed) before each."""
    pair = online_pair
    time_in_turn(
        benchmark,
        pair["stock"].case,
        "online sample-after-write",
        lambda v: pair[v].sample(),
        setup=_write(pair),
    )


def test_online_sample_without_write(benchmark, online_pair):
    """The same ``sample`` with no write before it: stock's value cache serves it.

    The floor for the sample after a write: what TorchRL's sampling costs when the
    boundaries are already known.
    """
    pair = online_pair
    time_in_turn(
        benchmark, pair["stock"].case, "online sample-without-write", lambda v: pair[v].rb.sample()
    )


def test_sweep_sample_after_write(benchmark, sweep_pair):
    """A sample right after a write, at one stored size in shorter and shorter episodes.

    1,000 rows are written (untimed) before each sample. The floors, timed in the
    same rounds on the patched buffer's storage: a ``RandomSampler`` sample of the
    same 2,048 rows, what TorchRL's sampling costs with no trajectory to find, and
    the gather of the 2,048 rows the patched sampler drew, what reading them costs.
    """
    _time_sample_after_write_with_floors(benchmark, sweep_pair, "sweep sample-after-write")


def test_use_gpu_sample_after_write(benchmark, use_gpu_pair):
    """The online sample right after a write by a ``SliceSampler(use_gpu=True)``, and its floors."""
    _time_sample_after_write_with_floors(benchmark, use_gpu_pair, "use_gpu sample-after-write")


def test_family_sample(benchmark, family_pair):
    """A sample (64 slices of 4, done flags, 10-step episodes) by one of SliceSampler's
    siblings, and its floors.

    ``without_replacement``: a ``SliceSamplerWithoutReplacement`` on a static buffer;
    it draws a new permutation of the trajectories whenever their number changes,
    as stock does, so only a buffer without writes times the sample alone. ``span``
    and ``not_strict``: ``SliceSampler(span=True)`` and
    ``SliceSampler(strict_length=False)``, whose slices have several lengths, right
    after a write of 1,000 rows (untimed), each floor after a write of its own.
    """
    operation = FAMILY_OPERATIONS[family_pair["stock"].case.mode]
    if operation.endswith("sample-after-write"):
        _time_sample_after_write_with_floors(benchmark, family_pair, operation)
    else:
        _time_static_sample_with_floors(benchmark, family_pair, operation)


def _batch_size(rb) -> int:
    """``rb``'s batch size (``rb.batch_size``, which TorchRL 0.8 does not have)."""
    return getattr(rb, "batch_size", None) or rb._batch_size


def _floor_sample(pair, sampler) -> Callable[[], None]:
    """``sample()`` of a buffer of the patched buffer's class, over its storage and with
    its batch size, drawn by ``sampler`` (sampled once), finished on the device."""
    patched = pair["patched"]
    rb = type(patched.rb)(
        storage=patched.rb.storage, sampler=sampler, batch_size=_batch_size(patched.rb)
    )
    rb.sample()
    return _on_device(rb.sample, patched.device)


def _prioritized_floor(pair) -> Callable[[], None]:
    """The floor of a prioritized slice sample: a ``PrioritizedSampler`` sample of the
    same batch from the patched buffer's storage, every stored row at priority 1."""
    storage = pair["patched"].rb.storage
    sampler = PrioritizedSampler(pair["patched"].case.capacity, alpha=0.7, beta=0.5)
    sampler.update_priority(torch.arange(len(storage)), 1.0)
    return _floor_sample(pair, sampler)


def _random_floor(pair) -> Callable[[], None]:
    """The floor of a pair's sample: a ``RandomSampler`` sample of the same batch from
    the patched buffer's storage, by a buffer of the same class (what TorchRL's
    sampling costs with no trajectory to find), finished on the device."""
    return _floor_sample(pair, RandomSampler())


def _gather_floor(pair) -> Floor:
    """The gather floor of a pair's sample: ``storage[index]``, the read of the rows that
    the patched sampler drew, finished on the device.

    Before each turn (untimed) the patched buffer's sampler draws an index as the
    buffer's ``sample()`` has it draw one, ``rb.sampler.sample(rb.storage,
    rb.batch_size)``, moved to the storage's device as the buffer moves it; the turn
    times ``rb.storage[index]``, which is ``rb.storage.get(index)``, the buffer's own
    read of those rows. The patched median over this one is then what the sampler,
    and the rest of ``sample()``, cost on top of reading the rows.

    A draw of its own keeps the timed patched sample the plain ``rb.sample()`` it is
    without this floor (taking the index out of it would add a call to each timed
    patched turn), and gives an index of the same round whichever turn comes first:
    every other round, the floors take their turns before the variants. As in
    ``sample()``, the rows are read right after the draw, which touches only what
    the sampler reads of them.
    """
    patched = pair["patched"]
    rb = patched.rb
    drawn = {}

    def draw_index():
        index, _ = rb.sampler.sample(rb.storage, _batch_size(rb))
        drawn["index"] = _on_storage_device(index, rb.storage)

    def read_rows():
        rb.storage[drawn["index"]]

    draw = _on_device(draw_index, patched.device)
    gather = _on_device(read_rows, patched.device)
    draw()
    gather()
    return Floor(timed=gather, setup=draw)


def _on_storage_device(index, storage: Storage):
    """``index`` (a tensor or a tuple of them) on ``storage``'s device, as the buffer
    gathers it: a ``use_gpu`` sampler may draw on another device."""
    device = getattr(storage, "device", None)
    if device is None or device == "auto":
        return index
    if isinstance(index, tuple):
        return tuple(_on_storage_device(item, storage) for item in index)
    return index.to(device) if isinstance(index, torch.Tensor) else index


def _floors(pair, *, after_write: bool = False) -> dict[str, Floor | Callable[[], None]]:
    """The floors of a pair's sample, by the names the report reads.

    ``after_write``: each floor's turn follows a write of its own into the patched
    buffer (untimed), as the sample it is the floor of follows one.
    """
    case = pair["patched"].case
    if case.mode == "prioritized":
        floor = _prioritized_floor(pair)
    else:
        floor = _random_floor(pair)
    floors = {"floor": Floor(floor), "gather_floor": _gather_floor(pair)}
    if not after_write:
        return floors
    write = _write(pair)

    def written_first(floor: Floor) -> Floor:
        def setup():
            write("patched")
            if floor.setup is not None:
                floor.setup()

        return Floor(timed=floor.timed, setup=setup)

    return {name: written_first(floor) for name, floor in floors.items()}


def _time_static_sample_with_floors(benchmark, pair, operation: str) -> None:
    """Times a sample of a buffer that nothing writes to, and its floors, in the same rounds."""
    time_in_turn(
        benchmark,
        pair["stock"].case,
        operation,
        lambda v: pair[v].rb.sample(),
        floors=_floors(pair),
    )


def _time_sample_after_write_with_floors(benchmark, pair, operation: str) -> None:
    """Times a sample after an untimed 1,000-row write, and its floors, each after a
    write of its own, in the same rounds."""
    time_in_turn(
        benchmark,
        pair["stock"].case,
        operation,
        lambda v: pair[v].sample(),
        setup=_write(pair),
        floors=_floors(pair, after_write=True),
    )


def test_online_extend(benchmark, online_pair):
    """The ``extend`` of an online step alone: 1,000 rows, writes back to back, no sample."""
    pair = online_pair
    rows = {}

    def make_rows(variant):
        rows[variant] = pair[variant].next_rows(WRITE)

    time_in_turn(
        benchmark,
        pair["stock"].case,
        "online extend",
        lambda v: pair[v].rb.extend(rows.pop(v)),
        setup=make_rows,
    )


# --- 3. TD-MPC2 loop ---------------------------------------------------------------


def test_tdmpc2_loop(benchmark, tdmpc2_pair):
    """One episode of a TD-MPC2 learner: 50 samples (256 slices of 4), then one 500-step episode.

    The sampler is TD-MPC2's (episode ids, no value cache, strict length). A round is
    the whole loop; ``extra_info`` also gives the median per sample (round / 50).
    """
    pair = tdmpc2_pair
    case = pair["stock"].case
    episodes = {}

    def make_episode(variant):
        episodes[variant] = pair[variant].next_rows(case.episode_len)

    def loop(variant):
        rb = pair[variant].rb
        for _ in range(TDMPC2_SAMPLES_PER_EPISODE):
            rb.sample()
        rb.extend(episodes.pop(variant))

    medians = time_in_turn(benchmark, case, "tdmpc2 loop", loop, setup=make_episode)
    benchmark.extra_info["samples_per_round"] = TDMPC2_SAMPLES_PER_EPISODE
    for variant, median in medians.items():
        benchmark.extra_info[f"{variant}_per_sample_median_s"] = median / TDMPC2_SAMPLES_PER_EPISODE


# --- 4. cold build ------------------------------------------------------------------


def test_cold_first_sample(benchmark, cold_case):
    """The first ``rb.sample()`` of a buffer just filled with ``stored`` rows.

    Each round builds and fills a fresh buffer of each variant (untimed, one alive at
    a time), then times its first sample: for the patched build, what the index
    costs before it is warm; for stock, one sample without the value cache, which is
    what every stock sample costs.
    """
    case = cold_case
    _require_memory(case)
    current = {}

    def build(variant):
        current.clear()
        gc.collect()
        current[variant] = Filled(case, variant, torch.device("cpu"))

    try:
        time_in_turn(
            benchmark,
            case,
            "cold first sample",
            lambda v: current[v].rb.sample(),
            setup=build,
            warmup_rounds=0,
        )
    finally:
        current.clear()
        gc.collect()


# --- 5. extend alone ----------------------------------------------------------------


def test_extend(benchmark, extend_pair):
    """One ``extend`` of 1,000 rows that follows a sample, as in an online loop.

    ``room``: the buffer has free capacity. ``wrap``: the buffer is full and its write
    cursor sits mid-episode, so each write overwrites the end of one old episode and
    the start of the next. The sample and the making of the rows before each write
    are untimed. The fix may cost at most 10% here.
    """
    pair = extend_pair
    case = pair["stock"].case
    rows = {}

    def sample_then_make_rows(variant):
        pair[variant].rb.sample()
        rows[variant] = pair[variant].next_rows(WRITE)

    time_in_turn(
        benchmark,
        case,
        f"extend {case.mode}",
        lambda v: pair[v].rb.extend(rows.pop(v)),
        setup=sample_then_make_rows,
        warmup_rounds=5,
    )
