"""Processes the fault tests start and stop themselves: tubeq on a port of the test's choosing
(so a restarted process comes back where its clients look for it), and a Sentinel topology.

Everything here is a child of the test run on loopback, in a temp directory, stopped by PID.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import LOOPBACK, ServerProcess, ServerStartError, _spawn_and_wait
from tubeq.redisio.process import RedisClusterNodes, RedisProcess, free_port

WAIT_S = 60.0  # bound on each wait for a topology to settle; never asserted as a duration
POLL_S = 0.05
DEFAULT_REPLICA_PRIORITY = 100  # redis.conf's replica-priority


def start_tubeq_on(port: int, redis_url: str, prefix: str, log_dir: Path, label: str,
                   flags: tuple[str, ...] = ()) -> ServerProcess:
    """``python -m tubeq`` on ``port`` (e.g. the port a killed process had)."""
    argv = [sys.executable, "-m", "tubeq", "-l", LOOPBACK, "-p", str(port), "--redis",
            redis_url, "--prefix", prefix, *flags]
    log_path = log_dir / f"{label}-{port}-{time.monotonic_ns()}.log"
    last: ServerStartError | None = None
    for _ in range(3):  # the port of a process killed an instant ago may still be busy
        try:
            server = _spawn_and_wait("tubeq", argv, port, log_path, label)
        except ServerStartError as error:
            last = error
            time.sleep(0.5)
            continue
        server.extra.update(redis_url=redis_url, prefix=prefix)
        return server
    assert last is not None
    raise last


def redis_command(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """One command to a loopback Redis (or sentinel) through redis-cli; its raw output."""
    done = subprocess.run(["redis-cli", "-h", LOOPBACK, "-p", str(port), *args],
                          capture_output=True, timeout=timeout, check=False)
    return done.stdout


@dataclass
class SentinelProcess:
    port: int
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class SentinelTopology:
    """A master, one replica and three sentinels (quorum 2) watching ``name``."""

    work_dir: Path
    name: str = "faultmaster"
    redises: list[RedisProcess] = field(default_factory=list)
    sentinels: list[SentinelProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        seeds = ",".join(f"{LOOPBACK}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{seeds}/{self.name}"

    def start(self) -> None:
        master = RedisProcess(self.work_dir / "master")
        master.start()
        self.redises.append(master)
        replica = RedisProcess(self.work_dir / "replica",
                               extra=("--replicaof", LOOPBACK, str(master.port)))
        replica.start()
        self.redises.append(replica)
        for index in range(3):
            self.sentinels.append(self._start_sentinel(index, master.port))
        self.wait_until(lambda: self.replica_ready(master.port), "the replica is in sync and "
                        "known to every sentinel")

    def _start_sentinel(self, index: int, master_port: int) -> SentinelProcess:
        directory = self.work_dir / f"sentinel{index}"
        directory.mkdir(parents=True)
        port = free_port()
        conf = directory / "sentinel.conf"
        conf.write_text("\n".join([
            f"port {port}", f"bind {LOOPBACK}", f"dir {directory}",
            f"logfile {directory / 'sentinel.log'}",
            f"sentinel monitor {self.name} {LOOPBACK} {master_port} 2",
            f"sentinel down-after-milliseconds {self.name} 1000",
            # A sentinel retries a failover of one master only after twice this: the test's
            # second failover comes seconds after its first.
            f"sentinel failover-timeout {self.name} 4000",
            ""]))
        proc = subprocess.Popen(["redis-server", str(conf), "--sentinel"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        sentinel = SentinelProcess(port, proc)
        self.wait_until(lambda: _accepts(port), f"sentinel {index} listens")
        return sentinel

    def master_port(self) -> int | None:
        """The master's port as the first sentinel that answers reports it."""
        for sentinel in self.sentinels:
            out = redis_command(sentinel.port, "SENTINEL", "get-master-addr-by-name", self.name)
            lines = out.split()
            if len(lines) == 2 and lines[1].isdigit():
                return int(lines[1])
        return None

    def replica_ready(self, master_port: int) -> bool:
        info = redis_command(master_port, "INFO", "replication")
        if b"connected_slaves:1" not in info or b"state=online" not in info:
            return False
        for sentinel in self.sentinels:
            out = redis_command(sentinel.port, "SENTINEL", "replicas", self.name)
            if b"slave" not in out or b"disconnected" in out or b"s_down" in out:
                return False
        return True

    def failover(self) -> int:
        """SENTINEL FAILOVER; returns the new master's port once every sentinel agrees and
        the old master replicates from it."""
        before = self.master_port()
        assert before is not None
        out = redis_command(self.sentinels[0].port, "SENTINEL", "failover", self.name)
        assert out.strip() == b"OK", out

        def moved() -> bool:
            ports = {self._reported(s.port) for s in self.sentinels}
            return len(ports) == 1 and before not in ports and None not in ports

        self.wait_until(moved, "every sentinel names the new master")
        after = self.master_port()
        assert after is not None
        self.wait_until(lambda: b"role:master" in redis_command(after, "INFO", "replication"),
                        "the new master is a master")
        return after

    def rejoin(self, redis: RedisProcess) -> None:
        """Start a Redis that was killed as the master again, as a replica of the current
        master that Sentinel must not promote (``replica-priority 0``): then
        :meth:`promotable_once_synced`.

        It comes back without the data it had (no persistence here), and Sentinel does not
        know that: a replica that has not reached its master since it started reports
        ``master_link_down_since_seconds:-1``, which Sentinel reads as "never down", so it
        passes every check of Sentinel's replica selection. A failover in that window (a
        sentinel that misses the master's PINGs for ``down-after-milliseconds`` on a busy
        machine is enough) promotes the empty replica, and the master, converted into its
        replica, resyncs from it and drops every job it had (seen: issue 11). Sentinel lists
        the killed master as a replica only since the failover, with no INFO of its own, and
        selects no replica before it has read its INFO: which already says priority 0.
        """
        master = self.master_port()
        assert master is not None
        redis.extra = ("--replicaof", LOOPBACK, str(master), "--replica-priority", "0")
        redis.start()

    def refuses_to_promote(self, redis: RedisProcess) -> None:
        """Once the first sentinel has read the INFO of ``redis`` (a rejoined replica, not yet
        promotable), a forced failover must find no replica to promote."""
        sentinel = self.sentinels[0].port
        run_id = _info_field(redis.port, "server", "run_id")

        def selectable_but_for_priority() -> bool:
            # Connected, answering, and the INFO of the restarted process read (its run id).
            replica = self._replica(sentinel, redis.port)
            flags = replica.get("flags", "disconnected")
            return ("disconnected" not in flags and "s_down" not in flags
                    and replica.get("runid") == run_id)

        self.wait_until(selectable_but_for_priority, f"sentinel {sentinel} has the INFO of "
                        f"{redis.port}")

        def refused() -> bool:
            out = redis_command(sentinel, "SENTINEL", "failover", self.name)
            assert not out.startswith(b"OK"), (
                f"Sentinel promotes {redis.port}, back without its data (issue 11)")
            return out.startswith(b"NOGOODSLAVE")  # else INPROG: the last failover is ending

        self.wait_until(refused, "SENTINEL FAILOVER answers NOGOODSLAVE")

    def promotable_once_synced(self, redis: RedisProcess) -> None:
        """Wait until a rejoined Redis has finished its sync, then let Sentinel promote it."""
        self.wait_until(lambda: b"master_link_status:up" in redis_command(
            redis.port, "INFO", "replication"), f"{redis.port} finishes its sync")
        out = redis_command(redis.port, "CONFIG", "SET", "replica-priority",
                            str(DEFAULT_REPLICA_PRIORITY))
        assert out.strip() == b"OK", out

    def _replica(self, sentinel_port: int, port: int) -> dict[str, str]:
        """The fields of SENTINEL REPLICAS for the replica on ``port`` ({} if not listed)."""
        lines = redis_command(sentinel_port, "SENTINEL", "replicas", self.name).decode(
            errors="replace").splitlines()
        replicas: list[dict[str, str]] = []
        for key, value in zip(lines[::2], lines[1::2], strict=False):
            if key == "name":
                replicas.append({})
            if replicas:
                replicas[-1][key] = value
        return next((r for r in replicas if r.get("port") == str(port)), {})

    def _reported(self, sentinel_port: int) -> int | None:
        out = redis_command(sentinel_port, "SENTINEL", "get-master-addr-by-name", self.name)
        lines = out.split()
        return int(lines[1]) if len(lines) == 2 and lines[1].isdigit() else None

    @staticmethod
    def wait_until(check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {WAIT_S:g} s: {what}")
            time.sleep(POLL_S)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for redis in self.redises:
            redis.stop()


class ClusterUnderTest(RedisClusterNodes):
    """The fault and cluster tests' Redis Cluster: three masters, each with an append-only file
    fsynced on every write (a restarted node comes back with its data), and the faults the
    tests inflict on it."""

    def __init__(self, work_dir: Path, count: int = 3) -> None:
        super().__init__(work_dir, count, persistent=True, appendfsync="always", host=LOOPBACK)

    def restart(self, index: int, down_s: float = 0.0) -> None:
        """SIGKILL node ``index``, leave it down ``down_s`` (under the cluster's node timeout:
        the others do not fail it), start it again on its port, data and cluster config."""
        node = self.nodes[index]
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait()
        node.proc = None
        time.sleep(down_s)
        node.start()
        self.wait_ok()

    def node_id(self, index: int) -> str:
        return redis_command(self.nodes[index].port, "CLUSTER", "MYID").strip().decode()

    def move_slot(self, slot: int, source: int, target: int) -> None:
        """Move ``slot`` with its keys from node ``source`` to node ``target``, as a resharding
        does: IMPORTING/MIGRATING, MIGRATE the keys in batches, then SETSLOT NODE on every
        node (after which the source answers MOVED for the slot)."""
        src, dst = self.nodes[source].port, self.nodes[target].port
        source_id, target_id = self.node_id(source), self.node_id(target)
        assert b"OK" in redis_command(dst, "CLUSTER", "SETSLOT", str(slot), "IMPORTING",
                                      source_id)
        assert b"OK" in redis_command(src, "CLUSTER", "SETSLOT", str(slot), "MIGRATING",
                                      target_id)
        for _ in range(10_000):  # bounded: a slot of a test's namespace holds few keys
            keys = redis_command(src, "CLUSTER", "GETKEYSINSLOT", str(slot), "100").split()
            if not keys:
                break
            redis_command(src, "MIGRATE", LOOPBACK, str(dst), "", "0", "5000", "KEYS",
                          *(key.decode() for key in keys))
        for node in self.nodes:
            redis_command(node.port, "CLUSTER", "SETSLOT", str(slot), "NODE", target_id)



def _info_field(port: int, section: str, name: str) -> str:
    for line in redis_command(port, "INFO", section).decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in INFO {section} of {port}")


def _accepts(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=0.2).close()
        return True
    except OSError:
        return False


@contextmanager
def sentinel_topology(work_dir: Path) -> Iterator[SentinelTopology]:
    topology = SentinelTopology(work_dir)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()
