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
fix's declaration (:attr:`torchrl_fixes._core.registry.Fix.fallbacks`), as ``status()``
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
    2: ("test/rb/test_slice_sampler_info.py", "benchmarks/test_slice_sampler_gather_benchmark.py"),
    3: ("test/rb/test_trajectory_order.py",),
    4: ("test/rb/test_trajectory_boundaries.py",),
    5: ("test/rb/test_storage_boundaries.py", "test/rb/test_replay_boundary_cache.py"),
    6: (
        "test/rb/test_slice_sampler_boundary_cache.py",
        "benchmarks/test_slice_sampler_online_benchmark.py",
    ),
    7: (
        "test/rb/test_trajectory_table.py",
        "test/rb/test_slice_sampler_draw_by_rank.py",
        "benchmarks/test_slice_sampler_growing_benchmark.py",
    ),
}
# upstream/ test files import the runtime's new modules; in TorchRL they live here.
_UPSTREAM_IMPORT = re.compile(r"^from (torchrl_fixes(?:\.\w+)+) import", re.MULTILINE)

_LICENSE = """\
# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""

_RB_MODULE = RB.replace("/", ".")
# Runtime module -> the TorchRL module (under torchrl/data/replay_buffers/) its code
# goes to, where that is not a module of the same name: the boundary cache's
# functions live beside the cache, in utils.py; what the slice samplers alone read
# is a sampler internal (samplers/, as samplers/_trajectory.py). The storage's side
# stays beside utils.py, which imports it: under samplers/ it would import the
# samplers, which import the storages, which import utils.
TORCHRL_MODULES = {
    "boundary_cache": "utils",
    "slice_boundaries": "samplers._slice_boundaries",
    "slice_sampling": "samplers._slice_sampling",
}
# A line of a runtime module for TorchRL releases before 0.14 alone: never true on
# TorchRL main, where the module goes without it.
BEFORE_014 = "  # TorchRL before 0.14"

# Runtime module text -> TorchRL module text. Every rewrite a module names must apply.
_MODULE_REWRITES = (
    ("import logging\n", ""),
    ('\nlogger = logging.getLogger("torchrl_fixes")\n', ""),
    (
        "from torchrl_fixes.fixes.slice_boundary_index.storage_boundaries import",
        f"from torchrl._utils import logger\nfrom {_RB_MODULE}.storage_boundaries import",
    ),
    ("from torchrl_fixes.fixes.slice_boundary_index.boundary_cache import", f"from {_RB_MODULE}.utils import"),
    ("from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import", f"from {_RB_MODULE}.trajectory_boundaries import"),
    ("from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import", f"from {_RB_MODULE}.trajectory_order import"),
    ("from torchrl_fixes.fixes.slice_boundary_index.trajectory_table import", f"from {_RB_MODULE}.trajectory_table import"),
    (
        "from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import",
        f"from {_RB_MODULE}.samplers._slice_boundaries import",
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
class EditSource:
    """Edits of a TorchRL function's source: ``(old, new)`` texts, each found exactly once
    in the function dedented, as :func:`torchrl_fixes._core.patching.derive_from_source`
    makes them at runtime."""

    path: str
    qualname: str
    edits: tuple[tuple[str, str], ...]


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
    if isinstance(edit, EditSource):
        (node,) = _find(tree, edit.qualname)
        first = (node.decorator_list[0] if node.decorator_list else node).lineno - 1
        source = textwrap.dedent("".join(lines[first : node.end_lineno]))
        for old, new in edit.edits:
            if source.count(old) != 1:
                raise ExportError(f"{edit.qualname}: {old.strip()!r} is not found once")
            source = source.replace(old, new)
        return [(first, node.end_lineno, _indent(source.splitlines(keepends=True), node.col_offset))]
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
    text = _without_release_lines(text, new.source)
    for leftover in ("torchrl_fixes",):
        if leftover in text:
            line = next(line for line in text.splitlines() if leftover in line)
            raise ExportError(f"{new.source} still names {leftover}: {line.strip()!r}")
    return _LICENSE + text


def _without_release_lines(text: str, source: str) -> str:
    """``text`` less each ``if`` statement marked :data:`BEFORE_014` and its one-line body."""
    lines = text.splitlines(keepends=True)
    kept, skip = [], 0
    for line in lines:
        if skip:
            skip -= 1
            continue
        if line.rstrip("\n").endswith(BEFORE_014):
            if not line.lstrip().startswith("if "):
                raise ExportError(f"{source}: only an if statement may be marked {BEFORE_014.strip()!r}")
            skip = 1  # its body, one line
            continue
        kept.append(line)
    return "".join(kept)


def _torchrl_module(runtime_module: str) -> str:
    """The dotted TorchRL module the code of ``runtime_module`` (``torchrl_fixes.x``) goes to."""
    short = runtime_module.rpartition(".")[2]
    return f"{_RB_MODULE}.{TORCHRL_MODULES.get(short, short)}"


def _module_function_edits(path: str, module, before: str) -> list:
    """The edits that add ``module``'s functions to the TorchRL module at ``path``, before
    its definition ``before``, with the imports they need.

    Its imports of other runtime modules become imports of their TorchRL modules;
    what it imports in a ``try`` (the runtime's fallbacks for older releases) the
    TorchRL module must hold already, as its plain ``import`` statements must.
    """
    target = _RB_MODULE + "." + Path(path).stem
    tree = ast.parse(inspect.getsource(module))
    functions = tuple(
        getattr(module, node.name) for node in tree.body if isinstance(node, ast.FunctionDef)
    )
    edits: list = [AddFunctions(path, before, functions)]
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        source = node.module
        if source.startswith("torchrl_fixes."):
            source = _torchrl_module(source)
        if source != target:
            edits.append(AddImport(path, source, tuple(alias.name for alias in node.names)))
    return edits


def upstream_file_text(path: str) -> str:
    """The text a pull request adds at ``path`` (in pytorch/rl) from ``upstream/<path>``."""
    source = UPSTREAM_DIR / path
    if not source.is_file():
        raise ExportError(f"{path} is listed in UPSTREAM_FILES but upstream/{path} does not exist")
    text = _UPSTREAM_IMPORT.sub(
        lambda match: f"from {_torchrl_module(match[1])} import", source.read_text()
    )
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
        edits.append(AddImport(f"{RB}/{path}", _torchrl_module(module), names))
    return edits


def patches() -> list[UpstreamPatch]:
    """The generated patches, in order."""
    import torchrl_fixes
    from torchrl_fixes._core.patching import get_original
    from torchrl_fixes.fixes import single_gather
    from torchrl_fixes.fixes.slice_boundary_index import (
        BOUNDARY_INDEX_EDITS,
        INLINE_HOOKS,
        SAMPLE_HOOKS,
        boundary_cache,
    )

    with torchrl_fixes.disabled():  # the fixes are planned against stock code
        hooks = dict(INLINE_HOOKS)
        # what the runtime fix puts in place of the methods that read the sampled rows
        derived = {
            rep.name: rep.new for rep in single_gather.SingleGather().plan()
        }
    finalize_index, prioritized_sample = derived["_finalize_index"], derived["sample"]

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
                single_gather._reads_tensordict,
                single_gather._read_entries,
                single_gather._integer_index_batch_size,
                single_gather._column,
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
            prioritized_sample,
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
            (NewModule(f"{RB}/trajectory_order.py", "torchrl_fixes.fixes.slice_boundary_index.trajectory_order"),),
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
                    "torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries",
                    rewrites=("from torchrl_fixes.fixes.slice_boundary_index.trajectory_order import",),
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
                    "torchrl_fixes.fixes.slice_boundary_index.storage_boundaries",
                    rewrites=("from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import",),
                ),
                # the boundary cache's functions, beside the cache
                *_module_function_edits(f"{RB}/utils.py", boundary_cache, "_ReplayBoundaryIndex"),
                *(
                    EditSource(f"{RB}/{path}", qualname, edits)
                    for (path, qualname), edits in BOUNDARY_INDEX_EDITS.items()
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
                    f"{RB}/samplers/_slice_boundaries.py",
                    "torchrl_fixes.fixes.slice_boundary_index.slice_boundaries",
                    rewrites=(
                        *to_torchrl,
                        "from torchrl_fixes.fixes.slice_boundary_index.boundary_cache import",
                        "from torchrl_fixes.fixes.slice_boundary_index.storage_boundaries import",
                        "from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import",
                        "from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import",
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
                    f"{RB}/trajectory_table.py",
                    "torchrl_fixes.fixes.slice_boundary_index.trajectory_table",
                    rewrites=("from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import",),
                ),
                NewModule(
                    f"{RB}/samplers/_slice_sampling.py",
                    "torchrl_fixes.fixes.slice_boundary_index.slice_sampling",
                    rewrites=(
                        "from torchrl_fixes.fixes.slice_boundary_index.slice_boundaries import",
                        "from torchrl_fixes.fixes.slice_boundary_index.trajectory_boundaries import",
                        "from torchrl_fixes.fixes.slice_boundary_index.trajectory_table import",
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
    from torchrl_fixes._core.versions import installed_version

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
        after.update(_upstream_files(patch.number))
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
    return _git_diff({}, _upstream_files(number)) if paths else ""


def _upstream_files(number: int) -> dict[str, str]:
    """Path -> text of the files patch ``number`` adds from ``upstream/``, as upstream's
    formatter writes them (their imports of TorchRL sorted as TorchRL's)."""
    return _formatted({path: upstream_file_text(path) for path in UPSTREAM_FILES[number]})


FALLBACKS = "{fallbacks}"


def fallbacks_text(fix: str, indent: int = 4, width: int = 80) -> str:
    """The fix's declared fallbacks (:attr:`torchrl_fixes._core.registry.Fix.fallbacks`), wrapped."""
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

Problem (in main's code)
  SliceSampler (and SliceSamplerWithoutReplacement, PrioritizedSliceSampler)
  and the sample units (Sequence, SubgoalTriplet) recover trajectory
  boundaries through _ReplayBoundaryIndex, which reads the trajectory-id or
  done column of every stored row (_derive_end_flags, _end_to_start_stop):
  O(capacity). _REPLAY_BOUNDARY_CACHE keeps the result per storage mutation
  revision, so every write empties it, and SliceSampler caches nothing by
  default (cache_values=False): an online loop (write, sample, write, sample)
  pays the whole pass at every step, 8-20 ms per sample at 1M-5M stored
  (measured in 0006). #2669 reported it and is closed; the pass is in main.
  This is the first of five pull requests (0003-0007) that keep the
  boundaries across writes; it adds the data structure alone.

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

Tests: test_trajectory_order.py checks every query against a listing of the
  trajectories rebuilt from a sorted array of stops, after random
  replacements, on one and several lanes.
"""

TRAJECTORY_BOUNDARIES_HEADER = """\
Subject: [PATCH] replay buffers: TrajectoryBoundaries, a trajectory index advanced by the rows written

Problem
  See 0003: _ReplayBoundaryIndex recovers the boundaries from the whole
  column again after every write. This pull request adds the index that
  replaces that pass, still unused.

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
  followers: what else keeps a view of the signal is told of each write and
  reset (0007 keeps a flat table there); a rebuild for too many queued rows
  forgets the order alone, not what the followers hold.

Tests: test_trajectory_boundaries.py compares the index with
  find_start_stop_traj on the whole signal after random sequences of writes:
  ids and end flags, one and several lanes, partial, full and wrapped
  storages, every cursor position; and that followers see every write and
  reset.
"""

STORAGE_BOUNDARIES_HEADER = """\
Subject: [PATCH] replay buffers: the boundary cache keeps a storage's trajectories across the writes it records

Problem (in main's code)
  TensorStorage.set moves the storage's _mutation_revision, and the storage's
  entry in _REPLAY_BOUNDARY_CACHE, filed under the old revision, is dropped at
  the next _ReplayBoundaryIndex lookup: the sample units (Sequence,
  SubgoalTriplet), which always cache, recover the episode boundaries from the
  whole done column after every write (see 0003).

Change
  A storage's entry in _REPLAY_BOUNDARY_CACHE becomes a StorageBoundaries (new
  module storage_boundaries.py) once something asks for its index: a dict of
  what _ReplayBoundaryIndex caches at the entry's revision, as every entry
  is, which also holds one TrajectoryBoundaries (0004) per boundary signal
  read from the storage. In utils.py, beside the cache: TensorStorage.set
  calls _revision_before_write and _record_write, which mark the written rows
  in each index and file the entry under the revision the write moved to,
  O(k) for k rows; a storage nobody asked about records nothing (its entry is
  not a StorageBoundaries: one attribute read per write). Writes it cannot
  account for row by row (another mutation interleaved, a storage shared with
  other processes, a compiled write) reset the entry, and it is rebuilt at
  the next query, as today. Every other mutation (_empty, load_state_dict,
  loads, the buffer's set_ / set_at_ / update_) moves the revision alone, as
  today. Storage.__getstate__ marks a memmap storage copied outside
  torch.multiprocessing, whose files another process may write: it is read
  whole, as today. _ReplayBoundaryIndex, where nothing is cached and no custom
  end_to_start_stop is given, asks the storage's index
  (_indexed_boundaries): the sample units get their boundaries from it.
  SliceSampler still reads the whole storage: 0006 wires it.

Tests: test_storage_boundaries.py (the entry, write by write);
  test_replay_boundary_cache.py, through the public API and free of the new
  modules: across 20 write-then-sample steps of a Sequence buffer, the
  whole-column recovery (_derive_end_flags) runs at most once (21 times on
  main: it fails there), and samples equal those of a buffer whose boundaries
  are recovered from its whole storage before every sample.
"""

SLICE_BOUNDARY_INDEX_HEADER = """\
Subject: [PATCH] replay buffers: slice samplers read the trajectory index, never stale, whatever cache_values says

Problem (in main's code)
  SliceSampler._get_stop_and_length (also behind SliceSamplerWithoutReplacement
  and PrioritizedSliceSampler) builds a _ReplayBoundaryIndex from the whole
  trajectory-id or done column at every sample: cache_values defaults to
  False, and with cache_values=True the cached boundaries last until the next
  write. An online loop (write 1,000 rows, sample) pays the whole pass at
  every step: 9.6-13.4 ms at 5M stored, where a RandomSampler step costs
  0.26 ms (below). #2669 reported it and is closed; the pass is in main.

Change
  New module samplers/_slice_boundaries.py. SliceSampler._get_stop_and_length
  asks the storage's boundary-cache entry (0005) first: the signal the sampler reads
  (traj_key ids, end_key flags or the union of end_keys) is found once per
  sampler and storage, and its index (0004) gives the boundaries after O(k)
  work per write of k rows; they are exactly the whole-column recovery's, so
  every sample is unchanged, and they are used whatever cache_values says:
  never stale. What a sampler queries the index with (the signal, the index,
  the storage's length and cursor) is kept until the storage changes
  otherwise than by recorded writes. A sampler that names no trajectory key
  reads the ("next", "done") flags instead of the ids it detects while both
  mark the same ends (checked on the written rows); where they disagree
  (interleaved collectors) it reads the ids and logs it once. The whole
  column is still read for:
{fallbacks}

Tests: test_slice_sampler_boundary_cache.py, through the public API and free
  of the new modules: after every write path (extend, add, rb[idx] =,
  storage.set, a second buffer on the same storage, load_state_dict, empty)
  samples equal those of a buffer whose boundaries are recovered from its
  whole storage, on memmap and ndim=2 storages too; across 100
  write-then-sample steps the whole-storage recovery runs at most once (on
  main it runs at every sample: these fail there).
  Benchmark: benchmarks/test_slice_sampler_online_benchmark.py.

Measured effect (torchrl main as built by torchrl-nightly==2026.10.27, torch
2.13.0+cpu, 2-core machine; main and main with 0001-0006 applied, each in its
own run of `pytest benchmarks/test_slice_sampler_online_benchmark.py
--benchmark-only`; median of 100 steps of write 1,000 rows, sample 256
slices of 4, full storage)
                                     main       with 0001-0006
    100k stored, done flags        0.83-0.94    0.60-0.65 ms
    1M stored, done flags          2.1-2.7      0.65-0.77 ms
    5M stored, done flags          9.6-10.6     0.74-1.05 ms
    5M stored, episode ids        11.8-13.4     0.75-1.03 ms
    RandomSampler step, 5M         0.26         0.27 ms
  (ranges: 1,000- and 100-step episodes)

"""

SLICE_SAMPLE_ORDER_HEADER = """\
Subject: [PATCH] replay buffers: SliceSampler draws trajectories by rank, without listing them

Problem (in main's code, and after 0006)
  SliceSampler.sample lists every trajectory (start, stop, length) and
  _sample_slices filters and indexes the whole listing at every sample:
  O(number of trajectories), once 0006 has made the boundaries O(k) per
  write. With short episodes that dominates: at 5M stored in 100-step
  episodes (50k trajectories) a sample after a write costs 1.0 ms with 0006,
  four times a RandomSampler step.

Change
  The index keeps each boundary signal's trajectory stops in a TrajectoryOrder
  (0003: sorted chunks of about 1,024 stops, each chunk with its trajectories'
  lengths and, per minimum length asked for, how many are that long).
  SliceSampler.sample now asks it first (new module samplers/_slice_sampling.py):
  the same torch.randint draw, from the same generator, over the same count
  (every trajectory, or those at least seq_length long where strict_length
  drops the others), picks trajectories by rank in the order, and
  _sample_slices receives only the drawn ones, numbered by traj_idx, plus one
  of the shortest where some are too short so that it takes the branch it
  takes on the whole listing. Where every slice has the sampler's length
  inside its trajectory (no span; none too short, or strict_length) and the
  storage is on the CPU, _fixed_length_index places the slices with the same
  torch.rand draw and float32 arithmetic as _get_index and writes their index
  in numpy, and _finalize_index adds the info: _sample_slices, _get_index and
  their dozen tensor operations are skipped. Every sample is unchanged. A
  sample costs O(batch) plus a scan of one count per chunk, whatever the
  number of trajectories.
  The short path, for a storage that only grows (not full yet, every write
  past its valid rows: an online buffer until it fills) and end flags on one
  lane: new module trajectory_table.py (numpy) keeps a TrajectoryTable, each
  trajectory's first row and length, flat, in order, and drawable(min_length)
  gives those long enough (the first count, or kept ranks where a shorter one
  closed earlier). GrowingStorageTable, one of the index's followers (0004),
  records the lowest row each write touches (one min over the rows the
  write hands it) and appends the rows written since the last sample to the
  table, reading those rows alone: where they close a few trajectories (an
  online write of whole episodes' steps) one by one in Python, whose scalar
  writes cost less there than one numpy call with numpy's code out of the
  cache; otherwise in a few numpy operations (the flags' nonzero, an add, a
  subtract). A write below the table's last row drops it, the order
  serves from then on, and the table is made again from it once as many
  rows as it had trajectories have been written. _sample_from_table makes
  the listing's draw over the table directly: torch.randint over the
  trajectories long enough, their first rows and lengths read with two fancy
  indices, then _fixed_length_index. A sampler that drew from the table
  keeps how (_TableDraw): while its query plan holds (0006) and it asks for
  the same slices, its next sample goes from the plan to the table and
  looks nothing else up. A handful of operations, nothing per chunk.
  Samplers that override _get_stop_and_length,
  _adjusted_batch_size, _sample_slices or _get_index (or
  _tensor_slices_from_startend, for the index alone), and every configuration
  0006 leaves to the whole-column recovery, sample as before;
  SliceSamplerWithoutReplacement and PrioritizedSliceSampler keep their own
  sample() and read the listing, as before.

Tests: test_slice_sampler_draw_by_rank.py compares the draw with the listing's
  (same generator state) for every sampler option, and after writes; the
  samples of a buffer that grows by appends with the listing's, its order
  never asked (the table alone serves them); and the kept draw, which serves
  until the batch size, the slice options, the storage or its state
  changes, every sample the listing's. test_trajectory_table.py
  checks the table against the trajectories listed from the whole column
  after random appends (closing a few trajectories or a hundred), and when
  it is dropped and made again.

Measured effect (as in 0006: `pytest
benchmarks/test_slice_sampler_online_benchmark.py --benchmark-only`, main with
0001-0006, then with 0001-0007, median of 100 write-then-sample steps)
                                          0001-0006   0001-0007
    5M stored, 100-step episodes, done       1.05        0.66 ms
    5M stored, 100-step episodes, ids        1.03        0.90 ms
    5M stored, 1,000-step episodes, done     0.74        0.63 ms
    1M stored, 100-step episodes, done       0.77        0.59 ms
  main itself: 9.6-13.4 ms at 5M.
  A buffer still filling, done flags, 1,000-step episodes (`pytest
  benchmarks/test_slice_sampler_growing_benchmark.py --benchmark-only`, new
  in this pull request: 256 slices of 4, median of 100 samples, the
  RandomSampler sample of the same storage beside them; two runs of each
  tree, in turn):
                                main      0001-0006   0001-0007   RandomSampler
    1M stored, static          1.0 ms     0.24-0.26   0.13-0.16   0.07-0.08 ms
    1M stored, after a write   1.0-1.04   0.38-0.39   0.18-0.19   0.10-0.12
    5M stored, static          3.0-3.1    0.27-0.28   0.16        0.10-0.11
    5M stored, after a write   3.0-3.1    0.41        0.20-0.21   0.13
  It samples back to back, with warm caches: the append row by row saves
  most where other work between samples leaves numpy's code cold.

"""

SINGLE_GATHER_HEADER = """\
Subject: [PATCH] replay buffers: slice samplers read only the entries their info needs

Problem (in main's code)
  To build its info (truncated / done / terminated / is_init),
  SliceSampler._finalize_index reads storage[index]: every entry of every
  sampled row is gathered, then the replay buffer gathers them all again to
  return the sample. PrioritizedSliceSampler.sample does the same, and
  StreamingSliceSampler.mark_update gathers every entry of the rows of each
  write to find its windows. On image rows a slice sample costs twice a
  random sample of the same size (#2422, closed; the double read is in main).

Change
  _read_entries reads only the entries the info uses (done, terminated, the
  init key) from a TensorStorage holding a TensorDict, gathering them from the
  storage's tensors. Left as they were:
{fallbacks}
  SliceSampler._finalize_index and PrioritizedSliceSampler.sample call it;
  for slices of one length on the CPU, _finalize_index builds the info in
  _fixed_length_info instead: the entries gathered, truncated and the
  slice-start marker written in place, without TensorDict indexing (the
  entries looked up with the TensorDict's _get_str / _get_tuple, as the
  environments do);
  StreamingSliceSampler.mark_update reads the trajectory ids, end flags and
  is_init of the written rows through _read_written_entries.
  The info and the queued windows are exactly what they were.

Tests: test_slice_sampler_info.py compares every info entry and sample with
  the full-row read's, for each sampler, storage and output layout, and counts
  the full-row reads of a sample (two on main, one with this change).

Measured effect (torchrl main as built by torchrl-nightly==2026.10.27, torch
2.13.0+cpu, 2-core machine;
`pytest benchmarks/test_slice_sampler_gather_benchmark.py --benchmark-only -m "not slow"`,
median of 50 samples)
  2,048 rows of two 3x64x64 uint8 images as 32 slices, 20k stored:
    SliceSampler   57.4 ms -> 24.0 ms (2.39x)
    RandomSampler  28.3 ms and 24.1 ms (the floor, unchanged)

"""
