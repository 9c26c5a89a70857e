"""Applies torchrl_fixes in every Python process started under ``torchrl-fixes run``.

``torchrl-fixes run`` puts this file's folder first on ``PYTHONPATH``. Python imports
the first ``sitecustomize`` on its path when it starts, so every interpreter started
from the launched program (spawn and forkserver workers, collector workers, the workers
of a local Ray cluster) runs this module, as the launched program does.

It does not import ``torchrl_fixes`` here: that imports torch and TorchRL, seconds
in a process that may never use them (pip, Ray's own helpers, a data loader's
workers). It adds an import hook instead, which imports ``torchrl_fixes`` the moment
the process has imported ``torchrl``; importing ``torchrl_fixes`` applies the fixes
``TORCHRL_FIXES`` asks for (all by default, none for ``0``), as in any program.

Then it runs the ``sitecustomize`` this one hides, if the environment has one (a
later ``PYTHONPATH`` entry, the virtual environment, the system's Python), as Python
would have. An error of this module's own is a warning, never a failed start; an
error in the other ``sitecustomize`` is reported by Python as it would be without
the launcher.

Nothing in this folder is part of the ``torchrl_fixes`` package: it is imported as
the top-level module ``sitecustomize`` and uses only the standard library.
"""
import os
import sys
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))


def _is_launcher_folder(entry):
    """Whether a ``sys.path`` entry is this folder, or the same folder of another copy."""
    path = os.path.abspath(entry or os.curdir)
    return path == _HERE or path.endswith(os.path.join("torchrl_fixes", "_site"))


def _apply_fixes():
    try:
        import torchrl_fixes  # noqa: F401  (applies the fixes TORCHRL_FIXES asks for)
    except Exception as err:
        # RuntimeWarning: torchrl_fixes' own warning categories may be what failed to import.
        warnings.warn(
            f"torchrl_fixes could not be applied in this process ({sys.executable}): "
            f"{type(err).__name__}: {err}",
            RuntimeWarning,
            stacklevel=2,
        )


class _LoadThenApply:
    """``torchrl``'s own loader, followed by the fixes once ``torchrl`` has loaded."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # torchrl sees its own loader while it loads, and keeps it afterwards.
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _apply_fixes()

    def __getattr__(self, name):
        return getattr(self.loader, name)


class TorchRLImportHook:
    """A ``sys.meta_path`` finder that hands ``torchrl`` to :class:`_LoadThenApply`.

    It finds nothing itself: it asks the finders after it for ``torchrl`` and wraps
    the loader they return. It removes itself at the first ``import torchrl``.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchrl":
            return None
        uninstall()
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _LoadThenApply(spec.loader)
        return spec


def install():
    """Adds the hook (once), or applies the fixes now if ``torchrl`` is already imported."""
    if "torchrl" in sys.modules:
        _apply_fixes()
    elif not any(isinstance(finder, TorchRLImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchRLImportHook())


def uninstall():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchRLImportHook)]


def _hidden_sitecustomize():
    """The spec of the ``sitecustomize`` that Python would have imported without this one."""
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(
        "sitecustomize", [entry for entry in sys.path if not _is_launcher_folder(entry)]
    )


def _run_hidden_sitecustomize():
    import importlib.util

    try:
        spec = _hidden_sitecustomize()
    except Exception as err:
        warnings.warn(
            f"torchrl_fixes: could not look for another sitecustomize: {type(err).__name__}: {err}",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    if spec is None:
        return
    # The other module takes the name: `import sitecustomize` gives what it gave before.
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors reach site.py, which reports them as usual


try:
    install()
except Exception as _err:
    warnings.warn(
        f"torchrl_fixes: the import hook was not installed: {type(_err).__name__}: {_err}",
        RuntimeWarning,
        stacklevel=2,
    )
_run_hidden_sitecustomize()
