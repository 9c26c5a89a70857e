"""The registry: applying, skipping, removing and reporting fixes, on a throwaway target."""
from __future__ import annotations

import re
import warnings

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchrl_fixes import (
    FixSkippedWarning,
    FixStatus,
    StatusReport,
    get_original,
    is_object_patched,
)
from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import Replacement, SourceEdits
from torchrl_fixes._core.registry import Fix, Registry, Target, stock_function
from torchrl_fixes._core.source_fingerprint import source_fingerprint

TORCHRL = Version("1.4.2")
TENSORDICT = Version("7.0.1")
SUPPORTED = ">=1.4,<1.5"


class _RefusesBlocked(type):
    def __setattr__(cls, name, value):
        if name == "blocked":
            raise AttributeError(f"{cls.__name__}.blocked cannot be set")
        super().__setattr__(name, value)


def _stock_helper():
    return "stock"


def _fixed_helper():
    return "fixed"


def _fixed_describe(self):
    return "fixed"


@pytest.fixture
def fake_versions(monkeypatch):
    """The registry sees TorchRL 1.4.2 and tensordict 7.0.1."""
    versions = {"torchrl": TORCHRL, "tensordict": TENSORDICT}
    monkeypatch.setattr("torchrl_fixes._core.registry.installed_version", versions.get)
    return versions


@pytest.fixture
def target(make_module):
    """A fresh module with a function, a class and a class that refuses one attribute."""

    class Widget:
        def __init__(self, size=1):
            self.size = size

        def describe(self):
            return "stock"

    class Plain:
        def describe(self):
            return "stock"

    class Locked(metaclass=_RefusesBlocked):
        def blocked(self):
            return "stock"

    class Ledger:
        def entries(self):
            parts = ["stock"]
            parts.append("one")
            parts.append("two")
            return parts

    return make_module(
        helper=_stock_helper, Widget=Widget, Plain=Plain, Locked=Locked, Ledger=Ledger
    )


@pytest.fixture
def registries():
    """Builds registries and removes whatever they applied at teardown."""
    made = []

    def build(*fixes):
        registry = Registry(fixes)
        made.append(registry)
        return registry

    yield build
    for registry in made:
        registry.deactivate()


def make_fix(name, plan, versions=SUPPORTED, stock_classes=()):
    """An instance of a new Fix subclass whose plan() is ``plan``."""
    cls = type(
        f"Fix_{name}",
        (Fix,),
        {
            "name": name,
            "summary": f"summary of {name}",
            "upstream_issue": f"https://example.invalid/{name}",
            "torchrl_versions": SpecifierSet(versions),
            "stock_classes": tuple(stock_classes),
            "plan": lambda self: plan(),
        },
    )
    return cls()


def helper_fix(target, name="helper_fix", **kwargs):
    return make_fix(name, lambda: [Replacement(target, "helper", _fixed_helper)], **kwargs)


def widget_fix(target, name="widget_fix", cls_name="Widget", **kwargs):
    cls = getattr(target, cls_name)
    return make_fix(name, lambda: [Replacement(cls, "describe", _fixed_describe)], **kwargs)


def ledger_fix(target, name, edits, names=None, also=()):
    """A fix editing the source of ``Ledger.entries``, gated on its stock code like a real fix."""
    cls = target.Ledger
    known = {source_fingerprint(vars(cls)["entries"])}

    def plan():
        stock = stock_function(cls, "entries", known)
        return [*also, SourceEdits(cls, "entries", stock, tuple(edits), dict(names or {}))]

    return make_fix(name, plan)


def appends(word):
    """An edit adding ``word`` last to the entries: two of them apply in either order."""
    return ("return parts", f"parts.append({word!r})\n    return parts")


def test_activate_applies_and_returns_names(fake_versions, target, registries):
    """activate() installs every fix's replacements and returns the applied names in order."""
    registry = registries(helper_fix(target), widget_fix(target))

    assert registry.activate() == ["helper_fix", "widget_fix"]
    assert target.helper() == "fixed"
    assert target.Widget().describe() == "fixed"
    assert is_object_patched(target, "helper")
    assert is_object_patched(target.Widget, "describe")
    assert [row.state for row in registry.status()] == ["applied", "applied"]


def test_activate_by_name_applies_only_that_fix(fake_versions, target, registries):
    """Naming a fix applies it alone."""
    registry = registries(helper_fix(target), widget_fix(target))

    assert registry.activate("widget_fix") == ["widget_fix"]
    assert target.helper is _stock_helper
    assert not is_object_patched(target, "helper")
    assert target.Widget().describe() == "fixed"


def test_activate_twice_is_idempotent(fake_versions, target, registries):
    """A second activate() keeps the installed objects and raises or warns nothing."""
    original_describe = vars(target.Widget)["describe"]
    registry = registries(helper_fix(target), widget_fix(target))
    first = registry.activate()
    installed_helper = target.helper
    installed_describe = vars(target.Widget)["describe"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = registry.activate()
        third = registry.activate("widget_fix")

    assert second == first
    assert third == first
    assert target.helper is installed_helper
    assert vars(target.Widget)["describe"] is installed_describe
    assert get_original(target.Widget, "describe") is original_describe
    assert get_original(target, "helper") is _stock_helper


def test_deactivate_restores_identity(fake_versions, target, registries):
    """deactivate() puts the exact original objects back."""
    original_describe = vars(target.Widget)["describe"]
    registry = registries(helper_fix(target), widget_fix(target))
    registry.activate()
    assert target.helper is not _stock_helper

    registry.deactivate()
    assert target.helper is _stock_helper
    assert vars(target.Widget)["describe"] is original_describe
    assert not is_object_patched(target, "helper")
    assert not is_object_patched(target.Widget, "describe")
    assert registry.applied() == []
    assert [row.state for row in registry.status()] == ["inactive", "inactive"]


def test_deactivate_by_name_leaves_the_others(fake_versions, target, registries):
    """deactivate(name) removes that fix only."""
    original_describe = vars(target.Widget)["describe"]
    registry = registries(helper_fix(target), widget_fix(target))
    registry.activate()

    registry.deactivate("widget_fix")
    assert vars(target.Widget)["describe"] is original_describe
    assert target.helper() == "fixed"
    assert registry.applied() == ["helper_fix"]


def test_unknown_name_raises_naming_unknown_and_known(fake_versions, target, registries):
    """An unknown name is a ValueError naming it and every known fix; nothing is applied."""
    registry = registries(helper_fix(target), widget_fix(target))

    with pytest.raises(ValueError) as excinfo:
        registry.activate("helper_fix", "no_such_fix")
    message = str(excinfo.value)
    assert "no_such_fix" in message
    assert "helper_fix" in message
    assert "widget_fix" in message
    assert target.helper is _stock_helper
    assert registry.applied() == []

    with pytest.raises(ValueError, match="no_such_fix"):
        registry.deactivate("no_such_fix")


def test_release_outside_the_checked_range_gets_what_its_code_allows(
    fake_versions, target, registries
):
    """The declared range is what the fix was checked on, not a gate: a fix whose
    range excludes the installed TorchRL applies where its plan finds its targets."""
    registry = registries(helper_fix(target, versions="<1.4"), widget_fix(target))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.activate() == ["helper_fix", "widget_fix"]
    assert target.helper() == "fixed"
    row = registry.status()["helper_fix"]
    assert row.applied and row.torchrl_versions == "<1.4"


def test_target_changed_is_skipped(fake_versions, target, registries):
    """A plan that raises TargetChanged is skipped with its message; nothing of it is installed."""

    def plan():
        raise TargetChanged("helper is not the code this fix replaces")

    registry = registries(make_fix("changed", plan), widget_fix(target))

    with pytest.warns(FixSkippedWarning, match="changed"):
        applied = registry.activate()
    assert applied == ["widget_fix"]
    assert target.helper is _stock_helper
    assert not is_object_patched(target, "helper")

    row = registry.status()["changed"]
    assert row.state == "skipped"
    assert row.reason.startswith("target changed")
    assert "helper is not the code this fix replaces" in row.reason


def test_unexpected_error_while_planning_is_a_skip(fake_versions, target, registries):
    """Any exception a plan raises (not only TargetChanged) is a skip with its reason."""

    def plan():
        raise AttributeError("'code' object has no attribute 'co_qualname'")

    registry = registries(make_fix("broken", plan), widget_fix(target))

    with pytest.warns(FixSkippedWarning, match="broken"):
        assert registry.activate() == ["widget_fix"]
    row = registry.status()["broken"]
    assert row.state == "skipped"
    assert row.reason == (
        "could not be planned: AttributeError: 'code' object has no attribute 'co_qualname'"
    )


def test_a_skip_is_reported_once(fake_versions, target, registries, caplog):
    """Asking again for a fix that cannot apply does not repeat its warning; nothing is logged
    beside the warning."""

    def plan():
        raise TargetChanged("helper changed")

    registry = registries(make_fix("changed", plan))
    with caplog.at_level("DEBUG", logger="torchrl_fixes"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            registry.activate()
            registry.activate("changed")
            registry.activate()
    assert [str(w.message) for w in caught] == ["torchrl_fixes: changed skipped: target changed: helper changed"]
    assert not [r for r in caplog.records if "skipped" in r.getMessage()]


def test_fix_that_cannot_be_fully_set_leaves_nothing_installed(fake_versions, target, registries):
    """When the second replacement cannot be set: the first is rolled back, the fix is skipped and says why."""
    locked_blocked = vars(target.Locked)["blocked"]
    fix = make_fix(
        "half",
        lambda: [
            Replacement(target, "helper", _fixed_helper),
            Replacement(target.Locked, "blocked", _fixed_describe),
        ],
    )
    registry = registries(fix)

    with pytest.warns(FixSkippedWarning, match="could not be installed"):
        assert registry.activate() == []
    row = registry.status()["half"]
    assert row.state == "skipped"
    assert row.reason.startswith("could not be installed: AttributeError")
    assert "blocked cannot be set" in row.reason
    assert target.helper is _stock_helper
    assert vars(target.Locked)["blocked"] is locked_blocked
    assert not is_object_patched(target, "helper")
    assert not is_object_patched(target.Locked, "blocked")
    assert registry.applied() == []
    assert not registry.status()["half"].applied


def test_unknown_torchrl_version_gets_what_its_code_allows(monkeypatch, target, registries):
    """A TorchRL whose release cannot be told (0.10.1 reads 0.0.0+unknown) is gated by
    its code alone; the report says the version is unknown."""
    monkeypatch.setattr("torchrl_fixes._core.registry.installed_version", lambda package: None)
    registry = registries(helper_fix(target))

    assert registry.activate() == ["helper_fix"]
    assert target.helper() == "fixed"
    report = registry.status()
    assert report["helper_fix"].applied
    assert report.torchrl == "unknown"


@pytest.mark.parametrize("cls_name", ["Widget", "Plain"])
def test_disabled_runs_stock_and_keeps_inside_objects_stock(
    fake_versions, target, registries, cls_name
):
    """Objects built inside disabled() keep the original method; others get the replacement."""
    cls = getattr(target, cls_name)
    own_init = vars(cls).get("__init__")
    original_describe = vars(cls)["describe"]
    class_path = f"{target.__name__}.{cls_name}"
    registry = registries(
        helper_fix(target), widget_fix(target, cls_name=cls_name, stock_classes=[class_path])
    )
    registry.activate()
    built_before = cls()

    with registry.disabled():
        assert registry.applied() == []
        assert target.helper is _stock_helper
        assert vars(cls)["describe"] is original_describe
        assert not is_object_patched(cls, "describe")
        built_inside = cls()
        assert built_inside.describe() == "stock"
        assert built_before.describe() == "stock"

    assert registry.applied() == ["helper_fix", "widget_fix"]
    assert is_object_patched(cls, "describe")
    assert target.helper() == "fixed"
    assert built_inside.describe() == "stock"
    assert built_before.describe() == "fixed"
    assert cls().describe() == "fixed"
    assert vars(cls).get("__init__") is own_init
    assert not is_object_patched(cls, "__init__")

    registry.deactivate()
    assert vars(cls)["describe"] is original_describe
    assert built_inside.describe() == "stock"


def test_disabled_reapplies_after_an_exception(fake_versions, target, registries):
    """Leaving disabled() by an exception still applies the fixes again."""
    registry = registries(helper_fix(target))
    registry.activate()

    with pytest.raises(KeyError), registry.disabled():
        assert target.helper is _stock_helper
        raise KeyError("inside")

    assert registry.applied() == ["helper_fix"]
    assert target.helper() == "fixed"


def test_disabled_with_nothing_applied_activates_nothing(fake_versions, target, registries):
    """disabled() on a registry with no fix applied applies none on exit."""
    registry = registries(helper_fix(target), widget_fix(target))
    original_describe = vars(target.Widget)["describe"]

    with registry.disabled():
        pass
    assert registry.applied() == []
    assert target.helper is _stock_helper
    assert vars(target.Widget)["describe"] is original_describe

    registry.activate("helper_fix")
    registry.deactivate()
    with registry.disabled():
        pass
    assert registry.applied() == []
    assert target.helper is _stock_helper
    assert [row.state for row in registry.status()] == ["inactive", "inactive"]


def test_status_rows_and_table(fake_versions, target, registries):
    """status() has one row per fix with state and reason, and prints them as a table."""
    applied = helper_fix(target, name="applied_fix")
    def changed():
        raise TargetChanged("Widget.describe is not the code this fix replaces")

    skipped = make_fix("skipped_fix", changed, versions="<1")
    idle = make_fix("idle_fix", lambda: [], versions=">=2")
    registry = registries(applied, skipped, idle)
    with pytest.warns(FixSkippedWarning):
        registry.activate("applied_fix", "skipped_fix")

    report = registry.status()
    assert isinstance(report, StatusReport)
    assert all(isinstance(row, FixStatus) for row in report)
    assert [row.name for row in report] == ["applied_fix", "skipped_fix", "idle_fix"]
    assert [row.state for row in report] == ["applied", "skipped", "inactive"]
    assert [row.applied for row in report] == [True, False, False]
    assert report[0].reason == ""
    assert report[1].reason == "target changed: Widget.describe is not the code this fix replaces"
    assert report[2].reason != ""
    for row, fix in zip(report, (applied, skipped, idle)):
        assert row.summary == fix.summary
        assert row.upstream_issue == fix.upstream_issue
        assert SpecifierSet(row.torchrl_versions) == fix.torchrl_versions
    assert report.torchrl == str(TORCHRL)
    assert report.tensordict == str(TENSORDICT)

    lines = str(report).splitlines()
    assert lines[0] == f"torchrl {TORCHRL}, tensordict {TENSORDICT}"
    assert lines[1].split() == ["fix", "state", "torchrl", "why"]
    assert len(lines) == 2 + len(report)
    for line, row in zip(lines[2:], report):
        assert line.startswith(row.name + " ")
        assert f" {row.state} " in line
        assert row.torchrl_versions in line
        assert line.endswith(row.reason or "-")


@pytest.mark.parametrize("columns", [60, 100])
def test_status_prose_lines_fold_to_the_terminal(monkeypatch, columns):
    """The fallbacks and notes are folded to the terminal's width, their words kept."""
    fallbacks = ", ".join(f"configuration number {i} of the fix" for i in range(30))
    note = "TORCHRL_FIXES names " + " ".join(f"unknown_fix_{i}" for i in range(30))
    row = FixStatus("a_fix", "summary", "", ">=0.8", "applied", "", fallbacks)
    report = StatusReport([row], "0.14.1", "0.14.3", notes=[note])
    monkeypatch.setenv("COLUMNS", str(columns))

    lines = str(report).splitlines()
    assert max(len(line) for line in lines) <= columns
    block = lines[lines.index("stock code still runs for:") + 1 :]
    first_note = next(i for i, line in enumerate(block) if line.startswith("note: "))
    assert " ".join(block[:first_note]).split() == f"a_fix: {fallbacks}".split()
    assert " ".join(block[first_note:]).split() == f"note: {note}".split()
    assert all(line.startswith("    ") for line in block[1:first_note])


def test_status_report_lookup_by_name(fake_versions, target, registries):
    """A report is indexed by fix name as well as by position; unknown names raise KeyError."""
    registry = registries(helper_fix(target), widget_fix(target))
    registry.activate("widget_fix")
    report = registry.status()

    assert report["widget_fix"] is report[1]
    assert report["widget_fix"].state == "applied"
    assert report["helper_fix"] is report[0]
    assert report["helper_fix"].state == "inactive"
    with pytest.raises(KeyError, match="no_such_fix"):
        report["no_such_fix"]


def test_wildcard_ranges_are_reported(fake_versions, target, registries):
    """Ranges with wildcards (!=1.4.*) are written readably in status()."""
    registry = registries(helper_fix(target, versions=">=1.0,!=1.4.*"))

    assert registry.activate() == ["helper_fix"]
    row = registry.status()["helper_fix"]
    assert row.torchrl_versions == ">=1.0,!=1.4.*"
    assert row.torchrl_versions in str(registry.status())


def test_disabled_setup_failure_keeps_fixes_applied(fake_versions, target, registries):
    """If disabled() cannot set itself up, the fixes stay applied and the error propagates."""
    registry = registries(widget_fix(target, stock_classes=("no_such_module_for_tests.Cls",)))
    registry.activate()

    with pytest.raises(ImportError):
        with registry.disabled():
            pass
    assert registry.applied() == ["widget_fix"]
    assert target.Widget().describe() == "fixed"


def test_staticmethod_replacement_keeps_working_on_instances(fake_versions, make_module, registries):
    """A staticmethod replacement is installed as is, callable from the class and from instances."""

    class Tool:
        @staticmethod
        def convert(x):
            return ("stock", x)

    stock = vars(Tool)["convert"]
    replacement = staticmethod(lambda x: ("fixed", x))
    registry = registries(make_fix("static", lambda: [Replacement(Tool, "convert", replacement)]))

    registry.activate()
    assert Tool().convert(1) == ("fixed", 1)
    assert Tool.convert(2) == ("fixed", 2)
    assert vars(Tool)["convert"] is replacement
    assert get_original(Tool, "convert") is stock
    registry.deactivate()
    assert vars(Tool)["convert"] is stock


def test_get_original_returns_stored_attributes_patched_or_not(fake_versions, registries):
    """get_original gives the class's stored object (the staticmethod), before and during a patch."""

    class Base:
        @staticmethod
        def convert(x):
            return x

    class Child(Base):
        pass

    stored = vars(Base)["convert"]
    assert get_original(Child, "convert") is stored
    registry = registries(
        make_fix("child", lambda: [Replacement(Child, "convert", staticmethod(lambda x: -x))])
    )
    registry.activate()
    assert Child.convert(3) == -3
    assert get_original(Child, "convert") is stored


def test_target_checks_the_declared_codes(make_module):
    """A Target returns the stored function when its fingerprint is declared, raises
    TargetChanged when it is not or the function is missing, and answers None for a
    missing optional target."""
    module = make_module(helper=_stock_helper)
    known = {source_fingerprint(_stock_helper): "1.4"}
    assert Target(module.__name__, "helper", known, installs="replaced").stock() is _stock_helper
    with pytest.raises(TargetChanged, match="helper is not the code this fix replaces"):
        Target(module.__name__, "helper", {"0" * 16: "1.3"}, installs="replaced").stock()
    with pytest.raises(TargetChanged, match="gone is missing"):
        Target(module.__name__, "gone", known, installs="replaced").stock()
    assert Target(module.__name__, "gone", known, installs="replaced", optional=True).stock() is None
    assert (
        Target(f"{module.__name__}.NoSuchClass", "run", known, installs="-", optional=True).stock()
        is None
    )


def test_fix_finds_its_declared_targets_by_path(make_module):
    module = make_module(helper=_stock_helper)
    target = Target(
        module.__name__, "helper", {source_fingerprint(_stock_helper): "1.4"}, installs="replaced"
    )
    fix = type("Declared", (Fix,), {"name": "declared", "implements": (target,)})()
    assert fix.target(target.path) is target
    assert fix.stock(target.path) is _stock_helper
    with pytest.raises(KeyError, match="declares no target"):
        fix.target("Other.name")


def test_source_edits_of_two_fixes_make_one_method(fake_versions, target, registries):
    """Two fixes editing one method install one method with both edits; removing one
    re-installs the other's; removing both puts the very stock function back."""
    stock = vars(target.Ledger)["entries"]
    registry = registries(
        ledger_fix(target, "upper_one", [('"one"', '"ONE"')]),
        ledger_fix(target, "named_two", [('"two"', "second")], names={"second": "TWO"}),
    )

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.activate() == ["upper_one", "named_two"]
    assert target.Ledger().entries() == ["stock", "ONE", "TWO"]
    assert is_object_patched(target.Ledger, "entries")
    assert get_original(target.Ledger, "entries") is stock

    registry.deactivate("upper_one")
    assert registry.applied() == ["named_two"]
    assert target.Ledger().entries() == ["stock", "one", "TWO"]
    assert get_original(target.Ledger, "entries") is stock

    registry.deactivate("named_two")
    assert vars(target.Ledger)["entries"] is stock
    assert not is_object_patched(target.Ledger, "entries")
    assert target.Ledger().entries() == ["stock", "one", "two"]
    assert [row.state for row in registry.status()] == ["inactive", "inactive"]


@pytest.mark.parametrize("order", [("first", "second"), ("second", "first")])
def test_source_edits_are_made_in_registry_order(fake_versions, target, registries, order):
    """Whichever fix is activated first, the edits are made in the registry's order (the
    second's plan gates on stock code while the first's method is installed)."""
    stock = vars(target.Ledger)["entries"]
    registry = registries(
        ledger_fix(target, "first", [appends("first")]),
        ledger_fix(target, "second", [appends("second")]),
    )

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in order:
            registry.activate(name)
    assert registry.applied() == ["first", "second"]
    assert target.Ledger().entries() == ["stock", "one", "two", "first", "second"]

    registry.deactivate("first")
    assert target.Ledger().entries() == ["stock", "one", "two", "second"]
    registry.deactivate("second")
    assert vars(target.Ledger)["entries"] is stock
    assert not is_object_patched(target.Ledger, "entries")


def test_source_edits_that_clash_skip_the_later_fix(fake_versions, target, registries):
    """A fix whose edit finds its text gone after an earlier fix's edit is skipped, saying
    why; none of it stays installed and the earlier fix's method stays."""
    stock = vars(target.Ledger)["entries"]
    also = [Replacement(target, "helper", _fixed_helper)]
    registry = registries(
        ledger_fix(target, "keep", [('"one"', '"uno"')]),
        ledger_fix(target, "clash", [('"one"', '"ONE"')], also=also),
    )

    why = "'\"one\"' is not found once"
    skipped = f"clash skipped: could not be installed: TargetChanged: .*{re.escape(why)}"
    with pytest.warns(FixSkippedWarning, match=skipped):
        assert registry.activate() == ["keep"]
    assert target.Ledger().entries() == ["stock", "uno", "two"]
    assert target.helper is _stock_helper
    assert not is_object_patched(target, "helper")

    report = registry.status()
    assert report["keep"].applied
    assert report["clash"].state == "skipped"
    assert report["clash"].reason.startswith("could not be installed: TargetChanged")
    assert "Ledger.entries" in report["clash"].reason
    assert why in report["clash"].reason

    registry.deactivate()
    assert vars(target.Ledger)["entries"] is stock
    assert not is_object_patched(target.Ledger, "entries")


def test_fix_with_replacements_and_source_edits_removes_both(fake_versions, target, registries):
    """deactivate() removes a fix's plain replacements and its edited method alike."""
    stock = vars(target.Ledger)["entries"]
    also = [Replacement(target, "helper", _fixed_helper)]
    registry = registries(ledger_fix(target, "both", [('"two"', '"TWO"')], also=also))

    assert registry.activate() == ["both"]
    assert target.helper() == "fixed"
    assert target.Ledger().entries() == ["stock", "one", "TWO"]

    registry.deactivate("both")
    assert target.helper is _stock_helper
    assert vars(target.Ledger)["entries"] is stock
    assert not is_object_patched(target, "helper")
    assert not is_object_patched(target.Ledger, "entries")
    assert registry.status()["both"].state == "inactive"


def test_stock_function_reads_the_original_of_a_patched_attribute(
    fake_versions, target, registries
):
    """Where a fix replaced the function, the gate checks (and returns) the one it replaced."""
    describe = vars(target.Widget)["describe"]
    registry = registries(helper_fix(target), widget_fix(target))
    registry.activate()
    installed = vars(target.Widget)["describe"]
    assert installed is not describe

    assert stock_function(target.Widget, "describe", {source_fingerprint(describe)}) is describe
    assert stock_function(target, "helper", {source_fingerprint(_stock_helper)}) is _stock_helper
    with pytest.raises(TargetChanged, match="Widget.describe is not the code"):
        stock_function(target.Widget, "describe", {source_fingerprint(installed)})
