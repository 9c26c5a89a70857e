"""How much memory the machine can give a benchmark before it starts filling a buffer."""
from __future__ import annotations

import os


def available_memory() -> int | None:
    """Bytes the system can hand out now: MemAvailable, else ``os.sysconf``'s free pages.

    Returns ``None`` where neither can be read.
    """
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
