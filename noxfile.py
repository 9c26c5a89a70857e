"""Sessions: tests, conformance over the TorchRL release matrix, lint, benchmark, compare, upstream.

Every environment installs torch first, explicitly: ``TORCHRL_FIXES_TORCH`` if set,
else ``torch==2.13.0``. Which build that gives depends on where pip looks: from the
plain package index, on Linux x86-64, ``torch==2.13.0`` is the CUDA build (several GB
with its CUDA libraries; it also runs on a machine without a GPU); the CPU build
(``2.13.0+cpu``) is what pip finds where its index or its ``--find-links`` offers a
CPU wheel (PyTorch's CPU index, a local wheel folder, a mirror). Set the variable to
any requirement pip takes, for example a wheel file or ``torch==2.13.0+cpu``:

    TORCHRL_FIXES_TORCH=/wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl nox -s tests

    nox -s tests                     # unit tests + conformance on TorchRL 0.14.1
    nox -s conformance               # conformance on every supported release and the nightly
    nox -s "conformance(torchrl='0.12.0')"
    nox -s "conformance(torchrl='nightly')"   # the pinned torchrl-nightly build (NIGHTLY)
    nox -s conformance_extension     # prioritized buffers, where TorchRL's C++ extension loads
    nox -s lint
    nox -s benchmark                 # the main job: stock vs patched timings, table and plot
    nox -s benchmark -- --full       # adds the 346M-transition rows (memory: python -m devtools bench --help)
    nox -s benchmark -- --compare BASELINE.json
    nox -s compare                   # stock vs patched outputs (pinning), side by side
    nox -s upstream                  # patches/ applied to TorchRL 0.14.1's source, no runtime patching

``benchmark``, ``compare`` and ``upstream`` run the repository's development tooling,
``python -m devtools``, from this folder.
"""
from __future__ import annotations

import os

import nox

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "conformance", "conformance_extension"]

# The torch requirement every session installs first (see the module docstring).
TORCH = os.environ.get("TORCHRL_FIXES_TORCH", "").strip() or "torch==2.13.0"
# TorchRL release -> the tensordict release it is tested with (the newest its pin admits).
RELEASES = {
    "0.11.1": "0.11.0",
    "0.12.0": "0.12.4",
    "0.13.3": "0.13.0",
    "0.14.1": "0.14.3",
}
NEWEST = "0.14.1"
# The next release as it stands: one dated build of upstream main and the tensordict
# build it was made with. Moving to a newer build is this one line.
NIGHTLY = ("torchrl-nightly==2026.10.27", "tensordict-nightly==2026.10.26")
# Every TorchRL the suite runs on: the releases, then "nightly".
MATRIX = [*RELEASES, "nightly"]


def _torchrl_requirements(torchrl: str) -> list[str]:
    if torchrl == "nightly":
        return list(NIGHTLY)
    return [f"torchrl=={torchrl}", f"tensordict=={RELEASES[torchrl]}"]


def _install(session: nox.Session, torchrl: str, torch: str = TORCH) -> None:
    session.install(torch)
    session.install("-e", ".[test]", *_torchrl_requirements(torchrl))


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of the package, and the conformance suite on the newest release."""
    _install(session, NEWEST)
    session.run(
        "python", "-m", "pytest", "--doctest-modules", "torchrl_fixes", "devtools", "tests",
        "conformance",
        *session.posargs,
    )


@nox.session
@nox.parametrize("torchrl", MATRIX)
def conformance(session: nox.Session, torchrl: str) -> None:
    """Stock vs patched on one TorchRL release, and which fixes apply there."""
    _install(session, torchrl)
    session.run("python", "-m", "torchrl_fixes", "status")
    session.run("python", "-m", "pytest", "conformance", *session.posargs)


@nox.session
def conformance_extension(session: nox.Session) -> None:
    """Conformance where TorchRL's C++ extension loads, so the prioritized buffers run.

    No TorchRL release's extension loads beside the CPU torch 2.13.0; torchrl 0.14.1's
    loads beside torch 2.14.1 (a CUDA build, about 5.5 GB installed, that also runs on
    a CPU-only machine). Here a prioritized test that cannot run fails instead of skipping.
    """
    _install(session, NEWEST, torch="torch==2.14.1")
    session.run(
        "python", "-m", "pytest", "conformance", *session.posargs,
        env={"TORCHRL_FIXES_REQUIRE_EXTENSION": "1"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, the development tooling, the tests and the suite."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "torchrl_fixes", "devtools", "tests", "conformance", "noxfile.py")


@nox.session
def compare(session: nox.Session) -> None:
    """The fix status, then stock and patched ``pin_memory=True`` output side by side."""
    _install(session, NEWEST)
    session.run("python", "-m", "devtools", "compare", *session.posargs)


@nox.session
def benchmark(session: nox.Session) -> None:
    """The main job: stock against patched TorchRL timed here, as a table and a plot.

    Shows each benchmark as it lands, then the table; writes ``results/``
    (``bench.json``, ``benchmark.md``, ``benchmark.png``, ``bench.log``). Arguments
    after ``--`` go to ``python -m devtools bench``: ``--full``, ``--compare
    BASELINE.json``, ``--margin``, ``--json``, ``--out DIR``, ``--threads N``
    (``python -m devtools bench --help`` says what each does and what ``--full`` needs).
    """
    session.install(TORCH)
    session.install("-e", ".[bench]", *_torchrl_requirements(NEWEST))
    session.run("python", "-m", "devtools", "bench", *session.posargs)


@nox.session
def upstream(session: nox.Session) -> None:
    """The upstream diffs, proven by the same suite with no runtime patching.

    Checks that ``patches/`` is what the runtime fixes write, copies the installed
    TorchRL 0.14.1 into a temporary folder, applies every patch with ``git apply``,
    then runs the conformance suite and the speed benchmarks against that copy with
    ``TORCHRL_FIXES=0``. Stock, for the comparison, is compiled from the untouched
    install (``conformance/stock_source.py``). Arguments after ``--`` go to pytest.
    """
    _install(session, NEWEST)
    session.run("python", "-m", "devtools", "export-patches", "--check")
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
    session.run(
        "python", "-m", "devtools", "bench", "--out", os.path.join(work, "results"), env=env
    )
