"""An online step of a slice-sampled buffer against its floor, timed in turn in one process.

The step writes 1,000 rows, then samples 2,048 rows as 32 slices; its floor is the
same write into a buffer of the same rows, then a ``RandomSampler`` sample of the
same batch: what any sampler pays for the write and the gather. One torch thread.
Whichever TorchRL is imported is timed: stock, with ``--fixes`` the runtime fixes,
or a patched source put first on ``PYTHONPATH`` (``python -m devtools patched-copy``)::

    python -m devtools.online_step_floor --stored 5000000 --key done
    PYTHONPATH=/tmp/torchrl-patched TORCHRL_FIXES=0 python -m devtools.online_step_floor
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.online_step_floor", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stored", type=int, default=5_000_000, help="rows stored before the loop")
    parser.add_argument("--key", choices=["done", "episode"], default="done",
                        help="the boundary signal the slice sampler reads (default: done)")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--fixes", action="store_true", help="import torchrl_fixes first")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.stored < 10_000 or args.rounds < 1:
        print("online_step_floor: --stored must be at least 10000 and --rounds at least 1",
              file=sys.stderr)
        return 2
    if args.fixes:
        import torchrl_fixes  # noqa: F401
    import torch
    import torchrl
    from torchrl.data import LazyTensorStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer

    torch.set_num_threads(1)

    keys = {"traj_key": "episode"} if args.key == "episode" else {"end_key": ("next", "done")}
    capacity = args.stored * 3 // 2
    buffers = {
        "slice": TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity), sampler=SliceSampler(num_slices=32, **keys),
            batch_size=2048,
        ),
        "floor": TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity), sampler=RandomSampler(), batch_size=2048
        ),
    }
    for rb in buffers.values():
        for start in range(0, args.stored, 1_000_000):
            rb.extend(stream_rows(start, min(1_000_000, args.stored - start)))
        rb.sample()
    times: dict[str, list[float]] = {name: [] for name in buffers}
    position = args.stored
    for round_ in range(args.rounds):
        new = stream_rows(position, 1000)
        position += 1000
        order = list(buffers) if round_ % 2 else list(buffers)[::-1]
        for name in order:
            rb = buffers[name]
            start = time.perf_counter()
            rb.extend(new)
            rb.sample()
            times[name].append(time.perf_counter() - start)
    step, floor = (statistics.median(times[name]) for name in ("slice", "floor"))
    source = "torchrl_fixes" if "torchrl_fixes" in sys.modules else torchrl.__file__
    print(
        f"{args.stored:,} stored, {args.key}: online step {step * 1e3:.2f} ms, "
        f"its floor (same write + RandomSampler sample) {floor * 1e3:.2f} ms, "
        f"ratio {step / floor:.2f}x  [torchrl {torchrl.__version__} from {source}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
