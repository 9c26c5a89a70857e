"""Stock versus patched ``pin_memory=True``, side by side, on this machine.

Each scenario builds a replay buffer with ``pin_memory=True``, samples it, and
reports what came back: an exception, or how many of the returned tensors are
pinned. The stock run happens inside :func:`torchrl_fixes.disabled`. The transform
that builds a new TensorDict is the one the conformance suite samples through
(:class:`conformance.pinned_sample_transforms.KeepObservation`).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from tensordict import TensorDict

from conformance.harness import tensor_leaves
from conformance.pinned_sample_transforms import KeepObservation
from torchrl_fixes._core.warning_categories import PinMemoryUnavailableWarning


def _tensordict_buffer(transform=None, ndim=1):
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64, ndim=ndim), pin_memory=True, transform=transform
    )
    shape = [2, 8] if ndim == 2 else [16]
    rb.extend(TensorDict({"obs": torch.randn(*shape, 4)}, shape))
    return rb


def _tensor_buffer():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(64), pin_memory=True)
    rb.extend(torch.randn(16, 4))
    return rb


SCENARIOS: dict[str, Callable[[], object]] = {
    "TensorDictReplayBuffer.sample": lambda: _tensordict_buffer().sample(4),
    "  transform -> device=None": lambda: _tensordict_buffer(KeepObservation()).sample(4),
    "  ndim=2 storage (stacked index)": lambda: _tensordict_buffer(ndim=2).sample(4),
    "  rb[index], device=None": lambda: _tensordict_buffer(KeepObservation())[0:4],
    "ReplayBuffer.sample(return_info)": lambda: _tensor_buffer().sample(4, return_info=True),
}


@dataclass
class Outcome:
    pinned: int = 0
    leaves: int = 0
    warned: int = 0
    error: str = ""

    def __str__(self) -> str:
        if self.error:
            return f"raises {self.error}"
        text = f"{self.pinned}/{self.leaves} pinned"
        if self.warned:
            text += ", warns"
        return text


def _run(scenario: Callable[[], object]) -> Outcome:
    outcome = Outcome()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            leaves = [leaf for _, leaf in tensor_leaves(scenario())]
        except RuntimeError as err:
            outcome.error = f"RuntimeError: {str(err).splitlines()[0]}"
            return outcome
    outcome.leaves = len(leaves)
    outcome.pinned = sum(bool(leaf.is_pinned()) for leaf in leaves)
    outcome.warned = sum(issubclass(w.category, PinMemoryUnavailableWarning) for w in caught)
    return outcome


def compare_pinned_samples() -> str:
    """Runs every scenario on stock and on patched TorchRL; returns a table.

    Examples:
        >>> from devtools.pinned_sample_report import compare_pinned_samples
        >>> print(compare_pinned_samples())  # doctest: +SKIP
    """
    import torchrl_fixes

    accelerator = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    rows = []
    torchrl_logger = logging.getLogger("torchrl")
    level = torchrl_logger.level
    torchrl_logger.setLevel(logging.WARNING)  # its per-storage INFO lines would bury the table
    try:
        for name, scenario in SCENARIOS.items():
            with torchrl_fixes.disabled():
                stock = _run(scenario)
            patched = _run(scenario)
            rows.append((name, str(stock), str(patched)))
    finally:
        torchrl_logger.setLevel(level)
    header = ("pin_memory=True", "stock TorchRL", "with torchrl_fixes")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(3)]
    lines = [f"pinned sample output (accelerator: {accelerator or 'none'})"]
    for row in (header, *rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)
