"""Redis frozen with SIGSTOP for longer than REAP_AFTER_MS and thawed with SIGCONT, under load:
two tubeq processes on it. Nothing is lost and nothing errors: tubeq's commands wait in the
socket (it puts no timeout on a Redis reply; the load's bound on a reply is longer), and Redis
runs them all after the thaw.

Both processes' heartbeats are then older than REAP_AFTER_MS, and each process's next sweep runs
its heartbeat and then a reap: whichever reap Redis runs before the other process's heartbeat
takes that process for dead, although it is alive. Expected: each process's idle connection
(opened before the freeze) is served at once afterwards, and current-watching counts every
connection. Issue 19: the reaped process's connections watched nothing from then on. Since it
depends on the order in which the two processes' commands reach Redis after the thaw, this
caught it in 1 run of 3 in the issue's measurement: a pass here on a code with the bug is
possible.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

from tests.faults.load import REPLY_S, Ledger, Load
from tests.support.servers import start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess
from tubeq.server.scheduler import REAP_AFTER_MS

PHASE_S = 2.0
FREEZE_S = 5.0
assert REAP_AFTER_MS / 1000 < FREEZE_S < REPLY_S


async def test_a_frozen_redis_loses_no_job_and_no_watcher(redis: RedisProcess,
                                                          tmp_path: Path) -> None:
    prefix = unique_prefix("tq-freeze")
    servers = [start_tubeq(redis.url, prefix, tmp_path / "logs", f"tubeq-{i}") for i in (0, 1)]
    ledger = Ledger(f"Redis SIGSTOP {FREEZE_S:g} s + SIGCONT")
    load = Load(ledger, lambda: [server.address for server in servers],
                f"freeze-{secrets.token_hex(3)}", max_jobs=20_000)
    assert redis.proc is not None
    pid = redis.proc.pid
    try:
        for server in servers:
            await load.open_idle(server.address)
        load.start()
        await load.run_for(PHASE_S)
        os.kill(pid, signal.SIGSTOP)
        try:
            await load.run_for(FREEZE_S)
        finally:
            os.kill(pid, signal.SIGCONT)
        ledger.fault(f"SIGSTOP redis for {FREEZE_S:g} s")
        await load.run_for(PHASE_S)
        await load.verify()
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the thaw"
        await load.finish()
    finally:
        if redis.proc is not None and redis.proc.poll() is None:
            os.kill(pid, signal.SIGCONT)  # never leave a stopped process behind
        for server in servers:
            server.stop()
    ledger.check()
