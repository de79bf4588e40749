"""What the benches read about a process from Linux's /proc (these machines: Linux only)."""

from __future__ import annotations

from pathlib import Path


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
