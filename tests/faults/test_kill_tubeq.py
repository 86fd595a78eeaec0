"""SIGKILL of tubeq processes under load: two processes serve one queue, each is killed with
SIGKILL in turn and started again on its port; clients fail over to the other address. Jobs a
killed process's clients held come back when their TTR runs out (the surviving process's sweep).
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.load import Ledger, Load
from tests.faults.procs import start_tubeq_on
from tests.servers import LOOPBACK, ServerProcess, unique_prefix
from tubeq.redis_process import RedisProcess, free_port

# Seconds of load between faults: enough for a few hundred jobs on the shared 2-core box.
PHASE_S = 2.0


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisProcess]:
    process = RedisProcess(tmp_path / "redis")
    process.start()
    yield process
    process.stop()


async def test_sigkill_of_tubeq_processes_loses_no_job(redis: RedisProcess,
                                                         tmp_path: Path) -> None:
    prefix = unique_prefix("tq-kill")
    ports = [free_port(), free_port()]
    servers: list[ServerProcess] = [
        start_tubeq_on(port, redis.url, prefix, tmp_path, f"tubeq-{i}")
        for i, port in enumerate(ports)]
    ledger = Ledger("SIGKILL tubeq")
    load = Load(ledger, lambda: [(LOOPBACK, port) for port in ports],
                f"kill-{secrets.token_hex(3)}", producers=2, consumers=2)
    try:
        load.start()
        await load.run_for(PHASE_S)
        for index in (0, 1):
            os.kill(servers[index].pid, signal.SIGKILL)
            servers[index].proc.wait()
            ledger.fault(f"SIGKILL tubeq {index}")
            await load.run_for(PHASE_S)
            servers[index] = start_tubeq_on(ports[index], redis.url, prefix, tmp_path,
                                            f"tubeq-{index}-again")
            await load.run_for(PHASE_S)
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the last restart"
        await load.finish()
    finally:
        for server in servers:
            server.stop()
    ledger.check()
