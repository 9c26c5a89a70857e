"""The upstream series in ``patches/main/``, written from the runtime fixes' own code.

``python -m devtools export-patches`` reads the installed TorchRL's source (the
pinned ``torchrl-nightly`` build of TorchRL main, untouched), applies the edits
listed here file by file, and writes one unified diff per pull request. The edits
take their code from the runtime fixes: modules are copied (imports rewritten to
TorchRL's paths), functions are the runtime functions' source, and the statements
put inline into TorchRL's methods are the ones the runtime wrappers run
(:data:`torchrl_fixes.fixes.slice_boundary_index.INLINE_HOOKS`). So the diffs and the
runtime fixes cannot say different things: ``export-patches --check`` fails when the
files in ``patches/main/`` are not what the fixes write today.

Each pull request also adds its tests and benchmarks: the files under ``upstream/``
of this repository, at the paths they take in pytorch/rl (``upstream/test/rb/x.py``
becomes ``test/rb/x.py``), listed per patch in :data:`UPSTREAM_FILES`. They run
here against the runtime fix (``upstream/conftest.py``) and go into the diff as
they are, with their imports of the runtime's new modules pointed at TorchRL's.

The configurations a patch leaves to the code it replaces are rendered from the
fix's declaration (:attr:`torchrl_fixes.registry.Fix.fallbacks`), as ``status()``
prints them.

``0001-pinned-sample-output.patch`` is written by hand, apart from its test files;
its functions are checked against the runtime fix by source fingerprint
(``tests/test_upstream_patches.py``). The patches are applied in order, each to the
source the earlier ones produced.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from devtools.review_hooks import FORMATTER_REQUIREMENTS, UPSTREAM_PYPROJECT
from devtools.torchrl_matrix import NIGHTLY, NIGHTLY_VERSION

RB = "torchrl/data/replay_buffers"
PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"


@dataclass(frozen=True)
class Series:
    """One series of upstream patches: the TorchRL source it applies to, and its files.

    Attributes:
        name (str): how the series is named (``"main"``).
        torchrl (str): the installed TorchRL version the series is written against.
        label (str): that source, in words, for the patch headers.
        folder (Path): where its generated patches live.
        hand_written (tuple of Path): patches written by hand, applied first.
    """

    name: str
    torchrl: str
    label: str
    folder: Path
    hand_written: tuple[Path, ...]


# The series: pull requests against TorchRL main, as the pinned nightly builds it.
# The pinning patch is written by hand, apart from its test files.
_MAIN = PATCHES_DIR / "main"
SERIES = (
    Series(
        "main",
        NIGHTLY_VERSION,
        f"torchrl main (as built by {NIGHTLY[0]})",
        _MAIN,
        (_MAIN / "0001-pinned-sample-output.patch",),
    ),
)

# The files each pull request adds outside torchrl/ (its tests and benchmarks), by
# patch number: paths in pytorch/rl, kept in this repository under upstream/.
UPSTREAM_DIR = Path(__file__).resolve().parent.parent / "upstream"
UPSTREAM_FILES: dict[int, tuple[str, ...]] = {
    1: ("test/rb/test_rb_pin_memory.py",),
    2: ("test/rb/test_slice_sampler_info.py",),
    3: ("test/rb/test_trajectory_order.py",),
    4: ("test/rb/test_trajectory_boundaries.py",),
    5: ("test/rb/test_storage_boundaries.py",),
    6: (
        "test/rb/test_slice_sampler_boundary_cache.py",
        "benchmarks/test_slice_sampler_online_benchmark.py",
    ),
    7: ("test/rb/test_slice_sampler_draw_by_rank.py",),
}
# upstream/ test files import the runtime's new modules; in TorchRL they live here.
_UPSTREAM_IMPORT = re.compile(r"^from torchrl_fixes\.(\w+) import", re.MULTILINE)

_LICENSE = """\
# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""

# The runtime's boundary cache: TorchRL's own, or its backport before TorchRL 0.14.
_CACHE_IMPORT = """\
try:
    from torchrl.data.replay_buffers.utils import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
except ImportError:  # TorchRL before 0.14
    from torchrl_fixes.mutation_revision import (
        _REPLAY_BOUNDARY_CACHE,
        _REPLAY_BOUNDARY_CACHE_LOCK,
    )
"""
_RB_MODULE = RB.replace("/", ".")

# Runtime module text -> TorchRL module text. Every rewrite a module names must apply.
_MODULE_REWRITES = (
    ("import logging\n", ""),
    ('\nlogger = logging.getLogger("torchrl_fixes")\n', ""),
    (
        "from torchrl_fixes.storage_boundaries import",
        f"from torchrl._utils import logger\nfrom {_RB_MODULE}.storage_boundaries import",
    ),
    ("from torchrl_fixes.trajectory_boundaries import", f"from {_RB_MODULE}.trajectory_boundaries import"),
    ("from torchrl_fixes.trajectory_order import", f"from {_RB_MODULE}.trajectory_order import"),
    ("from torchrl_fixes.slice_boundaries import", f"from {_RB_MODULE}.slice_boundaries import"),
    (
        _CACHE_IMPORT,
        f"from {_RB_MODULE}.utils import _REPLAY_BOUNDARY_CACHE, _REPLAY_BOUNDARY_CACHE_LOCK\n",
    ),
    (">>> import torch, torchrl_fixes\n", ">>> import torch\n"),
)


class ExportError(Exception):
    """The installed source is not the one the edits are written against."""


@dataclass(frozen=True)
class NewModule:
    """A module copied from the runtime package into TorchRL.

    Args:
        path (str): where it goes, relative to the repository root.
        source (str): the runtime module's dotted name.
        rewrites (tuple of str): the old texts of :data:`_MODULE_REWRITES` that must apply.
    """

    path: str
    source: str
    rewrites: tuple[str, ...] = ()


@dataclass(frozen=True)
class InlineStatements:
    """Statements written at the start and end of a method's body (before a final ``return``)."""

    path: str
    qualname: str
    before: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class ReplaceFunction:
    """A function or method of TorchRL replaced by a runtime function, under TorchRL's name.

    The runtime function's docstring says what it replaces; the stock docstring,
    if any, is kept instead.
    """

    path: str
    qualname: str
    new: Callable


@dataclass(frozen=True)
class AddFunctions:
    """Runtime functions added to a TorchRL module, before one of its top-level definitions."""

    path: str
    before: str
    functions: tuple[Callable, ...]


@dataclass(frozen=True)
class AddImport:
    """Names added to a module's ``from <module> import ...`` statement (made if missing)."""

    path: str
    module: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class UpstreamPatch:
    """One upstream diff: the runtime fix it comes from, its header text, the patches it
    needs, its edits, and its name where the fix gives more than one patch."""

    number: int
    fix: str
    header: str
    depends_on: tuple[int, ...]
    edits: tuple
    name: str | None = None

    @property
    def filename(self) -> str:
        return f"{self.number:04d}-{(self.name or self.fix).replace('_', '-')}.patch"


# ---------------------------------------------------------------------------
# Text edits
# ---------------------------------------------------------------------------


def _find(tree: ast.Module, qualname: str) -> list[ast.AST]:
    owner, _, name = qualname.rpartition(".")
    body = tree.body
    if owner:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        if len(classes) != 1:
            raise ExportError(f"class {owner} not found once")
        body = classes[0].body
    found = [
        n
        for n in body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
    ]
    if not found:
        raise ExportError(f"{qualname} not found")
    return found


def _indent(lines: list[str], col: int) -> list[str]:
    return [(" " * col + line) if line.strip() else "\n" for line in lines]


def _statement_lines(statements: tuple[str, ...]) -> list[str]:
    return [line + "\n" for statement in statements for line in statement.split("\n")]


def _function_source(func: Callable, name: str | None = None, docstring: list[str] | None = None) -> list[str]:
    """``func``'s source, dedented, renamed to ``name``, with ``docstring`` lines for its own."""
    source = textwrap.dedent(inspect.getsource(func))
    lines = source.splitlines(keepends=True)
    node = ast.parse(source).body[0]
    if name is not None and node.name != name:
        def_line = node.lineno - 1
        lines[def_line] = lines[def_line].replace(f"def {node.name}(", f"def {name}(", 1)
    if docstring is not None:
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            indent = " " * first.col_offset
            lines[first.lineno - 1 : first.end_lineno] = _indent(
                [line.removeprefix(" " * _docstring_col(docstring)) for line in docstring], len(indent)
            ) if docstring else []
    return lines


def _docstring_col(lines: list[str]) -> int:
    return min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)


def _edits_for(text: str, edit) -> list[tuple[int, int, list[str]]]:
    """``(start, end, new_lines)``: lines ``start:end`` (0-based) of ``text`` become ``new_lines``."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    if isinstance(edit, InlineStatements):
        out = []
        for node in _find(tree, edit.qualname):
            body = node.body
            col = body[0].col_offset
            has_doc = (
                isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            )
            if edit.before:
                at = body[0].end_lineno if has_doc else body[0].lineno - 1
                out.append((at, at, _indent(_statement_lines(edit.before), col)))
            if edit.after:
                last = body[-1]
                at = last.lineno - 1 if isinstance(last, ast.Return) else last.end_lineno
                out.append((at, at, _indent(_statement_lines(edit.after), col)))
        return out
    if isinstance(edit, ReplaceFunction):
        (node,) = _find(tree, edit.qualname)
        stock_doc: list[str] = []
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            stock_doc = lines[first.lineno - 1 : first.end_lineno]
        new = _function_source(edit.new, node.name, stock_doc)
        return [(node.lineno - 1, node.end_lineno, _indent(new, node.col_offset))]
    if isinstance(edit, AddFunctions):
        (node,) = _find(tree, edit.before)
        block: list[str] = []
        for func in edit.functions:
            block += _function_source(func) + ["\n", "\n"]
        at = (node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno) - 1
        return [(at, at, block)]
    if isinstance(edit, AddImport):
        level = len(edit.module) - len(edit.module.lstrip("."))
        module = edit.module.lstrip(".")
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
        existing = [n for n in imports if n.module == module and n.level == level]
        if existing:
            node = existing[0]
            names = [a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names]
            names += [n for n in edit.names if n not in names]
            return [(node.lineno - 1, node.end_lineno, _import_lines(edit.module, names))]
        torchrl = [n for n in imports if n.level == 0 and (n.module or "").startswith("torchrl")]
        later = [n for n in torchrl if n.module.lower() > module.lower()]
        if later:
            at = later[0].lineno - 1
        else:
            anchor = torchrl[-1] if torchrl else [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))][-1]
            at = anchor.end_lineno
        return [(at, at, _import_lines(edit.module, list(edit.names)))]
    raise TypeError(f"unknown edit {edit!r}")


def _import_lines(module: str, names: list[str]) -> list[str]:
    names = sorted(dict.fromkeys(names), key=str.lower)
    one = f"from {module} import {', '.join(names)}\n"
    if len(one) <= 89:
        return [one]
    return [f"from {module} import (\n", *[f"    {name},\n" for name in names], ")\n"]


def _apply_edits(text: str, edits: list) -> str:
    changes = [change for edit in edits for change in _edits_for(text, edit)]
    changes.sort(key=lambda c: (c[0], c[1]), reverse=True)
    lines = text.splitlines(keepends=True)
    floor = len(lines) + 1
    for start, end, new in changes:
        if end > floor:
            raise ExportError("two edits overlap")
        lines[start:end] = new
        floor = start
    return "".join(lines)


def _module_text(new: NewModule) -> str:
    module = importlib.import_module(new.source)
    text = Path(module.__file__).read_text()
    for old, replacement in _MODULE_REWRITES:
        if old in new.rewrites:
            if old not in text:
                raise ExportError(f"{new.source}: {old!r} not found")
            text = text.replace(old, replacement)
    for leftover in ("torchrl_fixes",):
        if leftover in text:
            line = next(line for line in text.splitlines() if leftover in line)
            raise ExportError(f"{new.source} still names {leftover}: {line.strip()!r}")
    return _LICENSE + text


def upstream_file_text(path: str) -> str:
    """The text a pull request adds at ``path`` (in pytorch/rl) from ``upstream/<path>``."""
    source = UPSTREAM_DIR / path
    if not source.is_file():
        raise ExportError(f"{path} is listed in UPSTREAM_FILES but upstream/{path} does not exist")
    text = _UPSTREAM_IMPORT.sub(rf"from {_RB_MODULE}.\1 import", source.read_text())
    if "torchrl_fixes" in text:
        line = next(line for line in text.splitlines() if "torchrl_fixes" in line)
        raise ExportError(f"upstream/{path} still names torchrl_fixes: {line.strip()!r}")
    return text


def unlisted_upstream_files() -> list[str]:
    """Files under ``upstream/`` that no patch of :data:`UPSTREAM_FILES` adds."""
    listed = {path for paths in UPSTREAM_FILES.values() for path in paths}
    present = {
        str(path.relative_to(UPSTREAM_DIR))
        for path in UPSTREAM_DIR.rglob("*.py")
        if path.name != "conftest.py" or path.parent != UPSTREAM_DIR
    }
    return sorted(present - listed)


def _sections(diff: str) -> tuple[str, dict[str, str]]:
    """A patch's header, and its per-file sections by the path they write (or delete)."""
    head, *parts = re.split(r"^(?=diff --git )", diff, flags=re.MULTILINE)
    sections = {}
    for part in parts:
        written = _paths_written(part) or [part.split("\n", 1)[0].split(" a/", 1)[1].split(" b/")[0]]
        sections[written[0]] = part
    return head, sections


# ---------------------------------------------------------------------------
# The patches
# ---------------------------------------------------------------------------


def _names_from(module_name: str, statements) -> tuple[str, ...]:
    """The names ``statements`` use that ``module_name`` defines."""
    module = importlib.import_module(module_name)
    used = {
        node.id
        for statement in statements
        for node in ast.walk(ast.parse(statement))
        if isinstance(node, ast.Name)
    }
    return tuple(sorted(name for name in used if hasattr(module, name)))


def _hook_edits(hooks: dict) -> list:
    """The statements of ``hooks`` written into TorchRL's methods, and the imports they need."""
    from torchrl_fixes.fixes.slice_boundary_index import hook_module

    edits: list = []
    imports: dict[tuple[str, str], list[str]] = {}
    for (path, qualname), (before, after) in hooks.items():
        edits.append(InlineStatements(f"{RB}/{path}", qualname, before, after))
        module = hook_module((*before, *after)).__name__
        imports.setdefault((path, module), []).extend((*before, *after))
    for (path, module), statements in imports.items():
        names = _names_from(module, statements)
        if not names:
            continue
        target = f"{_RB_MODULE}.{module.rpartition('.')[2]}"
        edits.append(AddImport(f"{RB}/{path}", target, names))
    return edits


def patches() -> list[UpstreamPatch]:
    """The generated patches, in order."""
    import torchrl_fixes
    from torchrl_fixes.fixes import single_gather
    from torchrl_fixes.fixes.slice_boundary_index import (
        INLINE_HOOKS,
        SAMPLE_HOOKS,
        SAMPLE_UNIT_HOOKS,
        _sample_unit_replacements,
    )
    from torchrl_fixes.patching import get_original

    with torchrl_fixes.disabled():  # the fixes are planned against stock code
        hooks = dict(INLINE_HOOKS)
        if _sample_unit_replacements():  # TorchRL main: its sample units read the index too
            hooks.update(SAMPLE_UNIT_HOOKS)
        # what the runtime fix puts in place of the method that builds the slice info
        finalize_index = {
            rep.name: rep.new for rep in single_gather.SingleGather().plan()
        }["_finalize_index"]

    # The hooks by the pull request that writes them: the storage's side records its
    # writes (0005), the sampler's side reads the index (0006).
    storage_hooks = {key: hook for key, hook in hooks.items() if key[0].startswith("storages/")}
    sampler_hooks = {key: hook for key, hook in hooks.items() if key not in storage_hooks}
    to_torchrl = (
        "import logging\n",
        '\nlogger = logging.getLogger("torchrl_fixes")\n',
        ">>> import torch, torchrl_fixes\n",
    )
    single_gather_edits = (
        AddFunctions(
            f"{RB}/samplers/slice.py",
            "SliceSampler",
            (
                single_gather._defined_by,
                single_gather._reads_tensordict,
                single_gather._read_entries,
                single_gather._integer_index_batch_size,
                single_gather._fixed_length_info,
            ),
        ),
        AddImport(f"{RB}/samplers/slice.py", "tensordict", ("TensorDict",)),
        AddImport(
            f"{RB}/samplers/slice.py",
            "torchrl.data.replay_buffers.storages",
            ("LazyMemmapStorage", "LazyTensorStorage"),
        ),
        ReplaceFunction(f"{RB}/samplers/slice.py", "SliceSampler._finalize_index", finalize_index),
        ReplaceFunction(
            f"{RB}/samplers/prioritized_slice.py",
            "PrioritizedSliceSampler.sample",
            single_gather._prioritized_slice_sample,
        ),
        AddImport(f"{RB}/samplers/prioritized_slice.py", ".slice", ("_read_entries",)),
        AddFunctions(
            f"{RB}/samplers/streaming_slice.py",
            "StreamingSliceSampler",
            (single_gather._read_written_entries,),
        ),
        AddImport(
            f"{RB}/samplers/streaming_slice.py", ".slice", ("_read_entries", "_reads_tensordict")
        ),
        ReplaceFunction(
            f"{RB}/samplers/streaming_slice.py",
            "StreamingSliceSampler.mark_update",
            single_gather._streaming_mark_update(
                get_original(single_gather.StreamingSliceSampler, "mark_update")
            ),
        ),
    )
    return [
        UpstreamPatch(2, "single_gather", SINGLE_GATHER_HEADER, (), single_gather_edits),
        UpstreamPatch(
            3,
            "slice_boundary_index",
            TRAJECTORY_ORDER_HEADER,
            (),
            (NewModule(f"{RB}/trajectory_order.py", "torchrl_fixes.trajectory_order"),),
            name="trajectory_order",
        ),
        UpstreamPatch(
            4,
            "slice_boundary_index",
            TRAJECTORY_BOUNDARIES_HEADER,
            (3,),
            (
                NewModule(
                    f"{RB}/trajectory_boundaries.py",
                    "torchrl_fixes.trajectory_boundaries",
                    rewrites=("from torchrl_fixes.trajectory_order import",),
                ),
            ),
            name="trajectory_boundaries",
        ),
        UpstreamPatch(
            5,
            "slice_boundary_index",
            STORAGE_BOUNDARIES_HEADER,
            (3, 4),
            (
                NewModule(
                    f"{RB}/storage_boundaries.py",
                    "torchrl_fixes.storage_boundaries",
                    rewrites=("from torchrl_fixes.trajectory_boundaries import", _CACHE_IMPORT),
                ),
                *_hook_edits(storage_hooks),
            ),
            name="storage_boundaries",
        ),
        UpstreamPatch(
            6,
            "slice_boundary_index",
            SLICE_BOUNDARY_INDEX_HEADER,
            (2, 3, 4, 5),
            (
                NewModule(
                    f"{RB}/slice_boundaries.py",
                    "torchrl_fixes.slice_boundaries",
                    rewrites=(
                        *to_torchrl,
                        "from torchrl_fixes.storage_boundaries import",
                        "from torchrl_fixes.trajectory_boundaries import",
                        "from torchrl_fixes.slice_boundaries import",
                    ),
                ),
                *_hook_edits(sampler_hooks),
            ),
        ),
        UpstreamPatch(
            7,
            "slice_boundary_index",
            SLICE_SAMPLE_ORDER_HEADER,
            (2, 3, 4, 5, 6),
            (
                NewModule(
                    f"{RB}/slice_sampling.py",
                    "torchrl_fixes.slice_sampling",
                    rewrites=(
                        "from torchrl_fixes.slice_boundaries import",
                        "from torchrl_fixes.trajectory_boundaries import",
                    ),
                ),
                *_hook_edits(SAMPLE_HOOKS),
            ),
            name="slice_sample_order",
        ),
    ]


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def installed_series() -> Series:
    """The series written against the installed TorchRL.

    Raises:
        ExportError: no series targets the installed TorchRL.
    """
    from torchrl_fixes.versions import installed_version

    version = str(installed_version("torchrl"))
    for series in SERIES:
        if series.torchrl == version:
            return series
    known = ", ".join(f"{s.name} ({s.label})" for s in SERIES)
    raise ExportError(f"no series of patches/ targets TorchRL {version}; the series: {known}")


def installed_torchrl_root() -> Path:
    """The directory holding the installed ``torchrl`` package, which a series targets."""
    import torchrl

    installed_series()
    return Path(torchrl.__file__).parent.parent


def _git_diff(before: dict[str, str], after: dict[str, str]) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        for side, files in (("a", before), ("b", after)):
            (Path(tmp) / side).mkdir()
            for path, text in files.items():
                target = Path(tmp) / side / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
                target.chmod(0o644)
        result = subprocess.run(
            ["git", "-c", "core.quotepath=off", "diff", "--no-index", "--no-prefix", "--no-color",
             "--no-ext-diff", "--full-index", "a", "b"],
            cwd=tmp, capture_output=True, text=True,
        )
    if result.returncode not in (0, 1):
        raise ExportError(f"git diff failed: {result.stderr.strip()}")
    # The trees are a/ and b/: their names are the a/ and b/ prefixes of the paths.
    return result.stdout


def _git_apply(root: Path, patch: Path) -> None:
    """``git apply -p1 patch`` in ``root``, as a folder of files and never as part of a repository.

    Inside a git work tree, ``git apply`` takes paths from the top of the tree and
    skips those outside the current folder without a word: the search for a
    repository must stop at ``root``.
    """
    root = Path(root).resolve()
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent)}
    result = subprocess.run(
        ["git", "apply", "-p1", str(Path(patch).resolve())],
        cwd=root, capture_output=True, text=True, env=env,
    )
    if result.returncode:
        raise ExportError(f"{Path(patch).name} does not apply: {result.stderr.strip()}")


def render(site: Path | None = None) -> dict[str, str]:
    """Patch file name -> its text, for every patch of the installed TorchRL's series.

    A hand-written patch keeps its header and library diff as written; the files it
    adds from ``upstream/`` are written afresh, as they are for the generated ones.
    """
    site = site or installed_torchrl_root()
    series = installed_series()
    unlisted = unlisted_upstream_files()
    if unlisted:
        raise ExportError(f"no patch adds upstream/{unlisted[0]}: list it in UPSTREAM_FILES")
    files: dict[str, str] = {}  # repository path -> text, as the earlier patches leave it
    rendered: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        for patch in series.hand_written:
            head, sections = _sections(patch.read_text())
            library = {path: text for path, text in sections.items() if path.startswith("torchrl/")}
            for path in library:
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(site / path, tree / path)
            library_diff = head + "".join(library.values())
            (tree / "library.patch").write_text(library_diff)
            _git_apply(tree, tree / "library.patch")
            files.update({path: (tree / path).read_text() for path in library})
            rendered[patch.name] = library_diff + _upstream_diff(_patch_number(patch.name))

    def current(path: str) -> str | None:
        if path in files:
            return files[path]
        source = site / path
        return source.read_text() if source.is_file() else None

    for patch in patches():
        before: dict[str, str] = {}
        after: dict[str, str] = {}
        by_path: dict[str, list] = {}
        for edit in patch.edits:
            by_path.setdefault(edit.path, []).append(edit)
        for path, edits in by_path.items():
            text = current(path)
            new_modules = [e for e in edits if isinstance(e, NewModule)]
            if new_modules:
                if text is not None:
                    raise ExportError(f"{path} already exists in {series.label}")
                after[path] = _module_text(new_modules[0])
                continue
            if text is None:
                raise ExportError(f"{path} is not in {series.label}")
            before[path] = text
            after[path] = _apply_edits(text, edits)
        after.update(_formatted({path: text for path, text in after.items() if path.endswith(".py")}))
        files.update(after)
        after.update({path: upstream_file_text(path) for path in UPSTREAM_FILES[patch.number]})
        rendered[patch.filename] = _header(patch, series) + "\n" + _git_diff(before, after)
    return dict(sorted(rendered.items()))


def _formatted(files: dict[str, str]) -> dict[str, str]:
    """``files`` (repository path -> text) as upstream's ufmt (black + usort) writes them.

    The files are laid out at their paths beside usort's configuration, as in a
    pytorch/rl checkout, so that the formatter sorts their imports as upstream's
    pre-commit does.
    """
    if not files:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text(UPSTREAM_PYPROJECT)
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        result = subprocess.run(
            [sys.executable, "-m", "ufmt", "format", *files], cwd=root, capture_output=True, text=True
        )
        if result.returncode:
            needs = " ".join(FORMATTER_REQUIREMENTS)
            raise ExportError(f"upstream's formatter did not run (pip install {needs}): "
                              + (result.stderr.strip().splitlines() or ["no output"])[-1])
        return {path: (root / path).read_text() for path in files}


def _patch_number(filename: str) -> int:
    return int(filename.split("-", 1)[0])


def _upstream_diff(number: int) -> str:
    """The diff that adds patch ``number``'s files from ``upstream/``."""
    paths = UPSTREAM_FILES[number]
    return _git_diff({}, {path: upstream_file_text(path) for path in paths}) if paths else ""


FALLBACKS = "{fallbacks}"


def fallbacks_text(fix: str, indent: int = 4, width: int = 80) -> str:
    """The fix's declared fallbacks (:attr:`torchrl_fixes.registry.Fix.fallbacks`), wrapped."""
    from torchrl_fixes.fixes import ALL_FIXES

    declared = next(f for f in ALL_FIXES if f.name == fix).fallbacks
    if not declared:
        raise ExportError(f"{fix} declares no fallbacks for its patch header")
    return textwrap.fill(
        declared + ".", width=width, initial_indent=" " * indent, subsequent_indent=" " * indent
    )


def _header(patch: UpstreamPatch, series: Series) -> str:
    depends = ", ".join(f"{n:04d}" for n in patch.depends_on) or "nothing"
    header = patch.header
    if FALLBACKS in header:
        header = header.replace(FALLBACKS, fallbacks_text(patch.fix))
    return (
        header.rstrip("\n")
        + "\n\n"
        + f"Applies to: {series.label}, with `git apply -p1` from the repository root,\n"
        + "  after the patches before it.\n"
        + f"Depends on: {depends}.\n"
        + _tests_line(patch.number)
    )


def _tests_line(number: int) -> str:
    """The header line naming the test and benchmark files a patch adds."""
    paths = UPSTREAM_FILES[number]
    return f"Tests (in this diff): {', '.join(paths)}.\n" if paths else ""


def series_patches(series: Series, folder: Path | None = None) -> list[Path]:
    """Every patch of ``series``, in the order they apply (``folder`` replaces its own)."""
    folder = Path(folder) if folder is not None else series.folder
    return sorted(folder.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def patched_copy(dest: Path, patches_dir: Path | None = None) -> Path:
    """Copies the installed ``torchrl`` package into ``dest`` and applies its series, in order.

    Args:
        dest (Path): the folder to copy ``torchrl`` into.
        patches_dir (Path, optional): a folder to take the generated patches from
            instead of the series' own.

    Returns:
        The untouched installed package directory (the stock source).
    """
    site = installed_torchrl_root()
    target = Path(dest) / "torchrl"
    if target.exists():
        raise ExportError(f"{target} already exists")
    shutil.copytree(site / "torchrl", target, ignore=shutil.ignore_patterns("__pycache__"))
    for patch in series_patches(installed_series(), patches_dir):
        _git_apply(Path(dest), patch)
        for path in _paths_written(patch.read_text()):
            written, stock = Path(dest) / path, site / path
            if not written.is_file() or (stock.is_file() and written.read_bytes() == stock.read_bytes()):
                raise ExportError(f"{patch.name} left {path} as it was")
    return site / "torchrl"


def _paths_written(diff: str) -> list[str]:
    """The repository paths a diff leaves written (changed or created)."""
    return [line[len("+++ b/") :] for line in diff.splitlines() if line.startswith("+++ b/")]


def export(out: Path | None = None, *, check: bool = False) -> list[str]:
    """Writes the patches of the installed TorchRL's series to ``out`` (its folder by
    default); with ``check``, lists those that differ instead.

    Returns:
        The file names written (or, with ``check``, out of date).
    """
    rendered = render()
    out = Path(out) if out is not None else installed_series().folder
    changed = []
    for name, text in rendered.items():
        target = out / name
        if not target.is_file() or target.read_text() != text:
            changed.append(name)
            if not check:
                out.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    return changed


TRAJECTORY_ORDER_HEADER = """\
Subject: [PATCH] replay buffers: TrajectoryOrder, a storage's trajectory stops in sorted chunks

Problem
  SliceSampler (and SliceSamplerWithoutReplacement, PrioritizedSliceSampler)
  recovers the trajectory boundaries of the whole storage at every sample
  (_ReplayBoundaryIndex over _derive_end_flags and _end_to_start_stop): it
  reads the trajectory-id or done column of every stored row, O(capacity).
  _REPLAY_BOUNDARY_CACHE keeps the result per storage mutation revision, so
  any write empties it: an online loop (write, sample, write, sample) pays the
  whole pass at every step. This is the first of four pull requests that keep
  the boundaries across writes; it adds the data structure alone.

Change
  New module trajectory_order.py (numpy and torch, no TorchRL import):
  TrajectoryOrder keeps the stops of a storage's trajectories (the key
  lane * capacity + row of each last row) sorted, in chunks of about 1,024 keys
  held in two arenas (keys, lengths), as sortedcontainers.SortedList keeps its
  chunks. replace(lo, hi, stops) rewrites only the chunks that hold [lo, hi]:
  a write of k rows costs O(k + 1,024), never a copy of the others. Each chunk
  caches its trajectories' lengths and, per minimum length, how many are that
  long, so the i-th trajectory at least L rows long is found in
  O(T / 1,024 + 1,024) for T trajectories (select, count, shortest), and
  materialize() gives (start, stop, lengths) exactly as _end_to_start_stop
  orders them, first trajectory of each lane wrapping around the ring
  included. Nothing uses it yet: 0004 builds the index on it, 0007 draws from
  it by rank.
"""

TRAJECTORY_BOUNDARIES_HEADER = """\
Subject: [PATCH] replay buffers: TrajectoryBoundaries, a trajectory index advanced by the rows written

Problem
  See 0003: the whole-storage boundary recovery runs again after every write.
  This pull request adds the index that replaces it, still unused.

Change
  New module trajectory_boundaries.py (pure torch and numpy):
  TrajectoryBoundaries holds, for one boundary signal (trajectory ids, or
  end-of-trajectory flags), the rows where trajectories end, in a
  TrajectoryOrder (0003). mark_written(rows) queues the rows a write touched;
  the next query reads the signal of those rows only (and of the row before
  each run, whose end may change), rewrites the chunks they fall in, and
  forces the stops the storage state makes (the last valid row of a storage
  that is not full, the write cursor of a full one, a lane's last row), as
  _derive_end_flags does: the boundaries are exactly the whole-signal
  recovery's. A whole-column build (the first query, or after too many
  queued rows) finds the ends on the CPU with numpy, several times faster
  than torch.nonzero on one thread; on another device the ends are found
  there and only their positions come to the host. EndFlagDisagreements
  follows, with the same machinery, the rows where done flags and ids mark
  different ends (0006 reads the flags while there are none).
"""

STORAGE_BOUNDARIES_HEADER = """\
Subject: [PATCH] replay buffers: TensorStorage.set records the rows it writes in the boundary cache

Problem
  See 0003: every write moves the storage's _mutation_revision, and the
  storage's entry in _REPLAY_BOUNDARY_CACHE, filed under the old revision, is
  dropped: what was known of the trajectories before the write is lost.

Change
  New module storage_boundaries.py. The storage's entry in
  _REPLAY_BOUNDARY_CACHE also holds a StorageBoundaries: one
  TrajectoryBoundaries (0004) per boundary signal a sampler reads. At the end
  of TensorStorage.set, _record_write marks the rows it wrote in each of them
  and files the entry under the revision the write moved to, instead of
  letting it drop: O(k) for k rows, under the cache lock. Writes it cannot
  account for row by row (another write interleaved, a storage shared with
  other processes, a compiled write) leave the entry under the old revision,
  and it is rebuilt at the next query, as today. Storage.__getstate__ marks a
  memmap storage copied outside torch.multiprocessing, whose files another
  process may write. Every other mutation (_empty, load_state_dict, loads,
  the buffer's set_ / set_at_ / update_) moves the revision alone, as today.
  Samplers read nothing of it yet: 0006 does.
"""

SLICE_BOUNDARY_INDEX_HEADER = """\
Subject: [PATCH] replay buffers: slice samplers read the trajectory index, never stale, whatever cache_values says

Problem
  SliceSampler (and SliceSamplerWithoutReplacement, PrioritizedSliceSampler)
  recovers the trajectory boundaries from the whole storage at every sample,
  O(capacity); cache_values=True keeps them only until the next write, so an
  online loop pays the full pass at every step: about a second per sample at
  346M stored transitions. Open in main's code: SliceSampler._get_stop_and_length
  and SampleUnit._episode_boundaries build a _ReplayBoundaryIndex from the
  whole column after every write (#2669 was closed, the cost is still there).

Change
  New module slice_boundaries.py. SliceSampler._get_stop_and_length asks the
  storage's StorageBoundaries (0005) first: the signal the sampler reads
  (traj_key ids, end_key flags or the union of end_keys) is found once per
  sampler and storage, and the index (0004) gives the boundaries after O(k)
  work per write of k rows; they are exactly the whole-storage recovery's,
  so every sample is unchanged, and they are used whatever cache_values says:
  never stale. What a sampler queries the index with (the signal, the index,
  the storage's length and cursor) is kept until the storage changes
  otherwise than by recorded writes. A sampler that names no trajectory key
  reads the ("next", "done") flags instead of the ids TorchRL detects while
  both mark the same ends (checked on the written rows); where they disagree
  (interleaved collectors) it reads the ids and logs it once. The sample units
  (Sequence, SubgoalTriplet) find the index's boundaries in the same cache.
  The whole-storage recovery still runs for:
{fallbacks}

Upstream issue: https://github.com/pytorch/rl/issues/2669

Measured effect (the same code as a runtime patch over torchrl 0.14.1, torch
2.13.0+cpu, 2-core machine, one thread; 0003-0007 applied; stock and patched
timed in turn)
  256 slices of 4, no value cache, median per sample, stock -> patched:
    5M stored / 6M capacity, episode ids       20.5 ms -> 0.37 ms
    5M stored / 600M capacity, episode ids     20.5 ms -> 0.37 ms
    346M stored / 600M capacity, episode ids   835 ms -> 0.51 ms
    346M stored / 600M capacity, done flags    556 ms -> 0.42 ms
    online loop, 40M / 60M, write 1,000 rows then sample: 91-164x faster
    first sample of a buffer just filled with 5M rows: 3.1-8.6x faster
"""

SLICE_SAMPLE_ORDER_HEADER = """\
Subject: [PATCH] replay buffers: SliceSampler draws trajectories by rank, without listing them

Problem
  With the incremental index (0003-0006) the boundaries cost O(k) per write of k
  rows, but SliceSampler.sample still lists every trajectory (start, stop,
  length) and _sample_slices filters and indexes the whole listing at every
  sample: O(number of trajectories). With short episodes that dominates: 100M
  stored transitions in 100-step episodes are 1M trajectories, and a sample
  after a write costs several times a random sample of the same batch.

Change
  The index keeps each boundary signal's trajectory stops in a TrajectoryOrder
  (0003's trajectory_order.py: sorted chunks of about 1,024 stops, each chunk
  with its trajectories' lengths and, per minimum length asked for, how many
  are that long). SliceSampler.sample now asks it first (new module
  slice_sampling.py): the same torch.randint draw, from the same generator,
  over the same count (every trajectory, or those at least seq_length long
  where strict_length drops the others), picks trajectories by rank in the
  order, and _sample_slices receives only the drawn ones, numbered by
  traj_idx, plus one of the shortest where some are too short so that it takes
  the branch it takes on the whole listing. Where every slice has the
  sampler's length inside its trajectory (no span; none too short, or
  strict_length) and the storage is on the CPU, _fixed_length_index places
  the slices with the same torch.rand draw and float32 arithmetic as
  _get_index and writes their index in numpy, and _finalize_index adds the
  info: _sample_slices, _get_index and their dozen tensor operations are
  skipped. Every sample is unchanged. A sample costs O(batch) plus a scan of
  one count per chunk, whatever the number of trajectories. Samplers that
  override _get_stop_and_length, _adjusted_batch_size, _sample_slices or
  _get_index (or _tensor_slices_from_startend, for the index alone), and
  every configuration 0006 leaves to the whole-storage recovery, sample as
  before; SliceSamplerWithoutReplacement and PrioritizedSliceSampler keep
  their own sample() and read the listing, as before.

Upstream issue: https://github.com/pytorch/rl/issues/2669

Measured effect (the same code as a runtime patch over torchrl 0.14.1, torch
2.13.0+cpu, 2-core machine, one thread; a sample of 2,048 rows as 32 slices right after a 1,000-row write, done flags,
against a RandomSampler sample of the same rows from the same storage in the
same run; `python repro/floor.py --patched --stored N --episode L`)
    stored, episode length (trajectories)   0003-0006      with 0007
    10M, 1,000 (10k)                         1.3x floor     1.09-1.20x floor
    10M, 100 (100k)                          2.0x floor     0.85-1.13x floor
    100M, 100 (1M)                           2.9-4.1x       0.86x floor
  Stock takes 29 ms there at 10M (38x its floor).
  20M stored, 64 slices of 32, 3,200- to 32-step episodes (6,250 to 625,000
  trajectories; `python -m devtools bench`, the sweep rows, stock and patched
  timed in turn): stock 57 -> 99 ms, patched 0.96-1.01 ms.

"""

SINGLE_GATHER_HEADER = """\
Subject: [PATCH] replay buffers: slice samplers read only the entries their info needs

Problem
  To build its info (truncated / done / terminated / is_init) SliceSampler
  reads storage[index]: every entry of every sampled row is gathered, then the
  replay buffer gathers them all again to return the sample. On image data a
  slice sample costs 1.7-4.8x a random sample of the same size.
  PrioritizedSliceSampler.sample does the same, and StreamingSliceSampler
  gathers every entry of the rows of each write to find its windows.

Change
  _read_entries reads only the entries the info uses (done, terminated, the
  init key) from a TensorStorage holding a TensorDict, gathering them from the
  storage's tensors. Left as they were:
{fallbacks}
  SliceSampler._finalize_index and PrioritizedSliceSampler.sample call it;
  for slices of one length on the CPU, _finalize_index builds the info in
  _fixed_length_info instead: the entries gathered, truncated and the
  slice-start marker written in place, without TensorDict indexing;
  StreamingSliceSampler.mark_update reads the trajectory ids, end flags and
  is_init of the written rows through _read_written_entries.
  The info and the queued windows are exactly what they were.

Upstream issue: https://github.com/pytorch/rl/issues/2422

Measured effect (the same code as a runtime patch over torchrl 0.14.1, torch
2.13.0+cpu, 2-core machine, one thread, stock and patched timed in turn)
  TensorDictReplayBuffer sample of two 3x64x64 uint8 images per row, 2,048
  rows as 32 slices, 200k stored: SliceSampler 1.98x faster (71 -> 35.7 ms);
  the sample now costs what a RandomSampler sample of the same size costs
  (38.5 ms).

"""
