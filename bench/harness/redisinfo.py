"""One-shot commands to a Redis the benchmark started itself: INFO sections, CONFIG RESETSTAT.

Owns: a blocking socket, one command, one reply (parsed by hiredis). It is for reading a private
redis-server's statistics between or after loads, never for load itself, and it refuses any
address outside loopback.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import hiredis

Reply = bytes | int | list["Reply"] | None


def _endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if not host.startswith("127."):
        raise ValueError(f"refusing {url!r}: benchmarks only talk to loopback")
    return host, port


def redis_command(url: str, *args: str | bytes | int) -> Reply:
    """Send one command to the Redis at ``url`` and return its reply."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    reader = hiredis.Reader()
    with socket.create_connection(_endpoint(url), timeout=10.0) as sock:
        sock.sendall(b"".join(parts))
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"{url} closed the connection before replying")
            reader.feed(chunk)
            reply = reader.gets()
            if reply is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise RuntimeError(f"{url}: {reply}")
                return reply  # type: ignore[no-any-return]


def redis_info(url: str, section: str) -> dict[str, str]:
    """``INFO section`` as a dict of its ``key:value`` lines."""
    text = redis_command(url, "INFO", section)
    assert isinstance(text, bytes)
    pairs = (line.split(":", 1) for line in text.decode().splitlines() if ":" in line)
    return {key: value for key, value in pairs}


def command_stats(url: str) -> dict[str, dict[str, float]]:
    """Per command: calls and usec (total CPU time in Redis) since the last CONFIG RESETSTAT."""
    stats: dict[str, dict[str, float]] = {}
    for key, value in redis_info(url, "commandstats").items():
        if not key.startswith("cmdstat_"):
            continue
        fields = dict(item.split("=", 1) for item in value.split(","))
        stats[key[len("cmdstat_"):]] = {"calls": float(fields["calls"]),
                                       "usec": float(fields["usec"])}
    return stats
