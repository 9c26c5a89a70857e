"""``python -m devtools bench``: refusing what cannot run, progress, the table, the results.

The benchmarks themselves take minutes; here ``subprocess.Popen`` is replaced by a
stand-in that writes a small pytest-benchmark JSON and the progress lines the
plugin would, so what the command does with a run's output is checked exactly.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conformance import speed_report, speed_sizes
from devtools import __main__ as cli
from devtools import bench_progress, speed_comparison


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


class FakeProcess:
    """What ``subprocess.Popen`` returns for the benchmark run: progress lines on stderr."""

    def __init__(self, command, cwd, stdout, stderr, text, bufsize, state, calls):
        calls.append((command, cwd))
        json_arg = next(a for a in command if a.startswith("--benchmark-json="))
        Path(json_arg.split("=", 1)[1]).write_text(json.dumps(state["report"]))
        stdout.write("pytest-benchmark tables and the rest of pytest's output\n")
        rows = speed_report.rows(state["report"])
        self.stderr = iter(
            [f"{bench_progress.MARK}{len(rows)} benchmarks to run\n", "a line that is not progress\n"]
            + [f"{bench_progress.MARK}[{i}/{len(rows)}] {row.scenario}: ...\n" for i, row in enumerate(rows, 1)]
        )
        self.returncode = state["returncode"]

    def wait(self):
        return self.returncode


@pytest.fixture
def fake_pytest(monkeypatch):
    """Replaces the benchmark run: records the command and writes ``report`` as its JSON."""
    calls = []
    state = {"report": _report(), "returncode": 0}

    real_popen = subprocess.Popen

    def popen(command, **kwargs):
        if command[1:3] != ["-m", "pytest"]:  # matplotlib's font search, for one
            return real_popen(command, **kwargs)
        return FakeProcess(command, state=state, calls=calls, **kwargs)

    monkeypatch.setattr(speed_comparison.subprocess, "Popen", popen)
    return calls, state


def test_the_memory_figure_is_computed_once():
    """--full's memory is memory_for_scale('full'): both variants' 600M-row buffers at once."""
    assert speed_comparison.full_memory() == speed_sizes.memory_for_scale("full")
    seed = [c for c in speed_sizes.SEED_TABLE if c.scale == "full" and c.key == "episode"][0]
    assert speed_comparison.full_memory() == seed.memory_needed(2)
    assert f"about {speed_comparison.full_memory() / speed_sizes.GiB:.0f} GiB" in (
        speed_comparison.full_run_cost()
    )


def test_the_rows_full_adds_are_named():
    """The default run plus the rows --full adds are every scenario of the full run."""
    added = speed_sizes.scenarios_added("full")
    assert added == [
        "seed_table episode 346M/600M",
        "seed_table sample-after-write episode 346M/600M",
        "seed_table done 346M/600M",
        "seed_table sample-after-write done 346M/600M",
        "cold first sample episode 346M/600M",
        "cold first sample done 346M/600M",
        "cold first sample unnamed 346M/600M",
    ]
    default = speed_sizes.scenarios_added("ci") + speed_sizes.scenarios_added("report")
    assert not set(added) & set(default) and len(set(default)) == len(default)
    assert all(name in speed_comparison.full_run_cost() for name in added)
    # two variants' buffers per seed_table row, a fresh buffer per variant and round when cold
    assert speed_sizes.fills_added("full") == (2 * 2 + 3 * 2 * 2, 346_000_000)


def test_the_default_run_has_the_siblings_rows():
    """SliceSampler's siblings, in 10-step episodes: a small case at the ci scale, and
    the 500k trajectories of 5M stored at the report scale, which the default run reaches."""
    rows = (
        "without_replacement done {}, 10-step episodes",
        "span sample-after-write done {}, 10-step episodes",
        "not_strict sample-after-write done {}, 10-step episodes",
    )
    for scale, sizes in (("ci", "1M/1.2M"), ("report", "5M/6M")):
        added = speed_sizes.scenarios_added(scale)
        assert [name for name in added if "10-step episodes" in name] == [
            row.format(sizes) for row in rows
        ]
    assert "--slice-scale=report" in speed_comparison.pytest_command(
        Path("b.json"), full=False, threads=1
    )
    assert {case.id for case in speed_sizes.FAMILY if case.scale == "ci"} == {
        "done-1M-1.2M-without_replacement-episode10",
        "done-1M-1.2M-span-episode10",
        "done-1M-1.2M-not_strict-episode10",
        "done-1M-1M-prioritized-episode1000",
        "done-1M-1M-prioritized-episode100",
    }


def test_full_runs_are_refused_without_the_memory(monkeypatch):
    monkeypatch.setattr(speed_comparison, "available_memory", lambda: 8 << 30)
    with pytest.raises(speed_comparison.SpeedComparisonError, match=r"needs about 17 GiB"):
        speed_comparison.check_memory(full=True)
    speed_comparison.check_memory(full=False)  # the default sizes need no check
    monkeypatch.setattr(speed_comparison, "available_memory", lambda: 64 << 30)
    speed_comparison.check_memory(full=True)


@pytest.mark.parametrize("full, scale", [(False, "report"), (True, "full")])
def test_pytest_command(full, scale, tmp_path):
    command = speed_comparison.pytest_command(tmp_path / "b.json", full=full, threads=3)
    assert command[1:3] == ["-m", "pytest"]
    assert f"--slice-scale={scale}" in command
    assert "--slice-threads=3" in command
    assert f"--benchmark-json={tmp_path / 'b.json'}" in command
    assert ["-m", "speed"] == command[command.index("speed") - 1 : command.index("speed") + 1]
    assert ["-p", "devtools.bench_progress"] == command[
        command.index("devtools.bench_progress") - 1 : command.index("devtools.bench_progress") + 1
    ]


def test_bench_prints_progress_then_the_one_table(fake_pytest, tmp_path, capsys):
    """Progress lines, then the table made from bench.json, and what --full would add."""
    calls, _ = fake_pytest
    out_dir = tmp_path / "out"
    assert cli.main(["bench", "--out", str(out_dir)]) == 0
    (command, cwd), = calls
    assert cwd == speed_comparison.ROOT
    out = capsys.readouterr().out
    assert out.index("slice_boundary_index") < out.index("4 benchmarks to run")  # status first
    assert "[4/4] online sample-after-write episode 40000000/60000000: ..." in out
    assert "pytest-benchmark" not in out and "not progress" not in out
    assert bench_progress.MARK not in out
    # the one table printed is the one bench.json gives, and benchmark.md holds it too
    table = speed_report.markdown_table(json.loads((out_dir / "bench.json").read_text()))
    assert out.count("| scenario |") == 1
    assert table in out
    assert (out_dir / "benchmark.md").read_text() == "2026-11-23 · Test CPU (2 CPUs) · " \
        "Python 3.11.7 · torch 2.13.0 · torchrl 0.14.1\n\n" + table + "\n"
    assert "| seed_table episode 5000000/6000000 | 10 ms | 500 µs | 20.00x |" in table
    assert (out_dir / "benchmark.png").read_bytes().startswith(b"\x89PNG")
    # pytest's own output is kept, with what was not progress
    assert "not progress" in (out_dir / "bench.log").read_text()
    assert out.rstrip().splitlines()[-1] == f"not run: {speed_comparison.full_run_cost()}"


def test_bench_options_are_its_own_and_validated(fake_pytest, tmp_path, capsys):
    calls, _ = fake_pytest
    for argv, bad in (
        (["bench", "--threads", "0"], "--threads"),
        (["bench", "--margin", "-1"], "--margin"),
        (["bench", "--check"], "--check"),
        (["compare", "--json"], "--json"),
        (["export-patches", "--full"], "--full"),
        (["patched-copy"], "dest"),
        ([], "COMMAND"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2, argv
        err = capsys.readouterr().err
        assert "usage: python -m devtools" in err and bad in err, (argv, err)
    assert calls == []


def test_bench_failure_shows_the_end_of_the_log(fake_pytest, tmp_path, capsys):
    _, state = fake_pytest
    state["returncode"] = 3
    assert cli.main(["bench", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "pytest-benchmark tables" in err  # the log's tail
    assert f"the benchmarks failed (pytest exit code 3); their whole output: {tmp_path / 'bench.log'}" in err


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


def test_bench_reports_missing_requirements(
    fake_pytest, tmp_path, monkeypatch, capsys
):
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


def test_progress_lines_say_what_landed():
    """The plugin's line for a pair, for one build, and what a test measures."""
    pair = {"variant": "pair", "stock_median_s": 0.0088, "patched_median_s": 0.00063}
    assert bench_progress.landed(pair, None) == "stock 8.8 ms, patched 630 µs, 13.97x"

    class Stats:
        median = 0.153

    one = {"variant": "stock", "sampler": "slice", "slice_over_random": 1.414}
    assert bench_progress.landed(one, Stats()) == "median 153 ms, slice/random 1.41x"

    class Item:
        def function():
            """One ``rb.sample()`` (256 slices of 4) on a static
            buffer. More detail here.
            """

    assert bench_progress.what_it_measures(Item) == "One rb.sample() (256 slices of 4) on a static buffer"
