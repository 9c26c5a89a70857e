"""A target's fingerprint must not depend on the Python that computes it.

Each fix stores the fingerprints of the stock functions it rewrites; a user on
another Python must get the same values, or every fix would be skipped there as
"target changed". Other interpreters found on this machine recompute them.
"""
from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchrl_fixes
from torchrl_fixes._core.source_fingerprint import source_fingerprint
from torchrl_fixes.fixes import ALL_FIXES

MODULE = Path(torchrl_fixes.__file__).parent / "_core" / "source_fingerprint.py"
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

# Loads the fingerprint module by path: the other interpreter has no torch.
CHILD = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("fp", {str(MODULE)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sources = json.load(sys.stdin)
print(json.dumps({{name: module.fingerprint_source(text) for name, text in sources.items()}}))
"""


def _stock_targets():
    """Every target every fix declares that the installed TorchRL has, by fix and path."""
    with torchrl_fixes.disabled():
        return {
            f"{fix.name} {target.path}": target.stock()
            for fix in ALL_FIXES
            for target in fix.implements
            if target.stock() is not None
        }


def _interpreter(version: str) -> list[str] | None:
    exe = shutil.which(f"python{version}")
    if exe is None:
        return None
    env = {**os.environ, "PYENV_VERSION": _pyenv_version(version) or ""}
    probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"], env=env, capture_output=True, text=True)
    return [exe] if probe.returncode == 0 else None


def _pyenv_version(version: str) -> str | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(p.name for p in root.glob(f"{version}.*")) if root.is_dir() else []
    return found[-1] if found else None


def test_installed_targets_are_declared_codes():
    """This Python computes, for each target of the installed TorchRL, a fingerprint its
    fix declares (Target.stock() would raise otherwise); the required ones are all here."""
    targets = _stock_targets()
    for fix in ALL_FIXES:
        for target in fix.implements:
            if not target.optional:
                assert f"{fix.name} {target.path}" in targets
    for name, func in targets.items():
        fix_name, path = name.split(" ")
        fix = next(f for f in ALL_FIXES if f.name == fix_name)
        assert source_fingerprint(func) in fix.target(path).seen, name


@pytest.mark.parametrize("version", PYTHONS)
def test_other_pythons_compute_the_same_fingerprints(version):
    """Python 3.10 to 3.13 give the same fingerprint for the same stock source."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        pytest.skip("this interpreter is the one running the tests")
    command = _interpreter(version)
    if command is None:
        pytest.skip(f"python{version} is not available here")
    targets = _stock_targets()
    sources = {name: inspect.getsource(func) for name, func in targets.items()}
    env = {**os.environ, "PYENV_VERSION": _pyenv_version(version) or ""}
    result = subprocess.run(
        [*command, "-c", CHILD], input=json.dumps(sources), env=env,
        capture_output=True, text=True, check=True,
    )
    theirs = json.loads(result.stdout)
    ours = {name: source_fingerprint(func) for name, func in targets.items()}
    assert theirs == ours
