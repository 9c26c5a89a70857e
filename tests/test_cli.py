"""``python -m torchrl_fixes``: the status table, its own options, and where the tooling went."""
from __future__ import annotations

import importlib.metadata

import pytest
from packaging.version import Version

import torchrl_fixes
from torchrl_fixes import __main__ as cli
from torchrl_fixes.fixes import ALL_FIXES


@pytest.fixture(scope="module")
def runs(spawn_python, finish_process):
    """The commands below, run in parallel subprocesses."""
    started = {
        "default": spawn_python("-m", "torchrl_fixes"),
        "status": spawn_python("-m", "torchrl_fixes", "status"),
        "status --targets": spawn_python("-m", "torchrl_fixes", "status", "--targets"),
        "bogus": spawn_python("-m", "torchrl_fixes", "bogus"),
        "status --full": spawn_python("-m", "torchrl_fixes", "status", "--full"),
        "bench --full": spawn_python("-m", "torchrl_fixes", "bench", "--full"),
        "bogus env": spawn_python("-m", "torchrl_fixes", torchrl_fixes_env="bogus"),
    }
    return {case: finish_process(process) for case, process in started.items()}


@pytest.mark.parametrize("case", ["default", "status"])
def test_status_table(runs, case):
    """The table names every fix as applied, under the TorchRL and tensordict versions."""
    run = runs[case]
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    torchrl = Version(importlib.metadata.version("torchrl"))
    tensordict = Version(importlib.metadata.version("tensordict"))
    assert lines[0] == f"torchrl {torchrl}, tensordict {tensordict}"
    for name in torchrl_fixes.fix_names():
        rows = [line.split() for line in lines if line.split()[:1] == [name]]
        assert len(rows) == 1, run.stdout
        assert rows[0][1] == "applied"


def test_status_targets_say_which_known_code_is_installed(runs):
    """``status --targets`` adds one row per declared target, ending with the releases
    whose code this install has (every target of an applied fix is a known code)."""
    run = runs["status --targets"]
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| `")]
    targets = [(fix, target) for fix in ALL_FIXES for target in fix.implements]
    assert len(rows) == len(targets)
    for row, (fix, target) in zip(rows, targets):
        assert row.startswith(f"| `{fix.name}` | `{target.path}`")
        found = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert found == "missing" and target.optional or found.removeprefix("as in ") in (
            target.seen.values()
        ), row


@pytest.mark.parametrize("case, bad", [("bogus", "bogus"), ("status --full", "--full")])
def test_unknown_commands_and_options_are_rejected(runs, case, bad):
    """An unknown command, or an option the command does not take, is a usage error."""
    run = runs[case]
    assert run.returncode == 2
    assert run.stdout == ""
    assert bad in run.stderr
    assert "usage: python -m torchrl_fixes" in run.stderr
    assert "Traceback" not in run.stderr


def test_moved_command_says_where_it_went_in_one_line(runs):
    run = runs["bench --full"]
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "python -m torchrl_fixes bench: bench (time stock against patched TorchRL) is "
        "development tooling: run `python -m devtools bench` in a clone of the repository"
    ]


def test_bogus_environment_variable_is_named_without_a_traceback(runs):
    run = runs["bogus env"]
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    for text in (run.stderr, run.stdout):
        assert "TORCHRL_FIXES='bogus'" in text
        assert all(name in text for name in torchrl_fixes.fix_names())


@pytest.mark.parametrize("command", sorted(cli.DEVTOOLS))
def test_every_moved_command_exits_2(command, capsys):
    assert cli.main([command, "--anything"]) == 2
    err = capsys.readouterr().err
    assert f"`python -m devtools {command}`" in err and len(err.splitlines()) == 1


def test_the_console_script_names_itself(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["/venv/bin/torchrl-fixes", "--help"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: torchrl-fixes ")
    monkeypatch.setattr("sys.argv", ["/repo/torchrl_fixes/__main__.py"])
    assert cli._prog() == "python -m torchrl_fixes"
