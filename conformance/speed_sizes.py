"""The buffer sizes of the slice-sampling speed benchmarks, and what each scale costs.

``conformance/test_speed_slice_sampling.py`` times the cases listed here; the
``--slice-scale`` option (``ci``, ``report``, ``full``) picks them, each scale adding
rows to the one before. This module needs neither torch nor TorchRL, so the memory
a scale needs (:func:`memory_for_scale`) and the rows it adds
(:func:`scenarios_added`) can be stated before anything is imported or filled:
``python -m devtools bench`` states them, and docs/benchmarks.md quotes them.

Examples:
    >>> from conformance.speed_sizes import GiB, memory_for_scale, scenarios_added
    >>> round(memory_for_scale("full") / GiB)
    17
    >>> scenarios_added("full")[0]
    'seed_table episode 346M/600M'
"""
from __future__ import annotations

from dataclasses import dataclass

from conformance.timing_in_turn import VARIANTS

SCALES = ("ci", "report", "full")
GiB = 1 << 30

# Bytes one row takes in the storage, per layout and trajectory key.
ROW_BYTES = {
    ("seed", "episode"): 4 + 8,
    ("seed", "done"): 4 + 1,
    ("seed", "unnamed"): 4 + 8 + 1,
    ("online", "episode"): 16 + 8 + 1 + 1,
    ("online", "done"): 16 + 8 + 1 + 1,
    ("sweep", "done"): 16 + 8 + 1 + 1,
    ("tdmpc2", "episode"): 4 + 8,
    ("family", "done"): 4 + 1,
}
TDMPC2_EPISODE_LEN = 500
# The layouts whose scenarios name their episodes' length, which is theirs to set.
EPISODES_NAMED = ("sweep", "family")


@dataclass(frozen=True)
class Case:
    """One buffer configuration: layout, trajectory key, sizes, how many timed rounds."""

    layout: str
    key: str
    stored: int
    capacity: int
    rounds: int
    scale: str = "ci"
    episode_len: int = 1_000
    mode: str = "room"

    @property
    def id(self) -> str:
        mode = "" if self.mode in ("room", "sweep") else f"-{self.mode}"
        if self.layout in EPISODES_NAMED:
            mode += f"-episode{self.episode_len}"
        return f"{self.key}-{size(self.stored)}-{size(self.capacity)}{mode}"

    def scenario(self, operation: str) -> str:
        scenario = f"{operation} {self.key} {size(self.stored)}/{size(self.capacity)}"
        if self.layout in EPISODES_NAMED:
            scenario += f", {self.episode_len}-step episodes"
        return scenario

    def memory_needed(self, buffers: int = 1) -> int:
        """``buffers`` storages of the whole capacity, a stock boundary pass over the
        stored rows, and slack."""
        return buffers * ROW_BYTES[self.layout, self.key] * self.capacity + 8 * self.stored + GiB


def size(n: int) -> str:
    """``n`` rows in millions, as the scenario names write it (``1.2M``)."""
    return f"{n / 1e6:g}M"


KEYS = ("episode", "done")

SEED_TABLE = [
    *(Case("seed", k, 1_000_000, 1_200_000, rounds=30) for k in KEYS),
    *(Case("seed", k, 1_000_000, 120_000_000, rounds=30) for k in KEYS),
    *(Case("seed", k, 5_000_000, 6_000_000, rounds=30, scale="report") for k in KEYS),
    *(Case("seed", k, 5_000_000, 600_000_000, rounds=10, scale="report") for k in KEYS),
    *(Case("seed", k, 50_000_000, 60_000_000, rounds=30, scale="report") for k in KEYS),
    *(Case("seed", k, 346_000_000, 600_000_000, rounds=5, scale="full") for k in KEYS),
]
ONLINE = [
    *(Case("online", k, 2_000_000, 3_000_000, rounds=40) for k in KEYS),
    *(Case("online", k, 40_000_000, 60_000_000, rounds=9, scale="report") for k in KEYS),
]
TDMPC2 = [
    Case("tdmpc2", "episode", 1_000_000, 1_200_000, rounds=5, episode_len=TDMPC2_EPISODE_LEN),
    Case(
        "tdmpc2", "episode", 5_000_000, 6_000_000, rounds=3, scale="report",
        episode_len=TDMPC2_EPISODE_LEN,
    ),
]
# "unnamed": episode ids and done flags both stored, no key named: stock reads the
# ids, the fix the done flags once every write has shown that they agree.
COLD_KEYS = (*KEYS, "unnamed")
COLD = [
    *(Case("seed", k, 1_000_000, 1_200_000, rounds=9) for k in COLD_KEYS),
    *(Case("seed", k, 5_000_000, 6_000_000, rounds=5, scale="report") for k in COLD_KEYS),
    *(Case("seed", k, 346_000_000, 600_000_000, rounds=2, scale="full") for k in COLD_KEYS),
]
# The same stored size in ever shorter episodes: 100x more trajectories from the
# first to the last, for a sample right after a write (the online rows, 2,048 of
# them as 64 slices of 32, so that the shortest episodes hold a slice), beside its
# floors (a RandomSampler sample of the same batch from the same storage, and the
# gather of the sample's own rows).
SWEEP_EPISODE_LENS = (3_200, 320, 32)
SWEEP = [
    *(
        Case("sweep", "done", 2_000_000, 3_000_000, rounds=30, episode_len=n, mode="sweep")
        for n in SWEEP_EPISODE_LENS
    ),
    *(
        Case(
            "sweep", "done", 20_000_000, 30_000_000, rounds=15, scale="report",
            episode_len=n, mode="sweep",
        )
        for n in SWEEP_EPISODE_LENS
    ),
]
# The online sample after a write by a SliceSampler(use_gpu=True), beside its floors:
# that device (the CPU where there is no accelerator) is where stock finds the
# boundaries; they, and the samples, are on the storage's device either way.
USE_GPU = [
    Case("online", "done", 2_000_000, 3_000_000, rounds=30, mode="use_gpu"),
    Case("online", "done", 10_000_000, 15_000_000, rounds=15, scale="report", mode="use_gpu"),
]
# SliceSampler's siblings (the "family" layout: the seed table's rows, done flags, 64
# slices of 4), each case's mode naming its sampler, and the operation its row
# times, beside its floors: SliceSamplerWithoutReplacement (whose value cache is
# always on) on a static buffer, as it draws a new permutation of the trajectories
# whenever their number changes, as stock does; SliceSampler(span=True) and
# SliceSampler(strict_length=False) (no value cache), whose slices have several
# lengths, right after a write. Episodes of 10 steps: 100k trajectories at 1M
# stored, 500k at 5M.
FAMILY_OPERATIONS = {
    "without_replacement": "without_replacement",
    "span": "span sample-after-write",
    "not_strict": "not_strict sample-after-write",
    "prioritized": "prioritized sample-after-write",
}
FAMILY_EPISODE_LEN = 10
FAMILY = [
    Case(
        "family", "done", stored, capacity, rounds=30, scale=scale,
        episode_len=FAMILY_EPISODE_LEN, mode=mode,
    )
    for stored, capacity, scale in ((1_000_000, 1_200_000, "ci"), (5_000_000, 6_000_000, "report"))
    for mode in FAMILY_OPERATIONS
    if mode != "prioritized"
] + [
    # PrioritizedSliceSampler where the C++ extension loads: a full 1M-row buffer (writes
    # wrap) of 1k and of 10k trajectories
    Case("family", "done", 1_000_000, 1_000_000, rounds=30, episode_len=episode_len, mode="prioritized")
    for episode_len in (1_000, 100)
]
EXTEND = [
    *(Case("online", k, 1_000_000, 1_500_000, rounds=200) for k in KEYS),
    *(Case("online", k, 1_000_000, 1_000_000, rounds=200, mode="wrap") for k in KEYS),
]

# The operations timed on each list's buffers, as the benchmarks name them.
OPERATIONS = {
    "seed_table": (SEED_TABLE, ("seed_table", "seed_table sample-after-write")),
    "online": (
        ONLINE,
        ("online step", "online sample-after-write", "online sample-without-write", "online extend"),
    ),
    "tdmpc2": (TDMPC2, ("tdmpc2 loop",)),
    "cold": (COLD, ("cold first sample",)),
    "extend": (EXTEND, ("extend",)),
    "sweep": (SWEEP, ("sweep sample-after-write",)),
    "use_gpu": (USE_GPU, ("use_gpu sample-after-write",)),
    **{
        mode: ([case for case in FAMILY if case.mode == mode], (operation,))
        for mode, operation in FAMILY_OPERATIONS.items()
    },
}


def cases_at(cases: list[Case], scale: str) -> list[Case]:
    """The cases of ``cases`` that run at ``scale``."""
    top = SCALES.index(scale)
    return [case for case in cases if SCALES.index(case.scale) <= top]


def memory_for_scale(scale: str) -> int:
    """The most memory one benchmark of ``scale`` holds at once, in bytes.

    The benchmarks of :data:`SEED_TABLE`, :data:`ONLINE`, :data:`TDMPC2`,
    :data:`EXTEND`, :data:`SWEEP`, :data:`USE_GPU` and :data:`FAMILY` keep both variants'
    buffers side by side;
    a ``cold first sample`` builds one buffer at a time.
    """
    side_by_side = [
        case.memory_needed(len(VARIANTS))
        for cases in (SEED_TABLE, ONLINE, TDMPC2, EXTEND, SWEEP, USE_GPU, FAMILY)
        for case in cases_at(cases, scale)
    ]
    one_at_a_time = [case.memory_needed() for case in cases_at(COLD, scale)]
    return max(side_by_side + one_at_a_time)


def _added(scale: str) -> list[tuple[str, str, Case]]:
    below = SCALES[SCALES.index(scale) - 1] if SCALES.index(scale) else None
    found = []
    for group, (cases, operations) in OPERATIONS.items():
        for case in cases_at(cases, scale):
            if below is not None and case in cases_at(cases, below):
                continue
            for operation in operations:
                name = f"extend {case.mode}" if operation == "extend" else operation
                found.append((case.scenario(name), group, case))
    return found


def scenarios_added(scale: str) -> list[str]:
    """The scenarios (rows of the stock / patched table) that ``scale`` adds to the scale before it."""
    return [scenario for scenario, _, _ in _added(scale)]


def fills_added(scale: str) -> tuple[int, int]:
    """``(buffers filled, rows each)`` that ``scale`` adds: the bulk of its run time.

    A benchmark of a pair fills each variant's buffer once; a ``cold first sample``
    fills a fresh buffer of each variant every round.
    """
    fills = []
    for group, case in {(group, case) for _, group, case in _added(scale)}:
        per_variant = case.rounds if group == "cold" else 1
        fills += [case.stored] * (per_variant * len(VARIANTS))
    return len(fills), max(fills, default=0)
