"""Command line: ``tubeq -l ADDR -p PORT [-z MAX_JOB_SIZE] [--redis URL] [--prefix NAME]``.

``--metrics ADDR:PORT`` opens the HTTP listener (/metrics, the HTTP API, the dashboard);
``--log-format json|console`` picks the log lines' shape (README, "Operating tubeq").

The flags are beanstalkd's, so tools that launch a beanstalkd binary can launch tubeq. Without
``--redis`` tubeq starts and supervises a private redis-server keeping its data (an append-only
file) under ``--data-dir``. SIGTERM/SIGINT shut down cleanly; SIGUSR1 enters drain mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import structlog

from tubeq.connection import DEFAULT_MAX_CLIENT_BUFFER, DEFAULT_MAX_IN_FLIGHT
from tubeq.metrics import DEFAULT_MAX_TUBES, DEFAULT_SLOW_MS
from tubeq.redis_process import RedisNotInstalled, RedisProcess
from tubeq.server import DEFAULT_EVENTS_MAXLEN, DEFAULT_MAX_JOB_SIZE, Config, Server

log = structlog.get_logger("tubeq")

# How often the supervisor checks that the private redis-server is still running.
SUPERVISE_PERIOD_S = 1.0


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tubeq"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tubeq", description=__doc__.splitlines()[0])
    p.add_argument("-l", dest="host", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("-p", dest="port", type=int, default=11300, help="listen port (11300)")
    p.add_argument("-z", dest="max_job_size", type=int, default=DEFAULT_MAX_JOB_SIZE,
                   help=f"maximum job size in bytes ({DEFAULT_MAX_JOB_SIZE})")
    p.add_argument("--redis", dest="redis_url", default=None,
                   help="Redis URL, e.g. redis://127.0.0.1:6379/0 (default: a private "
                        "redis-server started by tubeq)")
    p.add_argument("--prefix", default="tubeq",
                   help="key namespace: processes with the same Redis and prefix share tubes")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where the private redis-server keeps its data "
                        "(default: $XDG_DATA_HOME/tubeq)")
    p.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT, metavar="N",
                   help="unanswered commands per connection before tubeq stops reading it "
                        f"({DEFAULT_MAX_IN_FLIGHT})")
    p.add_argument("--max-client-buffer", type=int, default=DEFAULT_MAX_CLIENT_BUFFER,
                   metavar="BYTES",
                   help="unsent replies plus unparsed input one connection may hold before it "
                        f"is closed ({DEFAULT_MAX_CLIENT_BUFFER})")
    p.add_argument("--events", choices=["on", "off"], default=None,
                   help="write every job's lifecycle events to the Redis stream "
                        "{prefix}:events (default: on with the private redis-server, off with "
                        "--redis: a shared Redis's memory belongs to someone else)")
    p.add_argument("--events-maxlen", type=int, default=DEFAULT_EVENTS_MAXLEN, metavar="N",
                   help="keep about the last N events (XADD MAXLEN ~ N) "
                        f"({DEFAULT_EVENTS_MAXLEN})")
    p.add_argument("--metrics", default=None, metavar="ADDR:PORT", type=_address,
                   help="serve /metrics (Prometheus), the HTTP API and the dashboard on this "
                        "address, e.g. 127.0.0.1:11301 (default: off)")
    p.add_argument("--metrics-max-tubes", type=int, default=DEFAULT_MAX_TUBES, metavar="N",
                   help="tubes with series of their own per metric; the others are summed "
                        f"under tube=\"~other\" ({DEFAULT_MAX_TUBES})")
    p.add_argument("--slow-ms", type=int, default=None, metavar="MS",
                   help="log a command whose reply took this long (reserves excepted); "
                        f"0: never (default: {DEFAULT_SLOW_MS} with --metrics, else 0: timing "
                        "every command costs a little CPU)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="console", choices=["console", "json"],
                   help="one line per event: key=value text (console) or a JSON object")
    args = p.parse_args(argv)
    if not 0 < args.max_job_size <= 1 << 30:
        p.error("-z must be between 1 and 1073741824")
    if args.max_in_flight < 1:
        p.error("--max-in-flight must be at least 1")
    if args.max_client_buffer < 64 * 1024:
        p.error("--max-client-buffer must be at least 65536 (the transport's high-water mark)")
    if args.events_maxlen < 1:
        p.error("--events-maxlen must be at least 1 (--events off writes no events)")
    if args.metrics_max_tubes < 1:
        p.error("--metrics-max-tubes must be at least 1")
    if args.slow_ms is None:
        args.slow_ms = DEFAULT_SLOW_MS if args.metrics else 0
    elif args.slow_ms < 0:
        p.error("--slow-ms must be 0 (off) or more")
    return args


def _address(text: str) -> tuple[str, int]:
    """ADDR:PORT (the port may be 0: any free one)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT")
    return host.strip("[]"), int(port)


def events_maxlen(args: argparse.Namespace) -> int:
    """The stream cap the server gets: 0 (off) unless events are on, by flag or by default
    (on with the private redis-server, off with --redis)."""
    on = args.events == "on" if args.events is not None else args.redis_url is None
    return args.events_maxlen if on else 0


def configure_logging(level: str, fmt: str = "console") -> None:
    """Log lines to stderr, one per event: ``console`` is ``timestamp [level] event key=value``,
    ``json`` one JSON object per line (``timestamp``, ``level``, ``event`` and the event's own
    keys). Exceptions are rendered into the line (JSON: an ``exception`` string)."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper("iso", utc=True),
                    structlog.processors.format_exc_info, renderer]
        if fmt == "json" else
        [structlog.processors.add_log_level, structlog.processors.TimeStamper("iso"),
         renderer],
    )


async def supervise(redis: RedisProcess) -> None:
    """Restart the private redis-server if it dies; its AOF keeps the jobs."""
    while True:
        await asyncio.sleep(SUPERVISE_PERIOD_S)
        if not redis.alive():
            log.warning("private redis-server died, restarting", port=redis.port)
            await asyncio.to_thread(redis.start)


async def serve(args: argparse.Namespace) -> None:
    redis: RedisProcess | None = None
    url = args.redis_url
    if url is None:
        redis = RedisProcess(args.data_dir or default_data_dir(), persistent=True)
        await asyncio.to_thread(redis.start)
        url = redis.url
        log.info("private redis-server started", url=url, data_dir=str(redis.data_dir))
    server = Server(Config(host=args.host, port=args.port, redis_url=url, prefix=args.prefix,
                           max_job_size=args.max_job_size, max_in_flight=args.max_in_flight,
                           max_client_buffer=args.max_client_buffer,
                           events_maxlen=events_maxlen(args),
                           http_host=args.metrics[0] if args.metrics else None,
                           http_port=args.metrics[1] if args.metrics else 0,
                           metrics_max_tubes=args.metrics_max_tubes, slow_ms=args.slow_ms))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, server.drain)
    supervisor = asyncio.create_task(supervise(redis)) if redis is not None else None
    try:
        await server.start()
        await stop.wait()
        log.info("shutting down")
        await server.stop()
    finally:
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        if redis is not None:
            await asyncio.to_thread(redis.stop)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args))
    except RedisNotInstalled as exc:
        print(f"tubeq: {exc}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:
        print(f"tubeq: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
