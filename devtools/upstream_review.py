"""``python -m devtools upstream-review``: the ``patches/main/`` series reviewed as TorchRL's CI would.

The installed ``torchrl`` package (the pinned nightly build of TorchRL main) is
copied into a temporary git tree as ``torchrl/``, with a pytorch/rl checkout's
``test/``, ``benchmarks/`` and settings beside it when ``--checkout`` gives one, and
committed. Each patch of the series is one pull request: it is applied with ``git
apply -p1`` and committed, in name order, and checked against the bars of the
upstream contract (stated in ``patches/README.md``):

- it applies (a PR that does not stops the review: later ones build on it);
- at most :data:`TORCHRL_LINES_BAR` lines added and removed under ``torchrl/``;
- a PR that changes ``torchrl/`` adds or changes at least one file under ``test/``;
- upstream's hooks (:mod:`devtools.review_hooks`) find nothing new in what it touches;
- every new test of its test files passes on the tree after it, and none of
  TorchRL's tests in the existing test files it changes (with ``--touched-tests``,
  in those that import a module it touches) loses a pass it had before it;
- across the series, at least one new test fails by assertion on the tree before its PR.

Tests run with :mod:`devtools.review_pytest`: TorchRL from the tree, nothing
patched at runtime. The report is a table with a column per PR, the findings below
it and a one-line verdict; the exit status is 1 when a bar is missed.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from devtools import review_hooks, review_pytest
from devtools.compare_junit import Case, lost_tests
from devtools.review_hooks import HookResult

TORCHRL_LINES_BAR = 600
# What a pytorch/rl checkout lends the tree, beside the installed torchrl/; the
# first two it must have.
CHECKOUT_REQUIRED = ("test/", "setup.cfg")
CHECKOUT_OPTIONAL = ("benchmarks/", "pyproject.toml", "scripts/check-docstring-args", "pytest.ini")
# The tree is a scratch repository: its commits need an author and no signing.
_GIT_SETTINGS = (
    "-c",
    "user.name=upstream review",
    "-c",
    "user.email=upstream-review@localhost",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.autocrlf=false",
)


class ReviewError(Exception):
    """The review cannot start or go on; the message says why, in one line."""


@dataclass
class StockOutcome:
    """One new test of a PR, run on the tree before that PR."""

    test_id: str
    kind: str  # passed, skipped, assertion or error (review_pytest.outcome_on)
    message: str


@dataclass
class PullRequestReview:
    """What the review found about one patch."""

    patch: str
    applies: bool = True
    apply_error: str = ""
    torchrl_lines: int = 0
    test_files: list[str] = field(default_factory=list)
    hooks: list[HookResult] = field(default_factory=list)
    after: list[Case] = field(default_factory=list)  # its new tests, after it
    existing_after: list[Case] = field(default_factory=list)  # the rest of its test files' tests
    after_errors: dict[str, str] = field(default_factory=dict)
    stock: list[StockOutcome] = field(default_factory=list)
    regression_files: list[str] = field(default_factory=list)
    regressions: list[Case] = field(default_factory=list)

    @property
    def number(self) -> str:
        return self.patch.split("-")[0]

    def not_passing_after(self) -> list[Case]:
        return [case for case in self.after if case.outcome in ("failed", "error")]

    def new_tests_failing(self) -> int:
        """Its new tests that fail after it, and its test modules that cannot be collected."""
        return len(self.not_passing_after()) + len(self.after_errors)

    def missed_bars(self) -> list[str]:
        """Each bar this PR misses, in words."""
        if not self.applies:
            return [f"{self.number} does not apply"]
        missed = []
        if self.torchrl_lines > TORCHRL_LINES_BAR:
            missed.append(
                f"{self.number}: {self.torchrl_lines} torchrl/ lines > {TORCHRL_LINES_BAR}"
            )
        if self.torchrl_lines and not self.test_files:
            missed.append(f"{self.number}: no test/ file")
        missed += [f"{self.number}: {h.name} {len(h.findings)}" for h in self.hooks if not h.ok]
        failing = self.new_tests_failing()
        if failing:
            missed.append(f"{self.number}: {failing} new test(s) not passing")
        if self.regressions:
            missed.append(f"{self.number}: {len(self.regressions)} stock pass(es) lost")
        return missed


@dataclass
class SeriesReview:
    """The review of every PR of the series, and what this run left out."""

    prs: list[PullRequestReview] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def fails_on_stock(self) -> int:
        """How many new tests fail by assertion on the tree before their PR."""
        return sum(o.kind == "assertion" for pr in self.prs for o in pr.stock)

    def missed_bars(self) -> list[str]:
        missed = [bar for pr in self.prs for bar in pr.missed_bars()]
        if not self.fails_on_stock():
            missed.append("series: no new test fails by assertion before its PR")
        return missed


def verdict(series: SeriesReview) -> str:
    """The report's last line."""
    missed = series.missed_bars()
    if not missed:
        return f"verdict: PASS: {len(series.prs)} PRs, every bar met"
    return f"verdict: FAIL: {len(missed)} bar(s) missed: " + "; ".join(missed)


def series_patches(folder: Path) -> list[Path]:
    """The patches of ``folder`` in the order they apply: by name (0001, 0002, ...)."""
    patches = sorted(Path(folder).glob("*.patch"))
    if not patches:
        raise ReviewError(f"no *.patch in {folder}")
    return patches


def check_checkout(checkout: Path) -> None:
    """Raises :class:`ReviewError` unless ``checkout`` looks like the root of a pytorch/rl clone."""
    for name in CHECKOUT_REQUIRED:
        if not (Path(checkout) / name).exists():
            raise ReviewError(
                f"--checkout {checkout}: no {name} there (give the root of a pytorch/rl clone)"
            )


def git(tree: Path, *args: str) -> str:
    """``git args`` in ``tree``; its standard output."""
    result = subprocess.run(
        ["git", *_GIT_SETTINGS, *args], cwd=tree, capture_output=True, text=True
    )
    if result.returncode:
        why = " ".join(result.stderr.split()) or f"exit {result.returncode}"
        raise ReviewError(f"git {args[0]} in {tree}: {why}")
    return result.stdout


def build_tree(tree: Path, torchrl_package: Path, checkout: Path | None) -> list[str]:
    """Copies ``torchrl_package`` (and the checkout's files) into ``tree`` and commits it.

    Returns:
        What the tree lacks for want of a checkout, in words.
    """
    tree.mkdir(parents=True)
    shutil.copytree(torchrl_package, tree / "torchrl", ignore=shutil.ignore_patterns("__pycache__"))
    lacking = []
    if checkout is None:
        review_hooks.write_upstream_settings(tree)
        lacking.append(
            "no --checkout: the tree has no test/ or benchmarks/; flake8, pydocstyle, usort and "
            "codespell ran with upstream's settings as devtools/review_hooks.py writes them; "
            "docstring-args was skipped (scripts/check-docstring-args); no existing TorchRL test was run"
        )
    else:
        for name in (*CHECKOUT_REQUIRED, *CHECKOUT_OPTIONAL):
            source = Path(checkout) / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, tree / name)
            else:
                lacking.append(f"the checkout has no {name}")
        if not (tree / "pyproject.toml").exists():
            (tree / "pyproject.toml").write_text(review_hooks.UPSTREAM_PYPROJECT)
    git(tree, "init", "-q")
    git(tree, "add", "-A", "-f")
    git(
        tree,
        "commit",
        "-q",
        "-m",
        "torchrl as installed" + ("" if checkout is None else ", with the checkout's files"),
    )
    return lacking


def patch_paths(tree: Path, patch: Path) -> list[str]:
    """The paths ``patch`` writes, as ``git apply --numstat`` reads them (nothing is applied)."""
    out = git(tree, "apply", "-p1", "--numstat", str(Path(patch).resolve()))
    return [line.split("\t", 2)[2] for line in out.splitlines() if line.count("\t") >= 2]


def changed_paths(tree: Path) -> dict[str, str]:
    """Path -> git status letter (A, M, D, ...) of each file the last commit changed."""
    out = git(tree, "diff", "--name-status", "--no-renames", "HEAD~1", "HEAD")
    return {line.split("\t")[1]: line.split("\t")[0] for line in out.splitlines() if line}


def torchrl_lines(numstat: str) -> int:
    """Lines added and removed under ``torchrl/``, from ``git diff --numstat`` output.

    Examples:
        >>> torchrl_lines("10\\t2\\ttorchrl/a.py\\n5\\t0\\ttest/test_a.py\\n-\\t-\\ttorchrl/b.so\\n")
        12
    """
    total = 0
    for line in numstat.splitlines():
        added, removed, path = line.split("\t", 2)
        if path.startswith("torchrl/") and added != "-":  # "-": a binary file
            total += int(added) + int(removed)
    return total


def pr_test_files(changed: dict[str, str]) -> list[str]:
    """The files under ``test/`` that a PR adds or changes (deleted ones aside).

    Examples:
        >>> pr_test_files({"torchrl/a.py": "M", "test/rb/test_a.py": "A", "test/old.py": "D"})
        ['test/rb/test_a.py']
    """
    return sorted(
        path for path, status in changed.items() if path.startswith("test/") and status != "D"
    )


def is_test_module(path: str) -> bool:
    """A file pytest collects tests from by default."""
    name = Path(path).name
    return path.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def importing_test_modules(tree: Path, touched: list[str]) -> list[str]:
    """The test modules under ``tree/test/`` that import a touched ``torchrl`` module or its package.

    The package counts because tests mostly import what a package re-exports
    (``from torchrl.data.replay_buffers.samplers import SliceSampler`` for ``samplers/slice.py``).
    """
    modules = set()
    for path in touched:
        if path.startswith("torchrl/") and path.endswith(".py"):
            module = path[: -len(".py")].removesuffix("/__init__").replace("/", ".")
            modules |= {module, module.rpartition(".")[0]}
    found = []
    for file in sorted((tree / "test").rglob("*.py")):
        path = file.relative_to(tree).as_posix()
        if is_test_module(path) and _imported_modules(file) & modules:
            found.append(path)
    return found


def _imported_modules(file: Path) -> set[str]:
    try:
        tree = ast.parse(file.read_text())
    except (SyntaxError, UnicodeDecodeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@contextmanager
def worktree_before(tree: Path, dest: Path):
    """A worktree of ``tree`` at the commit before its last: the tree before the PR."""
    git(tree, "worktree", "add", "-q", "--detach", str(dest), "HEAD~1")
    try:
        yield dest
    finally:
        git(tree, "worktree", "remove", "--force", str(dest))


def review_tests(
    tree: Path, review: PullRequestReview, runs: Path, regression_files: list[str]
) -> None:
    """Runs the PR's test modules after it and before it, and ``regression_files`` both ways.

    Before the PR, ``regression_files`` run as they were; then the PR's test files are
    put in the tree before it, and its test modules run there (stock for them). A
    test is new when that first run did not have it.
    """
    modules = [path for path in review.test_files if is_test_module(path)]
    review.regression_files = regression_files
    if not modules and not regression_files:
        return
    log = runs / review.number
    after = review_pytest.run_pytest(
        tree, sorted({*modules, *regression_files}), Path(f"{log}-after.xml")
    )
    review.after_errors = {f: why for f, why in after.collection_errors.items() if f in modules}
    commit = git(tree, "rev-parse", "HEAD").strip()
    with worktree_before(tree, Path(f"{log}-before")) as before:
        old = review_pytest.run_pytest(before, regression_files, Path(f"{log}-old.xml"))
        if review.test_files:
            git(before, "checkout", commit, "--", *review.test_files)
        stock = review_pytest.run_pytest(before, modules, Path(f"{log}-stock.xml"))
    review.regressions = lost_tests(old.report, after.report)
    for case in after.cases_in(modules):
        (review.existing_after if case.key in old.report.cases else review.after).append(case)
    review.stock = [
        StockOutcome(c.test_id, *review_pytest.outcome_on(c, stock)) for c in review.after
    ]


def review_pull_request(
    tree: Path, patch: Path, runs: Path, *, touched_tests: bool
) -> PullRequestReview:
    """Applies ``patch`` to ``tree`` as one commit and checks it against every bar."""
    review = PullRequestReview(patch.name)
    try:
        baseline = review_hooks.baselines(tree, patch_paths(tree, patch))
        git(tree, "apply", "-p1", str(Path(patch).resolve()))
    except ReviewError as err:
        review.applies, review.apply_error = False, str(err)
        return review
    git(tree, "add", "-A", "-f")
    git(tree, "commit", "-q", "--allow-empty", "-m", patch.name)
    changed = changed_paths(tree)
    touched = sorted(path for path, status in changed.items() if status != "D")
    review.torchrl_lines = torchrl_lines(
        git(tree, "diff", "--numstat", "--no-renames", "HEAD~1", "HEAD")
    )
    review.test_files = pr_test_files(changed)
    _progress(f"{patch.name}: hooks on {len(touched)} file(s)")
    review.hooks = review_hooks.run_hooks(tree, touched, baseline)
    regression = {p for p in review.test_files if is_test_module(p) and changed[p] != "A"}
    if touched_tests:
        # a module the PR adds reaches existing tests only through the modules it edits
        edited = [path for path, status in changed.items() if status == "M"]
        regression |= set(importing_test_modules(tree, edited))
    if review.test_files or regression:
        _progress(
            f"{patch.name}: tests ({len(review.test_files)} file(s) of the PR, {len(regression)} existing)"
        )
    review_tests(tree, review, runs, sorted(regression))
    return review


def review_series(
    tree: Path, patches: list[Path], runs: Path, *, touched_tests: bool
) -> list[PullRequestReview]:
    """Each patch as one PR, in order, until one does not apply."""
    reviews = []
    for patch in patches:
        _progress(f"{patch.name}: applying")
        reviews.append(review_pull_request(tree, patch, runs, touched_tests=touched_tests))
        if not reviews[-1].applies:
            break
    return reviews


def _progress(text: str) -> None:
    print(f"upstream-review: {text}", file=sys.stderr, flush=True)


FAIL_MARK = " ✗"
SHOWN_FINDINGS = 50  # per hook and PR; --keep leaves the tree to see the rest


def _hook_cell(hook: HookResult) -> str:
    if hook.skipped:
        return "skipped"
    if not hook.files:
        return "-"
    return "ok" if hook.ok else f"{len(hook.findings)}{FAIL_MARK}"


def _table_rows(pr: PullRequestReview) -> list[tuple[str, str]]:
    """(label, cell) of one PR's column; a cell that misses its bar ends in :data:`FAIL_MARK`."""

    def mark(text, missed: bool) -> str:
        return f"{text}{FAIL_MARK if missed else ''}"

    rows = [("applies", mark("yes" if pr.applies else "no", not pr.applies))]
    if not pr.applies:
        return rows
    rows.append(
        (
            f"torchrl/ lines (<= {TORCHRL_LINES_BAR})",
            mark(pr.torchrl_lines, pr.torchrl_lines > TORCHRL_LINES_BAR),
        )
    )
    rows.append(
        ("test/ files (>= 1)", mark(len(pr.test_files), pr.torchrl_lines > 0 and not pr.test_files))
    )
    rows += [(hook.name, _hook_cell(hook)) for hook in pr.hooks]
    failing = pr.new_tests_failing()
    if pr.after or failing:
        passed = sum(case.outcome == "passed" for case in pr.after)
        skipped = sum(case.outcome == "skipped" for case in pr.after)
        rows.append(
            ("new tests after: pass/fail/skip", mark(f"{passed}/{failing}/{skipped}", failing))
        )
    else:
        rows.append(("new tests after: pass/fail/skip", "-"))
    assertion = sum(o.kind == "assertion" for o in pr.stock)
    errors = sum(o.kind == "error" for o in pr.stock)
    rows.append(("fail before PR: assert/error", f"{assertion}/{errors}" if pr.stock else "-"))
    lost = len(pr.regressions)
    rows.append(("stock passes lost", mark(lost, lost) if pr.regression_files else "-"))
    return rows


def render_table(series: SeriesReview) -> str:
    """One column per PR, one row per check."""
    columns = [dict(_table_rows(pr)) for pr in series.prs]
    labels = list(dict.fromkeys(label for pr in series.prs for label, _ in _table_rows(pr)))
    width = max(map(len, labels)) + 2
    cell_width = max(8, *(len(str(cell)) + 2 for column in columns for cell in column.values()))
    lines = [" " * width + "".join(pr.number.ljust(cell_width) for pr in series.prs)]
    for label in labels:
        cells = "".join(str(column.get(label, "")).ljust(cell_width) for column in columns)
        lines.append(f"{label.ljust(width)}{cells}".rstrip())
    return "\n".join(lines)


def _pr_details(pr: PullRequestReview) -> list[str]:
    """The findings under one PR's heading, indented."""
    if not pr.applies:
        return [f"  does not apply: {pr.apply_error}"]
    lines = [
        f"  torchrl/ lines: {pr.torchrl_lines}; test/ files: {', '.join(pr.test_files) or 'none'}"
    ]
    for hook in pr.hooks:
        if hook.findings:  # a skipped hook's reason is the series' "skipped:" note
            lines.append(
                f"  {hook.name}: {len(hook.findings)}{' new' if hook.new_only else ''} finding(s)"
            )
            lines += [f"    {finding}" for finding in hook.findings[:SHOWN_FINDINGS]]
            if len(hook.findings) > SHOWN_FINDINGS:
                lines.append(f"    ... {len(hook.findings) - SHOWN_FINDINGS} more")
    for file, why in pr.after_errors.items():
        lines.append(f"  after the PR, {file} is not collected: {why}")
    for case in pr.after:
        if case.outcome != "passed":
            lines.append(f"  after the PR, {case.test_id} {case.outcome}: {case.message}")
    if pr.existing_after:
        counts = Counter(case.outcome for case in pr.existing_after)
        lines.append(
            f"  the {len(pr.existing_after)} other tests of its test files, after it: "
            + ", ".join(f"{counts[o]} {o}" for o in ("passed", "failed", "error", "skipped"))
            + " (the bar for them: no stock pass lost)"
        )
    if pr.stock:
        lines.append("  its new tests on the tree before it:")
        lines += [f"    {o.kind:<9} {o.test_id}  {o.message}".rstrip() for o in pr.stock]
    for case in pr.regressions:
        lines.append(f"  stock pass lost: {case.test_id} {case.outcome}: {case.message}")
    return lines


def render(series: SeriesReview) -> str:
    """The whole report: the table, the findings per PR, what was skipped, the verdict."""
    parts = [render_table(series), ""]
    for pr in series.prs:
        parts.append(pr.patch)
        parts += _pr_details(pr)
    parts.append(
        f"series: {series.fails_on_stock()} new test(s) fail by assertion on the tree "
        "before their PR (bar: >= 1)"
    )
    parts += [f"skipped: {note}" for note in series.skipped]
    parts.append(verdict(series))
    return "\n".join(parts)


def main_series_folder() -> Path:
    """``patches/main/``: the series written against TorchRL main."""
    from devtools.upstream_patches import SERIES

    return next(series.folder for series in SERIES if series.name == "main")


def installed_main_torchrl() -> Path:
    """The installed ``torchrl`` package, which must be the build the main series targets."""
    from devtools import upstream_patches

    try:
        series = upstream_patches.installed_series()
    except upstream_patches.ExportError as err:
        raise ReviewError(str(err)) from None
    if series.name != "main":
        raise ReviewError(
            f"the installed TorchRL is {series.label}; the review needs the main series' "
            "build (nox -s upstream_review installs it)"
        )
    return upstream_patches.installed_torchrl_root() / "torchrl"


def run(
    *,
    checkout: Path | None = None,
    patches: Path | None = None,
    keep: bool = False,
    touched_tests: bool = False,
) -> int:
    """Reviews the series, prints the report, and returns the exit status (1: a bar missed)."""
    if checkout is not None:
        check_checkout(checkout)
    elif touched_tests:
        raise ReviewError("--touched-tests needs --checkout (the tree has no test/ without one)")
    patch_files = series_patches(patches or main_series_folder())
    mismatches = review_hooks.pin_mismatches()
    if mismatches:
        raise ReviewError(
            "hooks not at upstream's pins: "
            + ", ".join(mismatches)
            + " (nox -s upstream_review installs them)"
        )
    torchrl_package = installed_main_torchrl()
    work = Path(tempfile.mkdtemp(prefix="upstream-review-"))
    tree, runs = work / "tree", work / "runs"
    try:
        series = SeriesReview(skipped=build_tree(tree, torchrl_package, checkout))
        runs.mkdir()
        try:
            series.prs = review_series(tree, patch_files, runs, touched_tests=touched_tests)
        except (review_pytest.PytestRunError, review_hooks.HookError) as err:
            raise ReviewError(str(err)) from None
        print(render(series))
        if keep:
            print(f"tree kept: {tree} (pytest logs and reports in {runs})")
        return 1 if series.missed_bars() else 0
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
