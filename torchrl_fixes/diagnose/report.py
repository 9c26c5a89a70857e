"""What :func:`~torchrl_fixes.diagnose` returns and raises: the stages it times, its findings, its report.

:class:`DiagnoseReport` holds the measured stages, whether each fix serves the
buffer (:class:`FixVerdict`) and the findings, and writes them out as a table
(``str``), as data (``to_dict``, ``to_json``) and as a bar chart (``save_png``,
with matplotlib, imported only then).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# A stage "dominates" from this share of the sample on.
DOMINANT_SHARE = 0.5

# (name, label): the order of the table. The first six are what ``sample()`` runs;
# ``after_write`` is the sampler's whole draw (boundaries included) right after a write.
STAGES = (
    ("boundaries", "sampler: trajectory boundaries"),
    ("sampler", "sampler: index draw"),
    ("gather", "storage gather"),
    ("transform", "transform"),
    ("pin_memory", "pin memory"),
    ("info", "info entries into the sample"),
    ("to_device", "host->device copy, blocking"),
    ("to_device_non_blocking", "host->device, non_blocking from pinned"),
    ("after_write", "sampler: draw right after a write"),
)
SAMPLE_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory", "info")
# The stages of the index draw, which a write can change; the others read what it draws.
DRAW_STAGES = ("boundaries", "sampler")
# Stages a prefetch worker runs; TensorDictReplayBuffer.sample writes the info
# entries on the caller's thread.
PREFETCHED_STAGES = ("boundaries", "sampler", "gather", "transform", "pin_memory")
_LABELS = dict(STAGES)


class DiagnoseRefused(RuntimeError):
    """:func:`diagnose` cannot time this buffer without disturbing it (or does not know its layout)."""


# FixVerdict.state values
SERVES, STOCK, NOT_RELEVANT = "serves", "stock", "not relevant"


@dataclass(frozen=True)
class FixVerdict:
    """Whether one fix serves the diagnosed buffer, and if not, why.

    Attributes:
        state (str): ``"serves"`` (the fix's code runs for this buffer), ``"stock"``
            (TorchRL's code runs) or ``"not relevant"`` (the buffer uses nothing the
            fix changes).
        why (str): why stock code runs or the fix is not relevant; for ``"serves"``,
            what is worth knowing about it, or ``""``.
        cause (str): for ``"stock"``, a stable name of the cause: ``"inactive"`` (not
            applied in this process), ``"skipped"`` (it cannot apply to this TorchRL),
            ``"built disabled"`` (built inside ``torchrl_fixes.disabled()``),
            ``"configuration"`` (one the fix leaves to stock code) or ``"stock
            decorator"`` (a buffer class decorated with TorchRL's ``pin_memory_output``
            before the import); ``""`` otherwise.
        remedy (str): for ``"stock"``, what makes the fix serve the buffer, where
            something does; ``""`` otherwise.

    Examples:
        >>> print(FixVerdict(STOCK, "fragmented=True", "configuration", "fragmented=False"))
        stock code runs: fragmented=True
        >>> print(FixVerdict(SERVES))
        serves this buffer
    """

    state: str
    why: str = ""
    cause: str = ""
    remedy: str = ""

    def __str__(self) -> str:
        if self.state == SERVES:
            return "serves this buffer" + (f"; {self.why}" if self.why else "")
        if self.state == STOCK:
            return f"stock code runs: {self.why}"
        return f"not relevant: {self.why}"

    def to_dict(self) -> dict[str, str]:
        return {"state": self.state, "cause": self.cause, "why": self.why, "remedy": self.remedy,
                "text": str(self)}


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
        buffer (dict): what was diagnosed (classes, sizes, batch size, samples, and
            ``write_rows``, the rows of the write the ``after_write`` stage follows).
        prefetch (dict): the prefetch depth and what it takes off the training thread.
        notes (list of str): what the timing left out or approximated.
        fixes (dict): fix name -> :class:`FixVerdict`, for every fix this package knows.
    """

    stages: dict[str, float]
    not_measured: dict[str, str]
    findings: list[Finding]
    buffer: dict[str, Any]
    prefetch: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    fixes: dict[str, FixVerdict] = field(default_factory=dict)

    @property
    def sample_seconds(self) -> float:
        """The median seconds of one ``sample()``: the sum of the sample stages measured."""
        return sum(self.stages.get(name, 0.0) for name in SAMPLE_STAGES)

    @property
    def draw_seconds(self) -> float:
        """The median seconds of the sampler's index draw between writes, boundaries included."""
        return sum(self.stages.get(name, 0.0) for name in DRAW_STAGES)

    @property
    def after_write_seconds(self) -> float | None:
        """The seconds of a ``sample()`` right after a write (None when not measured).

        The index draw as timed right after the write (``after_write``), the other
        stages as timed between writes: a write changes only what the draw reads.
        """
        if "after_write" not in self.stages:
            return None
        return self.sample_seconds - self.draw_seconds + self.stages["after_write"]

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
            "after_write_sample_seconds": self.after_write_seconds,
            "fixes": {name: verdict.to_dict() for name, verdict in self.fixes.items()},
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
            f"torchrl {buf['torchrl']}; the fixes, for this buffer:",
        ]
        width = max((len(name) for name in self.fixes), default=0)
        lines += [f"  {name.ljust(width)}  {verdict}" for name, verdict in self.fixes.items()]
        lines.append("")
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
            if name == "after_write":
                continue  # its own row, under the total it is compared with
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
        rows.append(self._after_write_row())
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(3)]
        return [
            f"{row[0].ljust(widths[0])}  {row[1].rjust(widths[1])}  "
            f"{row[2].rjust(widths[2])}  {row[3]}".rstrip()
            for row in (header, *rows)
        ]

    def _after_write_row(self) -> tuple[str, str, str, str]:
        rows = self.buffer.get("write_rows")
        if self.after_write_seconds is None:
            return ("sample() right after a write", "-", "", self.not_measured.get("after_write", ""))
        return (
            f"sample() right after a write of {rows:,} rows",
            _format_seconds(self.after_write_seconds),
            "",
            f"index draw {_format_seconds(self.stages['after_write'])} "
            f"({_format_seconds(self.draw_seconds)} between writes)",
        )

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
