"""The tubeq process: listener, shared context, scheduler, subscriber, drain and shutdown.

Shutdown goes in phases: drain (every later put answers DRAINING) and stop accepting; give the
connections up to ``shutdown_grace_s`` to finish the jobs they hold (delete, release, bury: a
worker finishes its job instead of having it run twice); close every client connection (each
one's reserved jobs go back to ready through disconnect.lua), wait for that with a bound, stop the
scheduler and the subscriber, leave the namespace, close Redis. Drain mode (SIGUSR1, as in
beanstalkd) makes every later put answer DRAINING; it cannot be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass

import structlog

from tubeq.connection import (
    DEFAULT_MAX_CLIENT_BUFFER,
    DEFAULT_MAX_IN_FLIGHT,
    Connection,
    ServerContext,
)
from tubeq.durability import StartupError, check_redis
from tubeq.keys import Keys
from tubeq.resp import RedisClient, RedisReplyError
from tubeq.scheduler import Scheduler
from tubeq.sentinel import MasterNotFound
from tubeq.stats import CommandCounters, ServerIdentity
from tubeq.store import Store
from tubeq.subscriber import Subscriber
from tubeq.using import UseLedger
from tubeq.waiters import WaiterRegistry

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
# While connections finish their jobs at shutdown, how often tubeq looks whether any still holds
# one. A poll, not an event: it runs only during the grace period, and 50 ms is well below any
# grace worth setting.
SHUTDOWN_POLL_S = 0.05
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
    # Replicas that must acknowledge a state change before its reply (WAIT), and for how long
    # to wait for them (tubeq.resp: "Replica acknowledgement"); 0 waits for none.
    min_replicas: int = 0
    min_replicas_timeout_ms: int = 1000
    # Start on a Redis whose maxmemory-policy may evict keys (tubeq.durability).
    allow_eviction: bool = False
    # At shutdown, how long connections that hold reserved jobs get to finish them before they
    # are closed (their jobs then return to ready). The command line's default is 5 s;
    # embedded servers (the tests) close at once unless told otherwise.
    shutdown_grace_s: float = 0.0


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

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        assert self._listener is not None
        return int(self._listener.sockets[0].getsockname()[1])

    async def start(self) -> None:
        config = self.config
        try:
            self._client = client = await RedisClient.connect(
                config.redis_url, flush_at=REDIS_BATCH_CALLS, min_replicas=config.min_replicas,
                replicas_timeout_ms=config.min_replicas_timeout_ms)
        except MasterNotFound as error:
            raise StartupError(f"no Redis master: {error}") from None
        except (OSError, RedisReplyError) as error:
            raise StartupError(f"cannot connect to Redis at {config.redis_url}: "
                               f"{str(error) or type(error).__name__}") from None
        try:
            await check_redis(client, client.address or config.redis_url,
                              allow_eviction=config.allow_eviction,
                              min_replicas=config.min_replicas)
        except BaseException:
            await client.close()
            raise
        store = Store(client, self.keys, self.instance_id,
                      events_maxlen=config.events_maxlen)
        await store.load_scripts()
        await store.heartbeat()
        registry = WaiterRegistry()
        # After a reconnect (a Redis restart, a failover) every waiter re-checks with its
        # script, whether or not the subscriber's connection was lost too.
        client.add_reconnect_callback(registry.wake_all)
        scheduler = Scheduler(store, registry)
        self.ctx = ServerContext(
            store=store, registry=registry, scheduler=scheduler,
            counters=CommandCounters(store.add_counters), using=UseLedger(store),
            identity=ServerIdentity(config.max_job_size), max_job_size=config.max_job_size,
            max_in_flight=config.max_in_flight, max_client_buffer=config.max_client_buffer)

        grants = self.keys.grant_channel(self.instance_id).encode()
        connections = self.ctx.connections

        def on_message(channel: bytes, data: bytes) -> None:
            if channel == grants:  # put.lua handed a job to one of our waiting connections
                conn = connections.get(data.decode())
                if conn is not None:
                    conn.job_handed_over()
            else:
                registry.wake_one(self.keys.tube_of_wake_channel(channel.decode()))

        self._subscriber = Subscriber(config.redis_url, on_message, registry.wake_all)
        self._subscriber.psubscribe(self.keys.wake_pattern.encode())
        self._subscriber.subscribe(grants)  # a reconnect wakes every waiter: none is missed
        await self._subscriber.start()
        # After a failover the pub/sub connection follows the client to the new master.
        subscriber = self._subscriber
        client.add_reconnect_callback(lambda: subscriber.follow(client.address))
        self._tasks.append(asyncio.create_task(scheduler.run(), name="tubeq-scheduler"))
        ctx = self.ctx
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: Connection(ctx), config.host, config.port, reuse_address=True,
            backlog=LISTEN_BACKLOG)
        log.info("listening", host=config.host, port=self.port, redis=config.redis_url,
                 prefix=config.prefix, instance=self.instance_id,
                 events=f"on, maxlen ~{config.events_maxlen}" if config.events_maxlen else "off")

    def drain(self) -> None:
        """Enter drain mode: every later put answers DRAINING."""
        if self.ctx is not None and not self.ctx.draining:
            self.ctx.draining = True
            log.info("drain mode")

    async def stop(self) -> None:
        self.drain()
        if self._listener is not None:
            self._listener.close()
        if self.ctx is not None:
            await self._let_jobs_finish(self.ctx, self.config.shutdown_grace_s)
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

    @staticmethod
    async def _let_jobs_finish(ctx: ServerContext, grace_s: float) -> None:
        """Wait until no connection holds a reserved job, or ``grace_s`` has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s

        def holders() -> int:
            now = ctx.store.clock()
            return sum(any(due > now for due in conn.reserved.values())
                       for conn in ctx.connections.values())

        if grace_s > 0 and holders():
            log.info("waiting for connections to finish their jobs", connections=holders(),
                     grace_s=grace_s)
        while grace_s > 0 and holders() and loop.time() < deadline:
            await asyncio.sleep(SHUTDOWN_POLL_S)
        if holders():
            log.info("closing connections that still hold jobs: they return to ready",
                     connections=holders())
