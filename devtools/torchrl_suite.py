"""Pytest plugin that runs a test suite on TorchRL with ``torchrl_fixes`` applied first.

TorchRL's own replay-buffer tests (``test/rb`` in pytorch/rl) serve as an oracle for the
monkeypatching, the way gevent runs CPython's test suite under its monkey-patching: the
suite runs once on stock TorchRL and once with this plugin, and no test that passes on
stock may fail with the fixes.

Loaded with ``-p devtools.torchrl_suite``, the plugin imports ``torchrl_fixes`` while
pytest parses its options, before any ``conftest.py`` or test module imports TorchRL.
The pytest header gets one line with the fixes applied and skipped and where TorchRL was
imported from (printed at session start under ``-q`` too, which hides the header), and
``--junitxml`` reports carry it as the test-suite property ``torchrl_fixes``. A session in which no fix applied (``TORCHRL_FIXES=0``, a TorchRL none
of the fixes supports) stops with a usage error, so a run that silently tested stock
TorchRL cannot pass for a patched one.

The oracle, from a checkout of pytorch/rl's tests that matches the installed TorchRL
(run inside the checkout's ``test/`` folder, so that ``import torchrl`` finds the
installed package and not a source tree)::

    cd <pytorch/rl checkout>/test
    python -m pytest rb -p no:cacheprovider -q -rfE --junitxml=stock.xml
    PYTHONPATH=<this repository> python -m pytest rb -p no:cacheprovider -q -rfE \\
        -p devtools.torchrl_suite --junitxml=patched.xml
    python <this repository>/devtools/compare_junit.py stock.xml patched.xml

``devtools/run_torchrl_suite.sh <test dir> <venv> <results dir>`` runs those three.
"""
from __future__ import annotations

import sys

# Whether something imported TorchRL before the fixes did; recorded for the header.
TORCHRL_IMPORTED_BEFORE_FIXES = "torchrl" in sys.modules

import pytest  # noqa: E402
import torchrl  # noqa: E402

import torchrl_fixes  # noqa: E402

HEADER_PREFIX = "torchrl_fixes oracle:"


def fixes_summary() -> tuple[list[str], list[str], str]:
    """The applied fixes, the others with their state and reason, and the header line."""
    report = torchrl_fixes.status()
    applied = [row.name for row in report if row.applied]
    others = [f"{row.name} ({row.state}: {row.reason or '-'})" for row in report if not row.applied]
    line = (
        f"{HEADER_PREFIX} applied {len(applied)}/{len(report)} "
        f"[{', '.join(applied) or 'none'}]; not applied [{'; '.join(others) or 'none'}]; "
        f"torchrl {report.torchrl} from {torchrl.__file__}; "
        f"torchrl_fixes from {torchrl_fixes.__file__}; "
        f"torchrl imported before the fixes: {'yes' if TORCHRL_IMPORTED_BEFORE_FIXES else 'no'}"
    )
    return applied, others, line


def pytest_configure(config: pytest.Config) -> None:
    applied, others, _ = fixes_summary()
    if not applied:
        raise pytest.UsageError(
            "devtools.torchrl_suite: no torchrl_fixes fix is applied, so this session "
            f"would test stock TorchRL ({'; '.join(others)})"
        )


def pytest_report_header(config: pytest.Config) -> str:
    return fixes_summary()[2]


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    line = fixes_summary()[2]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and config.get_verbosity() < 0:
        reporter.write_line(line)
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest without it: the header still says it
        return
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        xml.add_global_property("torchrl_fixes", line)
