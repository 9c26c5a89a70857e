"""Uses of Python newer than 3.10 (TorchRL's floor) that vermin does not report.

No Python 3.10 interpreter is available to CI, so ``nox -s lint`` checks the floor
statically: vermin (``--target=3.10-``) finds the modules, members and syntax it
knows, and this module what vermin 1.9.2 lets through:

- grammar 3.10 does not parse, as Python's own parser reads it with
  ``feature_version=(3, 10)`` (``except*``), and star-unpacking in a subscript
  (``tuple[*Ts]``, ``*args: *Ts``), which that parser accepts;
- ``dataclass(weakref_slot=...)``;
- ``code.co_qualname``, ``BaseException.add_note`` and ``__notes__``, and the
  ``BaseExceptionGroup`` builtin;
- atomic groups and possessive quantifiers in the pattern literal of an ``re`` call.

Usage::

    python -m devtools.python_floor PATH...

prints ``path:line: what, and the 3.10 form to use`` for each finding in the given
files and the ``*.py`` files under the given folders, and exits with status 1 when
there is any.

Examples:
    >>> check_source("x = fn.__code__.co_qualname\\n")
    [(1, 'code.co_qualname is Python 3.11+: find the function by code identity (the one whose __code__.co_consts holds this code)')]
    >>> check_source("x = fn.__code__.co_name\\n")
    []
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

FLOOR = (3, 10)

# name -> what is newer than 3.10, and the 3.10 form to use
ATTRIBUTES = {
    "co_qualname": "code.co_qualname is Python 3.11+: find the function by code identity "
    "(the one whose __code__.co_consts holds this code)",
    "add_note": "BaseException.add_note is Python 3.11+: put the note in the message, "
    "or chain with `raise ... from`",
    "__notes__": "BaseException.__notes__ is Python 3.11+: put the note in the message, "
    "or chain with `raise ... from`",
}
DATACLASS_KEYWORDS = {
    "weakref_slot": "dataclass(weakref_slot=...) is Python 3.11+: keep slots=True and "
    "inherit from a class whose __slots__ is ('__weakref__',)",
}
BUILTINS = {
    "BaseExceptionGroup": "BaseExceptionGroup is Python 3.11+: catch the exceptions "
    "themselves, or take it from the exceptiongroup backport",
}
STARRED_SUBSCRIPT = (
    "star-unpacking in a subscript or annotation is Python 3.11+: use "
    "typing_extensions.Unpack[...]"
)
REGEX = (
    "atomic groups and possessive quantifiers are Python 3.11+ in re: emulate them with a "
    "lookahead and a backreference, (?=(X))\\1 for (?>X) and (?=(X*))\\1 for X*+"
)
RE_FUNCTIONS = {
    "compile", "search", "match", "fullmatch", "split", "findall", "finditer", "sub", "subn"
}


def check_source(source: str, path: str = "<source>") -> list[tuple[int, str]]:
    """The findings in ``source``: ``(line, what, and the 3.10 form to use)``, in line order."""
    findings = []
    try:
        ast.parse(source, path, feature_version=FLOOR)
    except SyntaxError as err:
        what = f"Python 3.10 does not parse this ({err.msg}): use 3.10 grammar"
        findings.append((err.lineno or 1, what))
    try:
        tree = ast.parse(source, path)
    except SyntaxError:
        return findings  # not Python to this interpreter either: reported above
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            findings.append((node.lineno, ATTRIBUTES[node.attr]))
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            findings.append((node.lineno, BUILTINS[node.id]))
        elif isinstance(node, ast.Call):
            findings.extend(_call_findings(node))
        elif isinstance(node, ast.Subscript) and _unpacks_unparenthesized(node.slice):
            findings.append((node.lineno, STARRED_SUBSCRIPT))
        elif isinstance(node, ast.arg) and isinstance(node.annotation, ast.Starred):
            findings.append((node.lineno, STARRED_SUBSCRIPT))
    return sorted(findings)


def _call_findings(call: ast.Call) -> list[tuple[int, str]]:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in ("dataclass", "make_dataclass"):
        return [
            (call.lineno, DATACLASS_KEYWORDS[k.arg])
            for k in call.keywords
            if k.arg in DATACLASS_KEYWORDS
        ]
    is_re_call = (
        isinstance(func, ast.Attribute) and func.attr in RE_FUNCTIONS
        and isinstance(func.value, ast.Name) and func.value.id == "re"
    )
    patterns = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "pattern")]
    if is_re_call and any(
        isinstance(p, ast.Constant) and isinstance(p.value, str) and _newer_regex(p.value)
        for p in patterns
    ):
        return [(call.lineno, REGEX)]
    return []


def _unpacks_unparenthesized(node: ast.expr) -> bool:
    # `x[*a]` is 3.11 grammar that ast.parse(feature_version=(3, 10)) still accepts;
    # `x[(*a,)]` is 3.10's, and there the tuple starts before its first item
    return (
        isinstance(node, ast.Tuple)
        and any(isinstance(item, ast.Starred) for item in node.elts)
        and (node.lineno, node.col_offset) == (node.elts[0].lineno, node.elts[0].col_offset)
    )


def _newer_regex(pattern: str) -> bool:
    parser = getattr(re, "_parser", None)  # re's own parser, 3.11+: it knows both forms
    if parser is None:  # on 3.10 the compiler rejects both forms
        try:
            re.compile(pattern)
        except re.error as err:
            return "multiple repeat" in str(err) or "unknown extension ?>" in str(err)
        return False
    try:
        parsed = repr(parser.parse(pattern))
    except re.error:
        return False
    return "ATOMIC_GROUP" in parsed or "POSSESSIVE_REPEAT" in parsed


def python_files(paths: list[str]) -> list[Path]:
    """The given files, and the ``*.py`` files under the given folders, sorted."""
    files = set()
    for path in map(Path, paths):
        files.update(path.rglob("*.py") if path.is_dir() else [path])
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.python_floor",
        description=__doc__.split("\n\nUsage")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="a file, or a folder of *.py files"
    )
    found = False
    for file in python_files(parser.parse_args(argv).paths):
        for line, what in check_source(file.read_text(encoding="utf-8"), str(file)):
            print(f"{file}:{line}: {what}")
            found = True
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
