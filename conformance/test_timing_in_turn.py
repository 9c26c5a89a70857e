"""Stock, patched and their floors timed in turn: order, setups, medians, ``extra_info``."""
from __future__ import annotations

import pytest

from conformance import timing_in_turn
from conformance.timing_in_turn import Floor, time_in_turn


class FakeBenchmark:
    """What :func:`time_in_turn` uses of pytest-benchmark's fixture."""

    def __init__(self):
        self.extra_info = {}

    def pedantic(self, target, rounds, warmup_rounds):
        for _ in range(warmup_rounds + rounds):
            target()


class Clock:
    """A ``time.perf_counter`` that moves only when an operation says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(timing_in_turn.time, "perf_counter", clock)
    return clock


def test_floors_take_turns_and_their_setups_are_untimed(clock):
    ran = []
    # seconds each turn takes, per round counted (the warm-up round takes 100 s)
    took = {"stock": [8.0, 9.0, 7.0], "patched": [2.0, 1.0, 3.0],
            "floor": [0.5, 0.5, 0.7], "gather_floor": [0.2, 0.4, 0.3]}

    def turn(name):
        ran.append(name)
        counted = sum(1 for n in ran if n == name) - 2
        clock.now += 100.0 if counted < 0 else took[name][counted]

    def setup(name):
        ran.append(f"setup {name}")
        clock.now += 1_000.0

    def gather_setup():
        ran.append("setup gather_floor")
        clock.now += 1_000.0

    medians = time_in_turn(
        FakeBenchmark(),
        turn,
        rounds=3,
        setup=setup,
        floors={
            "floor": lambda: turn("floor"),
            "gather_floor": Floor(timed=lambda: turn("gather_floor"), setup=gather_setup),
        },
    )
    # stock opens each round; patched and the floors follow it in turn, the other
    # way round once each has come first
    patched = ["setup patched", "patched"]
    gather_floor = ["setup gather_floor", "gather_floor"]
    stock = ["setup stock", "stock"]
    assert ran == [
        *stock, *patched, "floor", *gather_floor,
        *stock, "floor", *gather_floor, *patched,
        *stock, *gather_floor, *patched, "floor",
        *stock, *gather_floor, "floor", *patched,
    ]
    assert medians == pytest.approx(
        {"stock": 8.0, "patched": 2.0, "floor": 0.5, "gather_floor": 0.3}
    )


def test_each_turn_follows_its_neighbours_as_often_as_it_precedes_them(clock):
    ran = []

    def turn(name):
        ran.append(name)
        clock.now += 1.0

    floors = {name: (lambda name=name: turn(name)) for name in ("a", "b", "c")}
    # two cycles of the four turns after stock: one each way
    time_in_turn(FakeBenchmark(), turn, rounds=8, warmup_rounds=0, floors=floors)
    rounds = [ran[i + 1 : i + 5] for i in range(0, len(ran), 5)]
    assert all(ran[i] == "stock" for i in range(0, len(ran), 5))
    # each turn comes right after stock twice
    assert sorted(order[0] for order in rounds) == sorted(["patched", "a", "b", "c"] * 2)
    followed = {}
    for order in rounds:
        for before, after in zip(order, order[1:]):
            followed[before, after] = followed.get((before, after), 0) + 1
    assert followed[("c", "patched")] == 3
    assert all(count == followed.get((after, before)) for (before, after), count in followed.items())


def test_extra_info_carries_each_floor_median(clock):
    benchmark = FakeBenchmark()
    took = {"stock": 4.0, "patched": 1.0, "floor": 0.5, "gather_floor": 0.25}

    def turn(name):
        clock.now += took[name]

    time_in_turn(
        benchmark,
        turn,
        rounds=2,
        floors={"floor": lambda: turn("floor"), "gather_floor": lambda: turn("gather_floor")},
    )
    assert benchmark.extra_info == {
        "variant": "pair",
        "stock_median_s": 4.0,
        "patched_median_s": 1.0,
        "floor_median_s": 0.5,
        "gather_floor_median_s": 0.25,
        "speedup": 4.0,
    }


def test_without_floors_only_the_variants_are_timed(clock):
    benchmark = FakeBenchmark()
    ran = []

    def turn(name):
        ran.append(name)
        clock.now += 1.0

    time_in_turn(benchmark, turn, rounds=2, warmup_rounds=0)
    assert ran == ["stock", "patched", "patched", "stock"]
    assert set(benchmark.extra_info) == {
        "variant", "stock_median_s", "patched_median_s", "speedup"
    }


def test_a_floor_named_like_a_variant_is_refused():
    with pytest.raises(ValueError, match="named like a variant: \\['patched'\\]"):
        time_in_turn(FakeBenchmark(), lambda name: None, rounds=1, floors={"patched": print})
