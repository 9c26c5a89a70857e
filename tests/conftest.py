"""Shared fixtures: throwaway modules to patch, and subprocesses running the package."""
from __future__ import annotations

import os
import subprocess
import sys
import types
import uuid
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def make_module(monkeypatch):
    """Factory of fresh modules registered in ``sys.modules`` for the duration of a test."""

    def make(**attributes):
        name = f"torchrl_fixes_test_{uuid.uuid4().hex}"
        module = types.ModuleType(name)
        for key, value in attributes.items():
            if isinstance(value, type):
                value.__module__ = name
            setattr(module, key, value)
        monkeypatch.setitem(sys.modules, name, module)
        return module

    return make


@pytest.fixture(scope="session")
def spawn_python():
    """Starts ``python <args>`` with the repository importable and ``TORCHRL_FIXES`` as given.

    ``torchrl_fixes_env=None`` removes the variable from the child's environment.
    Returns the running :class:`subprocess.Popen`, so several can run at once.
    """

    def spawn(*args: str, torchrl_fixes_env: str | None = None) -> subprocess.Popen:
        env = dict(os.environ)
        env.pop("TORCHRL_FIXES", None)
        if torchrl_fixes_env is not None:
            env["TORCHRL_FIXES"] = torchrl_fixes_env
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return spawn


def finish(process: subprocess.Popen, timeout: float = 120) -> subprocess.CompletedProcess:
    """Waits for a process started by ``spawn_python`` and returns its outcome."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{process.args} did not finish in {timeout} s:\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope="session")
def finish_process():
    """The :func:`finish` helper, as a fixture."""
    return finish


@pytest.fixture
def torch_threads_restored():
    """The measurement tools set one torch thread for their process: restored after a test runs one."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
