"""Fingerprints of the functions a fix replaces.

A fix carries the fingerprint of each stock function it rewrites, one per supported
release where they differ. If the installed function has another fingerprint, the
target changed (perhaps fixed upstream) and the fix is skipped rather than applied
over code it was not written against. Docstrings, comments and formatting do not
count: only the syntax tree of the code does.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from typing import Callable


def source_fingerprint(func: Callable) -> str:
    """A short hash of ``func``'s code, blind to docstrings, comments and layout.

    Args:
        func (Callable): a function defined in a source file.

    Returns:
        The first 16 hex digits of the SHA-256 of the function's syntax tree with its
        docstring and decorators removed, written out so that the same code gives the
        same fingerprint on every Python version.

    Examples:
        >>> def f(x):
        ...     "Doubles."
        ...     return 2 * x  # comment
        >>> def g(x):
        ...     return 2 * x
        >>> source_fingerprint(f) == source_fingerprint(g)
        True
    """
    return fingerprint_source(inspect.getsource(func), what=repr(func))


def fingerprint_source(source: str, what: str = "source") -> str:
    """:func:`source_fingerprint` of the first function defined in ``source``."""
    node = ast.parse(textwrap.dedent(source)).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"{what} is not a function definition")
    node.decorator_list = []
    node.name = "_"  # the name lives in the target path, not in the fingerprint
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(_canonical(node).encode()).hexdigest()[:16]


def _canonical(node) -> str:
    # Like ast.dump, but fields left empty are dropped: newer Pythons add fields
    # (type_params in 3.12) that would otherwise change the text of unchanged code.
    if isinstance(node, ast.AST):
        fields = [
            f"{name}={_canonical(value)}"
            for name, value in ast.iter_fields(node)
            if value is not None and value != []
        ]
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(_canonical(item) for item in node)}]"
    return repr(node)
