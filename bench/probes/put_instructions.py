"""Instructions Redis executes per put script call, counted by callgrind: a base revision's
put.lua against the working tree's, on one Redis, interleaved.

    .venv/bin/python -m bench.probes.put_instructions --base REV [--new REV] [--calls 3000]
        [--reps 3]

Both revisions' script libraries (tubeq.store.scripts.library, named after a hash of their code,
so they load side by side) go into one private redis-server running under ``valgrind
--tool=callgrind``; each repetition calls each library's ``put`` function ``--calls`` times
(FCALL, pipelined 100 at a time, events on, 100-byte bodies, a fresh namespace per series), as
a plain ``put`` and as a ``put-with`` carrying ``traceparent=``, the order of the revisions
alternating, and reads Redis's instructions per call (callgrind_control --dump around each
series). No tubeq process: only the scripts' own work and Redis's command handling, without the
timers and idle loops that make a whole server's per-put count drift with the wall time
(bench.probes.script_instructions' "lone put"). Needs valgrind. Loopback only; the one
redis-server is started here and stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

from bench.harness.machine import cpu_model
from bench.harness.servers import LOOPBACK, snapshot_revision, snapshot_tubeq
from bench.probes.script_instructions import Counted, _wait_listening
from tubeq.redisio.process import free_port

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VARIANTS = ("put", "put-with traceparent")
PIPELINE = 100


def _library(code_dir: Path) -> dict[str, str]:
    """The library of the tubeq in ``code_dir``: its name, source and put function's name."""
    script = ("import json; from tubeq.store.scripts import library; lib = library(); "
              "print(json.dumps({'source': lib.source.decode(), 'put': lib.functions['put']}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True,
                          cwd=code_dir, env={**os.environ, "PYTHONPATH": str(code_dir)})
    return dict(json.loads(done.stdout))


def _series(client: redis.Redis, function: str, root: str, calls: int, traced: bool) -> None:
    for start in range(0, calls, PIPELINE):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(calls, start + PIPELINE)):
            args: list[object] = [1000, "probe", "t", 0, 0, 60, b"x" * 100,
                                  1_700_000_000_000 + i]
            if traced:
                args += ["traceparent", TRACEPARENT]
            pipe.execute_command("FCALL", function, 1, root, *args)
        pipe.execute()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probes.put_instructions",
                                description="Redis instructions per put script call, A/B.")
    p.add_argument("--base", required=True, help="the revision to compare with")
    p.add_argument("--new", default=None,
                   help="a revision to measure instead of the working tree")
    p.add_argument("--calls", type=int, default=3000, help="put calls per series")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every series")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tubeq-put-ir-") as tmp:
        new = (f"new {args.new}", _library(snapshot_revision(args.new, Path(tmp) / "new"))) \
            if args.new else ("working tree", _library(snapshot_tubeq(Path(tmp) / "head")))
        libraries = {new[0]: new[1],
                     f"base {args.base}": _library(snapshot_revision(args.base,
                                                                     Path(tmp) / "base"))}
        port = free_port(LOOPBACK)
        server = Counted(["redis-server", "--port", str(port), "--bind", LOOPBACK, "--save", "",
                          "--appendonly", "no", "--dir", tmp], Path(tmp), "redis")
        counts: dict[tuple[str, str], list[float]] = {}
        try:
            _wait_listening(port, server.proc)
            client = redis.Redis(host=LOOPBACK, port=port)
            for library in libraries.values():
                client.execute_command("FUNCTION", "LOAD", "REPLACE", library["source"])
            for rep in range(args.reps):
                order = list(libraries) if rep % 2 == 0 else list(reversed(libraries))
                for version in order:
                    for variant in VARIANTS:
                        root = f"{{probe{rep}-{order.index(version)}-{len(variant)}}}:"
                        server.dump()
                        _series(client, libraries[version]["put"], root, args.calls,
                                variant != "put")
                        counts.setdefault((version, variant), []).append(
                            server.dump() / args.calls)
        finally:
            server.stop()
    print(f"{cpu_model()}; Redis instructions per put call (callgrind Ir), {args.calls} calls "
          f"x {args.reps} repetitions, medians (each repetition)")
    for variant in VARIANTS:
        for version in libraries:
            values = counts[(version, variant)]
            print(f"  {variant:<21} {version:>16}: {statistics.median(values):>9,.0f} "
                  f"({', '.join(f'{v:,.0f}' for v in values)})")


if __name__ == "__main__":
    main()
