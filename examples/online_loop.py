"""An online loop on a slice-sampled replay buffer, stock TorchRL against torchrl_fixes.

The loop a TorchRL user writes: a ``TensorDictReplayBuffer`` over a
``LazyTensorStorage`` with a ``SliceSampler``, prefilled, then at every step extended
by a batch of new rows (several episodes of random length) and sampled. Two buffers
run it in one process: one built inside ``torchrl_fixes.disabled()``, which keeps
running stock TorchRL code afterwards, and one built outside it, with the fixes. Both
get the same rows and the same torch seed before each step. The script prints the time
of each step (extend + sample) and checks that every sampled slice stays within one
episode (its rows share one episode id) and that the fixed buffer samples exactly what
stock samples; it exits with status 1 if a check fails. Stock TorchRL recovers the
trajectory boundaries from the whole storage at every sample after a write, so the gap
grows with ``--stored``::

    python examples/online_loop.py
    python examples/online_loop.py --stored 5000000 --key done

Output of ``OMP_NUM_THREADS=1 python examples/online_loop.py`` (7 s) on a 2-core CPU
machine shared with other jobs, load average 4 (with two torch threads there, the steps
of both buffers were up to 20x slower and noisy); ``--stored 5000000 --key done`` gave
medians of 14.70 ms (stock) and 2.89 ms (fixed), 5.1x::

    torchrl 0.14.1, tensordict 0.14.3, torch 2.13.0+cpu; fixes applied: pinned_sample_output, slice_boundary_index, single_gather
    200,000 rows stored, 1,000 written per step, samples of 2,048 rows in slices of 64 (SliceSampler, episode)
    steps       stock TorchRL  with torchrl_fixes  speed-up
    1                 3.79 ms             2.61 ms      1.5x
    2                 3.70 ms             2.03 ms      1.8x
    ...
    10                7.16 ms             7.21 ms      1.0x
    median            2.77 ms             1.77 ms      1.6x
    slices within one episode, stock TorchRL: pass (320 of 320)
    slices within one episode, with torchrl_fixes: pass (320 of 320)
    samples equal to stock's, same seed: pass (10 of 10)
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import tensordict
import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, SliceSampler, TensorDictReplayBuffer

import torchrl_fixes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python examples/online_loop.py --stored 5000000 --key done",
    )
    parser.add_argument("--stored", type=int, default=200_000,
                        help="rows stored before the loop (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=10,
                        help="extend + sample steps timed (default: %(default)s)")
    parser.add_argument("--write", type=int, default=1000,
                        help="rows written at each step (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=2048,
                        help="rows per sample, a multiple of --slice-len (default: %(default)s)")
    parser.add_argument("--slice-len", type=int, default=64,
                        help="rows per slice; episodes last 1 to 8 slices (default: %(default)s)")
    parser.add_argument("--key", choices=["episode", "done"], default="episode",
                        help="what marks the trajectories: SliceSampler(traj_key='episode') "
                             "or SliceSampler(end_key=('next', 'done')) (default: %(default)s)")
    args = parser.parse_args(argv)
    for name in ("stored", "iterations", "write", "batch_size", "slice_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.batch_size % args.slice_len:
        parser.error(f"--batch-size {args.batch_size} is not a multiple of --slice-len {args.slice_len}")
    if args.stored < args.slice_len:
        parser.error(f"--stored {args.stored} must be at least --slice-len {args.slice_len}")
    return args


def episode_ids(steps: int, min_len: int, max_len: int) -> torch.Tensor:
    """The episode id of each of ``steps + 1`` steps: episodes of min_len..max_len steps."""
    lengths = torch.randint(min_len, max_len + 1, (steps // min_len + 2,),
                            generator=torch.Generator().manual_seed(0))
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths)[: steps + 1]


def rows(episodes: torch.Tensor, start: int, n: int) -> TensorDict:
    """Steps ``start`` to ``start + n``: done where the next step starts another episode."""
    episode = episodes[start : start + n]
    done = (episode != episodes[start + 1 : start + n + 1]).unsqueeze(-1)
    return TensorDict({
        "observation": torch.randn(n, 4), "action": torch.randn(n, 2), "episode": episode,
        ("next", "reward"): torch.randn(n, 1), ("next", "done"): done,
        ("next", "terminated"): done,
    }, batch_size=[n])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # no "Initialized storage" lines
    capacity = args.stored + args.iterations * args.write  # room for every write
    episodes = episode_ids(capacity, args.slice_len, 8 * args.slice_len)
    keys = {"traj_key": "episode"} if args.key == "episode" else {"end_key": ("next", "done")}

    def build() -> TensorDictReplayBuffer:
        return TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=args.batch_size,
                                      sampler=SliceSampler(slice_len=args.slice_len, **keys))

    with torchrl_fixes.disabled():
        stock = build()  # built here: stays stock TorchRL after the block too
    buffers = {"stock TorchRL": stock, "with torchrl_fixes": build()}
    for start in range(0, args.stored, 1_000_000):
        prefill = rows(episodes, start, min(1_000_000, args.stored - start))
        for rb in buffers.values():
            rb.extend(prefill)
    for rb in buffers.values():
        rb.sample()  # untimed: the fixed buffer indexes the whole storage once, here

    applied = [fix.name for fix in torchrl_fixes.status() if fix.applied]
    print(f"torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, torch "
          f"{torch.__version__}; fixes applied: {', '.join(applied) or 'none'}")
    print(f"{args.stored:,} rows stored, {args.write:,} written per step, samples of "
          f"{args.batch_size:,} rows in slices of {args.slice_len} (SliceSampler, {args.key})")
    times = {name: [] for name in buffers}
    in_one_episode = {name: 0 for name in buffers}
    same_samples = 0
    block = -(-args.iterations // 10)  # at most 10 lines of timings

    def timing(label: str, stock_s: float, fixed_s: float) -> None:
        print(f"{label:<10}{stock_s * 1e3:>12.2f} ms{fixed_s * 1e3:>17.2f} ms{stock_s / fixed_s:>9.1f}x")

    print(f"{'steps':<10}{'stock TorchRL':>15}{'with torchrl_fixes':>20}{'speed-up':>10}")
    for i in range(args.iterations):
        new = rows(episodes, args.stored + i * args.write, args.write)
        order = list(buffers) if i % 2 else list(buffers)[::-1]  # neither always goes first
        samples = {}
        for name in order:
            torch.manual_seed(i)  # both buffers draw the same slices
            start = time.perf_counter()
            buffers[name].extend(new)
            samples[name] = buffers[name].sample()
            times[name].append(time.perf_counter() - start)
            slice_ids = samples[name]["episode"].reshape(-1, args.slice_len)
            in_one_episode[name] += int((slice_ids == slice_ids[:, :1]).all(dim=1).sum())
        same_samples += bool((samples["stock TorchRL"] == samples["with torchrl_fixes"]).all())
        if (i + 1) % block == 0 or i + 1 == args.iterations:
            first = i - i % block
            label = f"{i + 1}" if first == i else f"{first + 1}-{i + 1}"
            timing(label, *(statistics.median(t[first:]) for t in times.values()))
    timing("median", *(statistics.median(t) for t in times.values()))

    slices = args.iterations * args.batch_size // args.slice_len
    checks = [(f"slices within one episode, {name}", n, slices) for name, n in in_one_episode.items()]
    checks.append(("samples equal to stock's, same seed", same_samples, args.iterations))
    for what, count, total in checks:
        print(f"{what}: {'pass' if count == total else 'FAIL'} ({count:,} of {total:,})")
    return 0 if all(count == total for _, count, total in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
