"""The stock / patched table built from a pytest-benchmark JSON."""
from __future__ import annotations

import json

from conformance.speed_report import format_seconds, main, markdown_table, medians


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
            "| scenario | stock median | patched median | speed-up (stock/patched) |",
            "| --- | ---: | ---: | ---: |",
            "| seed_table done 1M/1.2M | 24 ms | 300 µs | 80.00x |",
            "| extend room done 1M/1.5M | 100 µs | 110 µs | 0.91x |",
            "| online step done 2M/3M | 1.5 s | - | - |",
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
