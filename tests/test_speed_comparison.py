"""``python -m torchrl_fixes bench``: finding the suite, refusing what cannot run, writing results.

The benchmarks themselves take minutes; here ``subprocess.run`` is replaced by a
stand-in that writes a small pytest-benchmark JSON, so what the command does with
a run's output is checked exactly.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from torchrl_fixes import __main__ as cli
from torchrl_fixes import speed_comparison


def _pair(operation, key, stored, capacity, stock, patched):
    scenario = f"{operation} {key} {stored}/{capacity}"
    return {
        "group": scenario,
        "name": f"test[{scenario}]",
        "extra_info": {
            "scenario": scenario,
            "operation": operation,
            "key": key,
            "stored": stored,
            "capacity": capacity,
            "variant": "pair",
            "stock_median_s": stock,
            "patched_median_s": patched,
            "torch": "2.13.0",
            "torchrl": "0.14.1",
        },
        "stats": {"median": stock + patched},
    }


def _report(patched_seed_time=0.0005):
    return {
        "datetime": "2026-11-23T10:00:00",
        "machine_info": {"python_version": "3.11.7", "cpu": {"brand_raw": "Test CPU", "count": 2}},
        "benchmarks": [
            _pair("seed_table", "episode", 1_000_000, 1_200_000, 0.004, patched_seed_time),
            _pair("seed_table", "episode", 5_000_000, 6_000_000, 0.010, patched_seed_time),
            _pair("online sample-after-write", "episode", 2_000_000, 3_000_000, 0.005, 0.001),
            _pair("online sample-after-write", "episode", 40_000_000, 60_000_000, 0.08, 0.001),
        ],
    }


@pytest.fixture
def fake_pytest(monkeypatch):
    """Replaces the benchmark run: records the command and writes ``report`` as its JSON."""
    calls = []
    state = {"report": _report(), "returncode": 0}

    def run(command, cwd, stdout, stderr):
        calls.append((command, cwd))
        json_arg = next(a for a in command if a.startswith("--benchmark-json="))
        Path(json_arg.split("=", 1)[1]).write_text(json.dumps(state["report"]))
        return subprocess.CompletedProcess(command, state["returncode"])

    monkeypatch.setattr(speed_comparison.subprocess, "run", run)
    return calls, state


def test_the_suite_is_found_next_to_the_package():
    root = speed_comparison.suite_root()
    assert (root / "conformance" / "test_speed_slice_sampling.py").is_file()
    assert root == Path(speed_comparison.__file__).resolve().parent.parent


def test_an_installed_package_without_its_checkout_says_what_to_do(monkeypatch, tmp_path):
    (tmp_path / "torchrl_fixes").mkdir()
    monkeypatch.setattr(speed_comparison, "__file__", str(tmp_path / "torchrl_fixes" / "x.py"))
    with pytest.raises(speed_comparison.SpeedComparisonError, match="source checkout"):
        speed_comparison.suite_root()


def test_full_runs_are_refused_without_the_memory(monkeypatch):
    from conformance import host_memory

    root = speed_comparison.suite_root()
    monkeypatch.setattr(host_memory, "available_memory", lambda: 8 << 30)
    with pytest.raises(speed_comparison.SpeedComparisonError, match=r"needs about 1[78] GiB"):
        speed_comparison.check_memory(root, full=True)
    speed_comparison.check_memory(root, full=False)  # the default sizes need no check
    monkeypatch.setattr(host_memory, "available_memory", lambda: 64 << 30)
    speed_comparison.check_memory(root, full=True)


@pytest.mark.parametrize("full, scale", [(False, "report"), (True, "full")])
def test_pytest_command(full, scale, tmp_path):
    root = speed_comparison.suite_root()
    command = speed_comparison.pytest_command(root, tmp_path / "b.json", full=full, threads=3)
    assert command[1:3] == ["-m", "pytest"]
    assert f"--slice-scale={scale}" in command
    assert "--slice-threads=3" in command
    assert f"--benchmark-json={tmp_path / 'b.json'}" in command
    assert ["-m", "speed"] == command[command.index("speed") - 1 : command.index("speed") + 1]


def test_bench_writes_the_table_and_the_plot(fake_pytest, tmp_path, capsys):
    calls, _ = fake_pytest
    assert cli.main(["bench", "--out", str(tmp_path / "out")]) == 0
    (command, cwd), = calls
    assert cwd == speed_comparison.suite_root()
    table = (tmp_path / "out" / "benchmark.md").read_text()
    assert table.startswith("2026-11-23")
    assert "| seed_table episode 5000000/6000000 | 10 ms | 500 µs | 20.00x |" in table
    assert (tmp_path / "out" / "benchmark.png").read_bytes().startswith(b"\x89PNG")
    out = capsys.readouterr().out
    assert "slice_boundary_index" in out  # the status comes first
    assert "| online sample-after-write episode 40000000/60000000 | 80 ms | 1 ms | 80.00x |" in out


def test_bench_json_prints_rows_for_machines(fake_pytest, tmp_path, capsys):
    assert cli.main(["bench", "--json", "--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["scenario"] for row in rows][0] == "seed_table episode 1000000/1200000"
    assert rows[0]["stock_s"] == 0.004 and rows[0]["patched_s"] == 0.0005
    assert rows[0]["speedup"] == 8.0


def test_bench_compare_fails_on_a_slower_patched_build(fake_pytest, tmp_path, capsys):
    _, state = fake_pytest
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(_report()))
    assert cli.main(["bench", "--out", str(tmp_path / "a"), "--compare", str(baseline)]) == 0
    state["report"] = _report(patched_seed_time=0.0008)  # speed-ups 8x -> 5x, 20x -> 12.5x
    assert cli.main(["bench", "--out", str(tmp_path / "b"), "--compare", str(baseline)]) == 1
    assert capsys.readouterr().err.count("regression: seed_table") == 2
    assert cli.main(
        ["bench", "--out", str(tmp_path / "c"), "--compare", str(baseline), "--margin", "0.7"]
    ) == 0


def test_bench_reports_failing_benchmarks_and_missing_requirements(
    fake_pytest, tmp_path, monkeypatch, capsys
):
    _, state = fake_pytest
    state["returncode"] = 1
    assert cli.main(["bench", "--out", str(tmp_path)]) == 1
    assert "the benchmarks failed" in capsys.readouterr().err
    monkeypatch.setattr(speed_comparison, "missing_requirements", lambda: ["matplotlib"])
    assert cli.main(["bench", "--out", str(tmp_path)]) == 2
    assert "need matplotlib" in capsys.readouterr().err


def test_a_baseline_that_this_run_would_overwrite_is_refused(fake_pytest, tmp_path, capsys):
    calls, _ = fake_pytest
    (tmp_path / "bench.json").write_text(json.dumps(_report()))
    argv = ["bench", "--out", str(tmp_path), "--compare", str(tmp_path / "bench.json")]
    assert cli.main(argv) == 2
    assert "copy it elsewhere first" in capsys.readouterr().err
    assert cli.main(["bench", "--out", str(tmp_path), "--compare", str(tmp_path / "nope.json")]) == 2
    assert "no baseline" in capsys.readouterr().err
    assert calls == []  # refused before anything ran
