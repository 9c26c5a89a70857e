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

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer

from conformance import reference
from conformance.host_memory import available_memory
from conformance.timing_in_turn import time_in_turn

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
