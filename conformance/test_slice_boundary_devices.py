"""Conformance of the ``slice_boundary_index`` fix off the CPU: ``use_gpu`` and accelerator storages.

Stock ``SliceSampler(use_gpu=...)`` moves the storage's boundary column to that
device, finds the trajectory boundaries there and moves them back: they, and the
slices drawn from them, stay on the storage's device. A storage on an
accelerator keeps its boundaries, and the sampler's draws, on the accelerator.
The fix serves both from the storage's index: the written rows' boundary signal
comes to the host, the boundaries and the draws are where stock has them.

Every test runs a scenario on stock TorchRL and once patched, from the same
generator state, and asserts identical records (samples, infos, boundaries,
devices). The patched run also makes stock's whole-storage recovery
(``SliceSampler._find_start_stop_traj``) raise, so a scenario the index stopped
serving fails instead of matching stock by running it. The tests marked ``cuda``
need a CUDA device and are skipped without one; on such a machine
``use_gpu=True`` means the GPU in the CPU-storage tests too.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import replace

import pytest
import torch
from tensordict import TensorDict

from conformance.cuda_sync import count_host_synchronisations
from conformance.harness import assert_identical, run_patched, run_stock
from conformance.slice_scenarios import (
    MEMMAP_NDIM2,
    Recording,
    SliceSetup,
    record_sample,
    tdmpc2_buffer,
)
from conformance.test_slice_boundary_index import (
    _NOT_IN_EFFECT,
    FIX,
    RANDOM_SETUPS,
    random_plan,
    require,
)

pytestmark = [
    pytest.mark.skipif(_NOT_IN_EFFECT is not None, reason=f"{FIX} does not act here ({_NOT_IN_EFFECT})"),
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword"),
]


@contextlib.contextmanager
def whole_storage_recovery_raises():
    """Makes ``SliceSampler._find_start_stop_traj`` (stock's whole-storage recovery) raise."""
    from torchrl.data.replay_buffers.samplers import SliceSampler

    # in place of SliceSampler's own method, so that the index takes it for that method
    @functools.wraps(SliceSampler._find_start_stop_traj)
    def recover(self, *args, **kwargs):
        raise AssertionError("the whole storage was read: the index did not serve this sample")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SliceSampler, "_find_start_stop_traj", recover)
        yield


def assert_served_as_stock(scenario, seed: int) -> list:
    """Runs ``scenario`` stock and patched (the index alone serving it); asserts identical records."""
    stock = run_stock(scenario, seed)

    def served():
        with whole_storage_recovery_raises():
            return scenario()

    patched = run_patched(served, seed)
    assert_identical(stock, patched)
    return stock


def interleaved_records(setup: SliceSetup, seed: int, scratch) -> callable:
    """A third of the capacity, then random writes and samples, the boundaries after each sample."""
    plan = random_plan(setup, seed, steps=12)

    def scenario():
        run = Recording(setup, seed, scratch)
        run.write(setup.time_capacity // 3)
        for kind, rows in plan:
            if kind == "write":
                run.write(rows)
            else:
                run.sample()
                run.boundaries()
        run.fill_wrapped()
        run.sample(2)
        run.boundaries()
        return run.records

    return scenario


# ---------------------------------------------------------------------------
# use_gpu over storages on the CPU.
# ---------------------------------------------------------------------------

USE_GPU = {"cpu": "cpu", "device(cpu)": torch.device("cpu"), "True": True}

USE_GPU_SETUPS = [
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="traj_key"),
    SliceSetup(
        sampler="SliceSampler",
        storage="memmap",
        keys="end_key",
        strict_length=False,
        options=(("slice_len", 5),),
        batch_size=20,
    ),
    # Dreamer: a memory-mapped [T, num_envs] storage, cache_values=False
    SliceSetup(
        sampler="SliceSampler",
        storage=MEMMAP_NDIM2,
        keys="end_key",
        options=(("slice_len", 4), ("cache_values", False)),
        batch_size=20,
        buffer="ReplayBuffer",
    ),
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="unnamed"),
    SliceSetup(
        sampler="SliceSampler",
        storage="ndim2",
        keys="traj_key",
        strict_length=False,
        options=(("slice_len", 5), ("pad_output", True)),
        batch_size=20,
    ),
    SliceSetup(sampler="SliceSamplerWithoutReplacement", storage="ndim2", keys="auto"),
]


def with_use_gpu(setup: SliceSetup, use_gpu) -> SliceSetup:
    return replace(setup, options=(*setup.options, ("use_gpu", use_gpu)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_gpu", list(USE_GPU.values()), ids=list(USE_GPU))
@pytest.mark.parametrize("setup", USE_GPU_SETUPS, ids=str)
def test_use_gpu_is_served_as_stock(setup, use_gpu, seed, tmp_path, request):
    """``use_gpu`` (a device name, a device, True) over CPU storages: the index serves every
    sample, and samples and boundaries are stock's, on the storage's device."""
    setup = with_use_gpu(setup, use_gpu)
    require(setup, request)
    assert_served_as_stock(interleaved_records(setup, seed, tmp_path), seed)


def test_a_use_gpu_device_that_cannot_be_used_raises_as_stock(tmp_path):
    """A ``use_gpu`` device this machine cannot use: stock code runs, and raises as stock does."""
    device = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, or no CUDA at all
    setup = with_use_gpu(SliceSetup(sampler="SliceSampler", keys="traj_key"), device)

    def scenario():
        run = Recording(setup, 0, tmp_path)
        run.write(setup.time_capacity // 2)
        run.sample()
        return run.records

    records = run_stock(scenario)
    assert records[-1][0] == "raised"
    assert_identical(records, run_patched(scenario))


# ---------------------------------------------------------------------------
# Storages on a CUDA device.
# ---------------------------------------------------------------------------

CUDA_SETUPS = [
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="traj_key", device="cuda"),
    SliceSetup(
        sampler="SliceSampler",
        storage="tensor",
        keys="end_key",
        strict_length=False,
        options=(("slice_len", 5),),
        batch_size=20,
        device="cuda",
    ),
    SliceSetup(sampler="SliceSampler", storage="tensor", keys="unnamed", device="cuda"),
    # Dreamer's gpu_storage: [T, num_envs] on the GPU, use_gpu=True, cache_values=False
    SliceSetup(
        sampler="SliceSampler",
        storage="ndim2",
        keys="end_key",
        options=(("slice_len", 4), ("cache_values", False), ("use_gpu", True)),
        batch_size=20,
        buffer="ReplayBuffer",
        device="cuda",
    ),
    SliceSetup(
        sampler="SliceSampler",
        storage="ndim2",
        keys="traj_key",
        strict_length=False,
        options=(("slice_len", 5), ("pad_output", True)),
        batch_size=20,
        device="cuda",
    ),
    SliceSetup(sampler="SliceSamplerWithoutReplacement", storage="tensor", keys="end_key", device="cuda"),
    # spans, placed in the drawn trajectories with the draws on the GPU: the
    # SliceSampler spans of the interleavings on the CPU, on storages the GPU holds
    *(
        replace(setup, device="cuda")
        for setup in RANDOM_SETUPS
        if setup.sampler == "SliceSampler"
        and dict(setup.options).get("span")
        and setup.storage in ("tensor", "ndim2")
    ),
]


@pytest.mark.cuda
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("setup", CUDA_SETUPS, ids=str)
def test_cuda_storage_is_served_as_stock(setup, seed, tmp_path, request):
    """Storages on the GPU: boundaries and draws on the GPU, samples identical to stock's."""
    require(setup, request)
    assert_served_as_stock(interleaved_records(setup, seed, tmp_path), seed)


@pytest.mark.cuda
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("setup", USE_GPU_SETUPS[:3], ids=str)
def test_cuda_use_gpu_over_cpu_storage_is_served_as_stock(setup, seed, tmp_path, request):
    """``use_gpu="cuda"`` over CPU storages: stock finds the boundaries on the GPU and
    brings them back; the index gives the same, with no transfer."""
    setup = with_use_gpu(setup, "cuda")
    require(setup, request)
    assert_served_as_stock(interleaved_records(setup, seed, tmp_path), seed)


def tdmpc2_buffer_scenario(capacity: int, num_slices: int, horizon: int, episodes: int):
    """A buffer built as TD-MPC2's ``Buffer`` builds it, fed one whole episode at a time.

    A ``ReplayBuffer`` over a ``LazyTensorStorage`` on the GPU, a ``SliceSampler``
    reading the ``"episode"`` id that each ``add`` of an episode stamps on its
    rows (no end key, no truncated key, strict lengths), ``num_slices`` slices of
    ``horizon + 1`` steps per sample; a sample after every episode once the
    buffer holds a few.
    """

    def scenario():
        rb = tdmpc2_buffer(
            capacity, num_slices=num_slices, horizon=horizon, device=torch.device("cuda")
        )
        generator = torch.Generator().manual_seed(0)
        records = []
        for episode in range(episodes):
            length = int(torch.randint(horizon + 1, 4 * horizon, (), generator=generator))
            td = TensorDict(
                {
                    "obs": torch.randn(length, 3, generator=generator),
                    "reward": torch.randn(length, generator=generator),
                },
                [length],
            )
            td["episode"] = torch.full_like(td["reward"], episode, dtype=torch.int64)
            rb.extend(td)
            if episode >= 3:
                records.append(record_sample(rb))
        return records

    return scenario


@pytest.mark.cuda
def test_cuda_tdmpc2_buffer_is_served_as_stock():
    """TD-MPC2's buffer layout on the GPU, wrapping its ring: samples identical to stock's."""
    assert_served_as_stock(tdmpc2_buffer_scenario(400, 8, 5, 40), seed=0)


def synchronizing_calls_of_writes():
    """The host synchronisations that writes to a CUDA storage the index follows make.

    A sample builds the storage's index; then ``rb.extend`` (a cursor on the host)
    and ``storage.set`` with a cursor on the device, each counted under
    ``torch.cuda.set_sync_debug_mode("warn")``.
    """
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    def rows(first: int, count: int) -> TensorDict:
        step = torch.arange(first, first + count)
        done = ((step + 1) % 10 == 0).unsqueeze(-1)
        return TensorDict({"obs": step.float(), ("next", "done"): done}, [count]).cuda()

    storage = LazyTensorStorage(1_000, device="cuda")
    sampler = SliceSampler(num_slices=4, end_key=("next", "done"), truncated_key=None)
    rb = ReplayBuffer(storage=storage, sampler=sampler, batch_size=32)
    rb.extend(rows(0, 500))
    rb.sample()
    writes = (
        lambda: rb.extend(rows(500, 100)),
        lambda: storage.set(torch.arange(600, 700, device="cuda"), rows(600, 100)),
    )
    return [count_host_synchronisations(write) for write in writes]


@pytest.mark.cuda
def test_a_write_to_a_cuda_storage_adds_no_synchronisation():
    """Writes to a CUDA storage whose index a sample made wait on the device as stock's do."""
    run_stock(synchronizing_calls_of_writes)  # the process's first writes wait for more
    stock = run_stock(synchronizing_calls_of_writes)
    assert run_patched(synchronizing_calls_of_writes) == stock
