"""``tubeq --workers N``: N server processes on one port, kept running by this one.

Owns the worker processes' life: start, restart after a crash, forward drain, stop. Each worker
is an ordinary tubeq process (``python -m tubeq`` with the same flags) pointed at the same Redis
and prefix, so they share every tube as any set of tubeq processes does; each binds the port with
SO_REUSEPORT and the kernel spreads new connections over them. Rules:

* The supervisor serves nothing itself: it owns the private redis-server (when there is one) and
  the workers. SIGTERM/SIGINT stop the workers (each drains its connections as usual), then it;
  SIGUSR1 is forwarded (drain mode everywhere).
* A worker that exits on its own is started again after RESTART_DELAY_S (its reservations came
  back through disconnect or TTR, as after any crash); a worker that keeps dying is not
  restarted faster than that.
* Workers die with the supervisor, even if it is killed with SIGKILL (PR_SET_PDEATHSIG on Linux),
  so no orphan keeps the port.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
from collections.abc import Sequence

import structlog

log = structlog.get_logger(__name__)

# How long after a worker's unexpected exit it is started again.
RESTART_DELAY_S = 1.0
# How long stop waits for a worker after SIGTERM before SIGKILL (its own shutdown grace is 5 s).
STOP_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor goes, however it goes."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: workers outlive a SIGKILLed supervisor
        pass


class WorkerPool:
    """``count`` workers running ``python -m tubeq <argv>``."""

    def __init__(self, argv: Sequence[str], count: int) -> None:
        self.argv = [sys.executable, "-m", "tubeq", *argv]
        self.count = count
        self.workers: list[asyncio.subprocess.Process | None] = [None] * count
        self._stopping = False

    async def _start(self, slot: int) -> None:
        proc = await asyncio.create_subprocess_exec(*self.argv, preexec_fn=_die_with_parent)
        self.workers[slot] = proc
        log.info("worker started", worker=slot, pid=proc.pid)

    async def _keep(self, slot: int) -> None:
        while not self._stopping:
            await self._start(slot)
            proc = self.workers[slot]
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            log.warning("worker exited, restarting", worker=slot, pid=proc.pid, code=code)
            await asyncio.sleep(RESTART_DELAY_S)

    def signal_all(self, signum: int) -> None:
        for proc in self.workers:
            if proc is not None and proc.returncode is None:
                proc.send_signal(signum)

    async def run(self, stop: asyncio.Event) -> None:
        """Run the workers until ``stop`` is set, then stop them."""
        keepers = [asyncio.create_task(self._keep(slot)) for slot in range(self.count)]
        try:
            await stop.wait()
        finally:
            self._stopping = True
            self.signal_all(signal.SIGTERM)
            for proc in self.workers:
                if proc is None:
                    continue
                try:
                    await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            for keeper in keepers:
                keeper.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            log.info("workers stopped")
