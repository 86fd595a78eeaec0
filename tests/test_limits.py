"""Process-wide limits: ``--max-connections`` (issue 12 part 8), against a real tubeq."""

from __future__ import annotations

import socket
import time

from tests.extensions.wire import Wire
from tests.servers import TubeqCluster

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
