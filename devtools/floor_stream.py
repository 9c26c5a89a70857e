"""What the floor measurements share: the stream of rows they write, and their command line.

:mod:`devtools.online_step_floor` and :mod:`devtools.family_floor` fill a buffer from
the same stream of steps, read its boundaries from the same keys, take the same
options and label their output with the TorchRL they timed.
"""
from __future__ import annotations

import argparse
import sys


def add_stream_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """Adds ``--stored``, ``--key``, ``--rounds`` (``rounds`` by default) and ``--fixes``."""
    parser.add_argument("--stored", type=int, default=5_000_000, help="rows stored before the loop")
    parser.add_argument("--key", choices=["done", "episode"], default="done",
                        help="the boundary signal the slice sampler reads (default: done)")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--fixes", action="store_true", help="import torchrl_fixes first")


def prepare(args: argparse.Namespace) -> dict:
    """Imports the fixes where ``--fixes`` asks, leaves torch one thread, and returns the
    slice sampler's keyword for ``--key``."""
    if args.fixes:
        import torchrl_fixes  # noqa: F401
    import torch

    torch.set_num_threads(1)
    return {"traj_key": "episode"} if args.key == "episode" else {"end_key": ("next", "done")}


def stream_rows(start: int, n: int, episode: int = 1000):
    """Steps ``start`` to ``start + n`` of the stream the floor measurements write.

    A TensorDict of ``obs`` (4 zeros), the ``episode`` id, and ``("next", "done")`` and
    ``("next", "terminated")`` set at the last step of every ``episode`` steps.
    """
    import torch
    from tensordict import TensorDict

    step = torch.arange(start, start + n)
    done = ((step + 1) % episode == 0).unsqueeze(-1)
    return TensorDict(
        {"obs": torch.zeros(n, 4), "episode": step // episode, ("next", "done"): done,
         ("next", "terminated"): done},
        [n],
    )


def fill(rb, stored: int, episode: int = 1000) -> None:
    """Writes the first ``stored`` steps of the stream into ``rb``, a million at a time."""
    for start in range(0, stored, 1_000_000):
        rb.extend(stream_rows(start, min(1_000_000, stored - start), episode))


def torchrl_label() -> str:
    """``[torchrl VERSION from SOURCE]``: the TorchRL timed, and whether the fixes were on."""
    import torchrl

    source = "torchrl_fixes" if "torchrl_fixes" in sys.modules else torchrl.__file__
    return f"[torchrl {torchrl.__version__} from {source}]"
