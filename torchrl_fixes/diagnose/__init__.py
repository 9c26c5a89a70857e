"""Where a replay buffer's ``sample()`` spends its time, and what to do about it.

:func:`diagnose` times, on the user's own buffer, each stage that
``ReplayBuffer._sample`` and ``TensorDictReplayBuffer.sample`` compose: the
sampler's index draw (with a slice sampler's trajectory-boundary recovery on its
own), the storage gather, the transform, pinning, the info entries written into
the sample and, given an accelerator ``device``, the host->device copy; then the
draw again right after a write, as an online loop samples. It says whether each
fix serves the buffer (:class:`FixVerdict`), and names the problems it sees
(:class:`Finding`), each with the share of the sample it costs and a remedy.

It changes nothing: after :func:`diagnose` the buffer samples exactly what it
would have sampled without it. The stages run the buffer's own sampler and
storage, so everything they touch is put back afterwards: the sampler's (and a
sample unit's) attributes, the storage's and the buffer's attributes, every
random generator they hold, and torch's, numpy's and Python's global generators.
The transform runs on a copy of itself. The write is of the rows last written,
with the values they hold (:mod:`~torchrl_fixes.diagnose.after_write` says what
it leaves behind, and which storages it does not write). A buffer whose prefetch
worker or priority updates are still running is refused
(:class:`DiagnoseRefused`), not waited on for long and not disturbed.

The package, one module per job: :mod:`~torchrl_fixes.diagnose.report` (the
report, its verdicts and findings, and its bar chart),
:mod:`~torchrl_fixes.diagnose.buffer_parts` (the buffer's parts as TorchRL
composes them, and whether each fix serves them),
:mod:`~torchrl_fixes.diagnose.snapshot` (putting back what timing touches),
:mod:`~torchrl_fixes.diagnose.after_write` (the write the ``after_write`` stage
follows), :mod:`~torchrl_fixes.diagnose.stage_timing` (timing each stage),
:mod:`~torchrl_fixes.diagnose.findings` (what the times mean),
:mod:`~torchrl_fixes.diagnose.orchestration` (the steps of one diagnosis) and
:mod:`~torchrl_fixes.diagnose.demo` (the buffer of ``diagnose --demo``).
"""
from __future__ import annotations

from torchrl_fixes.diagnose.after_write import WRITE_ROWS
from torchrl_fixes.diagnose.demo import DEMO_STORED, demo_buffer
from torchrl_fixes.diagnose.findings import findings_from
from torchrl_fixes.diagnose.orchestration import run_diagnosis
from torchrl_fixes.diagnose.report import (
    DOMINANT_SHARE,
    PREFETCHED_STAGES,
    SAMPLE_STAGES,
    STAGES,
    DiagnoseRefused,
    DiagnoseReport,
    Finding,
    FixVerdict,
)

# How long diagnose waits for prefetched samples or priority updates still running
# (read at each call: set it here to wait longer or shorter).
SETTLE_SECONDS = 2.0


def diagnose(buffer, *, samples: int = 20, device=None, batch_size: int | None = None,
             write_rows: int = WRITE_ROWS) -> DiagnoseReport:
    """Times each stage of ``buffer.sample()`` and says what slows it down, changing nothing.

    The stages, each a median over ``samples`` samples: the sampler's index draw
    (``boundaries``: a slice sampler's trajectory-boundary recovery, on its own;
    ``sampler``: the rest), the storage ``gather``, the ``transform``,
    ``pin_memory``, the ``info`` entries ``TensorDictReplayBuffer.sample`` writes
    into the sample, and, for an accelerator ``device``, the host->device copy
    (``to_device``, blocking; ``to_device_non_blocking``, the training thread's
    time to issue it from pinned memory). Then ``after_write``: the whole index
    draw right after a write of ``write_rows`` rows, what an online loop
    (write, sample, write, sample) pays at every sample; the write is of the rows
    last written, with the values they hold. A stage it cannot time is in
    ``report.not_measured`` with the reason: the ``info`` stage, for one, where
    ``sample`` is not code diagnose knows, or ``after_write`` for a storage that
    another process may write. The report also says whether each fix serves the
    buffer (``report.fixes``), whether ``prefetch`` takes the sampling off the
    training thread, and lists its findings with a remedy each.

    After it returns, ``buffer`` samples exactly what it would have sampled
    without it: the stored values, the sampler's and storage's state, the
    prefetch queue, the buffer's generators and torch's, numpy's and Python's
    global generators are as they were. The storage's mutation revision is left
    moved by the writes, as after writes of unchanged values.

    Args:
        buffer (ReplayBuffer): the buffer to time, with data in it.

    Keyword Args:
        samples (int, optional): samples to time, between writes and after them.
            Defaults to ``20``.
        device (torch.device or str, optional): where the training step sends the
            sample; an accelerator device adds the host->device stages. Defaults to
            ``None`` (no copy timed).
        batch_size (int, optional): the batch size to sample; defaults to the buffer's.
        write_rows (int, optional): the rows of the write ``after_write`` follows,
            clipped to the rows stored; ``0`` times no write. Defaults to ``1000``.

    Returns:
        DiagnoseReport: ``str(report)`` is the table and the findings;
        ``report.to_dict()`` the same as data; ``report.save_png(path)`` a bar chart.

    Raises:
        DiagnoseRefused: the buffer cannot be timed without disturbing it (prefetch
            or priority updates still running), is empty, or has a layout this
            module does not know.

    Examples:
        >>> import time, torch, torchrl_fixes
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=8)
        >>> _ = rb.extend(TensorDict({"obs": torch.randn(100, 3)}, [100]))
        >>> def slow(td):
        ...     time.sleep(0.02)
        ...     return td
        >>> _ = rb.append_transform(slow)
        >>> report = torchrl_fixes.diagnose(rb, samples=3)
        >>> sorted(report.to_dict()["stages"])
        ['after_write', 'gather', 'info', 'sampler', 'transform']
        >>> report.buffer["write_rows"]  # clipped to the rows stored
        100
        >>> report.codes
        ['transform-dominates']
        >>> print(report.fixes["slice_boundary_index"])
        not relevant: RandomSampler is not a slice sampler
        >>> print(report)  # doctest: +SKIP
    """
    return run_diagnosis(
        buffer, samples=samples, device=device, batch_size=batch_size, write_rows=write_rows,
        settle_seconds=SETTLE_SECONDS,
    )


__all__ = [
    "DEMO_STORED",
    "DOMINANT_SHARE",
    "DiagnoseRefused",
    "DiagnoseReport",
    "Finding",
    "FixVerdict",
    "PREFETCHED_STAGES",
    "SAMPLE_STAGES",
    "SETTLE_SECONDS",
    "STAGES",
    "WRITE_ROWS",
    "demo_buffer",
    "diagnose",
    "findings_from",
]
