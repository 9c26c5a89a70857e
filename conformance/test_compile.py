"""What TorchRL compiles keeps compiling with the fixes, with stock's results.

Two compiled paths of the replay buffers: ``torch.compile(fullgraph=True)`` around
``storage.set`` on a ``compilable=True`` storage, and ``SliceSampler(compile=True)``.
The write hooks of the boundary index must not put anything Python-side (a lock,
counters) where the compiler traces; a compiled write goes unrecorded, and the
boundary index must still return stock's boundaries afterwards.
"""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

from conformance import reference
from conformance.harness import assert_identical, run_patched, run_stock


def _counted_by_torchrl(storage, name: str) -> bool:
    """Whether TorchRL itself keeps the counter ``name`` (before 0.14 the fix backports one)."""
    counter = inspect.getattr_static(type(storage), name, None)
    return getattr(getattr(counter, "fget", None), "__module__", "").startswith("torchrl.")


def _compiled_writes():
    storage = LazyTensorStorage(100, compilable=True)
    data = torch.arange(25).unsqueeze(-1)
    storage.set(torch.arange(25), data)

    @torch.compile(fullgraph=True)
    def write(cursor, value):
        storage.set(cursor, value)

    write(torch.arange(25, 50), data * 2)
    write(torch.arange(50, 75), data * 3)
    counters = [
        int(getattr(storage, name))
        for name in ("_mutation_revision", "_last_cursor_index")
        if _counted_by_torchrl(storage, name)
    ]
    return len(storage), counters, storage[:75].clone()


def test_fullgraph_compiled_storage_set():
    """torch.compile(fullgraph=True) over storage.set compiles and writes what stock writes."""
    torch._dynamo.reset()
    stock = run_stock(_compiled_writes)
    torch._dynamo.reset()
    patched = run_patched(_compiled_writes)
    assert patched[0] == 75
    assert_identical(stock, patched)


def _episodes(start: int, count: int, length: int) -> TensorDict:
    step = torch.arange(start, start + count)
    return TensorDict(
        {
            "obs": step.float(),
            "episode": step // length,
            ("next", "done"): (step % length == length - 1).unsqueeze(-1),
        },
        [count],
    )


def _sample_after_unrecorded_write(monkeypatch):
    """Samples of a compilable storage across a write the index cannot see (as when compiled)."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(200, compilable=True),
        sampler=SliceSampler(num_slices=4, traj_key="episode"),
        batch_size=16,
    )
    rb.extend(_episodes(0, 120, 10))
    out = [rb.sample()]
    # A write run as compiled code runs it: torch.compiler.is_compiling() is True.
    with monkeypatch.context() as patch:
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        if not reference.UPSTREAM:
            # the backported revision imports it by name
            mutation_revision = importlib.import_module("torchrl_fixes.fixes.slice_boundary_index.mutation_revision")
            patch.setattr(mutation_revision, "is_compiling", lambda: True)
        rb.storage.set(torch.arange(120, 200), _episodes(120, 80, 7))
    out.append(rb.sample())
    rb.extend(_episodes(200, 30, 5))
    out.append(rb.sample())
    return out


def test_write_unseen_by_the_index_gives_stock_samples(monkeypatch):
    """A write the boundary index does not record (compiled) still gives stock's samples after it:
    the storage's mutation revision, or the columns' version counters, make the index rebuild."""
    stock = run_stock(lambda: _sample_after_unrecorded_write(monkeypatch))
    patched = run_patched(lambda: _sample_after_unrecorded_write(monkeypatch))
    assert_identical(stock, patched)


@pytest.mark.skipif(
    not reference.in_effect("slice_boundary_index"), reason="the boundary index is not in effect"
)
def test_compilable_storage_is_indexed():
    """status: a compilable storage is indexed on every release: a compiled write, which the
    index does not record, still moves the version counters of the columns it writes."""
    storage = LazyTensorStorage(50, compilable=True)
    storage.set(torch.arange(20), _episodes(0, 20, 5))
    assert reference.fallback_reason(SliceSampler(num_slices=2, traj_key="episode"), storage) is None


def _compiled_sampler():
    rb = ReplayBuffer(
        storage=LazyTensorStorage(500),
        sampler=SliceSampler(num_slices=4, traj_key="episode", compile=True),
        batch_size=32,
    )
    rb.extend(_episodes(0, 300, 25))
    out = [rb.sample(return_info=True) for _ in range(2)]
    rb.extend(_episodes(300, 100, 9))
    out.append(rb.sample(return_info=True))
    return out


def test_compiled_slice_sampler():
    """SliceSampler(compile=True) samples what stock samples, with the fixes active."""
    torch._dynamo.reset()
    stock = run_stock(_compiled_sampler)
    torch._dynamo.reset()
    patched = run_patched(_compiled_sampler)
    assert_identical(stock, patched)
