"""The slice family's floor measurement's command line (its numbers are benchmarks, not tested here)."""
from __future__ import annotations

import pytest

from conformance import reference
from devtools import family_floor


@pytest.mark.parametrize(
    "argv", [["--stored", "5"], ["--rounds", "0"], ["--episode", "2"], ["--stored", "20000", "--episode", "30000"]]
)
def test_bad_sizes_are_a_usage_error(argv, capsys):
    assert family_floor.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stored must be at least" in err


@pytest.mark.parametrize("sampler", family_floor.SAMPLERS)
def test_a_small_run_prints_both_medians_and_their_ratio(sampler, capsys, torch_threads_restored):
    if sampler == "prioritized":
        reference.skip_without_extension()
    argv = ["--sampler", sampler, "--stored", "20000", "--rounds", "2", "--fixes"]
    assert family_floor.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{sampler}, done, 20,000 stored in 2,000 trajectories")
    assert "floor" in out and out.rstrip().split("ratio ")[1][0].isdigit()
