"""Every fix torchrl_fixes ships, one module each, in the order they are applied."""
from __future__ import annotations

from torchrl_fixes.fixes.pinned_sample_output import PinnedSampleOutput

ALL_FIXES = (PinnedSampleOutput(),)

__all__ = ["ALL_FIXES", "PinnedSampleOutput"]
