"""Stock and patched timed in turn inside one pytest-benchmark benchmark."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

VARIANTS = ("stock", "patched")


def time_in_turn(
    benchmark,
    timed: Callable[[str], None],
    *,
    rounds: int,
    setup: Callable[[str], None] | None = None,
    warmup_rounds: int = 1,
    floor: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Times ``timed(variant)`` for stock and patched in turn, and records both medians.

    Each round runs ``setup(variant)`` (untimed) then ``timed(variant)`` for each
    variant, in an order that alternates from round to round, so that a load that
    comes and goes on the machine hits both alike. The first ``warmup_rounds`` are
    not counted. ``benchmark.extra_info`` gets ``variant`` ``"pair"``,
    ``stock_median_s``, ``patched_median_s`` and ``speedup`` (stock / patched);
    pytest-benchmark's own statistics time whole rounds (both variants and the
    setups). ``floor``, where given (what the operation cannot beat, e.g. a
    RandomSampler sample of the same batch), takes its turn in each round after the
    variants, so that it too runs first every other round, and its median goes in
    ``floor_median_s``.

    Returns:
        variant (and ``"floor"``) -> median seconds.
    """
    turns = VARIANTS if floor is None else (*VARIANTS, "floor")
    times: dict[str, list[float]] = {name: [] for name in turns}
    played = [0]

    def one_round():
        order = turns if played[0] % 2 == 0 else turns[::-1]
        counted = played[0] >= warmup_rounds
        played[0] += 1
        for name in order:
            if name != "floor" and setup is not None:
                setup(name)
            start = time.perf_counter()
            floor() if name == "floor" else timed(name)
            elapsed = time.perf_counter() - start
            if counted:
                times[name].append(elapsed)

    benchmark.extra_info["variant"] = "pair"
    benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=warmup_rounds)
    medians = {variant: statistics.median(values) for variant, values in times.items() if values}
    benchmark.extra_info.update({f"{variant}_median_s": m for variant, m in medians.items()})
    if all(variant in medians for variant in VARIANTS):
        benchmark.extra_info["speedup"] = medians["stock"] / medians["patched"]
    return medians
