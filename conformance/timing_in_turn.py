"""Stock and patched timed in turn inside one pytest-benchmark benchmark."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

VARIANTS = ("stock", "patched")


@dataclass(frozen=True)
class Floor:
    """A floor's turn in :func:`time_in_turn`: ``timed()``, after ``setup()`` (untimed).

    A floor given as a bare callable is a :class:`Floor` without a setup.
    """

    timed: Callable[[], None]
    setup: Callable[[], None] | None = None


def time_in_turn(
    benchmark,
    timed: Callable[[str], None],
    *,
    rounds: int,
    setup: Callable[[str], None] | None = None,
    warmup_rounds: int = 1,
    floors: Mapping[str, Floor | Callable[[], None]] | None = None,
) -> dict[str, float]:
    """Times ``timed(variant)`` for stock and patched in turn, and records both medians.

    Each round runs ``setup(variant)`` (untimed) then ``timed(variant)`` for each
    variant, in an order that alternates from round to round, so that a load that
    comes and goes on the machine hits both alike. With floors, stock opens every
    round and the others (patched, then the floors) follow it in an order that
    rotates from round to round, one way for as many rounds as there are of them,
    then the other way: each of them comes right after stock (whose pass over a
    large storage leaves the caches cold) in as many rounds as the others, and
    right after each of its neighbours as often as right before it (a turn leaves
    warm the code it shares with the next), so that patched and its floors are
    timed alike. The first ``warmup_rounds`` are
    not counted. ``benchmark.extra_info`` gets ``variant`` ``"pair"``,
    ``stock_median_s``, ``patched_median_s`` and ``speedup`` (stock / patched);
    pytest-benchmark's own statistics time whole rounds (both variants, the floors
    and the setups).

    Args:
        benchmark: the pytest-benchmark fixture.
        timed: the operation, given the variant's name.
        rounds: how many rounds are counted.
        setup: what to run, untimed, before each ``timed(variant)``.
        warmup_rounds: how many rounds run first, not counted.
        floors: name -> a reference the operation is compared with (e.g. ``"floor"``: a
            RandomSampler sample of the same batch), a :class:`Floor` or a callable.
            Each takes its turn in each round, after stock, in the rotation
            described above (patched, then the floors in the order given, at
            round 0, and the reverse of that order at round ``len(floors) + 1``);
            its median goes in ``{name}_median_s``. A floor's
            ``setup`` runs untimed just before its turn.

    Returns:
        variant (and floor name) -> median seconds.

    Raises:
        ValueError: when a floor is named like a variant.
    """
    floors = {
        name: floor if isinstance(floor, Floor) else Floor(floor)
        for name, floor in (floors or {}).items()
    }
    clashing = sorted(set(floors) & set(VARIANTS))
    if clashing:
        raise ValueError(f"floors cannot be named like a variant: {clashing}")
    turns = (*VARIANTS, *floors)
    times: dict[str, list[float]] = {name: [] for name in turns}
    played = [0]

    def one_round():
        if floors:
            after_stock = turns[1:]
            cycle, shift = divmod(played[0], len(after_stock))
            if cycle % 2:
                # the other way round: a turn that warms the caches for the next one
                # does so as often as it comes after it
                after_stock = after_stock[::-1]
            order = (turns[0], *after_stock[shift:], *after_stock[:shift])
        else:
            order = turns if played[0] % 2 == 0 else turns[::-1]
        counted = played[0] >= warmup_rounds
        played[0] += 1
        for name in order:
            floor = floors.get(name)
            if floor is None and setup is not None:
                setup(name)
            elif floor is not None and floor.setup is not None:
                floor.setup()
            start = time.perf_counter()
            timed(name) if floor is None else floor.timed()
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
