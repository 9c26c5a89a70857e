"""``devtools/python_floor.py`` finds what Python 3.10 lacks and vermin lets through."""
from __future__ import annotations

import textwrap

import pytest

from devtools.python_floor import check_source, main

NEWER = {
    "weakref_slot": """
        import dataclasses

        @dataclasses.dataclass(slots=True, weakref_slot=True)
        class Plan:
            x: int
    """,
    "weakref_slot, bare dataclass": """
        from dataclasses import dataclass

        @dataclass(weakref_slot=True, slots=True)
        class Plan:
            x: int
    """,
    "make_dataclass": "Plan = dataclasses.make_dataclass('Plan', ['x'], slots=True, weakref_slot=True)",
    "co_qualname": "qualname = wrapper.__code__.co_qualname",
    "add_note": "err.add_note('while sampling')",
    "__notes__": "notes = err.__notes__",
    "BaseExceptionGroup": "raise BaseExceptionGroup('many', errors)",
    "except*": """
        try:
            run()
        except* ValueError:
            pass
    """,
    "star in subscript": "Shape = tuple[int, *Ts]",
    "star annotation": "def f(*args: *Ts): ...",
    "atomic group": "re.compile(r'(?>ab)c')",
    "possessive quantifier": "re.fullmatch(pattern=r'a*+b', string=text)",
}

OLDER = {
    "weakref slot inherited": """
        import dataclasses

        class WeakReferenceable:
            __slots__ = ("__weakref__",)

        @dataclasses.dataclass(slots=True, kw_only=True)
        class Plan(WeakReferenceable):
            x: int
    """,
    "code by identity": "found = any(c is wrapper.__code__ for c in fn.__code__.co_consts)",
    "names in strings": "message = 'no attribute co_qualname, add_note or weakref_slot'",
    "chained exception": """
        try:
            run()
        except ValueError as err:
            raise RuntimeError('while sampling') from err
    """,
    "parenthesized star": "first = items[(*head, tail)]",
    "unpack in a call": "f(*args)",
    "3.10 grammar": """
        match command:
            case [x, *rest]:
                pass
        with (open(a) as f, open(b) as g):
            pass
    """,
    "plain regex": "re.compile(r'(ab)c[*+]+a*?b{2}')",
    "regex-like string, not re": "text.split('a*+b')",
}


@pytest.mark.parametrize("name", NEWER)
def test_finds_newer_python(name):
    findings = check_source(textwrap.dedent(NEWER[name]))
    assert len(findings) == 1, findings
    line, what = findings[0]
    assert "Python 3.1" in what and ": " in what, what  # what is newer, then the 3.10 form


@pytest.mark.parametrize("name", OLDER)
def test_quiet_on_310_forms(name):
    assert check_source(textwrap.dedent(OLDER[name])) == []


def test_finding_line_and_fix():
    source = "import dataclasses\n\n@dataclasses.dataclass(weakref_slot=True)\nclass Plan:\n    x: int\n"
    [(line, what)] = check_source(source)
    assert line == 3
    assert "__slots__ is ('__weakref__',)" in what


def test_main_prints_each_finding_and_fails(tmp_path, capsys):
    package = tmp_path / "package"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "newer.py").write_text("x = f.__code__.co_qualname\n\n\ny = e.__notes__\n")
    (package / "older.py").write_text("x = f.__code__.co_name\n")
    (package / "notes.txt").write_text("x = f.__code__.co_qualname\n")

    assert main([str(package)]) == 1
    lines = capsys.readouterr().out.splitlines()
    newer = package / "sub" / "newer.py"
    assert [line.split(": ")[0] for line in lines] == [f"{newer}:1", f"{newer}:4"]


def test_main_passes_clean_files(tmp_path, capsys):
    (tmp_path / "older.py").write_text("x = f.__code__.co_name\n")
    assert main([str(tmp_path / "older.py")]) == 0
    assert capsys.readouterr().out == ""
