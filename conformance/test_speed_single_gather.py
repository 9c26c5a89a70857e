"""Speed of slice sampling against random sampling on image rows, stock and patched.

Each buffer holds rows of two 3x64x64 uint8 images (``pixels`` and
``("next", "pixels")``), six float actions and done / terminated flags, with
500-step episodes, the shape of ``repro/pixel_gather.py``. A timed call is one
``rb.sample()`` of 2,048 rows: as 32 slices (``SliceSampler``, value cache on) or
as random rows (``RandomSampler``). The sampler's own work is tiny, so both cost
about one gather of the sampled rows; stock ``SliceSampler`` gathers them twice.

All four benchmarks (stock / patched x slice / random) share one pytest-benchmark
group. The stock slice and random buffers are built and filled inside
:func:`conformance.reference.stock`, so they keep running stock code; the two buffers
of a variant share one storage, so they read the same memory. Each slice
benchmark records in ``extra_info``:

- ``slice_over_random``: its median over the median of the random benchmark of
  the same variant, from the same run;
- ``slice_over_random_interleaved``: the same ratio measured with slice and random
  samples taken in turn (``PAIRS`` of each), which a load that comes and goes on
  the machine affects alike.

Both ratios are printed at the end of the module. ``test_sample_image_rows_in_turn``
then times each sampler's sample on stock and patched buffers side by side, in
turn, for the stock / patched table of ``conformance/speed_report.py``.

``test_fixed_length_path`` times the fix's fixed-length path against its general
path (see its docstring): the measurement that keeps it in the fix.

Stored rows: 20,000 (about 0.5 GB per variant) by default; ``--slice-scale report``
or ``full`` stores 200,000 (about 5 GB per variant; skipped, saying so, when the
memory is not available). ``--slice-threads N`` sets torch's thread count. One
variant's storage is alive at a time. Every test here is marked ``speed``;
deselect them with ``-m "not speed"``.
"""
from __future__ import annotations

import gc
import statistics
import time
import types

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)

import torchrl_fixes
from conformance import reference
from conformance.host_memory import available_memory
from conformance.timing_in_turn import time_in_turn
from torchrl_fixes._core.patching import derive_from_source
from torchrl_fixes._core.source_fingerprint import source_fingerprint
from torchrl_fixes.fixes import single_gather

pytestmark = pytest.mark.speed

STORED = {"ci": 20_000, "report": 200_000, "full": 200_000}
ROUNDS = {"ci": 40, "report": 20, "full": 20}
PAIRS = {"ci": 40, "report": 20, "full": 20}
BATCH = 2_048
NUM_SLICES = 32
EPISODE_LEN = 500
FILL_CHUNK = 5_000
ROW_BYTES = 2 * 3 * 64 * 64 + 6 * 4 + 2
# Timed in this order, so each slice benchmark finds the random one of its variant.
RUNS = [("stock", "random"), ("stock", "slice"), ("patched", "random"), ("patched", "slice")]


def _scale(config) -> str:
    # --slice-scale and --slice-threads are registered by conformance/conftest.py
    return config.getoption("--slice-scale", default="ci")


def image_rows(start: int, stop: int) -> TensorDict:
    """Rows ``start`` to ``stop`` of the stream: zero images, episodes of 500 steps."""
    n = stop - start
    done = ((torch.arange(start, stop) + 1) % EPISODE_LEN == 0).unsqueeze(-1)
    return TensorDict(
        {
            "pixels": torch.zeros(n, 3, 64, 64, dtype=torch.uint8),
            ("next", "pixels"): torch.zeros(n, 3, 64, 64, dtype=torch.uint8),
            "action": torch.zeros(n, 6),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        [n],
    )


def build_buffers(stored: int) -> dict[str, TensorDictReplayBuffer]:
    """A slice buffer and a random buffer on one storage of ``stored`` image rows."""
    storage = LazyTensorStorage(stored)
    slice_rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=SliceSampler(num_slices=NUM_SLICES, end_key=("next", "done"), cache_values=True),
        batch_size=BATCH,
    )
    for start in range(0, stored, FILL_CHUNK):
        slice_rb.extend(image_rows(start, min(start + FILL_CHUNK, stored)))
    random_rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=BATCH)
    return {"slice": slice_rb, "random": random_rb}


@pytest.fixture(scope="module", autouse=True)
def threads(request):
    """Applies ``--slice-threads`` (torch.set_num_threads) for the module, then puts it back."""
    wanted = request.config.getoption("--slice-threads", default=None)
    before = torch.get_num_threads()
    if wanted:
        torch.set_num_threads(wanted)
    yield torch.get_num_threads()
    torch.set_num_threads(before)


class Variants:
    """The buffers of one variant at a time; asking for the other frees the first."""

    def __init__(self, stored: int):
        self.stored = stored
        self._variant: str | None = None
        self._buffers: dict[str, TensorDictReplayBuffer] = {}

    def get(self, variant: str) -> dict[str, TensorDictReplayBuffer]:
        if variant != self._variant:
            self._buffers = {}
            gc.collect()
            if variant == "stock":
                with reference.stock():
                    self._buffers = build_buffers(self.stored)
            else:
                self._buffers = build_buffers(self.stored)
            self._variant = variant
            for rb in self._buffers.values():
                rb.sample()  # the slice sampler fills its value cache here
        return self._buffers

    def clear(self) -> None:
        self._buffers = {}
        self._variant = None
        gc.collect()


@pytest.fixture(scope="module")
def variants(request):
    scale = _scale(request.config)
    stored = STORED[scale]
    needed = stored * ROW_BYTES * 3 // 2
    available = available_memory()
    if available is not None and available < needed:
        pytest.skip(f"needs about {needed / 2**30:.1f} GiB of available memory")
    found = Variants(stored)
    yield found
    found.clear()


@pytest.fixture(scope="module")
def medians() -> dict[tuple[str, str], float]:
    """(variant, sampler) -> median seconds of its benchmark in this run."""
    return {}


@pytest.fixture(scope="module")
def ratios(request):
    """variant -> (median ratio, interleaved ratio); printed at the end of the module."""
    found: dict[str, tuple[float, float]] = {}
    yield found
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if not found or reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(
            f"single gather, slice / random sampling of 2,048 image rows "
            f"({STORED[_scale(request.config)]:,} stored, {torch.get_num_threads()} threads):"
        )
        for variant, (ratio, interleaved) in found.items():
            reporter.write_line(
                f"  {variant:8s} ratio of medians {ratio:.2f}  interleaved {interleaved:.2f}"
            )


def interleaved_ratio(buffers: dict[str, TensorDictReplayBuffer], pairs: int) -> float:
    """Median slice time over median random time, the two sampled in turn."""
    times: dict[str, list[float]] = {"slice": [], "random": []}
    for _ in range(pairs):
        for name in ("random", "slice"):
            start = time.perf_counter()
            buffers[name].sample()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["slice"]) / statistics.median(times["random"])


@pytest.mark.parametrize(("variant", "sampler"), RUNS, ids=[f"{v}-{s}" for v, s in RUNS])
def test_sample_image_rows(benchmark, variants, medians, ratios, request, variant, sampler):
    """One ``rb.sample()`` of 2,048 image rows, as 32 slices or as random rows."""
    scale = _scale(request.config)
    buffers = variants.get(variant)
    benchmark.group = f"single gather: sample 2,048 image rows, {variants.stored:,} stored"
    # No "scenario": the stock / patched table takes these rows from the benchmark
    # below, which times both variants in turn.
    benchmark.extra_info.update(variant=variant, sampler=sampler)
    benchmark.pedantic(buffers[sampler].sample, rounds=ROUNDS[scale], warmup_rounds=2)
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable
        return
    medians[variant, sampler] = statistics.median(stats.stats.data)
    if sampler == "slice" and (variant, "random") in medians:
        ratio = medians[variant, "slice"] / medians[variant, "random"]
        interleaved = interleaved_ratio(buffers, PAIRS[scale])
        benchmark.extra_info["slice_over_random"] = round(ratio, 3)
        benchmark.extra_info["slice_over_random_interleaved"] = round(interleaved, 3)
        ratios[variant] = (ratio, interleaved)


@pytest.mark.parametrize("sampler", ["slice", "random"])
def test_sample_image_rows_in_turn(benchmark, variants, request, sampler):
    """The same sample, stock and patched buffers side by side, timed in turn.

    Timed by :func:`~conformance.timing_in_turn.time_in_turn`, whose medians the
    stock / patched table reads.
    """
    scale = _scale(request.config)
    variants.clear()
    needed = 2 * variants.stored * ROW_BYTES * 3 // 2
    available = available_memory()
    if available is not None and available < needed:
        pytest.skip(f"needs about {needed / 2**30:.1f} GiB of available memory")
    with reference.stock():
        pair = {"stock": build_buffers(variants.stored)[sampler]}
    pair["patched"] = build_buffers(variants.stored)[sampler]
    for rb in pair.values():
        rb.sample()
    scenario = f"{sampler} sample, image rows {variants.stored:,}"
    benchmark.group = scenario
    benchmark.extra_info.update(scenario=scenario, operation=f"{sampler} sample, image rows")
    time_in_turn(benchmark, lambda v: pair[v].sample(), rounds=ROUNDS[scale], warmup_rounds=2)
    pair.clear()
    gc.collect()


# --- The fixed-length path against the general path ---------------------------------
# single_gather keeps a second builder of _finalize_index's info for slices of one
# length (FIXED_LENGTH_EDITS) only while it wins a tenth of a whole rb.sample() on a
# row users run. The main job's two shapes, as the seed-table and online benchmarks
# of test_speed_slice_sampling.py build them:
FIXED_LENGTH_SHAPES = {
    # 256 slices of 4 from 5M rows of obs [N, 1] and done, truncated_key=None
    "seed-table 256x4": dict(
        stored=5_000_000, capacity=5_000_000, batch=1_024, num_slices=256, online=False
    ),
    # 32 slices of 64 from 2M rows (3M capacity) of obs [N, 4], episode, done and
    # terminated, the default truncated_key
    "online 32x64": dict(
        stored=2_000_000, capacity=3_000_000, batch=2_048, num_slices=32, online=True
    ),
}
FIXED_LENGTH_ROUNDS = {"ci": 200, "report": 400, "full": 400}
FIXED_LENGTH_BLOCK = 5  # samples per builder per round


def fixed_length_buffer(shape: dict) -> ReplayBuffer:
    """A buffer of ``shape`` (:data:`FIXED_LENGTH_SHAPES`), filled, episodes of 1,000 steps."""
    step = torch.arange(shape["stored"])
    done = ((step + 1) % 1_000 == 0).unsqueeze(-1)
    if shape["online"]:
        sampler = SliceSampler(
            num_slices=shape["num_slices"], cache_values=True, end_key=("next", "done")
        )
        rows = {
            "obs": torch.zeros(step.numel(), 4),
            "episode": step // 1_000,
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        }
        buffer_cls = TensorDictReplayBuffer
    else:
        sampler = SliceSampler(
            num_slices=shape["num_slices"],
            truncated_key=None,
            cache_values=False,
            end_key=("next", "done"),
        )
        rows = {"obs": torch.zeros(step.numel(), 1), ("next", "done"): done}
        buffer_cls = ReplayBuffer
    rb = buffer_cls(
        storage=LazyTensorStorage(shape["capacity"]), sampler=sampler, batch_size=shape["batch"]
    )
    rb.extend(TensorDict(rows, [step.numel()]))
    return rb


def finalize_index_builders() -> dict[str, types.FunctionType]:
    """The fix's ``_finalize_index`` with its fixed-length path, and without it."""
    target = next(
        t for t in single_gather.SingleGather.implements if t.path == "SliceSampler._finalize_index"
    )
    with torchrl_fixes.disabled():
        stock = target.stock()
    edits = single_gather.INFO_BUILDER_EDITS[source_fingerprint(stock)]
    general = tuple(edit for edit in edits if edit not in single_gather.FIXED_LENGTH_EDITS)
    assert len(general) == len(edits) - len(single_gather.FIXED_LENGTH_EDITS)
    names = {
        "_read_entries": single_gather._read_entries,
        "_fixed_length_info": single_gather._fixed_length_info,
    }
    return {
        "fixed-length": derive_from_source(stock, edits, **names),
        "general": derive_from_source(stock, general, **names),
    }


def fixed_length_ratios(rb, builders, rounds: int) -> dict[str, float]:
    """Medians of the per-round ratios fixed-length / general: of rb.sample(), and of ``_finalize_index`` in it.

    Each round takes :data:`FIXED_LENGTH_BLOCK` samples with one builder, then as many
    with the other (the order alternating from round to round), the builder set on
    the sampler; a round's ratio is that of the two blocks' medians.
    """
    sampler = rb._sampler
    sample_ratios, finalize_ratios = [], []
    for round_ in range(rounds + 2):  # two rounds of warm-up
        order = list(builders) if round_ % 2 else list(builders)[::-1]
        sample_s, finalize_s = {}, {}
        for name in order:
            inside = []

            def timed(self, _builder=builders[name], _inside=inside, **kwargs):
                start = time.perf_counter()
                out = _builder(self, **kwargs)
                _inside.append(time.perf_counter() - start)
                return out

            sampler._finalize_index = types.MethodType(timed, sampler)
            times = []
            try:
                for _ in range(FIXED_LENGTH_BLOCK):
                    start = time.perf_counter()
                    rb.sample()
                    times.append(time.perf_counter() - start)
            finally:
                del sampler._finalize_index
            assert len(inside) == FIXED_LENGTH_BLOCK  # every sample built its info here
            sample_s[name] = statistics.median(times)
            finalize_s[name] = statistics.median(inside)
        if round_ >= 2:
            sample_ratios.append(sample_s["fixed-length"] / sample_s["general"])
            finalize_ratios.append(finalize_s["fixed-length"] / finalize_s["general"])
    return {
        "sample": statistics.median(sample_ratios),
        "finalize_index": statistics.median(finalize_ratios),
    }


@reference.runtime_only
@pytest.mark.parametrize("shape", list(FIXED_LENGTH_SHAPES))
def test_fixed_length_path(benchmark, request, shape):
    """``rb.sample()`` with the fix's ``_finalize_index`` built with and without its fixed-length path.

    One torch thread, one buffer, the two builders set on its sampler in turn
    (:func:`fixed_length_ratios`); ``extra_info`` gets the medians of the per-round
    ratios fixed-length / general of the whole sample (``fixed_over_general_sample``)
    and of ``_finalize_index`` inside it (``fixed_over_general_finalize_index``). The
    fixed-length path stays in the fix while the sample ratio is 0.9 or less on one
    of the shapes. Untimed (``--benchmark-disable``), two rounds check that both
    builders run.
    """
    if "_finalize_index" not in vars(SliceSampler):
        pytest.skip("the fixed-length path is an edit of _finalize_index (TorchRL 0.14 on)")
    if not reference.in_effect("single_gather"):
        pytest.skip("single_gather does not act here")
    builders = finalize_index_builders()
    rb = fixed_length_buffer(FIXED_LENGTH_SHAPES[shape])
    rb.sample()
    rounds = FIXED_LENGTH_ROUNDS[_scale(request.config)] if not benchmark.disabled else 2
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        found = {}
        benchmark.group = "single gather: the fixed-length path"
        benchmark.extra_info.update(shape=shape, rounds=rounds)
        benchmark.pedantic(
            lambda: found.update(fixed_length_ratios(rb, builders, rounds)),
            rounds=1,
            iterations=1,
        )
    finally:
        torch.set_num_threads(threads)
    benchmark.extra_info["fixed_over_general_sample"] = round(found["sample"], 3)
    benchmark.extra_info["fixed_over_general_finalize_index"] = round(found["finalize_index"], 3)
