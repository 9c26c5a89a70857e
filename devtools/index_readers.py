"""Two properties of the slice index under its readers: draws racing a writer, and the memory it keeps.

``race``: two ``TensorDictReplayBuffer`` over one ``LazyTensorStorage`` of
``--capacity`` rows, each with its own slice sampler (slices of 4 of the
``episode`` ids, ``strict_length=False``, 32 rows a sample). The reader thread
samples the first buffer in a loop; the writer thread writes ``--write`` rows
through the second buffer (episodes of 1 to 8 steps at random; with
``--alternate``, one episode of ``--write`` steps, then ``--write`` one-step
episodes, in turn, so that the count of trajectories swings) and samples it, for
``--seconds``, Python switching threads every 10 µs (``--switch-interval``) so that
writes land inside draws. Each of ``--runs`` runs prints what each thread got done and the
exceptions it raised, by kind: their count, message and where they were raised.
Exits 1 where a run raised, or a thread was still running a minute after the end
(a hang).

``memory``: a ``ReplayBuffer(LazyTensorStorage(rows), SliceSampler(slice_len=4,
traj_key="episode"))`` filled with ``--rows`` rows (100-step episodes) and sampled
once, then written ``--writes`` times over its whole capacity, then sampled; prints
the process's resident memory (``VmRSS``, Linux's ``/proc/self/status``) before the
writes, and what it grew by after them and after the next sample.

``foreign``: a ``ReplayBuffer(LazyTensorStorage(stored), SliceSampler(slice_len=8,
traj_key="episode"))`` filled with ``--stored`` rows (500-step episodes) is handed to
a spawned process, which extends it by ``--write`` rows at each of ``--writes``
requests. After each write the main process samples 256 rows (the sample right
after another process's write, timed), then a ``RandomSampler`` sample of the same
batch from the same storage (the floor, timed). With ``--fixes`` each slice sample
is also compared with a twin sampler's, ``boundary_index=False`` (stock's
whole-storage recovery), drawn with the same seed. Prints the medians and their
ratio; exits 1 where a sample differed.

Whichever TorchRL is imported is measured: stock, with ``--fixes`` the runtime fixes,
or a patched source put first on ``PYTHONPATH``; the first line names it. One torch
thread.

Examples:
    On torchrl 0.14.1 with torch 2.13.0 (``prioritized``: torch 2.14.1, where the C++
    extension loads), 2026-12-07, the 2-core development machine, busy with other jobs::

        $ python -m devtools.index_readers race --seconds 3 --runs 1
        race: slice sampler, 400 rows, writes of 50 (episodes of 1 to 8 steps), 1 x 3 s, switch interval 1e-05 s  [torchrl 0.14.1 from /work/venv/lib/python3.11/site-packages/torchrl/__init__.py]
        run 1: reader 1127 samples, writer 727 writes and samples, exceptions 0
        0 of 1 runs raised
        $ python -m devtools.index_readers race --seconds 3 --runs 1 --fixes
        race: slice sampler, 400 rows, writes of 50 (episodes of 1 to 8 steps), 1 x 3 s, switch interval 1e-05 s  [torchrl 0.14.1 from torchrl_fixes]
        run 1: reader 1413 samples, writer 677 writes and samples, exceptions 0
        0 of 1 runs raised
        $ python -m devtools.index_readers race --seconds 3 --runs 1 --sampler prioritized
        race: prioritized sampler, 400 rows, writes of 50 (episodes of 1 to 8 steps), 1 x 3 s, switch interval 1e-05 s  [torchrl 0.14.1 from /work/venv214/lib/python3.11/site-packages/torchrl/__init__.py]
        run 1: reader 403 samples, writer 292 writes and samples, exceptions 2
          reader: 2 x RuntimeError: failed to compute seq_length, please report this bug  (at samplers/prioritized_slice.py:417 in sample)
        1 of 1 runs raised
        $ python -m devtools.index_readers race --seconds 3 --runs 1 --sampler prioritized --fixes
        race: prioritized sampler, 400 rows, writes of 50 (episodes of 1 to 8 steps), 1 x 3 s, switch interval 1e-05 s  [torchrl 0.14.1 from torchrl_fixes]
        run 1: reader 1191 samples, writer 493 writes and samples, exceptions 0
        0 of 1 runs raised
        $ python -m devtools.index_readers memory --rows 200000 --writes 10
        memory: 200,000 rows, 10 full-capacity writes  [torchrl 0.14.1 from /work/venv/lib/python3.11/site-packages/torchrl/__init__.py]
        resident 335 MiB before the writes, +7.6 MiB after them, +7.6 MiB after the next sample
        $ python -m devtools.index_readers memory --rows 200000 --writes 10 --fixes
        memory: 200,000 rows, 10 full-capacity writes  [torchrl 0.14.1 from torchrl_fixes]
        resident 335 MiB before the writes, +2.8 MiB after them, +2.8 MiB after the next sample
        $ python -m devtools.index_readers foreign --stored 20000000
        foreign: 20,000,000 rows stored, 40 writes of 1,000 by another process, samples of 256 rows  [torchrl 0.14.1 from /work/venv/lib/python3.11/site-packages/torchrl/__init__.py]
        slice sample after a foreign write: median 39.743 ms; RandomSampler floor 0.250 ms; ratio 159.12x the floor
        $ python -m devtools.index_readers foreign --stored 20000000 --fixes
        foreign: 20,000,000 rows stored, 40 writes of 1,000 by another process, samples of 256 rows  [torchrl 0.14.1 from torchrl_fixes]
        slice sample after a foreign write: median 0.984 ms; RandomSampler floor 0.375 ms; ratio 2.63x the floor
        samples equal to stock's whole-storage recovery: 40 of 40

    A stock slice sampler raises too, more rarely: ``IndexError: index 399 is out of bounds
    for dimension 0 with size 350`` in ``_derive_end_flags``, once in two 3-second runs of
    ``race --alternate``. The exit status is 1 where a run raised or hung, else 0.
"""
from __future__ import annotations

import argparse
import collections
import gc
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

from devtools.floor_stream import prepare, torchrl_label

PROG = "python -m devtools.index_readers"
RACE_SAMPLERS = ("slice", "without_replacement", "prioritized")
STATUS = Path("/proc/self/status")
# Python switches threads every 5 ms by default, long enough for most draws to finish
# before the other thread runs; every 10 µs, a write lands in the middle of a draw.
SWITCH_INTERVAL = 1e-5
# How long after its end a run's threads may take to stop before they count as a hang.
HANG_AFTER = 60.0


class _Parser(argparse.ArgumentParser):
    """Says what is wrong with a command line in one line, without argparse's usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _Parser(add_help=False)
    common.add_argument("--fixes", action="store_true", help="import torchrl_fixes first")
    # the rows' boundaries are their episode ids (what floor_stream.prepare reads from --key)
    common.set_defaults(key="episode")

    race = commands.add_parser(
        "race", parents=[common], help="a reader thread's draws against a writer's, on one storage",
        description=__doc__.split("\n\n")[1],
    )
    race.add_argument("--sampler", choices=RACE_SAMPLERS, default="slice",
                      help="SliceSampler, SliceSamplerWithoutReplacement or PrioritizedSliceSampler "
                      "(needs TorchRL's C++ extension) (default: slice)")
    race.add_argument("--seconds", type=float, default=20.0, help="length of a run (default: 20)")
    race.add_argument("--runs", type=int, default=3, help="(default: 3)")
    race.add_argument("--capacity", type=int, default=400, help="rows of the storage (default: 400)")
    race.add_argument("--write", type=int, default=50, help="rows of each write (default: 50)")
    race.add_argument("--alternate", action="store_true",
                      help="write one episode, then one-step episodes, in turn")
    race.add_argument("--switch-interval", type=float, default=SWITCH_INTERVAL, metavar="SECONDS",
                      help="sys.setswitchinterval during the runs "
                      "(default: %(default)g; Python's own: 0.005)")

    foreign = commands.add_parser(
        "foreign", parents=[common], help="the sample after another process's write, against the floor",
        description=__doc__.split("\n\n")[3],
    )
    foreign.add_argument("--stored", type=int, default=2_000_000,
                         help="rows stored, the storage's capacity (default: 2000000)")
    foreign.add_argument("--write", type=int, default=1_000, help="rows of each write (default: 1000)")
    foreign.add_argument("--writes", type=int, default=40, help="(default: 40)")

    memory = commands.add_parser(
        "memory", parents=[common], help="resident memory kept across full-capacity writes",
        description=__doc__.split("\n\n")[2],
    )
    memory.add_argument("--rows", type=int, default=500_000,
                        help="the storage's capacity (default: 500000)")
    memory.add_argument("--writes", type=int, default=40, help="full-capacity writes (default: 40)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        print(f"{PROG} {args.command}: {problem}", file=sys.stderr)
        return 2
    sampler_keys = prepare(args)
    import torchrl  # noqa: F401 - its import sets its logger's level

    # TorchRL logs each storage's initialisation to stdout, between the lines measured
    torchrl_logger = logging.getLogger("torchrl")
    level = torchrl_logger.level
    torchrl_logger.setLevel(logging.WARNING)
    try:
        command = {"race": _race, "foreign": _foreign, "memory": _memory}[args.command]
        return command(args, sampler_keys)
    finally:
        torchrl_logger.setLevel(level)


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the sizes asked for, in one line, or None."""
    if args.command == "race":
        if not (args.seconds > 0 and args.switch_interval > 0) or args.runs < 1:
            return "--seconds and --switch-interval must be above 0, --runs at least 1"
        if args.capacity < 16 or not 1 <= args.write <= args.capacity:
            return "--capacity must be at least 16, --write from 1 to --capacity"
        return None
    if args.command == "foreign":
        if args.stored < 10_000 or not 1 <= args.write <= args.stored // 4 or args.writes < 1:
            return "--stored must be at least 10000, --write from 1 to a quarter of it, --writes at least 1"
        return None
    if args.rows < 1000 or args.writes < 1:
        return "--rows must be at least 1000, --writes at least 1"
    if not STATUS.exists():
        return f"reads resident memory from {STATUS}, which this system does not have (Linux only)"
    return None


def _race(args: argparse.Namespace, sampler_keys: dict) -> int:
    from torchrl.data.replay_buffers.samplers import (
        PrioritizedSliceSampler,
        SliceSampler,
        SliceSamplerWithoutReplacement,
    )

    keys = dict(slice_len=4, strict_length=False, **sampler_keys)
    make_sampler = {
        "slice": lambda: SliceSampler(**keys),
        "without_replacement": lambda: SliceSamplerWithoutReplacement(**keys),
        "prioritized": lambda: PrioritizedSliceSampler(args.capacity, alpha=0.7, beta=0.5, **keys),
    }[args.sampler]
    if args.sampler == "prioritized":
        try:
            make_sampler()
        # its segment trees are TorchRL's C++ extension's: 0.8 and 0.9 raise NameError without
        except (RuntimeError, ImportError, NameError) as err:
            import torch

            detail = str(err).replace("See warning above.", "").strip()  # a warning not shown here
            print(f"{PROG} race: --sampler prioritized needs TorchRL's C++ extension, which does "
                  f"not load beside torch {torch.__version__} ({detail})", file=sys.stderr)
            return 2
    if args.alternate:
        episodes = "one episode, then one-step episodes, in turn"
    else:
        episodes = "episodes of 1 to 8 steps"
    print(
        f"race: {args.sampler} sampler, {args.capacity} rows, writes of {args.write} ({episodes}), "
        f"{args.runs} x {args.seconds:g} s, switch interval {args.switch_interval:g} s  {torchrl_label()}"
    )
    interval = sys.getswitchinterval()
    sys.setswitchinterval(args.switch_interval)
    raised = runs = 0
    hung: list[str] = []
    try:
        for run in range(1, args.runs + 1):
            threads = _race_once(args, make_sampler)
            runs += 1
            reader, writer = threads
            errors = sum(sum(thread.errors.values()) for thread in threads)
            print(f"run {run}: reader {reader.calls} samples, writer {writer.calls} writes and samples, "
                  f"exceptions {errors}")
            for thread in threads:
                for kind, count in thread.errors.items():
                    print(f"  {thread.name}: {count} x {kind}  (at {thread.where[kind]})")
            raised += errors > 0
            hung = [thread.name for thread in threads if thread.is_alive()]
            if hung:
                print(f"run {run}: the {' and the '.join(hung)} still running {HANG_AFTER:g} s "
                      "after the end: a hang; no further run")
                break
    finally:
        sys.setswitchinterval(interval)
    print(f"{raised} of {runs} runs raised")
    return 1 if raised or hung else 0


def _race_once(args: argparse.Namespace, make_sampler) -> tuple[_Loop, _Loop]:
    """One run: the reader's and the writer's loops, once both stopped or ``HANG_AFTER`` passed."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    storage = LazyTensorStorage(args.capacity)
    reader_rb, writer_rb = (
        TensorDictReplayBuffer(storage=storage, sampler=make_sampler(), batch_size=32) for _ in range(2)
    )
    stream = _EpisodeStream(alternate=args.alternate)
    writer_rb.extend(stream.rows(args.capacity // 2))

    def write_and_sample():
        writer_rb.extend(stream.next_write(args.write))
        writer_rb.sample()

    end = time.monotonic() + args.seconds
    threads = (_Loop("reader", reader_rb.sample, end), _Loop("writer", write_and_sample, end))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, end + HANG_AFTER - time.monotonic()))
    return threads


class _Loop(threading.Thread):
    """Calls ``step`` until ``end`` (a ``time.monotonic()``), counting the calls that
    returned (``calls``) and the exceptions by kind (``errors``, and ``where`` the first
    of each kind was raised)."""

    def __init__(self, name: str, step, end: float):
        super().__init__(name=name, daemon=True)  # a hung loop must not keep the process alive
        self.step, self.end = step, end
        self.calls = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.where: dict[str, str] = {}

    def run(self) -> None:
        while time.monotonic() < self.end:
            try:
                self.step()
            except Exception as err:  # noqa: BLE001 - what the race raises is what is measured
                kind = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}"
                self.errors[kind] += 1
                if kind not in self.where:
                    frame = traceback.extract_tb(err.__traceback__)[-1]
                    path = Path(frame.filename)
                    self.where[kind] = f"{path.parent.name}/{path.name}:{frame.lineno} in {frame.name}"
            else:
                self.calls += 1


class _EpisodeStream:
    """The rows the race writes: steps numbered on from one write to the next, with
    ``episode`` ids and ``("next", "done")`` at each episode's last step.

    Args:
        alternate: the writes after the first are one episode of all their steps and
            one-step episodes, in turn; otherwise, like the first, episodes of 1 to 8 steps
            at random (seeded by the position).
    """

    def __init__(self, alternate: bool):
        self.alternate = alternate
        self.position = 0

    def next_write(self, n: int):
        return self._alternating(n) if self.alternate else self.rows(n)

    def rows(self, n: int):
        """The next ``n`` steps, in episodes of 1 to 8 steps at random."""
        import torch

        start = self._advance(n)
        done = torch.randint(0, 8, (n,), generator=torch.Generator().manual_seed(start)) == 0
        done[-1] = True
        # ids from start on: this write's are all new
        return self._rows(start, (done.long().cumsum(0) - done.long()) + start)

    def _alternating(self, n: int):
        import torch

        start = self._advance(n)
        steps = torch.arange(start, start + n)
        return self._rows(start, torch.full((n,), start) if (start // n) % 2 else steps)

    def _advance(self, n: int) -> int:
        start, self.position = self.position, self.position + n
        return start

    @staticmethod
    def _rows(start: int, episode):
        import torch
        from tensordict import TensorDict

        n = len(episode)
        done = episode != torch.cat([episode[1:], episode[-1:] + 1])
        obs = torch.arange(start, start + n)
        return TensorDict({"obs": obs, "episode": episode, ("next", "done"): done.unsqueeze(-1)}, [n])


def _memory(args: argparse.Namespace, sampler_keys: dict) -> int:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    print(f"memory: {args.rows:,} rows, {args.writes} full-capacity writes  {torchrl_label()}")
    step = torch.arange(args.rows)
    rows = TensorDict(
        {"obs": step, "episode": step // 100, ("next", "done"): (step % 100 == 99).unsqueeze(-1)},
        [args.rows],
    )
    rb = ReplayBuffer(
        storage=LazyTensorStorage(args.rows), sampler=SliceSampler(slice_len=4, **sampler_keys),
        batch_size=256,
    )
    rb.extend(rows)
    rb.sample()
    gc.collect()
    before = _resident_mib()
    for _ in range(args.writes):
        rb.extend(rows)
    after_writes = _resident_mib()
    rb.sample()
    gc.collect()
    after_sample = _resident_mib()
    print(f"resident {before:.0f} MiB before the writes, {after_writes - before:+.1f} MiB after them, "
          f"{after_sample - before:+.1f} MiB after the next sample")
    return 0


def _episodes(start: int, rows: int):
    """``rows`` steps of 500-step episodes from step ``start``: obs, episode ids, done flags."""
    import torch
    from tensordict import TensorDict

    step = torch.arange(start, start + rows)
    done = (step % 500 == 499).unsqueeze(-1)
    return TensorDict({"obs": step, "episode": step // 500, ("next", "done"): done}, [rows])


def _write_on_request(rb, start: int, rows: int, requests, written) -> None:
    """Runs in the spawned process: extends ``rb`` by ``rows`` rows at each request."""
    while requests.get():
        rb.extend(_episodes(start, rows))
        start += rows
        written.put(start)


def _foreign(args: argparse.Namespace, sampler_keys: dict) -> int:
    import statistics

    import torch
    from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer, SliceSampler

    print(f"foreign: {args.stored:,} rows stored, {args.writes} writes of {args.write:,} by another "
          f"process, samples of 256 rows  {torchrl_label()}")
    options = {"slice_len": 8, **sampler_keys}
    rb = ReplayBuffer(storage=LazyTensorStorage(args.stored), sampler=SliceSampler(**options), batch_size=256)
    rb.extend(_episodes(0, args.stored))
    floor = ReplayBuffer(storage=rb.storage, sampler=RandomSampler(), batch_size=256)
    twin = SliceSampler(**options, boundary_index=False) if args.fixes else None
    rb.sample()
    context = torch.multiprocessing.get_context("spawn")
    requests, written = context.Queue(), context.Queue()
    child = context.Process(target=_write_on_request, args=(rb, args.stored, args.write, requests, written))
    child.start()
    sliced, random_rows, equal = [], [], 0
    try:
        for write in range(args.writes):
            requests.put(True)
            written.get(timeout=600)
            torch.manual_seed(write)
            start = time.perf_counter()
            drawn = rb.sampler.sample(rb.storage, 256)
            sliced.append(time.perf_counter() - start)
            start = time.perf_counter()
            floor.sample()
            random_rows.append(time.perf_counter() - start)
            if twin is not None:
                torch.manual_seed(write)
                expected = twin.sample(rb.storage, 256)
                equal += all(torch.equal(a, b) for a, b in zip(drawn[0], expected[0])) and all(
                    torch.equal(drawn[1][key], expected[1][key]) for key in expected[1]
                )
    finally:
        requests.put(False)
        child.join(timeout=600)
    sample, floor_time = statistics.median(sliced), statistics.median(random_rows)
    print(f"slice sample after a foreign write: median {sample * 1e3:.3f} ms; RandomSampler floor "
          f"{floor_time * 1e3:.3f} ms; ratio {sample / floor_time:.2f}x the floor")
    if twin is not None:
        print(f"samples equal to stock's whole-storage recovery: {equal} of {args.writes}")
        return 0 if equal == args.writes else 1
    return 0


def _resident_mib() -> float:
    """This process's resident memory, in MiB (``VmRSS`` of ``/proc/self/status``)."""
    for line in STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{STATUS} has no VmRSS line")


if __name__ == "__main__":
    sys.exit(main())
