"""Redis killed with SIGKILL and restarted under load, its append-only file fsynced on every
write (appendfsync always): every put acknowledged before the kill is in the file, so none is
lost; while Redis is down commands answer INTERNAL_ERROR and tubeq reconnects by itself.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from tests.faults.load import Ledger, Load
from tests.servers import start_tubeq, unique_prefix
from tubeq.redis_process import RedisProcess

PHASE_S = 2.0
OUTAGE_S = 1.0


async def test_redis_sigkill_and_restart_loses_no_job(tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis", persistent=True, appendfsync="always")
    redis.start()
    prefix = unique_prefix("tq-restart")
    servers = [start_tubeq(redis.url, prefix, tmp_path / "logs", f"tubeq-{i}") for i in (0, 1)]
    ledger = Ledger("Redis SIGKILL + restart (appendfsync always)")
    load = Load(ledger, lambda: [server.address for server in servers],
                f"restart-{secrets.token_hex(3)}")
    try:
        load.start()
        await load.run_for(PHASE_S)
        for round_ in (1, 2):
            assert redis.proc is not None
            redis.proc.kill()
            redis.proc.wait()
            ledger.fault(f"SIGKILL redis #{round_}")
            await load.run_for(OUTAGE_S)
            redis.start()  # same port, same append-only file
            await load.run_for(PHASE_S)
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the last restart"
        await load.finish()
    finally:
        for server in servers:
            server.stop()
        redis.stop()
    ledger.check()
