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

from devtools.floor_stream import add_stream_arguments, fill, prepare, stream_rows, torchrl_label


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.online_step_floor", description=__doc__.split("\n\n")[0]
    )
    add_stream_arguments(parser, rounds=60)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.stored < 10_000 or args.rounds < 1:
        print("online_step_floor: --stored must be at least 10000 and --rounds at least 1",
              file=sys.stderr)
        return 2
    keys = prepare(args)
    from torchrl.data import LazyTensorStorage, RandomSampler, SliceSampler, TensorDictReplayBuffer

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
        fill(rb, args.stored)
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
    print(
        f"{args.stored:,} stored, {args.key}: online step {step * 1e3:.2f} ms, "
        f"its floor (same write + RandomSampler sample) {floor * 1e3:.2f} ms, "
        f"ratio {step / floor:.2f}x  {torchrl_label()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
