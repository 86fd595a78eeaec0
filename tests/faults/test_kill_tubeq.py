"""SIGKILL of tubeq processes under load: two processes serve one queue, each is killed with
SIGKILL in turn and started again on its port; clients fail over to the other address. Jobs a
killed process's clients held come back when their TTR runs out (the surviving process's sweep).

Connections to the survivor outlive the kill: each process has an idle connection opened
before the first kill, and a restarted process gets one before the next kill. The killed
process's own connections are gone with it; after each kill and restart, the idle connections
still open (the survivor's; after the second kill, the one the restarted first process got)
must be served at once, and current-watching must count every connection the test holds and
no more: the survivor reaps the killed process (REAP_AFTER_MS after its last heartbeat), which
takes its connections' watches out, and must take nothing of its own.
"""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

from tests.faults.load import WATCHING_AFTER_KILL_S, Ledger, Load
from tests.faults.procs import start_tubeq_on
from tests.support.servers import LOOPBACK, ServerProcess, unique_prefix
from tubeq.redisio.process import RedisProcess, free_port

# Seconds of load between faults: enough for a few hundred jobs on the shared 2-core box.
PHASE_S = 2.0


async def test_sigkill_of_tubeq_processes_loses_no_job(redis: RedisProcess,
                                                         tmp_path: Path) -> None:
    prefix = unique_prefix("tq-kill")
    ports = [free_port(), free_port()]
    servers: list[ServerProcess] = [
        start_tubeq_on(port, redis.url, prefix, tmp_path, f"tubeq-{i}")
        for i, port in enumerate(ports)]
    ledger = Ledger("SIGKILL tubeq")
    load = Load(ledger, lambda: [(LOOPBACK, port) for port in ports],
                f"kill-{secrets.token_hex(3)}", producers=2, consumers=2, max_jobs=20_000)
    try:
        for server in servers:
            await load.open_idle(server.address)
        load.start()
        await load.run_for(PHASE_S)
        for index in (0, 1):
            os.kill(servers[index].pid, signal.SIGKILL)
            servers[index].proc.wait()
            load.idle_gone(servers[index].address)
            ledger.fault(f"SIGKILL tubeq {index}")
            await load.run_for(PHASE_S)
            servers[index] = start_tubeq_on(ports[index], redis.url, prefix, tmp_path,
                                            f"tubeq-{index}-again")
            await load.run_for(PHASE_S)
            await load.verify(watching_s=WATCHING_AFTER_KILL_S)
            if index == 0:
                await load.open_idle(servers[index].address)  # before the kill of the other
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the last restart"
        await load.finish()
    finally:
        for server in servers:
            server.stop()
    ledger.check()
