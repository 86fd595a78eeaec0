"""A tubeq process paused with SIGSTOP for longer than REAP_AFTER_MS and resumed with SIGCONT,
under load: two processes serve one queue; one of them is stopped for PAUSE_S, then goes on.

While it is stopped its heartbeats stop, so the other process takes it for dead and reaps it
(tubeq/store/lua/reap.lua); its clients' commands wait (the load's bound on a reply is longer than
the pause). It is not dead: once resumed it answers them and must serve every connection it
had as before. Expected: no job lost; its idle connection (opened before the pause) is served
at once when its tube has a ready job; current-watching counts its connections again. Issue 19:
the reap deleted its connections' watch lists and nothing re-created them, so they watched
nothing from then on (starved 1, watchers lost 3 or more, in 3 of 3 runs).
"""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

from tests.faults.load import REPLY_S, Ledger, Load
from tests.support.servers import ServerProcess, start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess
from tubeq.server.scheduler import REAP_AFTER_MS

PHASE_S = 2.0
PAUSE_S = 5.0  # REAP_AFTER_MS and then some: the other process's reap comes within the pause
assert REAP_AFTER_MS / 1000 < PAUSE_S < REPLY_S


async def test_a_paused_tubeq_serves_its_connections_after(redis: RedisProcess,
                                                           tmp_path: Path) -> None:
    prefix = unique_prefix("tq-pause")
    servers: list[ServerProcess] = [
        start_tubeq(redis.url, prefix, tmp_path / "logs", f"tubeq-{i}") for i in (0, 1)]
    ledger = Ledger(f"tubeq SIGSTOP {PAUSE_S:g} s + SIGCONT")
    load = Load(ledger, lambda: [server.address for server in servers],
                f"pause-{secrets.token_hex(3)}", max_jobs=20_000)
    paused = servers[0]
    try:
        for server in servers:
            await load.open_idle(server.address)
        load.start()
        await load.run_for(PHASE_S)
        paused.send_signal(signal.SIGSTOP)
        try:
            await load.run_for(PAUSE_S)
        finally:
            paused.send_signal(signal.SIGCONT)
        ledger.fault(f"SIGSTOP tubeq 0 for {PAUSE_S:g} s")
        await load.run_for(PHASE_S)
        await load.verify()
        assert ledger.inserted_after_fault > 0, "nothing was inserted after the pause"
        await load.finish()
    finally:
        paused.send_signal(signal.SIGCONT)  # never leave a stopped process behind
        for server in servers:
            server.stop()
    ledger.check()
