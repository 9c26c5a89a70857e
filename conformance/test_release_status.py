"""Which fixes apply on which TorchRL release, and why the others are skipped.

The nox ``conformance`` session runs this file under every supported release, so
the expectations below are checked against each real install.
"""
from __future__ import annotations

import warnings

import pytest
from packaging.version import Version

import torchrl_fixes
from conformance import reference
from torchrl_fixes._core import registry as registry_module
from torchrl_fixes._core.registry import Registry
from torchrl_fixes._core.versions import installed_version
from torchrl_fixes.fixes import ALL_FIXES

# Release -> the fixes that must be applied there; "nightly" stands for the pinned
# torchrl-nightly build (noxfile.py names it). The fingerprints of the code each
# fix finds decide, not the version: every release the matrix runs is listed.
EXPECTED_APPLIED = {
    "nightly": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.8.1": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.9.2": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.10.1": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.11.1": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.12.0": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.13.3": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
    "0.14.1": {"pinned_sample_output", "slice_boundary_index", "single_gather"},
}


@reference.runtime_only
def test_installed_release_applies_the_expected_fixes():
    """On the installed release, exactly the expected fixes are applied; the rest say why not."""
    version = installed_version("torchrl")
    report = torchrl_fixes.status()
    expected = EXPECTED_APPLIED.get(_release_key(version), set())
    assert {row.name for row in report if row.applied} == expected
    for row in report:
        if not row.applied:
            assert row.state == "skipped" and row.reason, row


def _release_key(version: Version) -> str:
    # torchrl-nightly numbers its builds by date (2026.10.27)
    return "nightly" if version.major >= 2000 else str(version)


def test_declared_ranges_match_the_release_table():
    """Each fix's declared range admits exactly the releases the table applies it on."""
    for fix in ALL_FIXES:
        admitted = {
            v
            for v in EXPECTED_APPLIED
            if v == "nightly" or fix.torchrl_versions.contains(Version(v))
        }
        listed = {v for v, names in EXPECTED_APPLIED.items() if fix.name in names}
        assert admitted == listed, fix.name


@pytest.mark.skipif(not reference.UPSTREAM, reason="only on a TorchRL source with patches/ applied")
def test_runtime_fixes_skip_a_source_that_holds_them():
    """On TorchRL with the patches applied, every runtime fix sees its target changed and skips."""
    registry = Registry(ALL_FIXES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            applied = registry.activate()
        finally:
            registry.deactivate()
    assert applied == []
    for row in registry.status():
        assert row.state == "skipped" and row.reason.startswith("target changed:"), row
    assert sum(issubclass(w.category, torchrl_fixes.FixSkippedWarning) for w in caught) == len(ALL_FIXES)


@reference.runtime_only
@pytest.mark.parametrize("release", ["0.5.0", None, "0.15.0", "1.0.0", "2026.12.1"])
def test_any_release_with_the_same_code_applies(monkeypatch, release):
    """No version gate: an older or later release, a date-versioned nightly, or one whose
    version cannot be told (None) gets the same fixes as this one when its targets are
    the same code; the fingerprints decide."""
    expected = [row.name for row in torchrl_fixes.status() if row.applied]
    torchrl_fixes.deactivate()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(
                registry_module,
                "installed_version",
                lambda name: None if release is None else Version(release),
            )
            registry = Registry(ALL_FIXES)
            try:
                assert registry.activate() == expected
            finally:
                registry.deactivate()
    finally:
        torchrl_fixes.activate(*expected)


@reference.runtime_only
def test_changed_target_is_skipped_not_half_applied(monkeypatch):
    """A target whose code is not what the fix replaces: skipped, and nothing of it installed."""
    from torchrl.data import ReplayBuffer, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import utils

    def sample(self, batch_size=None, return_info=False, include_info=None):
        return "an upstream rewrite"

    with torchrl_fixes.disabled(), monkeypatch.context() as patch:
        before = {
            "utils.pin_memory_output": utils.pin_memory_output,
            "ReplayBuffer._sample": ReplayBuffer._sample,
            "ReplayBuffer.__getitem__": ReplayBuffer.__getitem__,
        }
        patch.setattr(TensorDictReplayBuffer, "sample", sample)
        registry = Registry(ALL_FIXES)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            registry.activate("pinned_sample_output")
        row = registry.status()["pinned_sample_output"]
        assert row.state == "skipped"
        assert row.reason.startswith("target changed: TensorDictReplayBuffer.sample")
        assert any(issubclass(w.category, torchrl_fixes.FixSkippedWarning) for w in caught)
        after = {
            "utils.pin_memory_output": utils.pin_memory_output,
            "ReplayBuffer._sample": ReplayBuffer._sample,
            "ReplayBuffer.__getitem__": ReplayBuffer.__getitem__,
        }
        assert all(after[k] is before[k] for k in before)
        assert TensorDictReplayBuffer.sample is sample
