"""Warning categories of torchrl_fixes, so users can filter them by class."""
from __future__ import annotations

import sys
import warnings


class TorchRLFixesWarning(UserWarning):
    """Base class of every warning torchrl_fixes issues."""


class FixSkippedWarning(TorchRLFixesWarning):
    """A fix was not applied: TorchRL version outside its range, or a changed target."""


class PinMemoryUnavailableWarning(TorchRLFixesWarning):
    """``pin_memory=True`` was asked for, but there is no accelerator to pin for."""


def _package_dirs() -> tuple[str, ...]:
    import contextlib
    import os

    # this package: the folder above _core/
    package = os.path.dirname(os.path.dirname(__file__))
    dirs = [package, os.path.dirname(contextlib.__file__) + os.sep + "contextlib.py"]
    for name in ("torchrl", "tensordict"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(module.__file__))
    # code the fixes compile from TorchRL's source (patching.derive_from_source) has a
    # "<torchrl_fixes ...>" file name
    return (*(d if d.endswith(".py") else os.path.join(d, "") for d in dirs), "<torchrl_fixes")


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warns with the location of the first caller outside torchrl, tensordict and this package.

    The warning then names the line of the user's program that sampled, however many
    library frames lie in between. When no such frame exists (a prefetch worker
    thread), the warning names the innermost library frame.
    """
    internal = _package_dirs()
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
