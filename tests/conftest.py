"""Shared fixtures: private servers started and stopped by the tests themselves; and which tests
are unit tests, kept offline.

Nothing here touches a server the suite did not start: each Redis is a private redis-server on a
free loopback port in a temp directory (so flushing it is ours to do).
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from tests.support.job_counts import count_mismatches
from tests.support.offline import OfflineGuard
from tests.support.servers import ServerKind, ServerProcess, TubeqCluster, start_beanstalkd
from tubeq.redisio.process import RedisProcess

# ---------------------------------------------------------------------------------------------
# Unit tests: no Redis, no subprocess, no network (fakeredis would do), so `make test-fast`
# (pytest -m unit) runs them all in seconds. A folder (ending in /) or a module, relative to
# tests/; each gets the `unit` marker. When every test a run selected is a unit test, the run is
# offline (tests.support.offline): a socket connect or bind, or a process started, fails the test
# even where the code under test catches the error. So a unit test that starts to need Redis
# fails `make test-fast` at once and belongs in a module of its own, outside this list.
# ---------------------------------------------------------------------------------------------

UNIT_TESTS: tuple[str, ...] = (
    "protocol/",
    "store/test_scripts.py",
    "redisio/test_futures.py",
    "test_references.py",
    "server/test_describe.py",
    "server/test_end_waits.py",
    "server/test_fine_timer.py",
    "server/test_liveness.py",
    "server/test_reserves.py",
    "server/test_stats_counters.py",
    "server/test_using.py",
    "server/test_waiters.py",
    "extensions/test_batches_protocol.py",
    "pipeline/test_report_percentiles.py",
    "bench/",
)
TESTS_DIR = Path(__file__).parent
OFFLINE_GUARD = pytest.StashKey[OfflineGuard]()


def is_unit_test(path: Path) -> bool:
    """Whether the test module at ``path`` is in UNIT_TESTS (itself or its folder)."""
    if TESTS_DIR not in path.parents:
        return False
    relative = path.relative_to(TESTS_DIR).as_posix()
    return any(relative == unit or (unit.endswith("/") and relative.startswith(unit))
               for unit in UNIT_TESTS)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m unit`` (make test-fast), a test module outside UNIT_TESTS is not even imported:
    its tests would all be deselected, and the imports (Spark, selenium) cost more than the unit
    tests themselves."""
    if (config.getoption("markexpr") == "unit" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and not is_unit_test(collection_path)):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The Spark cluster module first: the suite's longest (three minutes of its own JVMs), it held
    # the run's last minutes alone when handed out late. make test runs xdist with
    # --no-loadscope-reorder, so modules are handed out in this order (by default xdist hands out
    # the modules with the most tests first, and this one has two).
    items.sort(key=lambda item: item.get_closest_marker("spark_cluster") is None)
    for item in items:
        if is_unit_test(item.path):
            item.add_marker(pytest.mark.unit)
        elif item.get_closest_marker("unit"):
            raise pytest.UsageError(f"{item.nodeid} is marked unit by hand: UNIT_TESTS is the list "
                                    "(make test-fast does not even import modules outside it)")


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.items and all(item.get_closest_marker("unit") for item in session.items):
        guard = OfflineGuard()
        guard.install()
        session.config.stash[OFFLINE_GUARD] = guard


def pytest_sessionfinish(session: pytest.Session) -> None:
    guard = session.config.stash.get(OFFLINE_GUARD, None)
    if guard is not None:
        guard.uninstall()


@pytest.fixture(autouse=True)
def offline_unless_refused(request: pytest.FixtureRequest) -> Iterator[None]:
    """In an offline run, fail the test that reached for the network or a process, even if the
    code under test caught the refusal."""
    yield
    guard = request.config.stash.get(OFFLINE_GUARD, None)
    if guard is not None and (refused := guard.take_violations()):
        pytest.fail("\n".join(refused), pytrace=False)


@pytest.fixture(scope="session")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    proc = RedisProcess(Path(tmp_path_factory.mktemp("redis")))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
async def redis_url(redis_process: RedisProcess) -> AsyncIterator[str]:
    """The URL of the session's private Redis, flushed before each test; at teardown every
    namespace's jobs by state must match its tubes (tests/support/job_counts.py)."""
    client = redis.asyncio.Redis.from_url(redis_process.url)
    await client.flushall()
    await client.aclose()
    yield redis_process.url
    if redis_process.alive() and (wrong := count_mismatches(redis_process.url)):
        pytest.fail("job counts drifted from the tubes:\n" + "\n".join(wrong), pytrace=False)


# ---------------------------------------------------------------------------------------------
# Wire-level servers: beanstalkd (the reference) and the server under test.
#
# The target is tubeq unless ``--wire-target=beanstalkd`` (or TUBEQ_WIRE_TARGET=beanstalkd) asks
# for a second private beanstalkd instead: beanstalkd against beanstalkd must pass every scenario,
# which is how the harness and its normalisation prove themselves.
# ---------------------------------------------------------------------------------------------

WIRE_TARGETS: tuple[ServerKind, ...] = ("tubeq", "beanstalkd")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--wire-target", choices=WIRE_TARGETS,
        default=os.environ.get("TUBEQ_WIRE_TARGET", "tubeq"),
        help="server the wire tests compare with beanstalkd: tubeq (default) or beanstalkd "
             "(a second private instance: a self-check of the harness)",
    )
    parser.addoption(
        "--wire-dump", default=None, metavar="PATH",
        help="write every differential scenario's reference and target transcripts to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "quirk: a beanstalkd 1.12 accident tubeq deliberately does not copy; the "
        "scenario checks tubeq's documented reply instead (see DOCUMENTED_DIFFERENCES)")
    config.addinivalue_line(
        "markers", "pristine: the scenario runs on a fresh beanstalkd/target pair of its own")


@pytest.fixture(scope="session")
def wire_target_kind(pytestconfig: pytest.Config) -> ServerKind:
    kind: ServerKind = pytestconfig.getoption("--wire-target")
    return kind


@pytest.fixture(scope="session")
def beanstalkd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The session's reference beanstalkd 1.12, shared by every independent scenario."""
    server = start_beanstalkd(tmp_path_factory.mktemp("beanstalkd"), "beanstalkd-reference")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tubeq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TubeqCluster]:
    """A private redis-server for tubeq processes; every process on it is stopped at the end."""
    cluster = TubeqCluster(tmp_path_factory.mktemp("tubeq"))
    cluster.start_redis()
    yield cluster
    for server in cluster.servers:
        if not server.alive() and server.proc.returncode not in (0, -signal.SIGTERM):
            print(f"\n{server.describe()} exited with {server.proc.returncode}; its output:\n"
                  f"{server.log_tail()}")
    cluster.stop_all()


@pytest.fixture(scope="session")
def tubeq(tubeq_cluster: TubeqCluster) -> ServerProcess:
    """The session's tubeq process (own Redis, unique prefix), shared by independent scenarios."""
    return tubeq_cluster.start(label="tubeq-target")


@pytest.fixture
def tubeq_factory(tubeq_cluster: TubeqCluster) -> Iterator[Callable[[str], ServerProcess]]:
    """Start extra tubeq processes on the session's tubeq Redis with a given prefix.

    Two calls with the same prefix give two processes serving one queue. They are stopped by PID
    when the test ends.
    """
    started: list[ServerProcess] = []

    def start(prefix: str) -> ServerProcess:
        server = tubeq_cluster.start(prefix, label=f"tubeq-{len(started) + 1}")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def wire_target(request: pytest.FixtureRequest, wire_target_kind: ServerKind,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server compared with the reference: the session's tubeq, or a second beanstalkd."""
    if wire_target_kind == "tubeq":
        server: ServerProcess = request.getfixturevalue("tubeq")
        yield server
        return
    server = start_beanstalkd(tmp_path_factory.mktemp("beanstalkd-target"), "beanstalkd-target")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pristine_pair_factory(
    request: pytest.FixtureRequest, wire_target_kind: ServerKind,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[], tuple[ServerProcess, ServerProcess]]]:
    """Start a fresh (reference, target) pair for one scenario that needs pristine servers.

    Pristine means: ids start at 1, global counters at 0, no other client, and state that cannot
    be undone (drain mode) stays private. A tubeq target gets a fresh prefix on the session's
    tubeq Redis. Everything started here is stopped by PID when the session ends, or earlier by
    the caller.
    """
    started: list[ServerProcess] = []
    log_dir = tmp_path_factory.mktemp("pristine")
    cluster: TubeqCluster | None = (
        request.getfixturevalue("tubeq_cluster") if wire_target_kind == "tubeq" else None
    )

    def start_pair() -> tuple[ServerProcess, ServerProcess]:
        reference = start_beanstalkd(log_dir, "beanstalkd-pristine-reference")
        started.append(reference)
        if cluster is not None:
            target = cluster.start(label="tubeq-pristine")
        else:
            target = start_beanstalkd(log_dir, "beanstalkd-pristine-target")
        started.append(target)
        return reference, target

    yield start_pair
    for server in started:
        server.stop()


@pytest.fixture
def skip_unless_tubeq(wire_target_kind: ServerKind) -> None:
    """Skip a test about tubeq itself when the run's wire target is beanstalkd."""
    if wire_target_kind != "tubeq":
        pytest.skip("this test exercises tubeq itself; the wire target is beanstalkd")


# ---------------------------------------------------------------------------------------------
# The bundled client and tubeq-cli (tests/client/: test_client.py, test_consume.py, test_cli.py): a
# private beanstalkd and a private tubeq (fresh prefix on the session's tubeq Redis) of their
# own, so their jobs, tubes and counters never meet the differential suite's shared servers.
# ---------------------------------------------------------------------------------------------

CLIENT_SERVER_KINDS: tuple[ServerKind, ...] = ("beanstalkd", "tubeq")


@pytest.fixture(scope="session")
def client_beanstalkd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A beanstalkd 1.12 for the client tests only."""
    server = start_beanstalkd(tmp_path_factory.mktemp("client-beanstalkd"), "beanstalkd-clients")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client_tubeq(tubeq_cluster: TubeqCluster) -> ServerProcess:
    """A tubeq for the client tests only (stopped with the cluster)."""
    return tubeq_cluster.start(label="tubeq-clients")


@pytest.fixture(params=CLIENT_SERVER_KINDS)
def any_server(request: pytest.FixtureRequest) -> ServerProcess:
    """Each of the client tests' beanstalkd and tubeq in turn."""
    server: ServerProcess = request.getfixturevalue(f"client_{request.param}")
    return server


@pytest.fixture
def tube_name() -> str:
    """A tube name no other test uses."""
    return f"t-{secrets.token_hex(6)}"
