"""pytest plugin of ``python -m devtools bench``: one line per benchmark as it lands.

Loaded with ``-p devtools.bench_progress``. pytest's own output (and pytest-benchmark's
tables) go wherever the run sends standard output; this plugin writes its lines to
the standard error the process started with, each prefixed with :data:`MARK`, so the
driver can tell them from anything else written there:

- once, the number of benchmarks collected;
- before the first benchmark of each test function, what it measures (the first
  sentence of its docstring);
- for each benchmark, ``[i/n] scenario: stock ..., patched ..., ratio`` as it lands
  (or its median, where it times one build; or why it was skipped or failed).
"""
from __future__ import annotations

import os

import pytest

MARK = "\x1e"
# Duplicated at import, before pytest captures anything.
_ERR = os.dup(2)


def emit(text: str) -> None:
    """Writes one marked line to the driver."""
    os.write(_ERR, f"{MARK}{text}\n".encode())


def _seconds(value: float | None) -> str:
    from conformance.speed_report import format_seconds

    return format_seconds(value)


def what_it_measures(item) -> str:
    """The first sentence of the test function's docstring, on one line, without markup."""
    doc = (getattr(item, "function", None) and item.function.__doc__) or ""
    text = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    return text.split(". ")[0].rstrip(".")


def landed(info: dict, stats) -> str:
    """What one benchmark measured, from its ``extra_info`` and statistics."""
    if info.get("variant") == "pair" and "stock_median_s" in info:
        stock, patched = info["stock_median_s"], info.get("patched_median_s")
        ratio = f"{stock / patched:.2f}x" if patched else "-"
        return f"stock {_seconds(stock)}, patched {_seconds(patched)}, {ratio}"
    median = getattr(stats, "median", None) if stats is not None else None
    text = f"median {_seconds(median)}"
    if "slice_over_random" in info:
        text += f", slice/random {info['slice_over_random']:.2f}x"
    return text


class Progress:
    def __init__(self):
        self.total = 0
        self.done = 0
        self.skipped = 0
        self.described: set[str] = set()

    def pytest_collection_finish(self, session):
        self.total = len(session.items)
        emit(f"{self.total} benchmarks to run")

    def _name(self, item) -> str:
        return item.name

    def _count(self) -> str:
        self.done += 1
        return f"[{self.done}/{self.total}]"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        function = getattr(item, "originalname", item.name)
        if call.when == "setup" and function not in self.described:
            self.described.add(function)
            emit(f"{function}: {what_it_measures(item)}")
        if report.skipped and call.when in ("setup", "call"):
            self.skipped += 1
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            emit(f"{self._count()} {self._name(item)}: skipped ({reason.removeprefix('Skipped: ')})")
        elif report.failed:
            emit(f"{self._count()} {self._name(item)}: FAILED in {call.when}")
        elif call.when == "call":
            fixture = (item.funcargs or {}).get("benchmark")
            info = dict(getattr(fixture, "extra_info", {}) or {})
            stats = getattr(getattr(fixture, "stats", None), "stats", None)
            name = info.get("scenario") or " ".join(
                str(info[k]) for k in ("variant", "sampler") if k in info
            ) or self._name(item)
            emit(f"{self._count()} {name}: {landed(info, stats)}")


def pytest_configure(config):
    config.pluginmanager.register(Progress(), "devtools-bench-progress")
