"""``python -m devtools upstream-review`` on a tiny synthetic ``torchrl`` and series.

No TorchRL and no hook is needed: the tree holds a fake ``torchrl`` package of one
module, the patches are written here, and :data:`devtools.review_hooks.HOOKS` is
replaced by a stand-in script wherever hooks would run.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from devtools import review_hooks, upstream_review
from devtools.__main__ import main as devtools_main
from devtools.compare_junit import Case, Report
from devtools.review_hooks import Hook, HookResult
from devtools.review_pytest import PytestRun, failure_kind, outcome_on
from devtools.upstream_review import (
    PullRequestReview,
    ReviewError,
    SeriesReview,
    StockOutcome,
    build_tree,
    pr_test_files,
    review_series,
    torchrl_lines,
    verdict,
)

STOCK_MODULE = "def value():\n    return 1\n"
FIXED_MODULE = "def value():\n    return 2\n"
BEHAVIOUR_TEST = """\
import pytest

from torchrl.mod import value


def test_value_is_two():
    assert value() == 2


def test_skipped_here():
    pytest.skip("needs a GPU")
"""
UNIT_TEST = """\
from torchrl.newmod import double


def test_double():
    assert double(2) == 4
"""


def write_patch(folder: Path, name: str, before: dict[str, str], after: dict[str, str]) -> Path:
    """A ``git diff`` of the files ``before`` -> ``after`` (paths from the repository root), as ``name``."""
    work = folder / f"{name}.work"
    for side, files in (("a", before), ("b", after)):
        (work / side).mkdir(parents=True)
        for path, text in files.items():
            (work / side / path).parent.mkdir(parents=True, exist_ok=True)
            (work / side / path).write_text(text)
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--no-prefix", "a", "b"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    patch = folder / name
    patch.write_text("Subject: [PATCH] header text git apply skips\n\n" + diff)
    return patch


@pytest.fixture
def fake_torchrl(tmp_path) -> Path:
    package = tmp_path / "site" / "torchrl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(STOCK_MODULE)
    return package


@pytest.fixture
def no_hooks(monkeypatch):
    monkeypatch.setattr(review_hooks, "HOOKS", ())


@pytest.fixture
def series(tmp_path) -> list[Path]:
    """0001 fixes mod.py and carries a behaviour test and a unit test of the module it adds;
    0002 changes torchrl/ alone; 0003 does not apply; 0004 is never reached."""
    folder = tmp_path / "patches"
    folder.mkdir()
    fix = write_patch(
        folder,
        "0001-fix.patch",
        {"torchrl/mod.py": STOCK_MODULE},
        {
            "torchrl/mod.py": FIXED_MODULE,
            "torchrl/newmod.py": "def double(x):\n    return 2 * x\n",
            "test/test_mod.py": BEHAVIOUR_TEST,
            "test/test_newmod.py": UNIT_TEST,
        },
    )
    untested = write_patch(
        folder,
        "0002-untested.patch",
        {"torchrl/mod.py": FIXED_MODULE},
        {"torchrl/mod.py": FIXED_MODULE + "\nX = 1\n"},
    )
    stale = write_patch(
        folder,
        "0003-stale.patch",
        {"torchrl/mod.py": STOCK_MODULE},
        {"torchrl/mod.py": "VALUE = 0\n"},
    )
    never = write_patch(folder, "0004-never.patch", {}, {"torchrl/other.py": "Y = 2\n"})
    return [fix, untested, stale, never]


def review(tmp_path, fake_torchrl, patches) -> list[PullRequestReview]:
    tree = tmp_path / "tree"
    build_tree(tree, fake_torchrl, checkout=None)
    runs = tmp_path / "runs"
    runs.mkdir()
    return review_series(tree, patches, runs, touched_tests=False)


def test_a_series_is_reviewed_pr_by_pr_until_one_does_not_apply(
    tmp_path, fake_torchrl, series, no_hooks
):
    fix, untested, stale = review(tmp_path, fake_torchrl, series)
    assert fix.torchrl_lines == 2 + 2  # mod.py: one line out, one in; newmod.py: two in
    assert fix.test_files == ["test/test_mod.py", "test/test_newmod.py"]
    assert untested.torchrl_lines == 2 and untested.test_files == []
    assert not stale.applies and "patch does not apply" in stale.apply_error
    assert untested.missed_bars() == ["0002: no test/ file"]
    assert stale.missed_bars() == ["0003 does not apply"]


def test_new_tests_run_after_the_pr_and_on_the_tree_before_it(
    tmp_path, fake_torchrl, series, no_hooks
):
    (fix,) = review(tmp_path, fake_torchrl, series[:1])
    after = {case.test_id: case.outcome for case in fix.after}
    assert after == {
        "test/test_mod.py::test_value_is_two": "passed",
        "test/test_mod.py::test_skipped_here": "skipped",
        "test/test_newmod.py::test_double": "passed",
    }
    before = {o.test_id: (o.kind, o.message) for o in fix.stock}
    assert before["test/test_mod.py::test_value_is_two"][0] == "assertion"
    assert before["test/test_mod.py::test_skipped_here"][0] == "skipped"
    kind, why = before["test/test_newmod.py::test_double"]
    assert kind == "error" and "No module named 'torchrl.newmod'" in why
    assert fix.missed_bars() == []
    assert verdict(SeriesReview([fix])) == "verdict: PASS: 1 PRs, every bar met"


def test_a_tree_whose_torchrl_is_imported_from_elsewhere_is_refused(
    tmp_path, fake_torchrl, monkeypatch
):
    from devtools import review_pytest

    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    monkeypatch.setattr(
        review_pytest, "tree_env", lambda tree: {"PYTHONPATH": str(fake_torchrl.parent)}
    )
    with pytest.raises(review_pytest.PytestRunError, match="resolves to .*site/torchrl"):
        review_pytest.check_torchrl_resolves(elsewhere)


def test_a_new_test_that_fails_after_the_pr_misses_the_bar(tmp_path, fake_torchrl, no_hooks):
    patch = write_patch(
        tmp_path,
        "0001-broken.patch",
        {"torchrl/mod.py": STOCK_MODULE},
        {"torchrl/mod.py": "def value():\n    return 3\n", "test/test_mod.py": BEHAVIOUR_TEST},
    )
    (broken,) = review(tmp_path, fake_torchrl, [patch])
    assert broken.missed_bars() == ["0001: 1 new test(s) not passing"]
    assert [case.message for case in broken.not_passing_after()] == ["assert 3 == 2"]


def test_torchrl_lines_count_added_and_removed_under_torchrl_only():
    numstat = (
        "10\t2\ttorchrl/a.py\n5\t1\ttest/test_a.py\n3\t0\tbenchmarks/b.py\n-\t-\ttorchrl/ext.so\n"
    )
    assert torchrl_lines(numstat) == 12


def test_a_pr_touching_torchrl_needs_a_test_file():
    assert pr_test_files({"torchrl/a.py": "M", "test/rb/test_a.py": "A", "test/gone.py": "D"}) == [
        "test/rb/test_a.py"
    ]
    bare = PullRequestReview("0002-x.patch", torchrl_lines=10)
    assert bare.missed_bars() == ["0002: no test/ file"]
    tests_only = PullRequestReview("0003-y.patch", torchrl_lines=0)
    assert tests_only.missed_bars() == []
    too_big = PullRequestReview("0004-z.patch", torchrl_lines=601, test_files=["test/test_z.py"])
    assert too_big.missed_bars() == ["0004: 601 torchrl/ lines > 600"]


def test_pydocstyle_findings_count_only_what_the_pr_adds():
    before = [
        "torchrl/a.py:4 in public function `f`: D403: First word",
        "torchrl/a.py:9 in public function `g`: D415: First line",
        "torchrl/a.py:9 in public function `g`: D415: First line",
    ]
    after = [
        "torchrl/a.py:14 in public function `f`: D403: First word",  # moved down: not new
        "torchrl/a.py:19 in public function `g`: D415: First line",
        "torchrl/a.py:25 in public function `g`: D415: First line",
        "torchrl/a.py:31 in public function `g`: D415: First line",  # a third one: new
        "torchrl/b.py:2 in public class `B`: D101: Missing docstring",
    ]
    assert review_hooks.new_findings(before, after) == after[3:]


def test_pydocstyle_output_becomes_one_line_per_finding():
    output = (
        "torchrl/a.py:4 in public function `f`:\n"
        "        D403: First word of the first line should be properly capitalized\n"
        "torchrl/a.py:8 in public class `A`:\n"
        "        D101: Missing docstring in public class\n"
    )
    assert review_hooks._pydocstyle_findings(output) == [
        "torchrl/a.py:4 in public function `f`: D403: First word of the first line should be properly capitalized",
        "torchrl/a.py:8 in public class `A`: D101: Missing docstring in public class",
    ]


def test_new_only_hooks_compare_against_the_files_before_the_pr(tmp_path, monkeypatch):
    """A stand-in hook that reports each line holding TODO: the baseline is taken
    before the edit, and only the TODO the edit adds is reported."""
    script = tmp_path / "todo_hook.py"
    script.write_text(
        textwrap.dedent("""\
        import sys
        for path in sys.argv[1:]:
            for number, line in enumerate(open(path), 1):
                if "TODO" in line:
                    print(f"{path}:{number}: {line.strip()}")
        """)
    )
    hook = Hook(
        "todo",
        ("python", str(script)),
        review_hooks._torchrl_python_file,
        review_hooks._lines_matching(r":\d+: "),
        new_only=True,
    )
    monkeypatch.setattr(review_hooks, "HOOKS", (hook,))
    (tmp_path / "torchrl").mkdir()
    module = tmp_path / "torchrl" / "a.py"
    module.write_text("x = 1  # TODO old\n")
    baseline = review_hooks.baselines(tmp_path, ["torchrl/a.py", "torchrl/new.py"])
    module.write_text("y = 0  # TODO new\nx = 1  # TODO old\n")
    (result,) = review_hooks.run_hooks(tmp_path, ["torchrl/a.py", "test/test_a.py"], baseline)
    assert (result.name, result.files, result.findings) == (
        "todo",
        1,
        ["torchrl/a.py:1: y = 0  # TODO new"],
    )


def test_a_hook_that_needs_the_checkout_is_skipped_without_it(tmp_path, monkeypatch):
    hook = Hook(
        "docstring-args",
        ("python", "scripts/check-docstring-args"),
        review_hooks._torchrl_python_file,
        review_hooks._lines_matching(":"),
        needs="scripts/check-docstring-args",
    )
    monkeypatch.setattr(review_hooks, "HOOKS", (hook,))
    (result,) = review_hooks.run_hooks(tmp_path, ["torchrl/a.py"], {})
    assert result.ok and "needs --checkout" in result.skipped


def _case(test_id: str, outcome: str = "passed", message: str = "") -> Case:
    return Case(f"key::{test_id}", test_id, outcome, message)


def test_tests_before_the_pr_fail_by_assertion_or_by_error():
    assert failure_kind(_case("t.py::a", "failed", "assert 1 == 2")) == "assertion"
    assert (
        failure_kind(_case("t.py::a", "failed", "AssertionError: Tensor-likes are not close!"))
        == "assertion"
    )
    assert (
        failure_kind(_case("t.py::a", "failed", "Failed: DID NOT RAISE <class 'ValueError'>"))
        == "assertion"
    )
    assert (
        failure_kind(_case("t.py::a", "failed", "AttributeError: no attribute '_index'")) == "error"
    )
    assert failure_kind(_case("t.py::a", "error", "fixture 'rb' not found")) == "error"

    stock = PytestRun(
        Report(
            {
                "key::test/rb/test_a.py::x": _case(
                    "test/rb/test_a.py::x", "failed", "assert 1 == 2"
                ),
                "key::test/rb/test_a.py::y": _case("test/rb/test_a.py::y", "skipped", "no cuda"),
            }
        ),
        collection_errors={
            "test/rb/test_new.py": "ModuleNotFoundError: No module named 'torchrl.new'"
        },
    )
    assert outcome_on(_case("test/rb/test_a.py::x"), stock) == ("assertion", "assert 1 == 2")
    assert outcome_on(_case("test/rb/test_a.py::y"), stock) == ("skipped", "no cuda")
    assert outcome_on(_case("test/rb/test_new.py::z"), stock) == (
        "error",
        "ModuleNotFoundError: No module named 'torchrl.new'",
    )
    assert outcome_on(_case("test/rb/test_b.py::w"), stock) == ("error", "not collected")


def test_the_verdict_names_every_missed_bar():
    clean = PullRequestReview("0001-a.patch", torchrl_lines=5, test_files=["test/test_a.py"])
    clean.stock = [StockOutcome("test/test_a.py::t", "assertion", "assert False")]
    assert verdict(SeriesReview([clean])) == "verdict: PASS: 1 PRs, every bar met"

    untested_behaviour = PullRequestReview(
        "0001-a.patch", torchrl_lines=5, test_files=["test/test_a.py"]
    )
    untested_behaviour.stock = [StockOutcome("test/test_a.py::t", "error", "ImportError")]
    assert verdict(SeriesReview([untested_behaviour])) == (
        "verdict: FAIL: 1 bar(s) missed: series: no new test fails by assertion before its PR"
    )

    messy = PullRequestReview(
        "0002-b.patch", torchrl_lines=700, hooks=[HookResult("flake8", 1, ["x.py:1:1: F401"])]
    )
    messy.regression_files = ["test/test_b.py"]
    messy.regressions = [_case("test/test_b.py::old", "failed", "boom")]
    line = verdict(SeriesReview([clean, messy]))
    assert line == (
        "verdict: FAIL: 4 bar(s) missed: 0002: 700 torchrl/ lines > 600; 0002: no test/ file; "
        "0002: flake8 1; 0002: 1 stock pass(es) lost"
    )


def test_the_report_is_a_table_then_the_findings_then_the_verdict():
    pr = PullRequestReview(
        "0001-a.patch",
        torchrl_lines=700,
        hooks=[HookResult("ufmt", 1, ["Would format torchrl/a.py"])],
    )
    series = SeriesReview([pr], skipped=["no --checkout"])
    report = upstream_review.render(series).splitlines()
    assert report[0].split() == ["0001"]
    assert report[1].split() == ["applies", "yes"]
    assert "700 ✗" in report[2] and "ufmt" in report[4] and "1 ✗" in report[4]
    assert "    Would format torchrl/a.py" in report
    assert report[-2] == "skipped: no --checkout"
    assert report[-1].startswith("verdict: FAIL: ")


def test_without_a_checkout_the_tree_gets_upstreams_settings(tmp_path, fake_torchrl):
    import configparser

    lacking = build_tree(tmp_path / "tree", fake_torchrl, checkout=None)
    assert any("docstring-args was skipped" in note for note in lacking)
    config = configparser.ConfigParser()
    config.read(tmp_path / "tree" / "setup.cfg")
    assert config["flake8"]["max-line-length"] == "79"
    assert "test_*.py: F841, E731, E266" in config["flake8"]["per-file-ignores"]
    assert config["pydocstyle"]["convention"] == "google"
    assert "first_party_detection = false" in (tmp_path / "tree" / "pyproject.toml").read_text()
    assert upstream_review.git(tmp_path / "tree", "status", "--porcelain") == ""


def test_bad_input_is_one_line(tmp_path, capsys):
    not_a_clone = tmp_path / "rl"
    not_a_clone.mkdir()
    assert devtools_main(["upstream-review", "--checkout", str(not_a_clone)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"python -m devtools upstream-review: --checkout {not_a_clone}: no test/ there "
        "(give the root of a pytorch/rl clone)\n"
    )
    assert devtools_main(["upstream-review", "--patches", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"no *.patch in {tmp_path}")
    assert devtools_main(["upstream-review", "--touched-tests"]) == 2
    assert "--touched-tests needs --checkout" in capsys.readouterr().err


def test_series_patches_are_taken_in_name_order(tmp_path):
    for name in ("0010-j.patch", "0002-b.patch", "0001-a.patch", "README.md"):
        (tmp_path / name).write_text("")
    assert [p.name for p in upstream_review.series_patches(tmp_path)] == [
        "0001-a.patch",
        "0002-b.patch",
        "0010-j.patch",
    ]
    with pytest.raises(ReviewError, match="no \\*.patch"):
        upstream_review.series_patches(tmp_path / "README.md")


def test_the_hook_pins_are_written_once():
    root = Path(__file__).resolve().parents[1]
    noxfile = (root / "noxfile.py").read_text()
    assert "HOOK_REQUIREMENTS" in noxfile
    for requirement in review_hooks.HOOK_REQUIREMENTS:
        assert requirement not in noxfile
