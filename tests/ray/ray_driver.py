"""A program that samples a RayReplayBuffer on a local Ray cluster, with and without the fixes.

Run by ``test_ray_replay_buffer.py`` in a process of its own, in one of two ways:

- ``python ray_driver.py hook``: the job's ``worker_process_setup_hook`` is
  ``torchrl_fixes.ray_worker_setup``; this program never imports ``torchrl_fixes``.
- ``torchrl-fixes run -- python ray_driver.py launcher``: no hook; the launcher's
  ``sitecustomize`` reaches the Ray workers through ``PYTHONPATH``.

It starts Ray on this machine (two CPUs, loopback only), builds two RayReplayBuffer
actors holding the same data (6M transitions in 1,000-step episodes, only the keys the
sampler reads: 30 MB), one plain and one whose worker has ``TORCHRL_FIXES=0``, and times, in
each actor, a slice sample (32 slices) right after a 1,000-row write, the two actors
in turn. The time is taken inside the actor: Ray's round trip, the same for both, is
not what the fixes change. It prints what each actor reports and the times as one
JSON line, and shuts Ray down.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial

# Before Ray is imported: the cluster's processes then listen on 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    RayReplayBuffer,
    SliceSampler,
    TensorDictReplayBuffer,
)

EPISODE = 1_000


def transitions(start: int, count: int) -> TensorDict:
    """Rows ``start`` to ``start + count`` of a stream of EPISODE-step episodes: what the sampler reads."""
    step = torch.arange(start, start + count)
    return TensorDict(
        {"obs": step.float().unsqueeze(-1), ("next", "done"): ((step + 1) % EPISODE == 0).unsqueeze(-1)},
        batch_size=[count],
    )


class ProbedReplayBuffer(TensorDictReplayBuffer):
    """A TensorDictReplayBuffer that can say, from inside its Ray actor, what runs there."""

    def fixes(self) -> dict:
        """Whether torchrl_fixes is imported in this process, and what it applied (without importing it)."""
        module = sys.modules.get("torchrl_fixes")
        site = sys.modules.get("sitecustomize")
        return {
            "pid": os.getpid(),
            "TORCHRL_FIXES": os.environ.get("TORCHRL_FIXES"),
            "imported": module is not None,
            "applied": [] if module is None else [r.name for r in module.status() if r.applied],
            "sampler patched": module is not None
            and module.is_object_patched(SliceSampler, "_get_stop_and_length"),
            "sitecustomize": getattr(site, "__file__", None),
        }

    def fill(self, stored: int) -> int:
        torch.set_num_threads(1)
        self._probe_next = 0
        while self._probe_next < stored:
            count = min(100_000, stored - self._probe_next)
            self.extend(transitions(self._probe_next, count))
            self._probe_next += count
        return len(self)

    def sample_after_write(self, rows: int) -> float:
        """Writes ``rows`` transitions, then samples: the seconds the sample took."""
        self.extend(transitions(self._probe_next, rows))
        self._probe_next += rows
        start = time.perf_counter()
        self.sample()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("way", choices=["hook", "launcher"])
    parser.add_argument("--stored", type=int, default=6_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--write", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()

    runtime_env = {}
    if args.way == "hook":
        runtime_env["worker_process_setup_hook"] = "torchrl_fixes.ray_worker_setup"
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
    try:
        node = ray.nodes()[0]["NodeManagerAddress"]
        capacity = args.stored + (args.rounds + 2) * args.write
        buffers = {}
        for name, env in (("patched", {}), ("stock", {"TORCHRL_FIXES": "0"})):
            remote_config = {"num_cpus": 1}
            if env:
                remote_config["runtime_env"] = {"env_vars": env}
            buffers[name] = RayReplayBuffer(
                replay_buffer_cls=ProbedReplayBuffer,
                remote_config=remote_config,
                storage=partial(LazyTensorStorage, capacity),
                sampler=partial(SliceSampler, num_slices=32, end_key=("next", "done")),
                batch_size=args.batch,
            )
        clients = {name: rb.client() for name, rb in buffers.items()}
        report = {
            "way": args.way,
            "node": node,
            "driver imported torchrl_fixes": "torchrl_fixes" in sys.modules,
            "actors": {name: client.fixes() for name, client in clients.items()},
            "stored": {name: client.fill(args.stored) for name, client in clients.items()},
        }
        times = {name: [] for name in clients}
        for round_ in range(args.rounds + 2):
            for name, client in clients.items():  # in turn, so load on the machine hits both
                seconds = client.sample_after_write(args.write)
                if round_ >= 2:  # two warm-up rounds
                    times[name].append(seconds)
        report["median ms"] = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        report["ms"] = {name: [round(s * 1e3, 3) for s in t] for name, t in times.items()}
        for rb in buffers.values():
            rb.shutdown()
    finally:
        ray.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
