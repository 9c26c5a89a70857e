"""Settings every test run here shares: its skips, counted under one line per reason.

pytest's own summary (``-rs``) gives a line per skipping test file and line; a run on a
machine without a GPU or without TorchRL's C++ extension skips hundreds of tests for the
same two reasons, so the end of the run says each reason once, with its count. The
doctests whose examples build a prioritized sampler skip where the extension does not
load, as the tests that need it do.
"""
from __future__ import annotations

from collections import Counter

import pytest
from _pytest.doctest import DoctestItem


def pytest_collection_modifyitems(config, items):
    prioritized = [
        item
        for item in items
        if isinstance(item, DoctestItem)
        and any("Prioritized" in example.source for example in item.dtest.examples)
    ]
    if not prioritized:
        return
    # imported here: conformance.reference imports torchrl_fixes, which applies the fixes
    from conformance import reference

    if reference.extension_load_error() is not None and not reference.extension_required():
        for item in prioritized:
            item.add_marker(pytest.mark.skip(reason=reference.EXTENSION_SKIP_REASON))


def _skip_reason(report) -> str:
    # a skip's longrepr is (path, line, "Skipped: <reason>")
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    skipped = Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    if not skipped:
        return
    terminalreporter.section("skipped, by reason (pytest -rs lists each test)")
    for reason, count in skipped.most_common():
        terminalreporter.write_line(f"{count:5d}  {reason}")
