"""The client: :class:`Client`, every beanstalkd command as a typed method.

A client holds one connection (``_Link``) at a time. It owns connecting and reconnecting, the
``use``/``watch`` state the server confirmed and its replay on a new connection, the release of
jobs granted to cancelled reserves ("orphans"), the push extension, and ``consume()``/``work()``,
which hand over to :class:`Consumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

from tubeq.client.args import _expect, _job_id, _tube, _uint
from tubeq.client.consume import Consumer
from tubeq.client.errors import ClientConnectionError, ClientError
from tubeq.client.job import (
    Job,
    _bury_command,
    _delete_command,
    _ok,
    _release_command,
    _stats_job_command,
    _touch_command,
)
from tubeq.client.link import Convert, _Link
from tubeq.client.parser import (
    SERVER_TEXT_KEYS,
    TUBE_TEXT_KEYS,
    Reply,
    Stats,
    parse_yaml_list,
    parse_yaml_mapping,
)
from tubeq.client.wire import (
    CLOSE_WAIT_S,
    CRLF,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_PRIORITY,
    DEFAULT_TTR,
    DEFAULT_TUBE,
    FOUND,
    INSERTED,
    KICKED,
    MAX_BODY,
    PAUSED,
    PUSHING,
    RESERVED,
    USING,
    WATCHING,
)

log = logging.getLogger("tubeq.client")

T = TypeVar("T")


class Client:
    """An asyncio beanstalkd client: one connection at a time, every command a typed method.

    Calls may be made concurrently: they are written at once (pipelined) and each gets its own
    reply, in order. The connection opens on the first call (or ``await client.connect()``, or
    ``async with Client(...)``). When it is lost, the calls waiting on it raise
    :class:`ClientConnectionError`; with ``reconnect=True`` the next call opens a new one and
    first replays ``use`` and ``watch``/``ignore`` so the new connection uses and watches what
    the old one did. Reservations do not survive a reconnect (the server put the jobs back).

    ``servers`` (``[("h1", 11300), "h2:11300", ...]``, instead of ``host``/``port``) lists
    several servers of one queue (tubeq processes sharing a Redis and prefix): a connect tries
    them in turn, starting with the one that served last, and the client then talks to the
    first that answers, so a reconnect after a server died goes to another one. ``host`` and
    ``port`` say which one it is on.

    A blocking :meth:`reserve` holds every command pipelined behind it until it is answered,
    and cancelling the call does not withdraw it from the server; prefer
    :meth:`reserve_with_timeout`, or a :meth:`consume` loop.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                 connect_timeout: float = 10.0, reconnect: bool = True,
                 max_body: int = MAX_BODY,
                 servers: Iterable[tuple[str, int] | str] | None = None) -> None:
        self.servers = _addresses(servers) if servers is not None else [(host, port)]
        self.host, self.port = self.servers[0]
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.max_body = max_body
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._ever_connected = False
        self._used = DEFAULT_TUBE
        self._watched = [DEFAULT_TUBE]
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<Client {self.address} {'connected' if self.connected else 'not connected'}>"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.usable

    @property
    def used(self) -> str:
        """The tube puts go to, as the server last confirmed."""
        return self._used

    @property
    def watched(self) -> tuple[str, ...]:
        """The watched tubes, as the server last confirmed."""
        return tuple(self._watched)

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open a connection unless one is open, replaying ``use``/``watch`` state on it."""
        async with self._connecting:
            if not self.connected:
                await self._open()

    async def _current_link(self) -> _Link:
        link = self._link
        if link is not None and link.usable:
            return link
        if self._ever_connected and not self.reconnect:
            if link is not None and link.error is not None:
                raise link.failure()
            raise ClientConnectionError(f"{self.address}: not connected (reconnect is off)")
        async with self._connecting:
            link = self._link
            if link is None or not link.usable:
                link = await self._open()
            return link

    async def _open(self) -> _Link:
        """Connect to the server that served last, else to each of the others in turn."""
        start = self.servers.index((self.host, self.port))
        failures: list[ClientConnectionError] = []
        for host, port in self.servers[start:] + self.servers[:start]:
            try:
                return await self._open_at(host, port)
            except ClientConnectionError as error:
                failures.append(error)
                if len(self.servers) > 1:
                    log.warning("%s; trying the next server", error)
        if len(failures) == 1:
            raise failures[0]
        raise ClientConnectionError("no server answered: " + "; ".join(map(str, failures))
                                    ) from failures[-1]

    async def _open_at(self, host: str, port: int) -> _Link:
        loop = asyncio.get_running_loop()
        address = f"{host}:{port}"
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, link = await loop.create_connection(lambda: _Link(self), host, port)
        except TimeoutError as error:
            raise ClientConnectionError(
                f"cannot connect to {address}: no answer within "
                f"{self.connect_timeout:g} s") from error
        except OSError as error:
            # asyncio words a refused connection "Connect call failed (...)"; say it plainly.
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ClientConnectionError(f"cannot connect to {address}: {reason}") from error
        self.host, self.port = host, port
        # Replay the state the server confirmed on the previous connection, pipelined, before
        # any other call can write: watches first, so ignoring default never leaves none.
        restore: list[asyncio.Future[Any]] = []
        if self._used != DEFAULT_TUBE:
            restore.append(link.send(*self._use_command(self._used)))
        for tube in list(self._watched):
            if tube != DEFAULT_TUBE:
                restore.append(link.send(*self._watch_command(tube)))
        if DEFAULT_TUBE not in self._watched:
            restore.append(link.send(*self._ignore_command(DEFAULT_TUBE)))
        try:
            await asyncio.gather(*restore)
        except BaseException:
            link.close()
            raise
        self._link = link
        self._ever_connected = True
        return link

    def close(self) -> None:
        """Close the connection now (the server puts back the jobs it had reserved)."""
        if self._link is not None:
            self._link.close()

    async def aclose(self) -> None:
        """Close the connection and wait (briefly) until it is closed."""
        link = self._link
        if link is None:
            return
        link.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await link.wait_closed()

    async def quit(self) -> None:
        """Send ``quit``: the server answers the commands before it and closes the connection.

        A later call opens a new connection (when ``reconnect`` is on).
        """
        link = self._link
        if link is None or not link.usable:
            return
        link.send_noreply(b"quit\r\n")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await link.wait_closed()
        link.close()

    # -- plumbing -----------------------------------------------------------------------------

    async def _call(self, data: bytes, convert: Convert[T], *, reserves: bool = False) -> T:
        return await self._call_on(await self._current_link(), data, convert, reserves=reserves)

    async def _call_on(self, link: _Link, data: bytes, convert: Convert[T], *,
                       reserves: bool = False) -> T:
        future = link.send(data, convert, reserves=reserves)
        await link.wait_writable()
        return await future

    def _job_from(self, reply: Reply, link: _Link | None, tube: str | None) -> Job:
        assert reply.body is not None
        job = Job(self, reply.int_arg(0), reply.body, tube=tube, link=link)
        if link is not None and tube is None and len(self._watched) == 1:
            job.tube = self._watched[0]
        return job

    def _release_orphan(self, job: Job) -> None:
        """A reserve whose caller was cancelled got a job: put it back at its own priority."""

        async def release() -> None:
            try:
                await job.release(delay=0)  # its own priority, asked on its own connection
            except ClientError as error:  # its connection is gone: the server put it back
                log.debug("orphaned job %d not released: %s", job.id, error)

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _use_command(self, tube: str) -> tuple[bytes, Convert[str]]:
        def convert(reply: Reply, link: _Link) -> str:
            _expect(reply, "use", USING)
            self._used = reply.args[0].decode("ascii", "replace")
            return self._used

        return b"use %s\r\n" % _tube(tube), convert

    def _watch_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "watch", WATCHING)
            if tube not in self._watched:
                self._watched.append(tube)
            return reply.int_arg(0)

        return b"watch %s\r\n" % _tube(tube), convert

    def _ignore_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "ignore", WATCHING)
            if tube in self._watched:
                # beanstalkd keeps the watch list as an array and fills a hole with the last.
                watched = self._watched
                watched[watched.index(tube)] = watched[-1]
                watched.pop()
            return reply.int_arg(0)

        return b"ignore %s\r\n" % _tube(tube), convert

    def _reserved(self, command: str) -> Convert[Job]:
        def convert(reply: Reply, link: _Link) -> Job:
            _expect(reply, command, RESERVED)
            return self._job_from(reply, link, None)

        return convert

    def _found(self, command: str, tube: Callable[[], str | None]) -> Convert[Job]:
        def convert(reply: Reply, link: _Link) -> Job:
            _expect(reply, command, FOUND)
            return self._job_from(reply, None, tube())

        return convert

    # -- producer commands --------------------------------------------------------------------

    async def put(self, body: bytes | str, *, pri: int = DEFAULT_PRIORITY, delay: int = 0,
                  ttr: int = DEFAULT_TTR) -> int:
        """Put a job into the used tube; returns its id. A ``str`` body is sent as UTF-8.

        Raises :class:`JobTooBig`, :class:`Draining`, :class:`Buried` (out of memory).
        """
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)

        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "put", INSERTED)
            return reply.int_arg(0)

        line = b"put %d %d %d %d\r\n" % (_uint(pri, "pri"), _uint(delay, "delay"),
                                         _uint(ttr, "ttr"), len(data))
        return await self._call(line + data + CRLF, convert)

    async def use(self, tube: str) -> str:
        """Make ``tube`` the tube that put, peek-* and kick act on; returns it."""
        return await self._call(*self._use_command(tube))

    # -- worker commands ----------------------------------------------------------------------

    async def reserve(self) -> Job:
        """Wait as long as it takes for a ready job in a watched tube and reserve it.

        Raises :class:`DeadlineSoon` when a job this connection holds is about to time out.
        """
        return await self._call(b"reserve\r\n", self._reserved("reserve"), reserves=True)

    async def reserve_with_timeout(self, seconds: int) -> Job:
        """Reserve a ready job of a watched tube, waiting at most ``seconds`` (0: don't wait).

        Raises :class:`TimedOut` when none came, :class:`DeadlineSoon` (see :meth:`reserve`).
        """
        line = b"reserve-with-timeout %d\r\n" % _uint(seconds, "seconds")
        return await self._call(line, self._reserved("reserve-with-timeout"), reserves=True)

    async def reserve_job(self, job_id: int) -> Job:
        """Reserve job ``job_id`` whatever its tube and state (ready, delayed or buried).

        Raises :class:`NotFound` when there is no such job or it is reserved.
        """
        line = b"reserve-job %d\r\n" % _job_id(job_id)
        return await self._call(line, self._reserved("reserve-job"), reserves=True)

    async def delete(self, job_id: int) -> None:
        """Delete a job that is ready, delayed, buried, or reserved by this connection."""
        await self._call(*_delete_command(job_id))

    async def release(self, job_id: int, *, pri: int = DEFAULT_PRIORITY, delay: int = 0) -> None:
        """Put back a job this connection reserved, at ``pri``, ready or after ``delay`` s.

        (:meth:`Job.release` keeps the job's own priority by default.)
        """
        await self._call(*_release_command(job_id, pri, delay))

    async def bury(self, job_id: int, *, pri: int = DEFAULT_PRIORITY) -> None:
        """Bury a job this connection reserved, at ``pri``."""
        await self._call(*_bury_command(job_id, pri))

    async def touch(self, job_id: int) -> None:
        """Give a job this connection reserved a full TTR from now."""
        await self._call(*_touch_command(job_id))

    async def watch(self, tube: str) -> int:
        """Add ``tube`` to the watch list; returns how many tubes are watched."""
        return await self._call(*self._watch_command(tube))

    async def ignore(self, tube: str) -> int:
        """Remove ``tube`` from the watch list; returns how many tubes are watched.

        Raises :class:`NotIgnored` for the last watched tube.
        """
        return await self._call(*self._ignore_command(tube))

    # -- inspection ---------------------------------------------------------------------------

    async def peek(self, job_id: int) -> Job:
        """Job ``job_id`` in any state (not reserved by this call); :class:`NotFound` if none."""
        line = b"peek %d\r\n" % _job_id(job_id)
        return await self._call(line, self._found("peek", lambda: None))

    async def peek_ready(self) -> Job:
        """The job a reserve would take next from the used tube; :class:`NotFound` if none."""
        return await self._call(b"peek-ready\r\n", self._found("peek-ready", lambda: self._used))

    async def peek_delayed(self) -> Job:
        """The used tube's delayed job that is due soonest; :class:`NotFound` if none."""
        return await self._call(b"peek-delayed\r\n",
                                self._found("peek-delayed", lambda: self._used))

    async def peek_buried(self) -> Job:
        """The used tube's oldest buried job; :class:`NotFound` if none."""
        return await self._call(b"peek-buried\r\n",
                                self._found("peek-buried", lambda: self._used))

    async def kick(self, bound: int) -> int:
        """Kick up to ``bound`` jobs of the used tube (buried ones if any, else delayed ones);
        returns how many were kicked."""

        def convert(reply: Reply, link: _Link) -> int:
            _expect(reply, "kick", KICKED)
            return reply.int_arg(0)

        return await self._call(b"kick %d\r\n" % _uint(bound, "bound"), convert)

    async def kick_job(self, job_id: int) -> None:
        """Kick one buried or delayed job of any tube; :class:`NotFound` otherwise."""

        def convert(reply: Reply, link: _Link) -> None:
            _expect(reply, "kick-job", KICKED)

        await self._call(b"kick-job %d\r\n" % _job_id(job_id), convert)

    async def stats_job(self, job_id: int) -> Stats:
        """The job's stats (id, tube, state, pri, age, delay, ttr, time-left, reserves ...)."""
        return await self._call(*_stats_job_command(job_id))

    async def stats_tube(self, tube: str) -> Stats:
        """The tube's stats (current-jobs-*, total-jobs, current-waiting, pause ...)."""
        parse = lambda data: parse_yaml_mapping(data, TUBE_TEXT_KEYS)  # noqa: E731
        return await self._call(b"stats-tube %s\r\n" % _tube(tube),
                                _ok("stats-tube", parse))

    async def stats(self) -> Stats:
        """The server's stats."""
        parse = lambda data: parse_yaml_mapping(data, SERVER_TEXT_KEYS)  # noqa: E731
        return await self._call(b"stats\r\n", _ok("stats", parse))

    async def list_tubes(self) -> list[str]:
        """Every existing tube."""
        return await self._call(b"list-tubes\r\n", _ok("list-tubes", parse_yaml_list))

    async def list_tube_used(self) -> str:
        """The used tube, as the server sees it."""

        def convert(reply: Reply, link: _Link) -> str:
            _expect(reply, "list-tube-used", USING)
            return reply.args[0].decode("ascii", "replace")

        return await self._call(b"list-tube-used\r\n", convert)

    async def list_tubes_watched(self) -> list[str]:
        """The watched tubes, as the server sees them."""
        return await self._call(b"list-tubes-watched\r\n",
                                _ok("list-tubes-watched", parse_yaml_list))

    async def pause_tube(self, tube: str, delay: int) -> None:
        """Hold every reserve from ``tube`` for ``delay`` s (0 resumes now)."""

        def convert(reply: Reply, link: _Link) -> None:
            _expect(reply, "pause-tube", PAUSED)

        await self._call(b"pause-tube %s %d\r\n" % (_tube(tube), _uint(delay, "delay")), convert)

    # -- the push extension (tubeq) -----------------------------------------------------------

    async def push(self, credits: int) -> int:
        """Ask the server to push ready jobs of the watched tubes, ``credits`` at most held.

        After ``PUSHING <credits>`` the server sends jobs unsolicited; take them with
        :meth:`next_pushed`. Deleting, releasing or burying a pushed job frees a credit; sending
        push again changes the credit count (``push(0)``: no new deliveries). The
        connection must not send reserve commands any more (RuntimeError). A server without the
        extension (beanstalkd) raises :class:`UnknownCommand` and the connection is unchanged.
        Push mode ends with the connection: a reconnect does not restore it.
        """
        link = await self._current_link()

        def convert(reply: Reply, link: _Link) -> int:
            if reply.word != PUSHING:
                link.push_requested = False
            _expect(reply, "push", PUSHING)
            link.pushing = True  # RESERVED frames from here on are pushed jobs
            return reply.int_arg(0)

        line = b"push %d\r\n" % _uint(credits, "credits")
        future = link.send(line, convert)
        link.push_requested = True
        await link.wait_writable()
        return await future

    async def next_pushed(self) -> Job:
        """The next job the server pushed on this connection (waits for one).

        Raises :class:`ClientConnectionError` when the connection is gone (its jobs went back).
        """
        link = self._link
        if link is None or not link.pushing:
            raise RuntimeError("next_pushed() needs a connection in push mode (see push())")
        return await link.next_pushed()

    # -- consumption --------------------------------------------------------------------------

    def consume(self, tubes: str | Iterable[str], *, concurrency: int = 32,
                connections: int | None = None, auto_touch: bool = False,
                max_tries: int | None = 5, backoff_base: int = 1, backoff_max: int = 60,
                push: bool | None = None, reserve_timeout: int = 1,
                grace: float = 30.0) -> Consumer:
        """Jobs of ``tubes`` as they come, up to ``concurrency`` held at once (see Consumer)."""
        return Consumer(self, tubes, concurrency=concurrency, connections=connections,
                        auto_touch=auto_touch, max_tries=max_tries, backoff_base=backoff_base,
                        backoff_max=backoff_max, push=push, reserve_timeout=reserve_timeout,
                        grace=grace)

    async def work(self, handler: Callable[[Job], Awaitable[object]],
                   tubes: str | Iterable[str], **options: Any) -> None:
        """Run ``handler(job)`` for every job of ``tubes`` until cancelled (see Consumer.run)."""
        await self.consume(tubes, **options).run(handler)

    def _sibling(self) -> Client:
        """A new client for the same server with the same settings but its own connection."""
        return Client(self.host, self.port, connect_timeout=self.connect_timeout,
                      reconnect=False, max_body=self.max_body,
                      servers=[(self.host, self.port), *(s for s in self.servers
                                                         if s != (self.host, self.port))])


def _addresses(servers: Iterable[tuple[str, int] | str]) -> list[tuple[str, int]]:
    """``("h", 11300)`` or ``"h:11300"`` (``"h"`` alone: port 11300) as (host, port) pairs."""
    out: list[tuple[str, int]] = []
    for server in servers:
        if isinstance(server, str):
            host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
            out.append((host, int(port) if port else DEFAULT_PORT))
        else:
            out.append((server[0], int(server[1])))
    if not out:
        raise ValueError("servers must name at least one server")
    return out
