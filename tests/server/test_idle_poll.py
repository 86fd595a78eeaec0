"""The idle poll (tubeq.server.idle_poll): the window it polls for after input, on a loop of
fake time; that a real loop keeps turning meanwhile and sleeps after; that a server with a
window tells it of its clients' bytes and of Redis's replies; and the command line's default,
off where the cgroup allows less than one core."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tubeq.server.idle_poll import DEFAULT_IDLE_POLL_US, IdlePoll, cpu_limit, default_window_us
from tubeq.server.process import Config, Server


class _FakeLoop:
    """A loop's call_soon, callbacks run by the test, and a clock it moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.soon: list[Callable[[], None]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def turn(self) -> None:
        """One loop turn: the callbacks scheduled before it."""
        callbacks, self.soon = self.soon, []
        for callback in callbacks:
            callback()


@pytest.fixture
def yields(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """sched_yield, counted (each poll yields the CPU first)."""
    counted: list[None] = []
    monkeypatch.setattr("tubeq.server.idle_poll._sched_yield", lambda: counted.append(None))
    return counted


def test_a_window_must_be_positive() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="positive"):
            IdlePoll(loop, 0)
    finally:
        loop.close()


def test_it_polls_for_the_window_after_the_last_input(yields: list[None],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _FakeLoop()
    monkeypatch.setattr("tubeq.server.idle_poll._clock", loop.time)  # the window's clock
    poll = IdlePoll(loop, 0.001)  # type: ignore[arg-type]
    assert not poll.polling and not loop.soon  # no input yet: the loop may sleep
    poll.input()
    assert poll.polling and len(loop.soon) == 1
    loop.turn()  # the window starts: 0 .. 1 ms
    assert len(loop.soon) == 1 and len(yields) == 1
    loop.now = 0.0009
    loop.turn()
    assert poll.polling and len(loop.soon) == 1
    poll.input()  # while polling: no second callback, the window starts again
    assert len(loop.soon) == 1
    loop.now = 0.0012
    loop.turn()  # the new window: 1.2 .. 2.2 ms
    loop.now = 0.0021
    loop.turn()
    assert poll.polling and len(loop.soon) == 1
    loop.now = 0.0023
    loop.turn()  # past it: no callback left, the loop may sleep
    assert not poll.polling and not loop.soon
    assert len(yields) == 4  # every poll that went on yielded first; the last did not
    poll.input()  # the next input opens a window again
    assert poll.polling and len(loop.soon) == 1


async def test_a_real_loop_turns_through_the_window_then_sleeps(yields: list[None]) -> None:
    poll = IdlePoll(asyncio.get_running_loop(), 0.1)
    poll.input()
    await asyncio.sleep(0.005)
    assert poll.polling and len(yields) > 1  # the loop turned through a 5 ms sleep
    deadline = asyncio.get_running_loop().time() + 5.0
    while poll.polling:  # (bounded: a loaded machine may run late)
        assert asyncio.get_running_loop().time() < deadline, "the poll never stopped"
        await asyncio.sleep(0.01)
    after = len(yields)
    await asyncio.sleep(0.05)
    assert len(yields) == after  # no input since: the loop sleeps, nothing polls


async def test_a_server_with_a_window_polls_after_its_clients_and_redis(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs: list[None] = []

    class Counted(IdlePoll):
        def input(self) -> None:
            inputs.append(None)
            super().input()

    monkeypatch.setattr("tubeq.server.process.IdlePoll", Counted)
    server = Server(Config(port=0, redis_url=redis_url, prefix="idlepoll", idle_poll_us=250))
    await server.start()
    try:
        polled = server.idle_poll
        assert isinstance(polled, Counted)
        # Redis's replies and pub/sub messages (tubeq.redisio.client calls on_data: its own
        # test), then a client's bytes alone:
        assert server._client is not None and server._client.on_data == polled.input
        assert server._subscriber is not None and server._subscriber.on_data == polled.input
        server._client.on_data = server._subscriber.on_data = None
        inputs.clear()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"put 0 0 60 2\r\nhi\r\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"INSERTED 1\r\n"
        assert inputs  # the put's bytes opened a window
        writer.close()
    finally:
        await server.stop()


async def test_an_embedded_server_does_not_poll_unless_told(redis_url: str) -> None:
    server = Server(Config(port=0, redis_url=redis_url, prefix="idlepoll-off"))
    await server.start()
    try:
        assert server.idle_poll is None
        assert server._client is not None and server._client.on_data is None
    finally:
        await server.stop()


# -- the command line's default: off where the cgroup allows less than a core ------------------

def _cgroup(tmp_path: Path, lines: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup mount under ``tmp_path`` with ``files`` (path -> content), and a
    /proc/self/cgroup of ``lines``."""
    root = tmp_path / "cgroup"
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(lines)
    return root, proc


@pytest.mark.parametrize(("lines", "files", "limit"), [
    # cgroup v2, a quota on the process's group
    ("0::/app\n", {"cgroup.controllers": "cpu\n", "app/cpu.max": "50000 100000\n",
                   "cpu.max": "max 100000\n"}, 0.5),
    # v2, the least of the group's and its ancestors' quotas
    ("0::/a/b\n", {"cgroup.controllers": "cpu\n", "a/b/cpu.max": "max 100000\n",
                   "a/cpu.max": "150000 100000\n"}, 1.5),
    # v2 with no quota anywhere
    ("0::/app\n", {"cgroup.controllers": "cpu\n", "app/cpu.max": "max 100000\n"}, None),
    # v1's cpu controller (a hybrid mount, v2 beside it at unified/)
    ("4:memory:/x\n2:cpu,cpuacct:/job\n0::/\n",
     {"cpu,cpuacct/job/cpu.cfs_quota_us": "25000\n",
      "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
      "unified/cgroup.controllers": "\n"}, 0.25),
    # v1 without a quota (-1), as on this project's machines
    ("1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
     None),
    # v1 named "cpuacct,cpu" in /proc but mounted as cpu/ (the fallback), in a container's "/"
    ("3:cpuacct,cpu:/\n", {"cpu/cpu.cfs_quota_us": "50000\n",
                            "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
    # v2, a quota on the root of a container's namespace
    ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "200000 100000\n"}, 2.0),
    # a zero period (no kernel writes one): unreadable, no limit
    ("0::/\n", {"cgroup.controllers": "cpu\n", "cpu.max": "50000 0\n"}, None),
    # unreadable or malformed files: no limit known
    ("0::/app\n", {"cgroup.controllers": "cpu\n", "app/cpu.max": "garbage\n"}, None),
])
def test_the_cgroups_cpu_limit_is_read(tmp_path: Path, lines: str, files: dict[str, str],
                                       limit: float | None) -> None:
    root, proc = _cgroup(tmp_path, lines, files)
    assert cpu_limit(root, proc) == limit
    expected = 0 if limit is not None and limit < 1 else DEFAULT_IDLE_POLL_US
    assert default_window_us(cgroup_root=root, proc_cgroup=proc, cpus=8) == expected


def test_no_cgroup_file_means_no_limit(tmp_path: Path) -> None:
    assert cpu_limit(tmp_path, tmp_path / "missing") is None
    assert default_window_us(cgroup_root=tmp_path, proc_cgroup=tmp_path / "missing",
                             cpus=2) == DEFAULT_IDLE_POLL_US


@pytest.mark.parametrize(("processes", "cpus", "quota", "window"), [
    (1, 2, None, DEFAULT_IDLE_POLL_US),
    (2, 2, None, DEFAULT_IDLE_POLL_US),  # a core each
    (3, 2, None, 0),  # --workers 3 on two CPUs: pollers would share a CPU
    (1, 1, None, DEFAULT_IDLE_POLL_US),  # one process, one CPU: it yields at every poll
    (2, 8, "150000 100000", 0),  # two workers under a 1.5-core quota
    (1, 8, "150000 100000", DEFAULT_IDLE_POLL_US),
])
def test_the_default_gives_each_process_a_core_or_does_not_poll(
        tmp_path: Path, processes: int, cpus: int, quota: str | None, window: int) -> None:
    files = {"cgroup.controllers": "cpu\n"}
    if quota is not None:
        files["cpu.max"] = quota + "\n"
    root, proc = _cgroup(tmp_path, "0::/\n", files)
    assert default_window_us(processes, cgroup_root=root, proc_cgroup=proc,
                             cpus=cpus) == window
