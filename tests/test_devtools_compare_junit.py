"""``devtools/compare_junit.py`` finds the tests that pass on stock and not with the fixes."""
from __future__ import annotations

import pytest

from devtools.compare_junit import lost_tests, main, read_report

STOCK = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="rb.test_storages.TestStorages" name="test_set[True]" />
<testcase classname="rb.test_storages.TestStorages" name="test_get" />
<testcase classname="rb.test_samplers" name="test_slice"><failure message="AssertionError: stock" /></testcase>
<testcase classname="rb.test_samplers" name="test_gpu"><skipped message="no cuda" /></testcase>
<testcase classname="rb.test_rb_core.TestBuffer" name="test_dump"><error message="fixture failed" /></testcase>
<testcase classname="rb.test_rb_core.TestBuffer" name="test_gone" />
<testcase classname="rb.test_rb_core.TestBuffer" name="test_skipped_later" />
</testsuite></testsuites>
"""

PATCHED = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<properties><property name="torchrl_fixes" value="torchrl_fixes oracle: applied 3/3" /></properties>
<testcase classname="rb.test_storages.TestStorages" name="test_set[True]">
<failure message="RuntimeError: lock under compile&#10;second line">trace</failure></testcase>
<testcase classname="rb.test_storages.TestStorages" name="test_get" />
<testcase classname="rb.test_samplers" name="test_slice" />
<testcase classname="rb.test_samplers" name="test_gpu"><skipped message="no cuda" /></testcase>
<testcase classname="rb.test_rb_core.TestBuffer" name="test_dump"><error message="fixture failed" /></testcase>
<testcase classname="rb.test_rb_core.TestBuffer" name="test_skipped_later"><skipped message="x" /></testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def reports(tmp_path):
    (tmp_path / "stock.xml").write_text(STOCK)
    (tmp_path / "patched.xml").write_text(PATCHED)
    return tmp_path / "stock.xml", tmp_path / "patched.xml"


def test_counts(reports):
    stock, patched = (read_report(path) for path in reports)
    assert dict(stock.counts()) == {"passed": 4, "failed": 1, "error": 1, "skipped": 1}
    assert dict(patched.counts()) == {"passed": 2, "failed": 1, "error": 1, "skipped": 2}
    assert patched.properties == {"torchrl_fixes": "torchrl_fixes oracle: applied 3/3"}


def test_lost_tests(reports):
    stock, patched = (read_report(path) for path in reports)
    lost = [(case.test_id, case.outcome, case.message) for case in lost_tests(stock, patched)]
    assert lost == [
        ("rb/test_storages.py::TestStorages::test_set[True]", "failed", "RuntimeError: lock under compile"),
        ("rb/test_rb_core.py::TestBuffer::test_gone", "missing", ""),
        ("rb/test_rb_core.py::TestBuffer::test_skipped_later", "skipped", "x"),
    ]


def test_same_report_loses_nothing(reports):
    stock, _ = reports
    assert lost_tests(read_report(stock), read_report(stock)) == []
    assert main([str(stock), str(stock)]) == 0


def test_file_attribute_gives_the_path(tmp_path):
    """The ``xunit1`` family names the file; nested classes follow the module."""
    path = tmp_path / "a.xml"
    path.write_text(
        '<testsuite><testcase classname="test.rb.test_x.TestA.TestB" name="test_y" '
        'file="test/rb/test_x.py" line="3" /></testsuite>'
    )
    (case,) = read_report(path).cases.values()
    assert case.test_id == "test/rb/test_x.py::TestA::TestB::test_y"


def test_main_prints_counts_and_lost(reports, capsys):
    assert main([str(path) for path in reports]) == 1
    out = capsys.readouterr().out
    assert "passed 4 failed 1 error 1 skipped 1 (total 7)" in out
    assert "passed 2 failed 1 error 1 skipped 2 (total 6)" in out
    assert "pass on stock, not on patched: 3" in out
    assert "  rb/test_storages.py::TestStorages::test_set[True]  [failed] RuntimeError: lock under compile" in out
    assert "pass on patched, not on stock: 1\n  rb/test_samplers.py::test_slice  [was failed]" in out
