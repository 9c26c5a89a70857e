"""The TorchRL builds this repository is tested against: one place for every pin.

``noxfile.py`` builds its sessions from these, and the upstream patch series in
``patches/`` are each written against one of them.
"""
from __future__ import annotations

# TorchRL release -> the tensordict release it is tested with (the newest its pin admits).
RELEASES = {
    "0.8.1": "0.8.3",  # TD-MPC2's pin
    "0.9.2": "0.9.1",
    "0.10.1": "0.10.0",
    "0.11.1": "0.11.0",
    "0.12.0": "0.12.4",
    "0.13.3": "0.13.0",
    "0.14.1": "0.14.3",
}
NEWEST = "0.14.1"
# The release TD-MPC2 pins (nox -s benchmark_tdmpc2 runs its buffer there).
TDMPC2 = "0.8.1"
# The next release as it stands: one dated build of TorchRL main and the tensordict
# build it was made with. Moving to a newer build is this one line.
NIGHTLY = ("torchrl-nightly==2026.10.27", "tensordict-nightly==2026.10.26")
# The version the nightly build reports (its date).
NIGHTLY_VERSION = NIGHTLY[0].partition("==")[2]
# Every TorchRL the suite runs on: the releases, then "nightly".
MATRIX = [*RELEASES, "nightly"]


def torchrl_requirements(torchrl: str) -> list[str]:
    """The pip requirements of ``torchrl`` (a release of :data:`RELEASES`, or ``"nightly"``)."""
    if torchrl == "nightly":
        return list(NIGHTLY)
    return [f"torchrl=={torchrl}", f"tensordict=={RELEASES[torchrl]}"]
