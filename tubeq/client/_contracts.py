"""The contracts at the bottom of the client: a command's connection, its reply converter, and
what a :class:`Job` needs of the client that made it.

A command is its bytes and a converter (:data:`Convert`) that turns the reply into the caller's
value. The converter runs as the reply is routed, on the connection the command went on, and
sees that connection as a :class:`Connection`: the state a reply may change there (the
extensions the server offers, push mode) and how to send on it. The batch and job commands and
:class:`Job` know only these Protocols; ``link._Link`` and ``client.Client`` satisfy them, and
only ``client.py`` puts the concrete classes together.

Rules: this module names nothing above ``parser`` (it is what lets job, batches, link and
consume sit below the client without importing it back). A contract that names :class:`Job`
cannot live here; it lives beside the module that needs it (``job.Hold``, ``link.LinkClient``,
``consume.ConsumerClient``). A Protocol lists what its users call, nothing more: a member added
here is a new dependency of the modules below the client on the one above them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from tubeq.client.parser import Reply

T = TypeVar("T")


class Connection(Protocol):
    """One connection as a command and its converter see it (``link._Link``)."""

    # The server's extension words once asked (batches.extensions_command), empty for beanstalkd.
    extensions: frozenset[str] | None
    # push sent / PUSHING answered: RESERVED frames from then on are pushed jobs (Client.push).
    push_requested: bool
    pushing: bool

    def send(self, data: bytes, convert: Convert[T], *,
             reserves: bool = False) -> asyncio.Future[T]:
        """Write one command; the future gets ``convert(reply, connection)`` or its exception."""
        ...

    @property
    def writable(self) -> bool:
        """Whether the transport's write buffer is below its high-water mark now."""
        ...

    async def wait_writable(self) -> None:
        """Return once the transport's write buffer is below its high-water mark."""
        ...

    def expect_end(self, job_id: int, deadline: float) -> asyncio.Future[Reply]:
        """The future of an END frame for job ``job_id`` (put-with notify-ms) of a call whose
        time runs out at ``deadline`` (loop time)."""
        ...


# A reply converter: state updated, value built or exception raised, as the reply is routed.
Convert = Callable[[Reply, Connection], T]


class JobClient(Protocol):
    """What a :class:`Job` needs of the client that made it (``client.Client``): a command sent
    on the client's current connection (a job from peek), or on the connection holding the
    reservation (a reserved job)."""

    async def _call(self, data: bytes, convert: Convert[T]) -> T: ...

    async def _call_on(self, link: Connection, data: bytes, convert: Convert[T]) -> T: ...
