"""The offline guard of the unit tests: while it is on, opening a socket connection, binding a
socket or starting a process raises, and is recorded.

Owns: what is refused and how. Rules: it patches the lowest Python-level doors, so every way
through them is covered: ``socket.socket.connect``/``connect_ex``/``bind`` (redis-py, asyncio's
``open_connection`` and ``start_server``, ``socket.create_connection``);
``subprocess.Popen._execute_child`` (``subprocess.run``, asyncio subprocesses, a private
redis-server), ``_posixsubprocess.fork_exec`` (``multiprocessing``), ``os.fork``/``forkpty``,
``os.posix_spawn``/``posix_spawnp`` and ``os.system``. Each refusal is also recorded, because the
code under test may catch it (redis-py turns it into a ConnectionError and retries): the caller
fails the test on any record. A socketpair (asyncio's self-pipe) needs none of these and stays
allowed. A C extension that opens sockets itself (uvloop's own transports) is not covered; no
unit test uses one.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from typing import Any

import pytest


class OfflineViolation(RuntimeError):
    """A unit test reached for the network or a process."""


class OfflineGuard:
    """Refuses network and process creation from ``install()`` until ``uninstall()``."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._patches = pytest.MonkeyPatch()

    def _refuse(self, what: str) -> OfflineViolation:
        message = (f"{what}: a unit test runs without network and subprocesses "
                   "(a test that needs them does not belong in tests/conftest.py's UNIT_TESTS)")
        self.violations.append(message)
        return OfflineViolation(message)

    def install(self) -> None:
        guard = self

        def connect(sock: socket.socket, address: Any) -> None:
            raise guard._refuse(f"socket connect to {address!r}")

        def connect_ex(sock: socket.socket, address: Any) -> int:
            raise guard._refuse(f"socket connect to {address!r}")

        def bind(sock: socket.socket, address: Any) -> None:
            raise guard._refuse(f"socket bind to {address!r}")

        def spawn(name: str) -> Any:
            def refused(*args: Any, **kwargs: Any) -> Any:
                raise guard._refuse(f"{name} (a subprocess)")
            return refused

        self._patches.setattr(socket.socket, "connect", connect)
        self._patches.setattr(socket.socket, "connect_ex", connect_ex)
        self._patches.setattr(socket.socket, "bind", bind)
        self._patches.setattr(subprocess.Popen, "_execute_child", spawn("subprocess.Popen"))
        self._patches.setattr(_posixsubprocess, "fork_exec", spawn("fork_exec"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                self._patches.setattr(os, name, spawn(f"os.{name}"))

    def uninstall(self) -> None:
        self._patches.undo()

    def take_violations(self) -> list[str]:
        """What was refused since the last call (and forget it)."""
        taken, self.violations = self.violations, []
        return taken
