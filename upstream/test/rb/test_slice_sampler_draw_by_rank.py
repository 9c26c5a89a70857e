# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
import pytest
import torch
from tensordict import TensorDict

from torchrl.data import LazyTensorStorage
from torchrl.data.replay_buffers import SliceSampler
from torchrl_fixes.fixes.slice_boundary_index.slice_sampling import _TABLE_DRAWS
from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import TrajectoryBoundaries


class ListingSliceSampler(SliceSampler):
    """A SliceSampler that samples from the list of every trajectory.

    Overriding ``_sample_slices`` keeps :meth:`SliceSampler.sample` on the path
    that lists the trajectories: the reference the draw by rank must equal.
    """

    def _sample_slices(self, *args, **kwargs):
        return super()._sample_slices(*args, **kwargs)


def _assert_same_sample(sample, expected):
    (index, info), (expected_index, expected_info) = sample, expected
    for got, want in zip(index, expected_index, strict=True):
        assert torch.equal(got, want)
    assert info.keys() == expected_info.keys()
    for key in info:
        assert torch.equal(info[key], expected_info[key]), key


def _storage(lengths, capacity, ndim):
    """Trajectories of ``lengths`` steps written in turn, wrapping past ``capacity``."""
    episode = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    done = torch.cat([torch.arange(n) == n - 1 for n in lengths])
    rows = episode.numel()
    data = TensorDict(
        {
            "episode": episode,
            "obs": torch.arange(rows),
            ("next", "done"): done[:, None],
        },
        [rows],
    )
    if ndim == 2:
        # two lanes of ``capacity`` rows
        storage = LazyTensorStorage(2 * capacity, ndim=2)
        data = torch.stack([data, data.apply(lambda x: x.flip(0))], 1)
    else:
        storage = LazyTensorStorage(capacity)
    cursor = 0
    while cursor < rows:
        step = min(rows - cursor, 7)
        index = torch.arange(cursor, cursor + step) % capacity
        storage.set(index, data[cursor : cursor + step])
        cursor += step
    return storage


class TestSliceSamplerDrawByRank:
    @pytest.mark.parametrize("ndim", [1, 2])
    @pytest.mark.parametrize("strict_length", [True, False])
    @pytest.mark.parametrize("keys", ["traj_key", "end_key", "none"])
    @pytest.mark.parametrize("capacity", [200, 97])
    def test_same_sample_as_the_listing(self, ndim, strict_length, keys, capacity):
        lengths = [3, 9, 2, 14, 6, 1, 11, 4] * 4
        storage = _storage(lengths, capacity, ndim)
        kwargs = {
            "traj_key": {"traj_key": "episode"},
            "end_key": {"end_key": ("next", "done")},
            "none": {},
        }[keys]
        samplers = [
            cls(slice_len=4, strict_length=strict_length, **kwargs)
            for cls in (SliceSampler, ListingSliceSampler)
        ]
        for seed in range(5):
            samples = []
            for sampler in samplers:
                torch.manual_seed(seed)
                samples.append(sampler.sample(storage, 32))
            _assert_same_sample(*samples)

    def test_same_sample_after_writes(self):
        storage = _storage([5, 8, 3, 12] * 3, 40, 1)
        samplers = [
            cls(num_slices=4, traj_key="episode", strict_length=False)
            for cls in (SliceSampler, ListingSliceSampler)
        ]
        for step in range(20):
            data = TensorDict(
                {
                    "episode": torch.full((3,), 100 + step // 2),
                    "obs": torch.arange(3),
                    ("next", "done"): torch.tensor([[False], [False], [step % 2 == 1]]),
                },
                [3],
            )
            storage.set(torch.arange(3 * step, 3 * step + 3) % 40, data)
            samples = []
            for sampler in samplers:
                torch.manual_seed(step)
                samples.append(sampler.sample(storage, 16))
            _assert_same_sample(*samples)

    def test_appends_are_sampled_from_the_table(self, monkeypatch):
        """An online buffer's writes, past its stored rows: the samples are the
        listing's, and the trajectory order is never asked for them."""
        storage = LazyTensorStorage(400)
        samplers = [
            cls(num_slices=4, end_key=("next", "done"), truncated_key=None)
            for cls in (SliceSampler, ListingSliceSampler)
        ]
        lengths = torch.tensor([9, 4, 12, 6, 3, 15, 5])
        # episodes of 2 to 7 steps, none shorter than a slice
        ends = torch.zeros(2000, dtype=torch.bool)
        ends[(torch.arange(250) % 6 + 2).cumsum(0) - 1] = True

        def rows(start, n):
            step = torch.arange(start, start + n)
            return TensorDict({"obs": step, ("next", "done"): ends[step, None]}, [n])

        storage.set(torch.arange(20), rows(0, 20))
        samplers[0].sample(storage, 8)
        order_queries = []
        trajectories = TrajectoryBoundaries.trajectories

        def counted(self, *args, **kwargs):
            order_queries.append(1)
            return trajectories(self, *args, **kwargs)

        written = 20
        for step in range(30):
            n = int(lengths[step % lengths.numel()])
            storage.set(torch.arange(written, written + n), rows(written, n))
            written += n
            samples = []
            for sampler in samplers:
                torch.manual_seed(step)
                with monkeypatch.context() as patch:
                    if sampler is samplers[0]:
                        patch.setattr(TrajectoryBoundaries, "trajectories", counted)
                    samples.append(sampler.sample(storage, 8))
            _assert_same_sample(*samples)
        assert not order_queries

    def test_the_kept_draw_serves_until_something_changes(self):
        """A sampler that drew from its storage's table draws from it again, the rows
        written since appended, without asking the index; a change of batch size,
        slice options, storage or storage state makes the next sample ask it
        again. Every sample is the listing's."""

        def rows(start, n):
            step = torch.arange(start, start + n)
            done = (step % 7 == 6) | (step % 11 == 10)
            return TensorDict({"obs": step, ("next", "done"): done[:, None]}, [n])

        storages = [LazyTensorStorage(120), LazyTensorStorage(120)]
        for storage in storages:
            storage.set(torch.arange(30), rows(0, 30))
        samplers = [
            cls(num_slices=4, end_key=("next", "done"), truncated_key=None)
            for cls in (SliceSampler, ListingSliceSampler)
        ]
        written = 30
        kept = []

        def sample(storage, batch_size, seed):
            samples = []
            for sampler in samplers:
                torch.manual_seed(seed)
                samples.append(sampler.sample(storage, batch_size))
            _assert_same_sample(*samples)
            kept.append(_TABLE_DRAWS.get(samplers[0]))

        def write(storage, rows_written, data):
            storage.set(rows_written, data)

        sample(storages[0], 8, 0)
        sample(storages[0], 8, 1)  # no write: the kept draw
        write(storages[0], torch.arange(written, written + 9), rows(written, 9))
        written += 9
        sample(storages[0], 8, 2)  # written past the stored rows: appended
        assert kept[0] is not None and kept[1] is kept[0] and kept[2] is kept[0]
        sample(storages[0], 12, 3)  # another batch size
        assert kept[3] is not kept[2]
        for sampler in samplers:
            sampler.num_slices = 3
        sample(storages[0], 12, 4)  # other slice options
        assert kept[4] is not kept[3]
        sample(storages[1], 12, 5)  # another storage
        assert kept[5] is not kept[4]
        assert None not in kept
        write(storages[1], torch.tensor([3]), rows(10, 1))
        sample(storages[1], 12, 6)  # a row before the last rewritten: no table
        storages[0].set(torch.arange(written, 120), rows(written, 120 - written))
        sample(storages[0], 12, 7)  # full: no table
        storages[0]._empty()
        storages[0].set(torch.arange(40), rows(500, 40))
        sample(storages[0], 12, 8)  # emptied (not recorded) and written again
        sample(storages[0], 12, 9)
        assert kept[9] is kept[8] is not None
