"""Command line: ``python -m torchrl_fixes [status]`` (or the ``torchrl-fixes`` script).

``status`` (the default) prints, for each fix, whether it is applied and why not,
and the configurations an applied fix leaves to stock code. The development tools
(benchmarks, the side-by-side comparison, the upstream patches) are not part of the
installed package: they run from a clone of the repository as ``python -m devtools``,
and asking this command for one says so.
"""
from __future__ import annotations

import argparse
import os
import sys

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
    commands.add_parser(
        "status",
        help="which fixes are applied and why not (the default)",
        description="For each fix: applied, skipped or inactive, and why; then what stock "
        "code still runs for. TORCHRL_FIXES chooses the fixes (0 / off: none).",
    )
    return top


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
    parser(prog).parse_args(argv)

    import torchrl_fixes

    print(torchrl_fixes.status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
