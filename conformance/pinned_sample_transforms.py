"""The transforms the pinning suite and ``python -m devtools compare`` sample through.

Not a test module: :mod:`conformance.test_pinned_sample_output` and
:mod:`devtools.pinned_sample_report` both import these, so the report shows the
buffers the suite checks.
"""
from __future__ import annotations

from tensordict import TensorDict


class KeepObservation:
    """Builds a new TensorDict: its device is None."""

    def __call__(self, td):
        return TensorDict({"obs": td["obs"]}, batch_size=td.batch_size)


class ScaleObservation:
    """Writes into the sampled TensorDict: its device is kept."""

    def __call__(self, td):
        td["obs2"] = td["obs"] * 2
        return td
