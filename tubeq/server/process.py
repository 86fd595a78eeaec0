"""The tubeq process: listeners, one context per namespace, subscriber, drain and shutdown.

Without an access file there is one namespace, ``--prefix``. With one (``--auth``,
tubeq.server.access) every namespace it names gets its own context (store, waiters, scheduler,
counters), opened at start; all share this process's Redis connection and its one pub/sub
connection, whose messages are routed by key root. The main listener then gates its connections
until ``auth``; the file's bound listeners put theirs straight into a namespace. The HTTP
listener (``--metrics``) is the composition root's (tubeq.cli): it hands the Server a
factory (:class:`HttpFront`), and this package imports nothing of tubeq.http.

Shutdown goes in phases: drain (every later put answers DRAINING) and stop accepting; quiet the
push connections (no more jobs pushed; those that asked hear ``QUIET``); give the
connections up to ``shutdown_grace_s`` to finish the jobs they hold (delete, release, bury: a
worker finishes its job instead of having it run twice); close every client connection (each
one's reserved jobs go back to ready through disconnect.lua), wait for that with a bound, stop the
scheduler and the subscriber, leave the namespaces, close Redis. Drain mode (SIGUSR1, as in
beanstalkd) makes every later put answer DRAINING; it cannot be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from tubeq.protocol.limits import DEFAULT_MAX_JOB_SIZE
from tubeq.redisio.checks import StartupError, check_redis
from tubeq.redisio.client import (
    DEFAULT_CALL_TIMEOUT,
    RedisClient,
    RedisConnectionLost,
    RedisReplyError,
)
from tubeq.redisio.cluster import (
    ClusterSeeds,
    ClusterUnavailable,
    SlotMap,
    is_cluster_url,
    read_slot_map,
)
from tubeq.redisio.pubsub import Subscriber
from tubeq.redisio.sentinel import MasterNotFound
from tubeq.server import tracing
from tubeq.server.access import DEFAULT_NAMESPACE, AccessConfig, namespace_prefix
from tubeq.server.connection import Connection
from tubeq.server.context import (
    DEFAULT_MAX_CLIENT_BUFFER,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_WATCH,
    DEFAULT_RESULT_TTL_MS,
    Capacity,
    Gate,
    ServerContext,
)
from tubeq.server.end_waits import EndWaits, parse_ended
from tubeq.server.idle_poll import IdlePoll
from tubeq.server.listeners import (
    DEFAULT_TLS_HANDSHAKE_TIMEOUT_S,
    LISTEN_BACKLOG,
    Prebound,
    TlsFiles,
    activated_socket,
    describe,
    tls_context,
    unix_path,
    unix_socket,
)
from tubeq.server.metrics import DEFAULT_MAX_TUBES, Metrics
from tubeq.server.parents import ParentEnds
from tubeq.server.scheduler import Scheduler, ShardSchedulers
from tubeq.server.stats import CommandCounters, ServerIdentity
from tubeq.server.using import UseLedger
from tubeq.server.waiters import WaiterRegistry
from tubeq.store.base import JobStore
from tubeq.store.keys import Keys
from tubeq.store.layout import claim_layout_version, count_jobs_by_state
from tubeq.store.shards import (
    LayoutMismatch,
    ShardedStore,
    claim_layout,
    shard_prefix,
)
from tubeq.store.store import Store

log = structlog.get_logger(__name__)

# The Redis client sends its buffer once this many calls are waiting in it (else at the end of
# the loop tick). Measured on the 2-core box with 64 connections x 16 in flight: 64 carried
# 66k puts/s against 34-47k with 16, by cutting the write syscalls per call.
REDIS_BATCH_CALLS = 64
# How long shutdown waits for connections to hand their jobs back before it stops waiting.
SHUTDOWN_GRACE_S = 5.0
# While connections finish their jobs at shutdown, how often tubeq looks whether any still holds
# one. A poll, not an event: it runs only during the grace period, and 50 ms is well below any
# grace worth setting.
SHUTDOWN_POLL_S = 0.05
# On a Redis Cluster, how often tubeq looks whether a node answered MOVED or is unreachable,
# and then reads the slot map again (tubeq.redisio.cluster): how long a moved shard's commands fail.
CLUSTER_RECHECK_S = 1.0
# How often --max-jobs counts a namespace's jobs: puts may pass the cap by what arrives within
# one period (one script of O(tubes) a second is cheap; one per put would not be).
JOB_COUNT_PERIOD_S = 1.0
# The lifecycle event stream's cap (XTRIM MAXLEN ~ once a second) unless --events-maxlen says
# otherwise: the life of ~200k jobs (put, reserved, deleted and the odd release: ~5 events
# each), about 70 MB of Redis memory at ~70 bytes per 11-field entry (measured with MEMORY
# USAGE, protocol.md).
DEFAULT_EVENTS_MAXLEN = 1_000_000
# The HTTP listener's bounds (tubeq.http.limits), the command line's defaults too. Connections
# at once: beside --max-connections, not within it, so idle HTTP sockets, which need no token,
# cannot use up the protocol port's room; 256 serves a dashboard, a scraper and a pool of
# long-polling consumers, and bounds the descriptors the port can take.
DEFAULT_HTTP_MAX_CONNECTIONS = 256
# A request's line and headers arrive in one or two packets: 10 s is a very slow link's worth,
# and what a client that trickles its headers holds a connection for.
DEFAULT_HTTP_HEADER_TIMEOUT_S = 10.0
# The whole body after the headers: the largest JSON put at the default -z (6 x 64 KiB + 4 KiB)
# needs 13 kB/s to arrive in 30 s; raise it with -z on slow links.
DEFAULT_HTTP_BODY_TIMEOUT_S = 30.0
# An open connection with no request under way: long enough to be reused by a dashboard (one
# call a second) and a 15 s scrape, short enough that idle sockets come back.
DEFAULT_HTTP_IDLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 11300
    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "tubeq"
    max_job_size: int = DEFAULT_MAX_JOB_SIZE
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_client_buffer: int = DEFAULT_MAX_CLIENT_BUFFER
    max_watch: int = DEFAULT_MAX_WATCH  # tubes one connection may watch; 0: no limit
    result_ttl_ms: int = DEFAULT_RESULT_TTL_MS  # how long a job's end is kept for wait
    max_result_size: int | None = None  # the largest result finish takes (None: max_job_size)
    # Lifecycle events (tubeq.model.events) go to the namespace's stream, capped at about this many
    # entries; 0 writes none. Off unless asked: a shared Redis's memory belongs to someone else
    # (the command line turns them on for its private redis-server).
    events_maxlen: int = 0
    # Call the Lua scripts as one Redis Functions library (FCALL) where Redis has Functions
    # (7.0+); False, or an older Redis: EVALSHA (tubeq.store.scripts).
    redis_functions: bool = True
    # TLS for the protocol listener (tubeq.server.listeners), None for plain text; a client that has
    # not finished its handshake this long after connecting is dropped.
    tls: TlsFiles | None = None
    tls_handshake_timeout_s: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT_S
    # The access file (tubeq.server.access): tokens, namespaces, bound listeners; None: no auth.
    access: AccessConfig | None = None
    # Connections this process accepts at once (all listeners); 0: no limit, as beanstalkd.
    max_connections: int = 0
    # Bind with SO_REUSEPORT, so several processes share the port (--workers).
    reuse_port: bool = False
    # The HTTP listener (/metrics, the HTTP API, the dashboard): off unless a host is given;
    # port 0 picks a free one (Server.http_port tells which).
    http_host: str | None = None
    http_port: int = 0
    # Tube labels per metric family (tubeq.server.metrics); commands slower than this are logged
    # (0: never; timing every command costs CPU, so the command line sets it with --metrics).
    metrics_max_tubes: int = DEFAULT_MAX_TUBES
    slow_ms: int = 0
    # HTTP API requests per second per client (token, else address); 0: no limit.
    http_rate: int = 0
    # The HTTP listener's connections at once (0: no limit) and how long a request's head, its
    # body and an idle connection may take before the connection is closed (tubeq.http.limits).
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    http_header_timeout_s: float = DEFAULT_HTTP_HEADER_TIMEOUT_S
    http_body_timeout_s: float = DEFAULT_HTTP_BODY_TIMEOUT_S
    http_idle_timeout_s: float = DEFAULT_HTTP_IDLE_TIMEOUT_S
    # The most jobs a namespace may hold (every state); 0: no cap. Checked once a second.
    max_jobs: int = 0
    # Every connection sees tubeq's extra stats keys, not only those that used an extension.
    extra_keys_always: bool = False
    # Replicas that must acknowledge a state change before its reply (WAIT), and for how long
    # to wait for them (tubeq.redisio.client: "Replica acknowledgement"); 0 waits for none.
    min_replicas: int = 0
    min_replicas_timeout_ms: int = 1000
    # How long Redis may leave calls unanswered before the connection is dropped as stalled
    # and they answer INTERNAL_ERROR (tubeq.redisio.client.DEFAULT_CALL_TIMEOUT); 0: no bound.
    redis_timeout_s: float = DEFAULT_CALL_TIMEOUT
    # Start on a Redis whose maxmemory-policy may evict keys (tubeq.redisio.checks).
    allow_eviction: bool = False
    # At shutdown, how long connections that hold reserved jobs get to finish them before they
    # are closed (their jobs then return to ready). The command line's default is 5 s;
    # embedded servers (the tests) close at once unless told otherwise.
    shutdown_grace_s: float = 0.0
    # The namespace's tubes spread over this many Redis hash tags (tubeq.store.shards); 1: one.
    shards: int = 1
    # Spans of traced jobs over OTLP/HTTP (tubeq.server.tracing): the collector's base URL; ""
    # where the OTEL_EXPORTER_OTLP_* variables say; None: off (unless those variables are set).
    otel_endpoint: str | None = None
    # After input, the event loop polls this long before it sleeps (tubeq.server.idle_poll);
    # 0: it sleeps at once. The command line's default is DEFAULT_IDLE_POLL_US; embedded
    # servers (the tests, which share the test's loop) do not poll unless told.
    idle_poll_us: int = 0


class HttpFront(Protocol):
    """The HTTP listener (tubeq.http.HttpListener) as the Server sees it: built from the started
    Server by the factory the composition root (tubeq.cli) hands in, so the server never
    imports the HTTP layer. Opened before the protocol port, closed first."""

    port: int  # the bound port, once started

    async def start(self, host: str, port: int) -> None: ...

    async def stop(self) -> None: ...


# A description of where this process listens that Redis did not take is sent again after
# this pause (the dashboard's server list reads it; nothing else waits for it).
DESCRIBE_RETRY_S = 1.0


async def describe_until_stored(store: JobStore, fields: dict[str, str]) -> None:
    """Store where this process listens (its instance hash), again every DESCRIBE_RETRY_S until
    Redis takes it; the first refusal is logged, and the store that ends it. The listener serves
    already: a Redis lost at this moment is one every command meets and gets past, not a failed
    start (it was: tubeq exited when a test killed its Redis right after the first served
    command). A Redis that loses its data later gets it back from Store.restore."""
    failures = 0
    while True:
        try:
            await store.describe_instance(fields)
        except (RedisConnectionLost, RedisReplyError) as error:
            if failures == 0:
                log.warning("where this process listens not stored; sending it again every "
                            f"{DESCRIBE_RETRY_S:g} s", error=repr(error))
            failures += 1
            await asyncio.sleep(DESCRIBE_RETRY_S)
        else:
            if failures:
                log.info("where this process listens stored", tries=failures + 1)
            return


class Server:
    """One tubeq process: a context per namespace (just ``--prefix`` without an access file),
    one Redis connection and one pub/sub connection for all of them, and the listeners."""

    def __init__(self, config: Config, *,
                 http: Callable[[Server], HttpFront] | None = None,
                 prebound: Prebound | None = None) -> None:
        """``http``: builds the HTTP listener, opened at start when ``config.http_host`` is set.
        ``prebound``: the protocol socket, listening already (tubeq.__main__ binds it before
        its imports); served instead of binding ``config.host``/``config.port``."""
        if config.http_host is not None and http is None:
            raise ValueError("Config.http_host needs the HTTP listener's factory (http=...)")
        self.config = config
        self._make_http = http
        self._prebound = prebound
        self._drain_asked = False  # drain() was called, maybe before the namespaces opened
        self.keys = Keys(config.prefix)
        self.instance_id = secrets.token_hex(6)
        self._listener: asyncio.Server | None = None
        self._bound: list[asyncio.Server] = []  # the access file's namespace-bound listeners
        self._unix_paths: list[Path] = []  # socket files this process created
        self._tasks: list[asyncio.Task[None]] = []
        self.ctx: ServerContext | None = None  # the default namespace (--prefix)
        self.namespaces: dict[str, ServerContext] = {}
        # Where the subscriber's messages go (wired in _open_namespace): a wake-up by its
        # channel's key root, a grant and a due instant by their channel.
        self._wakes: dict[bytes, WaiterRegistry] = {}  # key root -> its namespace's waiters
        self._grants: dict[bytes, WaiterRegistry] = {}  # grant channel -> the same
        self._dues: dict[bytes, Scheduler] = {}  # due channel -> its namespace's scheduler
        self._ends: dict[bytes, EndWaits] = {}  # ended channel -> its namespace's waits
        self._parent_ends: dict[bytes, ParentEnds] = {}  # parent_ends channel -> its drain
        self._cancels: dict[bytes, ServerContext] = {}  # cancels channel -> its namespace
        self._quiets: dict[bytes, ServerContext] = {}  # quiet channel -> its namespace
        self._client: RedisClient | None = None  # the default namespace's root's Redis
        self._nodes: dict[str, RedisClient] = {}  # by URL: every Redis this process talks to
        self._slot_map: SlotMap | None = None  # on a Redis Cluster (tubeq.redisio.cluster)
        self._moved = False  # a node answered MOVED/ASK since the slot map was last read
        self._subscriber: Subscriber | None = None
        self._capacity = Capacity(config.max_connections)
        self.metrics: Metrics | None = None
        self.tracer: tracing.JobTracer | None = None
        self._http: HttpFront | None = None
        self.idle_poll: IdlePoll | None = None  # made at start, on the running loop

    @property
    def port(self) -> int:
        """The bound TCP port (useful when configured as 0)."""
        assert self._listener is not None
        return int(self._listener.sockets[0].getsockname()[1])

    @property
    def http_port(self) -> int:
        """The HTTP listener's bound port."""
        assert self._http is not None
        return self._http.port

    def _protocol_socket(self) -> socket.socket | None:
        """The protocol listener's socket, listening from now on: the one bound before the
        server was built (``prebound``), one systemd passed, or a Unix socket; None for TCP,
        bound when the listener opens (:meth:`_listen`)."""
        config = self.config
        if self._prebound is not None:
            if (path := unix_path(config.host)) is not None:
                self._unix_paths.append(path)  # its socket file goes at stop
            return self._prebound.sock
        sock = activated_socket()
        if sock is None and (path := unix_path(config.host)) is not None:
            sock = self._unix_socket(path)
        return sock

    async def _listen(self, ctx: ServerContext, sock: socket.socket | None, *,
                      gated: bool) -> asyncio.Server:
        """The protocol listener on ``sock`` (:meth:`_protocol_socket`), else on TCP; maybe
        TLS."""
        return await self._serve(ctx, gated, sock, self.config.host, self.config.port)

    def _unix_socket(self, path: Path) -> socket.socket:
        sock = unix_socket(path)
        self._unix_paths.append(path)
        return sock

    async def _serve(self, ctx: ServerContext, gated: bool, sock: socket.socket | None,
                     host: str, port: int) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        tls = tls_context(self.config.tls) if self.config.tls is not None else None

        idle_poll = self.idle_poll

        def factory() -> Connection:
            return Connection(ctx, gated=gated, idle_poll=idle_poll)

        handshake = self.config.tls_handshake_timeout_s if tls is not None else None
        if sock is not None:
            return await loop.create_server(factory, sock=sock, ssl=tls, backlog=LISTEN_BACKLOG,
                                            ssl_handshake_timeout=handshake)
        return await loop.create_server(factory, host, port, reuse_address=True,
                                        reuse_port=self.config.reuse_port or None,
                                        backlog=LISTEN_BACKLOG, ssl=tls,
                                        ssl_handshake_timeout=handshake)

    async def _open_namespace(self, name: str) -> ServerContext:
        """A namespace's context: its store, waiters, scheduler, counters and subscriptions."""
        config = self.config
        assert self._client is not None and self._subscriber is not None
        prefix = namespace_prefix(config.prefix, name)
        keys = Keys(prefix)
        client = await self._client_for(keys.root)
        # First: a namespace of a newer data layout is not to be touched at all.
        recount = await claim_layout_version(client, keys, client.address or config.redis_url)
        try:
            await claim_layout(client, prefix, config.shards)
        except LayoutMismatch as error:
            raise StartupError(str(error)) from None
        store: Store | ShardedStore
        if config.shards > 1:
            roots = [Keys(shard_prefix(prefix, k, config.shards)).root
                     for k in range(config.shards)]
            store = ShardedStore(client, prefix, self.instance_id, config.shards,
                                 events_maxlen=config.events_maxlen,
                                 clients=[await self._client_for(root) for root in roots],
                                 functions=config.redis_functions)
            shard_keys = [shard.keys for shard in store.shards]
        else:
            store = Store(client, keys, self.instance_id, events_maxlen=config.events_maxlen,
                          functions=config.redis_functions)
            shard_keys = [keys]
        if self.metrics is not None and self.metrics.count_outcomes:
            store.metrics = self.metrics
        await store.load_scripts()
        await count_jobs_by_state(store, prefix, force=recount)
        await store.heartbeat()
        registry = WaiterRegistry()
        # After a reconnect (a Redis restart, a failover) every waiter re-checks with its
        # script, whether or not the subscriber's connection was lost too.
        for each_client in {id(c): c for c in (client, *self._nodes.values())}.values():
            each_client.add_reconnect_callback(registry.wake_all)
        scheduler = (ShardSchedulers(store, registry) if isinstance(store, ShardedStore)
                     else Scheduler(store, registry))
        ctx = ServerContext(
            store=store, registry=registry, scheduler=scheduler,
            counters=CommandCounters(store.add_counters), using=UseLedger(store),
            identity=ServerIdentity(config.max_job_size), max_job_size=config.max_job_size,
            max_in_flight=config.max_in_flight, max_client_buffer=config.max_client_buffer,
            max_watch=config.max_watch, capacity=self._capacity, observer=self.metrics,
            tracer=self.tracer,
            extra_keys_always=config.extra_keys_always, result_ttl_ms=config.result_ttl_ms,
            max_result_size=(config.max_job_size if config.max_result_size is None
                             else config.max_result_size))
        store.direct_grants = ctx.deliver_direct  # puts handing jobs to our push loops
        for each_client in {id(c): c for c in (client, *self._nodes.values())}.values():
            each_client.add_reconnect_callback(ctx.end_waits.wake_all)
        scheduler.when_registration_lost(ctx.restore_registrations)
        children = ParentEnds(store, scheduler.note_due)
        for each in shard_keys:  # every shard's channels (tubeq.store.shards), or the one root's
            grants = each.grant_channel(self.instance_id).encode()
            self._grants[grants] = registry
            self._wakes[each.root.encode()] = registry
            self._subscriber.psubscribe(each.wake_pattern.encode())
            self._subscriber.subscribe(grants)  # a reconnect wakes every waiter: none is missed
            dues = each.due_channel.encode()  # recurring ticks, rate windows
            self._dues[dues] = scheduler
            self._subscriber.subscribe(dues)
            ends = each.ended_channel.encode()  # jobs someone waits for that ended
            self._ends[ends] = ctx.end_waits
            self._subscriber.subscribe(ends)
            cancels = each.cancels_channel(self.instance_id).encode()  # held jobs cancelled
            self._cancels[cancels] = ctx
            self._subscriber.subscribe(cancels)
            quiet = each.quiet_channel.encode()  # quiet: push consumers to stop taking jobs
            self._quiets[quiet] = ctx
            self._subscriber.subscribe(quiet)
            parent_ends = each.parent_ends.encode()  # parents that ended with children held
            self._parent_ends[parent_ends] = children
            self._subscriber.subscribe(parent_ends)
        self._tasks.append(asyncio.create_task(scheduler.run(), name=f"tubeq-scheduler-{name}"))
        self._tasks.append(asyncio.create_task(children.run(), name=f"tubeq-parents-{name}"))
        if config.max_jobs > 0:
            self._tasks.append(asyncio.create_task(self._watch_job_count(ctx),
                                                   name=f"tubeq-max-jobs-{name}"))
        return ctx

    async def _watch_job_count(self, ctx: ServerContext) -> None:
        """--max-jobs: count the namespace's jobs every JOB_COUNT_PERIOD_S; while the count is
        at the cap, puts answer OUT_OF_MEMORY. Approximate by design (protocol.md, Limits): a
        count on every put would cost O(tubes) of Redis time per put."""
        cap = self.config.max_jobs
        while True:
            try:
                full = await ctx.store.count_jobs() >= cap
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: keep the last verdict, try again
                log.warning("job count failed", error=repr(exc))
            else:
                if full != ctx.full:
                    log.warning("namespace full: puts refused" if full else "namespace has room",
                                namespace=ctx.store.keys.prefix, max_jobs=cap)
                ctx.full = full
            await asyncio.sleep(JOB_COUNT_PERIOD_S)

    def _on_message(self, channel: bytes, data: bytes) -> None:
        registry = self._grants.get(channel)
        if registry is not None:  # put.lua handed a job to one of our waiting tokens
            registry.handed_over(data.decode())
            return
        scheduler = self._dues.get(channel)
        if scheduler is not None:  # another process created a due instant: be awake for it
            scheduler.note_due(int(data))
            return
        end_waits = self._ends.get(channel)
        if end_waits is not None:  # a job someone waits for ended
            end_waits.ended(*parse_ended(data))
            return
        children = self._parent_ends.get(channel)
        if children is not None:  # a parent ended: its held children are to be told
            children.heard()
            return
        cancelled_in = self._cancels.get(channel)
        if cancelled_in is not None:  # a job one of our connections holds was cancelled
            token, _, job_id = data.decode().partition(" ")
            conn = cancelled_in.connections.get(token)
            if conn is not None and job_id.isdigit():
                conn.job_cancelled(int(job_id))
            return
        quiet_in = self._quiets.get(channel)
        if quiet_in is not None:  # quiet: 'all', 'tube <name>' or 'conn <token>'
            scope, _, target = data.decode().partition(" ")
            reached = quiet_in.quiet_consumers(scope, target)
            log.info("quiet", scope=scope, target=target, push_connections=reached)
            return
        # A wake-up: "{prefix}:wake:<tube>", the namespace by its key root; its data how many
        # jobs the tube has ready ("" from a tubeq before that: one).
        split = channel.find(b"}:") + 2
        registry = self._wakes.get(channel[:split])
        if registry is not None:
            registry.wake(channel[split + len(b"wake:"):].decode(),
                          int(data) if data.isdigit() else 1)

    def _wake_all(self) -> None:
        for ctx in self.namespaces.values():
            ctx.registry.wake_all()
            ctx.end_waits.wake_all()

    async def _connect(self, url: str) -> RedisClient:
        """A checked connection to one Redis (a cluster's node, a Sentinel master, ...)."""
        config = self.config
        try:
            client = await RedisClient.connect(
                url, flush_at=REDIS_BATCH_CALLS, min_replicas=config.min_replicas,
                replicas_timeout_ms=config.min_replicas_timeout_ms,
                call_timeout=config.redis_timeout_s)
        except MasterNotFound as error:
            raise StartupError(f"no Redis master: {error}") from None
        except (OSError, RedisReplyError) as error:
            raise StartupError(f"cannot connect to Redis at {url}: "
                               f"{str(error) or type(error).__name__}") from None
        try:
            await check_redis(client, client.address or url,
                              allow_eviction=config.allow_eviction,
                              min_replicas=config.min_replicas)
        except BaseException:
            await client.close()
            raise
        if self.idle_poll is not None:
            client.on_data = self.idle_poll.input
        if self.metrics is not None and self.metrics.count_outcomes:
            client.on_round_trip = self.metrics.redis_round_trip
            client.on_error = self.metrics.redis_error
        return client

    async def _follow_cluster(self) -> None:
        """On a Redis Cluster: read the slot map again when a node answered MOVED/ASK or a
        node's connection is down, and move every shard whose slot now lives on another node
        to that node's connection (a resharding; a replica promoted after its master failed).
        Checked every CLUSTER_RECHECK_S; nothing is asked of Redis while all is well."""
        assert self._slot_map is not None
        seeds = ClusterSeeds.parse(self.config.redis_url)
        while True:
            await asyncio.sleep(CLUSTER_RECHECK_S)
            if not self._moved and all(c.connected for c in self._nodes.values()):
                continue
            self._moved = False
            try:
                slot_map = await read_slot_map(seeds)
            except ClusterUnavailable as error:
                log.warning("cluster slot map unavailable", error=str(error))
                continue
            if slot_map == self._slot_map:
                continue
            self._slot_map = slot_map
            for ctx in self.namespaces.values():
                store = ctx.store
                if not isinstance(store, ShardedStore):
                    log.warning("the cluster's slots moved; a namespace of one shard stays "
                                "on its node: restart tubeq", namespace=store.keys.prefix)
                    continue
                for k, shard in enumerate(store.shards):
                    client = await self._client_for(shard.keys.root)
                    if client is not shard.client:
                        moved = store.rebind(k, client)
                        await moved.load_scripts()
                        if isinstance(ctx.scheduler, ShardSchedulers):
                            ctx.scheduler.rebind(k, moved)
                        log.info("shard moved to another node", shard=shard.keys.prefix,
                                 node=client.address)
                ctx.registry.wake_all()

    def _note_moved(self) -> None:
        self._moved = True

    async def _client_for(self, key: str) -> RedisClient:
        """The connection that serves ``key``: on a Redis Cluster its slot's node (one
        connection per node), else the one connection."""
        assert self._client is not None
        if self._slot_map is None:
            return self._client
        url = self._slot_map.url_for(key)
        client = self._nodes.get(url)
        if client is None:
            client = self._nodes[url] = await self._connect(url)
            client.add_reconnect_callback(self._wake_all)
            client.on_moved = self._note_moved
        return client

    async def start(self) -> None:
        # The protocol socket first: connections queue in it while Redis is set up, and one
        # that cannot be had (a bad systemd descriptor, a Unix path in use) fails the start
        # before Redis is touched.
        sock = self._protocol_socket()
        try:
            await self._start(sock)
        except BaseException:
            if sock is not None:
                sock.close()
            for path in self._unix_paths:
                with contextlib.suppress(OSError):
                    path.unlink()
            raise

    async def _start(self, sock: socket.socket | None) -> None:
        config = self.config
        if config.http_host is not None:
            self.metrics = Metrics(config.metrics_max_tubes, config.slow_ms)
        elif config.slow_ms > 0:  # only the slow-command line
            self.metrics = Metrics(config.metrics_max_tubes, config.slow_ms, outcomes=False)
        if tracing.wanted(config.otel_endpoint):
            try:
                self.tracer = tracing.start_tracing(config.otel_endpoint)
            except tracing.TracingUnavailable as error:
                raise StartupError(str(error)) from None
        if config.idle_poll_us > 0:
            self.idle_poll = IdlePoll(asyncio.get_running_loop(), config.idle_poll_us / 1e6)
        url = config.redis_url
        if is_cluster_url(url):
            try:
                self._slot_map = await read_slot_map(ClusterSeeds.parse(url))
            except (ClusterUnavailable, ValueError) as error:
                raise StartupError(f"no usable Redis Cluster: {error}") from None
            url = self._slot_map.url_for(Keys(config.prefix).root)
        self._client = client = await self._connect(url)
        self._nodes[url] = client
        if self._slot_map is not None:
            client.on_moved = self._note_moved
        # On a cluster every node's PUBLISH reaches every node's subscribers: one connection.
        self._subscriber = Subscriber(url, self._on_message, self._wake_all)
        if self.idle_poll is not None:
            self._subscriber.on_data = self.idle_poll.input
        access = config.access
        names = {DEFAULT_NAMESPACE, *(access.namespaces if access is not None else ())}
        for name in sorted(names):
            self.namespaces[name] = await self._open_namespace(name)
        self.ctx = self.namespaces[DEFAULT_NAMESPACE]
        if self._drain_asked:
            self.drain()
        if access is not None:
            gate = Gate(access, self.namespaces)
            for ctx in self.namespaces.values():
                ctx.gate = gate
        await self._subscriber.start()
        if self._slot_map is not None:
            self._tasks.append(asyncio.create_task(self._follow_cluster(),
                                                   name="tubeq-cluster-map"))
        # After a failover the pub/sub connection follows the client to the new master.
        subscriber = self._subscriber
        client.add_reconnect_callback(lambda: subscriber.follow(client.address))
        listening: dict[str, str] = {}
        if self._make_http is not None and config.http_host is not None:
            # first: a protocol port that accepts means "all up"
            self._http = self._make_http(self)
            await self._http.start(config.http_host, config.http_port)
            listening["http"] = f"{config.http_host}:{self.http_port}"
            log.info("http listening", host=config.http_host, port=self.http_port)
        self._listener = await self._listen(self.ctx, sock, gated=access is not None)
        for bound in access.listeners if access is not None else ():
            ctx = self.namespaces[bound.namespace]
            if bound.unix is not None:
                listener = await self._serve(ctx, False, self._unix_socket(bound.unix), "", 0)
            else:
                host = config.host if unix_path(config.host) is None else "127.0.0.1"
                listener = await self._serve(ctx, False, None, host, bound.port or 0)
            self._bound.append(listener)
            log.info("listening for a namespace", namespace=bound.namespace,
                     address=describe(listener.sockets[0]))
        listening["addr"] = describe(self._listener.sockets[0])
        for ctx in self.namespaces.values():
            self._tasks.append(asyncio.create_task(describe_until_stored(ctx.store, listening),
                                                   name="tubeq-describe"))
        log.info("listening", address=describe(self._listener.sockets[0]),
                 tls="on" if config.tls is not None else "off",
                 auth="required" if access is not None else "off", redis=config.redis_url,
                 prefix=config.prefix, instance=self.instance_id,
                 events=f"on, maxlen ~{config.events_maxlen}" if config.events_maxlen else "off")

    def drain(self) -> None:
        """Enter drain mode: every later put answers DRAINING. Asked during the start (a
        SIGUSR1 while clients already queue on the socket), it holds from the first command."""
        self._drain_asked = True
        if self.ctx is not None and not self.ctx.draining:
            for ctx in self.namespaces.values():
                ctx.draining = True
            log.info("drain mode")

    async def stop(self) -> None:
        self.drain()
        if self._http is not None:
            await self._http.stop()  # its long polls end and give their jobs back first
        for listener in (self._listener, *self._bound):
            if listener is not None:
                listener.close()
        for path in self._unix_paths:
            with contextlib.suppress(OSError):
                path.unlink()
        for ctx in self.namespaces.values():
            # Push loops take no more jobs; the consumers that asked hear QUIET and hand back
            # what they have not started (hand-back), then finish the rest within the grace.
            ctx.stopping = True
            ctx.quiet_consumers("all")
        await asyncio.sleep(0)  # the QUIET frames are written before any connection closes
        for ctx in self.namespaces.values():
            await self._let_jobs_finish(ctx, self.config.shutdown_grace_s)
        connections = [conn for ctx in self.namespaces.values()
                       for conn in ctx.connections.values()]
        for conn in connections:
            conn.close(stopping=True)
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
        for ctx in self.namespaces.values():
            ctx.counters.flush()
            ctx.using.flush()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ctx.store.leave(), SHUTDOWN_GRACE_S)
        for node in self._nodes.values():
            await node.close()
        if self.tracer is not None:
            await self.tracer.shutdown()
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
