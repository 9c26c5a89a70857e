"""Pinned memory stood in for on a machine with no accelerator (shared by the suites' fixtures)."""
from __future__ import annotations

import importlib
import threading

import torch

from conformance import reference


class FakePinning:
    """Stands in for pinned memory on a machine with no accelerator.

    ``Tensor.pin_memory`` returns a copy and records it; ``Tensor.is_pinned`` is
    true for any tensor sharing the storage of a recorded copy, as a view of a
    pinned tensor is pinned. The thread of each pinning call is recorded too.
    """

    def __init__(self):
        self._storages: dict[int, torch.Tensor] = {}
        self.threads: dict[int, str] = {}
        self.calls = 0

    def pin_memory(self, tensor, device=None):
        self.calls += 1
        if self.is_pinned(tensor):
            return tensor
        copy = tensor.clone()
        ptr = copy.untyped_storage().data_ptr()
        self._storages[ptr] = copy  # keep alive, so the address is not reused
        self.threads[ptr] = threading.current_thread().name
        return copy

    def is_pinned(self, tensor, device=None):
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            return False
        return tensor.untyped_storage().data_ptr() in self._storages

    def thread_of(self, tensor) -> str:
        return self.threads[tensor.untyped_storage().data_ptr()]


def install_fake_pinning(monkeypatch) -> FakePinning:
    """Makes an accelerator 'available' and routes ``pin_memory`` / ``is_pinned`` through a
    :class:`FakePinning`, for the duration of ``monkeypatch``."""
    pinning = FakePinning()
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    forget_pin_memory_answer()
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, device=None: pinning.pin_memory(t))
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, device=None: pinning.is_pinned(t))
    return pinning


def forget_pin_memory_answer() -> None:
    """The next sample asks afresh whether an accelerator exists (the fixed pinning keeps
    the answer per process); call it after a fake accelerator is removed as well."""
    module = importlib.import_module(reference.pin_memory_function().__module__)
    answer = getattr(module, "_pin_memory_available", None)
    if answer is not None:  # stock asks at every sample
        answer.cache_clear()
