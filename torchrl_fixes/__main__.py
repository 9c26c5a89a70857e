"""Command line: ``python -m torchrl_fixes [status|compare|bench]``.

``status`` (the default) prints, for each fix, whether it is applied and why not.
``compare`` runs the same replay-buffer scenarios on stock and patched TorchRL in
this process and prints what each returns. ``bench`` times stock against patched
TorchRL on this machine and writes a table and a plot
(:mod:`torchrl_fixes.speed_comparison`).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchrl_fixes",
        description="Fixes for TorchRL's replay buffers: status and stock-vs-patched comparison.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="status",
        choices=("status", "compare", "bench"),
        help="status: which fixes are applied and why not (default); "
        "compare: run stock and patched TorchRL side by side; "
        "bench: time stock against patched TorchRL here, write a table and a plot",
    )
    bench = parser.add_argument_group("bench")
    bench.add_argument(
        "--full",
        action="store_true",
        help="add 346M stored transitions in a 600M buffer (about 18 GiB of memory)",
    )
    bench.add_argument(
        "--out", default="results", help="results folder (default: %(default)s)"
    )
    bench.add_argument(
        "--threads", type=int, default=1, help="torch threads while timing (default: %(default)s)"
    )
    bench.add_argument(
        "--compare",
        metavar="BASELINE_JSON",
        help="fail when a scenario's speed-up falls more than --margin below this earlier run's",
    )
    bench.add_argument(
        "--margin", type=float, default=0.3, help="allowed fall of a speed-up (default: 0.3)"
    )
    bench.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of a table"
    )
    args = parser.parse_args(argv)

    import torchrl_fixes

    if args.command == "bench":
        from torchrl_fixes import speed_comparison

        print(torchrl_fixes.status(), file=sys.stderr if args.json else sys.stdout)
        try:
            return speed_comparison.run(
                args.out,
                full=args.full,
                threads=args.threads,
                compare=args.compare,
                margin=args.margin,
                as_json=args.json,
            )
        except speed_comparison.SpeedComparisonError as err:
            print(f"python -m torchrl_fixes bench: {err}", file=sys.stderr)
            return 2

    print(torchrl_fixes.status())
    if args.command == "compare":
        from torchrl_fixes.pinned_sample_report import compare_pinned_samples

        print()
        print(compare_pinned_samples())
    return 0


if __name__ == "__main__":
    sys.exit(main())
