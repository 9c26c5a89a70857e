"""Sessions: tests, lint, conformance, ray, benchmark, benchmark_tdmpc2, compare, upstream, upstream_review, torchrl_suite.

Every environment installs torch first, explicitly: ``TORCHRL_FIXES_TORCH`` if set,
else ``torch==2.14.1`` for the README's two commands (``tests`` and ``benchmark``:
TorchRL 0.14.1's C++ extension, which the prioritized buffers need, loads beside it,
and one download serves both) and ``torch==2.13.0`` for the other sessions (the
release matrix among them, which also covers the extension not loading). Which build
that gives depends on where pip looks: from the plain package index, on Linux x86-64,
either is the CUDA build (several GB with its CUDA libraries; it also runs on a
machine without a GPU); a CPU build (``2.13.0+cpu``) is what pip finds where its
index or its ``--find-links`` offers a CPU wheel (PyTorch's CPU index, a local wheel
folder, a mirror). Set the variable to any requirement pip takes, for example a wheel
file or ``torch==2.13.0+cpu``:

    TORCHRL_FIXES_TORCH=/wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl nox -s tests

    nox -s tests                     # unit tests + conformance on TorchRL 0.14.1
    TORCHRL_FIXES_REQUIRE_EXTENSION=1 nox -s tests   # a prioritized test that cannot run fails
    nox -s lint
    nox -s conformance               # conformance on every supported release and the nightly
    nox -s "conformance(torchrl='0.12.0')"
    nox -s "conformance(torchrl='nightly')"   # the pinned torchrl-nightly build (devtools/torchrl_matrix.py)
    nox -s ray                       # a RayReplayBuffer on a local Ray cluster, with the fixes
    nox -s benchmark                 # the main job: stock vs patched timings, table and plot in results/latest/
    nox -s benchmark -- --out results          # refreshes the committed table and plot
    nox -s benchmark -- --full       # adds the 346M-transition rows (memory: python -m devtools bench --help)
    nox -s benchmark -- --compare BASELINE.json
    nox -s benchmark_tdmpc2          # TD-MPC2's buffer on the TorchRL it pins (0.8.1), stock vs patched
    nox -s compare                   # stock vs patched outputs (pinning), side by side
    nox -s upstream                  # patches/main/ applied to TorchRL main's source, no runtime patching
    nox -s upstream_review           # patches/main/ reviewed PR by PR as TorchRL's CI would (pinned hooks, tests)
    nox -s upstream_review -- --checkout /path/to/rl
    nox -s "torchrl_suite(torchrl='0.14.1')" -- /path/to/rl/test/rb   # TorchRL's own tests (needs a pytorch/rl checkout)

``benchmark``, ``compare``, ``upstream`` and ``upstream_review`` run the repository's development tooling,
``python -m devtools``, from this folder.
"""
from __future__ import annotations

import logging
import os
import sys

import nox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from devtools.review_hooks import (  # noqa: E402
    FORMATTER_REQUIREMENTS,
    HOOK_REQUIREMENTS,
    VERMIN_REQUIREMENT,
)
from devtools.speed_comparison import LOCAL_RESULTS  # noqa: E402
from devtools.torchrl_matrix import MATRIX, NEWEST, TDMPC2, torchrl_requirements  # noqa: E402

nox.options.reuse_existing_virtualenvs = True


def _without_uv_notice(record: logging.LogRecord) -> bool:
    """nox looks for uv at every session and logs when it is missing; the sessions use
    pip, so that line says nothing a user can act on."""
    return record.getMessage() != "uv binary not found."


logging.getLogger("nox").addFilter(_without_uv_notice)
nox.options.sessions = ["lint", "tests", "conformance"]

# The torch requirement each session installs first (see the module docstring): the
# README's two commands take the one beside which TorchRL 0.14.1's C++ extension
# (prioritized buffers) loads, the other sessions the smaller CPU-only default.
USER_TORCH = os.environ.get("TORCHRL_FIXES_TORCH", "").strip()
README_TORCH = USER_TORCH or "torch==2.14.1"
TORCH = USER_TORCH or "torch==2.13.0"
def _test_requirements() -> list[str]:
    """pyproject.toml's test extra and runtime requirements, less torch, torchrl and tensordict."""
    # nox's TOML reader: tomllib is Python 3.11+, and nox brings tomli where it is missing.
    project = nox.project.load_toml(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")
    )["project"]
    runtime = [r for r in project["dependencies"] if not r.startswith(("torch", "tensordict"))]
    return [*project["optional-dependencies"]["test"], *runtime]


def _install(session: nox.Session, torchrl: str, torch: str = TORCH) -> None:
    session.install(torch)
    if torchrl == "nightly":
        # torchrl-nightly and tensordict-nightly hold the torchrl and tensordict packages
        # under other names: this project's requirements on torchrl and tensordict would
        # install the releases over them, so it goes in without its requirements.
        session.install(*torchrl_requirements(torchrl), *_test_requirements())
        session.install("--no-deps", "-e", ".")
    else:
        session.install("-e", ".[test]", *torchrl_requirements(torchrl))


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of the package, and the conformance suite on the newest release (the README's).

    Beside ``torch==2.14.1`` TorchRL's C++ extension loads, so the prioritized buffers'
    tests run; with ``TORCHRL_FIXES_REQUIRE_EXTENSION=1`` (CI) a test that needs it
    fails instead of skipping where it does not load.
    """
    _install(session, NEWEST, torch=README_TORCH)
    session.run(
        "python", "-m", "pytest", "--doctest-modules", "torchrl_fixes", "devtools", "tests",
        "conformance", "--ignore=tests/ray",  # nox -s ray runs those
        *session.posargs,
    )


@nox.session
@nox.parametrize("torchrl", MATRIX)
def conformance(session: nox.Session, torchrl: str) -> None:
    """Conformance on one TorchRL release: stock vs patched, and which fixes apply there.

    The speed benchmarks run once each, untimed, so that they run on every release too.
    """
    _install(session, torchrl)
    session.run("python", "-m", "torchrl_fixes", "status")
    session.run("python", "-m", "pytest", "conformance", *session.posargs)
    session.run(
        "python", "-m", "pytest", "conformance", "-m", "speed", "--benchmark-disable", "-q",
        *session.posargs,
    )


@nox.session
def ray(session: nox.Session) -> None:
    """A RayReplayBuffer actor on a local Ray cluster gets the fixes (setup hook, launcher).

    ``tests/ray``: Ray started here (two CPUs, 127.0.0.1 only) once with the
    ``worker_process_setup_hook`` ``torchrl_fixes.ray_worker_setup`` and once under
    ``torchrl-fixes run``; each actor reports the fixes applied, and a slice sample
    after a write at 6M stored is at least 3x faster than in an actor with
    ``TORCHRL_FIXES=0`` (printed). About a minute, installs aside.
    """
    _install(session, NEWEST)
    session.install("ray")
    session.run("python", "-m", "pytest", "tests/ray", "-rA", *session.posargs)


# Every Python file of the repository: what lint checks.
LINT_PATHS = (
    "torchrl_fixes", "devtools", "tests", "conformance", "upstream", "examples", "noxfile.py", "conftest.py",
)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the repository's Python, and its Python 3.10 floor checked statically.

    No Python 3.10 interpreter is available to CI: vermin reports the modules, members
    and syntax newer than 3.10 that it knows, ``devtools/python_floor.py`` what vermin
    lets through (``python -m devtools.python_floor --help`` lists it).
    """
    session.install("ruff>=0.6", VERMIN_REQUIREMENT)
    session.run("ruff", "check", *LINT_PATHS)
    # --eval-annotations: annotations are checked as if evaluated (typing.get_type_hints
    # does), although `from __future__ import annotations` leaves them as strings;
    # --no-parse-comments: no `# novm` comment exempts a line.
    session.run(
        "vermin", "--target=3.10-", "--violations", "--eval-annotations",
        "--no-parse-comments", "--no-tips", *LINT_PATHS,
    )
    session.run("python", "-m", "devtools.python_floor", *LINT_PATHS)


@nox.session
def compare(session: nox.Session) -> None:
    """The fix status, then stock and patched ``pin_memory=True`` output, side by side."""
    _install(session, NEWEST)
    session.run("python", "-m", "devtools", "compare", *session.posargs)


@nox.session
def benchmark(session: nox.Session) -> None:
    """The main job: stock against patched TorchRL timed here, as a table and a plot.

    It installs ``torch==2.14.1`` unless ``TORCHRL_FIXES_TORCH`` says otherwise, as
    ``tests`` does: beside it TorchRL's C++ extension loads, which the
    ``PrioritizedSliceSampler`` rows need (they are skipped where it does not). Shows each benchmark as it lands, then the
    table; writes ``results/latest/``, which
    git ignores (``bench.json``, ``benchmark.md``, ``benchmark.png``, ``bench.log``);
    ``-- --out results`` refreshes the committed table and plot instead. Arguments
    after ``--`` go to ``python -m devtools bench``: ``--full``, ``--compare
    BASELINE.json``, ``--margin``, ``--json``, ``--out DIR``, ``--threads N``
    (``python -m devtools bench --help`` says what each does and what ``--full`` needs).
    """
    session.install(README_TORCH)
    session.install("-e", ".[bench]", *torchrl_requirements(NEWEST))
    session.run("python", "-m", "devtools", "bench", *session.posargs)


@nox.session
def benchmark_tdmpc2(session: nox.Session) -> None:
    """TD-MPC2's replay buffer on the TorchRL release it pins (0.8.1), stock against patched.

    ``python -m devtools tdmpc2``: 10M stored transitions, 50 samples per episode
    written, every slice checked; writes ``results/latest/tdmpc2.md``. Arguments after
    ``--`` replace ``--out results/latest`` (``--out results`` refreshes the committed
    table; ``python -m devtools tdmpc2 --help``).
    """
    session.install(TORCH)
    session.install("-e", ".[bench]", *torchrl_requirements(TDMPC2))
    session.run("python", "-m", "devtools", "tdmpc2", *(session.posargs or ["--out", LOCAL_RESULTS]))


@nox.session
def upstream(session: nox.Session) -> None:
    """patches/main/ applied to TorchRL main's source and proven by the suite, no runtime patching.

    ``patches/main/`` against TorchRL main as the pinned torchrl-nightly build has it:
    checks that the series is what the runtime fixes and ``upstream/`` write
    (``tests/test_upstream_patches.py``), copies the installed TorchRL into a temporary
    folder, applies the series with ``git apply``, then runs the conformance suite, the
    series' own test files and the speed benchmarks against that copy with
    ``TORCHRL_FIXES=0``. Stock, for the comparison, is compiled from the untouched
    install (``conformance/stock_source.py``). Arguments after ``--`` go to pytest.
    """
    _install(session, "nightly")
    session.install(*FORMATTER_REQUIREMENTS)  # export-patches writes the series through it
    session.run("python", "-m", "devtools", "export-patches", "--check")
    session.run("python", "-m", "pytest", "tests/test_upstream_patches.py", "-q")
    # the series' own test files (upstream/), against the runtime fix on TorchRL main
    session.run("python", "-m", "pytest", "upstream", "-q")
    work = os.path.abspath(session.create_tmp())
    source = os.path.join(work, "torchrl-patched")
    session.run("python", "-c", f"import shutil; shutil.rmtree({source!r}, ignore_errors=True)")
    stock = session.run(
        "python", "-m", "devtools", "patched-copy", source, silent=True
    ).strip().splitlines()[-1]
    env = {
        "PYTHONPATH": source,
        "TORCHRL_FIXES": "0",
        "TORCHRL_FIXES_STOCK_SOURCE": stock,
    }
    session.run("python", "-m", "pytest", "conformance", *session.posargs, env=env)
    # the tests the pull requests add, as the patched tree holds them
    # this repository's pytest options (strict markers among them) are not upstream's
    session.run(
        "python", "-m", "pytest", "-o", "addopts=", "-W", "ignore::pytest.PytestUnknownMarkWarning",
        os.path.join(source, "test"), *session.posargs, env=env,
    )
    session.run(
        "python", "-m", "devtools", "bench", "--out", os.path.join(work, "results"), env=env
    )


@nox.session
def upstream_review(session: nox.Session) -> None:
    """patches/main/ reviewed one pull request at a time, as TorchRL's CI would.

    Copies the pinned torchrl-nightly build into a git tree, applies each patch as a
    commit, and reports per PR: whether it applies, its ``torchrl/`` lines, its test
    files, upstream's pre-commit hooks at their pinned versions (installed here, from
    ``devtools/review_hooks.py``) on what it touches, and its tests on the tree after
    and before it, with ``TORCHRL_FIXES=0``. Exits 1 when a bar of the upstream
    contract is missed. With a pytorch/rl checkout its tests, benchmarks and settings
    join the tree and its ``scripts/check-docstring-args`` runs:

        nox -s upstream_review -- --checkout /path/to/rl

    Arguments after ``--`` go to ``python -m devtools upstream-review`` (``--keep``,
    ``--touched-tests``, ``--patches DIR``).
    """
    _install(session, "nightly")
    session.install(*HOOK_REQUIREMENTS)
    session.run("python", "-m", "devtools", "upstream-review", *session.posargs)


@nox.session
@nox.parametrize("torchrl", MATRIX)
def torchrl_suite(session: nox.Session, torchrl: str) -> None:
    """TorchRL's own replay-buffer tests from a pytorch/rl checkout, stock then patched; none lost.

    Needs a checkout of pytorch/rl's tests that match this TorchRL (never committed here):

        nox -s "torchrl_suite(torchrl='0.14.1')" -- /path/to/rl/test/rb [pytest args]

    See ``devtools/run_torchrl_suite.sh``.
    """
    if not session.posargs:
        session.error("give the test/rb folder of a pytorch/rl checkout that matches this TorchRL")
    _install(session, torchrl)
    session.run(
        "bash",
        "devtools/run_torchrl_suite.sh",
        session.posargs[0],
        session.virtualenv.location,
        os.path.join(session.virtualenv.location, "torchrl-suite"),
        *session.posargs[1:],
        external=True,
    )
