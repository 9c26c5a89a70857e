"""With the real TorchRL, removing the fixes leaves the replay-buffer modules exactly as stock."""
from __future__ import annotations

import sys

import pytest
import torchrl.data.replay_buffers as replay_buffers
from torchrl.data.replay_buffers import TensorDictReplayBuffer

import torchrl_fixes
from torchrl_fixes import get_original, is_object_patched

PREFIX = "torchrl.data.replay_buffers"


@pytest.fixture
def restore_activation():
    """Puts back whichever fixes were applied before the test."""
    before = [row.name for row in torchrl_fixes.status() if row.applied]
    yield
    torchrl_fixes.deactivate()
    if before:
        torchrl_fixes.activate(*before)
    assert [row.name for row in torchrl_fixes.status() if row.applied] == before


def _snapshot():
    """(owner, copy of its __dict__) for every replay-buffer module and class defined in one."""
    owners = []
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == PREFIX or name.startswith(PREFIX + ".")):
            continue
        owners.append(module)
        owners.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == name
        )
    return [(owner, dict(vars(owner))) for owner in owners]


def _differences(snapshot):
    """(owner, attribute) pairs whose current value is not the snapshot's object."""
    changed = []
    for owner, attributes in snapshot:
        current = vars(owner)
        for key in attributes.keys() | current.keys():
            if key not in current or key not in attributes or current[key] is not attributes[key]:
                changed.append((owner, key))
    return changed


def _name(owner, key):
    return f"{getattr(owner, '__qualname__', owner.__name__)}.{key}"


def test_deactivate_restores_every_replay_buffer_attribute(restore_activation):
    """Each activate/deactivate cycle leaves every module and class attribute identical."""
    torchrl_fixes.deactivate()
    stock_sample = vars(TensorDictReplayBuffer)["sample"]
    snapshot = _snapshot()
    owners = [owner for owner, _ in snapshot]
    assert TensorDictReplayBuffer in owners
    assert sys.modules[f"{PREFIX}.utils"] in owners
    assert _differences(snapshot) == []

    for _ in range(2):
        assert torchrl_fixes.activate() == list(torchrl_fixes.fix_names())
        changed = _differences(snapshot)
        assert (TensorDictReplayBuffer, "sample") in changed
        unrecorded = [_name(o, k) for o, k in changed if not is_object_patched(o, k)]
        assert unrecorded == []

        torchrl_fixes.deactivate()
        assert [_name(o, k) for o, k in _differences(snapshot)] == []
        assert vars(TensorDictReplayBuffer)["sample"] is stock_sample


def test_patched_sample_reports_its_original(restore_activation):
    """While active, TensorDictReplayBuffer.sample is patched and its original is the stock one."""
    torchrl_fixes.deactivate()
    stock_sample = vars(TensorDictReplayBuffer)["sample"]
    assert not is_object_patched(TensorDictReplayBuffer, "sample")
    assert get_original(TensorDictReplayBuffer, "sample") is stock_sample

    torchrl_fixes.activate()
    assert vars(TensorDictReplayBuffer)["sample"] is not stock_sample
    for owner in (
        TensorDictReplayBuffer,
        f"{replay_buffers.__name__}.TensorDictReplayBuffer",
        "torchrl.data.TensorDictReplayBuffer",
    ):
        assert is_object_patched(owner, "sample") is True
        assert get_original(owner, "sample") is stock_sample

    torchrl_fixes.deactivate()
    assert is_object_patched(TensorDictReplayBuffer, "sample") is False
    assert vars(TensorDictReplayBuffer)["sample"] is stock_sample
