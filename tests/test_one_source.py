"""Figures and lists said in several places come from one source.

- The configurations a fix leaves to stock code: the fix's ``fallbacks`` declaration.
  ``status()`` prints it, ``docs/fixes.md`` quotes that output, and the upstream
  patch's header renders it.
- The memory ``--full`` needs: :func:`conformance.speed_sizes.memory_for_scale`, which
  ``python -m devtools bench``, pytest's ``--slice-scale`` help and
  ``docs/benchmarks.md`` state.
- What each fix patches: the fix's ``implements`` declaration, which its plan checks
  and the table of ``docs/fixes.md`` renders.
- The runtime package: every module of ``torchrl_fixes`` imports without the test
  suite and without ``devtools/``; no module of ``devtools/`` imports a test module.
- The documents: the README stays short, and every relative link of it and of
  ``docs/`` resolves.
- The README's figures: each stock and patched time it quotes, its results table, its
  progress example and its count of benchmarks are those of the committed run
  (``results/benchmark.md``) and of the main job's collection.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.speed_sizes import GiB, fills_added, memory_for_scale, scenarios_added
from torchrl_fixes._core.registry import targets_table
from torchrl_fixes.fixes import ALL_FIXES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIXES_DOC = (ROOT / "docs" / "fixes.md").read_text()
BENCHMARKS_DOC = (ROOT / "docs" / "benchmarks.md").read_text()
# What a newcomer reads first, in characters.
README_LIMIT = 12_000


def test_docs_status_output_quotes_the_declared_fallbacks():
    assert _status_notes("stock code still runs for:", "limits:") == [
        f"{fix.name}: {fix.all_fallbacks()}".split() for fix in ALL_FIXES if fix.fallbacks
    ]


def test_docs_status_output_quotes_the_declared_limits():
    assert _status_notes("limits:") == [f"{fix.name}: {fix.limits}".split() for fix in ALL_FIXES if fix.limits]


def _status_notes(heading: str, next_heading: str | None = None) -> list:
    """The notes under ``heading`` in docs/fixes.md's status output, each as its words."""
    block = FIXES_DOC[FIXES_DOC.index(f"\n{heading}\n") + 1 :].split("\n```")[0]
    if next_heading is not None:
        block = block.split(f"\n{next_heading}\n")[0]
    quoted = block.split("\n")[1:]
    starts = [i for i, line in enumerate(quoted) if not line.startswith("    ")] + [len(quoted)]
    return [" ".join(quoted[a:b]).split() for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("fix", [f for f in ALL_FIXES if f.fallbacks], ids=lambda f: f.name)
def test_patch_headers_render_the_declared_fallbacks(fix):
    from devtools.upstream_patches import PRS, fallbacks_text

    (name,) = [pr.name for pr in PRS if pr.fix == fix.name]
    patch = ROOT / "patches" / "main" / f"{name}.patch"
    header = patch.read_text().split("\ndiff --git ")[0]
    assert fallbacks_text(fix.name) in header
    flat = " ".join(header.split())
    assert fix.fallbacks in flat


def test_fix_docstrings_point_at_the_declaration_instead_of_listing():
    """A fix module's docstring names where the list is, and does not repeat it."""
    for fix in ALL_FIXES:
        if not fix.fallbacks:
            continue
        doc = " ".join((sys.modules[type(fix).__module__].__doc__ or "").split())
        assert f"{type(fix).__name__}.fallbacks" in doc
        assert "fragmented=True" not in doc and "tensorclasses" not in doc


def test_docs_state_the_computed_full_run_cost():
    memory = f"{memory_for_scale('full') / GiB:.0f} GiB of available memory"
    fills, rows = fills_added("full")
    flat = " ".join(BENCHMARKS_DOC.split())
    assert f"adds the {len(scenarios_added('full'))} rows of 346M stored" in flat
    assert memory in flat
    assert f"a {rows // 1_000_000}M-row buffer {fills} times" in flat
    assert f"about {memory_for_scale('full') / GiB:.0f} GiB of memory" in " ".join(README.split())
    # nowhere else quotes another figure for it
    for path in ("noxfile.py", "conformance/conftest.py", "devtools/__main__.py"):
        assert not re.search(r"\b1[18] GiB|\b7 GB", (ROOT / path).read_text()), path


def test_docs_table_is_the_committed_run():
    """The whole-run table of ``docs/benchmarks.md`` is the committed run's
    (``results/benchmark.md``), which has every row of the default run (``ci`` and
    ``report`` scales, and the single-gather benchmark's two image rows)."""
    table = BENCHMARKS_DOC[BENCHMARKS_DOC.index("The whole run (`results/benchmark.md`") :]
    table = table.split("\n\n")[1]
    committed = (ROOT / "results" / "benchmark.md").read_text().split("\n\n")[1].strip()
    assert table == committed
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    scenarios = {row.split(" | ")[0].removeprefix("| ") for row in rows}
    assert scenarios >= set(scenarios_added("ci") + scenarios_added("report"))
    assert sum("image rows" in scenario for scenario in scenarios) == 2


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
    return names


def test_no_runtime_module_imports_the_suite_or_the_tooling():
    for path in (ROOT / "torchrl_fixes").rglob("*.py"):
        for name in _imported_modules(path):
            assert name.split(".")[0] not in ("conformance", "devtools", "tests"), (path, name)


def _last_line_printed(code: str) -> str:
    """The last line ``code`` prints in a fresh interpreter, which must exit cleanly."""
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()[-1]


def test_every_runtime_module_imports_without_the_suite():
    """In a fresh interpreter where ``conformance``, ``devtools`` and ``tests`` cannot import."""
    code = (
        "import sys, pkgutil, importlib\n"
        "for name in ('conformance', 'devtools', 'tests'): sys.modules[name] = None\n"
        "import torchrl_fixes\n"
        "names = [m.name for m in pkgutil.walk_packages(torchrl_fixes.__path__, 'torchrl_fixes.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names))\n"
    )
    assert int(_last_line_printed(code)) >= 10


def test_a_torchrl_without_tensor_storage_skips_the_fixes_that_read_it():
    """``TensorStorage`` gone from ``torchrl.data.replay_buffers.storages`` (a layout the
    fixes do not know): ``import torchrl_fixes`` works, and each fix that imports it is
    skipped with one warning that says why; the pinning fix, which does not, applies."""
    code = (
        "import json, warnings\n"
        "import torchrl.data.replay_buffers.storages as storages\n"
        "del storages.TensorStorage\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import torchrl_fixes\n"
        "print(json.dumps({\n"
        "    'applied': [r.name for r in torchrl_fixes.status() if r.state == 'applied'],\n"
        "    'warnings': [str(w.message) for w in caught],\n"
        "}))\n"
    )
    found = json.loads(_last_line_printed(code))
    assert found["applied"] == ["pinned_sample_output"]
    for name in ("slice_boundary_index", "single_gather"):
        about = [w for w in found["warnings"] if f"{name} skipped" in w]
        assert len(about) == 1, found["warnings"]
        assert "cannot import" in about[0] and "TensorStorage" in about[0], about[0]


def test_docs_targets_table_is_the_declarations():
    """The table of what each fix patches is written from the fixes' declarations."""
    assert targets_table(ALL_FIXES) in FIXES_DOC


def test_no_tool_imports_a_test_module():
    for path in (ROOT / "devtools").rglob("*.py"):
        for name in _imported_modules(path):
            last = name.split(".")[-1]
            assert not (last.startswith("test_") or last == "conftest"), (path, name)
            assert name.split(".")[0] != "tests", (path, name)


def test_the_readme_is_short():
    assert len(README) <= README_LIMIT


# [text](target): the targets that are not a web address or an anchor of the same page
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
LINK_TEXT = re.compile(r"\[([^\]]*)\]\([^)\s]+\)")


@pytest.mark.parametrize(
    "document",
    ["README.md", "patches/README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))],
)
def test_every_relative_link_resolves(document):
    path = ROOT / document
    text = path.read_text()
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), (document, target)
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked.read_text()), (document, target)


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = LINK_TEXT.sub(r"\1", line.lstrip("#").strip()).lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _committed_rows() -> dict[str, list[str]]:
    """The committed run's table: scenario -> its cells (stock, patched, speed-up, floors)."""
    table = (ROOT / "results" / "benchmark.md").read_text()
    rows = [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ")]
    return {row[0]: row[1:] for row in rows[2:]}


# a time as the tables format it (conformance.speed_report.format_seconds)
TIME = r"\d[\d.]* (?:s|ms|µs|ns)"


def test_the_readme_quotes_the_committed_run():
    """Every "A stock, B with the fixes" / "A against B" pair of times, and every row of the
    results table, is a (stock, patched) pair of one committed row; a ratio to the floor
    "at NM stored" is one of that size's."""
    committed = _committed_rows()
    flat = " ".join(README.split())
    pairs = re.findall(rf"({TIME}) (?:stock, |against )({TIME})", flat)
    assert len(pairs) >= 4, pairs
    measured = {(cells[0], cells[1]) for cells in committed.values()}
    for pair in pairs:
        assert pair in measured, pair
    table = README[README.index("| scenario | stock | patched | speed-up |") :].split("\n\n")[0]
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) >= 10
    for scenario, *cells in rows:
        assert cells == committed[scenario][:3], scenario
    for ratio, stored in re.findall(r"(\d+\.\d+x) at (\d+M) stored", flat):
        assert any(
            f" {stored}/" in scenario and cells[4] == ratio
            for scenario, cells in committed.items()
        ), (ratio, stored)


def test_the_readme_progress_example_is_the_main_jobs():
    """``[i/n] scenario: ...`` is the i-th of the n benchmarks ``nox -s benchmark``
    collects, with the committed run's figures, and n is the count the README gives."""
    from devtools.speed_comparison import SPEED_FILES

    found = re.search(
        rf"`\[(\d+)/(\d+)\] (seed_table (\w+) (\S+)/(\S+)): stock ({TIME}), "
        rf"patched ({TIME}), (\d+\.\d+x)`",
        " ".join(README.split()),
    )
    assert found, "no progress example in the README"
    position, total, scenario, key, stored, capacity, stock, patched, ratio = found.groups()
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", *(f"conformance/{name}" for name in SPEED_FILES),
         "-m", "speed", "--slice-scale=report", "-p", "no:cacheprovider", "--collect-only", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    ).stdout
    items = [line for line in collected.splitlines() if "::" in line]
    assert int(total) == len(items)
    assert f"it ran {total} benchmarks" in " ".join(README.split())
    expected = f"::test_seed_table_sample[{key}-{stored}-{capacity}]"
    assert items[int(position) - 1].endswith(expected), items[int(position) - 1]
    assert [stock, patched, ratio] == _committed_rows()[scenario][:3]
