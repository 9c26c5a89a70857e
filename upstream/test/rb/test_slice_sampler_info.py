# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

import inspect

import pytest
import torch
from tensordict import TensorDict

from torchrl._utils import _replace_last
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import (
    PrioritizedSliceSampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    StreamingSliceSampler,
)
from torchrl.data.replay_buffers.storages import LazyMemmapStorage, LazyTensorStorage

# two environments' worth of trajectories (one column each in a ndim=2 storage),
# each column ending with a complete trajectory; ids run across the columns
LENGTHS = torch.tensor([[3, 7, 5, 9, 2, 6], [6, 2, 9, 5, 7, 3]])
NUM_ROWS = int(LENGTHS.sum())
SLICE_LEN = 4
BATCH_SIZE = 16


def _trajectories(ndim, with_is_init=True, with_done=True):
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
    if not with_done:
        del data["next", "done"]
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
        done = last | slice_end if ("next", "done") in data.keys(True) else slice_end
        info[_replace_last(truncated_key, "done")] = done.unsqueeze(-1)
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
    pytest.param(
        SliceSampler,
        {"output_layout": "batch_time"},
        id="slice-batch-time",
        marks=pytest.mark.skipif(
            "output_layout" not in inspect.signature(SliceSampler.__init__).parameters,
            reason="output_layout is newer than this TorchRL",
        ),
    ),
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
        row_reads = _record_row_reads(rb, monkeypatch)
        for _ in range(3):
            row_reads.clear()
            rb.sample()
            assert len(row_reads) == 1


def _record_row_reads(rb, monkeypatch):
    """The indices of the rows read from ``rb``'s storage (``storage.get``) from now on."""
    row_reads = []
    get = rb.storage.get

    def recording_get(index):
        if not isinstance(index, slice):
            row_reads.append(index)
        return get(index)

    monkeypatch.setattr(rb.storage, "get", recording_get)
    return row_reads


# The writes of TestStreamingSliceSamplerInfo (rows of _trajectories(1)), each
# ending inside a trajectory, and the samples taken after some of them:
# write number -> the fresh windows (first row of each) the next sample returns.
# A window is SLICE_LEN consecutive steps of one trajectory, cut from its start;
# those of trajectories 2 (rows 10-13) and 9 (rows 49-52) span two writes.
STREAMING_WRITES = [(0, 13), (13, 26), (26, 39), (39, 52), (52, NUM_ROWS)]
STREAMING_SAMPLES = {1: [3, 10, 15, 19], 3: [26, 32, 40, 44], 4: [49, 54]}
# sampler keyword arguments, whether the rows hold is_init, and whether they hold
# done: each stored entry the sampler reads is the only mark of some trajectory ends
STREAMING_BOUNDARIES = [
    pytest.param({"end_key": ("next", "done")}, True, True, id="end_key"),
    pytest.param({"end_key": ("next", "done")}, False, True, id="end_key-no-is_init"),
    pytest.param({}, True, True, id="default-keys"),
    # the trajectory ids alone
    pytest.param({"traj_key": "traj"}, False, False, id="traj_key"),
    # odd trajectories end without terminated: the next one's is_init marks it
    pytest.param({"end_key": ("next", "terminated")}, True, True, id="is_init"),
]


class TestStreamingSliceSamplerInfo:
    def _buffer(self, storage, boundary, with_is_init, with_done):
        sampler = StreamingSliceSampler(slice_len=SLICE_LEN, **boundary)
        if storage == "memmap":
            storage = LazyMemmapStorage(NUM_ROWS)
        else:
            storage = LazyTensorStorage(NUM_ROWS)
        # each sample asks for as many rows as there are fresh windows
        rb = TensorDictReplayBuffer(storage=storage, sampler=sampler)
        return rb, _trajectories(1, with_is_init, with_done)

    @pytest.mark.parametrize("boundary,with_is_init,with_done", STREAMING_BOUNDARIES)
    @pytest.mark.parametrize("storage", ["tensor", "memmap"])
    def test_windows_across_writes(self, boundary, with_is_init, with_done, storage):
        torch.manual_seed(0)
        rb, data = self._buffer(storage, boundary, with_is_init, with_done)
        for write, (start, stop) in enumerate(STREAMING_WRITES):
            rb.extend(data[start:stop])
            if write not in STREAMING_SAMPLES:
                continue
            window_starts = torch.tensor(STREAMING_SAMPLES[write])
            expected_rows = (
                window_starts.unsqueeze(-1) + torch.arange(SLICE_LEN)
            ).flatten()
            sample, info = rb.sample(batch_size=expected_rows.numel(), return_info=True)
            info.pop("index")
            # each row is the only one of its trajectory and step
            for key in ("traj", "step"):
                assert torch.equal(sample[key], data[key][expected_rows]), key
            expected = _expected_info(sample, rb.sampler)
            assert info.keys() == expected.keys()
            for key, value in expected.items():
                assert torch.equal(info[key], value), key

    @pytest.mark.parametrize("boundary,with_is_init,with_done", STREAMING_BOUNDARIES)
    def test_writes_read_no_rows(self, boundary, with_is_init, with_done, monkeypatch):
        rb, data = self._buffer("tensor", boundary, with_is_init, with_done)
        # a write reads the trajectory ids, done flags and is_init of the
        # written rows to find its windows, not the rows themselves
        row_reads = _record_row_reads(rb, monkeypatch)
        for write, (start, stop) in enumerate(STREAMING_WRITES):
            row_reads.clear()
            rb.extend(data[start:stop])
            assert len(row_reads) == 0
            if write in STREAMING_SAMPLES:
                rb.sample(batch_size=len(STREAMING_SAMPLES[write]) * SLICE_LEN)
                assert len(row_reads) == 1
