"""The bundled asyncio client: every beanstalkd command as a typed method, and ``consume()``.

It speaks the beanstalkd protocol, so it works against tubeq and against beanstalkd itself. The
layers run one way, as in the server (socket -> parser -> conversion -> caller), one module each:

* :mod:`~tubeq.client.wire`: the vocabulary. Defaults, limits, the reply words and the reply
  grammar (:data:`REPLY_ARITY`).
* :mod:`~tubeq.client.errors`: every exception, and :data:`ERRORS`, the table from error reply
  to exception.
* :mod:`~tubeq.client.parser` is sans-IO: :class:`ReplyParser` takes bytes and gives complete
  :class:`Reply` frames. It enforces the grammar, the line and body limits, and the
  length-delimited bodies; it never returns part of a frame, so no half-read job can escape it.
  The YAML readers of the stats and list documents live there too.
* :mod:`~tubeq.client.args`: the checks of a command's arguments before it is sent, and
  ``_expect``, the one check of its answer.
* :mod:`~tubeq.client._contracts`: the Protocols the modules below :class:`Client` know it and
  its connection by (a command's ``Connection`` and reply converter, what a :class:`Job` needs
  of its client), so that none of them imports the client back.
* :mod:`~tubeq.client.job`: :class:`Job`, and the commands on one job id.
* :mod:`~tubeq.client.link`: ``_Link`` is one TCP connection, a thin :class:`asyncio.Protocol`:
  it writes commands, feeds the parser and hands each reply, in wire order, to the command that
  asked for it. Replies are converted (state updated, :class:`Job` built, error raised)
  synchronously as they are routed, whether or not the caller is still waiting, so pipelined
  calls and cancelled calls cannot disturb the connection's state.
* :mod:`~tubeq.client.consume`: :class:`Consumer` (``client.consume()``) keeps jobs in flight
  over long-lived connections of its own, with a server-side push extension when the server has
  one and pipelined ``reserve-with-timeout`` otherwise.
* :mod:`~tubeq.client.client`: :class:`Client` holds one link at a time: typed methods,
  reconnect, and the ``use``/``watch`` state replayed on a new connection.
* :mod:`~tubeq.client.blocking`: :class:`BlockingClient`, put, call and wait over a plain
  socket for code without an event loop (beside ``client``; neither imports the other).

A module imports only the ones listed before it. tubeq's command families (batches, admin,
policies, schedules, ends) sit beside job, and only client (and cli, on top) imports them.
pyproject's ``client-layers`` contract holds that order. What a lower module needs of a higher
one is a Protocol it declares and the higher one satisfies.

Import from ``tubeq.client`` itself; the modules are its implementation.

Rules:

* Error replies become exceptions through one table, :data:`ERRORS`. A reply outside the grammar
  or one that does not answer the command raises :class:`ProtocolError` and closes the connection
  (nothing after a bad frame can be trusted); a closed or lost connection raises
  :class:`ClientConnectionError` for every call still waiting.
* A reservation belongs to a connection, as on the server. A reserved :class:`Job` is bound to
  the link that reserved it; its ``delete``/``release``/``bury``/``touch`` go on that link and
  fail with :class:`ClientConnectionError` once it is gone (the server has already put the job
  back), never on a fresh connection where they would mean something else.
* Pipelined commands wait behind a blocking reserve on the server. A reserve whose caller was
  cancelled stays on the server; if it is later granted, the client releases the job at its
  original priority (the job is "orphaned", see ``Client._release_orphan``).

Logging goes to the standard ``logging`` module (logger ``tubeq.client``, whichever module logs):
a library should not impose the server's structlog setup on the applications that import it.
"""

from __future__ import annotations

from tubeq.client.admin import JobPage as JobPage  # admin verbs: list-jobs pages
from tubeq.client.admin import ListedJob as ListedJob
from tubeq.client.batches import NewJob as NewJob
from tubeq.client.blocking import BlockingClient  # put, call and wait without an event loop
from tubeq.client.client import Client
from tubeq.client.consume import Consumer, backoff_delay, touch_interval
from tubeq.client.ends import JSON, Codec, Ended, Progress  # jobs that answer: wait, call ...
from tubeq.client.errors import (
    ERRORS,
    BadFormat,
    BadOption,
    Buried,
    CallTimedOut,
    ClientConnectionError,
    ClientError,
    CommandError,
    DeadlineSoon,
    Draining,
    ExpectedCrlf,
    InternalError,
    JobCancelled,
    JobNotFinished,
    JobTooBig,
    NotFound,
    NotIgnored,
    OutOfMemory,
    ProtocolError,
    TimedOut,
    UnknownCommand,
    UnknownParent,
)
from tubeq.client.job import Job
from tubeq.client.parser import JOB_TEXT_KEYS as JOB_TEXT_KEYS
from tubeq.client.parser import SERVER_TEXT_KEYS as SERVER_TEXT_KEYS
from tubeq.client.parser import TUBE_TEXT_KEYS as TUBE_TEXT_KEYS
from tubeq.client.parser import Reply, ReplyParser, Stats, parse_yaml_list, parse_yaml_mapping
from tubeq.client.parser import StatValue as StatValue
from tubeq.client.policies import PutResult
from tubeq.client.wire import DEFAULT_HOST as DEFAULT_HOST
from tubeq.client.wire import DEFAULT_PORT, DEFAULT_PRIORITY, DEFAULT_TTR
from tubeq.client.wire import DEFAULT_TUBE as DEFAULT_TUBE
from tubeq.client.wire import MAX_BODY as MAX_BODY
from tubeq.client.wire import MAX_REPLY_LINE as MAX_REPLY_LINE
from tubeq.client.wire import U32_MAX as U32_MAX
from tubeq.client.wire import U64_MAX as U64_MAX

# The names aliased to themselves above are not in __all__ but stay importable from here, as
# before the split (tubeq.client.cli and the tests use some); the alias marks them re-exported.
__all__ = [
    "DEFAULT_PORT", "DEFAULT_PRIORITY", "DEFAULT_TTR", "ERRORS", "BadFormat", "BadOption",
    "Buried", "Client", "ClientConnectionError", "ClientError", "CommandError", "Consumer",
    "DeadlineSoon", "Draining", "ExpectedCrlf", "InternalError", "Job", "JobTooBig", "NotFound",
    "NotIgnored", "OutOfMemory", "ProtocolError", "PutResult", "Reply", "ReplyParser", "Stats",
    "TimedOut", "UnknownCommand", "backoff_delay", "parse_yaml_list", "parse_yaml_mapping",
    "touch_interval",
]

# tubeq's extensions: a refused option; recurring jobs
from tubeq.client.schedules import Schedule

__all__ += ["BadOption", "Schedule"]
__all__ += ["BlockingClient", "CallTimedOut", "Ended", "JobCancelled",  # jobs that answer
            "JobNotFinished", "Progress"]
__all__ += ["UnknownParent"]  # dependencies: put-with after=
__all__ += ["JSON", "Codec"]  # values as bodies and results (call, wait, consume)
