"""What the benches read about a process from Linux's /proc (these machines: Linux only)."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def status_mb(pid: int | str = "self", keys: tuple[str, ...] = ("VmRSS",)) -> dict[str, float]:
    """Memory fields of /proc/<pid>/status (kB there) in MB, e.g. VmRSS (resident), VmHWM (peak)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = int(value.split()[0]) / 1024
    return out


def rss_mb(pid: int | str = "self") -> float:
    return status_mb(pid)["VmRSS"]


def cpu_seconds(pid: int | str = "self") -> float:
    """CPU time (user + system) the process has used so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS
