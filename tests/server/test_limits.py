"""Process-wide limits: ``--max-connections`` (issue 12 part 8), against a real tubeq."""

from __future__ import annotations

import socket
import time

from tests.support.servers import TubeqCluster
from tests.support.wire import Wire
from tubeq.server.context import REFUSALS_LOGGED_EVERY_S, Capacity

WAIT_S = 10.0


def test_connections_past_the_limit_get_one_line_and_are_closed(
        tubeq_cluster: TubeqCluster) -> None:
    server = tubeq_cluster.start(label="tubeq-max-conn", flags=("--max-connections", "2"))
    try:
        with Wire(server.host, server.port) as a, Wire(server.host, server.port) as b:
            assert a.ask("use a") == b"USING a\r\n"
            assert b.ask("use b") == b"USING b\r\n"
            with socket.create_connection((server.host, server.port), timeout=WAIT_S) as c:
                out = b""
                while chunk := c.recv(100):
                    out += chunk
                assert out == b"TOO_MANY_CONNECTIONS\r\n"  # then closed
            assert a.ask("list-tube-used") == b"USING a\r\n"  # the others go on
        # Both closed: room again (the server sees the closes shortly after).
        deadline = time.monotonic() + WAIT_S
        while True:
            with Wire(server.host, server.port) as d:
                reply = d.ask("list-tube-used")
            if reply == b"USING default\r\n" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert reply == b"USING default\r\n"
    finally:
        server.stop()


REFUSED = 40  # connections over the cap, opened as fast as the test can


def test_a_flood_of_refused_connections_costs_the_log_a_line_a_second(
        tubeq_cluster: TubeqCluster) -> None:
    """Any client can open connections over --max-connections by the thousand: the first
    refusal is logged at once, the others at most one line a second, each saying how many
    went unlogged before it (tubeq.server.context.REFUSALS_LOGGED_EVERY_S)."""
    server = tubeq_cluster.start(label="tubeq-refusals", flags=("--max-connections", "1"))
    try:
        with Wire(server.host, server.port) as a:
            assert a.ask("use a") == b"USING a\r\n"
            began = time.monotonic()
            for _ in range(REFUSED):
                with socket.create_connection((server.host, server.port), timeout=WAIT_S) as c:
                    assert c.recv(100) == b"TOO_MANY_CONNECTIONS\r\n"
            took = time.monotonic() - began
            assert a.ask("list-tube-used") == b"USING a\r\n"
        lines = [line for line in server.log_path.read_text().splitlines()
                 if "connection refused: --max-connections reached" in line]
        assert 1 <= len(lines) <= took + 2, (len(lines), took)
        assert "refused_unlogged_before=0" in lines[0]
        if took < 1:  # all within the first second: one line for the lot
            assert len(lines) == 1
    finally:
        server.stop()


def test_a_namespace_at_max_jobs_refuses_puts_until_it_has_room(
        tubeq_cluster: TubeqCluster) -> None:
    server = tubeq_cluster.start(label="tubeq-max-jobs", flags=("--max-jobs", "3"))
    try:
        with Wire(server.host, server.port) as w:
            ids = []
            for tube in ("a", "b", "a"):  # the cap is the namespace's, across tubes
                assert w.ask(f"use {tube}").startswith(b"USING")
                reply = w.ask(b"put 0 0 60 1\r\nx\r\n")
                assert reply.startswith(b"INSERTED ")
                ids.append(reply.split()[1].decode())
            # Counted once a second: within a few seconds puts are refused, nothing stored.
            deadline = time.monotonic() + WAIT_S
            while (reply := w.ask(b"put 0 0 60 1\r\ny\r\n")) != b"OUT_OF_MEMORY\r\n":
                assert reply.startswith(b"INSERTED ") and time.monotonic() < deadline
                ids.append(reply.split()[1].decode())
                time.sleep(0.05)
            held = len(ids)
            assert w.ask(b"put-with 0 0 60 1 key=z\r\nz\r\n") == b"OUT_OF_MEMORY\r\n"
            for job_id in ids[: held - 2]:  # room again
                assert w.ask(f"delete {job_id}") == b"DELETED\r\n"
            deadline = time.monotonic() + WAIT_S
            while (reply := w.ask(b"put 0 0 60 1\r\nw\r\n")) == b"OUT_OF_MEMORY\r\n":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert reply.startswith(b"INSERTED ")
    finally:
        server.stop()


def test_a_connection_watches_at_most_max_watch_tubes(tubeq_cluster: TubeqCluster) -> None:
    """--max-watch: a watch past it answers OUT_OF_MEMORY (a generic error every beanstalkd
    client knows) and changes nothing; the limit bounds what one reserve reads in Redis."""
    server = tubeq_cluster.start(label="tubeq-max-watch", flags=("--max-watch", "3"))
    try:
        with Wire(server.host, server.port) as w:
            assert w.ask("watch a") == b"WATCHING 2\r\n"
            assert w.ask("watch b") == b"WATCHING 3\r\n"
            assert w.ask("watch c") == b"OUT_OF_MEMORY\r\n"
            assert w.ask("watch b") == b"WATCHING 3\r\n"  # already watched: no new tube
            assert w.ask("list-tubes-watched").endswith(b"\r\n---\n- default\n- a\n- b\n\r\n")
            assert w.ask("ignore a") == b"WATCHING 2\r\n"
            assert w.ask("watch c") == b"WATCHING 3\r\n"
            assert w.ask("stats-tube c").startswith(b"OK ")  # c exists: watched for real
    finally:
        server.stop()


def test_refusals_are_logged_at_most_once_per_interval_with_the_count_held_back() -> None:
    """Capacity.refusal_to_log, the rule both listeners' refusals follow (the HTTP listener's
    --http-max-connections too), on a clock the test moves."""
    now = [100.0]
    cap = Capacity(limit=1, clock=lambda: now[0])
    assert cap.refusal_to_log() == 0  # the first: logged at once
    assert [cap.refusal_to_log() for _ in range(5)] == [None] * 5  # counted, unlogged
    now[0] += REFUSALS_LOGGED_EVERY_S
    assert cap.refusal_to_log() == 5  # the next line says how many it held back
    now[0] += REFUSALS_LOGGED_EVERY_S / 2
    assert cap.refusal_to_log() is None
    now[0] += REFUSALS_LOGGED_EVERY_S
    assert cap.refusal_to_log() == 1
