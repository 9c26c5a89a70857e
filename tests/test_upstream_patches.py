"""The upstream series, ``patches/main/``, is what ``devtools/upstream_patches.py`` renders.

The committed patches must be byte for byte what the tool writes from the runtime fixes and
``upstream/`` today, apply in order to TorchRL main as the pinned nightly builds it, and say
nothing of this package; each pull request has its text, and each file of ``upstream/`` goes
into exactly one of them. A change to one side without the other fails here.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import re
import shutil
import subprocess
import symtable
import textwrap
from pathlib import Path

import pytest

import torchrl_fixes
from devtools import upstream_patches
from devtools.torchrl_matrix import NIGHTLY_VERSION
from devtools.upstream_review import torchrl_lines
from torchrl_fixes._core.patching import SourceEdits, compose_source_edits
from torchrl_fixes._core.versions import installed_version

SERIES = upstream_patches.SERIES[0]
NAMES = [f"{pr.name}.patch" for pr in upstream_patches.PRS]

pytestmark = pytest.mark.skipif(
    str(installed_version("torchrl")) != NIGHTLY_VERSION or shutil.which("git") is None,
    reason=f"the series targets TorchRL main as torchrl-nightly {NIGHTLY_VERSION} builds it, "
    "and is applied with git",
)


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """What export-patches writes today (rendered once: it runs upstream's formatter)."""
    return upstream_patches.render()


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    """A copy of the installed TorchRL with the committed series applied, made inside a git
    work tree (as nox's .nox/ folder is), where git apply must still write every path."""
    repo = tmp_path_factory.mktemp("repo")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    dest = repo / ".nox" / "upstream" / "tmp"
    dest.mkdir(parents=True)
    assert upstream_patches.patched_copy(dest) == upstream_patches.installed_torchrl_root() / "torchrl"
    return dest


def test_committed_patches_are_what_the_tool_renders(rendered):
    assert list(rendered) == NAMES
    assert sorted(p.name for p in SERIES.folder.glob("*.patch")) == NAMES
    for name, text in rendered.items():
        assert (SERIES.folder / name).read_text() == text, f"{name} is out of date: run export-patches"


def test_each_pull_request_has_its_text():
    for pr in upstream_patches.PRS:
        text = (SERIES.folder / f"{pr.name}.md").read_text()
        assert text.startswith("# ") and "torchrl_fixes" not in text, pr.name
        header = (SERIES.folder / f"{pr.name}.patch").read_text().split("\ndiff --git ", 1)[0]
        assert header.startswith(f"Subject: [PATCH] {text.splitlines()[0][2:]}\n"), pr.name


def test_the_texts_count_the_lines_their_patches_change():
    """A PR text that gives its size under torchrl/ (or a run of PRs' sizes) gives its patch's."""
    sizes = {}
    for pr in upstream_patches.PRS:
        patch = SERIES.folder / f"{pr.name}.patch"
        numstat = subprocess.run(
            ["git", "apply", "--numstat", str(patch)], capture_output=True, text=True, check=True
        ).stdout
        sizes[pr.name[:4]] = torchrl_lines(numstat)
    claims = 0
    for pr in upstream_patches.PRS:
        text = (SERIES.folder / f"{pr.name}.md").read_text()
        for size in re.findall(r"(\d[\d,]*)\s+lines\s+under\s+`torchrl/`", text):
            assert int(size.replace(",", "")) == sizes[pr.name[:4]], pr.name
            claims += 1
        for first, last, size in re.findall(r"\((\d{4})\s+to\s+(\d{4}):\s+(\d[\d,]*)\)", text):
            total = sum(n for k, n in sizes.items() if first <= k <= last)
            assert int(size.replace(",", "")) == total, pr.name
            claims += 1
    assert claims


def test_a_missing_text_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(upstream_patches, "SERIES", (SERIES._replace(folder=tmp_path),))
    with pytest.raises(upstream_patches.ExportError, match="0001-pinned-sample-output.md is missing") as err:
        upstream_patches._header(upstream_patches.PRS[0], upstream_patches.SERIES[0], [])
    assert "\n" not in str(err.value)


def test_the_series_applies_in_order(patched):
    """Each patch applies with git apply after the ones before it, and writes every path it names."""
    site = upstream_patches.installed_torchrl_root()
    for name in NAMES:
        written = [line[6:] for line in (SERIES.folder / name).read_text().splitlines() if line.startswith("+++ b/")]
        assert written, name
        for path in written:
            assert (patched / path).is_file(), (name, path)
            assert not (site / path).is_file() or (site / path).read_bytes() != (patched / path).read_bytes()


def _unbound(text: str) -> set[str]:
    """The global names a module's code reads that the module does not bind."""
    top = symtable.symtable(text, "module", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    found, tables = set(), [top]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        found |= {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    return found - bound - set(dir(builtins)) - {"__file__", "__name__", "__doc__", "__spec__"}


def test_the_code_the_series_writes_binds_what_it_reads(patched):
    """Every global name the code of a file the series writes reads is bound there (what a
    runtime function put in TorchRL needs is imported), as before the series."""
    site = upstream_patches.installed_torchrl_root()
    paths = {line[6:] for name in NAMES for line in (SERIES.folder / name).read_text().splitlines()
             if line.startswith("+++ b/torchrl/") and line.endswith(".py")}
    for path in sorted(paths):
        stock = _unbound((site / path).read_text()) if (site / path).is_file() else set()
        assert _unbound((patched / path).read_text()) <= stock, path
    assert _unbound("import os\n\n\ndef f():\n    return os, warnings\n") == {"warnings"}


def test_patched_copy_refuses_an_existing_copy(patched):
    with pytest.raises(upstream_patches.ExportError, match="already exists"):
        upstream_patches.patched_copy(patched)


def test_nothing_upstream_bound_names_the_runtime(rendered):
    for name, text in rendered.items():
        added = [line for line in text.split("\ndiff --git ", 1)[1].splitlines() if line.startswith("+")]
        assert not [line for line in added if "torchrl_fixes" in line], name
    with pytest.raises(upstream_patches.ExportError, match="still names torchrl_fixes") as err:
        upstream_patches._upstream_text("x = 1\nimport torchrl_fixes  # noqa\n", "upstream/test/x.py")
    assert "\n" not in str(err.value)


def test_runtime_imports_become_torchrl_imports():
    runtime = textwrap.dedent(
        """\
        import logging

        from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import _overrides

        logger = logging.getLogger("torchrl_fixes")


        def f():
            \"\"\"
            >>> import torch, torchrl_fixes
            >>> import torchrl_fixes
            \"\"\"
        """
    )
    assert upstream_patches._upstream_text(runtime, "x") == textwrap.dedent(
        """\
        from torchrl._utils import logger

        from torchrl.data.replay_buffers.samplers._slice_boundaries import _overrides



        def f():
            \"\"\"
            >>> import torch
            \"\"\"
        """
    )


def test_every_upstream_file_is_in_one_pull_request(monkeypatch, tmp_path):
    files = upstream_patches.upstream_files()
    assert set(files.values()) <= {pr.name for pr in upstream_patches.PRS}
    for path in files:  # each added by its pull request, and by it alone
        adding = [n for n in NAMES if f"+++ b/{path}\n" in (SERIES.folder / n).read_text()]
        assert adding == [f"{files[path]}.patch"], path
    (tmp_path / "test" / "rb").mkdir(parents=True)
    for path in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "test" / "rb" / "test_new.py").write_text("def test_it():\n    pass\n")
    monkeypatch.setattr(upstream_patches, "UPSTREAM_DIR", tmp_path)
    with pytest.raises(upstream_patches.ExportError, match="upstream/test/rb/test_new.py is in no pull") as err:
        upstream_patches.upstream_files()
    assert "\n" not in str(err.value)


def test_an_edit_that_does_not_apply_is_one_line(tmp_path):
    (tmp_path / "m.py").write_text("class A:\n    def f(self):\n        return 1\n")
    edit = upstream_patches.Edit("m.py", "A.f", (("return 2", "return 3"),))
    with pytest.raises(upstream_patches.ExportError, match="m.py:A.f: 'return 2' is not found once"):
        upstream_patches._apply(tmp_path, edit, {})
    upstream_patches._apply(tmp_path, edit._replace(edits=(("return 1", "return 3"),)), {})
    assert (tmp_path / "m.py").read_text() == "class A:\n    def f(self):\n        return 3\n"


def _method(path: Path, qualname: str) -> str:
    """The method ``qualname`` of ``path``, parsed from its dedented source (docstrings compare)."""
    (node,) = upstream_patches._nodes(path.read_text(), qualname)
    return ast.dump(ast.parse(upstream_patches._segment(path.read_text(), node)).body[0])


def test_edited_methods_are_the_runtime_methods(patched):
    """Where the runtime puts a stock method's own source with edits in its place
    (derive_from_source), the series holds the same code."""
    from torchrl_fixes.fixes import pinned_sample_output, single_gather, slice_boundary_index

    with torchrl_fixes.disabled():  # planned against stock code, as when applied
        plans = {**_plan(pinned_sample_output.PinnedSampleOutput()), **_plan(single_gather.SingleGather())}
        index_plan = slice_boundary_index.SliceBoundaryIndex().plan()
        derived = _plan(slice_boundary_index.SliceBoundaryIndex())["SliceSampler._tensor_slices_from_startend"]
        # PrioritizedSliceSampler.sample: single_gather's edits (0002), then the index's (0009, 0010)
        prioritized = [
            r for r in [*single_gather.SingleGather().plan(), *index_plan]
            if isinstance(r, SourceEdits) and (r.owner.__name__, r.name) == ("PrioritizedSliceSampler", "sample")
        ]
        plans["PrioritizedSliceSampler.sample"] = compose_source_edits(prioritized).new
    plans["SliceSampler._tensor_slices_from_startend"] = derived  # the others it plans are wrappers
    rb = patched / upstream_patches.RB
    for path, qualname in [
        ("replay_buffers/tensordict.py", "TensorDictReplayBuffer.sample"),
        ("samplers/slice.py", "SliceSampler._finalize_index"),
        ("samplers/prioritized_slice.py", "PrioritizedSliceSampler.sample"),
        ("samplers/streaming_slice.py", "StreamingSliceSampler.mark_update"),
        ("samplers/slice.py", "SliceSampler._tensor_slices_from_startend"),
    ]:
        runtime = ast.parse(textwrap.dedent(inspect.getsource(plans[qualname]))).body[0]
        assert _method(rb / path, qualname) == ast.dump(runtime), qualname


def test_mark_update_is_the_runtime_function(patched):
    """``TensorStorage.mark_update`` is the runtime's ``mark_update``, its doctest as TorchRL holds it."""
    from torchrl_fixes.fixes import slice_boundary_index

    source = upstream_patches._upstream_text(inspect.getsource(slice_boundary_index.mark_update), "mark_update")
    tensor = patched / upstream_patches.RB / "storages" / "tensor.py"
    assert _method(tensor, "TensorStorage.mark_update") == ast.dump(ast.parse(source).body[0])


def _plan(fix) -> dict:
    """The methods the fix puts in classes; a method it edits (SourceEdits) with its edits alone."""
    replacements = [
        compose_source_edits([r]) if isinstance(r, SourceEdits) else r for r in fix.plan()
    ]
    return {f"{r.owner.__name__}.{r.name}": r.new for r in replacements if isinstance(r.owner, type)}


def test_export_check_names_stale_patches(monkeypatch, rendered, tmp_path, capsys):
    """``export-patches --check`` exits 1 naming each patch that differs or is no longer in the
    series; ``export-patches`` writes the first and removes the second."""
    from devtools.__main__ import main

    monkeypatch.setattr(upstream_patches, "render", lambda: rendered)
    assert main(["export-patches", "--check"]) == 0
    for name in NAMES:
        shutil.copy(SERIES.folder / name, tmp_path / name)
    stale = tmp_path / NAMES[1]
    stale.write_text(stale.read_text().replace("_read_entries", "_read_all", 1))
    (tmp_path / "0009-gone.patch").write_text("")
    capsys.readouterr()
    assert main(["export-patches", "--check", "--patches", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{NAMES[1]}: out of date" in out and "0009-gone.patch: out of date" in out
    assert main(["export-patches", "--patches", str(tmp_path)]) == 0
    assert stale.read_text() == (SERIES.folder / NAMES[1]).read_text()
    assert sorted(p.name for p in tmp_path.glob("*.patch")) == NAMES


def test_no_series_for_the_installed_torchrl_is_one_clear_error(monkeypatch):
    from packaging.version import Version

    monkeypatch.setattr("torchrl_fixes._core.versions.installed_version", lambda name: Version("0.13.3"))
    with pytest.raises(upstream_patches.ExportError) as err:
        upstream_patches.installed_series()
    assert "TorchRL 0.13.3" in str(err.value) and "main" in str(err.value) and "\n" not in str(err.value)
