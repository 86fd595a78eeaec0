"""The ``--events`` and ``--events-maxlen`` flags: their defaults, their errors, a real process.

Events are on by default with tubeq's private redis-server and off with ``--redis`` (a shared
Redis's memory belongs to someone else) unless ``--events on`` asks for them.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import redis

from tests.support.servers import TubeqCluster, unique_prefix
from tubeq.cli import events_maxlen, parse_args
from tubeq.model.events import Event
from tubeq.server.process import DEFAULT_EVENTS_MAXLEN
from tubeq.store.keys import Keys


@pytest.mark.parametrize(("flags", "expected"), [
    ([], DEFAULT_EVENTS_MAXLEN),                                   # private redis-server: on
    (["--events-maxlen", "500"], 500),
    (["--events", "off"], 0),
    (["--redis", "redis://127.0.0.1:1/0"], 0),                    # shared Redis: off
    (["--redis", "redis://127.0.0.1:1/0", "--events", "on"], DEFAULT_EVENTS_MAXLEN),
    (["--redis", "redis://127.0.0.1:1/0", "--events", "on", "--events-maxlen", "7"], 7),
    (["--redis", "redis://127.0.0.1:1/0", "--events-maxlen", "7"], 0),
])
def test_events_default_on_with_the_private_redis_only(flags: list[str], expected: int) -> None:
    assert events_maxlen(parse_args(flags)) == expected


@pytest.mark.parametrize(("flags", "message"), [
    (["--events", "yes"], b"argument --events: invalid choice: 'yes'"),
    (["--events"], b"argument --events: expected one argument"),
    (["--events-maxlen", "0"], b"--events-maxlen must be at least 1"),
    (["--events-maxlen", "-5"], b"--events-maxlen must be at least 1"),
    (["--events-maxlen", "lots"], b"argument --events-maxlen: invalid int value: 'lots'"),
])
def test_bad_event_flags_are_refused(flags: list[str], message: bytes) -> None:
    proc = subprocess.run([sys.executable, "-m", "tubeq", *flags], capture_output=True,
                          timeout=30)
    assert proc.returncode == 2 and message in proc.stderr


def _put_one(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"put 3 0 7 2\r\nhi\r\nquit\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"INSERTED ")


@pytest.mark.parametrize("flags", [(), ("--events", "off"), ("--events", "on")])
def test_a_real_process_with_redis_writes_events_only_when_asked(
        tubeq_cluster: TubeqCluster, flags: tuple[str, ...]) -> None:
    prefix = unique_prefix("events")
    server = tubeq_cluster.start(prefix, label="tubeq-events", flags=flags)
    try:
        _put_one(server.address)
        with redis.Redis.from_url(tubeq_cluster.redis.url) as store:
            entries = store.xrange(Keys(prefix).events)
    finally:
        server.stop()
    if flags != ("--events", "on"):
        assert entries == []
        return
    [event] = [Event.from_entry(sid, fields) for sid, fields in entries]
    assert (event.event, event.tube, event.pri, event.ttr_ms, event.tries) == (
        "put", "default", 3, 7000, 0)
    assert event.by != ""  # the process's instance id
