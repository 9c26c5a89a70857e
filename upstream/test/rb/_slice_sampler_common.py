# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Helpers of the slice sampler tests: the reference sampler, the rows stored, and samples compared exactly."""
from __future__ import annotations

import torch
from tensordict import TensorDict


class WholeStorageRecovery:
    """A slice sampler mixin that recovers the boundaries from the whole storage, as
    main does (overriding how they are found keeps it off the index), and counts it."""

    recoveries = 0

    def _find_start_stop_traj(self, *args, **kwargs):
        self.recoveries += 1
        return super()._find_start_stop_traj(*args, **kwargs)


def slice_steps(start, rows, lanes=None):
    """``rows`` steps from ``start`` on, in episodes that end at each step with
    probability 0.15 (7 steps on average, a few over 30)."""
    generator = torch.Generator().manual_seed(start)
    shape = (rows,) if lanes is None else (rows, lanes)
    done = torch.rand(shape, generator=generator) < 0.15
    episode = done.long().cumsum(0) - done.long() + 1_000 * start
    if lanes is not None:
        episode = episode * lanes + torch.arange(lanes)
    return TensorDict(
        {
            "obs": torch.randn(shape, generator=generator),
            "episode": episode,
            ("next", "done"): done[..., None],
        },
        shape,
    )


def sample_tensors(sample):
    """Every tensor of ``(data, info)`` with where it is: the data's entries, then the info's."""
    data, info = sample
    found = [(key, data.get(key)) for key in sorted(data.keys(True, True), key=str)]
    for key, value in sorted(info.items(), key=str):
        values = value if isinstance(value, tuple) else (value,)
        found += [((key, i), v) for i, v in enumerate(values)]
    return found


def assert_same_sample(got, expected, where):
    """Asserts that two samples (or the messages of the errors raised) are the same."""
    if isinstance(got, str) or isinstance(expected, str):
        assert got == expected, where
        return
    got, expected = sample_tensors(got), sample_tensors(expected)
    assert [(k, t.dtype) for k, t in got] == [(k, t.dtype) for k, t in expected], where
    assert all(torch.equal(g, e) for (_, g), (_, e) in zip(got, expected)), where


def count_calls(monkeypatch, cls, name):
    """The classes of the samplers that call ``cls.name`` from now on, once a call."""
    called = []
    method = getattr(cls, name)

    def counted(sampler, *args, **kwargs):
        called.append(type(sampler))
        return method(sampler, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return called
