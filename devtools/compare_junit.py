"""Compares two pytest ``--junitxml`` reports: which tests pass in the first but not the second.

Used for the TorchRL test-suite oracle (see ``devtools/torchrl_suite.py``): the first
report is a run on stock TorchRL, the second the same tests with ``torchrl_fixes``
applied. The script prints the passed / failed / error / skipped counts of each report
and every test that passes in the first but fails, errors, is skipped or is missing in
the second, with the first line of its failure message; it exits with status 1 when
there is any such test, 0 otherwise. Standard library only.

Usage::

    python devtools/compare_junit.py stock.xml patched.xml

Examples:
    >>> import io
    >>> stock = io.StringIO('<testsuite><testcase classname="rb.test_a" name="test_x"/></testsuite>')
    >>> patched = io.StringIO(
    ...     '<testsuite><testcase classname="rb.test_a" name="test_x">'
    ...     '<failure message="AssertionError: boom"/></testcase></testsuite>'
    ... )
    >>> lost = lost_tests(read_report(stock), read_report(patched))
    >>> [(case.test_id, case.outcome) for case in lost]
    [('rb/test_a.py::test_x', 'failed')]
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass
class Case:
    """One ``<testcase>``: its pytest-style id, outcome and first message line."""

    key: str
    test_id: str
    outcome: str
    message: str = ""


@dataclass
class Report:
    """The test cases of one junit XML file, by key, and its suite properties."""

    cases: dict[str, Case] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)

    def counts(self) -> Counter:
        counts = Counter({outcome: 0 for outcome in OUTCOMES})
        counts.update(case.outcome for case in self.cases.values())
        return counts


def _test_id(classname: str, name: str, file: str | None) -> str:
    """A pytest node id from junit's ``classname`` and ``name`` (and ``file`` if given).

    Without ``file`` (pytest's default ``xunit2`` family), the module is the dotted
    prefix of ``classname`` up to the first part that starts with ``test``.
    """
    parts = classname.split(".") if classname else []
    if file:
        module = file[: -len(".py")] if file.endswith(".py") else file
        module_parts = module.replace("\\", "/").split("/")
        classes = parts[len(module_parts):]
        path = file
    else:
        split = next((i for i, part in enumerate(parts) if part.startswith("test")), len(parts) - 1)
        path = "/".join(parts[: split + 1]) + ".py" if parts else "?"
        classes = parts[split + 1:]
    return "::".join([path, *classes, name])


def _outcome(testcase: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error", "skipped"):
        child = testcase.find(tag)
        if child is not None:
            message = child.get("message") or (child.text or "").strip()
            outcome = "failed" if tag == "failure" else tag
            return outcome, (message.splitlines() or [""])[0]
    return "passed", ""


def read_report(source) -> Report:
    """Reads a junit XML file (a path or a file object)."""
    root = ET.parse(source).getroot()
    report = Report()
    for prop in root.iter("property"):
        report.properties[prop.get("name", "")] = prop.get("value", "")
    for testcase in root.iter("testcase"):
        classname, name = testcase.get("classname", ""), testcase.get("name", "")
        key = f"{classname}::{name}"
        outcome, message = _outcome(testcase)
        if key in report.cases:
            # the same id twice (e.g. a rerun plugin's reports): the worse outcome counts
            first = report.cases[key]
            if first.outcome == "passed" or outcome in ("failed", "error"):
                first.outcome, first.message = outcome, message
            continue
        test_id = _test_id(classname, name, testcase.get("file"))
        report.cases[key] = Case(key, test_id, outcome, message)
    return report


def lost_tests(stock: Report, patched: Report) -> list[Case]:
    """Tests that pass in ``stock`` and do not pass (or are missing) in ``patched``.

    Each is returned as its case in ``patched``; a missing one has outcome ``missing``.
    """
    lost = []
    for key, case in stock.cases.items():
        if case.outcome != "passed":
            continue
        other = patched.cases.get(key) or Case(key, case.test_id, "missing")
        if other.outcome != "passed":
            lost.append(other)
    return lost


def _format_counts(label: str, report: Report) -> str:
    counts = report.counts()
    parts = " ".join(f"{outcome} {counts[outcome]}" for outcome in OUTCOMES)
    return f"{label}: {parts} (total {len(report.cases)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stock", help="junit XML of the stock run")
    parser.add_argument("patched", help="junit XML of the run with the fixes")
    args = parser.parse_args(argv)
    stock, patched = read_report(args.stock), read_report(args.patched)
    print(_format_counts(f"stock   {args.stock}", stock))
    print(_format_counts(f"patched {args.patched}", patched))
    for label, report in (("stock", stock), ("patched", patched)):
        if "torchrl_fixes" in report.properties:
            print(f"{label} run: {report.properties['torchrl_fixes']}")
    if "torchrl_fixes" not in patched.properties:
        print("note: the patched report does not carry the devtools.torchrl_suite property")
    lost = lost_tests(stock, patched)
    gained = [
        case for key, case in patched.cases.items()
        if case.outcome == "passed" and key in stock.cases and stock.cases[key].outcome != "passed"
    ]
    print(f"pass on stock, not on patched: {len(lost)}")
    for case in lost:
        print(f"  {case.test_id}  [{case.outcome}] {case.message}".rstrip())
    print(f"pass on patched, not on stock: {len(gained)}")
    for case in gained:
        print(f"  {case.test_id}  [was {stock.cases[case.key].outcome}]")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
