"""Stock against patched, from a pytest-benchmark JSON (``--benchmark-json=PATH``).

The speed benchmarks put ``scenario`` and ``variant`` in each benchmark's
``extra_info``. A ``variant`` of ``stock`` or ``patched`` times one build, and the
benchmark's median is that build's; a ``variant`` of ``pair`` times both in turn
within one benchmark and carries their medians as ``stock_median_s`` and
``patched_median_s``. ``extra_info`` may also say what was timed: ``operation``
(``seed_table``, ``online sample-after-write``, ...), the trajectory ``key``
(``episode``, ``done``, ``unnamed``), the transitions ``stored``, the buffer
``capacity``, the ``episode_len`` and the ``torchrl`` (and ``torch``) version. A
benchmark may also time floors in the same rounds, the references it is compared with:
``floor_median_s``, a RandomSampler sample of the same batch, and
``gather_floor_median_s``, the gather of the sample's own rows (``storage[index]``
with an index the patched sampler drew, so that patched / gather floor is what the
sampler adds to reading the rows). Benchmarks without a scenario and variant, or
without statistics (``--benchmark-disable``), are left out.

- :func:`medians` and :func:`rows` pair the two builds by scenario;
- :func:`markdown_table` gives the median of each and the speed-up, stock median /
  patched median, then each floor with patched / floor; :func:`write_markdown`
  writes it under :func:`run_header`, one line saying when, where and with which
  versions the benchmarks ran;
- :func:`plot` draws the sample time against the transitions stored, and the
  sweep's against the trajectories stored beside its floors (PNG);
- :func:`regressions` compares the speed-ups with those of a baseline run. Each
  speed-up is a ratio of two medians from the same run, so the speed of the
  machine cancels out and runs from different machines can be compared.

From the command line::

    python -m conformance.speed_report bench.json
    python -m conformance.speed_report bench.json --markdown speed.md --plot speed.png
    python -m conformance.speed_report bench.json --compare baseline.json --margin 0.3
    python -m conformance.speed_report bench.json --json

The table (or, with ``--json``, the rows as a JSON list) goes to stdout. With
``--compare`` the regressions go to stderr and the exit status is 1 when there is any.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from os import PathLike
from typing import Any

VARIANTS = ("stock", "patched")
# The floors a ``pair`` benchmark may time beside the variants, as ``{name}_median_s``.
FLOORS = ("floor", "gather_floor")

# One colour per series, the same in both panels of :func:`plot`.
SERIES_COLORS = {
    "stock": "tab:red",
    "patched": "tab:blue",
    "floor": "tab:gray",
    "gather_floor": "tab:green",
}
# (operation, legend label, line style) of the lines :func:`plot` draws by stored size.
PLOTTED_OPERATIONS = (
    ("seed_table", "static buffer", "-"),
    ("online sample-after-write", "online, sample after a write", "--"),
)
PLOTTED_KEY = "episode"
# The rows drawn against the number of trajectories, with their floors.
SWEEP_OPERATION = "sweep sample-after-write"
SWEEP_KEY = "done"
# (Row field, legend label, line style) of the sweep's lines.
SWEEP_LINES = (
    ("stock", "stock", "-"),
    ("patched", "patched", "-"),
    ("floor", "RandomSampler floor", ":"),
    ("gather_floor", "gather floor", "-."),
)
# What the floors are, said under the figure so that it reads without the README.
FLOORS_CAPTION = (
    "Floors, timed in the same rounds on the "
    "same storage: RandomSampler floor = a RandomSampler sample of the same batch "
    "(scattered rows; the slices read runs of rows, so they can cost less); gather floor = "
    "reading the sample's own rows, storage[index]."
)
PLOT_TITLE = "SliceSampler sample time: stock vs torchrl_fixes"

Report = dict[str, Any]


def load(report: Report | str | PathLike) -> Report:
    """``report`` itself if it is the parsed JSON already, else the JSON at that path."""
    if isinstance(report, dict):
        return report
    with open(report, encoding="utf-8") as handle:
        return json.load(handle)


def _timed(report: Report) -> Iterator[tuple[str, dict[str, Any], dict[str, float]]]:
    """(scenario, extra_info, variant -> median seconds) of each benchmark that has them."""
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        stats = bench.get("stats") or {}
        scenario, variant = info.get("scenario"), info.get("variant")
        if scenario is None:
            continue
        if variant == "pair" and "stock_median_s" in info:
            # both variants timed in turn within one benchmark, and maybe their floors
            yield scenario, info, {
                v: float(info[f"{v}_median_s"])
                for v in (*VARIANTS, *FLOORS)
                if f"{v}_median_s" in info
            }
        elif variant in VARIANTS and "median" in stats:
            yield scenario, info, {variant: float(stats["median"])}


def medians(report: Report) -> dict[str, dict[str, float]]:
    """Scenario -> variant (or floor) -> median seconds, in the order scenarios first appear.

    A benchmark whose ``variant`` is ``pair`` timed both variants in turn and
    carries their medians as ``stock_median_s`` and ``patched_median_s``, and those
    of the floors it timed as ``{floor}_median_s`` (:data:`FLOORS`).
    Benchmarks without a ``scenario`` / ``variant`` in ``extra_info``, or without
    statistics (``--benchmark-disable``), are left out.
    """
    table: dict[str, dict[str, float]] = {}
    for scenario, _, values in _timed(report):
        table.setdefault(scenario, {}).update(values)
    return table


@dataclass(frozen=True)
class Row:
    """One scenario: what was timed and the median of each build, in seconds.

    ``operation``, ``key``, ``stored`` and ``capacity`` are ``None`` where the
    benchmarks did not say; ``stock`` / ``patched`` are ``None`` where that build
    was not timed, ``floor`` (a RandomSampler sample of the same batch) and
    ``gather_floor`` (the gather of the sample's own rows) where that floor was not.
    """

    scenario: str
    operation: str | None
    key: str | None
    stored: int | None
    capacity: int | None
    stock: float | None
    patched: float | None
    floor: float | None = None
    episode_len: int | None = None
    gather_floor: float | None = None

    @property
    def speedup(self) -> float | None:
        """Stock median / patched median (above 1: the patched build is faster)."""
        if self.stock is None or not self.patched:
            return None
        return self.stock / self.patched

    @property
    def over_floor(self) -> float | None:
        """Patched median / floor median (1: as fast as the floor), where a floor was timed."""
        return self._over(self.floor)

    @property
    def over_gather_floor(self) -> float | None:
        """Patched median / gather floor median (what the sampler adds to reading the rows).

        ``None`` where no gather floor was timed.
        """
        return self._over(self.gather_floor)

    def _over(self, floor: float | None) -> float | None:
        if self.patched is None or not floor:
            return None
        return self.patched / floor


def rows(report: Report | str | PathLike) -> list[Row]:
    """One :class:`Row` per scenario, in the order scenarios first appear.

    ``report`` is the parsed JSON or a path to it. What was timed comes from the
    first benchmark of the scenario whose ``extra_info`` gives it.

    Examples:
        >>> bench = {"extra_info": {"scenario": "seed_table episode 1M/1.2M",
        ...     "variant": "pair", "operation": "seed_table", "key": "episode",
        ...     "stored": 1_000_000, "capacity": 1_200_000,
        ...     "stock_median_s": 0.024, "patched_median_s": 0.0003}}
        >>> (row,) = rows({"benchmarks": [bench]})
        >>> row.operation, row.stored, round(row.speedup)
        ('seed_table', 1000000, 80)
    """
    report = load(report)
    described: dict[str, dict[str, Any]] = {}
    for scenario, info, _ in _timed(report):
        fields = described.setdefault(scenario, {})
        for name in ("operation", "key", "stored", "capacity", "episode_len"):
            if fields.get(name) is None and info.get(name) is not None:
                fields[name] = info[name]
    table = []
    for scenario, values in medians(report).items():
        fields = described[scenario]
        stored, capacity = fields.get("stored"), fields.get("capacity")
        episode_len = fields.get("episode_len")
        table.append(
            Row(
                scenario=scenario,
                operation=fields.get("operation"),
                key=fields.get("key"),
                stored=None if stored is None else int(stored),
                capacity=None if capacity is None else int(capacity),
                stock=values.get("stock"),
                patched=values.get("patched"),
                floor=values.get("floor"),
                episode_len=None if episode_len is None else int(episode_len),
                gather_floor=values.get("gather_floor"),
            )
        )
    return table


def _first_extra(report: Report, name: str) -> str | None:
    """``extra_info[name]`` of the first benchmark that has it."""
    for bench in report.get("benchmarks", []):
        value = (bench.get("extra_info") or {}).get(name)
        if value is not None:
            return str(value)
    return None


def run_header(report: Report | str | PathLike) -> str:
    """One line saying when, on what and with which versions the benchmarks ran.

    The date comes from the JSON's ``datetime``, the machine from its
    ``machine_info`` (CPU brand and count where known, else the processor or
    architecture), the torch / torchrl versions from the benchmarks' ``extra_info``.
    Parts the JSON lacks are left out; an empty string when it has none.

    Examples:
        >>> run_header({"datetime": "2026-11-23T10:00:00+00:00",
        ...     "machine_info": {"python_version": "3.12.3",
        ...         "cpu": {"brand_raw": "AMD EPYC 9654", "count": 16}},
        ...     "benchmarks": [{"extra_info": {"torchrl": "0.11.0"}}]})
        '2026-11-23 · AMD EPYC 9654 (16 CPUs) · Python 3.12.3 · torchrl 0.11.0'
    """
    report = load(report)
    parts = []
    stamp = report.get("datetime")
    if stamp:
        try:
            parts.append(datetime.fromisoformat(stamp).date().isoformat())
        except ValueError:
            # e.g. a trailing "Z", which fromisoformat takes only from Python 3.11 on
            parts.append(str(stamp)[:10])
    machine_info = report.get("machine_info") or {}
    cpu = machine_info.get("cpu") or {}
    machine = cpu.get("brand_raw") or machine_info.get("processor") or machine_info.get("machine")
    if machine:
        count = cpu.get("count")
        parts.append(f"{machine} ({count} CPUs)" if count else str(machine))
    if machine_info.get("python_version"):
        parts.append(f"Python {machine_info['python_version']}")
    for package in ("torch", "torchrl"):
        version = _first_extra(report, package)
        if version is not None:
            parts.append(f"{package} {version}")
    return " · ".join(parts)


def format_seconds(seconds: float | None) -> str:
    """``seconds`` with three significant digits in s, ms or µs; a dash for none."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if float(f"{seconds / scale:.3g}") >= 1:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def markdown_table(report: Report | str | PathLike) -> str:
    """A markdown table: scenario, stock median, patched median, speed-up, and the floors.

    ``report`` is the parsed JSON or a path to it. The speed-up is stock / patched
    (above 1: the patched build is faster). The floors, where they were timed: a
    RandomSampler sample of the same batch, with patched / floor beside it, then the
    gather of the sample's own rows, with patched / gather floor (what the sampler
    adds to reading the rows) beside it. A dash where a value is missing.
    """
    lines = [
        "| scenario | stock median | patched median | speed-up (stock/patched) "
        "| RandomSampler floor | patched/floor | gather floor | patched/gather floor |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows(report):
        lines.append(
            f"| {row.scenario} | {format_seconds(row.stock)} | {format_seconds(row.patched)}"
            f" | {_ratio(row.speedup)} | {format_seconds(row.floor)} | {_ratio(row.over_floor)}"
            f" | {format_seconds(row.gather_floor)} | {_ratio(row.over_gather_floor)} |"
        )
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def write_markdown(report: Report | str | PathLike, path: str | PathLike) -> None:
    """Write :func:`run_header`, a blank line and :func:`markdown_table` to ``path``.

    The header and its blank line are left out when the JSON says nothing of the run.
    """
    report = load(report)
    header = run_header(report)
    text = markdown_table(report) + "\n"
    if header:
        text = f"{header}\n\n{text}"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _plotted_points(table: list[Row], operation: str, variant: str) -> list[tuple[int, float]]:
    """(stored, median seconds) of one line of :func:`plot`, by transitions stored.

    Of the rows with the same transitions stored, the smallest buffer is kept: the
    capacity is the other size the sample time grows with, so that keeps the line
    one of stored transitions alone.
    """
    chosen: dict[int, Row] = {}
    for row in table:
        median = getattr(row, variant)
        if row.operation != operation or row.key != PLOTTED_KEY:
            continue
        # a log axis has no room for zero or a missing value
        if row.stored is None or row.stored <= 0 or median is None or median <= 0:
            continue
        kept = chosen.get(row.stored)
        if kept is None or _capacity_order(row) < _capacity_order(kept):
            chosen[row.stored] = row
    return [(stored, getattr(chosen[stored], variant)) for stored in sorted(chosen)]


def _capacity_order(row: Row) -> tuple[bool, int]:
    # rows that do not give their capacity come after those that do
    return (row.capacity is None, row.capacity or 0)


def plot(report: Report | str | PathLike, path: str | PathLike) -> None:
    """Draw the median sample time against the transitions stored, log-log, as a PNG.

    One line per operation of :data:`PLOTTED_OPERATIONS` (``seed_table``: a static
    buffer, solid; ``online sample-after-write``: a sample right after a write,
    dashed) and build, from the rows whose trajectory key is ``episode``. Where there
    are ``sweep sample-after-write`` rows, a second panel draws those of the largest
    stored size against the trajectories stored, with one line per build and per
    floor (:data:`SWEEP_LINES`). Each build and floor has one colour in both panels
    (:data:`SERIES_COLORS`), and under the sweep's panel the figure says what the
    floors are (:data:`FLOORS_CAPTION`). Lines without a point are left out.

    Args:
        report: the parsed pytest-benchmark JSON or a path to it.
        path: where the PNG goes.

    Raises:
        ValueError: when no row gives a point of any line.
    """
    # matplotlib is needed for the plot only; the table works without it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    report = load(report)
    table = rows(report)
    sweep = _sweep_lines(table)
    lines = []
    for operation, label, style in PLOTTED_OPERATIONS:
        for variant in VARIANTS:
            points = _plotted_points(table, operation, variant)
            if points:
                lines.append((points, f"{variant}, {label}", style, SERIES_COLORS[variant]))
    if not lines and not sweep:
        operations = " or ".join(repr(operation) for operation, _, _ in PLOTTED_OPERATIONS)
        raise ValueError(
            f"nothing to plot: no benchmark with operation {operations}, key "
            f"{PLOTTED_KEY!r}, transitions stored and a median"
        )

    panels = bool(lines) + bool(sweep)
    figure = Figure(figsize=(7 * panels + 1, 6), layout="constrained")
    FigureCanvasAgg(figure)
    header = run_header(report)
    figure.suptitle(f"{PLOT_TITLE}\n{header}" if header else PLOT_TITLE)
    if lines:
        _draw_by_stored(figure.add_subplot(1, panels, 1), lines)
    if sweep:
        _draw_sweep(figure.add_subplot(1, panels, panels), *sweep)
        figure.supxlabel(textwrap.fill(FLOORS_CAPTION, 60 * panels + 20), fontsize="small")
    figure.savefig(path, format="png", dpi=150)


def _draw_by_stored(axes, lines) -> None:
    for points, label, style, color in lines:
        stored = [x for x, _ in points]
        milliseconds = [seconds * 1e3 for _, seconds in points]
        axes.plot(stored, milliseconds, linestyle=style, marker="o", color=color, label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("transitions stored")
    axes.set_ylabel("median sample time (ms)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    axes.set_title(f"by transitions stored, the sampler reading {PLOTTED_KEY} ids", fontsize="small")


def _draw_sweep(axes, stored: int, lines) -> None:
    for points, label, style, color in lines:
        trajectories = [x for x, _ in points]
        milliseconds = [seconds * 1e3 for _, seconds in points]
        axes.plot(trajectories, milliseconds, linestyle=style, marker="o", color=color, label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(f"trajectories stored ({stored / 1e6:g}M transitions, shorter episodes)")
    axes.set_ylabel("median sample time after a write (ms)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    axes.set_title(f"by trajectories stored, the sampler reading {SWEEP_KEY} flags", fontsize="small")


def _sweep_lines(table: list[Row]):
    """``(stored, lines)`` of the sweep's largest stored size, or None without sweep rows.

    One line per build and one per floor (the RandomSampler one and the gather of
    the sample's own rows): (trajectories stored, median seconds).
    """
    found = [
        row for row in table
        if row.operation == SWEEP_OPERATION and row.key == SWEEP_KEY and row.stored and row.episode_len
    ]
    if not found:
        return None
    stored = max(row.stored for row in found)
    found = sorted((row for row in found if row.stored == stored), key=lambda r: r.episode_len, reverse=True)
    lines = []
    for variant, label, style in SWEEP_LINES:
        points = [
            (row.stored // row.episode_len, getattr(row, variant))
            for row in found
            if getattr(row, variant)
        ]
        if points:
            lines.append((points, label, style, SERIES_COLORS[variant]))
    return stored, lines


def regressions(
    current: Report | str | PathLike,
    baseline: Report | str | PathLike,
    margin: float = 0.3,
) -> list[str]:
    """The scenarios whose speed-up fell below that of a baseline run, one line each.

    A scenario regressed when ``current_speedup < baseline_speedup / (1 + margin)``.
    Each speed-up is stock / patched from its own run, so a faster or slower machine
    moves both medians alike and the ratio stays comparable. Scenarios without both
    medians in both runs are not compared.

    Args:
        current: the run to check, parsed JSON or a path to it.
        baseline: the run to check it against, likewise.
        margin: how much lower than the baseline's a speed-up may be, as a fraction
            of it (``0.3``: the floor is the baseline speed-up / 1.3).

    Examples:
        >>> def run(stock):
        ...     return {"benchmarks": [{"extra_info": {"scenario": "s", "variant": "pair",
        ...         "stock_median_s": stock, "patched_median_s": 1.0}}]}
        >>> regressions(run(10.0), run(13.0)), len(regressions(run(9.0), run(13.0)))
        ([], 1)
    """
    if margin < 0:
        raise ValueError(f"margin must be at least 0, got {margin}")
    baseline_speedups = {row.scenario: row.speedup for row in rows(baseline)}
    found = []
    for row in rows(current):
        baseline_speedup = baseline_speedups.get(row.scenario)
        if row.speedup is None or baseline_speedup is None:
            continue
        floor = baseline_speedup / (1 + margin)
        if row.speedup < floor:
            found.append(
                f"{row.scenario}: speed-up {row.speedup:.2f}x, baseline {baseline_speedup:.2f}x,"
                f" floor {floor:.2f}x"
            )
    return found


def row_dict(row: Row) -> dict[str, Any]:
    fields = asdict(row)
    return {
        "scenario": fields["scenario"],
        "operation": fields["operation"],
        "key": fields["key"],
        "stored": fields["stored"],
        "capacity": fields["capacity"],
        "stock_s": fields["stock"],
        "patched_s": fields["patched"],
        "speedup": row.speedup,
        "floor_s": fields["floor"],
        "patched_over_floor": row.over_floor,
        "gather_floor_s": fields["gather_floor"],
        "patched_over_gather_floor": row.over_gather_floor,
        "episode_len": fields["episode_len"],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.speed_report",
        description="Stock against patched medians from a pytest-benchmark JSON.",
    )
    parser.add_argument("benchmark_json", help="output of pytest --benchmark-json=PATH")
    parser.add_argument("--markdown", metavar="OUT.md", help="write the header and table here")
    parser.add_argument("--plot", metavar="OUT.png", help="draw sample time vs stored here")
    parser.add_argument(
        "--compare",
        metavar="BASELINE.json",
        help="report speed-ups below the baseline's (exit status 1 when there is any)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.3,
        help="with --compare: how much lower a speed-up may be, as a fraction (default 0.3)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of the table"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (see the module docstring)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        # argparse exits on bad usage or --help; hand the status back instead
        return int(exit_.code or 0)
    report = load(args.benchmark_json)
    if args.json:
        print(json.dumps([row_dict(row) for row in rows(report)], indent=2))
    else:
        print(markdown_table(report))
    if args.markdown:
        write_markdown(report, args.markdown)
    if args.plot:
        plot(report, args.plot)
    if args.compare is None:
        return 0
    found = regressions(report, args.compare, margin=args.margin)
    if found:
        print(
            f"speed-up regressions against {args.compare} (margin {args.margin:g}):",
            file=sys.stderr,
        )
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(
        f"no speed-up regression against {args.compare} (margin {args.margin:g})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
