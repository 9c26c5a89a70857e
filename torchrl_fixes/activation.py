"""The fixes of this process: their registry, and what ``TORCHRL_FIXES`` asks for.

``import torchrl_fixes`` binds its API to :data:`registry` and calls
:func:`activate_from_environment`; the tools (``diagnose``, the Ray hook of
``launcher``) reach the same registry here, without importing the package they are
part of.
"""
from __future__ import annotations

import os
import warnings

from torchrl_fixes._core.registry import Registry
from torchrl_fixes._core.warning_categories import TorchRLFixesWarning
from torchrl_fixes.fixes import ALL_FIXES

registry = Registry(ALL_FIXES)


def names_from_environment(value: str | None) -> tuple[str, ...] | None:
    """The fixes ``TORCHRL_FIXES`` asks for: None for none, () for all.

    Unknown names are left out with a warning that names the variable and the known
    fixes (the import never fails over it), and ``status()`` shows the problem.
    """
    if value is None:
        return ()
    value = value.strip()
    if value.lower() in ("0", "off", "false", "no", "none"):
        return None
    if value.lower() in ("", "1", "on", "true", "yes", "all"):
        return ()
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in registry.names]
    if not unknown:
        return names
    problem = (
        f"TORCHRL_FIXES={value!r} names unknown fix(es) {', '.join(map(repr, unknown))}; "
        f"known fixes: {', '.join(registry.names)} (or 0 / off for none)"
    )
    registry.notes.append(problem)
    # the line that imported torchrl_fixes: past this function, this module's body
    # and the package's
    warnings.warn(f"torchrl_fixes: {problem}", TorchRLFixesWarning, stacklevel=4)
    known = tuple(name for name in names if name not in unknown)
    return known or None


# What TORCHRL_FIXES asked for when this process first imported the package (None:
# nothing); read once, so a later change of the variable changes nothing.
REQUESTED = names_from_environment(os.environ.get("TORCHRL_FIXES"))


def activate_from_environment() -> list[str]:
    """Applies what ``TORCHRL_FIXES`` asked for at import (again: idempotent); returns the applied."""
    if REQUESTED is None:
        return registry.applied()
    return registry.activate(*REQUESTED)
