"""The rows a slice-sampling speed benchmark stores: an endless stream of episodes.

The speed benchmarks (``conformance/test_speed_slice_sampling.py``) and the GPU check
(``python -m devtools gpu``) fill their stock and patched buffers from it, so that both
buffers of a case hold the same rows.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

from conformance.speed_sizes import Case


def case_rows(case: Case, start: int, n: int) -> TensorDict:
    """Rows ``start .. start + n`` of the endless stream of episodes ``case`` stores.

    Step ``t`` belongs to episode ``t // episode_len`` and is done when it is the last
    step of its episode, so every buffer of a case holds the same rows.
    """
    step = torch.arange(start, start + n)
    episode = step // case.episode_len
    done = ((step + 1) % case.episode_len == 0).unsqueeze(-1)
    if case.layout in ("online", "sweep"):
        fields = {
            "obs": torch.zeros(n, 4),
            "episode": episode,
            ("next", "done"): done,
            ("next", "terminated"): done,
        }
    else:
        fields = {"obs": torch.zeros(n, 1)}
        if case.key in ("episode", "unnamed"):
            fields["episode"] = episode
        if case.key in ("done", "unnamed"):
            fields[("next", "done")] = done
    return TensorDict(fields, [n])
