"""What one lifecycle event's XADD costs inside Redis, by the shape of the command.

    .venv/bin/python -m bench.probes.events_xadd_cost [--events 200000] [--reps 2]

Each variant is a one-line Lua script run by EVALSHA, pipelined, on a private redis-server:
the XADD tubeq's scripts issue (11 field/value pairs) with and without ``MAXLEN ~ N``, the
same event packed into one field (a schema tubeq does not use: what a packed event would
save), and an empty script (the cost of a script call alone). Redis's own time per call (INFO
commandstats, reset per variant) is printed: the difference to the empty script is the XADD.
Variants alternate within each repetition, so a busy moment hurts all of them alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis

from bench.harness.machine import cpu_model
from tubeq.redisio.process import RedisProcess

FIELDS_XADD = ("'event','put','id',ARGV[1],'tube','t1','pri',1024,'delay_ms',0,'ttr_ms',60000,"
               "'due_ms',0,'tries',0,'time_ms',ARGV[2],'by','abcdef123456','reason',''")
VARIANTS = {
    "XADD MAXLEN ~ N, 11 fields": f"redis.call('XADD', KEYS[1], 'MAXLEN', '~', 1000000, '*', "
                                  f"{FIELDS_XADD})",
    "XADD, 11 fields (no MAXLEN)": f"redis.call('XADD', KEYS[1], '*', {FIELDS_XADD})",
    "XADD MAXLEN ~ N, 1 packed field": "redis.call('XADD', KEYS[1], 'MAXLEN', '~', 1000000, "
                                       "'*', 'e', 'put|' .. ARGV[1] .. '|t1|1024|0|60000|0|0|' "
                                       ".. ARGV[2] .. '|abcdef123456|')",
    "empty script": "return 1",
}
BATCH = 1000


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.events_xadd_cost")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    server = RedisProcess(Path(tempfile.mkdtemp(prefix="tubeq-xadd-")) / "redis")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        print(f"cpu: {cpu_model()}; {args.events:,} calls per variant and repetition")
        for rep in range(args.reps):
            for name, body in VARIANTS.items():
                client.delete("events")
                sha = client.script_load(body)
                client.config_resetstat()
                now = int(time.time() * 1000)
                pipe = client.pipeline(transaction=False)
                for i in range(args.events):
                    pipe.evalsha(sha, 1, "events", i, now)
                    if i % BATCH == BATCH - 1:
                        pipe.execute()
                pipe.execute()
                stats = client.info("commandstats")["cmdstat_evalsha"]
                print(f"rep {rep}  {name:<34} {stats['usec_per_call']:6.2f} us per call")
        client.close()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
