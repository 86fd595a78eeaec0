"""Client connections cut under load by a TCP proxy between the clients and tubeq: a cut
consumer's reserved job goes back to ready at once (disconnect.lua) and comes again; a put whose
reply was cut off is unacknowledged and may or may not exist.

An idle connection straight to tubeq (not through the proxy, so never cut), opened before the
first cut, must be served at once after the cuts, and current-watching must count every
connection the test holds: each cut connection's close takes out its own watches, and nothing
of the others'.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from tests.faults.load import Ledger, Load
from tests.support.client_support import LOOPBACK, Proxy
from tests.support.servers import start_tubeq, unique_prefix
from tubeq.redisio.process import RedisProcess

CUTS = 6
BETWEEN_CUTS_S = 1.0


async def test_cut_client_connections_lose_no_job(tmp_path: Path) -> None:
    redis = RedisProcess(tmp_path / "redis")
    redis.start()
    server = start_tubeq(redis.url, unique_prefix("tq-cut"), tmp_path / "logs")
    ledger = Ledger("TCP proxy cuts every client connection")
    try:
        async with Proxy(*server.address) as proxy:
            load = Load(ledger, lambda: [(LOOPBACK, proxy.port)],
                        f"cut-{secrets.token_hex(3)}", producers=2, consumers=3)
            await load.open_idle(server.address)
            load.start()
            for cut in range(CUTS):
                await load.run_for(BETWEEN_CUTS_S)
                proxy.cut()
                ledger.fault(f"cut #{cut + 1}")
            await load.run_for(BETWEEN_CUTS_S)
            await load.verify()
            assert proxy.accepted > CUTS, "the clients did not come back after the cuts"
            assert ledger.inserted_after_fault > 0, "nothing was inserted after the last cut"
            await load.finish()
    finally:
        server.stop()
        redis.stop()
    ledger.check()
