"""The upstream series, ``patches/main/``, rendered from the runtime fixes.

``python -m devtools export-patches`` copies the installed ``torchrl`` (the pinned nightly
build of TorchRL main) into a temporary tree and makes each pull request of :data:`PRS` there,
in order, from changes read from the runtime as it renders. Runtime imports become TorchRL's,
nothing upstream-bound may name ``torchrl_fixes``, and every file written goes through
upstream's ufmt (black + usort at its pins). Each patch is the ``git diff`` of its pull request
under a header made from ``patches/main/<name>.md``.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections import namedtuple
from pathlib import Path

from devtools.review_hooks import FORMATTER_REQUIREMENTS, UPSTREAM_PYPROJECT
from devtools.torchrl_matrix import NIGHTLY, NIGHTLY_VERSION

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM_DIR = ROOT / "upstream"
RB = "torchrl/data/replay_buffers"
_SBI = "torchrl_fixes.fixes.slice_boundary_index"
_PATCHES = "[0-9][0-9][0-9][0-9]-*.patch"
_LICENSE = (  # TorchRL's, on the files a pull request adds
    "# Copyright (c) Meta Platforms, Inc. and affiliates.\n#\n# This source code is licensed under the MIT "
    "license found in the\n# LICENSE file in the root directory of this source tree.\n"
)


class ExportError(Exception):
    """The series cannot be written or applied; the message says why, in one line."""


Series = namedtuple("Series", "name torchrl label folder")  # the TorchRL it targets, its folder
SERIES = (Series("main", NIGHTLY_VERSION, f"torchrl main (as built by {NIGHTLY[0]})", ROOT / "patches/main"),)

# Runtime module -> the TorchRL file its upstream-bound code lives in.
HOMES = {
    "torchrl_fixes.fixes.pinned_sample_output": f"{RB}/utils.py",
    "torchrl_fixes.fixes.single_gather": f"{RB}/samplers/slice.py",
    f"{_SBI}.trajectory_index": f"{RB}/trajectory_index.py",
    f"{_SBI}.write_journal": f"{RB}/write_journal.py",
    f"{_SBI}.storage_index": f"{RB}/storage_index.py",
    f"{_SBI}.slice_boundaries": f"{RB}/samplers/_slice_boundaries.py",
    f"{_SBI}.slice_sampling": f"{RB}/samplers/_slice_sampling.py",
    f"{_SBI}.slice_without_replacement": f"{RB}/samplers/slice_without_replacement.py",
    f"{_SBI}.slice_lengths": f"{RB}/utils.py",
}
# upstream/<path> (tests, benchmarks) -> the pull request that adds it at <path> in pytorch/rl.
UPSTREAM_FILES = {
    "test/rb/test_rb_pin_memory.py": "0001-pinned-sample-output",
    "test/rb/test_slice_sampler_info.py": "0002-single-gather",
    "benchmarks/test_slice_sampler_gather_benchmark.py": "0002-single-gather",
    "test/rb/test_trajectory_index.py": "0003-trajectory-index",
    "test/rb/test_write_journal.py": "0004-storage-write-journal",
    "test/rb/test_storage_index.py": "0005-slice-boundaries-from-index",
    "test/rb/_slice_sampler_common.py": "0005-slice-boundaries-from-index",
    "test/rb/test_slice_sampler_index.py": "0005-slice-boundaries-from-index",
    "benchmarks/_slice_sampler_buffers.py": "0005-slice-boundaries-from-index",
    "benchmarks/test_slice_sampler_index_benchmark.py": "0005-slice-boundaries-from-index",
    "test/rb/test_slice_sampler_draw.py": "0006-slice-draw-from-index",
    "test/rb/test_slice_sampler_without_replacement_draw.py": "0007-slice-without-replacement-from-index",
    "benchmarks/test_slice_sampler_without_replacement_benchmark.py": "0007-slice-without-replacement-from-index",
    "test/rb/test_slice_sampler_lengths.py": "0008-variable-length-slices",
    "benchmarks/test_slice_sampler_lengths_benchmark.py": "0008-variable-length-slices",
    "test/rb/test_prioritized_slice_stops.py": "0009-prioritized-slice-stops",
    "test/rb/test_trajectory_index_changes.py": "0010-prioritized-slice-eligible-starts",
    "test/rb/test_prioritized_slice_eligible_starts.py": "0010-prioritized-slice-eligible-starts",
    "benchmarks/test_prioritized_slice_sampler_benchmark.py": "0010-prioritized-slice-eligible-starts",
}

# The changes of a pull request: the runtime module ``source`` copied to its home (HOMES);
# the file ``upstream/<path>`` copied to ``path``; ``(old, new)`` texts, each found once in
# every definition ``scope`` ("Class.method", "function", "Class"; None: the file) of
# ``path``, dedented as derive_from_source edits a stock method at runtime; ``(name,
# source, runtime module)`` of functions put in ``path``, each in place of the definition
# ``name`` ("function" or "Class.method"), or else right before the definition ``before``.
# A Module's ``held`` edits are made in its copy: the parts a later pull request adds.
Upstream, Edit = namedtuple("Upstream", "path"), namedtuple("Edit", "path scope edits")
Module = namedtuple("Module", "source held", defaults=((),))
Functions = namedtuple("Functions", "path functions before", defaults=(None,))
# A pull request: patches/main/<name>.patch and .md, its changes (read from the runtime when
# called), and the fix whose declared fallbacks ``{fallbacks}`` in its text stands for.
PR = namedtuple("PR", "name changes fix", defaults=(None,))


def _reached(module, *texts: str) -> tuple:
    """The :class:`Functions` entries of each top-level function, class or constant of ``module``
    that ``texts`` name, and of those these name in turn, in source order, comments above included."""
    source, lines = inspect.getsource(module), inspect.getsource(module).splitlines(keepends=True)
    own = {
        getattr(n, "name", None) or n.targets[0].id: n for n in ast.parse(source).body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        or isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }
    found, todo = {}, set(re.findall(r"\w+", " ".join(texts)))
    while todo:
        name = todo.pop()
        if name in own and name not in found:
            found[name] = own[name]
            todo |= {n.id for n in ast.walk(own[name]) if isinstance(n, ast.Name)}
    reached = []
    for name, node in sorted(found.items(), key=lambda item: item[1].lineno):
        start = (getattr(node, "decorator_list", None) or [node])[0].lineno - 1
        while start and lines[start - 1].startswith("#"):
            start -= 1
        reached.append((name, "".join(lines[start : node.end_lineno]), module.__name__))
    return tuple(reached)


def _called(module, edited: list[str]) -> list[str]:
    """The lines importing the functions of ``module`` that the ``edited`` texts call, sorted."""
    return sorted(f"    {name}," for name, *_ in _reached(module, *edited) if name in re.findall(r"\w+", "".join(edited)))


def _after(path: str, scope: str | None, anchor: str, *lines: str) -> Edit:
    """``lines`` written after ``anchor`` in ``scope`` of ``path`` (an import: usort files it)."""
    return Edit(path, scope, ((anchor, anchor + "".join(line + "\n" for line in lines)),))


def _pinned_sample_output() -> list:
    from torchrl_fixes.fixes import pinned_sample_output as fix

    utils, buffer = f"{RB}/utils.py", f"{RB}/replay_buffers/tensordict.py"
    edited = [new for _, new in fix.SAMPLE_EDITS]
    return [
        # pin_memory_output and what it calls; a stock function of the same name is replaced
        Functions(utils, _reached(fix, "pin_memory_output", *edited), before="pin_memory_output"),
        Edit(utils, "_pins_memory", (("category=PinMemoryUnavailableWarning", "category=UserWarning"),)),
        _after(utils, None, "\nimport torch\n", "import functools", "import warnings", "from tensordict import is_tensor_collection"),
        Edit(buffer, "TensorDictReplayBuffer.sample", fix.SAMPLE_EDITS),
        _after(buffer, None, "from torchrl.data.replay_buffers.utils import (\n", *_called(fix, edited)),
    ]


def _single_gather() -> list:
    import torchrl_fixes
    from torchrl_fixes.fixes import single_gather as fix

    slice_, prioritized, streaming = (f"{RB}/samplers/{n}.py" for n in ("slice", "prioritized_slice", "streaming_slice"))
    stock = torchrl_fixes.get_original(fix.StreamingSliceSampler, "mark_update")
    derived = textwrap.dedent(inspect.getsource(fix._streaming_mark_update(stock)))  # stock's source, edited
    mark_update = ("StreamingSliceSampler.mark_update", derived, fix.__name__)
    edits = (*fix.FINALIZE_INDEX_EDITS, *fix.PRIORITIZED_SAMPLE_EDITS)
    # what the edits call, mark_update's included (the words it has that stock has not)
    added = set(re.findall(r"\w+", mark_update[1])) - set(re.findall(r"\w+", inspect.getsource(stock)))
    reached = _reached(fix, *(new for _, new in edits), *added)
    return [
        Functions(slice_, reached, before="SliceSampler"),
        _after(slice_, None, "\nimport torch\n", "from tensordict import TensorDict",
               "from torchrl.data.replay_buffers.storages import LazyMemmapStorage, LazyTensorStorage"),
        Edit(slice_, "SliceSampler._finalize_index", fix.FINALIZE_INDEX_EDITS),
        Edit(prioritized, "PrioritizedSliceSampler.sample", fix.PRIORITIZED_SAMPLE_EDITS),
        _after(prioritized, None, "from .slice import SliceSampler\n", "from .slice import _read_entries"),
        Functions(streaming, (mark_update,)),
        _after(streaming, None, "from .slice import SliceSampler\n", "from .slice import _read_written_entries"),
    ]


# The hook lines of 0004 to 0007 and 0010 mirror the runtime wrappers (slice_boundary_index/__init__.py) named
# beside them.
_SLICE, _TENSOR = f"{RB}/samplers/slice.py", f"{RB}/storages/tensor.py"
_SWR = f"{RB}/samplers/slice_without_replacement.py"
_PSS = f"{RB}/samplers/prioritized_slice.py"
# SliceSampler's docstring: what cache_values means once storages record their writes (0004)
_CACHE_VALUES_SEEN = ("""\
            including writes from another buffer or process. Direct backing
            tensor mutations cannot be detected.
""", """\
            including writes from another buffer or process. Writes torch does
            not count (through ``.data`` or numpy, or in place in another
            process) are seen once ``storage.mark_update(index)`` names their rows.
""")
# ... and once the index serves the sampler (0005); the sentences above stay
_CACHE_VALUES = ("""\
        cache_values (bool, optional): to be used with static datasets.
""", """\
        cache_values (bool, optional): unused where the storage's trajectory
            index serves the sampler, which sees every write torch counts in
            this process and every ``set`` in any process;
            ``boundary_index=False`` keeps the whole-storage recovery at every
            sample. Otherwise, to be used with static datasets.
""")
# SliceSampler's docstring: the new argument, after use_gpu
_BOUNDARY_INDEX = ("""\
            accelerate the sampling when the buffer content is large.
            Defaults to ``False``.
""", """\
            accelerate the sampling when the buffer content is large.
            Defaults to ``False``.
        boundary_index (bool, optional): if ``False``, the trajectory boundaries
            are recovered from the whole storage at every sample, without the
            storage's trajectory index. Defaults to ``True``.
""")


def _passes_boundary_index(path: str, cls: str, last: str, passed: str, documented: str) -> list:
    """take_boundary_index, in a sampler that calls SliceSampler.__init__ with its own arguments:
    ``boundary_index`` after its ``last`` argument, passed on after ``passed``, documented after
    the entry that ends with ``documented``."""
    return [
        Edit(path, f"{cls}.__init__", (
            (f"    {last}\n):\n", f"    {last}\n    boundary_index: bool = True,\n):\n"),
            (f"        {passed}\n    )\n", f"        {passed}\n        boundary_index=boundary_index,\n    )\n"),
        )),
        Edit(path, cls, ((documented, documented + """\
        boundary_index (bool, optional): see :class:`~torchrl.data.SliceSampler`.
            Defaults to ``True``.
"""),)),
    ]


def _storage_write_journal() -> list:
    from torchrl_fixes.fixes import slice_boundary_index as fix

    mark_update = ("TensorStorage.mark_update", inspect.getsource(fix.mark_update), fix.__name__)
    return [
        Module(f"{_SBI}.write_journal"),
        _after(_TENSOR, "TensorStorage.__init__", '    self.__dict__["_storage_keys"] = None\n',  # attach_journal
               "    journal_of(self)  # made before the storage is shared"),
        # record_write, in both TensorStorage.set (torch >= 2.0 and < 2.0): the revision the
        # write moves the storage to and the rows it covered are recorded as one
        Edit(_TENSOR, "TensorStorage.set", (("\n    self._bump_mutation_revision()\n", """
    if is_compiling():
        self._bump_mutation_revision()
    else:
        self.mark_update(cursor)
"""),)),
        Functions(_TENSOR, (mark_update,), before="TensorStorage._wait_for_init"),
        _after(_TENSOR, None, "from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer\n",
               "from torchrl.data.replay_buffers.write_journal import capacity_of, journal_of"),
        Edit(_SLICE, "SliceSampler", (_CACHE_VALUES_SEEN,)),
    ]


def _slice_boundaries_from_index() -> list:
    return [
        *(Module(f"{_SBI}.{name}") for name in ("storage_index", "slice_boundaries")),
        # record_write, in both TensorStorage.set (torch >= 2.0 and < 2.0), around 0004's record
        _after(_TENSOR, "TensorStorage.set", "    set_cursor: bool = True,\n):\n",
               "    index = existing_index(self)",
               "    versions = None if index is None or is_compiling() else index.begin_write()"),
        _after(_TENSOR, "TensorStorage.set", "\n        self.mark_update(cursor)\n",
               "    if versions is not None:", "        index.wrote(versions)"),
        _after(_TENSOR, None, "from torchrl.data.replay_buffers.checkpointers import TensorStorageCheckpointer\n",
               "from torchrl.data.replay_buffers.storage_index import existing_index"),
        _after(f"{RB}/storages/base.py", "Storage.__getstate__", "    state = copy(self.__dict__)\n",  # state_without_index
               "    # the trajectory index is the storage's own: never pickled",
               '    state.pop("_trajectory_index", None)'),
        # note_default_keys, first: the body rebinds end_key; take_boundary_index
        Edit(_SLICE, "SliceSampler.__init__", (
            ("    use_gpu: torch.device | bool = False,\n):\n",
             "    use_gpu: torch.device | bool = False,\n    boundary_index: bool = True,\n):\n"
             "    self._default_boundary_keys = traj_key is None and end_key is None and end_keys is None\n"),
            ("    self.cache_values = cache_values\n",
             "    self.cache_values = cache_values\n    if not isinstance(boundary_index, bool):\n"
             '        raise TypeError(f"boundary_index must be True or False, got {boundary_index!r}")\n'
             "    self._boundary_index = boundary_index\n"),
        )),
        _after(_SLICE, "SliceSampler._get_stop_and_length", "def _get_stop_and_length(self, storage, fallback=True):\n",
               "    boundaries = _stop_and_length_from_index(self, storage)",
               "    if boundaries is not None:", "        return boundaries"),
        Edit(_SLICE, "SliceSampler", (_CACHE_VALUES, _BOUNDARY_INDEX)),
        _after(_SLICE, None, "from .base import Sampler\n",
               "from torchrl.data.replay_buffers.samplers._slice_boundaries import _stop_and_length_from_index"),
    ]


def _slice_draw_from_index() -> list:
    return [
        Module(f"{_SBI}.slice_sampling"),
        _after(_SLICE, "SliceSampler.sample",  # sample_from_index
               "def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:\n",
               "    sampled = _sample_from_index(self, storage, batch_size)",
               "    if sampled is not None:", "        return sampled"),
        _after(_SLICE, None, "from .base import Sampler\n",
               "from torchrl.data.replay_buffers.samplers._slice_sampling import _sample_from_index"),
    ]


def _slice_without_replacement_from_index() -> list:
    from torchrl_fixes.fixes.slice_boundary_index import slice_without_replacement as fix

    # beside the sampler it serves, which imports SamplerWithoutReplacement already
    return [
        Functions(_SWR, _reached(fix, "_sample_without_replacement_from_index"), before="SliceSamplerWithoutReplacement"),
        _after(_SWR, "SliceSamplerWithoutReplacement.sample",  # sample_without_replacement_from_index
               ") -> tuple[tuple[torch.Tensor, ...], dict]:\n",
               "    sampled = _sample_without_replacement_from_index(self, storage, batch_size)",
               "    if sampled is not None:", "        return sampled"),
        Edit(_SWR, None, (("\nimport torch\n", "\nimport numpy as np\nimport torch\n"),)),  # the blank line stays above
        _after(_SWR, None, "from .slice import SliceSampler\n",
               "from torchrl.data.replay_buffers.samplers._slice_boundaries import _reads_index",
               "from torchrl.data.replay_buffers.samplers._slice_sampling import (",
               "    _slice_request,", "    _slices_of_drawn,", "    _warn_if_short,", ")"),
        *_passes_boundary_index(_SWR, "SliceSamplerWithoutReplacement", "use_gpu: bool | torch.device = False,",
                                "use_gpu=use_gpu,", """\
            accelerate the sampling when the buffer content is large.
            Defaults to ``False``.
"""),
    ]


def _variable_length_slices() -> list:
    from torchrl_fixes.fixes.slice_boundary_index import slice_lengths as fix

    edited = [new for _, new in fix.TENSOR_SLICES_EDITS]
    # a tensor helper among utils.py's (after unravel_index and tree_iter), away from 0001's and 0002's code
    return [
        Functions(f"{RB}/utils.py", _reached(fix, *edited), before="_auto_device"),
        Edit(_SLICE, "SliceSampler._tensor_slices_from_startend", fix.TENSOR_SLICES_EDITS),
        _after(_SLICE, None, "from torchrl.data.replay_buffers.utils import (\n", *_called(fix, edited)),
    ]


# What the trajectory index keeps for the eligible starts of 0010, which adds it: its
# revision and the key ranges of its last changes (changes_since), and stops_around.
_TI = f"{RB}/trajectory_index.py"
_CHANGES_KEPT = (
    Edit(_TI, None, (
        ("from __future__ import annotations\n\nfrom collections import deque\n\nimport numpy as np\n",
         "from __future__ import annotations\n\nimport numpy as np\n"),
        ("_LANE_FIRST = np.iinfo(np.int64).max\n# The changes :meth:`TrajectoryIndex.changes_since` can list; "
         "a reader further behind rebuilds.\n_KEPT_CHANGES = 256\n", "_LANE_FIRST = np.iinfo(np.int64).max\n"),
    )),
    Edit(_TI, "TrajectoryIndex.__init__", ((
        "    self._boundaries = None\n    self.revision = self._assigned = 0  # the changes made to the stops\n"
        "    self._changes = deque(maxlen=_KEPT_CHANGES)  # their key ranges\n", "    self._boundaries = None\n"),)),
    Edit(_TI, "TrajectoryIndex.assign", ((
        "    self._stops = SortedKeys(stops, gaps)\n    self.revision += 1\n"
        "    self._assigned = self.revision  # changes_since knows no change before\n",
        "    self._stops = SortedKeys(stops, gaps)\n"),)),
    Edit(_TI, "TrajectoryIndex._rewrite", ((
        "    stops, base = self._stops, lo - lo % self.capacity\n    self.revision += 1\n"
        "    self._changes.append((lo, hi))\n", "    stops, base = self._stops, lo - lo % self.capacity\n"),)),
)
_HELD_METHODS = ("changes_since", "stops_around")  # together, right before boundaries


def _held_methods() -> tuple:
    """The :class:`Functions` entries of :data:`_HELD_METHODS`, from the runtime's TrajectoryIndex."""
    from torchrl_fixes.fixes.slice_boundary_index import trajectory_index as module

    source = inspect.getsource(module)
    return tuple((f"TrajectoryIndex.{name}", _segment(source, _nodes(source, f"TrajectoryIndex.{name}")[0]),
                  module.__name__) for name in _HELD_METHODS)


def _trajectory_index() -> list:
    methods = "\n".join(textwrap.indent(source, "    ") for _, source, _ in _held_methods()) + "\n"
    return [Module(f"{_SBI}.trajectory_index", (*_CHANGES_KEPT, Edit(_TI, "TrajectoryIndex", ((methods, ""),))))]


def _trajectory_index_changes() -> list:
    """What 0003 held back (:data:`_CHANGES_KEPT`), in the runtime's words."""
    return [
        *(edit._replace(edits=tuple((new, old) for old, new in edit.edits)) for edit in _CHANGES_KEPT),
        Functions(_TI, _held_methods(), before="TrajectoryIndex.boundaries"),
    ]


def _prioritized_slice_stops() -> list:
    from torchrl_fixes.fixes.slice_boundary_index.prioritized_slices import SLICE_STOP_EDITS

    return [Edit(_PSS, "PrioritizedSliceSampler.sample", SLICE_STOP_EDITS)]


def _prioritized_slice_eligible_starts() -> list:
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler

    import torchrl_fixes
    from torchrl_fixes.fixes.slice_boundary_index import prioritized_slices as fix

    # the edits find the stock lines they replace; neither 0002's edits nor 0009's touch them
    edits = fix.prioritized_sample_edits(torchrl_fixes.get_original(PrioritizedSliceSampler, "sample"))
    return [
        *_trajectory_index_changes(),
        Functions(_PSS, _reached(fix, "_sample_eligible_starts"), before="PrioritizedSliceSampler"),
        Edit(_PSS, "PrioritizedSliceSampler.sample", edits),
        _after(_PSS, "PrioritizedSliceSampler.__getstate__",  # state_without_eligible_starts
               "    state.update(PrioritizedSampler.__getstate__(self))\n",
               "    # the eligible starts are the sampler's own: never pickled",
               '    state.pop("_eligible_starts", None)'),
        _after(_PSS, "PrioritizedSliceSampler.loads", "def loads(self, path):\n",  # forget_eligible_starts
               "    # the priorities it writes in place are read anew",
               '    self.__dict__.pop("_eligible_starts", None)'),
        _after(_PSS, None, "from .prioritized import PrioritizedSampler\n",
               "from torchrl.data.replay_buffers.samplers._slice_boundaries import (",
               "    _current_index,", "    _overrides,", "    _reads_index,", ")"),
        # note_priorities_set, as the sampler's own update_priority
        Edit(_PSS, "PrioritizedSliceSampler", (("    def __getstate__(self):\n", _UPDATE_PRIORITY + "    def __getstate__(self):\n"),)),
        *_passes_boundary_index(_PSS, "PrioritizedSliceSampler", "max_priority_within_buffer: bool = False,",
                                "span=span,", """\
            the maximum value since the instantiation of the sampler.
            Defaults to ``False``.
"""),
    ]


_UPDATE_PRIORITY = '''    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: Storage | None = None,
    ) -> None:
        """Updates the priorities of ``index``: see :meth:`PrioritizedSampler.update_priority` for the arguments.

        The sum tree the slice starts are drawn from reads these rows anew at the next sample.
        A subclass that overrides this method samples as earlier releases do, setting the
        priorities of every trajectory's last rows to zero at each sample.
        """
        super().update_priority(index, priority, storage=storage)
        eligible_starts = self.__dict__.get("_eligible_starts")
        if eligible_starts is not None:
            eligible_starts.priorities_set(index)

'''


PRS = (
    PR("0001-pinned-sample-output", _pinned_sample_output),
    PR("0002-single-gather", _single_gather, "single_gather"),
    PR("0003-trajectory-index", _trajectory_index),
    PR("0004-storage-write-journal", _storage_write_journal),
    PR("0005-slice-boundaries-from-index", _slice_boundaries_from_index, "slice_boundary_index"),
    PR("0006-slice-draw-from-index", _slice_draw_from_index),
    PR("0007-slice-without-replacement-from-index", _slice_without_replacement_from_index),
    PR("0008-variable-length-slices", _variable_length_slices),
    PR("0009-prioritized-slice-stops", _prioritized_slice_stops),
    PR("0010-prioritized-slice-eligible-starts", _prioritized_slice_eligible_starts),
)


def _upstream_text(text: str, where: str) -> str:
    """``text`` as TorchRL holds it: runtime imports pointed at their homes, TorchRL's logger,
    doctests without this package; one line of error if it still names ``torchrl_fixes``."""
    for module, home in HOMES.items():
        text = text.replace(f"from {module} import", f"from {home[:-3].replace('/', '.')} import")
    if 'logger = logging.getLogger("torchrl_fixes")\n' in text:
        text = text.replace('logger = logging.getLogger("torchrl_fixes")\n', "")
        text = text.replace("import logging\n", "from torchrl._utils import logger\n", 1)
    text = text.replace(">>> import torch, torchrl_fixes\n", ">>> import torch\n")
    text = re.sub(r"^ *>>> import torchrl_fixes\n", "", text, flags=re.MULTILINE)
    for line in text.splitlines():
        if "torchrl_fixes" in line:
            raise ExportError(f"{where} still names torchrl_fixes: {line.strip()!r}")
    return text


def _nodes(text: str, scope: str) -> list:
    """Every definition ``scope`` (``"Class.name"`` or ``"name"``) of ``text``."""
    *owners, name = scope.split(".")
    body = ast.parse(text).body
    for owner in owners:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner), [])
    return [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name]


def _segment(text: str, node, new: str | None = None) -> str:
    """The definition ``node`` of ``text`` (decorators in; ``None``: all), dedented; or ``text`` with ``new`` there."""
    lines = text.splitlines(keepends=True)
    start = 0 if node is None else (getattr(node, "decorator_list", None) or [node])[0].lineno - 1
    end = len(lines) if node is None else node.end_lineno
    if new is None:
        return textwrap.dedent("".join(lines[start:end]))
    return "".join(lines[:start]) + textwrap.indent(new, " " * getattr(node, "col_offset", 0)) + "".join(lines[end:])


def _apply(tree: Path, change, before: dict[str, str | None]) -> None:
    """Makes ``change`` in ``tree``, noting in ``before`` what each file it writes held."""
    path = HOMES[change.source] if isinstance(change, Module) else change.path
    before.setdefault(path, (tree / path).read_text() if (tree / path).is_file() else None)
    if isinstance(change, (Module, Upstream)):
        if before[path] is not None:
            raise ExportError(f"{path} is already in TorchRL")
        module = isinstance(change, Module) and importlib.import_module(change.source)
        text = _upstream_text(inspect.getsource(module) if module else (UPSTREAM_DIR / path).read_text(), change[0])
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text if text.startswith("# Copyright") else _LICENSE + text)
        for edit in change.held if isinstance(change, Module) else ():
            _apply(tree, edit, before)
        return None
    text = (tree / path).read_text()
    if isinstance(change, Edit):
        nodes = [None] if change.scope is None else _nodes(text, change.scope)
        if not nodes:
            raise ExportError(f"{path} has no {change.scope}")
        for node in reversed(nodes):  # the last first: the others keep their lines
            new = _segment(text, node)
            for old, replacement in change.edits:
                if new.count(old) != 1:
                    raise ExportError(f"{path}:{change.scope}: {old.strip()!r} is not found once")
                new = new.replace(old, replacement)
            text = _segment(text, node, new)
        return (tree / path).write_text(text)
    ahead = []
    for name, source, module in change.functions:
        source, nodes = _upstream_text(source, f"{module}.{name}"), _nodes(text, name)
        if len(nodes) > 1:
            raise ExportError(f"{path}: {name} is defined {len(nodes)} times")
        text = _segment(text, nodes[0], source) if nodes else text
        ahead += [] if nodes else [source]
    if ahead:
        (node,) = _nodes(text, change.before)
        text = _segment(text, node, "\n\n".join(ahead) + "\n\n" + _segment(text, node))
    (tree / path).write_text(text)


def _format(tree: Path, paths: list[str]) -> None:
    """Formats ``paths`` of ``tree`` as pytorch/rl's pre-commit does: ufmt (black + usort)."""
    command = [sys.executable, "-m", "ufmt"] if importlib.util.find_spec("ufmt") else [shutil.which("ufmt")]
    if command[0] is None:
        raise ExportError(f"upstream's formatter is not installed (pip install {' '.join(FORMATTER_REQUIREMENTS)})")
    result = subprocess.run([*command, "format", *paths], cwd=tree, capture_output=True, text=True)
    if result.returncode:
        raise ExportError("ufmt failed: " + (result.stderr.strip().splitlines() or ["no output"])[-1])


def upstream_files() -> dict[str, str]:
    """:data:`UPSTREAM_FILES`, checked against what ``upstream/`` holds (its conftest.py aside)."""
    present = sorted(p.relative_to(UPSTREAM_DIR).as_posix() for p in UPSTREAM_DIR.rglob("*")
                     if p.is_file() and p.parent != UPSTREAM_DIR and "__pycache__" not in p.parts)
    for path in [p for p in present if UPSTREAM_FILES.get(p) not in {pr.name for pr in PRS}]:
        raise ExportError(f"upstream/{path} is in no pull request: add it to UPSTREAM_FILES in {__name__}")
    for path in set(UPSTREAM_FILES) - set(present):
        raise ExportError(f"upstream/{path} is listed in UPSTREAM_FILES but does not exist")
    return dict(UPSTREAM_FILES)


def render() -> dict[str, str]:
    """Patch file name -> its text, for every pull request of :data:`PRS`, in order."""
    series, site, files, rendered = installed_series(), installed_torchrl_root(), upstream_files(), {}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        shutil.copytree(site / "torchrl", tree / "torchrl", ignore=shutil.ignore_patterns("__pycache__"))
        (tree / "pyproject.toml").write_text(UPSTREAM_PYPROJECT)  # usort's settings, as upstream's
        for pr in PRS:
            before: dict[str, str | None] = {}
            tests = [path for path, name in files.items() if name == pr.name]
            for change in [*pr.changes(), *map(Upstream, tests)]:
                _apply(tree, change, before)
            _format(tree, [path for path in before if path.endswith(".py")])
            after = {path: (tree / path).read_text() for path in before}
            _upstream_text("".join(after.values()), pr.name)  # nothing names the runtime
            before = {path: text for path, text in before.items() if text is not None}
            rendered[f"{pr.name}.patch"] = _header(pr, series, tests) + "\n" + _git_diff(before, after)
    return rendered


def _header(pr: PR, series: Series, tests: list[str]) -> str:
    if not (series.folder / f"{pr.name}.md").is_file():
        raise ExportError(f"{series.folder / pr.name}.md is missing: a pull request's text is beside its patch")
    title, _, body = (series.folder / f"{pr.name}.md").read_text().partition("\n")
    body = body.replace("{fallbacks}", fallbacks_text(pr.fix)) if "{fallbacks}" in body else body
    return (f"Subject: [PATCH] {title.removeprefix('# ').strip()}\n\n{body.strip()}\n\nApplies to: {series.label}, "
            "with `git apply -p1` from the repository root,\n  after the patches before it.\n"
            + (f"Tests (in this diff): {', '.join(tests)}.\n" if tests else ""))


def fallbacks_text(fix: str) -> str:
    """The fix's declared fallbacks (:attr:`torchrl_fixes._core.registry.Fix.fallbacks`), wrapped."""
    from torchrl_fixes.fixes import ALL_FIXES

    return textwrap.fill(next(f for f in ALL_FIXES if f.name == fix).fallbacks + ".", 80)


def _git_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """``git diff`` from ``before`` to ``after`` (path -> text), with a/ and b/ paths."""
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in [*((f"a/{p}", t) for p, t in before.items()), *((f"b/{p}", t) for p, t in after.items())]:
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / path).write_text(text)
            (Path(tmp) / path).chmod(0o644)
        (Path(tmp) / "a").mkdir(exist_ok=True)
        command = "git -c core.quotepath=off diff --no-index --no-prefix --no-color --no-ext-diff --full-index a b"
        result = subprocess.run(command.split(), cwd=tmp, capture_output=True, text=True)
    if result.returncode not in (0, 1):
        raise ExportError(f"git diff failed: {' '.join(result.stderr.split())}")
    return result.stdout


def installed_series() -> Series:
    """The series written against the installed TorchRL; one line of error if none is."""
    from torchrl_fixes._core.versions import installed_version

    version = str(installed_version("torchrl"))
    found = [series for series in SERIES if series.torchrl == version]
    if not found:
        raise ExportError(f"no series of patches/ targets TorchRL {version}; the series: "
                          + ", ".join(f"{s.name} ({s.label})" for s in SERIES))
    return found[0]


def installed_torchrl_root() -> Path:
    """The folder holding the installed ``torchrl`` package, which the series targets."""
    import torchrl

    installed_series()
    return Path(torchrl.__file__).parent.parent


def patched_copy(dest: Path, patches_dir: Path | None = None) -> Path:
    """Copies the installed ``torchrl`` into ``dest``, applies the series (from ``patches_dir``,
    its own folder by default) in order, and returns the untouched package's folder."""
    site, dest = installed_torchrl_root(), Path(dest).resolve()
    if (dest / "torchrl").exists():
        raise ExportError(f"{dest / 'torchrl'} already exists")
    shutil.copytree(site / "torchrl", dest / "torchrl", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in sorted(Path(patches_dir or installed_series().folder).glob(_PATCHES)):
        # never as part of a repository above dest, where git skips paths outside the folder
        result = subprocess.run(["git", "apply", "-p1", str(Path(patch).resolve())], cwd=dest, capture_output=True,
                                text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(dest.parent)})
        if result.returncode:
            raise ExportError(f"{patch.name} does not apply: {' '.join(result.stderr.split())}")
    return site / "torchrl"


def export(out: Path | None = None, *, check: bool = False) -> list[str]:
    """Writes the series into ``out`` (its folder by default) and removes the numbered patches
    it no longer has; returns their names. With ``check``, names them and writes nothing."""
    rendered, out = render(), Path(out or installed_series().folder)
    changed = [name for name, text in rendered.items() if not (out / name).is_file() or (out / name).read_text() != text]
    stale = [patch.name for patch in out.glob(_PATCHES) if patch.name not in rendered]
    for name in [] if check else changed + stale:
        (out / name).write_text(rendered[name]) if name in rendered else (out / name).unlink()
    return changed + stale
