"""Command line: ``python -m torchrl_fixes [status|compare|bench|export-patches]``.

``status`` (the default) prints, for each fix, whether it is applied and why not.
``compare`` runs the same replay-buffer scenarios on stock and patched TorchRL in
this process and prints what each returns. ``bench`` times stock against patched
TorchRL on this machine and writes a table and a plot
(:mod:`torchrl_fixes.speed_comparison`). ``export-patches`` writes the upstream
diffs of ``patches/`` from the runtime fixes (:mod:`torchrl_fixes.upstream_patches`);
with ``--check`` it only says which are out of date, and exits 1 if any is.
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
        choices=("status", "compare", "bench", "export-patches", "patched-copy"),
        help="status: which fixes are applied and why not (default); "
        "compare: run stock and patched TorchRL side by side; "
        "bench: time stock against patched TorchRL here, write a table and a plot; "
        "export-patches: write the upstream diffs of patches/ from the runtime fixes; "
        "patched-copy DEST: copy the installed TorchRL into DEST and apply patches/",
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
    parser.add_argument("dest", nargs="?", help="patched-copy: the folder to copy TorchRL into")
    export = parser.add_argument_group("export-patches")
    export.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a patch in the folder is not what the fixes write",
    )
    export.add_argument(
        "--patches", default=None, help="the patches folder (default: the repository's patches/)"
    )
    args = parser.parse_args(argv)

    if args.command in ("patched-copy", "export-patches"):
        from pathlib import Path

        from torchrl_fixes import upstream_patches

        if args.command == "patched-copy" and not args.dest:
            parser.error("patched-copy needs DEST, the folder to copy TorchRL into")
        out = Path(args.patches) if args.patches else upstream_patches.PATCHES_DIR
        try:
            if args.command == "patched-copy":
                print(upstream_patches.patched_copy(Path(args.dest), out))
                return 0
            changed = upstream_patches.export(out, check=args.check)
        except upstream_patches.ExportError as err:
            print(f"python -m torchrl_fixes {args.command}: {err}", file=sys.stderr)
            return 2
        if args.check:
            for name in changed:
                print(f"{out / name}: out of date (run python -m torchrl_fixes export-patches)")
            return 1 if changed else 0
        for name in changed:
            print(f"wrote {out / name}")
        if not changed:
            print(f"{out}: every patch is up to date")
        return 0

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
