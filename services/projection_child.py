"""`memstream serve --projections child`: the projections in a child process of their own.

Why: inline, the projections (two models' forward passes, index writes) and the query service
share one interpreter, so every search waits behind a batch of encoding; with them in a child
process the serving process keeps its own interpreter and a core, and the child runs at a lower
scheduling priority (nice +10), so queries get the CPU first and ingest takes the rest. The child
is an ordinary `memstream process` on the same settings (the environment, plus --data-dir), so it
keeps the same positions and exactly the guarantees of a separate worker; it dies with the server
(parent-death signal) and is restarted with back-off if it exits on its own.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("memstream.projections")

NICE = 10
_PR_SET_PDEATHSIG = 1


def _lower_priority_and_follow_parent() -> None:  # runs in the child between fork and exec
    os.nice(NICE)
    try:  # Linux: the child gets SIGTERM when the server dies, even by SIGKILL (no orphaned projector)
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - other platforms: the stop() path only
        pass


def child_pids(pid: int) -> list[int]:
    """The processes `pid` started (Linux), e.g. a server's projection child."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class ProjectionChild:
    def __init__(self, data_dir: Path, log_path: Path | None = None, max_backoff: float = 30.0):
        self.data_dir = data_dir
        self.log_path = log_path
        self.max_backoff = max_backoff
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._stopping = False

    def _spawn(self) -> subprocess.Popen:
        binary = Path(sys.executable).with_name("memstream")
        cmd = [str(binary)] if binary.exists() else [sys.executable, "-m", "services.cli"]
        out = open(self.log_path, "ab") if self.log_path else None
        try:
            proc = subprocess.Popen([*cmd, "--data-dir", str(self.data_dir), "process"], env=dict(os.environ),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT if out else None,
                                    preexec_fn=_lower_priority_and_follow_parent)
        finally:
            if out:
                out.close()
        log.info("projections: child process %d started (nice +%d)", proc.pid, NICE)
        return proc

    async def supervise(self, stop: asyncio.Event) -> None:
        """Keep a child running until `stop`; a child that exits by itself is restarted after
        1, 2, 4 … max_backoff seconds (reset once a child has lived a minute)."""
        backoff = 1.0
        while not stop.is_set():
            self.proc = self._spawn()
            started = asyncio.get_running_loop().time()
            code = await self._wait(stop)
            if code is None:  # stop was set
                return
            lived = asyncio.get_running_loop().time() - started
            backoff = 1.0 if lived > 60 else min(backoff * 2, self.max_backoff)
            self.restarts += 1
            log.warning("projections: child process %d exited with %s after %.0f s; restarting in %.0f s",
                        self.proc.pid, code, lived, backoff)
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except asyncio.TimeoutError:
                pass

    async def _wait(self, stop: asyncio.Event) -> int | None:
        while True:
            code = self.proc.poll()
            if code is not None:
                return code
            if stop.is_set():
                await asyncio.to_thread(self.terminate)
                return None
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    def terminate(self, timeout: float = 60.0) -> None:
        """SIGTERM (the child finishes its batch and closes its stores), SIGKILL after `timeout`."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("projections: child process %d did not stop within %.0f s; killing it", proc.pid, timeout)
            proc.kill()
            proc.wait()
