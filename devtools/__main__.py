"""``python -m devtools {bench,tdmpc2,compare,gpu,export-patches,patched-copy,upstream-review,tree-speed,index-structures}``, from the repository root.

Each command has its own options (``python -m devtools bench --help``); see
:mod:`devtools` for what each does.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

PROG = "python -m devtools"
# Commands whose module parses its own arguments: their help is theirs.
DELEGATED = {
    "tree-speed": ("devtools.tree_speed", "this tree's slice sample against another checkout's, as ratios to a floor"),
    "index-structures": ("devtools.index_structures", "the trajectory index's key store against a flat and a blocked one"),
    "gpu": ("devtools.gpu_check", "the whole GPU check into one report: pytest -m cuda, stock vs patched on the GPU, host syncs, compare, diagnose (--device cpu: a dry run)"),
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    from devtools import speed_comparison

    top = argparse.ArgumentParser(
        prog=PROG,
        description="Development tooling of torchrl-fixes: benchmarks, side-by-side "
        "comparison and upstream patches. Run it from the root of a clone.",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = commands.add_parser(
        "bench",
        help="time stock against patched TorchRL here; write a table, a plot and bench.json",
        description="Runs the speed benchmarks of conformance/ with stock and patched TorchRL "
        "timed in turn, shows each result as it lands, then the table; writes bench.json, "
        "benchmark.md, benchmark.png and bench.log into --out.",
    )
    bench.add_argument(
        "--full",
        action="store_true",
        help=f"add the rows of 346M stored transitions in a 600M buffer (about "
        f"{speed_comparison.full_memory() / speed_comparison.GiB:.0f} GiB of available memory, "
        "checked before anything starts)",
    )
    bench.add_argument(
        "--out",
        default=speed_comparison.LOCAL_RESULTS,
        help="results folder (default: %(default)s, which git ignores; --out results "
        "refreshes the table and plot the README shows)",
    )
    bench.add_argument(
        "--threads",
        type=_positive_int,
        default=1,
        help="torch threads while timing, 1 or more (default: %(default)s)",
    )
    bench.add_argument(
        "--compare",
        metavar="BASELINE_JSON",
        help="an earlier run's bench.json: exit 1 when a scenario's speed-up falls more than "
        "--margin below it",
    )
    bench.add_argument(
        "--margin",
        type=_fraction,
        default=0.3,
        help="with --compare: how far a speed-up may fall, as a fraction of the baseline's "
        "(default: %(default)s)",
    )
    bench.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of the table"
    )

    tdmpc2 = commands.add_parser(
        "tdmpc2",
        help="TD-MPC2's replay buffer, stock against patched, on the installed TorchRL",
        description="Builds TD-MPC2's buffer (256 slices of 4 by episode id, strict length, "
        "no value cache, CPU storage) stock and patched, fills both with --stored rows in "
        "500-step episodes, then times its loop in turn: --samples samples, one episode "
        "written. Checks that every sampled slice is one episode at consecutive steps. "
        "Prints a table; writes it to OUT/tdmpc2.md with --out.",
    )
    tdmpc2.add_argument(
        "--stored", type=_positive_int, default=10_000_000, help="rows stored before timing (default: %(default)s)"
    )
    tdmpc2.add_argument(
        "--capacity", type=_positive_int, default=12_000_000, help="the storage's capacity (default: %(default)s)"
    )
    tdmpc2.add_argument("--rounds", type=_positive_int, default=6, help="timed rounds (default: %(default)s)")
    tdmpc2.add_argument(
        "--samples", type=_positive_int, default=50, help="samples per episode written (default: %(default)s)"
    )
    tdmpc2.add_argument("--out", type=Path, default=None, help="write OUT/tdmpc2.md")

    commands.add_parser(
        "compare",
        help="stock and patched pin_memory=True buffers side by side",
        description="Prints the fix status, then what stock and patched TorchRL return "
        "from replay buffers built with pin_memory=True.",
    )

    export = commands.add_parser(
        "export-patches",
        help="write the upstream series, patches/main/, from the runtime fixes",
        description="Copies the installed TorchRL (untouched: the pinned torchrl-nightly build of "
        "TorchRL main) into a temporary tree, makes each pull request there from the runtime "
        "fixes and upstream/, and writes its git diff under its text (patches/main/NNNN-name.md) "
        "as patches/main/NNNN-name.patch; numbered patches no longer in the series are removed.",
    )
    export.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing each patch in the folder that is not what it writes",
    )
    export.add_argument("--patches", type=Path, default=None, help="the patches folder (default: patches/main/)")

    copy = commands.add_parser(
        "patched-copy",
        help="copy the installed TorchRL into DEST and apply patches/",
        description="Copies the installed torchrl package into DEST, applies every patch in "
        "order, and prints the untouched installed package's folder (the stock source).",
    )
    copy.add_argument("dest", type=Path, help="the folder to copy TorchRL into")
    copy.add_argument("--patches", type=Path, default=None, help="the patches folder (default: patches/main/)")

    review = commands.add_parser(
        "upstream-review",
        help="review patches/main/ one pull request at a time, as TorchRL's CI would",
        description="Copies the installed TorchRL (the pinned nightly) into a git tree, applies "
        "each patch of the series as one commit, and reports per PR: whether it applies, its "
        "torchrl/ lines, its test files, upstream's pinned hooks on what it touches, and its "
        "tests after and before it. Exits 1 when a bar of the upstream contract is missed.",
    )
    review.add_argument(
        "--checkout",
        type=Path,
        default=None,
        metavar="PATH",
        help="a pytorch/rl clone: its test/, benchmarks/, setup.cfg, pyproject.toml, pytest.ini "
        "and scripts/check-docstring-args join the tree",
    )
    review.add_argument(
        "--patches", type=Path, default=None, metavar="DIR", help="the series folder (default: patches/main/)"
    )
    review.add_argument(
        "--touched-tests",
        action="store_true",
        help="with --checkout: also run, before and after each PR, TorchRL's test modules "
        "that import a module it touches (or that module's package)",
    )
    review.add_argument("--keep", action="store_true", help="keep the tree and print its path")
    for name, (_, summary) in DELEGATED.items():
        commands.add_parser(name, help=f"{summary} (its own --help)")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return importlib.import_module(DELEGATED[argv[0]][0]).main(argv[1:])
    args = parser().parse_args(argv)
    command = f"{PROG} {args.command}"

    if args.command in ("export-patches", "patched-copy"):
        from devtools import upstream_patches

        try:
            folder = args.patches or upstream_patches.installed_series().folder
            if args.command == "patched-copy":
                print(upstream_patches.patched_copy(args.dest, folder))
                return 0
            changed = upstream_patches.export(folder, check=args.check)
        except upstream_patches.ExportError as err:
            print(f"{command}: {err}", file=sys.stderr)
            return 2
        if args.check:
            for name in changed:
                print(f"{folder / name}: out of date (run {PROG} export-patches)")
            return 1 if changed else 0
        for name in changed:
            print(f"{'wrote' if (folder / name).exists() else 'removed'} {folder / name}")
        if not changed:
            print(f"{folder}: every patch is up to date")
        return 0

    if args.command == "upstream-review":
        from devtools import upstream_review

        try:
            return upstream_review.run(
                checkout=args.checkout,
                patches=args.patches,
                keep=args.keep,
                touched_tests=args.touched_tests,
            )
        except upstream_review.ReviewError as err:
            print(f"{command}: {err}", file=sys.stderr)
            return 2

    import torchrl_fixes

    if args.command == "bench":
        from devtools import speed_comparison

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
            print(f"{command}: {err}", file=sys.stderr)
            return 2

    if args.command == "tdmpc2":
        from devtools import tdmpc2_loop

        try:
            return tdmpc2_loop.main(args.stored, args.capacity, args.rounds, args.samples, args.out)
        except tdmpc2_loop.TDMPC2LoopError as err:
            print(f"{command}: {err}", file=sys.stderr)
            return 1

    from devtools.pinned_sample_report import compare_pinned_samples

    print(torchrl_fixes.status())
    print()
    print(compare_pinned_samples())
    return 0


if __name__ == "__main__":
    sys.exit(main())
