"""The online-step measurement's command line (its numbers are benchmarks, not tested here)."""
from __future__ import annotations

import pytest

from devtools import online_step_floor


@pytest.mark.parametrize("argv", [["--stored", "5"], ["--rounds", "0"]])
def test_bad_sizes_are_a_usage_error(argv, capsys):
    assert online_step_floor.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stored must be at least" in err


def test_a_small_run_prints_both_medians_and_their_ratio(capsys, torch_threads_restored):
    assert online_step_floor.main(["--stored", "20000", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "online step" in out and "its floor" in out and out.rstrip().split("ratio ")[1][0].isdigit()
