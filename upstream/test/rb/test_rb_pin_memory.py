# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

import inspect
import linecache
import threading
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.utils._pytree import tree_flatten

from torchrl.data import (
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers import utils as rb_utils
from torchrl.data.replay_buffers.samplers import SliceSampler
from torchrl.data.replay_buffers.storages import (
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
)

_has_accelerator = (
    torch.accelerator.is_available()
    if hasattr(torch, "accelerator")
    else torch.cuda.is_available()
)

# the tests that count the queries of torch.accelerator.is_available
_needs_torch_accelerator = pytest.mark.skipif(
    not hasattr(torch, "accelerator"), reason="torch.accelerator is not available"
)

# the replay buffers pin_memory is checked on, by kind
BUFFER_KINDS = [
    "tensordict",
    "memmap",
    "ndim2",
    "slice",
    "slice-ndim2",
    "new-tensordict-transform",
    "prioritized",
    "tensor",
    "tuple",
]
CAPACITY = 24


def _new_tensordict(td):
    # a transform that builds a new TensorDict: its device is None
    return TensorDict({"obs": td["obs"]}, batch_size=td.batch_size)


def _transitions(shape):
    done = torch.zeros(*shape, 1, dtype=torch.bool)
    done[..., 5::6, :] = True
    return TensorDict(
        {
            "obs": torch.randn(*shape, 3),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        shape,
    )


def _make_buffer(kind, **kwargs):
    """A filled replay buffer of the given kind, built with ``kwargs``."""
    if kind == "tensor":
        rb = ReplayBuffer(storage=LazyTensorStorage(CAPACITY), batch_size=6, **kwargs)
        rb.extend(torch.randn(CAPACITY, 3))
        return rb
    if kind == "tuple":
        rb = ReplayBuffer(storage=ListStorage(CAPACITY), batch_size=6, **kwargs)
        rb.extend([(torch.randn(3), torch.randn(())) for _ in range(CAPACITY)])
        return rb
    if kind == "prioritized":
        pytest.importorskip("torchrl._torchrl", exc_type=ImportError)
        rb = TensorDictPrioritizedReplayBuffer(
            alpha=0.7,
            beta=0.5,
            storage=LazyTensorStorage(CAPACITY),
            batch_size=6,
            **kwargs,
        )
        rb.extend(_transitions((CAPACITY,)))
        return rb
    ndim = 2 if kind.endswith("ndim2") else 1
    if kind == "memmap":
        storage = LazyMemmapStorage(CAPACITY)
    else:
        storage = LazyTensorStorage(CAPACITY, ndim=ndim)
    if kind.startswith("slice"):
        kwargs["sampler"] = SliceSampler(num_slices=2, end_key=("next", "done"))
    if kind == "new-tensordict-transform":
        kwargs["transform"] = _new_tensordict
    rb = TensorDictReplayBuffer(storage=storage, batch_size=6, **kwargs)
    rb.extend(_transitions((2, CAPACITY // 2) if ndim == 2 else (CAPACITY,)))
    return rb


def _tensors(output):
    leaves, _ = tree_flatten(output)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _assert_names_the_pinning_line(record):
    # the warning names the line of pin_memory_output that skips the pinning, in
    # whichever thread the sample runs
    lines, first = inspect.getsourcelines(rb_utils.pin_memory_output)
    assert record.filename == inspect.getsourcefile(rb_utils.pin_memory_output)
    assert first <= record.lineno < first + len(lines)
    assert "_pins_memory(self)" in linecache.getline(record.filename, record.lineno)


def _count_accelerator_queries(monkeypatch):
    """Makes torch.accelerator.is_available answer False; returns the list of calls."""
    calls = []

    def is_available():
        calls.append(threading.current_thread().name)
        return False

    monkeypatch.setattr(torch.accelerator, "is_available", is_available)
    return calls


def _assert_equal(output, expected):
    leaves, spec = tree_flatten(output)
    expected_leaves, expected_spec = tree_flatten(expected)
    assert spec == expected_spec
    for leaf, expected_leaf in zip(leaves, expected_leaves):
        assert torch.equal(leaf, expected_leaf)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
class TestPinMemory:
    @pytest.mark.parametrize("kind", BUFFER_KINDS)
    @pytest.mark.parametrize("prefetch", [0, 2])
    def test_sample_is_pinned(self, kind, prefetch):
        rb = _make_buffer(kind, pin_memory=True, prefetch=prefetch)
        for _ in range(3):
            # the info and the entries it adds to a TensorDict (index, slice
            # flags) are pinned with the data
            output = rb.sample(return_info=True)
            tensors = _tensors(output)
            assert tensors
            assert all(tensor.is_pinned() for tensor in tensors)

    def test_getitem_is_pinned(self):
        rb = _make_buffer("new-tensordict-transform", pin_memory=True)
        output = rb[torch.tensor([0, 3, 2])]
        assert output.device is None
        assert all(tensor.is_pinned() for tensor in _tensors(output))


@pytest.mark.skipif(_has_accelerator, reason="an accelerator is available")
class TestPinMemoryWithoutAccelerator:
    @pytest.mark.parametrize("kind", BUFFER_KINDS)
    def test_sample_warns_and_returns_unpinned(self, kind):
        torch.manual_seed(0)
        rb = _make_buffer(kind, pin_memory=True)
        torch.manual_seed(0)
        rb_unpinned = _make_buffer(kind, pin_memory=False)
        torch.manual_seed(1)
        np.random.seed(1)  # a prioritized sampler draws with numpy
        expected = rb_unpinned.sample(return_info=True)
        torch.manual_seed(1)
        np.random.seed(1)
        with pytest.warns(UserWarning, match="no accelerator") as record:
            output = rb.sample(return_info=True)
        assert len(record) == 1
        _assert_names_the_pinning_line(record[0])
        _assert_equal(output, expected)
        assert not any(tensor.is_pinned() for tensor in _tensors(output))

    def test_getitem_warns_and_returns_unpinned(self):
        rb = _make_buffer("new-tensordict-transform", pin_memory=True)
        index = torch.tensor([0, 3, 2])
        with pytest.warns(UserWarning, match="no accelerator"):
            output = rb[index]
        _assert_equal(output, _new_tensordict(rb.storage[index]))

    @pytest.mark.parametrize("prefetch", [0, 2])
    def test_warns_once_per_buffer(self, prefetch):
        buffers = [
            _make_buffer("tensordict", pin_memory=True, prefetch=prefetch)
            for _ in range(2)
        ]
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for rb in buffers:
                for _ in range(3):
                    rb.sample()
        record = [w for w in record if "no accelerator" in str(w.message)]
        assert len(record) == 2
        for w in record:
            assert issubclass(w.category, UserWarning)
            _assert_names_the_pinning_line(w)

    @_needs_torch_accelerator
    @pytest.mark.parametrize("prefetch", [0, 2])
    def test_asks_for_an_accelerator_once(self, monkeypatch, prefetch):
        calls = _count_accelerator_queries(monkeypatch)
        # the question pin_memory_output asks, answered once per process
        available = rb_utils.pin_memory_output.__globals__["_pin_memory_available"]
        available.cache_clear()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                for _ in range(2):
                    rb = _make_buffer("slice", pin_memory=True, prefetch=prefetch)
                    for _ in range(3):
                        rb.sample(return_info=True)
                    rb[torch.tensor([0, 3, 2])]
        finally:
            available.cache_clear()
        # once per process, not once per sample
        assert len(calls) == 1
