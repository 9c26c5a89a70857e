"""``python -m devtools tree-speed``: this tree's slice sample against another tree's, as ratios to a floor.

Two checkouts of this repository cannot be compared by absolute times on a shared
machine: whole processes differ by up to 30% on the same code. Each case here is
timed in a process of its own, with the fixes of one tree (its root first on
``PYTHONPATH``): a ``SliceSampler`` sample and, in the same rounds and the same
order alternating, a ``RandomSampler`` sample of the same batch from the same storage
(the floor). What is compared is patched / floor, and processes alternate between
the trees, so that the load on the machine meets both alike.

Cases (the seed report's shape: 256 slices of 4, 1,024 rows, no value cache):
``done``, ``episode`` and ``unnamed`` (ids and done flags stored, no key named) at
5M stored in 6M, each static and right after a 1,000-row write; ``done`` at 50M in
60M; ``done`` at 5M stored in 500k trajectories; and ``unnamed/done``, the
default sampler over the sampler that names the done flags, both after a write,
interleaved in one process (no floor: their own ratio).

    python -m devtools tree-speed --baseline /path/to/other/checkout --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITE = 1_000
# (name, key, stored, capacity, episode length)
CASES = {
    "done 5M/6M": ("done", 5_000_000, 6_000_000, 1_000),
    "episode 5M/6M": ("episode", 5_000_000, 6_000_000, 1_000),
    "unnamed 5M/6M": ("unnamed", 5_000_000, 6_000_000, 1_000),
    "done 50M/60M": ("done", 50_000_000, 60_000_000, 1_000),
    "done 5M/6M, 500k trajectories": ("done", 5_000_000, 6_000_000, 10),
}


def _rows(key: str, start: int, count: int, episode_len: int):
    import torch
    from tensordict import TensorDict

    step = torch.arange(start, start + count)
    fields = {"obs": torch.zeros(count, 1)}
    if key in ("episode", "unnamed"):
        fields["episode"] = step // episode_len
    if key in ("done", "unnamed"):
        fields[("next", "done")] = ((step + 1) % episode_len == 0).unsqueeze(-1)
    return TensorDict(fields, [count])


def _sampler(key: str):
    from torchrl.data import SliceSampler

    named = {"done": {"end_key": ("next", "done")}, "episode": {"traj_key": "episode"}}
    return SliceSampler(num_slices=256, truncated_key=None, **named.get(key, {}))


class _Stream:
    """A buffer of ``stored`` rows of one case, and where its stream of rows is."""

    def __init__(self, key, stored, capacity, episode_len, sampler_key=None):
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        self.key, self.episode_len, self.position = key, episode_len, 0
        self.storage = LazyTensorStorage(capacity)
        self.rb = ReplayBuffer(
            storage=self.storage, sampler=_sampler(sampler_key or key), batch_size=1024
        )
        while self.position < stored:
            self.write(min(5_000_000, stored - self.position))

    def write(self, count: int) -> None:
        self.rb.extend(_rows(self.key, self.position, count, self.episode_len))
        self.position += count


def _timed(turns: dict, rounds: int, write) -> dict:
    """The median time of each turn, the turns taking their places in rotation."""
    import time

    names, times = list(turns), {name: [] for name in turns}
    for rb in turns.values():
        rb.sample()
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            if write is not None:
                write()
            start = time.perf_counter()
            turns[name].sample()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def worker(case: str, rounds: int) -> dict:
    """Times one case here, with whichever ``torchrl_fixes`` is first on the path."""
    import torch
    from torchrl.data import RandomSampler, ReplayBuffer

    import torchrl_fixes  # noqa: F401

    torch.set_num_threads(1)
    if case == "unnamed/done":
        key, stored, capacity, episode_len = CASES["unnamed 5M/6M"]
        unnamed = _Stream(key, stored, capacity, episode_len)
        done = ReplayBuffer(
            storage=unnamed.storage, sampler=_sampler("done"), batch_size=1024
        )
        medians = _timed(
            {"unnamed": unnamed.rb, "done": done}, rounds, lambda: unnamed.write(WRITE)
        )
        return {"after a write": medians["unnamed"] / medians["done"]}
    stream = _Stream(*CASES[case])
    floor = ReplayBuffer(storage=stream.storage, sampler=RandomSampler(), batch_size=1024)
    found = {}
    for when, write in (("static", None), ("after a write", lambda: stream.write(WRITE))):
        medians = _timed({"patched": stream.rb, "floor": floor}, rounds, write)
        found[when] = medians["patched"] / medians["floor"]
    return found


def _run_worker(tree: Path, case: str, rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", case, "--rounds", str(rounds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare(baseline: Path, cases: list[str], repeats: int, rounds: int) -> str:
    """The markdown table: for each case, this tree's and the baseline's ratios."""
    trees = {"baseline": baseline, "this tree": ROOT}
    found = {(tree, case): [] for tree in trees for case in cases}
    for _ in range(repeats):
        for case in cases:
            for tree, path in trees.items():
                found[tree, case].append(_run_worker(path, case, rounds))
    lines = [
        "| case | when | baseline | this tree | this tree / baseline |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for case in cases:
        for when in found["this tree", case][0]:
            base = statistics.median(r[when] for r in found["baseline", case])
            ours = statistics.median(r[when] for r in found["this tree", case])
            lines.append(f"| {case} | {when} | {base:.2f} | {ours:.2f} | {ours / base:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools tree-speed", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="the root of the other checkout")
    parser.add_argument("--case", action="append", choices=[*CASES, "unnamed/done"])
    parser.add_argument("--repeats", type=int, default=3, help="processes per tree and case")
    parser.add_argument("--rounds", type=int, default=200, help="timed rounds per process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.rounds)))
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    cases = args.case or [*CASES, "unnamed/done"]
    print(compare(args.baseline.resolve(), cases, args.repeats, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
