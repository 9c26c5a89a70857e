"""devtools/tdmpc2_loop.py: TD-MPC2's buffer, stock against patched, with every slice checked."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.slice_scenarios import TDMPC2_HORIZON as HORIZON
from conformance.slice_scenarios import TDMPC2_NUM_SLICES as NUM_SLICES
from conformance.slice_scenarios import tdmpc2_buffer
from devtools import tdmpc2_loop
from devtools.tdmpc2_loop import EPISODE_LEN, TDMPC2LoopError

ROOT = Path(__file__).resolve().parents[1]


def test_check_slices_accepts_slices_of_one_episode_at_consecutive_steps():
    rows = tdmpc2_loop.episodes(0, 3 * EPISODE_LEN)
    starts = torch.tensor([0, 10, EPISODE_LEN, 2 * EPISODE_LEN + 5])
    index = (starts[:, None] + torch.arange(HORIZON + 1)).reshape(-1)
    tdmpc2_loop.check_slices(rows[index])


def test_check_slices_rejects_a_slice_across_an_episode_end():
    rows = tdmpc2_loop.episodes(0, 2 * EPISODE_LEN)
    index = EPISODE_LEN - 2 + torch.arange(HORIZON + 1)
    with pytest.raises(TDMPC2LoopError, match="crosses an episode boundary"):
        tdmpc2_loop.check_slices(rows[index])


def test_check_slices_rejects_steps_out_of_order():
    rows = tdmpc2_loop.episodes(0, EPISODE_LEN)
    index = torch.tensor([0, 1, 3, 4])
    with pytest.raises(TDMPC2LoopError, match="not consecutive"):
        tdmpc2_loop.check_slices(rows[index])


def test_run_times_both_buffers_and_checks_every_sample():
    timing = tdmpc2_loop.run(stored=20_000, capacity=22_000, rounds=2, samples_per_episode=3)
    assert timing.stored == 20_000
    # 2 rounds x 2 buffers x 3 samples
    assert timing.samples_checked == 12
    assert timing.stock_s > 0 and timing.patched_s > 0
    assert timing.speedup == timing.stock_s / timing.patched_s


def test_the_buffer_is_tdmpc2s():
    rb = tdmpc2_buffer(1_000)
    sampler = rb._sampler
    # end_key=None: the sampler keeps its default end key, and reads the episode ids
    assert (sampler.num_slices, sampler.traj_key) == (NUM_SLICES, "episode")
    assert sampler.strict_length and not sampler.cache_values
    assert rb._batch_size == NUM_SLICES * (HORIZON + 1)


def test_capacity_too_small_is_one_line_error():
    result = subprocess.run(
        [sys.executable, "-m", "devtools", "tdmpc2", "--stored", "1000", "--capacity", "1000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "python -m devtools tdmpc2: capacity 1000 cannot hold 1000 rows and 6 more episodes; "
        "raise --capacity"
    )


def test_command_prints_and_writes_the_table(tmp_path):
    result = subprocess.run(
        [
            sys.executable, "-m", "devtools", "tdmpc2", "--stored", "6000", "--capacity", "8000",
            "--rounds", "2", "--samples", "2", "--out", str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    written = (tmp_path / "tdmpc2.md").read_text()
    assert written.strip() in result.stdout
    assert "| 6,000 |" in written and "| 8 |" in written
