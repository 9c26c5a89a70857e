"""Stock TorchRL inside a process whose ``torchrl`` is a patched copy of TorchRL's source.

``nox -s upstream`` applies ``patches/`` to a copy of the installed TorchRL and runs
the conformance suite on that copy with the runtime fixes off. The suite still
compares with stock TorchRL, in the same process: this module reads the untouched
installed source, finds every function and method the patches changed, added or
removed, and compiles the stock definitions in the namespace of the patched module
(a method keeps its class for zero-argument ``super()``). Each changed attribute is
replaced by a dispatcher that runs the stock definition inside :func:`stock` and
on objects built there, and the patched one otherwise, as
:func:`torchrl_fixes.disabled` does for the runtime fixes.

Module-level statements other than imports and definitions must be the same in
both sources; a patch that changes one cannot be reverted here, and building the
reference says so.
"""
from __future__ import annotations
import __future__

import ast
import contextlib
import copy
import functools
import importlib
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from packaging.version import Version

from torchrl_fixes._core import patching
from torchrl_fixes._core.registry import STOCK_MARK, _marking_init

_MISSING = object()


class StockSourceError(Exception):
    """The patched source cannot be reverted to stock in this process."""


@dataclass
class _Definition:
    """One function or method the patches changed, added or removed."""

    module: str
    owner: str | None  # the class name, None for a module-level function
    name: str
    stock: ast.FunctionDef | None  # None: added by the patches
    path: Path
    decorated_by_changed: bool = False


@dataclass
class StockReference:
    """The stock definitions of everything the patches touched, and the switch between them."""

    definitions: list[_Definition] = field(default_factory=list)
    owners: list[type] = field(default_factory=list)
    _active: int = 0
    _lock: Any = field(default_factory=threading.RLock)
    _marks: list = field(default_factory=list)
    # (owner module or class, name) -> the stock object
    stock_objects: dict = field(default_factory=dict)

    @contextlib.contextmanager
    def stock(self) -> Iterator[None]:
        """Runs a block on stock TorchRL; objects built inside stay stock afterwards."""
        with self._lock:
            self._active += 1
            if self._active == 1:
                self._marks = patching.install(
                    [patching.Replacement(cls, "__init__", _marking_init(cls.__init__)) for cls in self.owners]
                )
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    patching.uninstall(self._marks)
                    self._marks = []

    def runs_stock(self, obj: Any = None) -> bool:
        return self._active > 0 or (obj is not None and getattr(obj, "__dict__", {}).get(STOCK_MARK, False))


def _definitions(tree: ast.Module) -> dict[tuple[str | None, str], list[ast.FunctionDef]]:
    found: dict[tuple[str | None, str], list[ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault((None, node.name), []).append(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.setdefault((node.name, item.name), []).append(item)
    return found


def _other_statements(tree: ast.Module) -> list[str]:
    """Module and class statements that are neither imports nor definitions, as dumped ASTs."""
    kept = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.ClassDef):
            kept.append(f"class {node.name} bases={ast.dump(ast.Module(node.bases, []))}")
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if item is not _docstring(node):
                    kept.append(f"{node.name}: {ast.dump(item)}")
            continue
        if isinstance(node, ast.Try) and all(
            isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body
        ):
            continue
        kept.append(ast.dump(node))
    return kept


def _docstring(node: ast.ClassDef) -> ast.stmt | None:
    """The statement holding a class's docstring (a docstring is no behaviour to revert)."""
    first = node.body[0] if node.body else None
    is_text = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return first if is_text and isinstance(first.value.value, str) else None


def _assigned_names(node: ast.AST) -> set[str] | None:
    """The plain names a module-level assignment binds; None for any other statement."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return None
    if not all(isinstance(t, ast.Name) for t in targets):
        return None
    return {t.id for t in targets}


def _without_new_names(patched: ast.Module, stock: ast.Module) -> ast.Module:
    """``patched`` less the module-level assignments and classes of names stock never
    binds: only patched code reads them."""
    bound = {name for node in stock.body for name in (_assigned_names(node) or ())}
    classes = {node.name for node in stock.body if isinstance(node, ast.ClassDef)}
    body = [
        node
        for node in patched.body
        if not (isinstance(node, ast.ClassDef) and node.name not in classes)
        and ((names := _assigned_names(node)) is None or names & bound)
    ]
    return ast.Module(body, [])


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _implemented_here(node: ast.FunctionDef) -> bool:
    """False for an ``@implement_for`` variant written for another version of its module."""
    for decorator in node.decorator_list:
        if (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Name)
            and decorator.func.id == "implement_for"
        ):
            module_name, low, high = (
                [ast.literal_eval(arg) for arg in decorator.args] + [None, None]
            )[:3]
            installed = Version(importlib.import_module(module_name).__version__.split("+")[0])
            if low is not None and installed < Version(low):
                return False
            if high is not None and installed >= Version(high):
                return False
    return True


def _without_implement_for(node: ast.FunctionDef) -> ast.FunctionDef:
    node = copy.deepcopy(node)
    node.decorator_list = [
        d
        for d in node.decorator_list
        if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "implement_for")
    ]
    return node


def changed_definitions(stock_root: Path, patched_root: Path) -> list[_Definition]:
    """Every function and method that differs between the two copies of the ``torchrl`` package."""
    found: list[_Definition] = []
    changed_functions: set[str] = set()  # "module:name" of changed module-level functions
    for patched in sorted(patched_root.rglob("*.py")):
        rel = patched.relative_to(patched_root)
        stock = stock_root / rel
        if not stock.is_file():
            continue  # a module the patches add: only patched code imports it
        stock_text, patched_text = stock.read_text(), patched.read_text()
        if stock_text == patched_text:
            continue
        stock_tree, patched_tree = ast.parse(stock_text), ast.parse(patched_text)
        if _other_statements(stock_tree) != _other_statements(_without_new_names(patched_tree, stock_tree)):
            raise StockSourceError(
                f"{rel}: the patches change module or class statements other than "
                "imports and definitions; only functions can be reverted"
            )
        module = _module_name(patched_root, patched)
        stock_defs, patched_defs = _definitions(stock_tree), _definitions(patched_tree)
        stock_classes = {node.name for node in stock_tree.body if isinstance(node, ast.ClassDef)}
        for key in sorted(set(stock_defs) | set(patched_defs), key=str):
            before = [ast.dump(n) for n in stock_defs.get(key, [])]
            after = [ast.dump(n) for n in patched_defs.get(key, [])]
            owner, name = key
            if before == after or owner is not None and owner not in stock_classes:
                continue  # a class the patches add: only patched code uses it
            here = [n for n in stock_defs.get(key, []) if _implemented_here(n)]
            if len(here) > 1:
                raise StockSourceError(f"{rel}: {name} is defined twice for this version")
            found.append(_Definition(module, owner, name, here[0] if here else None, stock))
            if owner is None:
                changed_functions.add(f"{module}:{name}")
    if not changed_functions:
        return found
    # Definitions decorated by a changed function were built by the patched decorator.
    names = {key.split(":")[1] for key in changed_functions}
    listed = {(d.module, d.owner, d.name) for d in found}
    for stock in sorted(stock_root.rglob("*.py")):
        text = stock.read_text()
        if not any(f"@{name}" in text for name in names):
            continue
        module = _module_name(stock_root, stock)
        for (owner, name), nodes in _definitions(ast.parse(text)).items():
            for node in nodes:
                decorators = {
                    d.id for d in ast.walk(ast.Module(node.decorator_list, [])) if isinstance(d, ast.Name)
                }
                if decorators & names and (module, owner, name) not in listed and _implemented_here(node):
                    found.append(_Definition(module, owner, name, node, stock, decorated_by_changed=True))
                    listed.add((module, owner, name))
    return found


def _compile(definition: _Definition, module: types.ModuleType, owner: type | None) -> Any:
    node = _without_implement_for(definition.stock)
    # A factory taking ``__class__`` lets zero-argument super() resolve as in the class body.
    factory = ast.FunctionDef(
        name="_stock_factory",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg("__class__")],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[node, ast.Return(ast.Name(node.name, ast.Load()))],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    tree = ast.fix_missing_locations(ast.Module([factory], []))
    code = compile(
        tree, str(definition.path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    scope: dict[str, Any] = {}
    exec(code, module.__dict__, scope)
    return scope["_stock_factory"](owner)


# Dispatchers are compiled as if written in the patched module's file, so that code
# which walks the stack past the library's own frames (warnings naming the caller's
# line) walks past them too.
_DISPATCHERS = """
def _method_dispatcher(runs_stock, owner, name, stock, patched):
    def method(self, *args, **kwargs):
        if runs_stock(self):
            return stock(self, *args, **kwargs)
        return patched(self, *args, **kwargs)

    return method


def _function_dispatcher(runs_stock, stock, patched):
    def function(*args, **kwargs):
        if runs_stock():
            return stock(*args, **kwargs)
        return patched(*args, **kwargs)

    return function
"""


@functools.cache
def _dispatcher_factories(module: types.ModuleType) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(compile(_DISPATCHERS, module.__file__, "exec"), {"__name__": module.__name__}, scope)
    return scope


def _method_dispatcher(reference: StockReference, module, owner: type, name: str, stock: Any, patched: Any):
    if stock is _MISSING:

        def stock(self, *args, **kwargs):  # added by the patches: stock inherits it
            return getattr(super(owner, self), name)(*args, **kwargs)

    if patched is _MISSING:

        def patched(self, *args, **kwargs):  # removed by the patches
            return getattr(super(owner, self), name)(*args, **kwargs)

    method = _dispatcher_factories(module)["_method_dispatcher"](reference.runs_stock, owner, name, stock, patched)
    return functools.wraps(patched)(method)


def _function_dispatcher(reference: StockReference, module, stock: Any, patched: Any):
    function = _dispatcher_factories(module)["_function_dispatcher"](reference.runs_stock, stock, patched)
    return functools.wraps(patched)(function)


def build(stock_root: Path) -> StockReference:
    """Installs the dispatchers that let :meth:`StockReference.stock` run stock TorchRL.

    Args:
        stock_root (Path): the untouched ``torchrl`` package directory.
    """
    import torchrl

    patched_root = Path(torchrl.__file__).parent
    if patched_root.resolve() == Path(stock_root).resolve():
        raise StockSourceError("the imported torchrl is the stock one: no patched source to test")
    definitions = changed_definitions(Path(stock_root), patched_root)
    reference = StockReference(definitions)
    functions = [d for d in definitions if d.owner is None]
    methods = [d for d in definitions if d.owner is not None]
    reference._active = 1  # stock decorators and defaults are evaluated while compiling
    try:
        for definition in functions:
            module = importlib.import_module(definition.module)
            patched = module.__dict__.get(definition.name, _MISSING)
            if patched is _MISSING or definition.stock is None:
                continue  # only the patched code calls what the patches add
            stock = _compile(definition, module, None)
            reference.stock_objects[(module, definition.name)] = stock
            dispatcher = _function_dispatcher(reference, module, stock, patched)
            # The module's own name, and every torchrl module that imported it by name.
            for other in list(sys.modules.values()):
                if getattr(other, "__name__", "").split(".")[0] != "torchrl":
                    continue
                for attr, value in list(vars(other).items()):
                    if value is patched:
                        setattr(other, attr, dispatcher)
        owners = []
        for definition in methods:
            module = importlib.import_module(definition.module)
            owner = getattr(module, definition.owner)
            patched = vars(owner).get(definition.name, _MISSING)
            stock = _MISSING if definition.stock is None else _compile(definition, module, owner)
            if stock is not _MISSING:
                reference.stock_objects[(owner, definition.name)] = stock
            if isinstance(patched, staticmethod) and isinstance(stock, staticmethod):
                # no instance to tell stock objects by: stock inside the stock block
                function = _function_dispatcher(reference, module, stock.__func__, patched.__func__)
                setattr(owner, definition.name, staticmethod(function))
                if owner not in owners:
                    owners.append(owner)
                continue
            if isinstance(patched, (staticmethod, classmethod, property)) or isinstance(
                stock, (staticmethod, classmethod, property)
            ):
                raise StockSourceError(f"{definition.owner}.{definition.name}: not a plain method")
            setattr(
                owner,
                definition.name,
                _method_dispatcher(reference, module, owner, definition.name, stock, patched),
            )
            if owner not in owners:
                owners.append(owner)
        reference.owners = owners
    finally:
        reference._active = 0
    return reference
