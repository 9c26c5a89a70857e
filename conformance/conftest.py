"""Fixtures shared by the conformance suite."""
from __future__ import annotations

import os

import pytest
import torch

import torchrl_fixes
from conformance import reference
from conformance.fake_pinning import forget_pin_memory_answer, install_fake_pinning
from conformance.speed_sizes import GiB, memory_for_scale


def pytest_report_header(config):
    header = [str(torchrl_fixes.status()).splitlines()[0]]
    if reference.UPSTREAM:
        import torchrl

        header.append(
            f"upstream: patched TorchRL source at {torchrl.__file__}, stock compiled from "
            f"{os.environ[reference.STOCK_SOURCE_ENV]}"
        )
    return header


def _has_cuda() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not _has_cuda():
            item.add_marker(skip_cuda)


@pytest.fixture(autouse=True)
def activation_unchanged():
    """Fails a test that leaves fixes applied or removed behind it."""
    before = [(row.name, row.state) for row in torchrl_fixes.status()]
    yield
    after = [(row.name, row.state) for row in torchrl_fixes.status()]
    assert after == before, "the test changed which fixes are applied"


@pytest.fixture(scope="session")
def torchrl_extension():
    """Skips the test where TorchRL's C++ extension (segment trees) does not load.

    The probe builds a stock ``PrioritizedSampler``: if stock TorchRL itself fails
    here, the environment cannot run the test, which is not a failure of the fixes.
    With ``TORCHRL_FIXES_REQUIRE_EXTENSION=1`` (the environment meant to cover the
    prioritized buffers) the test fails instead.
    """
    reference.skip_without_extension()


@pytest.fixture
def fake_accelerator(monkeypatch):
    """An accelerator is 'available', and pinning goes through :class:`FakePinning`."""
    if _has_cuda():
        pytest.skip("a real accelerator is present: the cuda-marked tests cover this")
    yield install_fake_pinning(monkeypatch)
    forget_pin_memory_answer()


@pytest.fixture
def no_accelerator():
    """Skips where an accelerator exists: the test is about machines without one."""
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is available")


def pytest_addoption(parser):
    group = parser.getgroup("slice sampling speed (conformance/test_speed_slice_sampling.py)")
    group.addoption(
        "--slice-scale",
        choices=("ci", "report", "full"),
        default="ci",
        help=(
            "Buffer sizes of the slice-sampling benchmarks (marker 'speed'). Each scale adds "
            "rows to the one before. ci (default): 1M-2M transitions, the whole file in about "
            "3 minutes on 2 CPU cores. report: adds the issue's 5M/6M and 5M/600M seed-table "
            "rows and the 40M online loop. full: adds 346M stored / 600M capacity, about "
            f"{memory_for_scale('full') / GiB:.0f} GiB of available memory at once (the "
            f"report rows: {memory_for_scale('report') / GiB:.0f} GiB), and a long run (each "
            "346M-row buffer takes about a minute to fill). Rows that do not fit in the "
            "available memory are skipped, saying how much they need; "
            "conformance/speed_sizes.py lists the rows and computes these figures."
        ),
    )
    group.addoption(
        "--slice-threads",
        type=int,
        default=None,
        help=(
            "torch.set_num_threads for the slice-sampling benchmarks (default: leave torch's "
            "setting). On a shared machine, 1 gives steadier timings."
        ),
    )
    group.addoption(
        "--slice-device",
        default="cpu",
        help=(
            "Device of the storages of the online, sweep and use_gpu slice-sampling "
            "benchmarks (default: cpu), e.g. cuda: each timed sample then waits for the device."
        ),
    )


@pytest.fixture(scope="session")
def slice_scale(request) -> str:
    """The ``--slice-scale`` the slice-sampling benchmarks run at."""
    return request.config.getoption("--slice-scale")


@pytest.fixture(scope="module")
def slice_threads(request):
    """Applies ``--slice-threads`` for a module, and puts torch's setting back after it."""
    threads = request.config.getoption("--slice-threads")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    yield torch.get_num_threads()
    torch.set_num_threads(before)
