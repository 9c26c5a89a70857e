"""``python -m devtools bench``: stock against patched TorchRL, timed on this machine.

Runs the speed benchmarks of the conformance suite (``conformance/test_speed_*.py``,
pytest-benchmark) in the current environment. While they run it prints one line per
benchmark as it lands (``[i/n] scenario: stock ..., patched ..., ratio``), then the
table of every scenario, and writes into a results folder (:data:`LOCAL_RESULTS`, which
git ignores, unless told otherwise):

- ``bench.json``: pytest-benchmark's raw output, which the table is made from;
- ``benchmark.md``: the table of scenario, stock median, patched median and
  speed-up, headed by the date, the machine and the versions;
- ``benchmark.png``: sample time against stored transitions, log-log, stock and
  patched, for a static buffer and for an online loop;
- ``bench.log``: everything pytest printed, pytest-benchmark's own tables included.

The slice-sampling benchmarks time stock and patched in turn inside each round, so
a load that comes and goes on the machine hits both alike. The default sizes
(``report``: up to 5M stored transitions on a static buffer, 40M in an online loop)
take a few minutes on two cores; ``--full`` adds the rows of 346M stored transitions
in a 600M buffer (:func:`full_run_cost`), whose memory is checked before anything
starts. ``--compare BASELINE.json`` fails (exit code 1) when a scenario's speed-up
falls more than ``--margin`` below the baseline's.

It needs a clone of the repository (the benchmarks are its ``conformance/``) and
``pytest``, ``pytest-benchmark`` and ``matplotlib`` (``pip install -e '.[bench]'``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

from conformance import speed_report, speed_sizes
from conformance.host_memory import available_memory

ROOT = Path(__file__).resolve().parent.parent
GiB = speed_sizes.GiB
SPEED_FILES = ("test_speed_slice_sampling.py", "test_speed_single_gather.py")
REQUIREMENTS = ("pytest", "pytest_benchmark", "matplotlib")
# Where a run writes by default: a folder git ignores, so that a run leaves the clone
# clean; ``results/`` itself holds the committed run the README quotes.
LOCAL_RESULTS = "results/latest"
# How long one 346M-row buffer takes to fill on the 2-core development machine.
FILL_SECONDS_PER_ROW = 60 / 346_000_000


class SpeedComparisonError(RuntimeError):
    """The comparison cannot run here; the message says why and what to do."""


def missing_requirements() -> list[str]:
    """The modules the benchmarks need that this environment lacks."""
    return [name for name in REQUIREMENTS if importlib.util.find_spec(name) is None]


def full_memory() -> int:
    """Bytes of available memory ``--full`` needs: :func:`conformance.speed_sizes.memory_for_scale`."""
    return speed_sizes.memory_for_scale("full")


def full_run_cost() -> str:
    """What ``--full`` adds to a default run: its rows, the memory it needs and its time.

    Examples:
        >>> print(full_run_cost())  # doctest: +ELLIPSIS
        7 rows need --full (seed_table episode 346M/600M, ...): about 17 GiB of available memory, and 16 fills of a 346M-row buffer, about 16 minutes more on a 2-core machine.
    """
    added = speed_sizes.scenarios_added("full")
    fills, rows = speed_sizes.fills_added("full")
    minutes = fills * rows * FILL_SECONDS_PER_ROW / 60
    return (
        f"{len(added)} rows need --full ({', '.join(added)}): about "
        f"{full_memory() / GiB:.0f} GiB of available memory, and {fills} fills of a "
        f"{speed_sizes.size(rows)}-row buffer, about {minutes:.0f} minutes more on a "
        "2-core machine."
    )


def check_memory(full: bool) -> None:
    """Refuses a ``--full`` run up front when the memory it needs is not available."""
    if not full:
        return
    needed = full_memory()
    available = available_memory()
    if available is not None and available < needed:
        raise SpeedComparisonError(
            f"--full needs about {needed / GiB:.0f} GiB of available memory "
            f"(two 600M-row buffers side by side); this machine has "
            f"{available / GiB:.1f} GiB available. Run without --full."
        )


def pytest_command(json_path: Path, *, full: bool, threads: int) -> list[str]:
    """The pytest command line that runs the benchmarks, reports progress and saves their JSON."""
    return [
        sys.executable,
        "-m",
        "pytest",
        *(str(ROOT / "conformance" / name) for name in SPEED_FILES),
        "-m",
        "speed",
        "-p",
        "no:cacheprovider",
        "-p",
        "devtools.bench_progress",
        "--benchmark-columns=median,rounds",
        f"--slice-scale={'full' if full else 'report'}",
        f"--slice-threads={threads}",
        f"--benchmark-json={json_path}",
    ]


def _run_benchmarks(command: list[str], log_path: Path, progress) -> int:
    """Runs ``command``: its output goes to ``log_path``, its progress lines to ``progress``."""
    from devtools.bench_progress import MARK

    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        others = []
        for line in process.stderr:
            if line.startswith(MARK):
                print(line[len(MARK) :], end="", file=progress, flush=True)
            else:
                others.append(line)
        returncode = process.wait()
        log.writelines(others)
    return returncode


def _tail(path: Path, lines: int = 30) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


def run(
    out_dir: str | os.PathLike = LOCAL_RESULTS,
    *,
    full: bool = False,
    threads: int = 1,
    compare: str | os.PathLike | None = None,
    margin: float = 0.3,
    as_json: bool = False,
) -> int:
    """Runs the comparison and writes the results; returns the exit code.

    Args:
        out_dir (path): where ``bench.json``, ``benchmark.md``, ``benchmark.png`` and
            ``bench.log`` go.

    Keyword Args:
        full (bool): add the rows of 346M stored transitions in a 600M buffer.
        threads (int): torch's thread count during the benchmarks.
        compare (path, optional): a ``bench.json`` of an earlier run to guard against.
        margin (float): how far below the baseline's a speed-up may fall.
        as_json (bool): print the rows as JSON (for machines) instead of the table;
            the progress lines then go to standard error.
    """
    missing = missing_requirements()
    if missing:
        raise SpeedComparisonError(
            f"the benchmarks need {', '.join(missing)}: `pip install -e '.[bench]'` in {ROOT}"
        )
    check_memory(full)
    out = Path(out_dir).resolve()
    json_path = out / "bench.json"
    log_path = out / "bench.log"
    if compare is not None:
        if not Path(compare).is_file():
            raise SpeedComparisonError(f"no baseline at {compare}")
        if Path(compare).resolve() == json_path:
            raise SpeedComparisonError(
                f"the baseline {compare} is the file this run writes: copy it elsewhere first"
            )
    out.mkdir(parents=True, exist_ok=True)
    progress = sys.stderr if as_json else sys.stdout
    progress.flush()
    returncode = _run_benchmarks(pytest_command(json_path, full=full, threads=threads), log_path, progress)
    if returncode != 0:
        print(_tail(log_path), end="", file=sys.stderr)
        print(
            f"the benchmarks failed (pytest exit code {returncode}); their whole output: {log_path}",
            file=sys.stderr,
        )
        return returncode

    report = json.loads(json_path.read_text(encoding="utf-8"))
    speed_report.write_markdown(report, out / "benchmark.md")
    speed_report.plot(report, out / "benchmark.png")
    if as_json:
        print(json.dumps([speed_report.row_dict(row) for row in speed_report.rows(report)], indent=2))
    else:
        print()
        print(speed_report.run_header(report))
        print()
        print(speed_report.markdown_table(report))
        print(f"\nwritten: {json_path}, {out / 'benchmark.md'}, {out / 'benchmark.png'}, {log_path}")
    if not full:
        print(f"not run: {full_run_cost()}", file=progress)
    if compare is None:
        return 0
    baseline = json.loads(Path(compare).read_text(encoding="utf-8"))
    found = speed_report.regressions(report, baseline, margin=margin)
    for line in found:
        print(f"regression: {line}", file=sys.stderr)
    if not found:
        print(f"no scenario's speed-up fell more than {margin:.0%} below {compare}", file=sys.stderr)
    return 1 if found else 0
