"""``python -m torchrl_fixes`` prints the status table."""
from __future__ import annotations

import importlib.metadata

import pytest
from packaging.version import Version

import torchrl_fixes


@pytest.fixture(scope="module")
def runs(spawn_python, finish_process):
    """The default command and a bogus one, run in parallel subprocesses."""
    started = {
        "default": spawn_python("-m", "torchrl_fixes"),
        "bogus": spawn_python("-m", "torchrl_fixes", "bogus"),
    }
    return {case: finish_process(process) for case, process in started.items()}


def test_status_table(runs):
    """The table names every fix as applied, under the TorchRL and tensordict versions."""
    run = runs["default"]
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    torchrl = Version(importlib.metadata.version("torchrl"))
    tensordict = Version(importlib.metadata.version("tensordict"))
    assert lines[0] == f"torchrl {torchrl}, tensordict {tensordict}"
    for name in torchrl_fixes.fix_names():
        rows = [line.split() for line in lines if line.split()[:1] == [name]]
        assert len(rows) == 1, run.stdout
        assert rows[0][1] == "applied"


def test_bogus_command_is_rejected(runs):
    """An unknown command is an argparse usage error."""
    run = runs["bogus"]
    assert run.returncode == 2
    assert run.stdout == ""
    assert "bogus" in run.stderr
    assert "usage:" in run.stderr
