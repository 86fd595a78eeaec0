"""``python -m tubeq`` and the ``tubeq`` command: listen first, then start.

beanstalkd listens within a millisecond of exec; tubeq's imports take a few hundred. So this
module imports nothing of the server: it reads the listen flags (``-l``, ``-p``,
``--reuse-port``, ``--workers``) off the command line, binds the protocol socket
(tubeq.server.listeners.listen_before_start) and holds SIGTERM, SIGINT and SIGUSR1, and only
then imports the composition root, tubeq.cli, which parses the whole command line and serves on
that socket. The kernel queues the connections that arrive meanwhile; they are answered once
the server is up (a client sees a slow first reply, never a refused connection).

The reading here is a guess that needs no import: tubeq.cli's full parse decides, and a socket
bound for other settings than it reads is closed and bound again the usual way. Nothing here
fails a start: what cannot be bound early is bound later, and a failure is then reported in
the usual one line.
"""

from __future__ import annotations

import signal
import sys

from tubeq.server.listeners import Prebound, listen_before_start

# Held until the event loop takes them over (tubeq.cli acts on them then): their default
# action would kill a server half-way through its start, leaving a socket file behind.
HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def listen_flags(argv: list[str]) -> tuple[str, int, bool] | None:
    """``-l``, ``-p`` and ``--reuse-port`` as argparse will read them (tubeq.cli), or None
    where nothing is to be bound early: ``--help``, ``--version``, ``--workers`` above 1 (the
    supervisor serves nothing), or a flag this reading cannot be sure of (an abbreviation)."""
    host, port, reuse_port = "127.0.0.1", 11300, False
    args = iter(argv)
    for arg in args:
        if arg == "--":
            break
        if arg[:2] in ("-l", "-p"):  # -l ADDR, -lADDR, -p PORT, -pPORT
            value = arg[2:] or next(args, "")
            if arg[:2] == "-l":
                host = value
            elif not value.isdigit():
                return None
            else:
                port = int(value)
        elif arg == "--reuse-port":
            reuse_port = True
        elif arg.startswith("--workers"):
            value = arg.removeprefix("--workers").removeprefix("=") or next(args, "")
            if value != "1":
                return None
        elif arg.startswith(("-h", "--h", "--v", "--w", "--reu")):
            return None
    return host, port, reuse_port


def main() -> None:
    """The ``tubeq`` command (pyproject.toml's entry point) and ``python -m tubeq``."""
    held: list[int] = []
    for signum in HELD_SIGNALS:
        signal.signal(signum, lambda signum, _frame: held.append(signum))
    argv = sys.argv[1:]
    flags = listen_flags(argv)
    prebound: Prebound | None = listen_before_start(*flags) if flags is not None else None

    # structlog imports rich when it is installed (~0.13 s here) to draw tracebacks, which
    # tubeq's log lines never use (they render exceptions as text: tubeq.cli.configure_logging).
    # An install of tubeq does not have rich (the dev tools bring it); a server that happens to
    # sit beside it should not start slower, nor log differently.
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]
    from tubeq.cli import main as run  # the imports this module is here to put after the bind

    run(argv, prebound=prebound, held_signals=held)


if __name__ == "__main__":
    main()
