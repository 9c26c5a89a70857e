"""What the suite compares: stock TorchRL, and TorchRL with the fixes.

The same tests run in two set-ups:

- runtime (the default): ``torchrl`` is a stock install and ``torchrl_fixes`` patches it
  in this process. Stock runs inside :func:`torchrl_fixes.disabled`.
- upstream (``nox -s upstream``): ``torchrl`` is a copy of the installed source with
  ``patches/`` applied, and the runtime fixes are off (``TORCHRL_FIXES=0``). Stock is
  compiled from the untouched install named by ``TORCHRL_FIXES_STOCK_SOURCE``
  (:mod:`conformance.stock_source`) and runs inside :func:`stock`.

Tests ask this module for stock, for whether a fix is in effect, and for the few
objects that live in different places in the two set-ups (the boundary index
module, the pinning function, the warning category, the logger).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import torchrl_fixes
from torchrl_fixes._core import patching

STOCK_SOURCE_ENV = "TORCHRL_FIXES_STOCK_SOURCE"
UPSTREAM = bool(os.environ.get(STOCK_SOURCE_ENV))

# Where each patch puts its code in TorchRL's source: the fix is in effect there.
_UPSTREAM_CODE = {
    "pinned_sample_output": ("torchrl.data.replay_buffers.utils", "_pin_tensor"),
    "slice_boundary_index": (
        "torchrl.data.replay_buffers.samplers._slice_boundaries",
        "_stop_and_length_from_index",
    ),
    "single_gather": ("torchrl.data.replay_buffers.samplers.slice", "_read_entries"),
}

FIX_NAMES = tuple(_UPSTREAM_CODE)

runtime_only = pytest.mark.skipif(
    UPSTREAM,
    reason="checks how the runtime fixes are applied; the patched source has none to apply",
)


_reference = None


def _stock_reference():
    global _reference
    if _reference is None:
        from conformance import stock_source

        applied = [row.name for row in torchrl_fixes.status() if row.applied]
        if applied:
            raise RuntimeError(
                f"{STOCK_SOURCE_ENV} is set but fixes are applied at runtime "
                f"({', '.join(applied)}): run with TORCHRL_FIXES=0"
            )
        _reference = stock_source.build(Path(os.environ[STOCK_SOURCE_ENV]))
    return _reference


def stock():
    """A context manager that runs its block on stock TorchRL.

    Objects built inside (buffers, samplers, storages) keep running stock code
    afterwards.
    """
    if UPSTREAM:
        return _stock_reference().stock()
    return torchrl_fixes.disabled()


def _upstream_code(name: str) -> Any:
    module_name, attr = _UPSTREAM_CODE[name]
    try:
        if importlib.util.find_spec(module_name) is None:
            return None
    except ModuleNotFoundError:
        return None
    return getattr(importlib.import_module(module_name), attr, None)


def why_not_in_effect(name: str) -> str | None:
    """Why fix ``name`` does not act in this process; None when it does.

    Runtime: the fix is not applied (its status says why). Upstream: the patched
    source does not hold the fix's code.
    """
    if UPSTREAM:
        _stock_reference()
        if _upstream_code(name) is None:
            module_name, attr = _UPSTREAM_CODE[name]
            return f"the TorchRL source has no {module_name}.{attr}: its patch is not applied"
        return None
    row = torchrl_fixes.status()[name]
    return None if row.applied else f"{row.state}: {row.reason}"


def in_effect(name: str) -> bool:
    return why_not_in_effect(name) is None


def stock_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` as stock TorchRL defines it."""
    if UPSTREAM:
        found = _stock_reference().stock_objects.get((owner, name))
        if found is not None:
            return found
        return patching.class_attribute(owner, name)
    return torchrl_fixes.get_original(owner, name)


# Where each module of the slice boundary index lives in the patched source.
_UPSTREAM_INDEX_MODULES = {
    "trajectory_index": "torchrl.data.replay_buffers.trajectory_index",
    "storage_index": "torchrl.data.replay_buffers.storage_index",
    "slice_boundaries": "torchrl.data.replay_buffers.samplers._slice_boundaries",
    "slice_sampling": "torchrl.data.replay_buffers.samplers._slice_sampling",
}


def boundary_index_module(part: str = "slice_boundaries"):
    """A module of the slice boundary index: ``"trajectory_index"`` (the structure),
    ``"storage_index"`` (the storage's entry), ``"slice_boundaries"`` (what samplers
    read: ``fallback_reason``) or ``"slice_sampling"`` (the draw)."""
    if UPSTREAM:
        return importlib.import_module(_UPSTREAM_INDEX_MODULES[part])
    return importlib.import_module(f"torchrl_fixes.fixes.slice_boundary_index.{part}")


def fallback_reason(sampler, storage):
    """Why ``sampler`` recovers the boundaries of ``storage`` as stock does (None: it does not)."""
    # the runtime's checks are pure functions of the sampler and the storage: they
    # answer for the patched source too
    from torchrl_fixes.fixes.slice_boundary_index import fallback_reason

    return fallback_reason(sampler, storage)


def boundary_source(storage):
    """What the last slice sample of ``storage`` read its boundaries from: the runtime's
    answer, which reads the storage's index as the patched source keeps it too."""
    from torchrl_fixes.fixes.slice_boundary_index import boundary_source

    return boundary_source(storage)


def pin_memory_function():
    """The function that pins a sample's tensors."""
    if UPSTREAM:
        return importlib.import_module("torchrl.data.replay_buffers.utils")._pin_memory
    return importlib.import_module("torchrl_fixes.fixes.pinned_sample_output")._pin_memory


def pin_memory_warning() -> type[Warning]:
    """The category of the warning given when no accelerator can pin memory."""
    if UPSTREAM:
        return UserWarning
    from torchrl_fixes._core.warning_categories import PinMemoryUnavailableWarning

    return PinMemoryUnavailableWarning


# The logger the boundary index reports to.
INDEX_LOGGER = "torchrl" if UPSTREAM else "torchrl_fixes"


def skip_where_stock_cannot_copy(copier) -> None:
    """Skips where ``copier`` (``copy.deepcopy``, a pickle round trip) fails on a stock buffer.

    Before 0.11 a tensor storage keeps its length in a ``multiprocessing.Value``,
    which pickle and deepcopy refuse outside a spawn.
    """
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    with stock():
        rb = ReplayBuffer(storage=LazyTensorStorage(4))
        rb.extend(TensorDict({"obs": torch.zeros(2)}, [2]))
        try:
            copier(rb)
        except RuntimeError as err:
            pytest.skip(f"a stock buffer cannot be copied so on this TorchRL either: {err}")


# Why a test that needs TorchRL's C++ extension (segment trees) is skipped; the detail of
# the failed import is left to the session that must run them, which fails instead.
EXTENSION_SKIP_REASON = (
    "needs TorchRL's C++ extension, which does not load beside this torch "
    "(nox -s tests installs one it loads beside: torch 2.14.1)"
)
# Set to 1 by the session meant to cover the prioritized buffers: there, a test that
# needs the extension fails where it does not load, instead of skipping.
REQUIRE_EXTENSION_ENV = "TORCHRL_FIXES_REQUIRE_EXTENSION"


def extension_load_error() -> BaseException | None:
    """Why a stock ``PrioritizedSampler`` cannot be built here, or None.

    It fails where TorchRL's C++ extension (its segment trees) does not load: the
    environment cannot run a test that needs one, which is not a failure of the fixes.
    """
    from torchrl.data import PrioritizedSampler

    with stock():
        try:
            PrioritizedSampler(8, alpha=0.7, beta=0.5)
        # 0.8 and 0.9 raise NameError: the segment tree class was never imported
        except (RuntimeError, ImportError, NameError) as err:
            return err
    return None


def extension_required() -> bool:
    """Whether a test needing the extension fails, rather than skips, where it does not load."""
    return os.environ.get(REQUIRE_EXTENSION_ENV) == "1"


def _extension_import_error(sampler_error: BaseException) -> str:
    """Why the segment trees are missing, in one line.

    TorchRL's own message points at a log line ("See warning above.") that a test
    run does not show, so the import error itself is given instead.
    """
    try:
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401
    except ImportError as err:
        text = (str(err).splitlines() or [""])[0]
        # "/path/to/_torchrl.so: undefined symbol: ..." -> "undefined symbol: ..."
        text = text.split(".so: ", 1)[-1]
        return f"importing torchrl._torchrl raises ImportError: {text[:120]}"
    return str(sampler_error).replace("See warning above.", "").strip()


def skip_without_extension() -> None:
    """Skips the calling test where TorchRL's C++ extension does not load, or fails it where
    :func:`extension_required`."""
    err = extension_load_error()
    if err is None:
        return
    if extension_required():
        pytest.fail(
            f"TorchRL's C++ extension does not load beside torch {torch.__version__}, "
            f"so a stock PrioritizedSampler fails too: {_extension_import_error(err)}"
        )
    pytest.skip(EXTENSION_SKIP_REASON)
