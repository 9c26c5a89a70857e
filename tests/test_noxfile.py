"""``nox --list`` shows every session with a whole sentence, and the module lists them all.

Read from ``noxfile.py``'s source, so nox need not be installed: a session is a function
decorated with ``nox.session``, and nox lists the first line of its docstring.
"""
from __future__ import annotations

import ast
from pathlib import Path

NOXFILE = Path(__file__).resolve().parents[1] / "noxfile.py"


def _sessions() -> dict[str, str]:
    tree = ast.parse(NOXFILE.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            "nox.session" in ast.unparse(decorator) for decorator in node.decorator_list
        ):
            found[node.name] = ast.get_docstring(node) or ""
    return found


def test_every_session_has_a_whole_first_line():
    sessions = _sessions()
    assert len(sessions) >= 10
    for name, doc in sessions.items():
        first = doc.splitlines()[0] if doc else ""
        assert first.endswith("."), (name, first)
        assert len(first) <= 100, (name, first)


def test_the_module_docstring_names_every_session():
    listed = ast.get_docstring(ast.parse(NOXFILE.read_text())).splitlines()[0]
    assert listed.startswith("Sessions: ")
    names = [name.strip(" .") for name in listed.removeprefix("Sessions: ").split(",")]
    assert sorted(names) == sorted(_sessions())
