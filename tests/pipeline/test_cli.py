"""``tubeq-pipeline``: the command table, the shared options, and every way it fails.

The commands run end to end through the dispatcher in this process on the module's one
SparkSession; one real ``python -m tubeq.pipeline report`` subprocess proves the entry point.
The failure paths (no Java, an old Java, a Java that says no version, the extra not installed,
Spark Connect's client missing, a Spark error, bad arguments) each run as a real process or
through :func:`cli.main`, and each must leave exactly one line on stderr.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import greenstalk
import pyarrow.parquet as pq
import pytest
import redis
from pyspark.sql import SparkSession

from tests.pipeline import eventstream, workload
from tests.support.servers import ServerProcess
from tubeq.model.events import FIELDS, INT_FIELDS, SPARK_DDL
from tubeq.pipeline import cli, session
from tubeq.pipeline.archive import write_archive
from tubeq.redisio.process import RedisProcess, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# A pipeline command that fails before Spark starts answers in about a second; one that starts
# Spark needs its ~6 s start-up and the job, on two busy cores.
FAST_TIMEOUT_S = 60
SPARK_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def record() -> workload.Record:
    return workload.simulate(jobs=40)


@pytest.fixture(scope="module")
def archive(spark: SparkSession, record: workload.Record,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny archive: the workload's events as Parquet partitioned by date and tube."""
    path = tmp_path_factory.mktemp("archive")
    frame = spark.createDataFrame(workload.events(record), SPARK_DDL)
    write_archive(frame, str(path))
    return path


def puts_in(record: workload.Record) -> int:
    return sum(1 for job in record.jobs for step in job.steps if step[0] == "put")


def all_tubes_row(out: Path, table: str = "by_tube") -> dict[str, object]:
    rows = pq.read_table(out / table).to_pylist()
    return next(row for row in rows if row["tube"] == "*")


def pipeline(*args: str, env: dict[str, str] | None = None,
             timeout: float = FAST_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m tubeq.pipeline ARGS`` as its own process (bounded by ``timeout``)."""
    return subprocess.run([sys.executable, "-m", "tubeq.pipeline", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


def java_home(tmp_path: Path, script: str | None) -> dict[str, str]:
    """The environment with JAVA_HOME at a temp dir: empty, or with ``bin/java`` = ``script``."""
    if script is not None:
        java = tmp_path / "bin" / "java"
        java.parent.mkdir(parents=True)
        java.write_text("#!/bin/sh\n" + script + "\n")
        java.chmod(0o755)
    return {**os.environ, "JAVA_HOME": str(tmp_path)}


# ---------------------------------------------------------------------------------------------
# The command table and the parser.
# ---------------------------------------------------------------------------------------------


def test_help_lists_every_command_through_the_console_script() -> None:
    script = Path(sys.executable).with_name("tubeq-pipeline")
    assert script.is_file(), "the tubeq-pipeline console script is not installed (pip install -e .)"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                          timeout=FAST_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()
              if line.startswith("    ") and line.split()}
    assert set(cli.COMMANDS) == {"archive", "report", "schedule", "tail", "live"}
    assert set(cli.COMMANDS) <= listed
    assert "--master" in done.stdout
    assert "--remote" in done.stdout


def test_help_imports_no_command_and_no_pyspark() -> None:
    probe = textwrap.dedent("""
        import contextlib, io, sys
        from tubeq.pipeline import cli, session
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.main(["--help"])
            except SystemExit as exit:
                assert exit.code == 0, exit.code
        heavy = sorted(name for name in sys.modules
                       if name.split(".")[0] in ("pyspark", "py4j", "pyarrow", "pandas")
                       or name in [command.module for command in cli.COMMANDS.values()])
        print(heavy)
    """)
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=FAST_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("argv", "chosen"), [
    (["report", "--archive", "a"], "report"),
    (["--master", "report", "schedule"], "schedule"),  # a --master value is not the command
    (["--remote", "sc://h:15002", "tail"], "tail"),
    (["--master=local[2]", "archive"], "archive"),
    (["--help"], None),
    (["bogus", "report"], None),
    ([], None),
])
def test_chosen_command(argv: list[str], chosen: str | None) -> None:
    assert cli.chosen_command(argv) == chosen


def test_spark_options_go_before_or_after_the_command() -> None:
    before = cli.build_parser("report").parse_args(
        ["--master", "spark://h:7077", "report", "--archive", "a", "--out", "o"])
    after = cli.build_parser("report").parse_args(
        ["report", "--remote", "sc://h:15002", "--archive", "a", "--out", "o"])
    neither = cli.build_parser("report").parse_args(["report", "--archive", "a", "--out", "o"])
    assert (before.master, before.remote) == ("spark://h:7077", None)
    assert (after.master, after.remote) == ("local[*]", "sc://h:15002")
    assert (neither.master, neither.remote, neither.command) == ("local[*]", None, "report")


@pytest.mark.parametrize("argv", [
    [],                                          # no command
    ["bogus"],                                   # not a command
    ["report", "--out", "o"],                    # --archive missing
    ["schedule", "--input", "x.json"],           # --address missing
    ["report", "--archive", "a", "--out", "o", "--nonsense"],
    ["--master"],                                # an option without its value
    ["report", "--archive", "a", "--out", "o", "--since", "yesterday"],  # not a date
    ["report", "--archive", "a", "--out", "o", "--until", "2026-13-01"],
    ["report", "--archive", "a", "--out", "o", "--driver-samples", "-1"],  # not a count
    ["report", "--archive", "a", "--out", "o", "--driver-samples", "many"],
])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    done = pipeline(*argv)
    assert done.returncode == 2, done.stderr
    assert "usage: tubeq-pipeline" in done.stderr
    assert "Traceback" not in done.stderr


class RecordingBuilder:
    """Stands in for ``SparkSession.builder``: records what a session would be built with."""

    def __init__(self) -> None:
        self.settings: dict[str, str] = {}

    def appName(self, name: str) -> RecordingBuilder:
        self.settings["app"] = name
        return self

    def master(self, master: str) -> RecordingBuilder:
        self.settings["master"] = master
        return self

    def config(self, key: str, value: str) -> RecordingBuilder:
        self.settings[key] = value
        return self

    def getOrCreate(self) -> dict[str, str]:
        return self.settings


@pytest.mark.parametrize(("master", "local"), [("local[2]", True), ("spark://10.0.0.5:7077", False),
                                                ("yarn", False)])
def test_only_a_local_master_is_pinned_to_loopback_and_this_interpreter(
        monkeypatch: pytest.MonkeyPatch, master: str, local: bool) -> None:
    builder = RecordingBuilder()
    monkeypatch.setattr(SparkSession, "builder", builder)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    built: object = session.spark_session(master)
    assert built == builder.settings
    assert builder.settings["master"] == master
    # A cluster's executors must reach the driver and run their own Python.
    assert os.environ.get("SPARK_LOCAL_IP") == ("127.0.0.1" if local else None)
    assert os.environ.get("PYSPARK_PYTHON") == (sys.executable if local else None)
    assert ("spark.sql.shuffle.partitions" in builder.settings) == local


@pytest.mark.parametrize("short", [False, True])
def test_a_short_local_run_compiles_with_c1_alone(monkeypatch: pytest.MonkeyPatch,
                                                   short: bool) -> None:
    builder = RecordingBuilder()
    monkeypatch.setattr(SparkSession, "builder", builder)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    session.spark_session("local[2]", short=short)
    options = builder.settings["spark.driver.extraJavaOptions"].split()
    assert session.LOCAL_DRIVER_JAVA_OPTIONS in options
    assert (session.SHORT_RUN_JAVA_OPTIONS in options) == short
    # The archive's folders are listed in the driver, not by a job of a task per folder.
    assert builder.settings["spark.sql.sources.parallelPartitionDiscovery.threshold"] == str(
        session.LOCAL_LISTING_JOB_THRESHOLD)


# ---------------------------------------------------------------------------------------------
# Failures the user fixes: exactly one line on stderr, exit 1, before any JVM starts.
# ---------------------------------------------------------------------------------------------


def test_no_java_is_one_line(tmp_path: Path, archive: Path) -> None:
    done = pipeline("report", "--archive", str(archive), "--out", str(tmp_path / "o"),
                    env=java_home(tmp_path, None))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith("tubeq-pipeline: no java found (looked in JAVA_HOME)")
    assert "Java 17 or newer" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("version", "major"), [('"11.0.22" 2024-01-16', 11),
                                                 ('"1.8.0_402"', 8)])
def test_old_java_is_one_line(tmp_path: Path, version: str, major: int) -> None:
    env = java_home(tmp_path, f"echo 'openjdk version {version}' >&2")
    done = pipeline("schedule", "--input", str(tmp_path / "x.json"), "--address",
                    "127.0.0.1:1", env=env)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(f"tubeq-pipeline: {tmp_path}/bin/java is Java {major};")
    assert "Java 17 or newer" in line


def test_java_that_does_not_say_its_version_is_one_line(tmp_path: Path, archive: Path) -> None:
    env = java_home(tmp_path, "echo 'Error: could not create the Java VM' >&2; exit 1")
    done = pipeline("report", "--archive", str(archive), "--out", str(tmp_path / "o"), env=env)
    assert done.returncode == 1
    assert "-version did not say its version (exit 1)" in one_line(done.stderr)


# Run as a process in which importing pyspark fails as it does where it is not installed.
WITHOUT_PYSPARK = textwrap.dedent("""
    import runpy, sys

    class NoPyspark:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "pyspark":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoPyspark())
    sys.argv = ["tubeq-pipeline", *sys.argv[1:]]
    runpy.run_module("tubeq.pipeline", run_name="__main__", alter_sys=True)
""")


@pytest.mark.parametrize("argv", [["report", "--archive", "a", "--out", "o"],
                                  ["schedule", "--help"]])
def test_missing_extra_is_one_line(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=FAST_TIMEOUT_S, check=False)
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert line.startswith("tubeq-pipeline: the pipeline needs its optional dependencies")
    assert "pip install 'tubeq[pipeline]'" in line
    assert "No module named 'pyspark" in line


def test_help_works_without_the_extra() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=FAST_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "schedule" in done.stdout


@pytest.mark.parametrize(("error", "hint"), [
    (ModuleNotFoundError("No module named 'pyspark'", name="pyspark"), "tubeq[pipeline]"),
    (ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow"), "tubeq[pipeline]"),
    (ModuleNotFoundError("No module named 'pandas.core'", name="pandas.core"), "tubeq[pipeline]"),
    (ModuleNotFoundError("No module named 'grpc'", name="grpc"), "pyspark[connect]"),
    (ModuleNotFoundError("No module named 'yaml'", name="yaml"), None),
    (ImportError("cannot import name 'x' from 'tubeq.model.events'", name="tubeq.model.events"),
     None),
])
def test_missing_dependency_names_what_to_install(error: ImportError, hint: str | None) -> None:
    message = cli.missing_dependency(error)
    if hint is None:
        assert message is None
    else:
        assert message is not None
        assert f"pip install '{hint}'" in message


def test_an_import_error_of_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> object:
        raise ImportError("cannot import name 'nothing' from 'tubeq.model.events'",
                          name="tubeq.model.events")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ImportError, match="nothing"):
        cli.main(["report", "--archive", "a", "--out", "o"])


def test_unreachable_remote_is_one_line(tmp_path: Path, archive: Path) -> None:
    # Nothing listens on the port. Spark Connect's own client would retry for minutes; the
    # command probes the port first and says so in one line.
    port = free_port()
    done = pipeline("--remote", f"sc://127.0.0.1:{port}", "report", "--archive",
                    str(archive), "--out", str(tmp_path / "o"))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(f"tubeq-pipeline: no Spark Connect server answers at 127.0.0.1:{port}")


@pytest.mark.parametrize("url", ["sc://127.0.0.1:notaport", "sc://127.0.0.1:99999"])
def test_a_bad_remote_port_is_one_line(url: str, tmp_path: Path, archive: Path) -> None:
    done = pipeline("--remote", url, "report", "--archive", str(archive), "--out",
                    str(tmp_path / "o"))
    assert done.returncode == 1
    assert one_line(done.stderr).startswith(f"tubeq-pipeline: --remote {url}: bad port ")


def test_schedule_input_of_an_unknown_kind_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "orders.xlsx").write_text("body\nx\n")
    done = pipeline("schedule", "--input", str(tmp_path / "orders.xlsx"), "--address",
                    "127.0.0.1:1", timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    assert one_line(done.stderr) == (f"tubeq-pipeline: --input {tmp_path / 'orders.xlsx'}: "
                                     "expected a .parquet, .csv or .json file")


def watched_java(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment with JAVA_HOME at a wrapper of the real java that notes each start in a
    file (returned): a command that says its error before Spark starts leaves no note."""
    real = session.java_executable()
    assert real is not None
    started = tmp_path / "java-started"
    return java_home(tmp_path / "jdk", f'echo "$@" >> {started}\nexec {real} "$@"'), started


def test_a_missing_archive_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    env, started = watched_java(tmp_path)
    missing = tmp_path / "no-archive"
    done = pipeline("--master", "local[1]", "report", "--archive", str(missing), "--out",
                    str(tmp_path / "o"), env=env, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    assert one_line(done.stderr) == f"tubeq-pipeline: --archive {missing}: no such directory"
    assert not started.exists()
    assert not (tmp_path / "o").exists()


def test_an_empty_archive_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    """An archive directory with no Parquet file in it (a wrong path, or an archive of an empty
    stream: only _spark_metadata) is an error, not a blank report."""
    env, started = watched_java(tmp_path)
    empty = tmp_path / "archive"
    (empty / "_spark_metadata").mkdir(parents=True)
    (empty / "_spark_metadata" / "0").write_text("v1\n")
    done = pipeline("--master", "local[1]", "report", "--archive", str(empty), "--out",
                    str(tmp_path / "o"), env=env, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    assert one_line(done.stderr) == (f"tubeq-pipeline: no events to report: --archive {empty} "
                                     "holds no Parquet file")
    assert not started.exists()
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["archive", "tail"])
def test_an_unreachable_redis_is_one_line_before_spark_starts(tmp_path: Path,
                                                               command: str) -> None:
    env, started = watched_java(tmp_path)
    url = f"redis://127.0.0.1:{free_port()}/0"
    flags = (["--once", "--out", str(tmp_path / "archive"), "--checkpoint",
              str(tmp_path / "checkpoint")] if command == "archive" else ["--seconds", "30"])
    done = pipeline("--master", "local[1]", command, "--redis", url, *flags, env=env,
                    timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    assert one_line(done.stderr).startswith(f"tubeq-pipeline: cannot reach Redis at {url} ")
    assert not started.exists()
    assert not (tmp_path / "checkpoint").exists()


# ---------------------------------------------------------------------------------------------
# Failures found once Spark runs: still one line on stderr, the JVM's own output in a log file
# that the line names (kept because the command failed).
# ---------------------------------------------------------------------------------------------


def spark_log_of(line: str) -> Path:
    assert line.endswith(")") and " (Spark's log: " in line, line
    log = Path(line[line.rindex(" (Spark's log: ") + len(" (Spark's log: "):-1])
    assert log.is_file(), line
    return log


def corrupt_archive(tmp_path: Path) -> tuple[Path, Path]:
    """An archive of one good Parquet file and one that is not Parquet: (archive, bad file)."""
    import pyarrow as pa

    archive = tmp_path / "archive"
    part = archive / "date=2026-01-01" / "tube=orders"
    part.mkdir(parents=True)
    rows = [eventstream.event_fields(i, tube="orders") for i in range(20)]
    table = pa.table({"stream_id": [f"{1000 + i}-0" for i in range(20)],
                      **{name: [row[name] for row in rows] for name in FIELDS if name != "tube"}})
    pq.write_table(table, part / "part-0.parquet")
    broken = part / "part-1.parquet"
    broken.write_bytes(b"PAR1" + b"not a parquet file" * 50 + b"PAR1")
    return archive, broken


def test_a_corrupt_parquet_file_is_one_line(tmp_path: Path) -> None:
    archive, broken = corrupt_archive(tmp_path)
    # TMPDIR: where the command's log file goes (tempfile), here kept with the test's files.
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(tmp_path)}
    done = pipeline("--master", "local[1]", "report", "--archive", str(archive), "--out",
                    str(tmp_path / "o"), env=env, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith("tubeq-pipeline: Spark: [FAILED_READ_FILE"), line
    assert f"{broken}" in line and "corrupted file" in line
    log = spark_log_of(line)
    assert log.parent == tmp_path and "FAILED_READ_FILE" in log.read_text()


def test_an_archive_of_no_events_is_one_line(tmp_path: Path) -> None:
    """Parquet files with no rows in them: found empty once Spark reads them."""
    import pyarrow as pa

    archive = tmp_path / "archive"
    part = archive / "date=2026-01-01" / "tube=orders"
    part.mkdir(parents=True)
    table = pa.table({"stream_id": pa.array([], pa.string()),
                      **{name: pa.array([], pa.int64() if name in INT_FIELDS else pa.string())
                         for name in FIELDS if name != "tube"}})
    pq.write_table(table, part / "part-0.parquet")
    # TMPDIR: where the command's log file goes (tempfile), here kept with the test's files.
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(tmp_path)}
    done = pipeline("--master", "local[1]", "report", "--archive", str(archive), "--out",
                    str(tmp_path / "o"), env=env, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(f"tubeq-pipeline: no events to report: --archive {archive} holds "
                           "no events"), line
    assert spark_log_of(line).parent == tmp_path
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# The commands, end to end through the dispatcher.
# ---------------------------------------------------------------------------------------------


def test_report_through_the_dispatcher(spark: SparkSession, archive: Path, tmp_path: Path,
                                       record: workload.Record,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert cli.main(["report", "--archive", str(archive), "--out", str(out)], spark=spark) == 0
    assert "report.html" in capsys.readouterr().out
    assert (out / "report.html").is_file()
    assert all_tubes_row(out)["put"] == puts_in(record)


def test_since_after_until_is_one_line(spark: SparkSession, archive: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["report", "--archive", str(archive), "--out", str(tmp_path / "o"),
                       "--since", "2026-11-30", "--until", "2026-11-29T12:00"], spark=spark)
    assert status == 1
    assert one_line(capsys.readouterr().err) == (
        "tubeq-pipeline: --since must come before --until")
    assert not (tmp_path / "o").exists()


def test_verbose_leaves_sparks_output_on_stderr() -> None:
    quiet = cli.build_parser("report").parse_args(["report", "--archive", "a", "--out", "o"])
    loud = cli.build_parser("report").parse_args(
        ["report", "--verbose", "--archive", "a", "--out", "o"])
    assert (quiet.verbose, loud.verbose) == (False, True)


def test_a_spark_error_is_one_line(spark: SparkSession, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    archive, broken = corrupt_archive(tmp_path)
    status = cli.main(["report", "--archive", str(archive), "--out", str(tmp_path / "o")],
                      spark=spark)
    assert status == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("tubeq-pipeline: Spark: [FAILED_READ_FILE"), line
    assert str(broken) in line and "corrupted file" in line
    assert "Spark's log" not in line  # this process did not start the JVM


def test_a_spark_error_collected_as_arrow_is_its_cause() -> None:
    """A result collected as Arrow fails with "Exception thrown in awaitResult", no condition of
    its own: the line is its cause's, Spark's error condition and the deepest cause."""
    text = "\n".join([
        "An error occurred while calling o722.getResult.",
        ": org.apache.spark.SparkException: Exception thrown in awaitResult:",
        "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:70)",
        "Caused by: org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered "
        "error while reading file file:///a/part-1.parquet.  SQLSTATE: KD001",
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotReadFilesError(x:920)",
        "Caused by: java.lang.RuntimeException: corrupted file: the footer index is not within",
    ])
    assert cli.spark_error(text) == (
        "Spark: [FAILED_READ_FILE.NO_HINT] Encountered error while reading file "
        "file:///a/part-1.parquet.  SQLSTATE: KD001 (corrupted file: the footer index is not "
        "within)")
    assert cli.spark_error(text.replace("[FAILED_READ_FILE.NO_HINT] ", "")) is None


def test_schedule_through_the_dispatcher(spark: SparkSession, tubeq: ServerProcess,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    tube = f"cli-{secrets.token_hex(3)}"
    dataset = tmp_path / "orders.json"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in [
        {"body": "order-1", "delay": 0},
        {"body": "order-2", "delay": 600},
        {"body": "order-3", "delay": 0, "priority": 7},
        {"delay": 0},  # no body: counted as bad, not fatal
    ]))
    status = cli.main(["schedule", "--input", str(dataset), "--address",
                       f"{tubeq.host}:{tubeq.port}", "--tube", tube, "--ttr", "30"], spark=spark)
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "put 3," in printed
    assert "bad 1" in printed
    with greenstalk.Client(tubeq.address) as client:
        stats = client.stats_tube(tube)
    assert (stats["total-jobs"], stats["current-jobs-ready"],
            stats["current-jobs-delayed"]) == (3, 2, 1)


def test_archive_then_report_through_the_dispatcher(
        spark: SparkSession, redis_process: RedisProcess, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prefix = eventstream.fresh_prefix()
    client = redis.Redis.from_url(redis_process.url)
    written = eventstream.write_events(client, eventstream.key_of(prefix), 500)
    client.close()
    archived = tmp_path / "archive"
    assert cli.main(["archive", "--redis", redis_process.url, "--prefix", prefix, "--out",
                     str(archived), "--checkpoint", str(tmp_path / "checkpoint"), "--once"],
                    spark=spark) == 0
    assert "archive: 500 events in 1 batches" in capsys.readouterr().out
    out = tmp_path / "report"
    assert cli.main(["report", "--archive", str(archived), "--out", str(out)], spark=spark) == 0
    assert all_tubes_row(out)["put"] == sum(1 for w in written if w.fields["event"] == "put")


def test_tail_through_the_dispatcher(spark: SparkSession, redis_process: RedisProcess) -> None:
    prefix = eventstream.fresh_prefix()
    client = redis.Redis.from_url(redis_process.url)
    written = eventstream.write_events(client, eventstream.key_of(prefix), 200)
    client.close()
    assert cli.main(["tail", "--redis", redis_process.url, "--prefix", prefix, "--from-start",
                     "--batches", "1", "--interval", "0.5", "--sink", "memory",
                     "--query-name", "cli_tail"], spark=spark) == 0
    counted: dict[tuple[object, ...], int] = {}
    for row in spark.table("cli_tail").collect():  # update mode: a window's latest count wins
        key = (row.window_start, row.tube, row.event)
        counted[key] = max(counted.get(key, 0), row.events)
    assert sum(counted.values()) == len(written)


def test_report_as_its_own_process(archive: Path, tmp_path: Path, record: workload.Record) -> None:
    out = tmp_path / "report"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(scratch)}
    done = pipeline("--master", "local[1]", "report", "--archive", str(archive), "--out",
                    str(out), env=env, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    # The JVM's output went to a log file, removed since the command succeeded.
    assert done.stderr == ""
    assert not list(scratch.glob("tubeq-pipeline-*.log"))
    assert "report: 7 tables and" in done.stdout
    assert all_tubes_row(out)["put"] == puts_in(record)


# Python with tubeq hidden: what a cluster node without the package runs as Spark's worker.
NO_TUBEQ_SITECUSTOMIZE = """
import sys

class HideTubeq:
    def find_spec(self, name, path=None, target=None):
        if name == "tubeq" or name.startswith("tubeq."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideTubeq())
"""


def python_without_tubeq(folder: Path) -> Path:
    """An executable that runs this interpreter with tubeq not importable."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(NO_TUBEQ_SITECUSTOMIZE)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{folder}${{PYTHONPATH:+:$PYTHONPATH}}" '
                      f'exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return python


def test_workers_that_cannot_import_tubeq_are_one_line_saying_what_to_install(
        archive: Path, tmp_path: Path) -> None:
    python = python_without_tubeq(tmp_path / "node")
    assert subprocess.run([str(python), "-c", "import tubeq"], capture_output=True,
                          check=False).returncode == 1
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "TMPDIR": str(tmp_path),
           "PYSPARK_PYTHON": str(python)}
    # Not from the repository: a worker's working directory would make tubeq importable. With
    # --driver-samples 0 the percentiles are computed on the workers, whatever the archive.
    done = subprocess.run([sys.executable, "-m", "tubeq.pipeline", "--master", "local[1]",
                           "report", "--archive", str(archive), "--out", str(tmp_path / "o"),
                           "--driver-samples", "0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=SPARK_TIMEOUT_S, check=False)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith("tubeq-pipeline: Spark: a Python worker could not import 'tubeq': "
                           "install the pipeline where Spark's Python workers run (pip install "
                           "'tubeq[pipeline]' into the Python that PYSPARK_PYTHON"), line
    assert not (tmp_path / "o" / "report.html").exists()
