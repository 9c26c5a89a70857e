"""What :func:`~torchrl_fixes.diagnose` returns and raises: the stages it times, its findings, its report.

:class:`DiagnoseReport` holds the measured stages and the findings, and writes them
out as a table (``str``), as data (``to_dict``, ``to_json``) and as a bar chart
(``save_png``, with matplotlib, imported only then).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# A stage "dominates" from this share of the sample on.
DOMINANT_SHARE = 0.5

# (name, label): the order of the table. The first six are what ``sample()`` runs.
STAGES = (
    ("boundaries", "sampler: trajectory boundaries"),
    ("sampler", "sampler: index draw"),
    ("gather", "storage gather"),
    ("transform", "transform"),
    ("pin_memory", "pin memory"),
    ("info", "info entries into the sample"),
    ("to_device", "host->device copy, blocking"),
    ("to_device_non_blocking", "host->device, non_blocking from pinned"),
)
SAMPLE_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory", "info")
# Stages a prefetch worker runs; TensorDictReplayBuffer.sample writes the info
# entries on the caller's thread.
PREFETCHED_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory")
_LABELS = dict(STAGES)


class DiagnoseRefused(RuntimeError):
    """:func:`diagnose` cannot time this buffer without disturbing it (or does not know its layout)."""


@dataclass(frozen=True)
class Finding:
    """A problem :func:`diagnose` found.

    Attributes:
        code (str): a short stable identifier (``"slice-boundaries"``, ...).
        message (str): one line, with the measured share where there is one.
        remedy (str): what to change.
    """

    code: str
    message: str
    remedy: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message, "remedy": self.remedy}


@dataclass
class DiagnoseReport:
    """What :func:`diagnose` measured and found.

    Attributes:
        stages (dict): stage name -> median seconds per sample, for the stages measured.
        not_measured (dict): stage name -> why it was not measured.
        findings (list of Finding): the problems found, largest share first.
        buffer (dict): what was diagnosed (classes, sizes, batch size, samples).
        prefetch (dict): the prefetch depth and what it takes off the training thread.
        notes (list of str): what the timing left out or approximated.
    """

    stages: dict[str, float]
    not_measured: dict[str, str]
    findings: list[Finding]
    buffer: dict[str, Any]
    prefetch: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def sample_seconds(self) -> float:
        """The median seconds of one ``sample()``: the sum of the sample stages measured."""
        return sum(self.stages.get(name, 0.0) for name in SAMPLE_STAGES)

    def share(self, stage: str) -> float:
        """The share of one ``sample()`` that ``stage`` takes (0 when not measured)."""
        total = self.sample_seconds
        return self.stages.get(stage, 0.0) / total if total > 0 else 0.0

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": dict(self.stages),
            "not_measured": dict(self.not_measured),
            "sample_seconds": self.sample_seconds,
            "findings": [finding.to_dict() for finding in self.findings],
            "buffer": dict(self.buffer),
            "prefetch": dict(self.prefetch),
            "notes": list(self.notes),
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def __str__(self) -> str:
        buf = self.buffer
        lines = [
            f"replay buffer: {buf['buffer']}, {buf['sampler']}, {buf['storage']} "
            f"({buf['stored']:,} of {buf['capacity']:,} rows), batch {buf['batch_size']}, "
            f"median of {buf['samples']} samples",
            f"torchrl {buf['torchrl']}; " + "; ".join(f"{k}: {v}" for k, v in buf["fixes"].items()),
            "",
        ]
        lines += self._stage_table()
        lines.append(f"prefetch: {self.prefetch['summary']}")
        lines += [f"note: {note}" for note in self.notes]
        lines.append("")
        if not self.findings:
            lines.append("findings: none")
        else:
            lines.append("findings:")
            for finding in self.findings:
                lines.append(f"  [{finding.code}] {finding.message}")
                lines.append(f"      remedy: {finding.remedy}")
        return "\n".join(lines)

    def _stage_table(self) -> list[str]:
        """The lines of the stage table: a row per stage, measured or not, then the total."""
        header = ("stage", "median/sample", "share", "")
        rows = []
        for name, label in STAGES:
            if name in self.stages:
                seconds = self.stages[name]
                if name in SAMPLE_STAGES:
                    share = self.share(name)
                    rows.append((label, _format_seconds(seconds), f"{share:.1%}", "#" * round(share * 30)))
                else:
                    rows.append((label, _format_seconds(seconds), "", ""))
            else:
                rows.append((label, "-", "", self.not_measured.get(name, "")))
        rows.append(("sample() total", _format_seconds(self.sample_seconds), "100.0%", ""))
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
        return [
            f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  "
            f"{row[2].rjust(widths[2])}  {row[3]}".rstrip()
            for row in (header, *rows)
        ]

    def save_png(self, path) -> str:
        """Writes a bar chart of the stages to ``path`` (needs matplotlib); returns the path.

        Raises:
            ImportError: matplotlib is not installed.
        """
        # imported here: matplotlib is optional, and ``import torchrl_fixes`` stays light
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        names = [name for name, _ in STAGES if name in self.stages]
        values = [self.stages[name] * 1e3 for name in names]
        colors = ["tab:red" if name in SAMPLE_STAGES and self.share(name) >= DOMINANT_SHARE
                  else "tab:blue" for name in names]
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
        ax.barh([_LABELS[name] for name in names][::-1], values[::-1], color=colors[::-1])
        ax.set_xlabel("median ms per sample")
        buf = self.buffer
        ax.set_title(f"{buf['sampler']}, {buf['storage']} ({buf['stored']:,} rows), batch {buf['batch_size']}",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return str(path)


def _format_seconds(seconds: float) -> str:
    """``seconds`` in s, ms or µs, to three significant digits.

    Examples:
        >>> _format_seconds(0.0123), _format_seconds(2.5e-5)
        ('12.3 ms', '25 µs')
    """
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _format_share(share: float) -> str:
    return f"{share:.0%}"
