"""The stock / patched report built from a pytest-benchmark JSON: table, header, plot, checks."""
from __future__ import annotations

import json
from dataclasses import FrozenInstanceError

import pytest

from conformance.speed_report import (
    Row,
    _plotted_points,
    format_seconds,
    main,
    markdown_table,
    medians,
    plot,
    regressions,
    rows,
    run_header,
    write_markdown,
)


def _bench(scenario, variant, median):
    return {
        "group": scenario,
        "name": f"test_x[{variant}]",
        "extra_info": {"scenario": scenario, "variant": variant, "key": "done"},
        "stats": {"median": median, "min": median / 2, "max": median * 2},
    }


SYNTHETIC = {
    "machine_info": {},
    "benchmarks": [
        _bench("seed_table done 1M/1.2M", "stock", 0.024),
        _bench("seed_table done 1M/1.2M", "patched", 0.0003),
        _bench("extend room done 1M/1.5M", "patched", 0.00011),
        _bench("extend room done 1M/1.5M", "stock", 0.0001),
        _bench("online step done 2M/3M", "stock", 1.5),
        {"name": "unrelated", "extra_info": {}, "stats": {"median": 1.0}},
    ],
}


def test_medians_pair_variants_by_scenario():
    assert medians(SYNTHETIC) == {
        "seed_table done 1M/1.2M": {"stock": 0.024, "patched": 0.0003},
        "extend room done 1M/1.5M": {"patched": 0.00011, "stock": 0.0001},
        "online step done 2M/3M": {"stock": 1.5},
    }


def test_markdown_table_from_a_json_file(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(SYNTHETIC), encoding="utf-8")
    expected = "\n".join(
        [
            "| scenario | stock median | patched median | speed-up (stock/patched) "
            "| RandomSampler floor | patched/floor | gather floor | patched/gather floor |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            "| seed_table done 1M/1.2M | 24 ms | 300 µs | 80.00x | - | - | - | - |",
            "| extend room done 1M/1.5M | 100 µs | 110 µs | 0.91x | - | - | - | - |",
            "| online step done 2M/3M | 1.5 s | - | - | - | - | - | - |",
        ]
    )
    assert markdown_table(path) == expected
    assert markdown_table(str(path)) == expected
    assert main([str(path)]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_a_run_with_benchmarks_disabled_gives_an_empty_table():
    disabled = {"benchmarks": [{"extra_info": {"scenario": "s", "variant": "stock"}}]}
    assert markdown_table(disabled).count("\n") == 1


def test_format_seconds():
    assert format_seconds(None) == "-"
    assert format_seconds(2.345) == "2.35 s"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(4.2e-5) == "42 µs"
    assert format_seconds(5e-8) == "50 ns"
    assert format_seconds(0.0009996) == "1 ms"
    assert format_seconds(0.9996) == "1 s"


def test_a_pair_benchmark_carries_both_medians():
    pair = _bench("extend room done 1M/1.5M interleaved", "pair", 0.0009)
    pair["extra_info"].update(stock_median_s=0.0004, patched_median_s=0.0005)
    assert medians({"benchmarks": [pair]}) == {
        "extend room done 1M/1.5M interleaved": {"stock": 0.0004, "patched": 0.0005}
    }
    assert "| extend room done 1M/1.5M interleaved | 400 µs | 500 µs | 0.80x |" in markdown_table(
        {"benchmarks": [pair]}
    )


# --- rows, header, files, plot, regressions, command line ----------------------------


def _pair(operation, key, stored, capacity, stock, patched, **extra):
    """A ``pair`` benchmark as the slice-sampling benchmarks write it."""
    scenario = f"{operation} {key} {stored}/{capacity}"
    info = {
        "scenario": scenario,
        "variant": "pair",
        "operation": operation,
        "key": key,
        "stored": stored,
        "capacity": capacity,
        "torchrl": "0.11.0",
        "stock_median_s": stock,
        "patched_median_s": patched,
        **extra,
    }
    # the benchmark's own statistics time the pair, not either build
    pair_median = stock + patched
    return {
        "group": scenario,
        "name": f"test_x[{scenario}]",
        "extra_info": info,
        "stats": {"median": pair_median},
    }


def _run(*benchmarks, **top):
    return {
        "machine_info": {
            "node": "bench-host",
            "processor": "x86_64",
            "machine": "x86_64",
            "python_version": "3.12.3",
            "cpu": {"brand_raw": "AMD EPYC 9654 96-Core Processor", "count": 16},
        },
        "datetime": "2026-11-23T09:15:42.123456+00:00",
        "commit_info": {"id": "2835043"},
        "benchmarks": list(benchmarks),
        **top,
    }


PAIRS = _run(
    _pair("seed_table", "episode", 1_000_000, 1_200_000, 0.024, 0.0003, torch="2.13.0"),
    _pair("seed_table", "episode", 1_000_000, 1_500_000, 0.030, 0.0004),
    _pair("seed_table", "episode", 10_000_000, 12_000_000, 0.25, 0.0005),
    _pair("seed_table", "done", 1_000_000, 1_200_000, 0.020, 0.0002),
    _pair("online sample-after-write", "episode", 1_000_000, 1_500_000, 0.016, 0.002),
    _pair("online sample-after-write", "episode", 10_000_000, 15_000_000, 0.16, 0.004),
    _pair("online extend", "episode", 1_000_000, 1_500_000, 0.0001, 0.0001),
    {"name": "unrelated", "extra_info": {}, "stats": {"median": 1.0}},
    {"name": "disabled", "extra_info": {"scenario": "s", "variant": "pair"}},
)


def test_rows_carry_what_was_timed_and_both_medians():
    table = rows(PAIRS)
    assert [row.scenario for row in table] == [
        "seed_table episode 1000000/1200000",
        "seed_table episode 1000000/1500000",
        "seed_table episode 10000000/12000000",
        "seed_table done 1000000/1200000",
        "online sample-after-write episode 1000000/1500000",
        "online sample-after-write episode 10000000/15000000",
        "online extend episode 1000000/1500000",
    ]
    assert table[0] == Row(
        scenario="seed_table episode 1000000/1200000",
        operation="seed_table",
        key="episode",
        stored=1_000_000,
        capacity=1_200_000,
        stock=0.024,
        patched=0.0003,
    )
    assert table[0].speedup == 0.024 / 0.0003
    assert table[6].speedup == 1.0
    assert rows(_run()) == []


def test_rows_of_single_variant_benchmarks_without_description():
    table = rows(SYNTHETIC)
    assert table[0] == Row("seed_table done 1M/1.2M", None, "done", None, None, 0.024, 0.0003)
    assert table[2] == Row("online step done 2M/3M", None, "done", None, None, 1.5, None)
    assert table[2].speedup is None
    with pytest.raises(FrozenInstanceError):
        table[0].stock = 1.0


def test_a_pair_without_a_scenario_is_left_out():
    nameless = _pair("seed_table", "episode", 1, 2, 0.1, 0.1)
    del nameless["extra_info"]["scenario"]
    assert medians(_run(nameless)) == {}
    assert rows(_run(nameless)) == []


def test_run_header_names_date_machine_and_versions():
    assert run_header(PAIRS) == (
        "2026-11-23 · AMD EPYC 9654 96-Core Processor (16 CPUs) · Python 3.12.3"
        " · torch 2.13.0 · torchrl 0.11.0"
    )


def test_run_header_falls_back_on_what_the_json_has():
    report = {
        "machine_info": {"processor": "", "machine": "aarch64"},
        "datetime": "2026-01-05T23:59:59Z",
        "benchmarks": [],
    }
    assert run_header(report) == "2026-01-05 · aarch64"
    report["machine_info"] = {"processor": "arm", "cpu": {"count": 8}}
    assert run_header(report) == "2026-01-05 · arm (8 CPUs)"
    assert run_header({"benchmarks": []}) == ""


def test_write_markdown_puts_the_header_above_the_table(tmp_path):
    path = tmp_path / "speed.md"
    write_markdown(PAIRS, path)
    text = path.read_text(encoding="utf-8")
    assert text == f"{run_header(PAIRS)}\n\n{markdown_table(PAIRS)}\n"
    lines = text.splitlines()
    assert lines[0].startswith("2026-11-23 · AMD EPYC")
    assert lines[1] == ""
    assert lines[2].startswith("| scenario |")
    assert (
        "| seed_table episode 1000000/1200000 | 24 ms | 300 µs | 80.00x"
        " | - | - | - | - |" in lines
    )


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "speed.png"
    plot(PAIRS, path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_plot_keeps_the_smallest_capacity_per_stored_size():
    points = _plotted_points(rows(PAIRS), "seed_table", "stock")
    assert points == [(1_000_000, 0.024), (10_000_000, 0.25)]
    points = _plotted_points(rows(PAIRS), "online sample-after-write", "patched")
    assert points == [(1_000_000, 0.002), (10_000_000, 0.004)]


def test_plot_without_seed_table_or_online_rows_raises(tmp_path):
    path = tmp_path / "speed.png"
    only_other_rows = _run(
        _pair("online extend", "episode", 1_000_000, 1_500_000, 0.0001, 0.0001),
        _pair("seed_table", "done", 1_000_000, 1_200_000, 0.020, 0.0002),
    )
    with pytest.raises(ValueError, match="nothing to plot"):
        plot(only_other_rows, path)
    with pytest.raises(ValueError, match="nothing to plot"):
        plot(SYNTHETIC, path)
    assert not path.exists()


def _speedup_run(**speedups):
    return _run(
        *(
            _pair(operation, "episode", 1_000, 2_000, speedup, 1.0)
            for operation, speedup in speedups.items()
        )
    )


def test_regressions_at_the_margin_boundary():
    baseline = _speedup_run(a=10.0, b=10.0, c=10.0, gone=10.0)
    # margin 0.25: the floor is 10 / 1.25 = 8 exactly
    current = _speedup_run(a=8.0, b=7.99, c=30.0, new=0.5)
    assert regressions(current, baseline, margin=0.25) == [
        "b episode 1000/2000: speed-up 7.99x, baseline 10.00x, floor 8.00x"
    ]
    # the default margin, 0.3: floor 10 / 1.3 = 7.69...
    assert regressions(current, baseline) == []
    assert regressions(_speedup_run(a=7.69), baseline) == [
        "a episode 1000/2000: speed-up 7.69x, baseline 10.00x, floor 7.69x"
    ]
    assert regressions(_speedup_run(a=7.70), baseline) == []
    assert regressions(baseline, baseline, margin=0.0) == []
    with pytest.raises(ValueError, match="margin"):
        regressions(current, baseline, margin=-0.1)


def test_regressions_skip_scenarios_without_both_medians():
    assert regressions(SYNTHETIC, _speedup_run()) == []
    baseline = {"benchmarks": [_bench("online step done 2M/3M", "pair", 1.0)]}
    baseline["benchmarks"][0]["extra_info"].update(stock_median_s=9.0, patched_median_s=1.0)
    # the current run has no patched median for that scenario
    assert regressions(SYNTHETIC, baseline) == []


def _write(tmp_path, name, report):
    path = tmp_path / name
    path.write_text(json.dumps(report), encoding="utf-8")
    return str(path)


def test_cli_compare_exit_status(tmp_path, capsys):
    baseline = _write(tmp_path, "baseline.json", _speedup_run(a=10.0))
    fine = _write(tmp_path, "fine.json", _speedup_run(a=8.0))
    slower = _write(tmp_path, "slower.json", _speedup_run(a=7.0))

    assert main([fine, "--compare", baseline, "--margin", "0.25"]) == 0
    out, err = capsys.readouterr()
    assert out == markdown_table(fine) + "\n"
    assert err == f"no speed-up regression against {baseline} (margin 0.25)\n"

    assert main([slower, "--compare", baseline]) == 1
    out, err = capsys.readouterr()
    assert out == markdown_table(slower) + "\n"
    assert err == (
        f"speed-up regressions against {baseline} (margin 0.3):\n"
        "  a episode 1000/2000: speed-up 7.00x, baseline 10.00x, floor 7.69x\n"
    )


def test_cli_json_prints_the_rows(tmp_path, capsys):
    path = _write(tmp_path, "bench.json", PAIRS)
    assert main([path, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed) == 7
    assert printed[0] == {
        "scenario": "seed_table episode 1000000/1200000",
        "operation": "seed_table",
        "key": "episode",
        "stored": 1_000_000,
        "capacity": 1_200_000,
        "stock_s": 0.024,
        "patched_s": 0.0003,
        "speedup": 0.024 / 0.0003,
        "floor_s": None,
        "patched_over_floor": None,
        "gather_floor_s": None,
        "patched_over_gather_floor": None,
        "episode_len": None,
    }
    assert printed[6]["speedup"] == 1.0


def test_cli_writes_markdown_and_plot(tmp_path, capsys):
    path = _write(tmp_path, "bench.json", PAIRS)
    markdown, png = tmp_path / "out.md", tmp_path / "out.png"
    assert main([path, "--markdown", str(markdown), "--plot", str(png)]) == 0
    assert capsys.readouterr().out == markdown_table(PAIRS) + "\n"
    assert markdown.read_text(encoding="utf-8").startswith(run_header(PAIRS) + "\n\n| scenario")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_bad_usage_returns_2(capsys):
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err


def _sweep_bench(episode_len, stock, patched, floor, gather_floor=None):
    info = {
        "scenario": f"sweep sample-after-write done 2M/3M, {episode_len}-step episodes",
        "variant": "pair", "operation": "sweep sample-after-write", "key": "done",
        "stored": 2_000_000, "capacity": 3_000_000, "episode_len": episode_len,
        "stock_median_s": stock, "patched_median_s": patched, "floor_median_s": floor,
    }
    if gather_floor is not None:
        info["gather_floor_median_s"] = gather_floor
    return {"extra_info": info}


SWEEP = {"benchmarks": [
    _sweep_bench(1000, 0.02, 0.0012, 0.001), _sweep_bench(10, 0.03, 0.0015, 0.001)
]}
# The same rows with the gather of the sample's own rows timed too, but for the last.
SWEEP_WITH_GATHER = {"benchmarks": [
    _sweep_bench(1000, 0.02, 0.0012, 0.001, gather_floor=0.0004),
    _sweep_bench(100, 0.025, 0.0013, 0.001, gather_floor=0.00052),
    _sweep_bench(10, 0.03, 0.0015, 0.001),
]}


def test_a_floor_timed_in_the_same_rounds_is_in_the_row_and_the_table():
    first, last = rows(SWEEP)
    assert (first.floor, first.episode_len) == (0.001, 1000)
    assert last.over_floor == pytest.approx(1.5)
    assert (first.gather_floor, first.over_gather_floor) == (None, None)
    table = markdown_table(SWEEP).splitlines()
    assert table[2] == (
        "| sweep sample-after-write done 2M/3M, 1000-step episodes | 20 ms | 1.2 ms | 16.67x"
        " | 1 ms | 1.20x | - | - |"
    )


def _seed_bench(scenario, patched, floors):
    info = {
        "scenario": scenario, "variant": "pair", "operation": "seed_table", "key": "done",
        "stock_median_s": 0.005, "patched_median_s": patched,
        **{f"{name}_median_s": value for name, value in floors.items()},
    }
    return {"extra_info": info}


def test_the_gather_floor_is_in_the_row_the_table_and_the_json(tmp_path, capsys):
    report = {"benchmarks": [
        _seed_bench("seed_table done 5M/6M", 0.0003, {"floor": 0.0002, "gather_floor": 0.00025}),
        _seed_bench("seed_table episode 5M/6M", 0.0004, {"floor": 0.0002}),
    ]}
    timed, untimed = rows(report)
    assert timed.gather_floor == 0.00025
    assert timed.over_gather_floor == pytest.approx(1.2)
    assert (untimed.gather_floor, untimed.over_gather_floor) == (None, None)
    assert medians(report)[timed.scenario] == {
        "stock": 0.005, "patched": 0.0003, "floor": 0.0002, "gather_floor": 0.00025
    }
    assert markdown_table(report).splitlines()[2:] == [
        "| seed_table done 5M/6M | 5 ms | 300 µs | 16.67x | 200 µs | 1.50x | 250 µs | 1.20x |",
        "| seed_table episode 5M/6M | 5 ms | 400 µs | 12.50x | 200 µs | 2.00x | - | - |",
    ]
    assert main([_write(tmp_path, "bench.json", report), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed[0]["gather_floor_s"] == 0.00025
    assert printed[0]["patched_over_gather_floor"] == pytest.approx(1.2)
    assert (printed[1]["gather_floor_s"], printed[1]["patched_over_gather_floor"]) == (None, None)


def test_the_sweep_is_drawn_against_trajectories_with_its_floor(tmp_path):
    from conformance import speed_report

    stored, lines = speed_report._sweep_lines(rows(SWEEP))
    assert stored == 2_000_000
    drawn = {label: points for points, label, _, _ in lines}
    assert drawn["RandomSampler floor"] == [(2_000, 0.001), (200_000, 0.001)]
    assert drawn["patched"] == [(2_000, 0.0012), (200_000, 0.0015)]
    # no gather floor timed: no line for it
    assert list(drawn) == ["stock", "patched", "RandomSampler floor"]
    assert speed_report._sweep_lines(rows(PAIRS)) is None
    path = tmp_path / "with-sweep.png"
    plot({"benchmarks": PAIRS["benchmarks"] + SWEEP["benchmarks"]}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sweep_draws_the_gather_floor_where_it_was_timed(tmp_path):
    from conformance import speed_report

    _, lines = speed_report._sweep_lines(rows(SWEEP_WITH_GATHER))
    drawn = {label: (points, style) for points, label, style, _ in lines}
    assert list(drawn) == ["stock", "patched", "RandomSampler floor", "gather floor"]
    # the 10-step row has no gather floor: the line stops where the timings do
    assert drawn["gather floor"] == ([(2_000, 0.0004), (20_000, 0.00052)], "-.")
    assert drawn["RandomSampler floor"][1] == ":"
    path = tmp_path / "with-gather.png"
    plot(SWEEP_WITH_GATHER, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_series_keeps_its_colour_across_both_panels(tmp_path, monkeypatch):
    """stock, patched and each floor are drawn in one colour each, in both panels, and
    the figure itself says what the floors are."""
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: drawn.append(figure))
    plot({"benchmarks": PAIRS["benchmarks"] + SWEEP_WITH_GATHER["benchmarks"]}, tmp_path / "a.png")
    (figure,) = drawn
    assert len(figure.axes) == 2
    colours: dict[str, set[str]] = {}
    for axes in figure.axes:
        for line in axes.get_lines():
            series = line.get_label().split(",")[0]
            colours.setdefault(series, set()).add(line.get_color())
    assert set(colours) == {"stock", "patched", "RandomSampler floor", "gather floor"}
    assert all(len(colour) == 1 for colour in colours.values()), colours
    assert len(set.union(*colours.values())) == len(colours)
    caption = " ".join(text.get_text() for text in figure.texts)
    assert "RandomSampler floor =" in " ".join(caption.split())
    assert "gather floor =" in " ".join(caption.split())
