"""Installing and removing replacements, and the lookups of the saved originals."""
from __future__ import annotations

import pytest

from torchrl_fixes import get_original, is_object_patched
from torchrl_fixes._core import patching
from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import (
    Replacement,
    SourceEdits,
    compose_source_edits,
    derive_from_source,
    wrap,
)


@pytest.fixture
def installs():
    """Install records made by a test; whatever is still patched is removed at teardown."""
    records = []
    yield records
    for record in reversed(records):
        rep = record.replacement
        if is_object_patched(rep.owner, rep.name):
            patching.uninstall([record])


def _install(installs, replacements):
    records = patching.install(replacements)
    installs.extend(records)
    return records


def _stock():
    return "stock"


def _fixed():
    return "fixed"


def _fixed_method(self):
    return "fixed"


def test_uninstall_puts_back_the_same_objects(installs, make_module):
    """Module functions, class methods and plain class attributes come back by identity."""

    class Thing:
        marker = object()

        def method(self):
            return "stock"

    module = make_module(helper=_stock, Thing=Thing)
    original_method = vars(Thing)["method"]
    original_marker = vars(Thing)["marker"]
    new_marker = object()

    records = _install(
        installs,
        [
            Replacement(module, "helper", _fixed),
            Replacement(Thing, "method", _fixed_method),
            Replacement(Thing, "marker", new_marker),
        ],
    )
    assert module.helper is _fixed
    assert vars(Thing)["method"] is _fixed_method
    assert Thing.marker is new_marker
    assert Thing().method() == "fixed"

    patching.uninstall(records)
    assert module.helper is _stock
    assert vars(Thing)["method"] is original_method
    assert vars(Thing)["marker"] is original_marker
    assert Thing().method() == "stock"
    assert not is_object_patched(module, "helper")
    assert not is_object_patched(Thing, "method")
    assert not is_object_patched(Thing, "marker")


def test_inherited_attribute_leaves_the_subclass_dict_again(installs):
    """A replacement of an inherited method is removed from the subclass, not frozen there."""

    class Base:
        def method(self):
            return "base"

    class Child(Base):
        pass

    base_method = vars(Base)["method"]
    assert "method" not in vars(Child)

    records = _install(installs, [Replacement(Child, "method", _fixed_method)])
    assert vars(Child)["method"] is _fixed_method
    assert Child().method() == "fixed"
    assert get_original(Child, "method") is base_method
    assert vars(Base)["method"] is base_method

    patching.uninstall(records)
    assert "method" not in vars(Child)
    assert Child.method is base_method
    assert Child().method() == "base"
    assert vars(Base)["method"] is base_method


def test_attribute_absent_before_patching_is_removed(installs, make_module):
    """An attribute a replacement adds does not survive uninstall."""
    module = make_module()
    records = _install(installs, [Replacement(module, "added", _fixed)])
    assert module.added is _fixed

    patching.uninstall(records)
    assert not hasattr(module, "added")


def test_static_and_class_method_descriptors_come_back_unchanged(installs):
    """staticmethod and classmethod objects are restored as the very same descriptors."""

    class Thing:
        @staticmethod
        def static():
            return "stock"

        @classmethod
        def klass(cls):
            return "stock"

    static_descriptor = vars(Thing)["static"]
    class_descriptor = vars(Thing)["klass"]
    assert isinstance(static_descriptor, staticmethod)
    assert isinstance(class_descriptor, classmethod)

    records = _install(
        installs,
        [
            Replacement(Thing, "static", staticmethod(_fixed)),
            Replacement(Thing, "klass", classmethod(_fixed_method)),
        ],
    )
    assert Thing.static() == "fixed"
    assert Thing.klass() == "fixed"
    assert get_original(Thing, "static") is static_descriptor
    assert get_original(Thing, "klass") is class_descriptor

    patching.uninstall(records)
    assert vars(Thing)["static"] is static_descriptor
    assert vars(Thing)["klass"] is class_descriptor
    assert Thing.static() == "stock"
    assert Thing().klass() == "stock"


class _RefusesBlocked(type):
    def __setattr__(cls, name, value):
        if name == "blocked":
            raise AttributeError(f"{cls.__name__}.blocked cannot be set")
        super().__setattr__(name, value)


def test_install_is_all_or_nothing(installs, make_module):
    """When one setattr fails, the replacements already set are rolled back."""

    class Locked(metaclass=_RefusesBlocked):
        def fine(self):
            return "stock"

        def blocked(self):
            return "stock"

    module = make_module(helper=_stock, Locked=Locked)
    fine = vars(Locked)["fine"]
    blocked = vars(Locked)["blocked"]

    with pytest.raises(AttributeError, match="blocked cannot be set"):
        _install(
            installs,
            [
                Replacement(module, "helper", _fixed),
                Replacement(Locked, "fine", _fixed_method),
                Replacement(Locked, "blocked", _fixed_method),
            ],
        )
    assert module.helper is _stock
    assert vars(Locked)["fine"] is fine
    assert vars(Locked)["blocked"] is blocked
    assert not is_object_patched(module, "helper")
    assert not is_object_patched(Locked, "fine")
    assert not is_object_patched(Locked, "blocked")

    records = _install(
        installs,
        [Replacement(module, "helper", _fixed), Replacement(Locked, "fine", _fixed_method)],
    )
    assert is_object_patched(module, "helper")
    assert is_object_patched(Locked, "fine")
    patching.uninstall(records)
    assert module.helper is _stock
    assert vars(Locked)["fine"] is fine


def test_patching_the_same_attribute_twice_raises(installs, make_module):
    """A second patch of a patched attribute is refused and leaves the first in place."""
    module = make_module(helper=_stock, other=_stock)
    first = _install(installs, [Replacement(module, "helper", _fixed)])

    def second():
        return "second"

    with pytest.raises(RuntimeError, match="already patched"):
        _install(
            installs, [Replacement(module, "other", second), Replacement(module, "helper", second)]
        )

    assert module.helper is _fixed
    assert module.other is _stock
    assert is_object_patched(module, "helper")
    assert not is_object_patched(module, "other")
    assert get_original(module, "helper") is _stock

    patching.uninstall(first)
    assert module.helper is _stock
    assert not is_object_patched(module, "helper")


def test_lookups_by_object_and_by_dotted_path(installs, make_module):
    """is_object_patched and get_original accept the owner or its dotted path."""

    class Thing:
        class Inner:
            def method(self):
                return "stock"

        def method(self):
            return "stock"

    module = make_module(helper=_stock, Thing=Thing)
    module_path = module.__name__
    class_path = f"{module_path}.Thing"
    inner_path = f"{module_path}.Thing.Inner"
    thing_method = vars(Thing)["method"]
    inner_method = vars(Thing.Inner)["method"]

    for owner in (module, module_path):
        assert is_object_patched(owner, "helper") is False
        assert get_original(owner, "helper") is _stock
    for owner in (Thing, class_path):
        assert is_object_patched(owner, "method") is False
        assert get_original(owner, "method") is thing_method
    assert get_original(inner_path, "method") is inner_method

    records = _install(
        installs,
        [
            Replacement(module, "helper", _fixed),
            Replacement(Thing, "method", _fixed_method),
            Replacement(Thing.Inner, "method", _fixed_method),
        ],
    )
    for owner in (module, module_path):
        assert is_object_patched(owner, "helper") is True
        assert get_original(owner, "helper") is _stock
    for owner in (Thing, class_path):
        assert is_object_patched(owner, "method") is True
        assert get_original(owner, "method") is thing_method
    assert is_object_patched(inner_path, "method") is True
    assert get_original(inner_path, "method") is inner_method
    assert is_object_patched(class_path, "helper") is False
    assert module.helper is _fixed

    patching.uninstall(records)
    for owner in (module, module_path):
        assert is_object_patched(owner, "helper") is False
    for owner in (Thing, class_path):
        assert is_object_patched(owner, "method") is False
    assert is_object_patched(inner_path, "method") is False


def test_wrap_passes_the_bound_method_and_the_arguments_as_they_came():
    """The wrapper gets the stock method bound to the instance, the instance, and the
    positional and keyword arguments as the caller passed them."""

    class Stock:
        def method(self, a, b=1, *args, d, **kwargs):
            return self, a, b, args, d, kwargs

    original = Stock.method
    seen = []

    def wrapper(wrapped, instance, args, kwargs):
        seen.append((wrapped.__func__, instance, args, kwargs))
        return wrapped(*args, **kwargs)

    Stock.method = wrap(original, wrapper)
    obj = Stock()
    assert obj.method(1, 2, 3, d=4, z=5) == (obj, 1, 2, (3,), 4, {"z": 5})
    assert seen == [(original, obj, (1, 2, 3), {"d": 4, "z": 5})]
    assert Stock.method.__wrapped__ is original and Stock.method.__name__ == "method"


def test_wrap_may_answer_without_the_stock_method():
    """A wrapper decides whether the stock method runs at all."""

    class Stock:
        def method(self, x):
            return ("stock", x)

    def shortcut(wrapped, instance, args, kwargs):
        (x,) = args
        return ("index", x) if x > 0 else wrapped(x)

    Stock.method = wrap(Stock.method, shortcut)
    assert Stock().method(3) == ("index", 3)
    assert Stock().method(-1) == ("stock", -1)


def test_derive_from_source_applies_each_edit_once_or_refuses():
    """An edit that does not match exactly once is a TargetChanged, never a half-edited function."""
    def stock(rows):
        total = 0
        for row in rows:
            total += row
        return total

    doubled = derive_from_source(stock, [("total += row", "total += scale * row")], scale=2)
    assert doubled([1, 2, 3]) == 12 and stock([1, 2, 3]) == 6
    with pytest.raises(TargetChanged, match="not found once"):
        derive_from_source(stock, [("total -= row", "total += row")])
    with pytest.raises(TargetChanged, match="not found once"):
        derive_from_source(stock, [("total", "sum_")])  # four matches


def test_compose_source_edits_makes_every_edit_with_every_name():
    """The composed method makes the edits of each SourceEdits in order and sees the names of
    each; the stock method is left as it was."""

    class Greeter:
        def greet(self):
            return "hello" + " " + "world"

    stock = Greeter.greet
    hello = SourceEdits(Greeter, "greet", stock, (('"hello"', "salutation"),), {"salutation": "hi"})
    world = SourceEdits(Greeter, "greet", stock, (('"world"', "audience"),), {"audience": "you"})

    composed = compose_source_edits([hello, world])
    assert (composed.owner, composed.name) == (Greeter, "greet")
    assert composed.new(Greeter()) == "hi you"
    assert compose_source_edits([world]).new(Greeter()) == "hello you"
    assert vars(Greeter)["greet"] is stock and Greeter().greet() == "hello world"

    clash = SourceEdits(Greeter, "greet", stock, (('"hello"', '"hey"'),))
    with pytest.raises(TargetChanged, match="not found once"):
        compose_source_edits([hello, clash])
