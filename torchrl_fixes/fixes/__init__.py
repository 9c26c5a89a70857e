"""Every fix torchrl_fixes ships, one module each, in the order they are applied."""
from __future__ import annotations

from torchrl_fixes.fixes.pinned_sample_output import PinnedSampleOutput
from torchrl_fixes.fixes.single_gather import SingleGather
from torchrl_fixes.fixes.slice_boundary_index import SliceBoundaryIndex

ALL_FIXES = (PinnedSampleOutput(), SliceBoundaryIndex(), SingleGather())

__all__ = ["ALL_FIXES", "PinnedSampleOutput", "SingleGather", "SliceBoundaryIndex"]
