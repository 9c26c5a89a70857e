"""TORCHRL_FIXES decides what ``import torchrl_fixes`` applies, in a fresh interpreter."""
from __future__ import annotations

import json

import pytest

import torchrl_fixes

REPORT = (
    "import dataclasses, json, torchrl_fixes; "
    "print(json.dumps({"
    "'names': list(torchrl_fixes.fix_names()), "
    "'rows': [dataclasses.asdict(row) for row in torchrl_fixes.status()], "
    "'sample_patched': torchrl_fixes.is_object_patched("
    "'torchrl.data.replay_buffers.TensorDictReplayBuffer', 'sample')}))"
)

KNOWN = torchrl_fixes.fix_names()
CASES = {
    "unset": None,
    "zero": "0",
    "off": "off",
    **{f"only:{name}": name for name in KNOWN},
    "unknown": "no_such_fix",
}


@pytest.fixture(scope="module")
def runs(spawn_python, finish_process):
    """Every case, run in parallel subprocesses."""
    started = {
        case: spawn_python("-c", REPORT, torchrl_fixes_env=value) for case, value in CASES.items()
    }
    return {case: finish_process(process) for case, process in started.items()}


def _report(run):
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_unset_applies_every_fix(runs):
    """Without TORCHRL_FIXES every fix is applied."""
    report = _report(runs["unset"])
    assert report["names"] == list(KNOWN)
    assert [row["name"] for row in report["rows"]] == list(KNOWN)
    assert {row["state"] for row in report["rows"]} == {"applied"}
    assert all(row["reason"] == "" for row in report["rows"])
    assert report["sample_patched"] is True


@pytest.mark.parametrize("case", ["zero", "off"])
def test_off_applies_nothing(runs, case):
    """TORCHRL_FIXES=0 or off imports without applying any fix."""
    report = _report(runs[case])
    assert [row["name"] for row in report["rows"]] == list(KNOWN)
    assert {row["state"] for row in report["rows"]} == {"inactive"}
    assert report["sample_patched"] is False


@pytest.mark.parametrize("name", KNOWN)
def test_named_fix_only(runs, name):
    """TORCHRL_FIXES=<name> applies that fix and no other."""
    report = _report(runs[f"only:{name}"])
    states = {row["name"]: row["state"] for row in report["rows"]}
    assert states[name] == "applied"
    assert {other: state for other, state in states.items() if other != name} == {
        other: "inactive" for other in KNOWN if other != name
    }


def test_unknown_name_warns_naming_the_variable_and_applies_nothing(runs):
    """An unknown name: the import succeeds, one warning names the variable, the unknown
    name and every known fix, nothing is applied, and status() shows the same problem."""
    run = runs["unknown"]
    report = _report(run)
    assert {row["state"] for row in report["rows"]} == {"inactive"}
    warnings = [line for line in run.stderr.splitlines() if "TorchRLFixesWarning" in line]
    assert len(warnings) == 1, run.stderr
    assert "Traceback" not in run.stderr
    for needle in ("TORCHRL_FIXES", "no_such_fix", *KNOWN):
        assert needle in warnings[0]


def test_status_command_shows_an_unknown_name(spawn_python, finish_process):
    """python -m torchrl_fixes with a bad TORCHRL_FIXES prints the table and the problem."""
    run = finish_process(spawn_python("-m", "torchrl_fixes", torchrl_fixes_env="no_such_fix"))
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    note = [line for line in run.stdout.splitlines() if line.startswith("note: TORCHRL_FIXES=")]
    assert len(note) == 1 and "no_such_fix" in note[0]
