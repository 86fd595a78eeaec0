"""The tubeq process: listener, shared context, scheduler, subscriber, drain and shutdown.

Shutdown goes in phases: stop accepting, close every client connection (each one's reserved
jobs go back to ready through disconnect.lua), wait for that with a bound, stop the scheduler and
the subscriber, leave the namespace, close Redis. Drain mode (SIGUSR1, as in beanstalkd) makes
every later put answer DRAINING; it cannot be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from tubeq.connection import (
    DEFAULT_MAX_CLIENT_BUFFER,
    DEFAULT_MAX_IN_FLIGHT,
    Connection,
    ServerContext,
)
from tubeq.keys import Keys
from tubeq.metrics import DEFAULT_MAX_TUBES, Metrics
from tubeq.resp import RedisClient
from tubeq.scheduler import Scheduler
from tubeq.stats import CommandCounters, ServerIdentity
from tubeq.store import Store
from tubeq.subscriber import Subscriber
from tubeq.using import UseLedger
from tubeq.waiters import WaiterRegistry

if TYPE_CHECKING:
    from tubeq.http import HttpListener

log = structlog.get_logger(__name__)

# beanstalkd's -z default: the largest job body, in bytes.
DEFAULT_MAX_JOB_SIZE = 65535
# The Redis client sends its buffer once this many calls are waiting in it (else at the end of
# the loop tick). Measured on the 2-core box with 64 connections x 16 in flight: 64 carried
# 66k puts/s against 34-47k with 16, by cutting the write syscalls per call.
REDIS_BATCH_CALLS = 64
# The listen queue: connections the kernel completes before tubeq accepts them. asyncio's
# default (100) overflowed when thousands of clients connected at once (a SYN dropped is retried
# by the client after 1 s); 1024 is beanstalkd's.
LISTEN_BACKLOG = 1024
# How long shutdown waits for connections to hand their jobs back before it stops waiting.
SHUTDOWN_GRACE_S = 5.0
# The lifecycle event stream's cap (XADD MAXLEN ~) unless --events-maxlen says otherwise: the
# life of ~200k jobs (put, reserved, deleted and the odd release: ~5 events each), about 70 MB
# of Redis memory at ~70 bytes per 11-field entry (measured with MEMORY USAGE, protocol.md).
DEFAULT_EVENTS_MAXLEN = 1_000_000


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 11300
    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "tubeq"
    max_job_size: int = DEFAULT_MAX_JOB_SIZE
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_client_buffer: int = DEFAULT_MAX_CLIENT_BUFFER
    # Lifecycle events (tubeq.events) go to the namespace's stream, capped at about this many
    # entries; 0 writes none. Off unless asked: a shared Redis's memory belongs to someone else
    # (the command line turns them on for its private redis-server).
    events_maxlen: int = 0
    # The HTTP listener (/metrics, the HTTP API, the dashboard): off unless a host is given;
    # port 0 picks a free one (Server.http_port tells which).
    http_host: str | None = None
    http_port: int = 0
    # Tube labels per metric family (tubeq.metrics); commands slower than this are logged
    # (0: never; timing every command costs CPU, so the command line sets it with --metrics).
    metrics_max_tubes: int = DEFAULT_MAX_TUBES
    slow_ms: int = 0


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.keys = Keys(config.prefix)
        self.instance_id = secrets.token_hex(6)
        self._listener: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.ctx: ServerContext | None = None
        self._client: RedisClient | None = None
        self._subscriber: Subscriber | None = None
        self.metrics: Metrics | None = None
        self._http: HttpListener | None = None

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        assert self._listener is not None
        return int(self._listener.sockets[0].getsockname()[1])

    @property
    def http_port(self) -> int:
        """The HTTP listener's bound port."""
        assert self._http is not None
        return self._http.port

    async def start(self) -> None:
        config = self.config
        self._client = client = await RedisClient.connect(config.redis_url,
                                                          flush_at=REDIS_BATCH_CALLS)
        store = Store(client, self.keys, self.instance_id,
                      events_maxlen=config.events_maxlen)
        await store.load_scripts()
        await store.heartbeat()
        registry = WaiterRegistry()
        scheduler = Scheduler(store, registry)
        if config.http_host is not None:
            self.metrics = Metrics(config.metrics_max_tubes, config.slow_ms)
            store.metrics = self.metrics
            client.on_round_trip = self.metrics.redis_round_trip
            client.on_error = self.metrics.redis_error
        elif config.slow_ms > 0:  # only the slow-command line
            self.metrics = Metrics(config.metrics_max_tubes, config.slow_ms, outcomes=False)
        self.ctx = ServerContext(
            store=store, registry=registry, scheduler=scheduler,
            counters=CommandCounters(store.add_counters), using=UseLedger(store),
            identity=ServerIdentity(config.max_job_size), max_job_size=config.max_job_size,
            max_in_flight=config.max_in_flight, max_client_buffer=config.max_client_buffer,
            observer=self.metrics)

        grants = self.keys.grant_channel(self.instance_id).encode()
        connections = self.ctx.connections
        grant_listeners = self.ctx.grant_listeners

        def on_message(channel: bytes, data: bytes) -> None:
            if channel == grants:  # put.lua handed a job to one of our waiting connections
                token = data.decode()
                conn = connections.get(token)
                if conn is not None:
                    conn.job_handed_over()
                elif (listener := grant_listeners.get(token)) is not None:
                    listener()
            else:
                registry.wake_one(self.keys.tube_of_wake_channel(channel.decode()))

        self._subscriber = Subscriber(config.redis_url, on_message, registry.wake_all)
        self._subscriber.psubscribe(self.keys.wake_pattern.encode())
        self._subscriber.subscribe(grants)  # a reconnect wakes every waiter: none is missed
        await self._subscriber.start()
        self._tasks.append(asyncio.create_task(scheduler.run(), name="tubeq-scheduler"))
        ctx = self.ctx
        listening = {}
        if config.http_host is not None:  # first: a protocol port that accepts means "all up"
            from tubeq.http import HttpListener  # the one place the core reaches the HTTP layer

            self._http = HttpListener(self)
            await self._http.start(config.http_host, config.http_port)
            listening["http"] = f"{config.http_host}:{self.http_port}"
            log.info("http listening", host=config.http_host, port=self.http_port)
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: Connection(ctx), config.host, config.port, reuse_address=True,
            backlog=LISTEN_BACKLOG)
        listening["addr"] = f"{config.host}:{self.port}"
        await store.describe_instance(listening)
        log.info("listening", host=config.host, port=self.port, redis=config.redis_url,
                 prefix=config.prefix, instance=self.instance_id,
                 events=f"on, maxlen ~{config.events_maxlen}" if config.events_maxlen else "off")

    def drain(self) -> None:
        """Enter drain mode: every later put answers DRAINING."""
        if self.ctx is not None and not self.ctx.draining:
            self.ctx.draining = True
            log.info("drain mode")

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()  # its long polls end and give their jobs back first
        if self._listener is not None:
            self._listener.close()
        if self.ctx is not None:
            connections = list(self.ctx.connections.values())
            for conn in connections:
                conn.close()
            if connections:
                await asyncio.wait([asyncio.ensure_future(conn.wait_closed())
                                    for conn in connections], timeout=SHUTDOWN_GRACE_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._subscriber is not None:
            await self._subscriber.stop()
        if self.ctx is not None:
            self.ctx.counters.flush()
            self.ctx.using.flush()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ctx.store.leave(), SHUTDOWN_GRACE_S)
        if self._client is not None:
            await self._client.close()
        log.info("stopped")
