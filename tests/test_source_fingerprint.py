"""Fingerprints see the code of a function, not its docstring, comments, layout or name."""
from __future__ import annotations

import functools

import pytest

from torchrl_fixes._core.source_fingerprint import source_fingerprint


def _passthrough(func):
    return func


def reference(values, scale=2):
    total = 0
    for value in values:
        total += value * scale
    return {"total": total}


def with_docstring_and_comments(values, scale=2):
    """Adds up the scaled values.

    The docstring is not part of the code.
    """
    # a comment on its own line
    total = 0
    for value in values:  # a trailing comment
        total += value * scale
    return {"total": total}


def reformatted(values,
                scale = 2):
    total=0
    for value in values: total += (value*scale)  # noqa: E701
    return {
        "total": total,
    }


@_passthrough
@functools.cache
def decorated(values, scale=2):
    total = 0
    for value in values:
        total += value * scale
    return {"total": total}


class Holder:
    @staticmethod
    def indented(values, scale=2):
        "A one-line docstring."
        total = 0
        for value in values:
            total += value * scale
        return {"total": total}


def changed_operator(values, scale=2):
    total = 0
    for value in values:
        total += value + scale
    return {"total": total}


def changed_constant(values, scale=2):
    total = 0
    for value in values:
        total += value * scale
    return {"sum": total}


def changed_default(values, scale=3):
    total = 0
    for value in values:
        total += value * scale
    return {"total": total}


def test_fingerprint_is_a_short_hex_digest():
    """The fingerprint is 16 hex digits and repeatable."""
    fingerprint = source_fingerprint(reference)
    assert len(fingerprint) == 16
    assert int(fingerprint, 16) >= 0
    assert source_fingerprint(reference) == fingerprint


@pytest.mark.parametrize(
    "func",
    [
        with_docstring_and_comments,
        reformatted,
        decorated.__wrapped__,
        Holder.__dict__["indented"].__func__,
    ],
    ids=["docstring-comments", "formatting", "decorators", "indented-method"],
)
def test_same_code_same_fingerprint(func):
    """Docstrings, comments, formatting, decorators, indentation and the name do not count."""
    assert func.__name__ != reference.__name__
    assert source_fingerprint(func) == source_fingerprint(reference)


@pytest.mark.parametrize(
    "func",
    [changed_operator, changed_constant, changed_default],
    ids=["operator", "constant", "default"],
)
def test_changed_code_changes_fingerprint(func):
    """A changed expression, constant or default argument gives another fingerprint."""
    assert source_fingerprint(func) != source_fingerprint(reference)


def test_class_is_refused():
    """A class is not a function definition."""
    with pytest.raises(TypeError):
        source_fingerprint(Holder)
