"""``python -m devtools gpu``: the whole GPU check, stock TorchRL against the fixes, in one run.

Its steps, each written into ``OUT/gpu.md`` as soon as it is done (the report is
printed at the end):

1. ``pytest -m cuda`` over ``tests/`` and ``conformance/`` with the fixes, in a process
   of its own, stopped after :data:`PYTEST_TIMEOUT_S` (``OUT/pytest-cuda.txt``: its
   output with the ``-rA`` summary; ``OUT/pytest-cuda.xml``: its JUnit XML);
2. a storage on the device (``LazyTensorStorage(..., device=device)``): a
   ``SliceSampler`` sample of 256 slices of 4 steps (no value cache) right after a
   1,000-row write, at each stored size, the sampler reading episode ids, then done
   flags;
3. ``SliceSampler(use_gpu=device)`` over a CPU storage at the largest size: the online
   sample (2,048 rows as 32 slices, value cache on) right after a 1,000-row write;
4. TD-MPC2's buffer with its storage on the device, at each size
   (:func:`devtools.tdmpc2_loop.run`: samples then one episode written, every slice
   checked);
5. for the buffers of 2 and 3, the host synchronisations of a write and of a sample,
   stock and patched (:func:`conformance.cuda_sync.count_host_synchronisations`);
6. ``compare``: what stock and patched ``pin_memory=True`` buffers return
   (:func:`devtools.pinned_sample_report.compare_pinned_samples`);
7. :func:`torchrl_fixes.diagnose` of the demo buffer of ``python -m torchrl_fixes
   diagnose --demo``, with the device as the training step's.

Stock and patched buffers live side by side in this process: stock is built inside
:func:`torchrl_fixes.disabled`, both get the same rows, and each round times one
then the other, in an order that alternates from round to round. Each timing is a
median; the ratio quoted is stock / patched.

``--device cuda`` (the default) stores 1M and 10M transitions: about 2 GiB of device
memory and under 3 GiB of host memory at any time, and under 8 minutes on an H100,
the pytest step's 4 included (``docs/gpu.md`` counts the repeats). ``--device cpu``
is a dry run: every step, at 10k and 100k stored, with the CPU standing in for the
accelerator; nothing is counted there for synchronisations, which only CUDA reports.

    python -m devtools gpu --out /tmp/gpu
    python -m devtools gpu --device cpu --out /tmp/gpu-dry
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler, TensorDictReplayBuffer

import torchrl_fixes
from conformance.cuda_sync import count_host_synchronisations, synchronize
from conformance.speed_report import format_seconds
from conformance.speed_rows import case_rows
from conformance.speed_sizes import Case
from conformance.timing_in_turn import VARIANTS
from devtools import tdmpc2_loop
from devtools.pinned_sample_report import compare_pinned_samples
from torchrl_fixes._core.versions import installed_version
from torchrl_fixes.diagnose import DEMO_STORED, demo_buffer

PROG = "python -m devtools gpu"
ROOT = Path(__file__).resolve().parent.parent
REPORT = "gpu.md"
PYTEST_OUTPUT = "pytest-cuda.txt"
PYTEST_JUNIT = "pytest-cuda.xml"
# The pytest step is stopped past this, so that the whole check stays within minutes.
PYTEST_TIMEOUT_S = 240
# Rows written before each timed sample.
WRITE = 1_000
# Rows per extend while filling a buffer.
FILL_CHUNK = 1_000_000
# Stored transitions per buffer: on a CUDA device, and in the dry run on the CPU.
CUDA_SIZES = (1_000_000, 10_000_000)
DRY_RUN_SIZES = (10_000, 100_000)
# The entry each trajectory key of the seed-table sampler reads, as the report names it.
KEYS = {"episode": "episode ids", "done": "done flags"}


class DeviceUnavailable(Exception):
    """The device asked for cannot be used here; the message says why and what to do."""


@dataclass(frozen=True)
class Plan:
    """What each step does: the stored sizes and how many times each thing is repeated."""

    sizes: tuple[int, ...]
    # timed sample-after-write rounds per pair of buffers, after one that is not counted
    rounds: int
    # writes and samples whose synchronisations are counted, per buffer
    sync_steps: int
    tdmpc2_rounds: int
    tdmpc2_samples: int
    demo_stored: int
    diagnose_samples: int


def plan_for(device: torch.device, sizes: tuple[int, ...] | None = None) -> Plan:
    """The full check on a CUDA device; small sizes and few repeats for the dry run on the CPU."""
    if device.type == "cuda":
        return Plan(
            sizes=sizes or CUDA_SIZES,
            rounds=30,
            sync_steps=3,
            tdmpc2_rounds=6,
            tdmpc2_samples=50,
            demo_stored=DEMO_STORED,
            diagnose_samples=20,
        )
    return Plan(
        sizes=sizes or DRY_RUN_SIZES,
        rounds=5,
        sync_steps=2,
        tdmpc2_rounds=2,
        tdmpc2_samples=5,
        demo_stored=100_000,
        diagnose_samples=5,
    )


def resolve_device(name: str) -> torch.device:
    """The device ``name`` names, with its index, or :class:`DeviceUnavailable` saying why not.

    ``cuda`` (the current CUDA device, or ``cuda:N``) runs the check; ``cpu`` its dry run.
    """
    try:
        device = torch.device(name)
    except RuntimeError as err:
        reason = str(err).splitlines()[0]
        raise DeviceUnavailable(
            f"--device {name} is not a torch device ({reason}); pass cuda, cuda:N or cpu"
        ) from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceUnavailable(
            f"--device {name}: the check runs on a CUDA device, or on cpu as a dry run"
        )
    # torch warns instead of raising where a driver is missing or too old: that is the reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        if torch.version.cuda is None:
            why = f"torch {torch.__version__} is a build without CUDA"
        else:
            why = f"torch {torch.__version__} finds no CUDA device"
            if caught:
                why += f" ({str(caught[0].message).strip().splitlines()[0]})"
        raise DeviceUnavailable(
            f"--device {name} cannot be used: {why}; run it where a CUDA build of torch sees "
            "a GPU, or pass --device cpu for the dry run"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= count:
        raise DeviceUnavailable(
            f"--device {name} cannot be used: this machine has {count} CUDA device(s), "
            f"cuda:0 to cuda:{count - 1}"
        )
    return torch.device("cuda", index)


# ---------------------------------------------------------------------------
# The buffers compared: stock and patched, fed the same rows.
# ---------------------------------------------------------------------------


def seed_table_buffer(key: str, capacity: int, device: torch.device):
    """The seed table's buffer: 256 slices of 4 (1,024 rows), no value cache, the storage on ``device``."""
    reads = {"traj_key": "episode"} if key == "episode" else {"end_key": ("next", "done")}
    sampler = SliceSampler(num_slices=256, truncated_key=None, cache_values=False, **reads)
    return ReplayBuffer(
        storage=LazyTensorStorage(capacity, device=device), sampler=sampler, batch_size=1024
    )


def use_gpu_buffer(capacity: int, device: torch.device):
    """The online buffer of the speed benchmarks, its sampler finding boundaries on ``device``.

    A CPU storage; 2,048 rows as 32 slices, value cache on, done flags read.
    """
    sampler = SliceSampler(
        num_slices=32, cache_values=True, use_gpu=device, end_key=("next", "done")
    )
    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=2048
    )


class BufferPair:
    """A stock and a patched buffer holding the same rows, and where their stream of rows is.

    Args:
        build: makes one empty buffer; the stock one is built inside
            :func:`torchrl_fixes.disabled`, so that it runs stock code throughout.
        rows: ``rows(start, count)``, the stream's rows from ``start`` on.
        stored (int): rows written to each buffer before anything is timed.
        storage_device (torch.device): where the rows go before each write.
    """

    def __init__(
        self,
        build: Callable[[], object],
        rows: Callable[[int, int], TensorDict],
        stored: int,
        storage_device: torch.device,
    ):
        with torchrl_fixes.disabled():
            stock = build()
        self.buffers = {"stock": stock, "patched": build()}
        self.rows = rows
        self.storage_device = storage_device
        self.position = 0
        while self.position < stored:
            rows_now = self.next_rows(min(FILL_CHUNK, stored - self.position))
            for rb in self.buffers.values():
                rb.extend(rows_now)
        # the first sample builds the patched sampler's index: not what is timed
        for rb in self.buffers.values():
            rb.sample()

    def next_rows(self, count: int) -> TensorDict:
        """The stream's next ``count`` rows, on the storage's device."""
        rows = self.rows(self.position, count).to(self.storage_device)
        self.position += count
        return rows


def capacity_for(stored: int, plan: Plan) -> int:
    """Room for ``stored`` rows, a fifth more, and every write the timing and counting add."""
    return stored + stored // 5 + (plan.rounds + 1 + plan.sync_steps) * WRITE


def time_sample_after_write(
    pair: BufferPair, rounds: int, device: torch.device
) -> dict[str, float]:
    """Each variant's median sample right after a 1,000-row write, timed in turn.

    Every round writes the same rows to both buffers, each just before its own
    sample, the order alternating from round to round; the first round is not
    counted. A sample is timed until ``device`` has finished it.
    """
    times: dict[str, list[float]] = {name: [] for name in pair.buffers}
    for round_number in range(rounds + 1):
        rows = pair.next_rows(WRITE)
        order = list(pair.buffers) if round_number % 2 == 0 else list(reversed(pair.buffers))
        for name in order:
            rb = pair.buffers[name]
            rb.extend(rows)
            synchronize(device)
            start = time.perf_counter()
            rb.sample()
            synchronize(device)
            if round_number:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def count_synchronisations(
    pair: BufferPair, steps: int, device: torch.device
) -> dict[str, dict[str, list[int]]]:
    """The host synchronisations of ``steps`` writes of 1,000 rows and as many samples, per variant.

    Returns ``{"write": {variant: counts}, "sample": {variant: counts}}``. The rows
    are on the storage's device before each counted write.
    """
    counts = {what: {name: [] for name in pair.buffers} for what in ("write", "sample")}
    for _ in range(steps):
        rows = pair.next_rows(WRITE)
        for name, rb in pair.buffers.items():
            counts["write"][name].append(
                count_host_synchronisations(functools.partial(rb.extend, rows), device)
            )
            counts["sample"][name].append(count_host_synchronisations(rb.sample, device))
    return counts


def measure(pair: BufferPair, plan: Plan, device: torch.device):
    """``(medians, counts)`` of ``pair``: :func:`time_sample_after_write`, then, on a CUDA
    device, :func:`count_synchronisations` (``None`` elsewhere). The pair is emptied."""
    medians = time_sample_after_write(pair, plan.rounds, device)
    counts = count_synchronisations(pair, plan.sync_steps, device) if device.type == "cuda" else None
    pair.buffers.clear()
    _release(device)
    return medians, counts


def _release(device: torch.device) -> None:
    """Hands the memory of the buffers just dropped back before the next ones are filled."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# The report.
# ---------------------------------------------------------------------------


def size(rows: int) -> str:
    """``rows`` as the report writes a stored size: ``10k``, ``1M``, ``2.5M``."""
    if rows >= 1_000_000:
        return f"{rows / 1e6:g}M"
    return f"{rows / 1e3:g}k"


def _ratio(stock_s: float, patched_s: float) -> str:
    return f"{stock_s / patched_s:.1f}x"


def _counts(values: list[int]) -> str:
    """One count, or the range the counts span."""
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


def _measured_cells(medians: dict[str, float], counts) -> str:
    """The stock, patched, ratio and synchronisation cells of a table row."""
    return (
        f"{format_seconds(medians['stock'])} | {format_seconds(medians['patched'])} "
        f"| {_ratio(medians['stock'], medians['patched'])} | {_sync_cells(counts)}"
    )


def _sync_cells(counts: dict[str, dict[str, list[int]]] | None) -> str:
    if counts is None:
        return "not counted | not counted"
    return " | ".join(
        " / ".join(_counts(counts[what][name]) for name in VARIANTS) for what in ("write", "sample")
    )


def _sync_note(device: torch.device, plan: Plan) -> str:
    if device.type != "cuda":
        return (
            "Host synchronisations: not counted (no CUDA device: "
            "`torch.cuda.set_sync_debug_mode` reports CUDA's only)."
        )
    return (
        f"Host synchronisations: synchronising CUDA calls under "
        f'`torch.cuda.set_sync_debug_mode("warn")`, stock / patched, for each of '
        f"{plan.sync_steps} writes of {WRITE:,} rows (already on the storage's device) "
        "and of the sample after each; a range where they differ."
    )


def header(device: torch.device, plan: Plan) -> str:
    """Where and on what the check ran, and which fixes the patched buffers have."""
    if device.type == "cuda":
        where = f"{device} ({torch.cuda.get_device_name(device)})"
    else:
        where = "cpu: a dry run, the CPU standing in for the accelerator"
    versions = ", ".join(
        f"{package} {installed_version(package) or 'unknown'}" for package in ("torchrl", "tensordict")
    )
    status = torchrl_fixes.status()
    applied = ", ".join(row.name for row in status if row.applied) or "none"
    return "\n".join(
        [
            "# GPU check: stock TorchRL against torchrl_fixes",
            "",
            f"Device: {where}. torch {torch.__version__} (CUDA {torch.version.cuda}), {versions}, "
            f"Python {platform.python_version()}; {os.cpu_count()} CPU cores, "
            f"{torch.get_num_threads()} torch threads. Stored sizes: "
            f"{', '.join(size(n) for n in plan.sizes)}. Fixes applied: {applied}.",
            "",
            "```",
            str(status),
            "```",
        ]
    )


@dataclass
class JUnitResults:
    """What pytest's JUnit XML says: the counts, the tests that failed, and why tests skipped."""

    counts: dict[str, int]
    failed: list[str]
    skip_reasons: dict[str, int]


def read_junit(path: Path) -> JUnitResults | None:
    """The results in the JUnit XML file ``path``; ``None`` where pytest wrote none."""
    if not path.is_file():
        return None
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed = []
    skip_reasons = Counter()
    for suite in suites:
        for name in counts:
            counts[name] += int(suite.get(name, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                # a module that fails to import is a test case with no class name
                failed.append("::".join(filter(None, (case.get("classname"), case.get("name")))))
            skipped = case.find("skipped")
            if skipped is not None:
                skip_reasons[skipped.get("message", "")] += 1
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return JUnitResults(counts, failed, dict(skip_reasons.most_common()))


@dataclass
class PytestRun:
    """What ``pytest -m cuda`` gave: its exit status (``None``: stopped at its limit), its
    results, and its summary lines (``FAILED`` and ``ERROR``, then the last line)."""

    returncode: int | None
    seconds: float
    results: JUnitResults | None
    summary: list[str]

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def run_cuda_tests(
    out: Path, device: torch.device, timeout: float = PYTEST_TIMEOUT_S
) -> PytestRun:
    """``pytest -m cuda`` over ``tests/`` and ``conformance/``, with the fixes, in its own process.

    Its output goes to ``out/pytest-cuda.txt`` as it comes, so that a run stopped at
    ``timeout`` seconds keeps what it printed. With ``device`` the CPU (the dry run),
    the tests see no CUDA device, as on a machine without one.
    """
    command = [
        sys.executable, "-m", "pytest", "-m", "cuda", "tests", "conformance",
        "--ignore=tests/ray",  # needs a Ray cluster: nox -s ray
        "--ignore=tests/test_gpu_check.py",  # runs this command
        # a module that cannot be imported here (a tool the machine lacks) stops no other
        "--continue-on-collection-errors",
        "-rA", "-p", "no:cacheprovider", f"--junitxml={out / PYTEST_JUNIT}",
    ]
    env = dict(os.environ)
    env.pop("TORCHRL_FIXES", None)  # every fix applied
    if device.type != "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.perf_counter()
    with open(out / PYTEST_OUTPUT, "w") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            returncode = None
    seconds = time.perf_counter() - start
    results = read_junit(out / PYTEST_JUNIT) if returncode is not None else None
    lines = (out / PYTEST_OUTPUT).read_text(errors="replace").splitlines()
    summary = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    if lines:
        summary.append(lines[-1])
    return PytestRun(returncode, seconds, results, summary)


def pytest_section(run: PytestRun) -> str:
    """The pytest step as markdown: its counts, what failed, why tests skipped, its summary."""
    lines = ["## pytest -m cuda (tests/, conformance/), with the fixes", ""]
    if run.returncode is None:
        lines.append(f"Stopped after {run.seconds:.0f} s (the step's limit): see `{PYTEST_OUTPUT}`.")
    else:
        found = ""
        if run.results is not None:
            counts = run.results.counts
            found = (
                f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} "
                f"errors, {counts['skipped']} skipped; "
            )
        lines.append(
            f"{found}exit status {run.returncode}, {run.seconds:.0f} s. Output: "
            f"`{PYTEST_OUTPUT}`; JUnit XML: `{PYTEST_JUNIT}`."
        )
    if run.results is not None and run.results.failed:
        lines += ["", "Failed or errored:", "", *(f"- `{name}`" for name in run.results.failed)]
    if run.results is not None and run.results.skip_reasons:
        lines += ["", "Skipped, by reason:", ""]
        lines += [f"- {count}: {reason}" for reason, count in run.results.skip_reasons.items()]
    if run.summary:
        shown = run.summary[-25:]
        lines += ["", "```", *shown, "```"]
        if len(run.summary) > len(shown):
            lines.append(f"({len(run.summary) - len(shown)} more lines in `{PYTEST_OUTPUT}`)")
    return "\n".join(lines)


def storage_section(device: torch.device, plan: Plan) -> str:
    """Step 2 (and its synchronisations): the seed table's sample after a write, storage on ``device``."""
    lines = [
        f"## A storage on {device}: SliceSampler sample right after a {WRITE:,}-row write",
        "",
        f"`LazyTensorStorage(capacity, device={str(device)!r})`, 256 slices of 4 steps (1,024 "
        f"rows), no value cache, {Case.episode_len:,}-step episodes; median of {plan.rounds} "
        "rounds, stock and patched in turn.",
        "",
        "| stored | sampler reads | stock | patched | stock/patched "
        "| host syncs per write (stock / patched) | per sample (stock / patched) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for stored in plan.sizes:
        for key, reads in KEYS.items():
            case = Case("seed", key, stored, capacity_for(stored, plan), rounds=plan.rounds)
            pair = BufferPair(
                functools.partial(seed_table_buffer, key, case.capacity, device),
                functools.partial(case_rows, case),
                stored,
                device,
            )
            lines.append(f"| {size(stored)} | {reads} | {_measured_cells(*measure(pair, plan, device))} |")
    lines += ["", _sync_note(device, plan)]
    return "\n".join(lines)


def use_gpu_section(device: torch.device, plan: Plan) -> str:
    """Step 3 (and its synchronisations): ``SliceSampler(use_gpu=device)`` over a CPU storage."""
    stored = max(plan.sizes)
    case = Case("online", "done", stored, capacity_for(stored, plan), rounds=plan.rounds)
    pair = BufferPair(
        functools.partial(use_gpu_buffer, case.capacity, device),
        functools.partial(case_rows, case),
        stored,
        torch.device("cpu"),
    )
    cells = _measured_cells(*measure(pair, plan, device))
    return "\n".join(
        [
            f"## SliceSampler(use_gpu={str(device)!r}) over a CPU storage",
            "",
            f"The online buffer: `TensorDictReplayBuffer`, a CPU `LazyTensorStorage`, 2,048 rows "
            f"as 32 slices, value cache on, done flags read; the sample right after a "
            f"{WRITE:,}-row write, median of {plan.rounds} rounds, stock and patched in turn.",
            "",
            "| stored | stock | patched | stock/patched "
            "| host syncs per write (stock / patched) | per sample (stock / patched) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
            f"| {size(stored)} | {cells} |",
            "",
            _sync_note(device, plan),
        ]
    )


def tdmpc2_section(device: torch.device, plan: Plan) -> str:
    """Step 4: TD-MPC2's buffer with its storage on ``device``, at each size."""
    lines = [
        f"## TD-MPC2's buffer on {device}",
        "",
        f"As `tdmpc2/common/buffer.py` builds it (256 slices of 4 by episode id, strict "
        f"length, no value cache), `LazyTensorStorage(capacity, device={str(device)!r})`, "
        f"{tdmpc2_loop.EPISODE_LEN}-step episodes: {plan.tdmpc2_rounds} rounds of "
        f"{plan.tdmpc2_samples} samples then one episode written, stock and patched in "
        "turn; the median sample, every slice checked.",
        "",
        "| stored | stock sample | patched sample | stock/patched | samples checked |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for stored in plan.sizes:
        capacity = stored + stored // 5 + plan.tdmpc2_rounds * tdmpc2_loop.EPISODE_LEN
        timing = tdmpc2_loop.run(
            stored, capacity, plan.tdmpc2_rounds, plan.tdmpc2_samples, device=device
        )
        _release(device)
        lines.append(
            f"| {size(stored)} | {format_seconds(timing.stock_s)} "
            f"| {format_seconds(timing.patched_s)} | {_ratio(timing.stock_s, timing.patched_s)} "
            f"| {timing.samples_checked:,} |"
        )
    return "\n".join(lines)


def compare_section(device: torch.device, plan: Plan) -> str:
    """Step 6: ``python -m devtools compare``'s table."""
    return "\n".join(
        ["## compare: pin_memory=True, stock and patched", "", "```", compare_pinned_samples(), "```"]
    )


def diagnose_section(device: torch.device, plan: Plan) -> str:
    """Step 7: :func:`torchrl_fixes.diagnose` of the demo buffer, ``device`` the training step's."""
    report = torchrl_fixes.diagnose(
        demo_buffer(plan.demo_stored), samples=plan.diagnose_samples, device=device
    )
    return "\n".join(
        [
            f'## diagnose: the demo buffer, device="{device}"',
            "",
            f"`torchrl_fixes.diagnose(demo_buffer({plan.demo_stored:_}), "
            f'samples={plan.diagnose_samples}, device="{device}")`: the buffer of '
            "`python -m torchrl_fixes diagnose --demo` (built stock).",
            "",
            "```",
            str(report),
            "```",
        ]
    )


def run(device: torch.device, plan: Plan, out: Path) -> int:
    """Runs every step, writing ``out/gpu.md`` after each; 1 when a test or a step failed.

    A step that raises is reported with its traceback and the next one runs: one
    run on a lent machine gives every result it can.
    """
    out.mkdir(parents=True, exist_ok=True)
    report = out / REPORT
    sections = [header(device, plan)]

    def write() -> None:
        report.write_text("\n\n".join(sections) + "\n")

    write()
    print(f"{PROG}: pytest -m cuda over tests/ and conformance/ ...", flush=True)
    tests = run_cuda_tests(out, device)
    sections.append(pytest_section(tests))
    write()
    failed = not tests.passed
    # TorchRL logs each storage it creates; the report is what this command prints
    torchrl_logger = logging.getLogger("torchrl")
    level = torchrl_logger.level
    torchrl_logger.setLevel(logging.WARNING)
    try:
        for title, section in (
            ("storage on the device", storage_section),
            ("use_gpu over a CPU storage", use_gpu_section),
            ("TD-MPC2's buffer", tdmpc2_section),
            ("compare", compare_section),
            ("diagnose", diagnose_section),
        ):
            print(f"{PROG}: {title} ...", flush=True)
            start = time.perf_counter()
            try:
                sections.append(section(device, plan))
            except Exception:  # noqa: BLE001 - reported; the steps after it still run
                failed = True
                _release(device)  # what the failed step held, an out-of-memory one above all
                sections.append(f"## {title}: failed\n\n```\n{traceback.format_exc()}```")
            print(f"{PROG}: {title}: {time.perf_counter() - start:.0f} s", flush=True)
            write()
    finally:
        torchrl_logger.setLevel(level)
    print()
    print(report.read_text())
    print(f"{PROG}: report in {report}", flush=True)
    return 1 if failed else 0


def parse_size(text: str) -> int:
    """A stored size: ``100000``, ``100_000``, ``100k``, ``1M`` or ``2.5M``."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number.replace("_", "")) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 100000, 100k, 1M)") from None
    if value < WRITE:
        raise argparse.ArgumentTypeError(f"must be {WRITE:,} rows or more, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The whole GPU check, stock TorchRL against torchrl_fixes: pytest -m cuda, "
        "a storage on the GPU, use_gpu over a CPU storage, TD-MPC2's buffer on the GPU, host "
        "synchronisations, compare and diagnose; writes OUT/gpu.md (and the pytest output).",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda or cuda:N: the check; cpu: a dry run at small sizes (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder the report goes to")
    parser.add_argument(
        "--sizes",
        type=parse_size,
        nargs="+",
        metavar="N",
        help="stored transitions per buffer, e.g. 1M 10M (default: 1M 10M on cuda, 10k 100k on cpu)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceUnavailable as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("pytest") is None:
        print(f"{PROG}: the check runs pytest -m cuda: install pytest", file=sys.stderr)
        return 2
    plan = plan_for(device, tuple(args.sizes) if args.sizes else None)
    return run(device, plan, args.out)


if __name__ == "__main__":
    sys.exit(main())
