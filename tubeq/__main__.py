"""Command line: ``tubeq -l ADDR -p PORT [-z MAX_JOB_SIZE] [--redis URL] [--prefix NAME]``.

The flags are beanstalkd's, so tools that launch a beanstalkd binary can launch tubeq. Without
``--redis`` tubeq starts and supervises a private redis-server keeping its data (an append-only
file) under ``--data-dir``; it holds a lock on that directory and the redis-server dies with it
(tubeq.redis_process). SIGTERM/SIGINT shut down cleanly (drain, let connections finish their
jobs for ``--shutdown-grace`` seconds, close); SIGUSR1 enters drain mode.

Anything that keeps tubeq from starting (an unreachable Redis or sentinel, an unknown master
name, a Redis too old or one that may evict keys, a data directory in use) is one line on
stderr and a non-zero exit, never a traceback.
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
from tubeq.durability import StartupError
from tubeq.redis_process import DataDirLock, RedisNotInstalled, RedisProcess, stop_orphan
from tubeq.resp import Endpoint
from tubeq.server import (
    DEFAULT_EVENTS_MAXLEN,
    DEFAULT_MAX_JOB_SIZE,
    SHUTDOWN_GRACE_S,
    Config,
    Server,
)

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
                   help="Redis URL, e.g. redis://127.0.0.1:6379/0, or Sentinel: "
                        "redis+sentinel://h1:26379,h2:26379/mymaster[/db] (default: a "
                        "private redis-server started by tubeq)")
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
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--min-replicas", type=int, default=0, metavar="N",
                   help="answer a put (INSERTED) or any other acknowledged state change only "
                        "once N replicas have it (Redis WAIT); else INTERNAL_ERROR (0: do not "
                        "wait)")
    p.add_argument("--min-replicas-timeout", type=int, default=1000, metavar="MS",
                   help="how long --min-replicas waits for the replicas (1000)")
    p.add_argument("--allow-eviction", action="store_true",
                   help="start even if Redis's maxmemory-policy may evict keys (and lose jobs)")
    p.add_argument("--shutdown-grace", type=float, default=SHUTDOWN_GRACE_S, metavar="S",
                   help="on SIGTERM, how long connections holding jobs get to finish them "
                        f"before they are closed and their jobs return to ready "
                        f"({SHUTDOWN_GRACE_S:g})")
    args = p.parse_args(argv)
    if not 0 < args.max_job_size <= 1 << 30:
        p.error("-z must be between 1 and 1073741824")
    if args.max_in_flight < 1:
        p.error("--max-in-flight must be at least 1")
    if args.max_client_buffer < 64 * 1024:
        p.error("--max-client-buffer must be at least 65536 (the transport's high-water mark)")
    if args.events_maxlen < 1:
        p.error("--events-maxlen must be at least 1 (--events off writes no events)")
    if args.min_replicas < 0 or args.min_replicas_timeout < 0:
        p.error("--min-replicas and --min-replicas-timeout must not be negative")
    if args.shutdown_grace < 0:
        p.error("--shutdown-grace must not be negative")
    if args.redis_url is not None:
        try:
            Endpoint.parse(args.redis_url)
        except ValueError as error:
            p.error(f"--redis: {error}")
    return args


def events_maxlen(args: argparse.Namespace) -> int:
    """The stream cap the server gets: 0 (off) unless events are on, by flag or by default
    (on with the private redis-server, off with --redis)."""
    on = args.events == "on" if args.events is not None else args.redis_url is None
    return args.events_maxlen if on else 0


def configure_logging(level: str) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper("iso"),
                    structlog.dev.ConsoleRenderer(colors=False)],
    )


async def supervise(redis: RedisProcess) -> None:
    """Restart the private redis-server if it dies; its AOF keeps the jobs."""
    while True:
        await asyncio.sleep(SUPERVISE_PERIOD_S)
        if not redis.alive():
            log.warning("private redis-server died, restarting", port=redis.port)
            redis.spawn()  # from this (the main) thread: the child dies with it
            await asyncio.to_thread(redis.wait_ready)


async def start_private_redis(redis: RedisProcess, lock: DataDirLock) -> None:
    """Lock the data dir, stop an orphaned redis-server of it, start ours (tubeq.redis_process)."""
    lock.acquire()
    orphan = await asyncio.to_thread(stop_orphan, redis.data_dir)
    if orphan is not None:
        log.warning("stopped a redis-server left running on the data dir by an earlier tubeq",
                    pid=orphan, data_dir=str(redis.data_dir))
    redis.spawn()  # from the main thread: the child gets SIGTERM when it dies
    try:
        await asyncio.to_thread(redis.wait_ready)
    except RuntimeError as error:
        raise StartupError(f"the private redis-server did not start: {error}") from None
    log.info("private redis-server started", url=redis.url, data_dir=str(redis.data_dir),
             pid=redis.proc.pid if redis.proc else None)


async def serve(args: argparse.Namespace) -> None:
    redis: RedisProcess | None = None
    lock: DataDirLock | None = None
    url = args.redis_url
    try:
        if url is None:
            redis = RedisProcess(args.data_dir or default_data_dir(), persistent=True,
                                 die_with_parent=True)
            lock = DataDirLock(redis.data_dir)
            await start_private_redis(redis, lock)
            url = redis.url
        await serve_on(args, url, redis)
    finally:
        if redis is not None:
            await asyncio.to_thread(redis.stop)
        if lock is not None:
            lock.release()


async def serve_on(args: argparse.Namespace, url: str, redis: RedisProcess | None) -> None:
    server = Server(Config(host=args.host, port=args.port, redis_url=url, prefix=args.prefix,
                           max_job_size=args.max_job_size, max_in_flight=args.max_in_flight,
                           max_client_buffer=args.max_client_buffer,
                           events_maxlen=events_maxlen(args), min_replicas=args.min_replicas,
                           min_replicas_timeout_ms=args.min_replicas_timeout,
                           allow_eviction=args.allow_eviction,
                           shutdown_grace_s=args.shutdown_grace))
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging(args.log_level)
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
    except StartupError as exc:
        print(f"tubeq: {exc}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:
        print(f"tubeq: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
