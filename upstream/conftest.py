"""Runs the upstream series' own test files (``upstream/``) against this package's runtime.

The files under ``upstream/`` are the ones the pull requests in ``patches/main/`` add to
pytorch/rl (TorchRL main: ``nox -s upstream`` runs them on the pinned nightly), at the same paths (``test/rb/...``, ``benchmarks/...``). They import TorchRL
only; here the fixes are applied first, so they test the runtime fix. With
``TORCHRL_FIXES=0`` they run against stock TorchRL, where the behaviour tests fail.
"""
import torchrl_fixes  # noqa: F401


def pytest_configure(config):
    # markers pytorch/rl registers in its pytest.ini
    config.addinivalue_line("markers", "gpu: mark test as requiring a GPU (CUDA device)")
    config.addinivalue_line("markers", "slow: the largest sizes of upstream/benchmarks")
