"""``examples/online_loop.py`` runs as a user would run it, and says what it checked."""
from __future__ import annotations

import re

import pytest
import torchrl

SCRIPT = "examples/online_loop.py"
STORED, ITERATIONS, BATCH_SIZE, SLICE_LEN = 20_000, 3, 1024, 32
# a line of the timings table: steps, stock TorchRL, with torchrl_fixes, speed-up
TIMING = re.compile(r"(\S+) +(\d+\.\d\d) ms +(\d+\.\d\d) ms +(\d+\.\d)x")


@pytest.fixture(scope="module")
def runs(spawn_python, finish_process):
    """The script with small sizes, and with bad input, run in parallel subprocesses."""
    started = {
        "small": spawn_python(
            SCRIPT, "--stored", str(STORED), "--iterations", str(ITERATIONS),
            "--batch-size", str(BATCH_SIZE), "--slice-len", str(SLICE_LEN),
        ),
        "batch not whole slices": spawn_python(SCRIPT, "--batch-size", "100"),
        "not a number": spawn_python(SCRIPT, "--stored", "lots"),
        "not positive": spawn_python(SCRIPT, "--iterations", "0"),
    }
    return {case: finish_process(process) for case, process in started.items()}


def test_prints_versions_and_timings_of_stock_and_fixed(runs):
    run = runs["small"]
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"torchrl {torchrl.__version__}, "), lines[0]
    assert "fixes applied: " in lines[0] and "slice_boundary_index" in lines[0]
    header = lines.index(next(line for line in lines if line.startswith("steps")))
    assert lines[header].split() == ["steps", "stock", "TorchRL", "with", "torchrl_fixes", "speed-up"]
    rows = [TIMING.fullmatch(line) for line in lines[header + 1 : header + ITERATIONS + 2]]
    assert all(rows), run.stdout
    assert [row[1] for row in rows] == [*map(str, range(1, ITERATIONS + 1)), "median"]
    for row in rows:
        stock_ms, fixed_ms = float(row[2]), float(row[3])
        assert stock_ms > 0 and fixed_ms > 0, row[0]


@pytest.mark.parametrize("buffer", ["stock TorchRL", "with torchrl_fixes"])
def test_every_sampled_slice_stays_in_one_episode(runs, buffer):
    run = runs["small"]
    slices = ITERATIONS * BATCH_SIZE // SLICE_LEN
    expected = f"slices within one episode, {buffer}: pass ({slices:,} of {slices:,})"
    assert expected in run.stdout.splitlines(), run.stdout


def test_fixed_samples_equal_stock(runs):
    run = runs["small"]
    expected = f"samples equal to stock's, same seed: pass ({ITERATIONS} of {ITERATIONS})"
    assert expected in run.stdout.splitlines(), run.stdout


@pytest.mark.parametrize(
    "case, message",
    [
        ("batch not whole slices", "--batch-size 100 is not a multiple of --slice-len 64"),
        ("not a number", "argument --stored: invalid int value: 'lots'"),
        ("not positive", "--iterations must be a positive integer, got 0"),
    ],
)
def test_bad_input_is_one_line_usage_error(runs, case, message):
    run = runs[case]
    assert run.returncode == 2
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == f"online_loop.py: error: {message}"
