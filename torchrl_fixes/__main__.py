"""Command line: ``python -m torchrl_fixes [status | run -- COMMAND]`` (or the ``torchrl-fixes`` script).

``status`` (the default) prints, for each fix, whether it is applied and why not,
and the configurations an applied fix leaves to stock code; ``status --targets``
adds every stock function each fix targets and which known code of it is installed. ``run -- COMMAND``
starts ``COMMAND`` with the fixes in every Python process it starts
(:mod:`torchrl_fixes.launcher`). ``diagnose --demo`` shows
:func:`torchrl_fixes.diagnose` on a built-in slow buffer (a buffer of your own is
diagnosed from Python). The development tools
(benchmarks, the side-by-side comparison, the upstream patches) are not part of the
installed package: they run from a clone of the repository as ``python -m devtools``,
and asking this command for one says so.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import torchrl_fixes
from torchrl_fixes import launcher
from torchrl_fixes._core.registry import targets_table
from torchrl_fixes.diagnose import demo_buffer
from torchrl_fixes.fixes import ALL_FIXES

# Commands that moved to the repository's development tooling.
DEVTOOLS = {
    "bench": "time stock against patched TorchRL",
    "compare": "show stock and patched pin_memory=True output side by side",
    "export-patches": "write the upstream diffs",
    "patched-copy": "copy TorchRL with the upstream diffs applied",
}


def _prog() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not script or script in ("__main__.py", "-c", "-m"):
        return "python -m torchrl_fixes"
    return script


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=prog or _prog(),
        description="Fixes for TorchRL's replay buffers: which are applied here, and why not.",
        epilog="Benchmarks, the stock-vs-patched comparison and the upstream patches are "
        "development tooling: `python -m devtools --help` in a clone of the repository.",
    )
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    status = commands.add_parser(
        "status",
        help="which fixes are applied and why not (the default)",
        description="For each fix: applied, skipped or inactive, and why; then what stock "
        "code still runs for. TORCHRL_FIXES chooses the fixes (0 / off: none).",
    )
    status.add_argument(
        "--targets",
        action="store_true",
        help="also list every stock function each fix replaces or relies on, the codes of "
        "it the fix knows, and which one this TorchRL has",
    )
    run = commands.add_parser(
        "run",
        help="run a command with the fixes in every Python process it starts",
        description="Runs COMMAND with the fixes applied in every Python process it starts: "
        "the program, its spawn / forkserver and collector workers, a local Ray cluster's "
        "workers. Each applies them when it imports torchrl; TORCHRL_FIXES chooses which "
        "(0 / off: none). Exits with COMMAND's exit status.",
        usage="%(prog)s [-h] -- COMMAND [ARGS ...]",
        epilog="example: %(prog)s -- python train.py --steps 1000",
    )
    run.add_argument(
        "program", nargs=argparse.REMAINDER, metavar="COMMAND", help="the program and its arguments"
    )
    run.set_defaults(run_parser=run)
    _add_diagnose(commands)
    return top


DIAGNOSE_NEEDS_A_BUFFER = (
    "diagnose needs a replay buffer from Python: `torchrl_fixes.diagnose(rb)` "
    "(or `diagnose --demo` for a built-in example)"
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_diagnose(commands) -> None:
    diagnose = commands.add_parser(
        "diagnose",
        help="where a replay buffer's sample() spends its time (--demo: a built-in slow buffer)",
        description="Times each stage of a replay buffer's sample() and names what slows it "
        "down. A buffer of your own: torchrl_fixes.diagnose(rb) in Python. --demo builds a "
        "slow one: a stock SliceSampler over 5M stored rows, with a transform that breaks "
        "pin_memory.",
    )
    diagnose.add_argument("--demo", action="store_true", help="diagnose the built-in slow buffer")
    diagnose.add_argument("--samples", type=_positive_int, default=20, metavar="N",
                          help="samples to time (default: 20)")
    diagnose.add_argument("--png", metavar="PATH", help="also write a bar chart of the stages (matplotlib)")
    diagnose.add_argument("--json", action="store_true", help="print the report as JSON")


def _diagnose(args, prog: str) -> int:
    if not args.demo:
        print(f"{prog} diagnose: {DIAGNOSE_NEEDS_A_BUFFER}", file=sys.stderr)
        return 2
    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"{prog} diagnose: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2

    # TorchRL logs the storage's initialisation to stdout: not part of the report (or its JSON)
    torchrl_logger = logging.getLogger("torchrl")
    level = torchrl_logger.level
    torchrl_logger.setLevel(logging.WARNING)
    try:
        report = torchrl_fixes.diagnose(demo_buffer(), samples=args.samples)
    finally:
        torchrl_logger.setLevel(level)
    print(report.to_json(indent=2) if args.json else report)
    if args.png:
        report.save_png(args.png)
        print(f"bar chart: {args.png}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or _prog()
    if argv and argv[0] in DEVTOOLS:
        print(
            f"{prog} {argv[0]}: {argv[0]} ({DEVTOOLS[argv[0]]}) is development tooling: "
            f"run `python -m devtools {argv[0]}` in a clone of the repository",
            file=sys.stderr,
        )
        return 2
    args = parser(prog).parse_args(argv)
    if args.command == "run":
        return _run(args.run_parser, args.program)
    if args.command == "diagnose":
        return _diagnose(args, prog)
    print(torchrl_fixes.status())
    if getattr(args, "targets", False):
        with torchrl_fixes.disabled():  # the stock code, not the fixes'
            print()
            print(targets_table(ALL_FIXES, found=True))
    return 0


def _run(run: argparse.ArgumentParser, program: list[str]) -> int:
    if program[:1] == ["--"]:  # REMAINDER keeps the separator
        program = program[1:]
    try:
        # Returns only where the program runs as a child (not POSIX); see launcher.run.
        return launcher.run(program)
    except launcher.CommandNotFound as err:
        # One line: what is wrong, and the usage.
        print(f"{run.prog}: error: {err}; usage: {run.prog} -- COMMAND [ARGS ...]", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
