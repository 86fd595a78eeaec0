"""A worker process for the quiet-shutdown fault test: the bundled client's ``consume()`` as a
user writes it, stopped by SIGTERM (its default ``stop_signals``).

    python -m tests.faults.quiet_consumer HOST PORT TUBE CONCURRENCY PREFETCH GRACE

Each job's body is ``sleep:<seconds>``: the handler sleeps that long and answers ``done``.
Prints ``stopped`` when ``run()`` returned (the consumer gave back what it held and closed).
"""

from __future__ import annotations

import asyncio
import sys

from tubeq.client import Client, Job


async def main(host: str, port: int, tube: str, concurrency: int, prefetch: int,
               grace: float) -> None:
    async def handle(job: Job) -> bytes:
        await asyncio.sleep(float(job.body.decode().split(":", 1)[1]))
        return b"done"

    async with Client(host, port) as client:
        await client.consume(tube, concurrency=concurrency, prefetch=prefetch,
                             grace=grace).run(handle)
    print("stopped", flush=True)


if __name__ == "__main__":
    host, port, tube, concurrency, prefetch, grace = sys.argv[1:7]
    asyncio.run(main(host, int(port), tube, int(concurrency), int(prefetch), float(grace)))
