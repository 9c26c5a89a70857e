"""The fixes torchrl_fixes knows, and turning them on and off.

The shape follows OpenTelemetry's ``BaseInstrumentor`` and gevent's ``__implements__``:
every fix declares, once, the stock functions it replaces or relies on and the codes
of them it knows (:class:`Target`, in :attr:`Fix.implements`); applying and removing
it are idempotent; a fix that cannot apply cleanly is skipped with a warning that
says why, and is never left half-applied.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import shutil
import textwrap
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Collection, Iterator, Mapping, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from torchrl_fixes._core import patching
from torchrl_fixes._core.errors import TargetChanged
from torchrl_fixes._core.patching import Replacement, SourceEdits
from torchrl_fixes._core.source_fingerprint import source_fingerprint
from torchrl_fixes._core.versions import installed_version
from torchrl_fixes._core.warning_categories import FixSkippedWarning, warn_at_caller

logger = logging.getLogger("torchrl_fixes")

# Instance attribute set on objects built inside ``disabled()``: they keep running stock code.
STOCK_MARK = "_torchrl_fixes_stock"


def stock_function(owner: Any, name: str, fingerprints: Collection[str]) -> types.FunctionType:
    """``owner.name`` as stored (a static method's function), checked to be stock code a fix knows.

    The one gate every fix puts on the code it replaces or reproduces: the function
    must be defined on ``owner`` itself and its :func:`source_fingerprint` must be one
    of ``fingerprints`` (one per release where the code differs). Where a fix's
    replacement is there, the function read is the one it replaced
    (:func:`~torchrl_fixes._core.patching.get_original`).

    Args:
        owner (module or type): where the function is stored.
        name (str): the attribute name.
        fingerprints (collection of str): the fingerprints of the stock code the fix knows.

    Raises:
        TargetChanged: the function is missing, or is not one of the known codes.

    Examples:
        >>> import types
        >>> def helper():
        ...     return 1
        >>> module = types.SimpleNamespace(__name__="m", helper=helper)
        >>> stock_function(module, "helper", {source_fingerprint(helper)}) is helper
        True
        >>> stock_function(module, "helper", set())
        Traceback (most recent call last):
        ...
        torchrl_fixes._core.errors.TargetChanged: helper is not the code this fix replaces (changed or fixed upstream)
    """
    if isinstance(owner, type):
        func, path = vars(owner).get(name), f"{owner.__qualname__}.{name}"
    else:
        func, path = getattr(owner, name, None), name
    if patching.installed_replacement(owner, name) is not None:
        func = patching.get_original(owner, name)
    if isinstance(func, staticmethod):
        func = func.__func__
    if not isinstance(func, types.FunctionType):
        raise TargetChanged(f"{path} is missing")
    if source_fingerprint(func) not in fingerprints:
        raise TargetChanged(f"{path} is not the code this fix replaces (changed or fixed upstream)")
    return func


@dataclass(frozen=True)
class Target:
    """A stock function a fix replaces or relies on: where it is, the codes of it the fix
    knows, and what the fix puts there (gevent's ``__implements__``, one entry).

    Each fix declares its targets once, in :attr:`Fix.implements`; its plan gets
    them checked through :meth:`Fix.stock`, and the tests and the docs read the same
    entries.

    Args:
        owner (str): the dotted path of the class or module that stores the function.
        name (str): the attribute name.
        seen (dict): each fingerprint of the stock code the fix knows
            (:func:`source_fingerprint`) -> the TorchRL releases it was seen in.
        installs (str): what the fix puts there, or how it uses the code.
        optional (bool, optional): the function is missing from some releases the fix
            supports; it is checked where it exists. Defaults to ``False``.

    Examples:
        >>> target = Target(
        ...     "torchrl.data.replay_buffers.utils", "_pin_memory", {"fe2edbb01bceb61d": "0.8.1 to 0.14.1"},
        ...     installs="relied on unchanged")
        >>> target.path, target.stock() is not None
        ('utils._pin_memory', True)
    """

    owner: str
    name: str
    seen: Mapping[str, str]
    installs: str
    optional: bool = False

    @property
    def path(self) -> str:
        """``Owner.name``, the owner by its last dotted part."""
        return f"{self.owner.rpartition('.')[2]}.{self.name}"

    def stock(self) -> types.FunctionType | None:
        """The installed function, checked by :func:`stock_function` against :attr:`seen`.

        ``None`` where an optional target is missing.

        Raises:
            TargetChanged: the owner or the function is missing (and not optional), or
                the function is not one of the codes the fix knows.
        """
        try:
            owner = patching.resolve_path(self.owner)
        except (ImportError, AttributeError) as err:
            if self.optional:
                return None
            raise TargetChanged(f"{self.owner} is missing") from err
        stored = vars(owner).get(self.name) if isinstance(owner, type) else getattr(owner, self.name, None)
        if stored is None and self.optional:
            return None
        return stock_function(owner, self.name, self.seen)

    def found(self) -> str:
        """Which code of :attr:`seen` the installed function is: its releases, ``"missing"``
        (an optional target that is not there), or why it is not a code the fix knows.

        Read it with the fixes off (inside ``disabled()``): an applied fix's target
        holds the fix's code.
        """
        try:
            function = self.stock()
        except TargetChanged as err:
            return f"not a known code ({err})"
        if function is None:
            return "missing"
        return f"as in {self.seen[source_fingerprint(function)]}"


def targets_table(fixes: Sequence[Fix], *, found: bool = False) -> str:
    """The targets ``fixes`` declare (:attr:`Fix.implements`), as a Markdown table.

    One row per target: the fix, the stock function, the releases each code of it the
    fix knows was seen in, and what the fix puts there. With ``found``, a last column
    says which code the installed TorchRL has (:meth:`Target.found`; call it with the
    fixes off).
    """
    header = "| fix | stock function | codes known (releases) | what the fix puts there |"
    rows = [header + (" found here |" if found else ""), "| --- " * (5 if found else 4) + "|"]
    for fix in fixes:
        for target in fix.implements:
            seen = "; ".join(target.seen.values())
            optional = " (where present)" if target.optional else ""
            row = f"| `{fix.name}` | `{target.path}`{optional} | {seen} | {target.installs} |"
            rows.append(row + (f" {target.found()} |" if found else ""))
    return "\n".join(rows)


class Fix:
    """Base class of a fix.

    A subclass declares what it is and where it applies, and implements
    :meth:`plan`, which inspects the installed TorchRL and returns the attribute
    replacements that apply the fix. The registry installs them all or none.

    Class attributes:
        name (str): the identifier used by :func:`activate` and ``TORCHRL_FIXES``.
        summary (str): one line on what the fix changes.
        upstream_issue (str): the URL of the TorchRL issue the fix answers.
        torchrl_versions (SpecifierSet): the TorchRL releases the fix was checked on
            (shown by ``status()``). It does not gate the fix: :meth:`plan` does, by
            the fingerprints of the stock code it finds (:func:`stock_function`), so
            a release of unknown version or outside the range gets what its code
            allows.
        implements (tuple of Target): every stock function the fix replaces or relies on,
            with the codes of it the fix knows: the one declaration its plan, the
            tests and the docs read.
        stock_classes (tuple of str): dotted paths of the classes whose instances,
            when built inside :func:`disabled`, keep running stock code afterwards.
        fallbacks (str): the configurations an applied fix leaves to stock code, if any.
        release_fallbacks (str): those it leaves to stock code only on older TorchRL
            releases, whose code lacks what it needs (the upstream patches target
            TorchRL main, where they do not arise).
        limits (str): what an applied fix does not see, or sees only at stock's
            cost, and how to avoid it.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    upstream_issue: ClassVar[str]
    torchrl_versions: ClassVar[SpecifierSet]
    implements: ClassVar[tuple[Target, ...]] = ()
    stock_classes: ClassVar[tuple[str, ...]] = ()
    fallbacks: ClassVar[str] = ""
    release_fallbacks: ClassVar[str] = ""
    limits: ClassVar[str] = ""

    def all_fallbacks(self) -> str:
        """:attr:`fallbacks`, then :attr:`release_fallbacks`: what ``status()`` lists."""
        return "; ".join(text for text in (self.fallbacks, self.release_fallbacks) if text)

    @classmethod
    def target(cls, path: str) -> Target:
        """The :class:`Target` of :attr:`implements` at ``path`` (``Owner.name``)."""
        for target in cls.implements:
            if target.path == path:
                return target
        raise KeyError(f"{cls.__name__} declares no target {path!r}")

    def stock(self, path: str) -> types.FunctionType | None:
        """The installed function of target ``path``, checked (see :meth:`Target.stock`)."""
        return self.target(path).stock()

    def plan(self) -> list[Replacement]:
        """The replacements that apply this fix to the installed TorchRL.

        Raises:
            TargetChanged: a target is missing, or its code is not what the fix replaces.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class FixStatus:
    """Where one fix stands in this process.

    Attributes:
        name (str): the fix.
        summary (str): what it changes.
        upstream_issue (str): the TorchRL issue it answers.
        torchrl_versions (str): the releases the fix was checked on, as a specifier.
        state (str): ``"applied"``, ``"skipped"`` (it was asked for and could not
            apply) or ``"inactive"`` (not asked for, or deactivated).
        reason (str): why it is not applied; empty when it is.
        fallbacks (str): the configurations the fix leaves to stock code, if any.
        limits (str): what the fix does not see, or sees only at stock's cost, if anything.
    """

    name: str
    summary: str
    upstream_issue: str
    torchrl_versions: str
    state: str
    reason: str
    fallbacks: str = ""
    limits: str = ""

    @property
    def applied(self) -> bool:
        return self.state == "applied"


class StatusReport(list):
    """The status of every fix, printable as a table."""

    def __init__(
        self,
        rows: Sequence[FixStatus],
        torchrl: str,
        tensordict: str,
        notes: Sequence[str] = (),
    ):
        super().__init__(rows)
        self.torchrl = torchrl
        self.tensordict = tensordict
        self.notes = list(notes)

    def __getitem__(self, item):
        if isinstance(item, str):
            for row in self:
                if row.name == item:
                    return row
            raise KeyError(item)
        return super().__getitem__(item)

    def __str__(self) -> str:
        header = ("fix", "state", "torchrl", "why")
        rows = [(r.name, r.state, r.torchrl_versions, r.reason or "-") for r in self]
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        lines = [f"torchrl {self.torchrl}, tensordict {self.tensordict}"]
        for row in (header, *rows):
            lines.append("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
        # the prose lines are folded to the terminal, between words, under their first line
        fold = functools.partial(
            textwrap.fill,
            width=max(shutil.get_terminal_size().columns, 40),
            break_long_words=False,
            break_on_hyphens=False,
        )
        for heading, field in (("stock code still runs for:", "fallbacks"), ("limits:", "limits")):
            notes = [
                fold(f"{r.name}: {getattr(r, field)}", initial_indent="  ", subsequent_indent="    ")
                for r in self
                if r.applied and getattr(r, field)
            ]
            if notes:
                lines += [heading, *notes]
        lines += [fold(f"note: {note}", subsequent_indent="  ") for note in self.notes]
        return "\n".join(lines)


def _stock_aware(original: Callable, replacement: Callable) -> Callable:
    """A method that runs ``replacement``, or ``original`` on objects built while disabled."""

    @functools.wraps(replacement)
    def method(self, *args, **kwargs):
        if getattr(self, "__dict__", {}).get(STOCK_MARK, False):
            return original(self, *args, **kwargs)
        return replacement(self, *args, **kwargs)

    return method


def _marking_init(original_init: Callable) -> Callable:
    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.__dict__[STOCK_MARK] = True

    return __init__


def format_range(versions: SpecifierSet) -> str:
    """A version range written low to high (``>=0.8,<0.15``), not in SpecifierSet's text order."""

    def key(spec):
        # "0.13.*" (with == or !=) sorts as 0.13
        return (Version(spec.version.removesuffix(".*")), spec.operator)

    return ",".join(str(spec) for spec in sorted(versions, key=key))


class Registry:
    """Knows every fix, applies and removes them, and reports their status.

    Args:
        fixes (sequence of Fix): the fixes, in the order they are applied.
    """

    def __init__(self, fixes: Sequence[Fix]):
        self._fixes = {fix.name: fix for fix in fixes}
        self._installed: dict[str, list] = {}
        self._source_edits: dict[str, list[SourceEdits]] = {}  # applied fix -> its edits
        self._edited: list = []  # the records of the methods installed for them
        self._skipped: dict[str, str] = {}
        self._inactive: dict[str, str] = {name: "not requested" for name in self._fixes}
        # (fix, reason) pairs already reported: a skip is said once per process, not
        # at every activate().
        self._reported: set[tuple[str, str]] = set()
        # Problems with how the fixes were asked for (the environment variable), shown by status().
        self.notes: list[str] = []
        self._lock = threading.RLock()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._fixes)

    def _select(self, names: Sequence[str]) -> list[Fix]:
        unknown = [n for n in names if n not in self._fixes]
        if unknown:
            raise ValueError(
                f"unknown fix name(s) {', '.join(map(repr, unknown))}; "
                f"known fixes: {', '.join(self._fixes)}"
            )
        return [self._fixes[n] for n in (names or self._fixes)]

    def _wrap_methods(self, replacements: list[Replacement]) -> list[Replacement]:
        wrapped = []
        for rep in replacements:
            # Plain functions only: staticmethod, classmethod and property objects
            # take no instance to tell stock objects by.
            if isinstance(rep.owner, type) and inspect.isfunction(rep.new):
                try:
                    original = patching.class_attribute(rep.owner, rep.name)
                except AttributeError:
                    original = None  # an attribute the fix adds (a backport)
                if inspect.isfunction(original):
                    rep = Replacement(rep.owner, rep.name, _stock_aware(original, rep.new))
            wrapped.append(rep)
        return wrapped

    def activate(self, *names: str) -> list[str]:
        """Applies the named fixes (all if none is named); returns those now applied.

        Applying an applied fix does nothing. A fix whose targets are not code it
        knows (whatever the installed TorchRL's version) is skipped with a
        :class:`~torchrl_fixes.FixSkippedWarning` saying why.
        """
        with self._lock:
            for fix in self._select(names):
                if fix.name in self._installed:
                    continue
                reason = None
                try:
                    plan = fix.plan()
                    edits = [r for r in plan if isinstance(r, SourceEdits)]
                    replacements = self._wrap_methods(
                        [r for r in plan if not isinstance(r, SourceEdits)]
                    )
                except TargetChanged as err:
                    reason = f"target changed: {err}"
                except ImportError as err:
                    reason = f"target missing: {err}"
                except Exception as err:  # a fix must never fail the import
                    reason = f"could not be planned: {type(err).__name__}: {err}"
                if reason is None:
                    try:
                        self._installed[fix.name] = patching.install(replacements)
                    except Exception as err:  # install() has already put everything back
                        reason = f"could not be installed: {type(err).__name__}: {err}"
                if reason is None and edits:
                    self._source_edits[fix.name] = edits
                    try:
                        self._install_source_edits()
                    except Exception as err:  # the others' edits are put back
                        del self._source_edits[fix.name]
                        patching.uninstall(self._installed.pop(fix.name))
                        self._install_source_edits()
                        reason = f"could not be installed: {type(err).__name__}: {err}"
                if reason is not None:
                    self._skipped[fix.name] = reason
                    self._inactive.pop(fix.name, None)
                    if (fix.name, reason) not in self._reported:
                        self._reported.add((fix.name, reason))
                        warn_at_caller(
                            f"torchrl_fixes: {fix.name} skipped: {reason}", FixSkippedWarning
                        )
                    continue
                self._skipped.pop(fix.name, None)
                self._inactive.pop(fix.name, None)
                logger.debug("fix %s applied", fix.name)
            return self.applied()

    def deactivate(self, *names: str) -> None:
        """Removes the named fixes (all if none is named), restoring the original objects."""
        with self._lock:
            for fix in reversed(self._select(names)):
                records = self._installed.pop(fix.name, None)
                if records is not None:
                    patching.uninstall(records)
                    if self._source_edits.pop(fix.name, None):
                        self._install_source_edits()
                    self._inactive[fix.name] = "deactivated"

    def _install_source_edits(self) -> None:
        """Installs each edited method anew, with the edits of every applied fix in order.

        Raises:
            TargetChanged: the edits of two fixes do not apply one after the other
                (nothing is installed for that method then).
        """
        methods: dict[tuple[int, str], list[SourceEdits]] = {}
        for name in self._fixes:
            for edit in self._source_edits.get(name, ()):
                methods.setdefault((id(edit.owner), edit.name), []).append(edit)
        replacements = [patching.compose_source_edits(e) for e in methods.values()]
        patching.uninstall(self._edited)
        self._edited = []
        self._edited = patching.install(self._wrap_methods(replacements))

    def applied(self) -> list[str]:
        with self._lock:
            return [name for name in self._fixes if name in self._installed]

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Runs a block on stock TorchRL.

        Every applied fix is removed for the duration of the block and applied again
        on exit. Objects built inside the block (replay buffers, samplers) stay stock
        objects afterwards: patched methods hand them to the original code.
        """
        with self._lock:
            names = self.applied()
            self.deactivate(*names)
            try:
                marks = []
                for path in dict.fromkeys(p for n in names for p in self._fixes[n].stock_classes):
                    cls = patching.resolve_path(path)
                    marks.append(Replacement(cls, "__init__", _marking_init(cls.__init__)))
                hooks = patching.install(marks)
            except BaseException:
                if names:
                    self.activate(*names)
                raise
        try:
            yield
        finally:
            with self._lock:
                patching.uninstall(hooks)
                if names:
                    self.activate(*names)

    def status(self) -> StatusReport:
        """The state of every fix, with the reason when it is not applied."""
        with self._lock:
            rows = []
            for name, fix in self._fixes.items():
                if name in self._installed:
                    state, reason = "applied", ""
                elif name in self._skipped:
                    state, reason = "skipped", self._skipped[name]
                else:
                    state, reason = "inactive", self._inactive.get(name, "not requested")
                rows.append(
                    FixStatus(
                        name=name,
                        summary=fix.summary,
                        upstream_issue=fix.upstream_issue,
                        torchrl_versions=format_range(fix.torchrl_versions),
                        state=state,
                        reason=reason,
                        fallbacks=fix.all_fallbacks(),
                        limits=fix.limits,
                    )
                )
        return StatusReport(
            rows,
            torchrl=str(installed_version("torchrl") or "unknown"),
            tensordict=str(installed_version("tensordict") or "unknown"),
            notes=self.notes,
        )
