"""Saved originals for every attribute a fix replaces.

Modelled on ``gevent.monkey``: a replacement is recorded with the exact object it
displaced, so :func:`get_original` can hand that object back by name and removing
the patch puts the very same object (identity, not a copy) back in place.
"""
from __future__ import annotations
import __future__

import functools
import hashlib
import importlib
import inspect
import linecache
import textwrap
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from torchrl_fixes._core.errors import TargetChanged

_MISSING = object()

# (id(owner), attribute name) -> its installed record, for every patch in place.
_active: dict[tuple[int, str], _Installed] = {}
_lock = threading.RLock()


@dataclass(frozen=True)
class Replacement:
    """One attribute of one module or class, and what a fix puts there.

    Args:
        owner (module or type): the object whose attribute is replaced.
        name (str): the attribute name.
        new (Any): the object installed while the fix is applied.
    """

    owner: Any
    name: str
    new: Any

    @property
    def path(self) -> str:
        return f"{_owner_path(self.owner)}.{self.name}"


@dataclass(frozen=True)
class SourceEdits:
    """Edits a fix makes to the source of one stock method (see :func:`derive_from_source`).

    Where several applied fixes edit the same method, one method is installed with
    the edits of each, in the order the fixes are applied; removing a fix installs
    the method the others make.

    Args:
        owner (type): the class whose method is edited.
        name (str): the method's name.
        stock (function): the stock method, checked by the fix's fingerprint gate.
        edits (tuple of (str, str)): ``(old, new)`` texts, each found once.
        names (dict, optional): the names the new code uses beside the stock
            module's. Defaults to none.
    """

    owner: Any
    name: str
    stock: types.FunctionType
    edits: tuple
    names: Mapping[str, Any] = field(default_factory=dict)


def compose_source_edits(edits: Sequence[SourceEdits]) -> Replacement:
    """One :class:`Replacement` that makes every one of ``edits`` (to the same method), in order.

    Raises:
        TargetChanged: an edit does not apply exactly once after those before it.

    Examples:
        >>> class Greeter:
        ...     def greet(self):
        ...         return "hello " + "world"
        >>> loud = SourceEdits(Greeter, "greet", Greeter.greet, (('"hello "', '"HELLO "'),))
        >>> named = SourceEdits(Greeter, "greet", Greeter.greet, (('"world"', "who"),), {"who": "you"})
        >>> Greeter.greet = compose_source_edits([loud, named]).new
        >>> Greeter().greet()
        'HELLO you'
    """
    first = edits[0]
    names = {name: value for edit in edits for name, value in edit.names.items()}
    new = derive_from_source(
        first.stock, [pair for edit in edits for pair in edit.edits], **names
    )
    return Replacement(first.owner, first.name, new)


@dataclass
class _Installed:
    replacement: Replacement
    original: Any  # the owner's own attribute, or _MISSING when it was inherited


def _owner_path(owner: Any) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", repr(owner))


def _own_attribute(owner: Any, name: str) -> Any:
    # Read through __dict__ so descriptors (staticmethod, property) come back as stored.
    return vars(owner).get(name, _MISSING)


def class_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` as stored: for a class, the raw entry of the first class in its MRO
    that defines it (a ``staticmethod`` object, not the function it wraps); for a
    module, the attribute itself."""
    if not isinstance(owner, type):
        return getattr(owner, name)
    return vars(defining_class(owner, name))[name]


def defining_class(cls: type, name: str) -> type:
    """The first class in ``cls``'s MRO that defines ``name`` itself (in its ``__dict__``).

    Raises:
        AttributeError: no class in the MRO defines ``name``.

    Examples:
        >>> class Base:
        ...     def f(self):
        ...         pass
        >>> class Child(Base):
        ...     pass
        >>> defining_class(Child, "f") is Base
        True
    """
    return _first_defining(cls.__mro__, cls, name)


def _first_defining(classes: tuple[type, ...], owner: type, name: str) -> type:
    for klass in classes:
        if name in vars(klass):
            return klass
    raise AttributeError(f"{owner.__qualname__} has no attribute {name!r}")


def resolve_path(owner: Any) -> Any:
    """The module or class a dotted path names (``"torchrl.data.ReplayBuffer"``); objects pass through."""
    if not isinstance(owner, str):
        return owner
    module_name, _, rest = owner, "", ""
    while True:
        try:
            obj = importlib.import_module(module_name)
            break
        except ImportError:
            if "." not in module_name:
                raise
            module_name, _, tail = module_name.rpartition(".")
            rest = f"{tail}.{rest}" if rest else tail
    for part in filter(None, rest.split(".")):
        obj = getattr(obj, part)
    return obj


def install(replacements: list[Replacement]) -> list[_Installed]:
    """Installs every replacement, or none of them.

    If setting any attribute fails, the ones already set are put back before the
    error propagates, so a fix is never left half-applied.
    """
    done: list[_Installed] = []
    with _lock:
        try:
            for rep in replacements:
                key = (id(rep.owner), rep.name)
                if key in _active:
                    raise RuntimeError(f"{rep.path} is already patched")
                record = _Installed(rep, _own_attribute(rep.owner, rep.name))
                setattr(rep.owner, rep.name, rep.new)
                _active[key] = record
                done.append(record)
        except BaseException:
            uninstall(done)
            raise
    return done


def uninstall(installed: list[_Installed]) -> None:
    """Puts back the original objects, newest patch first."""
    with _lock:
        for record in reversed(installed):
            rep = record.replacement
            if record.original is _MISSING:
                delattr(rep.owner, rep.name)
            else:
                setattr(rep.owner, rep.name, record.original)
            _active.pop((id(rep.owner), rep.name), None)


def is_object_patched(owner: Any, name: str) -> bool:
    """Whether ``owner.name`` is currently replaced by a fix.

    Args:
        owner (module, type or str): the module or class, or its dotted path
            (``"torchrl.data.replay_buffers.utils"``,
            ``"torchrl.data.TensorDictReplayBuffer"``).
        name (str): the attribute name.

    Examples:
        >>> import torchrl_fixes
        >>> torchrl_fixes.is_object_patched("torchrl.data.TensorDictReplayBuffer", "sample")
        True
    """
    with _lock:
        return (id(resolve_path(owner)), name) in _active


def get_original(owner: Any, name: str) -> Any:
    """The object ``owner.name`` held before any fix replaced it.

    When the attribute is not patched, this is its current value. For a class, the
    attribute comes back as stored in the class (a ``staticmethod`` object, say),
    whether or not it is patched.

    Args:
        owner (module, type or str): the module or class, or its dotted path.
        name (str): the attribute name.

    Examples:
        >>> import torchrl_fixes
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> stock = torchrl_fixes.get_original(TensorDictReplayBuffer, "sample")
        >>> stock is TensorDictReplayBuffer.sample
        False
    """
    owner = resolve_path(owner)
    with _lock:
        record = _active.get((id(owner), name))
        if record is None:
            return class_attribute(owner, name)
        if record.original is not _MISSING:
            return record.original
    # Inherited before the patch: the original is what lookup finds past the owner.
    return vars(_first_defining(owner.__mro__[1:], owner, name))[name]


def installed_replacement(owner: Any, name: str) -> Any:
    """The object a fix put at ``owner.name``, while it is still there; None otherwise.

    None when no fix replaced the attribute, and when something else was set over
    the fix's object since (``owner.name`` then runs neither the fix nor the original).

    Args:
        owner (module, type or str): the module or class, or its dotted path.
        name (str): the attribute name.

    Examples:
        >>> import torchrl_fixes
        >>> from torchrl.data import TensorDictReplayBuffer
        >>> installed = installed_replacement(TensorDictReplayBuffer, "sample")
        >>> installed is vars(TensorDictReplayBuffer)["sample"]
        True
        >>> installed_replacement(TensorDictReplayBuffer, "no_such_attribute") is None
        True
    """
    owner = resolve_path(owner)
    with _lock:
        record = _active.get((id(owner), name))
        if record is None or _own_attribute(owner, name) is not record.replacement.new:
            return None
        return record.replacement.new


def wrap(original: Callable, wrapper: Callable) -> Callable:
    """A method that calls ``wrapper(original, self, args, kwargs)``, wrapt's shape.

    The one way a fix runs code around a stock method: ``wrapper`` is a plain
    function that linters, debuggers and readers follow, and decides whether and
    how ``original`` runs. ``original`` may be any callable (TorchRL dispatches some
    methods through callable objects).

    Args:
        original (Callable): the stock method, as stored in its class.
        wrapper (Callable): ``wrapper(wrapped, instance, args, kwargs)``, where
            ``wrapped`` is ``original`` bound to ``instance``.

    Examples:
        >>> class Counter:
        ...     def add(self, n=1):
        ...         return n
        >>> def doubled(wrapped, instance, args, kwargs):
        ...     return 2 * wrapped(*args, **kwargs)
        >>> Counter.add = wrap(Counter.add, doubled)
        >>> Counter().add(3)
        6
    """

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return wrapper(original.__get__(self, type(self)), self, args, kwargs)

    return method


def derive_from_source(
    stock: types.FunctionType, edits: Sequence[tuple[str, str]], **names: Any
) -> types.FunctionType:
    """``stock`` with its source edited: each ``(old, new)`` text must be found exactly once.

    The other way a fix is made from TorchRL's code (beside :func:`wrap`): where the
    change sits inside a method's body, the
    fix is the stock source with a few lines changed, so the runtime fix and the
    upstream diff are the same text. The new function is compiled in ``stock``'s module
    (its globals, its ``super()`` class) and also sees ``names``. ``stock`` must have
    passed the fingerprint gate, so the edits are made to known code.

    Raises:
        TargetChanged: an edit does not apply exactly once.

    Examples:
        >>> def twice(x):
        ...     return x * 2
        >>> thrice = derive_from_source(twice, [("x * 2", "x * factor")], factor=3)
        >>> thrice(2)
        6
    """
    source = textwrap.dedent(inspect.getsource(stock))
    for old, new in edits:
        if source.count(old) != 1:
            raise TargetChanged(f"{stock.__qualname__}: {old.strip()!r} is not found once")
        source = source.replace(old, new)
    cells = dict(
        zip(stock.__code__.co_freevars, [c.cell_contents for c in stock.__closure__ or ()])
    )
    free = {**cells, **names}
    factory = (
        f"def _factory({', '.join(free)}):\n"
        f"{textwrap.indent(source, '    ')}\n"
        f"    return {stock.__name__}\n"
    )
    # one name per source: inspect and tracebacks find each variant's own lines
    digest = hashlib.sha256(factory.encode()).hexdigest()[:8]
    filename = f"<torchrl_fixes {stock.__module__}.{stock.__qualname__} {digest}>"
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    code = compile(
        factory, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    namespace: dict[str, Any] = {}
    exec(code, stock.__globals__, namespace)
    func = namespace["_factory"](*free.values())
    func.__qualname__ = stock.__qualname__
    return func
