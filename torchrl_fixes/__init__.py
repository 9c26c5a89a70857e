"""Fixes for TorchRL's replay buffers, applied on import.

``import torchrl_fixes`` applies every fix whose targets in the installed TorchRL are
code it knows (by fingerprint, whatever the version).
The environment variable ``TORCHRL_FIXES`` changes that: ``0`` or ``off`` imports
without applying anything, ``name,name`` applies only the fixes named.

Examples:
    >>> import torchrl_fixes
    >>> print(torchrl_fixes.status())  # doctest: +SKIP
    torchrl 0.14.1, tensordict 0.14.3
    fix                   state    torchrl  why
    pinned_sample_output  applied  >=0.8    -
    >>> with torchrl_fixes.disabled():
    ...     pass  # stock TorchRL here
"""
from __future__ import annotations

from torchrl_fixes._core.patching import get_original, is_object_patched
from torchrl_fixes._core.registry import FixStatus, StatusReport
from torchrl_fixes._core.warning_categories import (
    FixSkippedWarning,
    PinMemoryUnavailableWarning,
    TorchRLFixesWarning,
)
from torchrl_fixes.activation import activate_from_environment, registry
from torchrl_fixes.diagnose import diagnose
from torchrl_fixes.launcher import ray_worker_setup

__version__ = "0.1.0"

activate = registry.activate
deactivate = registry.deactivate
disabled = registry.disabled
status = registry.status


def fix_names() -> tuple[str, ...]:
    """The names of every fix this package knows, in the order they are applied."""
    return registry.names


activate_from_environment()

__all__ = [
    "FixSkippedWarning",
    "FixStatus",
    "PinMemoryUnavailableWarning",
    "StatusReport",
    "TorchRLFixesWarning",
    "activate",
    "deactivate",
    "diagnose",
    "disabled",
    "fix_names",
    "get_original",
    "is_object_patched",
    "ray_worker_setup",
    "status",
]
