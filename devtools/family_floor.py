"""A sample of one of the slice family right after a write, against its floor, in one process.

Each round writes 1,000 rows (``without_replacement``: none, the buffer is static),
then times one sample of 64 slices of 4 and one of its floor, in that order: a
``RandomSampler`` sample of the same batch from the same storage, or for
``prioritized`` a ``PrioritizedSampler`` one (every row at priority 1). The rows are
the online step's (:func:`devtools.floor_stream.stream_rows`), in a
``TensorDictReplayBuffer``. One torch thread. Whichever TorchRL is imported is timed:
stock, with ``--fixes`` the runtime fixes, or a patched source put first on
``PYTHONPATH``::

    python -m devtools.family_floor --sampler span --fixes
    python -m devtools.family_floor --sampler prioritized --stored 1000000 --episode 100 --fixes

``prioritized`` needs TorchRL's C++ extension (``nox -s tests`` installs a torch it
loads beside).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from devtools.floor_stream import add_stream_arguments, fill, prepare, stream_rows, torchrl_label

SAMPLERS = ("slice", "span", "not_strict", "without_replacement", "prioritized")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.family_floor", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sampler", choices=SAMPLERS, default="span",
                        help="SliceSampler (slice, span=True, strict_length=False), "
                        "SliceSamplerWithoutReplacement or PrioritizedSliceSampler (in a full "
                        "buffer of --stored rows)")
    add_stream_arguments(parser, rounds=40)
    parser.add_argument("--episode", type=int, default=10, help="steps per episode")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.stored < 10_000 or args.rounds < 1 or not 4 <= args.episode <= args.stored:
        print("family_floor: --stored must be at least 10000, --rounds at least 1 and "
              "--episode from 4 to --stored", file=sys.stderr)
        return 2
    keys = prepare(args)
    import torch
    from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSampler,
        PrioritizedSliceSampler,
        SliceSampler,
        SliceSamplerWithoutReplacement,
    )

    # a full buffer for the prioritized sampler, whose writes then wrap around; room
    # for every write for the others
    capacity = args.stored
    if args.sampler != "prioritized":
        capacity += args.rounds * 1000
    sampler = {
        "slice": lambda: SliceSampler(num_slices=64, **keys),
        "span": lambda: SliceSampler(num_slices=64, span=True, **keys),
        "not_strict": lambda: SliceSampler(num_slices=64, strict_length=False, **keys),
        "without_replacement": lambda: SliceSamplerWithoutReplacement(num_slices=64, **keys),
        "prioritized": lambda: PrioritizedSliceSampler(
            capacity, alpha=0.7, beta=0.5, num_slices=64, **keys
        ),
    }[args.sampler]()
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=256
    )
    fill(rb, args.stored, args.episode)
    if args.sampler == "prioritized":
        floor_sampler = PrioritizedSampler(capacity, alpha=0.7, beta=0.5)
        floor_sampler.update_priority(torch.arange(len(rb)), 1.0)
    else:
        floor_sampler = RandomSampler()
    floor = TensorDictReplayBuffer(storage=rb.storage, sampler=floor_sampler, batch_size=256)
    rb.sample()
    floor.sample()
    times: dict[str, list[float]] = {"sample": [], "floor": []}
    position = args.stored
    for _ in range(args.rounds):
        if args.sampler != "without_replacement":
            rb.extend(stream_rows(position, 1000, args.episode))
            position += 1000
        for name, buffer in (("sample", rb), ("floor", floor)):
            start = time.perf_counter()
            buffer.sample()
            times[name].append(time.perf_counter() - start)
    sample, floor_time = (statistics.median(times[name]) for name in ("sample", "floor"))
    when = "static" if args.sampler == "without_replacement" else "right after a 1,000-row write"
    print(
        f"{args.sampler}, {args.key}, {args.stored:,} stored in {-(-args.stored // args.episode):,} "
        f"trajectories, {when}: sample {_duration(sample)}, floor {_duration(floor_time)}, "
        f"ratio {sample / floor_time:.2f}x  {torchrl_label()}"
    )
    return 0


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


if __name__ == "__main__":
    sys.exit(main())
