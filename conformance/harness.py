"""Run one scenario on stock and on patched TorchRL, and compare what they return.

A scenario is a callable that builds whatever it needs (buffers, data) and returns
the outputs to compare. The stock run happens inside
:func:`conformance.reference.stock` (:func:`torchrl_fixes.disabled` on a stock
install), so everything it builds is a stock object; both
runs start from the same generator state: torch's, NumPy's (stock
``PrioritizedSampler`` draws from ``np.random`` when it has no generator) and
Python's. Outputs are compared exactly
(``torch.equal``, same dtype, shape, device and structure), never with a tolerance.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch
from tensordict import is_tensor_collection

from conformance import reference


def seed_everything(seed: int) -> None:
    """Puts every global generator TorchRL may draw from in the state ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def run_stock(scenario: Callable[[], Any], seed: int = 0) -> Any:
    """Runs ``scenario`` on stock TorchRL, from generator state ``seed``."""
    with reference.stock():
        seed_everything(seed)
        return scenario()


def run_patched(scenario: Callable[[], Any], seed: int = 0) -> Any:
    """Runs ``scenario`` with the active fixes, from generator state ``seed``."""
    seed_everything(seed)
    return scenario()


def assert_identical(stock: Any, patched: Any, where: str = "output") -> None:
    """Asserts two outputs are the same structure holding exactly equal values.

    Tensor collections must have the same class, batch size, device and keys, and
    every leaf must be identical; tensors must match in dtype, shape and device and
    be ``torch.equal``; tuples, lists and dicts are compared item by item; anything
    else with ``==``.
    """
    if is_tensor_collection(stock) or is_tensor_collection(patched):
        assert type(stock) is type(patched), f"{where}: {type(stock)} != {type(patched)}"
        assert stock.batch_size == patched.batch_size, f"{where}: batch size differs"
        assert stock.device == patched.device, f"{where}: device {stock.device} != {patched.device}"
        stock_keys = set(stock.keys(include_nested=True, leaves_only=True))
        patched_keys = set(patched.keys(include_nested=True, leaves_only=True))
        assert stock_keys == patched_keys, f"{where}: keys {stock_keys ^ patched_keys} differ"
        for key in sorted(stock_keys, key=str):
            assert_identical(stock.get(key), patched.get(key), f"{where}[{key!r}]")
    elif isinstance(stock, torch.Tensor) or isinstance(patched, torch.Tensor):
        assert isinstance(stock, torch.Tensor) and isinstance(patched, torch.Tensor), where
        assert stock.dtype == patched.dtype, f"{where}: dtype {stock.dtype} != {patched.dtype}"
        assert stock.shape == patched.shape, f"{where}: shape {stock.shape} != {patched.shape}"
        assert stock.device == patched.device, f"{where}: device differs"
        assert torch.equal(stock, patched), f"{where}: values differ"
    elif isinstance(stock, (tuple, list)):
        assert type(stock) is type(patched), f"{where}: {type(stock)} != {type(patched)}"
        assert len(stock) == len(patched), f"{where}: length differs"
        for i, (a, b) in enumerate(zip(stock, patched)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(stock, dict):
        assert isinstance(patched, dict), f"{where}: {type(patched)} is not a dict"
        assert stock.keys() == patched.keys(), f"{where}: keys differ"
        for key in stock:
            assert_identical(stock[key], patched[key], f"{where}[{key!r}]")
    else:
        assert stock == patched, f"{where}: {stock!r} != {patched!r}"


def tensor_leaves(output: Any) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in ``output``, with a path naming where it sits."""
    if is_tensor_collection(output):
        return [
            (str(key), leaf)
            for key, leaf in output.items(include_nested=True, leaves_only=True)
            if isinstance(leaf, torch.Tensor)
        ]
    if isinstance(output, torch.Tensor):
        return [("", output)]
    if isinstance(output, (tuple, list)):
        return [(f"[{i}]{p}", t) for i, item in enumerate(output) for p, t in tensor_leaves(item)]
    if isinstance(output, dict):
        return [(f"[{k!r}]{p}", t) for k, item in output.items() for p, t in tensor_leaves(item)]
    return []
