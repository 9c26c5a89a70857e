"""TD-MPC2's replay buffer as its users run it, stock against patched, on the installed TorchRL.

TD-MPC2 (``tdmpc2/common/buffer.py``) pins ``torchrl==0.8.1``. Its ``Buffer`` keeps
every transition in a ``LazyTensorStorage`` tagged with its episode number, samples
slices of ``horizon + 1`` steps by that id (built here by
:func:`conformance.slice_scenarios.tdmpc2_buffer`) and adds each finished episode
with ``extend``. :func:`run` builds that buffer twice, stock (inside
:func:`torchrl_fixes.disabled`) and patched, with its storage on the CPU or on a
given device (``python -m devtools gpu`` puts it on the GPU, as TD-MPC2 does where
it fits), fills both with the same episodes, then times TD-MPC2's loop in turn:
``samples_per_episode`` samples, then one episode written. Every sample of both is
checked: each slice lies in one episode, at consecutive steps.

Run it with ``nox -s benchmark_tdmpc2`` (TorchRL 0.8.1, as TD-MPC2 pins it) or
``python -m devtools tdmpc2`` on any installed TorchRL.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

import torchrl_fixes
from conformance.cuda_sync import synchronize
from conformance.slice_scenarios import TDMPC2_HORIZON, tdmpc2_buffer
from torchrl_fixes._core.versions import installed_version

# DMControl episodes of 500 steps.
EPISODE_LEN = 500
# Rows written per extend while filling: TD-MPC2 adds one episode at a time, which
# leaves the same rows; chunks fill 10M rows in seconds.
FILL_CHUNK = 1_000_000


class TDMPC2LoopError(Exception):
    """A sample broke TD-MPC2's contract, or the arguments cannot run."""


@dataclass
class Timing:
    """The median seconds of one sample, stock and patched, and the samples checked."""

    stored: int
    stock_s: float
    patched_s: float
    samples_checked: int

    @property
    def speedup(self) -> float:
        return self.stock_s / self.patched_s


def episodes(first_step: int, count: int) -> TensorDict:
    """``count`` transitions from global step ``first_step`` on, in 500-step episodes.

    ``step`` is each row's global step: a slice is consecutive where it counts up by one.
    """
    step = torch.arange(first_step, first_step + count)
    return TensorDict(
        {
            "obs": torch.randn(count, 8),
            "action": torch.randn(count, 2),
            "reward": torch.randn(count),
            "episode": step // EPISODE_LEN,
            "step": step,
        },
        [count],
    )


def check_slices(sample: TensorDict) -> None:
    """Raises :class:`TDMPC2LoopError` unless every slice is one episode at consecutive steps."""
    slices = sample.view(-1, TDMPC2_HORIZON + 1)
    episode, step = slices["episode"], slices["step"]
    if not (episode == episode[:, :1]).all():
        raise TDMPC2LoopError("a slice crosses an episode boundary")
    if not (step.diff(dim=1) == 1).all():
        raise TDMPC2LoopError("a slice's steps are not consecutive")


def run(
    stored: int,
    capacity: int,
    rounds: int,
    samples_per_episode: int,
    device: torch.device | str = "cpu",
) -> Timing:
    """Fills a stock and a patched TD-MPC2 buffer with ``stored`` rows, then times the loop.

    Each round runs, for stock then patched (patched first every other round),
    ``samples_per_episode`` samples and one episode's ``extend``; the sample's
    median over the rounds is what is reported.

    Args:
        stored (int): rows written before timing.
        capacity (int): the storage's capacity.
        rounds (int): timed rounds, one episode written in each.
        samples_per_episode (int): samples timed per round and buffer.
        device (torch.device or str, optional): the storage's device (TD-MPC2 keeps
            its buffer on ``cuda:0`` when it fits). A sample on a CUDA device is
            timed until the device has finished it. Defaults to ``"cpu"``.
    """
    device = torch.device(device)
    if capacity < stored + rounds * EPISODE_LEN:
        raise TDMPC2LoopError(
            f"capacity {capacity} cannot hold {stored} rows and {rounds} more episodes; "
            "raise --capacity"
        )
    with torchrl_fixes.disabled():
        buffers = {"stock": tdmpc2_buffer(capacity, device=device)}
    buffers["patched"] = tdmpc2_buffer(capacity, device=device)
    for start in range(0, stored, FILL_CHUNK):
        rows = episodes(start, min(FILL_CHUNK, stored - start))
        for rb in buffers.values():
            rb.extend(rows)
    times: dict[str, list[float]] = {name: [] for name in buffers}
    checked = 0
    for round_number in range(rounds):
        new_episode = episodes(stored + round_number * EPISODE_LEN, EPISODE_LEN)
        order = list(buffers) if round_number % 2 == 0 else list(reversed(buffers))
        for name in order:
            rb = buffers[name]
            for _ in range(samples_per_episode):
                synchronize(device)  # the write before it is not the sample's time
                start = time.perf_counter()
                sample = rb.sample()
                synchronize(device)
                times[name].append(time.perf_counter() - start)
                check_slices(sample)
                checked += 1
            rb.extend(new_episode)
    return Timing(
        stored=stored,
        stock_s=statistics.median(times["stock"]),
        patched_s=statistics.median(times["patched"]),
        samples_checked=checked,
    )


def table(timing: Timing) -> str:
    """The run as a Markdown table, headed by the TorchRL it ran on."""
    torchrl = installed_version("torchrl") or "unknown"
    applied = ", ".join(row.name for row in torchrl_fixes.status() if row.applied) or "none"
    return "\n".join(
        [
            f"TD-MPC2's buffer on torchrl {torchrl}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread(s); fixes applied: {applied}",
            "",
            "| stored | stock sample | patched sample | speed-up | samples checked |",
            "| --- | --- | --- | --- | --- |",
            f"| {timing.stored:,} | {timing.stock_s * 1e3:.2f} ms | "
            f"{timing.patched_s * 1e3:.3f} ms | {timing.speedup:.1f}x | "
            f"{timing.samples_checked:,} |",
        ]
    )


def main(stored: int, capacity: int, rounds: int, samples: int, out: Path | None) -> int:
    """Runs :func:`run` on one torch thread (as the main job times) and prints its table."""
    torch.set_num_threads(1)
    timing = run(stored, capacity, rounds, samples)
    text = table(timing)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tdmpc2.md").write_text(text + "\n")
    return 0
