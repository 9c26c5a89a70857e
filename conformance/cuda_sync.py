"""How many times an operation makes the host wait on a CUDA device.

Under ``torch.cuda.set_sync_debug_mode("warn")`` every CUDA call that blocks the
host until the device catches up (a ``.item()``, a ``nonzero``, a copy to the
host) warns; :func:`count_host_synchronisations` counts those warnings. The
conformance suite compares stock's count with the fixes' count, and
``python -m devtools gpu`` reports both.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Waits for ``device`` to finish what was queued on it (nothing to wait for off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_host_synchronisations(operation: Callable[[], object], device=None) -> int:
    """Runs ``operation`` once and returns how many synchronising CUDA calls it made.

    ``device`` first finishes the work already queued on it, so that only the
    waits of ``operation`` are counted. The sync debug mode is put back to what
    it was afterwards.

    Args:
        operation: what to run, with no arguments.
        device (torch.device, optional): the CUDA device to drain first; defaults
            to the current one.
    """
    torch.cuda.synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            operation()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(w.message) for w in caught)
