"""What the commands that follow the live event stream share (``tail``, ``live``): the arguments
that name the stream, the source options they give, and the loop that runs a streaming query in
the foreground until it is told to stop.

Rules: a query is followed until it ends by itself (AvailableNow), ``--seconds`` pass,
``--batches`` micro-batches have read events, or ^C; then it is stopped, and what it read and how
it ended are returned, not printed: each command says it in its own words. Progress reports are
tallied as they come, because Spark keeps only the last hundred.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.query import StreamingQuery

from tubeq.pipeline.source import DEFAULT_REDIS

POLL_S: Final = 1  # awaitTermination takes whole seconds


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """``--redis`` and ``--prefix`` or ``--key`` (the stream a command reads), and
    ``--max-events-per-trigger``."""
    parser.add_argument("--redis", default=DEFAULT_REDIS,
                        help=f"Redis URL of the event stream (default {DEFAULT_REDIS})")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument("--prefix", default="tubeq", help="tubeq namespace (default tubeq)")
    stream.add_argument("--key", help="the stream's key, instead of a namespace")
    parser.add_argument("--max-events-per-trigger", type=int, default=None, metavar="N",
                        help="at most N events per micro-batch")


def stream_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``tubeq`` source's options for the arguments of :func:`add_stream_arguments`."""
    options = {"redis": args.redis}
    if args.key:
        options["key"] = args.key
    else:
        options["prefix"] = args.prefix
    if args.max_events_per_trigger:
        options["maxEventsPerTrigger"] = str(args.max_events_per_trigger)
    return options


@dataclass(frozen=True)
class Followed:
    """How a followed query went: events per micro-batch id, and its failure if it failed."""

    events_per_batch: Mapping[int, int]
    error: StreamingQueryException | None

    @property
    def events(self) -> int:
        return sum(self.events_per_batch.values())

    @property
    def batches(self) -> int:
        """The micro-batches that read events."""
        return sum(1 for events in self.events_per_batch.values() if events > 0)


def follow(query: StreamingQuery, seconds: float | None, batches: int | None) -> Followed:
    """Wait on ``query`` until it ends by itself, ``seconds`` have passed, ``batches``
    micro-batches have read events, or ^C; then stop it."""
    started = time.monotonic()
    read: dict[int, int] = {}

    def tally() -> None:
        for progress in query.recentProgress:
            read[int(progress["batchId"])] = int(progress.get("numInputRows", 0))

    try:
        while query.isActive:
            with contextlib.suppress(StreamingQueryException):  # read below, as exception()
                query.awaitTermination(POLL_S)
            tally()
            if batches is not None and Followed(read, None).batches >= batches:
                break
            if seconds is not None and time.monotonic() - started >= seconds:
                break
    except KeyboardInterrupt:
        pass
    error = query.exception() if not query.isActive else None
    query.stop()
    tally()
    return Followed(read, error)
