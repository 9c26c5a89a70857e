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

import os
import warnings

from torchrl_fixes.diagnose import diagnose
from torchrl_fixes.fixes import ALL_FIXES
from torchrl_fixes.launcher import ray_worker_setup
from torchrl_fixes.patching import get_original, is_object_patched
from torchrl_fixes.registry import FixStatus, Registry, StatusReport
from torchrl_fixes.warning_categories import (
    FixSkippedWarning,
    PinMemoryUnavailableWarning,
    TorchRLFixesWarning,
)

__version__ = "0.1.0"

_registry = Registry(ALL_FIXES)

activate = _registry.activate
deactivate = _registry.deactivate
disabled = _registry.disabled
status = _registry.status


def fix_names() -> tuple[str, ...]:
    """The names of every fix this package knows, in the order they are applied."""
    return _registry.names


def _names_from_environment(value: str | None) -> tuple[str, ...] | None:
    """The fixes ``TORCHRL_FIXES`` asks for: None for none, () for all.

    Unknown names are left out with a warning that names the variable and the known
    fixes (the import never fails over it), and :func:`status` shows the problem.
    """
    if value is None:
        return ()
    value = value.strip()
    if value.lower() in ("0", "off", "false", "no", "none"):
        return None
    if value.lower() in ("", "1", "on", "true", "yes", "all"):
        return ()
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in _registry.names]
    if not unknown:
        return names
    problem = (
        f"TORCHRL_FIXES={value!r} names unknown fix(es) {', '.join(map(repr, unknown))}; "
        f"known fixes: {', '.join(_registry.names)} (or 0 / off for none)"
    )
    _registry.notes.append(problem)
    warnings.warn(f"torchrl_fixes: {problem}", TorchRLFixesWarning, stacklevel=3)
    known = tuple(name for name in names if name not in unknown)
    return known or None


# What TORCHRL_FIXES asked for when this package was imported (None: nothing).
_REQUESTED = _names_from_environment(os.environ.get("TORCHRL_FIXES"))


def _activate_from_environment() -> list[str]:
    """Applies what ``TORCHRL_FIXES`` asked for at import (again: idempotent); returns the applied."""
    if _REQUESTED is None:
        return _registry.applied()
    return activate(*_REQUESTED)


_activate_from_environment()

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
