"""The client: :class:`Client`, every beanstalkd command as a typed method.

A client holds one connection (``_Link``) at a time. It owns connecting and reconnecting, the
``use``/``watch`` state the server confirmed and its replay on a new connection, the release of
jobs granted to cancelled reserves ("orphans"), the push extension, and ``consume()``/``work()``,
which hand over to :class:`Consumer`.

Rules: this is the top of the client, the one module that knows the concrete classes (``_Link``,
:class:`Job`, :class:`Consumer`) and puts them together. The modules below it know a client
only as the Protocols they declare, which :class:`Client` satisfies (mypy checks it where a
``Client`` is handed down): ``_contracts.JobClient`` for a job, ``link.LinkClient`` for a
connection, ``consume.ConsumerClient`` for a consumer; and a connection only as
``_contracts.Connection``, which is how the reply converters here see it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

from tubeq.client import admin, batches
from tubeq.client._contracts import Connection, Convert
from tubeq.client.args import _expect, _job_id, _tube, _uint
from tubeq.client.consume import Consumer
from tubeq.client.ends import (
    REPLY_GRACE_S,
    Codec,
    Ended,
    Progress,
    ended_of,
    progress_of,
    result_of,
    wait_line,
    wait_ms,
)
from tubeq.client.errors import (
    BadOption,
    CallTimedOut,
    ClientConnectionError,
    ClientError,
    CommandError,
    ProtocolError,
    TimedOut,
    UnknownCommand,
)
from tubeq.client.job import (
    Job,
    _bury_command,
    _delete_command,
    _ok,
    _release_command,
    _stats_job_command,
    _touch_command,
)
from tubeq.client.link import _Link
from tubeq.client.parser import (
    SERVER_TEXT_KEYS,
    TUBE_TEXT_KEYS,
    Reply,
    Stats,
    parse_yaml_list,
    parse_yaml_mapping,
)
from tubeq.client.policies import PutResult, key_arg, put_with_line, traceparent_option
from tubeq.client.schedules import Schedule, cron_on_the_wire, parse_schedule_list
from tubeq.client.wire import (
    CANCELLED,
    CHANGED,
    CLEARED,
    CLOSE_WAIT_S,
    CRLF,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_PRIORITY,
    DEFAULT_TTR,
    DEFAULT_TUBE,
    DUPLICATE,
    END_TIMED_OUT,
    ENDED,
    FOUND,
    INSERTED,
    KICKED,
    MAX_BODY,
    PAUSED,
    PROGRESS,
    PUSHING,
    PUT_MANY_MAX,
    QUIETING,
    REMOVED,
    RESERVED,
    RESUMED,
    SCHEDULED,
    U32_MAX,
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
        # The server refused put-with notify-ms (a tubeq older than it): calls then use
        # wait-ms, one at a time per connection.
        self._calls_hold: bool = False
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

    async def _call_within(self, data: bytes, convert: Convert[T], seconds: float) -> T:
        """``_call`` bounded by ``seconds``: TimeoutError once they ran out (the reply, if it
        comes later, is dropped as a cancelled call's). On an open connection that takes writes
        (the usual case) one loop timer cancels the reply's future, where ``asyncio.timeout``
        cost a fifth of a request/reply's client CPU (its context manager, the task's
        cancellation and uncancellation); else (connecting, the server not reading) the
        call runs under ``asyncio.timeout``, as every part of it then may wait."""
        link = self._link
        if link is None or not link.usable or not link.writable:
            async with asyncio.timeout(seconds):
                return await self._call(data, convert)
        future = link.send(data, convert)
        timer = future.get_loop().call_later(seconds, future.cancel)
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled, not the call
            raise TimeoutError from None
        finally:
            timer.cancel()

    async def _call_on(self, link: Connection, data: bytes, convert: Convert[T], *,
                       reserves: bool = False) -> T:
        future = link.send(data, convert, reserves=reserves)
        if not link.writable:
            await link.wait_writable()
        return await future

    def _job_from(self, reply: Reply, link: Connection | None, tube: str | None, *,
                  now: float | None = None) -> Job:
        assert reply.body is not None
        job = Job(self, reply.int_arg(0), reply.body, tube=tube, link=link, now=now)
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
        def convert(reply: Reply, link: Connection) -> str:
            _expect(reply, "use", USING)
            self._used = reply.args[0].decode("ascii", "replace")
            return self._used

        return b"use %s\r\n" % _tube(tube), convert

    def _watch_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: Connection) -> int:
            _expect(reply, "watch", WATCHING)
            if tube not in self._watched:
                self._watched.append(tube)
            return reply.int_arg(0)

        return b"watch %s\r\n" % _tube(tube), convert

    def _ignore_command(self, tube: str) -> tuple[bytes, Convert[int]]:
        def convert(reply: Reply, link: Connection) -> int:
            _expect(reply, "ignore", WATCHING)
            if tube in self._watched:
                # beanstalkd keeps the watch list as an array and fills a hole with the last.
                watched = self._watched
                watched[watched.index(tube)] = watched[-1]
                watched.pop()
            return reply.int_arg(0)

        return b"ignore %s\r\n" % _tube(tube), convert

    def _reserved(self, command: str) -> Convert[Job]:
        def convert(reply: Reply, link: Connection) -> Job:
            _expect(reply, command, RESERVED)
            return self._job_from(reply, link, None)

        return convert

    def _found(self, command: str, tube: Callable[[], str | None]) -> Convert[Job]:
        def convert(reply: Reply, link: Connection) -> Job:
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

        def convert(reply: Reply, link: Connection) -> int:
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

        def convert(reply: Reply, link: Connection) -> int:
            _expect(reply, "kick", KICKED)
            return reply.int_arg(0)

        return await self._call(b"kick %d\r\n" % _uint(bound, "bound"), convert)

    async def kick_job(self, job_id: int) -> None:
        """Kick one buried or delayed job of any tube; :class:`NotFound` otherwise."""

        def convert(reply: Reply, link: Connection) -> None:
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

        def convert(reply: Reply, link: Connection) -> str:
            _expect(reply, "list-tube-used", USING)
            return reply.args[0].decode("ascii", "replace")

        return await self._call(b"list-tube-used\r\n", convert)

    async def list_tubes_watched(self) -> list[str]:
        """The watched tubes, as the server sees them."""
        return await self._call(b"list-tubes-watched\r\n",
                                _ok("list-tubes-watched", parse_yaml_list))

    async def pause_tube(self, tube: str, delay: int) -> None:
        """Hold every reserve from ``tube`` for ``delay`` s (0 resumes now)."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "pause-tube", PAUSED)

        await self._call(b"pause-tube %s %d\r\n" % (_tube(tube), _uint(delay, "delay")), convert)

    # -- the push extension (tubeq) -----------------------------------------------------------

    async def push(self, credits: int, *,
                   on_cancelled: Callable[[int], None] | None = None,
                   on_quiet: Callable[[], None] | None = None) -> int:
        """Ask the server to push ready jobs of the watched tubes, ``credits`` at most held.
        ``on_cancelled``: also ask to be told at once of a held job cancelled (tubeq's
        ``push ... cancels=1``), and call it with the job's id in the reading task.
        ``on_quiet``: also ask to be told when the server asks its consumers to stop taking
        jobs (``push ... quiet=1``: an operator's ``quiet``, or the server stopping), and call
        it in the reading task; the server has stopped pushing to this connection by then.

        After ``PUSHING <credits>`` the server sends jobs unsolicited; take them with
        :meth:`next_pushed`. Deleting, releasing or burying a pushed job frees a credit; sending
        push again changes the credit count (``push(0)``: no new deliveries). The
        connection must not send reserve commands any more (RuntimeError). A server without the
        extension (beanstalkd) raises :class:`UnknownCommand` and the connection is unchanged.
        Push mode ends with the connection: a reconnect does not restore it.
        """
        link = await self._current_link()

        def convert(reply: Reply, link: Connection) -> int:
            if reply.word != PUSHING:
                link.push_requested = False
            _expect(reply, "push", PUSHING)
            link.pushing = True  # RESERVED frames from here on are pushed jobs
            return reply.int_arg(0)

        line = b"push %d%s%s\r\n" % (_uint(credits, "credits"),
                                      b"" if on_cancelled is None else b" cancels=1",
                                      b"" if on_quiet is None else b" quiet=1")
        link.on_cancelled = on_cancelled
        link.on_quiet = on_quiet
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

    def pushed_waiting(self) -> list[Job]:
        """The jobs the server pushed on this connection that :meth:`next_pushed` has not
        returned yet, taken now (none when the connection does not push)."""
        link = self._link
        return [] if link is None else link.take_pushed()

    # -- job policies and deduplicated put (tubeq) ----------------------------------------------

    async def put_with(self, body: bytes | str, *, pri: int = DEFAULT_PRIORITY, delay: int = 0,
                       ttr: int = DEFAULT_TTR, delay_ms: int | None = None,
                       max_tries: int | None = None, backoff_ms: int | None = None,
                       backoff_max_ms: int | None = None, ttl_ms: int | None = None,
                       on_expire: str | None = None, key: str | None = None,
                       after: Sequence[int] | None = None,
                       result_ttl_ms: int | None = None, group: str | None = None,
                       traceparent: str | None = None) -> PutResult:
        """Put a job with tubeq's options (protocol.md, "put-with"); an option left None is not
        sent (the tube's setting applies). Returns the new job's id, or, when a living job has
        ``key``, that job's id with ``inserted`` False (nothing was enqueued). ``after``: the
        job is held until these jobs finished (protocol.md, "Dependencies"); a child reads
        their results with :meth:`wait`. ``result_ttl_ms``: how long the job's result is kept
        once finished, instead of the server's --result-ttl. ``group``: the job's group in its
        tube (protocol.md, "Groups"): the tube's groups take turns. ``traceparent``: the W3C
        context the job carries to its worker (protocol.md, "Traces"); None sends the current
        OpenTelemetry span's when opentelemetry-api is installed and a span is current, ""
        sends none.

        Raises ValueError for an option the server would refuse, :class:`BadOption`,
        :class:`UnknownParent`, :class:`JobTooBig`, :class:`Draining`, and
        :class:`UnknownCommand` from beanstalkd.
        """
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        line = put_with_line(pri, delay, ttr, len(data), delay_ms=delay_ms, max_tries=max_tries,
                             backoff_ms=backoff_ms, backoff_max_ms=backoff_max_ms,
                             ttl_ms=ttl_ms, on_expire=on_expire, key=key, after=after,
                             result_ttl_ms=result_ttl_ms, group=group,
                             traceparent=traceparent)

        def convert(reply: Reply, link: Connection) -> PutResult:
            _expect(reply, "put-with", INSERTED, DUPLICATE)
            return PutResult(reply.int_arg(0), inserted=reply.word == INSERTED)

        return await self._call(line + data + CRLF, convert)

    # -- ends: wait and request/reply (tubeq) -------------------------------------------------

    @overload
    async def wait_end(self, job_id: int, timeout: float) -> Ended: ...

    @overload
    async def wait_end(self, job_id: int, timeout: float,
                       progress_after: int) -> Ended | Progress: ...

    async def wait_end(self, job_id: int, timeout: float,
                       progress_after: int | None = None) -> Ended | Progress:
        """How job ``job_id`` ended, waiting up to ``timeout`` s for it (0: don't wait); with
        ``progress_after``, also its latest progress report once it made more than that many
        (wait again with the report's ``seq``). The connection runs nothing else meanwhile
        (as with ``reserve``).

        Raises :class:`TimedOut` (the job lives on), :class:`NotFound` (no such job, or it
        ended nobody waiting and was not finished, or its result's time ran out).
        """
        def convert(reply: Reply, link: Connection) -> Ended | Progress:
            _expect(reply, "wait", ENDED, PROGRESS)
            return ended_of(reply) if reply.word == ENDED else progress_of(reply)

        line = wait_line(job_id, timeout, progress_after)
        try:
            return await self._call_within(line, convert, timeout + REPLY_GRACE_S)
        except TimeoutError:  # the server did not answer (stopped, cut off)
            raise TimedOut("wait", " (no answer from the server)") from None

    async def cancel(self, job_id: int) -> None:
        """The job is not to run (again): deleted now, or, reserved, when its holder next
        touches, finishes, fails, releases or buries it, or at its TTR (tubeq's ``cancel``).
        Raises :class:`NotFound` when there is no such job."""
        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "cancel", CANCELLED)

        await self._call(b"cancel %d\r\n" % _job_id(job_id), convert)

    @overload
    async def wait(self, job_id: int, timeout: float) -> bytes: ...

    @overload
    async def wait(self, job_id: int, timeout: float, *, codec: Codec) -> Any: ...

    async def wait(self, job_id: int, timeout: float, *, codec: Codec | None = None) -> Any:
        """The result of job ``job_id`` once a worker finished it, waiting up to ``timeout``
        s (decoded by ``codec``, e.g. :data:`tubeq.client.JSON`); :class:`JobNotFinished` when
        it ended otherwise (deleted, buried, expired), and the errors of :meth:`wait_end`."""
        result = result_of(await self.wait_end(job_id, timeout))
        return result if codec is None else codec.decode(result)

    @overload
    async def call(self, tube: str, body: bytes | str, *, timeout: float,
                   pri: int = ..., ttr: int = ..., key: str | None = ...,
                   max_tries: int | None = ..., ttl_ms: int | None = ...) -> bytes: ...

    @overload
    async def call(self, tube: str, body: Any, *, timeout: float,
                   pri: int = ..., ttr: int = ..., key: str | None = ...,
                   max_tries: int | None = ..., ttl_ms: int | None = ...,
                   codec: Codec) -> Any: ...

    async def call(self, tube: str, body: Any, *, timeout: float,
                   pri: int = DEFAULT_PRIORITY, ttr: int = DEFAULT_TTR, key: str | None = None,
                   max_tries: int | None = None, ttl_ms: int | None = None,
                   codec: Codec | None = None) -> Any:
        """Request/reply: put a job into ``tube`` and wait up to ``timeout`` s for a worker to
        finish it; its result. One command (``put-with ... tube=... notify-ms=...``): the put
        is answered at once and the end comes later as a frame, so any number of calls share
        the client's connection (a web app's handlers share one client); the used tube stays
        as it was. With ``key``, a call while a job of that key lives waits for that job. With
        ``codec`` (e.g. :data:`tubeq.client.JSON`) ``body`` is any value it encodes, and the
        result is decoded by it (a ``consume(codec=...)`` handler returns values).

        Raises :class:`CallTimedOut` (``job_id``: the job lives on; :meth:`wait` for it again),
        :class:`JobNotFinished` (deleted, buried or expired instead), and put-with's errors.
        """
        if codec is not None:
            body = codec.encode(body)
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if max_tries is None and ttl_ms is None and key is None:  # the usual call, at once
            head = b"put-with %d 0 %d %d tube=%s%s" % (
                _uint(pri, "pri"), _uint(ttr, "ttr"), len(data), _tube(tube),
                traceparent_option(None))
        else:
            line = put_with_line(pri, 0, ttr, len(data), delay_ms=None, max_tries=max_tries,
                                 backoff_ms=None, backoff_max_ms=None, ttl_ms=ttl_ms,
                                 on_expire=None, key=key)
            head = line[:-2] + b" tube=%s" % _tube(tube)
        ms = wait_ms(timeout)
        if not self._calls_hold:
            try:
                result = await self._call_notified(head, ms, data, timeout)
            except BadOption as refused:
                if refused.option != "notify-ms":
                    raise
                self._calls_hold = True  # nothing was stored: call again the older way
            else:
                return result if codec is None else codec.decode(result)
        result = await self._call_held(head, ms, data, timeout)
        return result if codec is None else codec.decode(result)

    async def _call_notified(self, head: bytes, ms: int, data: bytes, timeout: float) -> bytes:
        """A call by put-with notify-ms: the put answered at once, the end as a frame later
        (the connection stays free for the client's other commands)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout + REPLY_GRACE_S

        def convert(reply: Reply, link: Connection) -> tuple[int, asyncio.Future[Reply]]:
            _expect(reply, "call", INSERTED, DUPLICATE)
            job_id = reply.int_arg(0)
            return job_id, link.expect_end(job_id, deadline)

        try:
            job_id, end = await self._call_within(
                b"%s notify-ms=%d\r\n%s\r\n" % (head, ms, data), convert,
                timeout + REPLY_GRACE_S)
        except TimeoutError:  # the server did not answer (stopped, cut off)
            raise CallTimedOut("call", None) from None
        timer = loop.call_at(deadline, end.cancel)
        try:
            frame = await end
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled, not the call
            raise CallTimedOut("call", job_id) from None  # stored; its end never came
        finally:
            timer.cancel()
            end.cancel()
        if frame.args[1] == END_TIMED_OUT:
            raise CallTimedOut("call", frame.int_arg(0))
        return result_of(ended_of(frame))

    async def _call_held(self, head: bytes, ms: int, data: bytes, timeout: float) -> bytes:
        """A call by put-with wait-ms (a tubeq without notify-ms): the command holds the
        connection until the job ended or the time ran out."""
        def convert(reply: Reply, link: Connection) -> Ended | int:
            _expect(reply, "call", ENDED, INSERTED, DUPLICATE)
            return ended_of(reply) if reply.word == ENDED else reply.int_arg(0)

        try:
            outcome = await self._call_within(b"%s wait-ms=%d\r\n%s\r\n" % (head, ms, data),
                                              convert, timeout + REPLY_GRACE_S)
        except TimeoutError:  # the server did not answer (stopped, cut off)
            raise CallTimedOut("call", None) from None
        if isinstance(outcome, int):
            raise CallTimedOut("call", outcome)
        return result_of(outcome)

    async def peek_key(self, key: str) -> Job:
        """The living job put with dedupe ``key``; :class:`NotFound` if none."""
        line = b"peek-key %s\r\n" % key_arg(key)
        return await self._call(line, self._found("peek-key", lambda: None))
    # -- admin verbs (tubeq; protocol.md "Admin verbs") ---------------------------------------

    async def clear_tube(self, tube: str, state: str = "all") -> int:
        """Delete the tube's jobs in ``state`` (``all``, ``ready``, ``delayed`` or ``buried``;
        never reserved ones); returns how many. :class:`NotFound` if no such tube."""
        line = b"clear-tube %s %s\r\n" % (_tube(tube), admin.check_state(state,
                                                                          admin.CLEAR_STATES))

        def convert(reply: Reply, link: Connection) -> int:
            _expect(reply, "clear-tube", CLEARED)
            return reply.int_arg(0)

        return await self._call(line, convert)

    async def list_jobs(self, tube: str, state: str = "ready", *, cursor: str = admin.START,
                        count: int = 100) -> admin.JobPage:
        """One page of the tube's jobs in ``state``, after ``cursor`` (``"0"``: the first
        page; then the previous page's ``cursor``, until it is ``"0"`` again)."""
        if count == 0:
            raise ValueError("count must be at least 1")
        line = b"list-jobs %s %s %s %d\r\n" % (
            _tube(tube), admin.check_state(state, admin.LIST_STATES),
            admin.check_cursor(cursor), _uint(count, "count", admin.LIST_JOBS_MAX))
        return await self._call(line, _ok("list-jobs", admin.parse_job_page))

    async def iter_jobs(self, tube: str, state: str = "ready", *,
                        page_size: int = 100) -> AsyncIterator[admin.ListedJob]:
        """Every job of the tube in ``state``, page by page (see :meth:`list_jobs` for what
        a walk guarantees while jobs come and go)."""
        cursor = admin.START
        while True:
            page = await self.list_jobs(tube, state, cursor=cursor, count=page_size)
            for job in page.jobs:
                yield job
            if page.last:
                return
            cursor = page.cursor

    async def change_pri(self, job_id: int, pri: int) -> None:
        """Give a job a new priority, in any state. :class:`NotFound` if no such job."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "change-pri", CHANGED)

        await self._call(b"change-pri %d %d\r\n" % (_job_id(job_id), _uint(pri, "pri")), convert)

    async def change_delay(self, job_id: int, delay_ms: int) -> None:
        """Make a delayed job due ``delay_ms`` ms from now (0: ready at once).
        :class:`NotFound` if no such job or it is not delayed."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "change-delay", CHANGED)

        line = b"change-delay %d %d\r\n" % (_job_id(job_id),
                                            _uint(delay_ms, "delay_ms", U32_MAX * 1000))
        await self._call(line, convert)

    async def tube_pause(self, tube: str) -> None:
        """Pause ``tube`` with no end (until :meth:`tube_resume`); it outlives its users."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "tube-pause", PAUSED)

        await self._call(b"tube-pause %s\r\n" % _tube(tube), convert)

    async def tube_resume(self, tube: str) -> None:
        """End the tube's pause, with or without an end."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "tube-resume", RESUMED)

        await self._call(b"tube-resume %s\r\n" % _tube(tube), convert)

    async def quiet(self, *, tube: str | None = None, conn: str | None = None) -> None:
        """Ask the namespace's push consumers to stop taking jobs, on every tubeq process:
        all of them, those watching ``tube``, or connection ``conn`` (its token, as the
        server's log names it). Consumers of this client stop quietly (see Consumer)."""
        if tube is not None and conn is not None:
            raise ValueError("quiet: give tube or conn, or neither (all)")
        if tube is not None:
            line = b"quiet tube %s\r\n" % _tube(tube)
        elif conn is not None:
            if not conn or not conn.isascii() or not conn.isprintable() or " " in conn:
                raise ValueError(f"quiet: not a connection token: {conn!r}")
            line = b"quiet conn %s\r\n" % conn.encode("ascii")
        else:
            line = b"quiet all\r\n"

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "quiet", QUIETING)

        await self._call(line, convert)

    # -- recurring jobs (tubeq) ----------------------------------------------------------------

    async def schedule_add(self, tube: str, name: str, body: bytes | str, *,
                           cron: str | None = None, every_ms: int | None = None,
                           pri: int = DEFAULT_PRIORITY, ttr: int = DEFAULT_TTR,
                           delay_ms: int = 0) -> int:
        """Make ``tube`` get a job with ``body`` on every tick of ``cron`` (a 5-field cron
        expression or an ``@hourly``-style alias, in UTC) or every ``every_ms`` ms (at least
        100), exactly once per tick whatever the number of tubeq processes. A schedule of the
        same name is replaced. Returns when it first ticks (ms since the epoch).

        Raises :class:`BadOption` (``option`` ``cron`` or ``every-ms``) for an expression that
        does not parse or an interval too short, :class:`JobTooBig`, and
        :class:`UnknownCommand` from a server without recurring jobs (beanstalkd).
        """
        if (cron is None) == (every_ms is None):
            raise ValueError("give exactly one of cron and every_ms")
        data = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        when = (b"cron=" + cron_on_the_wire(cron).encode("ascii") if cron is not None
                else b"every-ms=%d" % _uint(every_ms or 0, "every_ms", 2**64 - 1))
        line = b"schedule-add %s %s %d %s pri=%d ttr=%d delay-ms=%d\r\n" % (
            _tube(tube), _tube(name), len(data), when, _uint(pri, "pri"), _uint(ttr, "ttr"),
            _uint(delay_ms, "delay_ms", 2**64 - 1))

        def convert(reply: Reply, link: Connection) -> int:
            _expect(reply, "schedule-add", SCHEDULED)
            return reply.int_arg(0)

        return await self._call(line + data + CRLF, convert)

    async def schedule_list(self, tube: str) -> list[Schedule]:
        """The schedules of ``tube``, by name (none: an empty list)."""
        return await self._call(b"schedule-list %s\r\n" % _tube(tube),
                                _ok("schedule-list", parse_schedule_list))

    async def schedule_remove(self, tube: str, name: str) -> None:
        """Stop one of ``tube``'s schedules (its jobs already put stay); :class:`NotFound`
        when it has none of that name."""

        def convert(reply: Reply, link: Connection) -> None:
            _expect(reply, "schedule-remove", REMOVED)

        await self._call(b"schedule-remove %s %s\r\n" % (_tube(tube), _tube(name)), convert)

    # -- consumption --------------------------------------------------------------------------

    def consume(self, tubes: str | Iterable[str], *, concurrency: int = 32,
                connections: int | None = None, auto_touch: bool = False,
                max_tries: int | None = 5, backoff_base: int = 1, backoff_max: int = 60,
                push: bool | None = None, reserve_timeout: int = 1,
                grace: float = 30.0, codec: Codec | None = None, prefetch: int = 0,
                stop_signals: Iterable[int] = (signal.SIGTERM,)) -> Consumer:
        """Jobs of ``tubes`` as they come, up to ``concurrency`` handled and ``prefetch``
        more held at once; stopped quietly on ``stop_signals`` (see Consumer)."""
        return Consumer(self, tubes, concurrency=concurrency, connections=connections,
                        auto_touch=auto_touch, max_tries=max_tries, backoff_base=backoff_base,
                        codec=codec,
                        backoff_max=backoff_max, push=push, reserve_timeout=reserve_timeout,
                        grace=grace, prefetch=prefetch, stop_signals=stop_signals)

    async def work(self, handler: Callable[[Job], Awaitable[object]],
                   tubes: str | Iterable[str], **options: Any) -> None:
        """Run ``handler(job)`` for every job of ``tubes`` until cancelled (see Consumer.run)."""
        await self.consume(tubes, **options).run(handler)

    # -- batches (tubeq's put-many, reserve-many, delete-many) --------------------------------

    async def extensions(self) -> list[str]:
        """The server's extension commands (tubeq); :class:`UnknownCommand` from beanstalkd."""
        return await self._call(*batches.extensions_command(probe=False))

    async def _extensions_of(self, link: Connection) -> frozenset[str]:
        """What ``link``'s server offers, asked once per connection (beanstalkd: nothing)."""
        if link.extensions is None:
            await self._call_on(link, *batches.extensions_command(probe=True))
        return link.extensions or frozenset()

    async def put_many(self, jobs: Iterable[bytes | str | batches.NewJob], *,
                       pri: int = DEFAULT_PRIORITY, delay: int = 0,
                       ttr: int = DEFAULT_TTR) -> list[int | CommandError]:
        """Put jobs into the used tube in one round trip; per job, in order, its id or the
        error that refused it (:class:`JobTooBig`, :class:`Draining` ...), not raised.

        A job is a body (``str`` as UTF-8) with ``pri``/``delay``/``ttr``, or a
        :class:`NewJob` with its own. Against tubeq the jobs go as ``put-many`` commands of at
        most 1000 jobs and 4 MiB of bodies each, written at once; against a server without
        batches (beanstalkd, asked once per connection) as pipelined ``put`` commands (a
        NewJob with a group or a traceparent is then refused BAD_FORMAT: they are tubeq's).
        """
        entries = batches._entries(jobs, pri, delay, ttr)
        if not entries:
            return []
        link = await self._current_link()
        if "put-many" in await self._extensions_of(link):
            sent = [link.send(*batches.put_many_command(chunk))
                    for chunk in batches._put_chunks(entries)]
            await link.wait_writable()
            return [result for chunk in await asyncio.gather(*sent) for result in chunk]
        puts = [link.send(*batches.put_command(entry)) for entry in entries]
        await link.wait_writable()
        return list(await asyncio.gather(*puts))

    async def reserve_many(self, count: int, timeout: int) -> list[Job]:
        """Wait up to ``timeout`` s until a job of a watched tube is ready, then reserve up to
        ``count`` (1-1000) at once, in reserve order (tubeq's ``reserve-many``).

        Raises :class:`TimedOut`, :class:`DeadlineSoon` as :meth:`reserve_with_timeout` does,
        :class:`UnknownCommand` from a server without batches (beanstalkd; asked once per
        connection with ``extensions``).
        """
        if not 1 <= count <= PUT_MANY_MAX:
            raise ValueError(f"count must be from 1 to {PUT_MANY_MAX}, not {count!r}")

        def convert(reply: Reply, link: Connection) -> list[Job]:
            items = batches._items(reply, "reserve-many")
            if not 1 <= len(items) <= count or any(i.word != RESERVED for i in items):
                raise ProtocolError(f"reserve-many: a BATCH of {len(items)} replies that are "
                                    f"not 1-{count} jobs")
            return [self._job_from(item, link, None) for item in items]

        line = b"reserve-many %d %d\r\n" % (count, _uint(timeout, "timeout"))
        link = await self._current_link()
        # beanstalkd would answer BAD_FORMAT (its "reserve" claims the line): ask first.
        if "reserve-many" not in await self._extensions_of(link):
            raise UnknownCommand("reserve-many", " (the server has no batch commands)")
        return await self._call_on(link, line, convert, reserves=True)

    async def delete_many(self, job_ids: Iterable[int]) -> list[bool]:
        """Delete jobs in one round trip; per id, in order, whether it was deleted (False:
        not found, or reserved by another connection). Uses ``delete-many`` where the server
        has it, pipelined ``delete`` commands otherwise."""
        return await self._delete_many_on(await self._current_link(), list(job_ids))

    async def _delete_many_on(self, link: Connection, ids: list[int]) -> list[bool]:
        if not ids:
            return []
        if "delete-many" in await self._extensions_of(link):
            sent = [link.send(*command) for command in batches.delete_many_commands(ids)]
            await link.wait_writable()
            return [done for run in await asyncio.gather(*sent) for done in run]
        deletes = [link.send(*batches.delete_command(job_id)) for job_id in ids]
        await link.wait_writable()
        return list(await asyncio.gather(*deletes))

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
