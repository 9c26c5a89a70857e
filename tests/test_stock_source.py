"""Unit tests of conformance.stock_source: what it finds between two copies of a package."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conformance.stock_source import StockSourceError, changed_definitions

STOCK = '''
import os

LIMIT = 3


def helper(x):
    return x + 1


def decorate(fun):
    def wrapper(self):
        return fun(self)
    return wrapper


class Buffer:
    size = 4

    def read(self):
        return helper(1)

    def write(self):
        return 0

    @decorate
    def sample(self):
        return 1
'''


def _packages(tmp_path: Path, patched: str) -> tuple[Path, Path]:
    roots = []
    for side, text in (("stock", STOCK), ("patched", patched)):
        root = tmp_path / side / "torchrl"
        root.mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "buffers.py").write_text(textwrap.dedent(text))
        roots.append(root)
    return roots[0], roots[1]


def _found(definitions) -> set[tuple]:
    return {(d.module, d.owner, d.name, d.stock is None, d.decorated_by_changed) for d in definitions}


def test_identical_sources_change_nothing(tmp_path):
    assert changed_definitions(*_packages(tmp_path, STOCK)) == []


def test_changed_added_and_decorated_definitions_are_found(tmp_path):
    patched = (
        STOCK.replace("return x + 1", "return x + 2")
        .replace("        return 0\n", "        self.count = 1\n        return 0\n")
        .replace(
            "class Buffer:",
            "_NEW = 1\n\n\ndef added():\n    return _NEW\n\n\n"
            "class _Added:\n    size = 2\n\n    def get(self):\n        return _NEW\n\n\n"
            "class Buffer:",
        )
        + "\n    def flush(self):\n        return added()\n"
    )
    found = _found(changed_definitions(*_packages(tmp_path, patched)))
    assert found == {
        ("torchrl.buffers", None, "helper", False, False),
        ("torchrl.buffers", None, "added", True, False),
        ("torchrl.buffers", "Buffer", "write", False, False),
        ("torchrl.buffers", "Buffer", "flush", True, False),
    }


def test_definitions_built_by_a_changed_decorator_are_found(tmp_path):
    patched = STOCK.replace("        return fun(self)\n", "        return fun(self) + 1\n")
    found = _found(changed_definitions(*_packages(tmp_path, patched)))
    assert found == {
        ("torchrl.buffers", None, "decorate", False, False),
        ("torchrl.buffers", "Buffer", "sample", False, True),
    }


@pytest.mark.parametrize(
    "old, new",
    [("LIMIT = 3", "LIMIT = 4"), ("    size = 4", "    size = 5"), ("class Buffer:", "class Buffer(dict):")],
)
def test_changed_statements_cannot_be_reverted(tmp_path, old, new):
    with pytest.raises(StockSourceError, match="only functions can be reverted"):
        changed_definitions(*_packages(tmp_path, STOCK.replace(old, new)))
