"""The index readers' measurement: its command line and what it prints (its numbers are measurements, not tested here)."""
from __future__ import annotations

import re
import threading

import pytest

from devtools import index_readers

LABEL = r"\[torchrl \S+ from torchrl_fixes\]"
RUN = re.compile(r"run 1: reader (\d+) samples, writer (\d+) writes and samples, exceptions (\d+)")


@pytest.mark.parametrize(
    "argv",
    [
        ["race", "--seconds", "0"],
        ["race", "--runs", "0"],
        ["race", "--capacity", "8"],
        ["race", "--write", "401"],
        ["memory", "--rows", "999"],
        ["memory", "--writes", "0"],
        ["foreign", "--stored", "9999"],
        ["foreign", "--write", "0"],
        ["foreign", "--stored", "10000", "--write", "2501"],
        ["foreign", "--writes", "0"],
    ],
)
def test_bad_sizes_are_a_usage_error_in_one_line(argv, capsys):
    assert index_readers.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith(f"{index_readers.PROG} {argv[0]}: --")


@pytest.mark.parametrize("argv", [["race", "--seconds", "soon"], ["walk"], []])
def test_a_malformed_command_line_is_one_line_too(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        index_readers.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err


def test_race_with_the_fixes_raises_nothing(capsys, torch_threads_restored):
    assert index_readers.main(["race", "--seconds", "1", "--runs", "1", "--fixes"]) == 0
    header, run, summary = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"race: slice sampler, 400 rows, writes of 50 \(.+\), 1 x 1 s, .+  {LABEL}", header)
    reader, writer, errors = map(int, RUN.fullmatch(run).groups())
    assert reader > 0 and writer > 0 and errors == 0
    assert summary == "0 of 1 runs raised"


def test_a_race_that_raises_is_reported_by_kind_and_exits_1(monkeypatch, capsys, torch_threads_restored):
    def broken_write(self, n):
        raise ValueError(f"no write of {n} rows")

    monkeypatch.setattr(index_readers._EpisodeStream, "next_write", broken_write)
    assert index_readers.main(["race", "--seconds", "0.2", "--runs", "1", "--write", "7", "--fixes"]) == 1
    _, run, kind, summary = capsys.readouterr().out.splitlines()
    reader, writer, errors = map(int, RUN.fullmatch(run).groups())
    assert reader > 0 and writer == 0 and errors > 0
    assert re.fullmatch(
        rf"  writer: {errors} x ValueError: no write of 7 rows  \(at tests/test_devtools_index_readers.py:\d+ "
        r"in broken_write\)",
        kind,
    )
    assert summary == "1 of 1 runs raised"


def test_memory_prints_the_growth_in_mib(capsys, torch_threads_restored):
    assert index_readers.main(["memory", "--rows", "20000", "--writes", "3", "--fixes"]) == 0
    header, growth = capsys.readouterr().out.splitlines()
    assert re.fullmatch(rf"memory: 20,000 rows, 3 full-capacity writes  {LABEL}", header)
    assert re.fullmatch(
        r"resident \d+ MiB before the writes, [+-]\d+\.\d MiB after them, [+-]\d+\.\d MiB after the next sample",
        growth,
    )


def test_memory_without_proc_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(index_readers, "STATUS", tmp_path / "status")
    assert index_readers.main(["memory"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Linux only" in err


def test_a_thread_still_running_after_the_end_is_a_hang(monkeypatch, capsys, torch_threads_restored):
    released = threading.Event()
    monkeypatch.setattr(index_readers, "HANG_AFTER", 0.2)
    monkeypatch.setattr(index_readers._EpisodeStream, "next_write", lambda self, n: released.wait(30))
    try:
        assert index_readers.main(["race", "--seconds", "0.2", "--runs", "2", "--fixes"]) == 1
    finally:
        released.set()
    _, run, hang, summary = capsys.readouterr().out.splitlines()
    assert RUN.fullmatch(run).group(2) == "0"
    assert hang == "run 1: the writer still running 0.2 s after the end: a hang; no further run"
    assert summary == "0 of 1 runs raised"


def test_foreign_prints_the_ratio_and_the_samples_equal_to_stock(capsys, torch_threads_restored):
    assert index_readers.main(["foreign", "--stored", "20000", "--write", "100", "--writes", "3", "--fixes"]) == 0
    header, timing, equal = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        rf"foreign: 20,000 rows stored, 3 writes of 100 by another process, samples of 256 rows  {LABEL}", header
    )
    assert re.fullmatch(
        r"slice sample after a foreign write: median \d+\.\d{3} ms; RandomSampler floor \d+\.\d{3} ms; "
        r"ratio \d+\.\d\dx the floor",
        timing,
    )
    assert equal == "samples equal to stock's whole-storage recovery: 3 of 3"
