"""The command line of every Python driver process: ``python -m bench.peers.driver SYSTEM ROLE``.

Owns: importing the system's driver module (bench/peers/drivers/<system>.py) and running its
``produce(settings)`` or ``consume(settings)`` (bench.peers, settings of bench/peers/common.py),
or its ``serve(settings)`` or ``call(settings)`` (bench.peers.call, settings of
bench/peers/call_common.py), which return the result written to ``--out``. A driver that raises
writes ``{"error": ...}`` and exits 1: the orchestrator reports it as failed. Standard library
only at import time; the system's own client is imported by its module.
"""

from __future__ import annotations

import importlib
import sys
import traceback

from bench.peers.call_common import CallSettings
from bench.peers.common import Settings, write

# The roles of bench.peers.call; any other is bench.peers's (produce, consume).
CALL_ROLES = ("serve", "call", "call_apart")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings: Settings | CallSettings
    if len(args) > 1 and args[1] in CALL_ROLES:
        system, settings = CallSettings.parse(args)
    else:
        system, settings = Settings.parse(args)
    try:
        module = importlib.import_module(f"bench.peers.drivers.{system.replace('-', '_')}")
        result = getattr(module, settings.role)(settings)
    except BaseException as exc:
        traceback.print_exc()
        write(settings, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    write(settings, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
