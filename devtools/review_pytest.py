"""pytest runs against a review tree, and what each test did, read from pytest's junit XML.

Each run imports TorchRL from the tree it is given (``PYTHONPATH=<tree>``) with
``TORCHRL_FIXES=0``, so nothing is patched at runtime; :func:`check_torchrl_resolves`
makes sure of it first. Reports are read with :mod:`devtools.compare_junit`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from devtools.compare_junit import Case, Report, read_report

# The start of pytest's message for a failed ``assert`` (rewritten or not), for
# ``pytest.fail`` and ``pytest.raises`` that saw nothing: a test that ran and found
# the behaviour wrong, where any other exception means it could not run its check.
ASSERTION_MESSAGES = ("assert", "AssertionError", "Failed:")
PYTEST_TIMEOUT_S = 1800


class PytestRunError(Exception):
    """A pytest run gave no report, or TorchRL did not come from the tree."""


@dataclass
class PytestRun:
    """One pytest run's outcomes.

    Attributes:
        report (Report): its test cases, by junit key.
        collection_errors (dict): test file -> why it could not be collected.
        files (list of str): the test files it ran, relative to the tree.
    """

    report: Report = field(default_factory=Report)
    collection_errors: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def cases_in(self, files) -> list[Case]:
        """The cases of the given test files (collection errors excluded)."""
        wanted = set(files)
        return [
            case
            for case in self.report.cases.values()
            if case_file(case) in wanted and case.message != "collection failure"
        ]


def case_file(case: Case) -> str:
    """The test file a case's pytest id names."""
    return case.test_id.split("::")[0]


def tree_env(tree: Path) -> dict[str, str]:
    """The environment a run against ``tree`` gets: TorchRL from the tree, no runtime fixes."""
    return {**os.environ, "PYTHONPATH": str(tree), "TORCHRL_FIXES": "0"}


def check_torchrl_resolves(tree: Path) -> None:
    """Raises :class:`PytestRunError` unless ``import torchrl`` finds the tree's copy."""
    result = subprocess.run(
        [sys.executable, "-c", "import torchrl; print(torchrl.__file__)"],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
    )
    if result.returncode:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise PytestRunError(f"import torchrl fails in {tree}: {last}")
    found = Path(result.stdout.strip().splitlines()[-1]).resolve()
    if not found.is_relative_to(Path(tree).resolve()):
        raise PytestRunError(f"import torchrl resolves to {found}, not into {tree}")


def run_pytest(tree: Path, files: list[str], junit: Path) -> PytestRun:
    """Runs pytest on ``files`` (relative to ``tree``) against ``tree``; its log sits beside ``junit``."""
    if not files:
        return PytestRun()
    check_torchrl_resolves(tree)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *files,
        f"--junitxml={junit}",
        f"--rootdir={tree}",
        "-p",
        "no:cacheprovider",
        # a test module of a new module fails to import before its PR: the others still run
        "--continue-on-collection-errors",
        # xunit1 names each case's file: the default's dotted class name cannot tell
        # a test/ folder from a test module
        "-o",
        "junit_family=xunit1",
    ]
    log = junit.with_suffix(".log")
    try:
        with open(log, "w") as out:
            subprocess.run(
                command,
                cwd=tree,
                env=tree_env(tree),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=PYTEST_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        raise PytestRunError(
            f"pytest on {' '.join(files)} ran past {PYTEST_TIMEOUT_S} s (log: {log})"
        ) from None
    if not junit.is_file():
        last = (log.read_text().strip().splitlines() or ["no output"])[-1]
        raise PytestRunError(f"pytest on {' '.join(files)} wrote no report: {last}")
    return PytestRun(read_report(junit), collection_errors(junit), list(files))


def collection_errors(junit: Path) -> dict[str, str]:
    """Test file -> the last line of the error that kept it from being collected."""
    errors = {}
    for testcase in ET.parse(junit).getroot().iter("testcase"):
        error = testcase.find("error")
        if error is not None and error.get("message") == "collection failure":
            lines = [line.strip() for line in (error.text or "").splitlines() if line.strip()]
            cause = lines[-1].removeprefix("E").strip() if lines else "collection failure"
            errors[testcase.get("file", "?")] = cause
    return errors


def failure_kind(case: Case) -> str:
    """``"assertion"`` for a test that ran its check and failed it, ``"error"`` for any other failure.

    Examples:
        >>> failure_kind(Case("k", "t.py::a", "failed", "assert 1 == 2"))
        'assertion'
        >>> failure_kind(Case("k", "t.py::a", "failed", "AttributeError: no _index"))
        'error'
    """
    if case.outcome == "failed" and case.message.startswith(ASSERTION_MESSAGES):
        return "assertion"
    return "error"


def outcome_on(case: Case, run: PytestRun) -> tuple[str, str]:
    """What the test of ``case`` did in ``run``: passed, skipped, assertion or error, and why."""
    other = run.report.cases.get(case.key)
    if other is None:
        file = case_file(case)
        return "error", run.collection_errors.get(file, "not collected")
    if other.outcome in ("passed", "skipped"):
        return other.outcome, other.message
    return failure_kind(other), other.message
