"""TorchRL's sample units (``Sequence``, ``SubgoalTriplet``) beside the slice boundary index.

A replay buffer can expand each sampled anchor into a sequence
(``sample_unit=Sequence(...)``) or, on TorchRL main, a goal triplet; both recover
episode boundaries from the done flags of the whole storage, through
``_ReplayBoundaryIndex``, as stock does. Their samples must stay exactly stock's
with the fixes applied (the storage's writes are recorded for its trajectory
index), across writes, wrap-around and ``ndim=2`` storages. Releases without sample
units skip this file.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from conformance.harness import assert_identical, run_patched, run_stock

sample_units = pytest.importorskip(
    "torchrl.data.replay_buffers.sample_units", reason="this TorchRL has no sample units"
)


def _rows(start: int, count: int, length: int, lanes: int = 0) -> TensorDict:
    step = torch.arange(start, start + count)
    done = (step % length == length - 1) | (step % (length + 3) == 0)
    if lanes:
        # [lanes, time], the layout collectors write; each lane ends episodes at its own pace
        lane = torch.arange(lanes).unsqueeze(-1)
        done = (step + lane) % (length + lane) == 0
        obs = (step * 10 + lane).float()
        return TensorDict({"obs": obs, ("next", "done"): done.unsqueeze(-1)}, [lanes, count])
    return TensorDict({"obs": step.float(), ("next", "done"): done.unsqueeze(-1)}, [count])


def _unit(kind: str):
    if kind == "triplet":
        if not hasattr(sample_units, "SubgoalTriplet"):
            pytest.skip("needs a newer TorchRL: this one has no SubgoalTriplet")
        return sample_units.SubgoalTriplet(goal_discount=0.9)
    return sample_units.Sequence(length=5, episode_boundary=kind, burn_in=1, bootstrap=1)


def _scenario(kind: str, capacity: int, lanes: int, writes: list[int]):
    from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer

    def run():
        rb = ReplayBuffer(
            storage=LazyTensorStorage(capacity, ndim=2 if lanes else 1),
            sampler=RandomSampler(),
            sample_unit=_unit(kind),
            batch_size=6,
            **({"dim_extend": 1} if lanes else {}),
        )
        out, position = [], 0
        for count in writes:
            rb.extend(_rows(position, count, length=9, lanes=lanes))
            position += count
            out.append(rb.sample(return_info=True))
            out.append(rb.sample(return_info=True))
        return out

    return run


@pytest.mark.parametrize("kind", ["pad", "stop", "include_reset", "triplet"])
@pytest.mark.parametrize(
    ("capacity", "writes"),
    [(200, [40, 3, 17, 60]), (64, [40, 30, 1, 50, 7])],
    ids=["filling", "wrapping"],
)
def test_sample_unit_samples_match_stock(kind, capacity, writes):
    """Sequence (every boundary mode) and SubgoalTriplet: stock's samples, write after write."""
    scenario = _scenario(kind, capacity, 0, writes)
    for seed in range(3):
        assert_identical(run_stock(scenario, seed), run_patched(scenario, seed))


@pytest.mark.parametrize("kind", ["pad", "stop"])
def test_sequence_without_done_key_matches_stock(kind):
    """Sequence(done_key=None): the whole storage is one episode, as in stock."""
    from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer

    def scenario():
        rb = ReplayBuffer(
            storage=LazyTensorStorage(64),
            sampler=RandomSampler(),
            sample_unit=sample_units.Sequence(length=5, episode_boundary=kind, done_key=None),
            batch_size=6,
        )
        out, position = [], 0
        for count in (40, 3, 30):
            rb.extend(_rows(position, count, length=9))
            position += count
            out.append(rb.sample(return_info=True))
        return out

    for seed in range(3):
        assert_identical(run_stock(scenario, seed), run_patched(scenario, seed))


@pytest.mark.parametrize("kind", ["pad", "stop"])
def test_sequence_on_ndim2_storage_matches_stock(kind):
    """Sequence over an ndim=2 storage (time x lanes): stock's samples."""
    scenario = _scenario(kind, 120, 3, [15, 20, 9, 11])
    for seed in range(3):
        assert_identical(run_stock(scenario, seed), run_patched(scenario, seed))
