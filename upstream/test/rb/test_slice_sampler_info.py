# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl._utils import _replace_last
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import LazyMemmapStorage, LazyTensorStorage

# two environments' worth of trajectories (one column each in a ndim=2 storage),
# each column ending with a complete trajectory; ids run across the columns
LENGTHS = torch.tensor([[3, 7, 5, 9, 2, 6], [6, 2, 9, 5, 7, 3]])
NUM_ROWS = int(LENGTHS.sum())
SLICE_LEN = 4
BATCH_SIZE = 16


def _trajectories(ndim, with_is_init=True):
    lengths = LENGTHS.flatten()
    traj = torch.arange(lengths.numel()).repeat_interleave(lengths)
    step = torch.cat([torch.arange(length) for length in lengths.tolist()])
    last = step == lengths[traj] - 1
    data = TensorDict(
        {
            "traj": traj,
            "step": step,
            "pixels": torch.zeros(NUM_ROWS, 3, 8, 8, dtype=torch.uint8),
            # odd trajectories are cut by a time limit: done, not terminated
            ("next", "done"): last.unsqueeze(-1),
            ("next", "terminated"): (last & (traj % 2 == 0)).unsqueeze(-1),
        },
        [NUM_ROWS],
    )
    if with_is_init:
        data["is_init"] = (step == 0).unsqueeze(-1)
    return data.reshape(LENGTHS.shape[0], -1) if ndim == 2 else data


def _make_buffer(sampler, storage="tensor", with_is_init=True):
    ndim = 2 if storage == "ndim2" else 1
    if storage == "memmap":
        storage = LazyMemmapStorage(NUM_ROWS)
    else:
        storage = LazyTensorStorage(NUM_ROWS, ndim=ndim)
    rb = TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=BATCH_SIZE)
    rb.extend(_trajectories(ndim, with_is_init))
    return rb


def _expected_info(data, sampler):
    """The info of a sample, from the trajectory and step of each of its rows.

    A slice ends after ``SLICE_LEN`` rows or at the last step of its
    trajectory; with ``pad_output=True``, each slice is ``SLICE_LEN`` rows long
    and its padding repeats its last real row.
    """
    traj, step = data["traj"], data["step"]
    last = step == LENGTHS.flatten()[traj] - 1
    if getattr(sampler, "pad_output", False):
        step = step.view(-1, SLICE_LEN)
        real = torch.ones_like(step, dtype=torch.bool)
        real[:, 1:] = step[:, 1:] != step[:, :-1]
        slice_end = torch.zeros_like(real)
        slice_end[torch.arange(real.shape[0]), real.sum(1) - 1] = True
        slice_start = torch.zeros_like(real)
        slice_start[:, 0] = True
        slice_end, slice_start = slice_end.flatten(), slice_start.flatten()
    else:
        real = None
        slice_end = torch.zeros_like(last)
        length = 0
        for i in range(last.numel()):
            length += 1
            if length == SLICE_LEN or last[i]:
                slice_end[i] = True
                length = 0
        slice_start = torch.ones_like(last)
        slice_start[1:] = slice_end[:-1]
    info = {}
    truncated_key = sampler.truncated_key
    if truncated_key is not None:
        info[truncated_key] = slice_end.unsqueeze(-1)
        info[_replace_last(truncated_key, "done")] = (last | slice_end).unsqueeze(-1)
        info[_replace_last(truncated_key, "terminated")] = (
            last & (traj % 2 == 0)
        ).unsqueeze(-1)
    # PrioritizedSliceSampler returns no is_init
    if "is_init" in data.keys() and not isinstance(sampler, PrioritizedSliceSampler):
        info["is_init"] = ((step.flatten() == 0) | slice_start).unsqueeze(-1)
    if real is not None:
        info[("collector", "mask")] = real.flatten()
    return info


PRIORITIZED_KWARGS = {"max_capacity": NUM_ROWS, "alpha": 0.7, "beta": 0.5}
INFO_SAMPLERS = [
    pytest.param(SliceSampler, {}, id="slice"),
    pytest.param(SliceSampler, {"strict_length": False}, id="slice-short"),
    pytest.param(SliceSampler, {"span": (False, 2)}, id="slice-span"),
    pytest.param(
        SliceSampler,
        {"strict_length": False, "pad_output": True},
        id="slice-pad-output",
    ),
    pytest.param(SliceSamplerWithoutReplacement, {}, id="without-replacement"),
    pytest.param(
        SliceSamplerWithoutReplacement,
        {"strict_length": False},
        id="without-replacement-short",
    ),
    pytest.param(PrioritizedSliceSampler, PRIORITIZED_KWARGS, id="prioritized"),
    pytest.param(
        PrioritizedSliceSampler,
        {**PRIORITIZED_KWARGS, "strict_length": False},
        id="prioritized-short",
    ),
]

GATHER_SAMPLERS = [
    pytest.param(SliceSampler, {}, id="slice"),
    pytest.param(SliceSampler, {"strict_length": False}, id="slice-short"),
    pytest.param(
        SliceSampler,
        {"strict_length": False, "pad_output": True},
        id="slice-pad-output",
    ),
    pytest.param(SliceSampler, {"truncated_key": None}, id="slice-no-truncated"),
    pytest.param(SliceSampler, {"output_layout": "batch_time"}, id="slice-batch-time"),
    pytest.param(SliceSamplerWithoutReplacement, {}, id="without-replacement"),
    pytest.param(
        SliceSamplerWithoutReplacement,
        {"truncated_key": None},
        id="without-replacement-no-truncated",
    ),
    pytest.param(PrioritizedSliceSampler, PRIORITIZED_KWARGS, id="prioritized"),
    pytest.param(
        PrioritizedSliceSampler,
        {**PRIORITIZED_KWARGS, "strict_length": False},
        id="prioritized-short",
    ),
]


class TestSliceSamplerInfo:
    @pytest.mark.parametrize("sampler_cls,sampler_kwargs", INFO_SAMPLERS)
    @pytest.mark.parametrize("storage", ["tensor", "memmap", "ndim2"])
    @pytest.mark.parametrize("traj_key", ["traj", None])
    @pytest.mark.parametrize("truncated_key", [("next", "truncated"), None])
    @pytest.mark.parametrize("with_is_init", [True, False])
    def test_info_matches_trajectories(
        self,
        sampler_cls,
        sampler_kwargs,
        storage,
        traj_key,
        truncated_key,
        with_is_init,
    ):
        if sampler_cls is PrioritizedSliceSampler:
            pytest.importorskip("torchrl._torchrl", exc_type=ImportError)
        torch.manual_seed(0)
        sampler = sampler_cls(
            slice_len=SLICE_LEN,
            traj_key=traj_key,
            end_key=None if traj_key else ("next", "done"),
            truncated_key=truncated_key,
            **sampler_kwargs,
        )
        rb = _make_buffer(sampler, storage, with_is_init)
        for _ in range(4):
            data, info = rb.sample(return_info=True)
            info.pop("index")
            info.pop("priority_weight", None)
            expected = _expected_info(data, sampler)
            assert info.keys() == expected.keys()
            for key, value in expected.items():
                assert torch.equal(info[key], value), key

    @pytest.mark.parametrize("sampler_cls,sampler_kwargs", GATHER_SAMPLERS)
    @pytest.mark.parametrize("storage", ["tensor", "memmap", "ndim2"])
    def test_rows_gathered_once(
        self, sampler_cls, sampler_kwargs, storage, monkeypatch
    ):
        if sampler_cls is PrioritizedSliceSampler:
            pytest.importorskip("torchrl._torchrl", exc_type=ImportError)
        torch.manual_seed(0)
        rb = _make_buffer(sampler_cls(slice_len=SLICE_LEN, **sampler_kwargs), storage)
        # the sampler reads the entries its info needs (done, terminated,
        # is_init), not the rows the buffer gathers
        row_reads = []
        get = rb.storage.get

        def recording_get(index):
            if not isinstance(index, slice):
                row_reads.append(index)
            return get(index)

        monkeypatch.setattr(rb.storage, "get", recording_get)
        for _ in range(3):
            row_reads.clear()
            rb.sample()
            assert len(row_reads) == 1
