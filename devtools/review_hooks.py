"""Upstream's pre-commit hooks, at its pinned versions, run on the files one pull request touches.

The pins are pytorch/rl's ``.pre-commit-config.yaml`` (main, August 2026), except
autoflake (upstream runs whichever is installed) and vermin (not an upstream hook:
it checks that nothing needs a Python newer than 3.10, TorchRL's floor; like
pydocstyle's, only its findings that a file did not have before the PR count). ``nox -s
upstream_review`` installs :data:`HOOK_REQUIREMENTS`; :func:`pin_mismatches` says
when the running environment holds other versions.

Each :class:`Hook` runs in the review tree (``devtools/upstream_review.py``) with the
tree's ``setup.cfg`` and ``pyproject.toml``: a pytorch/rl checkout's, or, without
one, upstream's settings as written here (:data:`UPSTREAM_SETUP_CFG`,
:data:`UPSTREAM_PYPROJECT`).
"""

from __future__ import annotations

import configparser
import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HOOK_REQUIREMENTS = (
    # upstream's pinned hooks and their additional_dependencies
    "ufmt==2.8.0",
    "black==22.3.0",
    "usort==1.0.3",
    "libcst==1.0.1",
    "flake8==6.1.0",
    "flake8-bugbear==22.10.27",
    "flake8-comprehensions==3.10.1",
    "flake8-print==4.0.1",
    "pydocstyle==6.3.0",
    "pyupgrade==3.20.0",
    "codespell==2.4.1",
    # unpinned upstream (a "system" hook): the release current when this list was written
    "autoflake==2.4.0",
    # not an upstream hook: the Python 3.10 floor
    "vermin==1.9.2",
)

# Upstream's settings (pytorch/rl main: setup.cfg [flake8] and [pydocstyle],
# pyproject.toml [tool.usort] and [tool.codespell]), written into a tree that has no
# checkout to take them from. Only the entries that apply to torchrl/, test/ and
# benchmarks/ are kept; the TOR codes need torchfix, which upstream's hook lacks too.
UPSTREAM_SETUP_CFG = {
    "flake8": {
        "max-line-length": "79",
        "ignore": "E203, E402, W503, W504, E501, E231",
        "per-file-ignores": "\ntest_*.py: F841, E731, E266\nbenchmarks/*.py: T001, T201",
        "extend-select": "B901, C401, C408, C409",
    },
    "pydocstyle": {
        "match": r".*\.py",
        "convention": "google",
        "add-ignore": "D100, D104, D105, D107, D102, D417",
    },
}
# upstream's formatter (the ufmt hook and its additional_dependencies): export-patches
# writes the series through it
FORMATTER_REQUIREMENTS = HOOK_REQUIREMENTS[:4]
VERMIN_REQUIREMENT = next(r for r in HOOK_REQUIREMENTS if r.startswith("vermin=="))
UPSTREAM_PYPROJECT = """\
[tool.usort]
first_party_detection = false

[tool.codespell]
ignore-words-list = "multicat,nd,splitted,te,uncompressible,dout"
"""
TARGET_PYTHON = "3.10"


def write_upstream_settings(tree: Path) -> None:
    """Writes upstream's hook settings as ``setup.cfg`` and ``pyproject.toml`` in ``tree``."""
    config = configparser.ConfigParser()
    config.read_dict(UPSTREAM_SETUP_CFG)
    with open(tree / "setup.cfg", "w") as f:
        config.write(f)
    (tree / "pyproject.toml").write_text(UPSTREAM_PYPROJECT)


def pin_mismatches() -> list[str]:
    """Each pinned hook distribution that this environment lacks or holds at another version."""
    mismatches = []
    for requirement in HOOK_REQUIREMENTS:
        name, _, pinned = requirement.partition("==")
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            mismatches.append(f"{name} missing (pinned {pinned})")
            continue
        if installed != pinned:
            mismatches.append(f"{name} {installed} (pinned {pinned})")
    return mismatches


def _lines_matching(pattern: str) -> Callable[[str], list[str]]:
    regex = re.compile(pattern)
    return lambda output: [line for line in output.splitlines() if regex.search(line)]


def _pydocstyle_findings(output: str) -> list[str]:
    """``path:LINE in public function `f`:`` and the indented code line below it, as one line each."""
    lines = output.splitlines()
    return [
        f"{where.strip()} {what.strip()}"
        for where, what in zip(lines, lines[1:])
        if re.match(r"\S+:\d+ ", where) and what.startswith((" ", "\t"))
    ]


def _vermin_findings(output: str) -> list[str]:
    """vermin's ``--violations`` output, one ``path: what needs a newer Python`` line per finding."""
    findings, path = [], "?"
    for line in output.splitlines():
        if not line.startswith(" ") and line.endswith(".py"):  # "!2, 3.11     torchrl/x.py"
            path = line.split()[-1]
        elif line.startswith("  ") and line.strip():
            findings.append(f"{path}: {line.strip()}")
    return findings


def _python_file(path: str) -> bool:
    return path.endswith(".py")


def _torchrl_python_file(path: str) -> bool:
    return path.startswith("torchrl/") and path.endswith(".py")


def _any_file(path: str) -> bool:
    return True


@dataclass(frozen=True)
class Hook:
    """One check, run as ``argv + files`` from the tree's root.

    Attributes:
        name (str): how the report names it.
        argv (tuple of str): the command; its first item is a console script of this
            environment, or ``"python"`` for this interpreter.
        selects (callable): which touched paths it checks.
        findings (callable): its output (stdout and stderr) -> one line per finding.
        needs (str, optional): a path the tree must hold for the hook to run.
        rewrites (bool): it edits the files in place, so it runs on copies.
        new_only (bool): only findings the files did not have before the PR count.
    """

    name: str
    argv: tuple[str, ...]
    selects: Callable[[str], bool]
    findings: Callable[[str], list[str]]
    needs: str | None = None
    rewrites: bool = False
    new_only: bool = False


HOOKS = (
    Hook("ufmt", ("ufmt", "check"), _python_file, _lines_matching(r"^(Would format|Error)")),
    Hook("flake8", ("flake8", "--config=setup.cfg"), _python_file, _lines_matching(r":\d+:\d+: ")),
    Hook("pydocstyle", ("pydocstyle",), _torchrl_python_file, _pydocstyle_findings, new_only=True),
    Hook(
        "pyupgrade",
        ("pyupgrade", "--py311-plus"),
        _python_file,
        _lines_matching(r"^Rewriting "),
        rewrites=True,
    ),
    Hook("codespell", ("codespell",), _any_file, _lines_matching(r":\d+: ")),
    Hook(
        "autoflake",
        (
            "autoflake",
            "--check",
            "--quiet",
            "--remove-unused-variables",
            "--remove-all-unused-imports",
        ),
        _python_file,
        _lines_matching(r": Unused imports/variables detected$"),
    ),
    Hook(
        "docstring-args",
        ("python", "scripts/check-docstring-args", "--config", "setup.cfg"),
        _torchrl_python_file,
        _lines_matching(r":\d+: "),
        needs="scripts/check-docstring-args",
    ),
    Hook(
        "vermin",
        ("vermin", "-q", f"--target={TARGET_PYTHON}-", "--violations", "--no-tips"),
        _python_file,
        _vermin_findings,
        # main's own files already trip it (a guarded ``typing.Self`` import): the PR
        # answers for what it adds
        new_only=True,
    ),
    # The Python-floor checks vermin misses (devtools/python_floor.py) join here, as one more Hook.
)


@dataclass
class HookResult:
    """What one hook said about one PR's files.

    Attributes:
        name (str): the hook's name.
        files (int): how many touched files it checked.
        findings (list of str): one line each; for a ``new_only`` hook, the new ones.
        skipped (str): why it did not run, or ``""``.
        new_only (bool): the findings are those the PR added (:attr:`Hook.new_only`).
    """

    name: str
    files: int = 0
    findings: list[str] = field(default_factory=list)
    skipped: str = ""
    new_only: bool = False

    @property
    def ok(self) -> bool:
        return not self.findings


class HookError(Exception):
    """A hook could not be run."""


def _command(argv: tuple[str, ...]) -> list[str]:
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    script = Path(sysconfig.get_path("scripts")) / argv[0]
    if not script.exists():
        raise HookError(
            f"{argv[0]} is not installed beside {sys.executable} (nox -s upstream_review installs it)"
        )
    return [str(script), *argv[1:]]


def run_hook(hook: Hook, tree: Path, files: list[str]) -> list[str]:
    """The findings of ``hook`` on ``files`` (paths relative to ``tree``), every one of them."""
    with tempfile.TemporaryDirectory() as scratch:
        cwd = tree
        if hook.rewrites:
            cwd = Path(scratch)
            for path in files:
                (cwd / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(tree / path, cwd / path)
        result = subprocess.run(
            [*_command(hook.argv), *files], cwd=cwd, capture_output=True, text=True
        )
    output = (result.stdout + result.stderr).replace(f"{Path(cwd).resolve()}/", "")
    findings = hook.findings(output)
    if result.returncode and not findings:
        last = (output.strip().splitlines() or ["no output"])[-1]
        findings = [f"{hook.name} exited {result.returncode}: {last}"]
    return findings


def new_findings(before: list[str], after: list[str]) -> list[str]:
    """The findings of ``after`` that ``before`` does not have, line numbers aside.

    Examples:
        >>> before = ["torchrl/a.py:4 in public function `f`: D403: capitalize"]
        >>> after = ["torchrl/a.py:9 in public function `f`: D403: capitalize",
        ...          "torchrl/a.py:12 in public function `g`: D403: capitalize"]
        >>> new_findings(before, after)
        ['torchrl/a.py:12 in public function `g`: D403: capitalize']
    """
    unplaced = Counter(_without_line(finding) for finding in before)
    new = []
    for finding in after:
        key = _without_line(finding)
        if unplaced[key]:
            unplaced[key] -= 1
        else:
            new.append(finding)
    return new


def _without_line(finding: str) -> str:
    return re.sub(r"^(\S+?):\d+(:\d+)?", r"\1", finding, count=1)


def baselines(tree: Path, paths: list[str]) -> dict[str, list[str]]:
    """The findings of each ``new_only`` hook on the ``paths`` that exist in ``tree`` now."""
    found = {}
    for hook in HOOKS:
        if hook.new_only:
            files = [p for p in paths if hook.selects(p) and (tree / p).is_file()]
            found[hook.name] = run_hook(hook, tree, files) if files else []
    return found


def run_hooks(tree: Path, paths: list[str], baseline: dict[str, list[str]]) -> list[HookResult]:
    """Every hook on the ``paths`` (relative to ``tree``) a PR touched, as the tree now holds them."""
    results = []
    for hook in HOOKS:
        files = [p for p in paths if hook.selects(p)]
        result = HookResult(hook.name, len(files), new_only=hook.new_only)
        if hook.needs and not (tree / hook.needs).exists():
            result.skipped = f"the tree has no {hook.needs} (needs --checkout)"
        elif files:
            result.findings = run_hook(hook, tree, files)
            if hook.new_only:
                result.findings = new_findings(baseline.get(hook.name, []), result.findings)
        results.append(result)
    return results
