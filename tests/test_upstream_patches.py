"""The upstream series applies to TorchRL main and carries the runtime fixes' code.

Each patch is applied with ``git apply -p1`` to a copy of the installed TorchRL's
files. The generated patches must be byte for byte what ``export-patches`` writes
from the runtime fixes today; the hand-written one must hold functions with the
same source fingerprints as the runtime fix's. A change to one side without the
other fails.
"""
from __future__ import annotations

import ast
import inspect
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

import torchrl_fixes
from devtools import upstream_patches
from devtools.torchrl_matrix import NIGHTLY_VERSION
from torchrl_fixes._core.source_fingerprint import fingerprint_source, source_fingerprint
from torchrl_fixes._core.versions import installed_version
from torchrl_fixes.fixes import pinned_sample_output as pinned
from torchrl_fixes.fixes.slice_boundary_index import (
    BOUNDARY_INDEX_EDITS,
    INLINE_HOOKS,
    SAMPLE_HOOKS,
    SliceBoundaryIndex,
)

PATCHES = upstream_patches.SERIES[0].folder
# The series, one pull request each, in merge order.
SERIES_FILES = [
    "0001-pinned-sample-output.patch",
    "0002-single-gather.patch",
    "0003-trajectory-order.patch",
    "0004-trajectory-boundaries.patch",
    "0005-storage-boundaries.patch",
    "0006-slice-boundary-index.patch",
    "0007-slice-sample-order.patch",
]

pytestmark = pytest.mark.skipif(
    str(installed_version("torchrl")) != NIGHTLY_VERSION or shutil.which("git") is None,
    reason=f"the series targets TorchRL main as torchrl-nightly {NIGHTLY_VERSION} builds it, "
    "and is applied with git",
)


def _function_source(path: Path, name: str, cls: str | None = None) -> str:
    source = path.read_text()
    body = ast.parse(source).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node)


@pytest.fixture
def patched_torchrl(tmp_path):
    """A copy of the installed TorchRL with every patch applied."""
    tree = tmp_path / "src"
    tree.mkdir()
    upstream_patches.patched_copy(tree)
    return tree


def test_patches_apply_in_order(patched_torchrl):
    """Every patch applies cleanly, in order, to TorchRL main."""
    assert (patched_torchrl / "torchrl/data/replay_buffers/utils.py").is_file()


def test_pinned_sample_output_patch_matches_the_runtime_fix(patched_torchrl):
    """The functions the pinning patch writes are the runtime fix's, fingerprint for fingerprint."""
    utils = patched_torchrl / "torchrl/data/replay_buffers/utils.py"
    tensordict_rb = patched_torchrl / "torchrl/data/replay_buffers/replay_buffers/tensordict.py"
    for name in ("pin_memory_output", "_pin_memory", "_pin_memory_available", "_pin_tensor"):
        assert fingerprint_source(_function_source(utils, name)) == source_fingerprint(
            getattr(pinned, name)
        ), name
    from torchrl.data import TensorDictReplayBuffer

    runtime_sample = pinned._tensordict_replay_buffer_sample(
        torchrl_fixes.get_original(TensorDictReplayBuffer, "sample")
    )
    assert fingerprint_source(
        _function_source(tensordict_rb, "sample", cls="TensorDictReplayBuffer")
    ) == source_fingerprint(runtime_sample)


def test_warning_differs_only_in_category(patched_torchrl):
    """The upstream warning says the same words as the runtime one, as a UserWarning."""
    upstream = _function_source(
        patched_torchrl / "torchrl/data/replay_buffers/utils.py", "_warn_pin_memory_unavailable"
    )
    runtime = inspect.getsource(pinned._warn_pin_memory_unavailable)

    def message(source):
        call = next(
            n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
        )
        return call.args[0].value

    assert message(upstream) == message(runtime)
    assert "category=UserWarning" in upstream
    assert issubclass(torchrl_fixes.PinMemoryUnavailableWarning, UserWarning)


def test_generated_patches_are_what_the_fixes_write():
    """patches/main/ is exactly what export-patches writes from the runtime fixes and upstream/."""
    rendered = upstream_patches.render()
    assert list(rendered) == [
        *SERIES_FILES,
    ]
    for name, text in rendered.items():
        assert (PATCHES / name).read_text() == text, f"{name} is out of date: run export-patches"


def _statements(nodes) -> list[str]:
    return [ast.dump(node) for node in nodes]


def _parsed(statements) -> list[str]:
    return _statements(ast.parse("\n".join(statements)).body)


def test_inline_hooks_are_what_the_runtime_wrappers_run():
    """Each method the slice patch edits runs, around the stock code, what its runtime wrapper runs."""
    with torchrl_fixes.disabled():  # planned against stock code, as when applied
        replacements = SliceBoundaryIndex().plan()
    wrappers = {
        # a static method's replacement is the staticmethod around the wrapper
        f"{rep.owner.__name__}.{rep.name}": getattr(rep.new, "__func__", rep.new)
        for rep in replacements
    }
    hooks = {**INLINE_HOOKS, **SAMPLE_HOOKS}
    edited = {qualname for _, qualname in BOUNDARY_INDEX_EDITS}
    assert {qualname for _, qualname in hooks} == set(wrappers) - edited
    for (_, qualname), (before, after) in hooks.items():
        # the code object: inspect would follow functools.wraps to the stock method
        body = ast.parse(textwrap.dedent(inspect.getsource(wrappers[qualname].__code__))).body[0].body
        call = next(
            i for i, node in enumerate(body)
            if any(isinstance(n, ast.Name) and n.id == "original" for n in ast.walk(node))
        )
        tail = body[call + 1 :]
        if tail and isinstance(tail[-1], ast.Return):
            tail = tail[:-1]  # hands back what the stock method returned
        assert _statements(body[:call]) == _parsed(before), qualname
        assert _statements(tail) == _parsed(after), qualname


def test_patch_edits_only_add_the_hooks(patched_torchrl):
    """With the inline statements taken out, every method the slice patch edits is the stock method."""
    import torchrl

    site = Path(torchrl.__file__).parent
    for (path, qualname), (before, after) in {**INLINE_HOOKS, **SAMPLE_HOOKS}.items():
        cls, name = qualname.split(".")
        hooks = set(_parsed(before) + _parsed(after))
        patched_file = patched_torchrl / "torchrl/data/replay_buffers" / path
        stock_file = site / "data/replay_buffers" / path
        patched = _methods(patched_file, cls, name)
        stock = _methods(stock_file, cls, name)
        assert len(patched) == len(stock) >= 1, qualname
        for patched_node, stock_node in zip(patched, stock):
            kept = [n for n in patched_node.body if ast.dump(n) not in hooks]
            assert len(kept) == len(patched_node.body) - len(hooks), qualname
            assert _statements(kept) == _statements(stock_node.body), qualname


def test_edited_methods_are_what_the_runtime_derives(patched_torchrl):
    """A method the series edits in place is, in the patched source, the runtime fix's
    method: the stock source with the same edits (patching.derive_from_source)."""
    with torchrl_fixes.disabled():  # planned against stock code, as when applied
        derived = {f"{rep.owner.__name__}.{rep.name}": rep.new for rep in SliceBoundaryIndex().plan()}
    for (path, qualname), _ in BOUNDARY_INDEX_EDITS.items():
        cls, name = qualname.split(".")
        (patched,) = _methods(patched_torchrl / "torchrl/data/replay_buffers" / path, cls, name)
        runtime = ast.parse(textwrap.dedent(inspect.getsource(derived[qualname]))).body[0]
        assert ast.dump(patched) == ast.dump(runtime), qualname


def _methods(path: Path, cls: str, name: str) -> list[ast.FunctionDef]:
    body = next(
        n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls
    ).body
    return [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]


@pytest.mark.parametrize("name", SERIES_FILES)
def test_each_patch_needs_only_what_it_declares(name, tmp_path):
    """A patch applies to TorchRL main with only the patches its header names applied first."""
    import torchrl

    site = Path(torchrl.__file__).parent.parent
    header = (PATCHES / name).read_text().split("\ndiff --git ", 1)[0]
    declared = header.split("Depends on: ", 1)[1].split(".", 1)[0]
    needed = [] if declared == "nothing" else [n.strip() for n in declared.split(",")]
    tree = tmp_path / "src"
    shutil.copytree(site / "torchrl", tree / "torchrl", ignore=shutil.ignore_patterns("__pycache__"))
    for number in needed:
        (patch,) = PATCHES.glob(f"{number}-*.patch")
        upstream_patches._git_apply(tree, patch)
    result = subprocess.run(
        ["git", "apply", "--check", "-p1", str(PATCHES / name)],
        cwd=tree,
        capture_output=True,
        text=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)},
    )
    assert result.returncode == 0, result.stderr


def test_patched_source_holds_the_runtime_modules(patched_torchrl):
    """The modules the slice patch adds are the runtime package's, imports aside."""
    from torchrl_fixes.fixes.slice_boundary_index import (
        boundary_cache,
        slice_boundaries,
        slice_sampling,
        storage_boundaries,
        trajectory_boundaries,
    )

    rb = patched_torchrl / "torchrl/data/replay_buffers"
    for module in (trajectory_boundaries, storage_boundaries, slice_boundaries, slice_sampling):
        dotted = upstream_patches._torchrl_module(module.__name__)
        added = patched_torchrl / (dotted.replace(".", "/") + ".py")
        runtime_text = upstream_patches._without_release_lines(
            Path(module.__file__).read_text(), module.__name__
        )
        runtime = _definitions_without_docstrings(runtime_text)
        upstream = _definitions_without_docstrings(added.read_text())
        assert upstream == runtime, module.__name__
    # the boundary cache's functions, in utils.py beside the cache
    runtime = _definitions_without_docstrings(Path(boundary_cache.__file__).read_text())
    utils = _definitions_without_docstrings((rb / "utils.py").read_text())
    assert runtime and all(utils.get(name) == dump for name, dump in runtime.items())


def _definitions_without_docstrings(source: str) -> dict[str, str]:
    """Top-level definitions, dumped without docstrings (their doctests import differently)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return {n.name: ast.dump(n) for n in tree.body if hasattr(n, "name")}


def test_export_check_names_a_stale_patch(tmp_path, capsys):
    """``export-patches --check`` exits 0 on patches/ and 1, naming the file, on a stale copy."""
    from devtools.__main__ import main

    assert main(["export-patches", "--check"]) == 0
    for patch in PATCHES.glob("*.patch"):
        shutil.copy(patch, tmp_path / patch.name)
    stale = tmp_path / "0002-single-gather.patch"
    stale.write_text(stale.read_text().replace("_read_entries", "_read_all", 1))
    capsys.readouterr()
    assert main(["export-patches", "--check", "--patches", str(tmp_path)]) == 1
    assert "0002-single-gather.patch: out of date" in capsys.readouterr().out
    assert main(["export-patches", "--patches", str(tmp_path)]) == 0
    assert stale.read_text() == (PATCHES / stale.name).read_text()


def test_patched_copy_applies_every_patch(tmp_path):
    """``patched-copy`` leaves a TorchRL tree holding every patch, and names the stock one."""
    stock = upstream_patches.patched_copy(tmp_path)
    assert (tmp_path / "torchrl/data/replay_buffers/storage_boundaries.py").is_file()
    assert "_read_entries" in (tmp_path / "torchrl/data/replay_buffers/samplers/slice.py").read_text()
    assert not (stock / "data/replay_buffers/storage_boundaries.py").exists()
    with pytest.raises(upstream_patches.ExportError, match="already exists"):
        upstream_patches.patched_copy(tmp_path)


def test_patched_copy_inside_a_git_work_tree(tmp_path):
    """A copy made inside a repository (nox's .nox/ folder) still gets every patch."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    dest = tmp_path / ".nox" / "upstream" / "tmp"
    dest.mkdir(parents=True)
    upstream_patches.patched_copy(dest)
    assert (dest / "torchrl/data/replay_buffers/storage_boundaries.py").is_file()
    assert "_read_entries" in (dest / "torchrl/data/replay_buffers/samplers/slice.py").read_text()


def test_the_series_lists_its_patches_in_order():
    """patches/main/ holds the whole series, 0001 included, in merge order."""
    (series,) = upstream_patches.SERIES
    assert upstream_patches.installed_series() is series
    listed = upstream_patches.series_patches(series)
    assert [p.name for p in listed] == [
        *SERIES_FILES,
    ]
    assert series.torchrl == NIGHTLY_VERSION


def test_every_upstream_file_goes_into_one_patch(monkeypatch, tmp_path):
    """A file under upstream/ that no patch lists stops the export, naming the file."""
    assert upstream_patches.unlisted_upstream_files() == []
    (tmp_path / "test" / "rb").mkdir(parents=True)
    (tmp_path / "test" / "rb" / "test_new.py").write_text("def test_it():\n    pass\n")
    monkeypatch.setattr(upstream_patches, "UPSTREAM_DIR", tmp_path)
    with pytest.raises(upstream_patches.ExportError, match="upstream/test/rb/test_new.py"):
        upstream_patches.render()


def test_upstream_files_import_torchrl_not_the_runtime(monkeypatch, tmp_path):
    """An upstream file's imports of the runtime's modules are TorchRL's in the patch."""
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_x.py").write_text(
        "from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import TrajectoryOrder\n"
    )
    monkeypatch.setattr(upstream_patches, "UPSTREAM_DIR", tmp_path)
    assert upstream_patches.upstream_file_text("test/test_x.py") == (
        "from torchrl.data.replay_buffers.trajectory_order import TrajectoryOrder\n"
    )
    (tmp_path / "test" / "test_x.py").write_text("import torchrl_fixes\n")
    with pytest.raises(upstream_patches.ExportError, match="still names torchrl_fixes"):
        upstream_patches.upstream_file_text("test/test_x.py")


def test_no_series_for_the_installed_torchrl_is_one_clear_error(monkeypatch):
    """export-patches with a TorchRL no series targets: one line naming it and the series."""
    monkeypatch.setattr("torchrl_fixes._core.versions.installed_version", lambda name: Version("0.13.3"))
    with pytest.raises(upstream_patches.ExportError) as excinfo:
        upstream_patches.installed_series()
    message = str(excinfo.value)
    assert "TorchRL 0.13.3" in message and "main" in message
    assert "\n" not in message
