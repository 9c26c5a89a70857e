"""Stock against patched, from a pytest-benchmark JSON (``--benchmark-json=PATH``).

The speed benchmarks put ``scenario`` and ``variant`` (``stock`` or ``patched``) in
each benchmark's ``extra_info``. :func:`markdown_table` pairs them by scenario and
gives the median of each and the speed-up, stock median / patched median.

    python -m conformance.speed_report bench.json
"""
from __future__ import annotations

import json
import sys
from os import PathLike
from typing import Any

VARIANTS = ("stock", "patched")


def medians(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Scenario -> variant -> median seconds, in the order scenarios first appear.

    A benchmark whose ``variant`` is ``pair`` timed both variants in turn and
    carries their medians as ``stock_median_s`` and ``patched_median_s``.
    Benchmarks without a ``scenario`` / ``variant`` in ``extra_info``, or without
    statistics (``--benchmark-disable``), are left out.
    """
    table: dict[str, dict[str, float]] = {}
    for bench in report.get("benchmarks", []):
        info = bench.get("extra_info") or {}
        stats = bench.get("stats") or {}
        scenario, variant = info.get("scenario"), info.get("variant")
        if variant == "pair" and "stock_median_s" in info:
            # both variants timed in turn within one benchmark
            table[scenario] = {v: float(info[f"{v}_median_s"]) for v in VARIANTS}
            continue
        if scenario is None or variant not in VARIANTS or "median" not in stats:
            continue
        table.setdefault(scenario, {})[variant] = float(stats["median"])
    return table


def format_seconds(seconds: float | None) -> str:
    """``seconds`` with three significant digits in s, ms or µs; a dash for none."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if float(f"{seconds / scale:.3g}") >= 1:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def markdown_table(report: dict[str, Any] | str | PathLike) -> str:
    """A markdown table: scenario, stock median, patched median, speed-up.

    ``report`` is the parsed JSON or a path to it. The speed-up is stock / patched
    (above 1: the patched build is faster); a dash where one side is missing.
    """
    if not isinstance(report, dict):
        with open(report, encoding="utf-8") as handle:
            report = json.load(handle)
    lines = [
        "| scenario | stock median | patched median | speed-up (stock/patched) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for scenario, row in medians(report).items():
        stock, patched = row.get("stock"), row.get("patched")
        speedup = f"{stock / patched:.2f}x" if stock is not None and patched else "-"
        lines.append(
            f"| {scenario} | {format_seconds(stock)} | {format_seconds(patched)} | {speedup} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m conformance.speed_report BENCHMARK_JSON", file=sys.stderr)
        return 2
    print(markdown_table(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
