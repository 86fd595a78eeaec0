"""Redis killed with SIGKILL and restarted under load, its append-only file fsynced on every
write (appendfsync always): every put acknowledged before the kill is in the file, so none is
lost; while Redis is down commands answer INTERNAL_ERROR and tubeq reconnects by itself.

Connections outlive the outage: each of the two tubeq processes has an idle connection opened
before the first kill, and each must be served at once afterwards, with current-watching
counting every connection. The restarted Redis holds both processes' instances with their
heartbeats from before the kill: an outage longer than REAP_AFTER_MS makes the first process
back reap the other, which is alive (issue 19: the reaped process's connections watched nothing
from then on, 4 of 4 runs with a 5 s outage, 0 of 2 with 1 s). The 5 s outage comes once: a
second one may reap the other process in turn, and with the bug every consumer of the load
then starves and the run waits out the drain bound before it fails.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.faults.load import Ledger, Load
from tests.support.servers import start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess
from tubeq.server.scheduler import REAP_AFTER_MS

PHASE_S = 2.0


@pytest.mark.parametrize(("outage_s", "rounds"), [(1.0, 2), (5.0, 1)], ids=["1s", "5s"])
async def test_redis_sigkill_and_restart_loses_no_job(tmp_path: Path, outage_s: float,
                                                      rounds: int) -> None:
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    prefix = unique_prefix("tq-restart")
    servers = [start_tubeq(redis.url, prefix, tmp_path / "logs", f"tubeq-{i}") for i in (0, 1)]
    longer = " (longer than REAP_AFTER_MS)" if outage_s > REAP_AFTER_MS / 1000 else ""
    ledger = Ledger(f"Redis SIGKILL + restart after {outage_s:g} s{longer} (appendfsync always)")
    load = Load(ledger, lambda: [server.address for server in servers],
                f"restart-{secrets.token_hex(3)}", max_jobs=20_000)
    try:
        for server in servers:
            await load.open_idle(server.address)
        load.start()
        await load.run_for(PHASE_S)
        for round_ in range(1, rounds + 1):
            assert redis.proc is not None
            redis.proc.kill()
            redis.proc.wait()
            ledger.fault(f"SIGKILL redis #{round_}")
            await load.run_for(outage_s)
            redis.start()  # same port, same append-only file
            await load.run_for(PHASE_S)
            await load.verify()
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the last restart"
        await load.finish()
    finally:
        for server in servers:
            server.stop()
        redis.stop()
    ledger.check()
