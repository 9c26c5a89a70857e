"""``python -m torchrl_fixes bench``: stock against patched TorchRL, timed on this machine.

Runs the speed benchmarks of the conformance suite (``conformance/test_speed_*.py``,
pytest-benchmark) in the current environment, then writes what they measured into
a results folder:

- ``bench.json``: pytest-benchmark's raw output;
- ``benchmark.md``: a table of scenario, stock median, patched median and speed-up,
  headed by the date, the machine and the versions;
- ``benchmark.png``: sample time against stored transitions, log-log, stock and
  patched, for a static buffer and for an online loop.

The slice-sampling benchmarks time stock and patched in turn inside each round, so
a load that comes and goes on the machine hits both alike. The default sizes
(``report``: up to 5M stored transitions on a static buffer, 40M in an online loop)
take a few minutes on two cores; ``--full`` adds 346M stored transitions in a 600M
buffer, which needs about 18 GiB of memory (checked before anything starts).
``--compare BASELINE.json`` fails (exit code 1) when a scenario's speed-up falls
more than ``--margin`` below the baseline's.

The benchmarks live in the source checkout (``conformance/``), next to the package;
they need ``pytest``, ``pytest-benchmark`` and ``matplotlib``
(``pip install -e '.[bench]'``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

GiB = 1 << 30
SPEED_FILES = ("test_speed_slice_sampling.py", "test_speed_single_gather.py")
REQUIREMENTS = ("pytest", "pytest_benchmark", "matplotlib")


class SpeedComparisonError(RuntimeError):
    """The comparison cannot run here; the message says why and what to do."""


def suite_root() -> Path:
    """The source checkout holding ``conformance/``, next to the package.

    Raises:
        SpeedComparisonError: when the package was installed without its checkout.
    """
    root = Path(__file__).resolve().parent.parent
    if not all((root / "conformance" / name).is_file() for name in SPEED_FILES):
        raise SpeedComparisonError(
            f"the speed benchmarks are not next to the package ({root / 'conformance'} "
            "has no test_speed_*.py): they ship with the source checkout. Clone the "
            "repository, `pip install -e '.[bench]'` there, and run this command again."
        )
    return root


def missing_requirements() -> list[str]:
    """The modules the benchmarks need that this environment lacks."""
    return [name for name in REQUIREMENTS if importlib.util.find_spec(name) is None]


def check_memory(root: Path, full: bool) -> None:
    """Refuses a ``--full`` run up front when the memory it needs is not available."""
    if not full:
        return
    _import_suite(root)
    from conformance.host_memory import available_memory
    from conformance.test_speed_slice_sampling import memory_for_scale

    needed = memory_for_scale("full")
    available = available_memory()
    if available is not None and available < needed:
        raise SpeedComparisonError(
            f"--full needs about {needed / GiB:.0f} GiB of available memory "
            f"(two 600M-row buffers side by side); this machine has "
            f"{available / GiB:.1f} GiB available. Run without --full."
        )


def _import_suite(root: Path) -> None:
    """Makes the checkout's ``conformance`` package importable."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def pytest_command(root: Path, json_path: Path, *, full: bool, threads: int) -> list[str]:
    """The pytest command line that runs the benchmarks and saves their JSON."""
    return [
        sys.executable,
        "-m",
        "pytest",
        *(str(root / "conformance" / name) for name in SPEED_FILES),
        "-m",
        "speed",
        "-p",
        "no:cacheprovider",
        "-v",
        "--benchmark-columns=median,rounds",
        f"--slice-scale={'full' if full else 'report'}",
        f"--slice-threads={threads}",
        f"--benchmark-json={json_path}",
    ]


def run(
    out_dir: str | os.PathLike = "results",
    *,
    full: bool = False,
    threads: int = 1,
    compare: str | os.PathLike | None = None,
    margin: float = 0.3,
    as_json: bool = False,
) -> int:
    """Runs the comparison and writes the results; returns the exit code.

    Args:
        out_dir (path): where ``bench.json``, ``benchmark.md`` and ``benchmark.png`` go.

    Keyword Args:
        full (bool): add the report-scale rows (346M / 600M).
        threads (int): torch's thread count during the benchmarks.
        compare (path, optional): a ``bench.json`` of an earlier run to guard against.
        margin (float): how far below the baseline's a speed-up may fall.
        as_json (bool): print the rows as JSON (for machines) instead of the table;
            the benchmarks' progress then goes to standard error.
    """
    root = suite_root()
    missing = missing_requirements()
    if missing:
        raise SpeedComparisonError(
            f"the benchmarks need {', '.join(missing)}: `pip install -e '.[bench]'` "
            f"in {root}"
        )
    check_memory(root, full)
    out = Path(out_dir).resolve()
    json_path = out / "bench.json"
    if compare is not None:
        if not Path(compare).is_file():
            raise SpeedComparisonError(f"no baseline at {compare}")
        if Path(compare).resolve() == json_path:
            raise SpeedComparisonError(
                f"the baseline {compare} is the file this run writes: copy it elsewhere first"
            )
    out.mkdir(parents=True, exist_ok=True)
    command = pytest_command(root, json_path, full=full, threads=threads)
    progress = sys.stderr if as_json else sys.stdout
    progress.flush()
    result = subprocess.run(command, cwd=root, stdout=progress, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        print(f"the benchmarks failed (pytest exit code {result.returncode})", file=sys.stderr)
        return result.returncode

    _import_suite(root)
    from conformance import speed_report

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
        print(f"\nwritten: {json_path}, {out / 'benchmark.md'}, {out / 'benchmark.png'}")
    if compare is None:
        return 0
    baseline = json.loads(Path(compare).read_text(encoding="utf-8"))
    found = speed_report.regressions(report, baseline, margin=margin)
    for line in found:
        print(f"regression: {line}", file=sys.stderr)
    if not found:
        print(f"no scenario's speed-up fell more than {margin:.0%} below {compare}", file=sys.stderr)
    return 1 if found else 0
