"""``python -m devtools gpu``: its dry run on the CPU writes every step, and what it is built from.

The dry run (``--device cpu``) runs the whole check at small sizes, the CPU standing
in for the accelerator; the GPU run itself needs a CUDA device (docs/gpu.md).
"""
from __future__ import annotations

import argparse
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.speed_rows import case_rows
from conformance.speed_sizes import Case
from devtools import gpu_check

ROOT = Path(__file__).resolve().parents[1]
TIME = r"[\d.]+ (?:s|ms|µs|ns)"


def _gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devtools.gpu_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_writes_every_step(tmp_path):
    out = tmp_path / "gpu"
    result = _gpu_check("--device", "cpu", "--out", str(out))
    assert (out / gpu_check.REPORT).is_file(), result.stderr
    report = (out / gpu_check.REPORT).read_text()
    # pytest -m cuda ran, with the fixes, and not over this test
    pytest_step = report[report.index("## pytest -m cuda") : report.index("## A storage on cpu")]
    assert pytest_step.startswith("## pytest -m cuda (tests/, conformance/), with the fixes\n")
    assert re.search(r"\n0 passed, 0 failed, 0 errors, \d+ skipped; exit status 0", pytest_step), (
        pytest_step
    )
    assert re.search(r"\n- \d+: needs a CUDA device\n", pytest_step)
    assert (out / gpu_check.PYTEST_JUNIT).is_file()
    assert "test_gpu_check" not in (out / gpu_check.PYTEST_OUTPUT).read_text()
    failed_steps = re.findall(r"^## .*: failed$", report, flags=re.MULTILINE)
    assert not failed_steps, report[report.index(failed_steps[0]) :]
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith(f"report in {out / gpu_check.REPORT}")
    assert "Device: cpu: a dry run" in report

    not_counted = "| not counted | not counted |"
    for stored in ("10k", "100k"):
        for reads in ("episode ids", "done flags"):
            row = rf"\| {stored} \| {reads} \| {TIME} \| {TIME} \| [\d.]+x {re.escape(not_counted)}"
            assert re.search(row, report), f"no storage row for {stored} {reads}"
        assert re.search(rf"\| {stored} \| {TIME} \| {TIME} \| [\d.]+x \| 20 \|", report), (
            f"no TD-MPC2 row for {stored}"
        )
    assert "## SliceSampler(use_gpu='cpu') over a CPU storage" in report
    assert re.search(rf"\| 100k \| {TIME} \| {TIME} \| [\d.]+x {re.escape(not_counted)}", report)
    assert "Host synchronisations: not counted (no CUDA device" in report

    assert "## compare: pin_memory=True, stock and patched" in report
    assert "TensorDictReplayBuffer.sample" in report
    assert '## diagnose: the demo buffer, device="cpu"' in report
    assert "sampler: trajectory boundaries" in report and "sample() total" in report
    # what the demo's transform does to pinning, whatever the timings
    assert "[pin-memory-unpinned]" in report


@pytest.mark.parametrize("device", ["cuda", "nonsense"])
def test_a_device_that_cannot_be_used_is_one_line(device, tmp_path):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is available: --device cuda runs the check")
    result = _gpu_check("--device", device, "--out", str(tmp_path / "gpu"))
    assert result.returncode == 2
    assert result.stderr.startswith(f"python -m devtools gpu: --device {device} ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "cpu" in result.stderr
    assert not (tmp_path / "gpu").exists()


def test_a_pair_feeds_stock_and_patched_the_same_rows():
    cpu = torch.device("cpu")
    plan = gpu_check.plan_for(cpu)
    pair = gpu_check.BufferPair(
        lambda: gpu_check.seed_table_buffer("done", gpu_check.capacity_for(5_000, plan), cpu),
        functools.partial(case_rows, Case("seed", "done", 5_000, 0, rounds=2)),
        5_000,
        cpu,
    )
    medians = gpu_check.time_sample_after_write(pair, 2, cpu)
    assert sorted(medians) == ["patched", "stock"]
    assert all(seconds > 0 for seconds in medians.values())
    stock, patched = pair.buffers["stock"], pair.buffers["patched"]
    # 5,000 stored, then one write per round and one round not counted
    assert len(stock) == len(patched) == 5_000 + 3 * gpu_check.WRITE
    done = ("next", "done")
    assert torch.equal(stock[:][done], patched[:][done])
    assert int(patched[:][done].sum()) == 8


def test_junit_failures_and_skips_are_named_in_the_report(tmp_path):
    (tmp_path / gpu_check.PYTEST_JUNIT).write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="1" skipped="1">'
        '<testcase classname="conformance.test_x" name="test_ok"/>'
        '<testcase classname="conformance.test_x" name="test_bad"><failure message="no"/></testcase>'
        '<testcase classname="" name="tests.test_y"><error message="collection failure"/></testcase>'
        '<testcase classname="conformance.test_x" name="test_skip">'
        '<skipped message="needs a CUDA device"/></testcase>'
        "</testsuite></testsuites>"
    )
    results = gpu_check.read_junit(tmp_path / gpu_check.PYTEST_JUNIT)
    assert results.counts == {"tests": 4, "failures": 1, "errors": 1, "skipped": 1, "passed": 1}
    assert results.failed == ["conformance.test_x::test_bad", "tests.test_y"]
    assert results.skip_reasons == {"needs a CUDA device": 1}
    run = gpu_check.PytestRun(1, 2.0, results, ["FAILED conformance/test_x.py::test_bad", "= 1 failed ="])
    section = gpu_check.pytest_section(run)
    assert "1 passed, 1 failed, 1 errors, 1 skipped; exit status 1" in section
    assert "- `conformance.test_x::test_bad`\n- `tests.test_y`" in section
    assert "- 1: needs a CUDA device" in section
    assert "```\nFAILED conformance/test_x.py::test_bad\n= 1 failed =\n```" in section
    assert not run.passed


def test_a_stopped_pytest_step_says_so():
    run = gpu_check.PytestRun(None, 240.0, None, [])
    assert "Stopped after 240 s" in gpu_check.pytest_section(run)
    assert not run.passed


@pytest.mark.parametrize(
    "text, rows", [("100k", 100_000), ("1M", 1_000_000), ("2.5M", 2_500_000), ("1_000_000", 1_000_000)]
)
def test_sizes_are_read_with_their_unit(text, rows):
    assert gpu_check.parse_size(text) == rows
    assert gpu_check.size(rows) == {"1_000_000": "1M"}.get(text, text)


@pytest.mark.parametrize("text", ["ten", "10", "1x"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        gpu_check.parse_size(text)
