"""The versions of TorchRL and tensordict this process runs with."""
from __future__ import annotations

import importlib.metadata

from packaging.version import InvalidVersion, Version

# Some builds report a placeholder instead of their release (torchrl 0.10.1 wheels).
_PLACEHOLDERS = {"0.0.0+unknown", "0.0.0", "unknown", ""}


def installed_version(package: str) -> Version | None:
    """The release of ``package`` that is importable, or ``None`` if it cannot be told.

    The distribution metadata is read first; the module's ``__version__`` is the
    fallback. A placeholder such as ``0.0.0+unknown`` counts as unknown, so a fix
    is never enabled on a version it has not been checked against.

    Args:
        package (str): the distribution and module name (``"torchrl"``).

    Examples:
        >>> from torchrl_fixes._core.versions import installed_version
        >>> installed_version("torchrl") >= Version("0.11")
        True
    """
    candidates = []
    try:
        candidates.append(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        module = __import__(package)
        candidates.append(str(getattr(module, "__version__", "")))
    except ImportError:
        pass
    for text in candidates:
        if text.strip() in _PLACEHOLDERS:
            continue
        try:
            return Version(text)
        except InvalidVersion:
            continue
    return None
