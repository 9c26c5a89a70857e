"""Command line: ``python -m torchrl_fixes [status|compare]``.

``status`` (the default) prints, for each fix, whether it is applied and why not.
``compare`` runs the same replay-buffer scenarios on stock and patched TorchRL in
this process and prints what each returns.
"""
from __future__ import annotations

import argparse
import sys

from torchrl_fixes.pinned_sample_report import compare_pinned_samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchrl_fixes",
        description="Fixes for TorchRL's replay buffers: status and stock-vs-patched comparison.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="status",
        choices=("status", "compare"),
        help="status: which fixes are applied and why not (default); "
        "compare: run stock and patched TorchRL side by side",
    )
    args = parser.parse_args(argv)

    import torchrl_fixes

    print(torchrl_fixes.status())
    if args.command == "compare":
        print()
        print(compare_pinned_samples())
    return 0


if __name__ == "__main__":
    sys.exit(main())
