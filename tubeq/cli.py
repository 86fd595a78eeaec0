"""Command line: ``tubeq -l ADDR -p PORT [-z MAX_JOB_SIZE] [--redis URL] [--prefix NAME]``.

``--metrics ADDR:PORT`` opens the HTTP listener (/metrics, the HTTP API, the dashboard);
``--log-format json|console`` picks the log lines' shape (README, "Operating tubeq").

The flags are beanstalkd's, so tools that launch a beanstalkd binary can launch tubeq. Without
``--redis`` tubeq starts and supervises a private redis-server keeping its data (an append-only
file) under ``--data-dir``; it holds a lock on that directory and the redis-server dies with it
(tubeq.redisio.process). SIGTERM/SIGINT shut down cleanly (drain, let connections finish their
jobs for ``--shutdown-grace`` seconds, close); SIGUSR1 enters drain mode.

Anything that keeps tubeq from starting (an unreachable Redis or sentinel, an unknown master
name, a Redis too old or one that may evict keys, a data directory in use) is one line on
stderr in the ``--log-format`` (``tubeq: ...``, or a JSON object) and a non-zero exit, never a
traceback.

This module is the composition root: the one place that puts the server and the HTTP listener
together (the server imports nothing of tubeq.http; pyproject.toml's import contracts say so).
It is entered through tubeq.__main__, which binds the protocol socket and holds the signals
before importing it (listen first: this module's imports take a few hundred milliseconds). The
client's command, ``tubeq-cli``, is tubeq.client.cli.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import structlog

from tubeq import __version__
from tubeq.model.options import MAX_MS
from tubeq.protocol.limits import DEFAULT_MAX_JOB_SIZE
from tubeq.redisio.checks import StartupError
from tubeq.redisio.client import DEFAULT_CALL_TIMEOUT, Endpoint
from tubeq.redisio.cluster import DEFAULT_CLUSTER_SHARDS, ClusterSeeds, is_cluster_url
from tubeq.redisio.process import DataDirLock, RedisNotInstalled, RedisProcess, stop_orphan
from tubeq.server.access import AccessConfig, AccessFileError
from tubeq.server.access import load as load_access
from tubeq.server.context import (
    DEFAULT_MAX_CLIENT_BUFFER,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_WATCH,
    DEFAULT_RESULT_TTL_MS,
)
from tubeq.server.idle_poll import (
    DEFAULT_IDLE_POLL_US,
    MAX_IDLE_POLL_US,
    default_window_us,
)
from tubeq.server.listeners import (
    DEFAULT_TLS_HANDSHAKE_TIMEOUT_S,
    ListenError,
    Prebound,
    TlsFiles,
)
from tubeq.server.metrics import DEFAULT_MAX_TUBES, DEFAULT_SLOW_MS
from tubeq.server.process import (
    DEFAULT_EVENTS_MAXLEN,
    DEFAULT_HTTP_BODY_TIMEOUT_S,
    DEFAULT_HTTP_HEADER_TIMEOUT_S,
    DEFAULT_HTTP_IDLE_TIMEOUT_S,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    SHUTDOWN_GRACE_S,
    Config,
    HttpFront,
    Server,
)
from tubeq.server.workers import WorkerPool
from tubeq.store.keys import LAYOUT_VERSION
from tubeq.store.shards import MAX_SHARDS

log = structlog.get_logger("tubeq")

# How often the supervisor checks that the private redis-server is still running.
SUPERVISE_PERIOD_S = 1.0


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tubeq"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tubeq", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version",
                   version=f"tubeq {__version__} (data layout {LAYOUT_VERSION})")
    p.add_argument("-l", dest="host", default="127.0.0.1",
                   help="listen address (127.0.0.1), or unix:/path for a Unix socket; a socket "
                        "passed by systemd (LISTEN_FDS) wins over both")
    p.add_argument("-p", dest="port", type=int, default=11300, help="listen port (11300)")
    p.add_argument("-z", dest="max_job_size", type=int, default=DEFAULT_MAX_JOB_SIZE,
                   help=f"maximum job size in bytes ({DEFAULT_MAX_JOB_SIZE})")
    p.add_argument("--redis", dest="redis_url", default=None,
                   help="Redis URL, e.g. redis://127.0.0.1:6379/0, or Sentinel: "
                        "redis+sentinel://h1:26379,h2:26379/mymaster[/db], or a Redis Cluster's "
                        "seeds: redis+cluster://h1:7000,h2:7001 (default: a private "
                        "redis-server started by tubeq)")
    p.add_argument("--prefix", default="tubeq",
                   help="key namespace: processes with the same Redis and prefix share tubes")
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="split the namespace's tubes over N Redis hash tags (N slots of a "
                        "Redis Cluster); every process of a namespace must use the same N "
                        f"(default: 1, or {DEFAULT_CLUSTER_SHARDS} on a Redis Cluster)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where the private redis-server keeps its data "
                        "(default: $XDG_DATA_HOME/tubeq)")
    p.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT, metavar="N",
                   help="unanswered commands per connection before tubeq stops reading it "
                        f"({DEFAULT_MAX_IN_FLIGHT})")
    p.add_argument("--max-watch", type=int, default=DEFAULT_MAX_WATCH, metavar="N",
                   help="tubes one connection may watch; a watch past it answers OUT_OF_MEMORY "
                        f"(0: no limit; {DEFAULT_MAX_WATCH})")
    p.add_argument("--max-result-size", type=int, default=None, metavar="BYTES",
                   help="the largest result finish takes; a larger one answers JOB_TOO_BIG "
                        "(at most -z, which is the default)")
    p.add_argument("--result-ttl", type=float, default=DEFAULT_RESULT_TTL_MS / 1000,
                   metavar="SECONDS",
                   help="how long a job's end (finish's result) is kept for wait "
                        f"({DEFAULT_RESULT_TTL_MS // 1000})")
    p.add_argument("--max-client-buffer", type=int, default=DEFAULT_MAX_CLIENT_BUFFER,
                   metavar="BYTES",
                   help="unsent replies plus unparsed input one connection may hold before it "
                        f"is closed ({DEFAULT_MAX_CLIENT_BUFFER})")
    p.add_argument("--events", choices=["on", "off"], default=None,
                   help="write every job's lifecycle events to the Redis stream "
                        "{prefix}:events (default: on with the private redis-server, off with "
                        "--redis: a shared Redis's memory belongs to someone else)")
    p.add_argument("--events-maxlen", type=int, default=DEFAULT_EVENTS_MAXLEN, metavar="N",
                   help="keep about the last N events (XTRIM MAXLEN ~ N once a second) "
                        f"({DEFAULT_EVENTS_MAXLEN})")
    p.add_argument("--redis-functions", choices=["on", "off"], default="on",
                   help="call the Lua scripts as one Redis Functions library (FCALL; Redis 7+, "
                        "else EVALSHA anyway); off: EVALSHA (on)")
    p.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                   help="serve the protocol over TLS with this certificate (chain)")
    p.add_argument("--tls-key", type=Path, default=None, metavar="PEM",
                   help="the private key of --tls-cert")
    p.add_argument("--tls-client-ca", type=Path, default=None, metavar="PEM",
                   help="require client certificates signed by this CA (with --tls-cert)")
    p.add_argument("--tls-handshake-timeout", type=float,
                   default=DEFAULT_TLS_HANDSHAKE_TIMEOUT_S, metavar="SECONDS",
                   help="drop a TLS client that has not finished its handshake this long after "
                        f"connecting ({DEFAULT_TLS_HANDSHAKE_TIMEOUT_S:g})")
    p.add_argument("--max-connections", type=int, default=0, metavar="N",
                   help="accept at most N connections at once; more get TOO_MANY_CONNECTIONS "
                        "and are closed (0: no limit)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N server processes on the port (SO_REUSEPORT), kept running by "
                        "this one (1)")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind the port with SO_REUSEPORT (what --workers gives each worker)")
    p.add_argument("--auth", type=Path, default=None, metavar="FILE",
                   help="require `auth <token>`: tokens, namespaces and namespace-bound "
                        "listeners from this TOML file (README, Authentication)")
    p.add_argument("--metrics", default=None, metavar="ADDR:PORT", type=_address,
                   help="serve /metrics (Prometheus), the HTTP API and the dashboard on this "
                        "address, e.g. 127.0.0.1:11301 (default: off)")
    p.add_argument("--metrics-max-tubes", type=int, default=DEFAULT_MAX_TUBES, metavar="N",
                   help="tubes with series of their own per metric; the others are summed "
                        f"under tube=\"~other\" ({DEFAULT_MAX_TUBES})")
    p.add_argument("--otel-endpoint", default=None, metavar="URL",
                   help="export OpenTelemetry spans of the jobs put with a traceparent over "
                        "OTLP/HTTP to this collector (its base URL, e.g. http://127.0.0.1:4318; "
                        "traces go to URL/v1/traces); the OTEL_EXPORTER_OTLP_* variables turn "
                        "it on too (default: off; needs tubeq[otel])")
    p.add_argument("--max-jobs", type=int, default=0, metavar="N",
                   help="the most jobs a namespace may hold, every state together; past it "
                        "puts answer OUT_OF_MEMORY (counted once a second; 0: no cap)")
    p.add_argument("--http-rate", type=int, default=0, metavar="N",
                   help="HTTP API requests per second per client (its token, else its address); "
                        "past it 429 (0: no limit)")
    p.add_argument("--http-max-connections", type=int, default=DEFAULT_HTTP_MAX_CONNECTIONS,
                   metavar="N",
                   help="HTTP connections open at once, beside --max-connections; one more is "
                        f"answered 503 and closed (0: no limit) ({DEFAULT_HTTP_MAX_CONNECTIONS})")
    p.add_argument("--http-header-timeout", type=float, default=DEFAULT_HTTP_HEADER_TIMEOUT_S,
                   metavar="S",
                   help="close an HTTP connection (408) whose request line and headers have "
                        "not all arrived S seconds after the request's first byte "
                        f"({DEFAULT_HTTP_HEADER_TIMEOUT_S:g})")
    p.add_argument("--http-body-timeout", type=float, default=DEFAULT_HTTP_BODY_TIMEOUT_S,
                   metavar="S",
                   help="answer 408 and close an HTTP connection whose request body has not "
                        "all arrived S seconds after its headers "
                        f"({DEFAULT_HTTP_BODY_TIMEOUT_S:g})")
    p.add_argument("--http-idle-timeout", type=float, default=DEFAULT_HTTP_IDLE_TIMEOUT_S,
                   metavar="S",
                   help="close an HTTP connection with no request under way for S seconds "
                        f"(keep-alive) ({DEFAULT_HTTP_IDLE_TIMEOUT_S:g})")
    p.add_argument("--slow-ms", type=int, default=None, metavar="MS",
                   help="log a command whose reply took this long (reserves excepted); "
                        f"0: never (default: {DEFAULT_SLOW_MS} with --metrics, else 0: timing "
                        "every command costs a little CPU)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="console", choices=["console", "json"],
                   help="one line per event: key=value text (console) or a JSON object")
    p.add_argument("--extra-keys", choices=["extended", "always"], default="extended",
                   help="who sees tubeq's extra stats-tube/stats-job keys: connections that "
                        "sent an extension command (extended), or every connection (always: "
                        "for monitoring tools that cannot send one)")
    p.add_argument("--min-replicas", type=int, default=0, metavar="N",
                   help="answer a put (INSERTED) or any other acknowledged state change only "
                        "once N replicas have it (Redis WAIT); else INTERNAL_ERROR (0: do not "
                        "wait)")
    p.add_argument("--min-replicas-timeout", type=int, default=1000, metavar="MS",
                   help="how long --min-replicas waits for the replicas (1000)")
    p.add_argument("--redis-timeout", type=float, default=DEFAULT_CALL_TIMEOUT, metavar="S",
                   help="a command whose Redis call is not answered within S seconds answers "
                        "INTERNAL_ERROR (it may or may not have run); the Redis connection is "
                        f"then re-opened; 0: wait for ever ({DEFAULT_CALL_TIMEOUT:g})")
    p.add_argument("--allow-eviction", action="store_true",
                   help="start even if Redis's maxmemory-policy may evict keys (and lose jobs)")
    p.add_argument("--shutdown-grace", type=float, default=SHUTDOWN_GRACE_S, metavar="S",
                   help="on SIGTERM, how long connections holding jobs get to finish them "
                        f"before they are closed and their jobs return to ready "
                        f"({SHUTDOWN_GRACE_S:g})")
    p.add_argument("--idle-poll-us", type=int, default=None, metavar="US",
                   help="after input, poll the sockets this long before sleeping: lower "
                        "latency for a request/reply, at most that much CPU per input "
                        f"(0: sleep at once; default {DEFAULT_IDLE_POLL_US}, or 0 where the "
                        "cgroup's quota or the CPU affinity gives each process less than a "
                        "core)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --workers passes on
    if not 0 < args.max_job_size <= 1 << 30:
        p.error("-z must be between 1 and 1073741824")
    if args.max_in_flight < 1:
        p.error("--max-in-flight must be at least 1")
    if args.max_watch < 0:
        p.error("--max-watch must be 0 (no limit) or more")
    if args.max_result_size is None:
        args.max_result_size = args.max_job_size
    if not 0 <= args.max_result_size <= args.max_job_size:
        p.error("--max-result-size must be between 0 and the job size limit (-z)")
    if not 0.001 <= args.result_ttl <= MAX_MS / 1000:
        p.error("--result-ttl must be between 0.001 and 4294967295 seconds")
    if args.max_client_buffer < 64 * 1024:
        p.error("--max-client-buffer must be at least 65536 (the transport's high-water mark)")
    if args.events_maxlen < 1:
        p.error("--events-maxlen must be at least 1 (--events off writes no events)")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.shards is None:
        cluster = args.redis_url is not None and is_cluster_url(args.redis_url)
        args.shards = DEFAULT_CLUSTER_SHARDS if cluster else 1
    if not 1 <= args.shards <= MAX_SHARDS:
        p.error(f"--shards must be between 1 and {MAX_SHARDS}")
    if args.workers > 1 and (args.port == 0 or args.host.startswith("unix:")):
        p.error("--workers needs a TCP port (-p, not 0): the workers share it with SO_REUSEPORT")
    if args.max_connections < 0:
        p.error("--max-connections must be 0 (no limit) or positive")
    if (args.tls_cert is None) != (args.tls_key is None):
        p.error("--tls-cert and --tls-key go together")
    if not 0 < args.tls_handshake_timeout <= 3600:
        p.error("--tls-handshake-timeout must be more than 0 and at most 3600 seconds")
    if args.tls_client_ca is not None and args.tls_cert is None:
        p.error("--tls-client-ca needs --tls-cert and --tls-key")
    if args.metrics_max_tubes < 1:
        p.error("--metrics-max-tubes must be at least 1")
    if args.max_jobs < 0:
        p.error("--max-jobs must be 0 (no cap) or positive")
    if args.http_rate < 0:
        p.error("--http-rate must be 0 (no limit) or positive")
    if args.http_max_connections < 0:
        p.error("--http-max-connections must be 0 (no limit) or positive")
    for flag in ("header", "body", "idle"):
        if not 0 < getattr(args, f"http_{flag}_timeout") <= 3600:
            p.error(f"--http-{flag}-timeout must be more than 0 and at most 3600 seconds")
    if args.slow_ms is None:
        args.slow_ms = DEFAULT_SLOW_MS if args.metrics else 0
    elif args.slow_ms < 0:
        p.error("--slow-ms must be 0 (off) or more")
    if args.workers > 1 and args.metrics is not None and args.metrics[1] == 0:
        p.error("--workers needs a fixed --metrics port (each worker serves it with SO_REUSEPORT)")
    if args.min_replicas < 0 or args.min_replicas_timeout < 0:
        p.error("--min-replicas and --min-replicas-timeout must not be negative")
    if args.shutdown_grace < 0:
        p.error("--shutdown-grace must not be negative")
    if args.redis_timeout < 0:
        p.error("--redis-timeout must be 0 (no bound) or more")
    if args.idle_poll_us is None:
        args.idle_poll_us = default_window_us(args.workers)
    if not 0 <= args.idle_poll_us <= MAX_IDLE_POLL_US:
        p.error(f"--idle-poll-us must be between 0 (off) and {MAX_IDLE_POLL_US}")
    if args.redis_url is not None:
        try:
            if is_cluster_url(args.redis_url):
                ClusterSeeds.parse(args.redis_url)
            else:
                Endpoint.parse(args.redis_url)
        except ValueError as error:
            p.error(f"--redis: {error}")
    return args


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    if args.tls_cert is None:
        return None
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)


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
            redis.spawn()  # from this (the main) thread: the child dies with it
            await asyncio.to_thread(redis.wait_ready)


async def start_private_redis(redis: RedisProcess, lock: DataDirLock) -> None:
    """Lock the data dir, stop an orphaned redis-server of it, start ours (redisio.process)."""
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


async def serve(args: argparse.Namespace, prebound: Prebound | None = None,
                held_signals: Sequence[int] = ()) -> None:
    """Run the server (or --workers' supervisor) until SIGTERM/SIGINT. ``prebound``: the
    protocol socket, listening already; ``held_signals``: those that came before the event
    loop could take them (tubeq.__main__), acted on once it runs."""
    access = load_access(args.auth) if args.auth is not None else None  # before any start
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
        if args.workers > 1:
            await run_workers(args, url, redis, held_signals)
        else:
            await serve_on(args, url, redis, access, prebound, held_signals)
    finally:
        if redis is not None:
            await asyncio.to_thread(redis.stop)
        if lock is not None:
            lock.release()


def http_listener(server: Server) -> HttpFront:
    """The HTTP listener of ``--metrics``, composed here so the server never imports tubeq.http;
    imported only when asked for (aiohttp's import is not free)."""
    from tubeq.http import HttpListener

    return HttpListener(server)


async def serve_on(args: argparse.Namespace, url: str, redis: RedisProcess | None,
                   access: AccessConfig | None, prebound: Prebound | None = None,
                   held_signals: Sequence[int] = ()) -> None:
    server = Server(Config(host=args.host, port=args.port, redis_url=url, prefix=args.prefix,
                           max_job_size=args.max_job_size, max_in_flight=args.max_in_flight,
                           max_client_buffer=args.max_client_buffer, max_watch=args.max_watch,
                           result_ttl_ms=round(args.result_ttl * 1000),
                           max_result_size=args.max_result_size,
                           events_maxlen=events_maxlen(args), tls=tls_files(args),
                           tls_handshake_timeout_s=args.tls_handshake_timeout,
                           redis_functions=args.redis_functions == "on",
                           access=access, max_connections=args.max_connections,
                           reuse_port=args.reuse_port,
                           http_host=args.metrics[0] if args.metrics else None,
                           http_port=args.metrics[1] if args.metrics else 0,
                           metrics_max_tubes=args.metrics_max_tubes, slow_ms=args.slow_ms,
                           http_rate=args.http_rate, max_jobs=args.max_jobs,
                           http_max_connections=args.http_max_connections,
                           http_header_timeout_s=args.http_header_timeout,
                           http_body_timeout_s=args.http_body_timeout,
                           http_idle_timeout_s=args.http_idle_timeout,
                           extra_keys_always=args.extra_keys == "always",
                           min_replicas=args.min_replicas,
                           min_replicas_timeout_ms=args.min_replicas_timeout,
                           redis_timeout_s=args.redis_timeout,
                           allow_eviction=args.allow_eviction,
                           shutdown_grace_s=args.shutdown_grace, shards=args.shards,
                           otel_endpoint=args.otel_endpoint, idle_poll_us=args.idle_poll_us),
                    http=http_listener if args.metrics else None, prebound=prebound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, server.drain)
    supervisor = asyncio.create_task(supervise(redis)) if redis is not None else None
    for signum in held_signals:  # those that came before the loop: acted on once it is up
        (server.drain if signum == signal.SIGUSR1 else stop.set)()
    try:
        await server.start()
        settle_collector()
        await stop.wait()
        log.info("shutting down")
        await server.stop()
    finally:
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor


# The cyclic garbage collector of a serving process: its young generation is collected after
# this many allocations (CPython's default is 700: a few commands' worth, each collection
# walking the futures and buffers still in use); the older generations as CPython's.
GC_YOUNG_THRESHOLD = 20_000


def settle_collector() -> None:
    """Once started: what start-up built (modules, the scripts, the listeners) lives as long as
    the process, so no collection walks it again (gc.freeze), and the young generation is
    collected less often; a serving process allocates mostly objects that go within a request,
    freed by reference counting before any collection sees them. Measured on the request/reply
    bench (32 callers): ~5 % fewer instructions of the tubeq process per call (callgrind)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


async def run_workers(args: argparse.Namespace, url: str, redis: RedisProcess | None,
                      held_signals: Sequence[int] = ()) -> None:
    """--workers N: this process supervises N workers (and the private redis-server, if any);
    each worker gets this command line plus the Redis URL, the events setting and the idle
    poll's window it resolved (the window for N processes: a worker sees ``--workers 1``)."""
    events = "on" if events_maxlen(args) else "off"
    pool = WorkerPool([*args.argv, "--redis", url, "--events", events, "--workers", "1",
                       "--idle-poll-us", str(args.idle_poll_us), "--reuse-port"], args.workers)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: pool.signal_all(signal.SIGUSR1))
    supervisor = asyncio.create_task(supervise(redis)) if redis is not None else None
    if signal.SIGTERM in held_signals or signal.SIGINT in held_signals:
        stop.set()  # before any worker started (a SIGUSR1 then has no worker to drain)
    log.info("starting workers", workers=args.workers, port=args.port, redis=url)
    try:
        await pool.run(stop)
    finally:
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor


def main(argv: list[str] | None = None, *, prebound: Prebound | None = None,
         held_signals: Sequence[int] = ()) -> None:
    """Parse the command line and run tubeq. ``prebound`` and ``held_signals``: what
    tubeq.__main__ did before importing this module; the socket is served only if it is the
    one the parsed flags ask for, else it is closed and the server binds its own."""
    args = parse_args(argv)
    if prebound is not None and (args.workers > 1 or not prebound.matches(
            args.host, args.port, args.reuse_port)):
        prebound.close()
        prebound = None
    configure_logging(args.log_level, args.log_format)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(args, prebound, held_signals))
    except RedisNotInstalled as exc:
        cannot_start(args.log_format, str(exc), 2)
    except (StartupError, OSError, ListenError, AccessFileError) as exc:
        cannot_start(args.log_format, str(exc), 1)
    finally:
        if prebound is not None:  # not handed over: the start failed before it listened
            prebound.close()


def cannot_start(fmt: str, message: str, status: int) -> NoReturn:
    """Say why tubeq cannot start in one line of the chosen log format, and exit: ``tubeq:
    <message>`` (console), or a JSON object like every other line (event ``cannot start``,
    ``error`` the message), so a collector that parses JSON lines does not drop it."""
    if fmt == "json":
        log.error("cannot start", error=message, exit_status=status)
    else:
        print(f"tubeq: {message}", file=sys.stderr)
    sys.exit(status)
