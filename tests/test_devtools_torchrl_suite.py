"""``-p devtools.torchrl_suite`` applies the fixes before any test module imports TorchRL."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

import torchrl_fixes
from devtools.torchrl_suite import HEADER_PREFIX

# A test module that records, before it imports TorchRL, whether the fixes were imported.
PROBE = '''
import sys

FIXES_FIRST = "torchrl_fixes" in sys.modules and "torchrl" in sys.modules

import torchrl  # noqa: E402
from torchrl.data import SliceSampler  # noqa: E402


def test_fixes_imported_first():
    assert FIXES_FIRST


def test_a_fix_is_applied():
    import torchrl_fixes

    assert any(row.applied for row in torchrl_fixes.status())
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory, spawn_python, finish_process):
    """The probe run with the plugin (verbose and quiet), without it, and with no fix."""
    folder = tmp_path_factory.mktemp("suite")
    (folder / "test_probe.py").write_text(PROBE)
    (folder / "pytest.ini").write_text("[pytest]\n")
    base = ("-m", "pytest", "-p", "no:cacheprovider", "-c", str(folder / "pytest.ini"),
            "--rootdir", str(folder), str(folder / "test_probe.py"))
    xml = folder / "patched.xml"
    started = {
        "plugin": spawn_python(*base, "-p", "devtools.torchrl_suite"),
        "quiet": spawn_python(*base, "-q", "-p", "devtools.torchrl_suite", f"--junitxml={xml}"),
        "stock": spawn_python(*base),
        "no_fix": spawn_python(*base, "-p", "devtools.torchrl_suite", torchrl_fixes_env="0"),
    }
    outcome = {case: finish_process(process, timeout=300) for case, process in started.items()}
    outcome["xml"] = ET.parse(xml).getroot()
    return outcome


def _status_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(HEADER_PREFIX)]


def test_header_names_the_applied_fixes(runs):
    run = runs["plugin"]
    assert run.returncode == 0, run.stdout + run.stderr
    (line,) = _status_lines(run.stdout)
    applied = [row.name for row in torchrl_fixes.status() if row.applied]
    assert applied, "no fix applies to the installed TorchRL: the plugin cannot be tested"
    assert f"applied {len(applied)}/{len(torchrl_fixes.fix_names())} [{', '.join(applied)}]" in line
    assert "torchrl imported before the fixes: no" in line
    # the line comes in the header, before the first test runs
    assert run.stdout.index(line) < run.stdout.index("test_probe.py")


def test_quiet_run_prints_and_records_the_status(runs):
    run = runs["quiet"]
    assert run.returncode == 0, run.stdout + run.stderr
    (line,) = _status_lines(run.stdout)
    recorded = {p.get("name"): p.get("value") for p in runs["xml"].iter("property")}
    assert recorded["torchrl_fixes"] == line


def test_probe_fails_without_the_plugin(runs):
    """Without the plugin the probe module sees stock TorchRL, and says so."""
    run = runs["stock"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout
    assert "assert False" in run.stdout
    assert not _status_lines(run.stdout)


def test_no_applied_fix_is_a_usage_error(runs):
    run = runs["no_fix"]
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "no torchrl_fixes fix is applied" in run.stderr
