"""Every fix torchrl_fixes ships, in the order they are applied.

A fix is a module, or a package where it has modules of its own
(``slice_boundary_index/``). Each uses the framework of :mod:`torchrl_fixes._core`
and declares its targets in ``implements``; nothing here imports the tools.
"""
from __future__ import annotations

from torchrl_fixes.fixes.pinned_sample_output import PinnedSampleOutput
from torchrl_fixes.fixes.single_gather import SingleGather
from torchrl_fixes.fixes.slice_boundary_index import SliceBoundaryIndex

ALL_FIXES = (PinnedSampleOutput(), SliceBoundaryIndex(), SingleGather())

__all__ = ["ALL_FIXES", "PinnedSampleOutput", "SingleGather", "SliceBoundaryIndex"]
