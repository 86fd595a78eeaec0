"""The cluster section of `make bench`: one Redis against a 3-node Redis Cluster, and how the Lua
work splits across the nodes -> bench/RESULTS-cluster.md.

    make bench-cluster                                 the full run (~3 min on 2 cores)
    .venv/bin/python -m bench.cluster_bench --quick    1 repetition, 1 s windows (bench/out/)

Owns: the cluster section's configurations, loads, repetitions and its report. Every run starts
fresh servers on free loopback ports (bench/harness/servers.py: plain or cluster-enabled
redis-servers without persistence, two tubeq processes on them with ``--events off``, tubeq's
default with ``--redis``) and stops them by PID; nothing here touches a Redis it did not start.

Configurations (two tubeq processes each, on one prefix; generator process i talks to tubeq i):

* ``1 Redis, --shards 1``: the namespace on one hash tag (tubeq's default on a plain Redis).
* ``1 Redis, --shards 16``: the same Redis, the namespace split over 16 hash tags: the cost of
  the split itself (one Redis thread does all of it either way).
* ``3-node cluster, --shards 16``: ``redis-cli --cluster create`` over three nodes (masters
  only, slots split evenly); the 16 shards' slots fall on the nodes as crc16 puts them.

Loads (bench.harness.loadgen, 100 B bodies, 64 connections x 16 in flight, 2 generator processes):
the put and cycle loads of bench.run's matrix, but over 64 tubes so that they reach every shard:
connection n uses (and, in cycle, consumer n watches) tube ``bench.<n mod 64>`` only. And ``cycle,
watch all``: the many-tubes load (producers use the 64 tubes round robin, every consumer watches all
64), where a reserve on a split namespace asks every shard (best.lua).

Measured per run, over the measurement window: CPU of each redis-server and each tubeq process
(``/proc/PID/stat``, before and after), divided by the jobs counted in the window (us per job);
each node's INFO commandstats (reset at the window's start): script calls (EVALSHA or FCALL)
and usec per job; load average and ``other_cores`` (what the rest of the machine used). On
this shared 2-core machine the three nodes, two tubeq processes and two generators share 2
cores, so a cluster cannot show more jobs/s than one Redis: the rates are reported, but the
reading is the CPU per job and its split over the nodes. The capacity model (README "Scaling
out") follows from those: one Redis thread is one core, so a node serves ~1e6 / (Redis us per
job) jobs/s.

Raw results go to bench/out/cluster-<stamp>.json; the full run appends a dated section to
bench/RESULTS-cluster.md, ``--quick`` writes its section to bench/out/ instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from bench.harness.bench import QUIET_CORES, RUN_SLACK_S, WINDOW_JOB_CAP, Scale, alternate
from bench.harness.loadgen import LoadResult, LoadSpec, run_load
from bench.harness.machine import cpu_model, machine_and_versions
from bench.harness.paths import BENCH_DIR, OUT_DIR
from bench.harness.procstat import QuietGate
from bench.harness.profiling import SCRIPT_RUNNERS
from bench.harness.redisinfo import redis_command
from bench.harness.servers import BenchCluster, TubeqOn, snapshot_tubeq
from bench.harness.summary import median_of
from tubeq.redisio.process import RedisProcess

RESULTS = BENCH_DIR / "RESULTS-cluster.md"
TUBEQ_PROCESSES = 2
CLUSTER_NODES = 3
CLUSTER_SHARDS = 16
TUBES = 64
CONNECTIONS = 64
IN_FLIGHT = 16
BODY_SIZE = 100
GENERATOR_PROCS = 2
# After this many runs in a row found the machine busy, stop waiting for quiet (QuietGate):
# sooner than the other sections, as each of these runs starts several processes.
BUSY_STREAK_GIVE_UP = 3
TARGET_RATES = (100_000, 500_000)


@dataclass(frozen=True)
class ClusterScale(Scale):
    window_s: float
    warmup_s: float
    quiet_wait_s: float


FULL = ClusterScale("full", repetitions=3, window_s=2.0, warmup_s=0.5, quiet_wait_s=1.5)
QUICK = ClusterScale("quick", repetitions=1, window_s=1.0, warmup_s=0.3, quiet_wait_s=0.3)


@dataclass(frozen=True)
class Config:
    label: str
    cluster: bool
    shards: int


CONFIGS = (Config("1 Redis, --shards 1", False, 1),
           Config("1 Redis, --shards 16", False, CLUSTER_SHARDS),
           Config(f"{CLUSTER_NODES}-node cluster, --shards {CLUSTER_SHARDS}", True,
                  CLUSTER_SHARDS))


@dataclass(frozen=True)
class Load:
    label: str
    mode: str


LOADS = (Load("put 64x16, 64 tubes", "put"),
         Load("cycle 64x16, 64 tubes", "cycle"),
         Load("cycle 64x16, every consumer watches all 64 tubes", "many-tubes"))


def spec_for(load: Load, scale: ClusterScale, ports: list[int]) -> LoadSpec:
    return LoadSpec(mode=load.mode, port=ports[0], ports=tuple(ports), connections=CONNECTIONS,
                    in_flight=IN_FLIGHT, body_size=BODY_SIZE, jobs=WINDOW_JOB_CAP,
                    seconds=scale.window_s, warmup=scale.warmup_s, procs=GENERATOR_PROCS,
                    tubes=TUBES, time_limit=scale.warmup_s + scale.window_s + RUN_SLACK_S)


# -- servers ----------------------------------------------------------------------------------

@dataclass
class Servers:
    """A configuration's running servers: Redis node URLs and PIDs, tubeq ports and PIDs."""

    node_urls: list[str]
    redis_pids: dict[str, int]
    tubeq: TubeqOn
    prefix: str

    @property
    def pids(self) -> dict[str, int]:
        return {**self.redis_pids, **self.tubeq.pids}


@contextmanager
def running(config: Config, work_dir: Path, code_dir: Path) -> Iterator[Servers]:
    """Fresh Redis (or cluster) and two tubeq processes for ``config``; stopped by PID after."""
    plain: RedisProcess | None = None
    cluster: BenchCluster | None = None
    tubeq: TubeqOn | None = None
    try:
        if config.cluster:
            cluster = BenchCluster(work_dir / "cluster", count=CLUSTER_NODES)
            cluster.start()
            url, node_urls, redis_pids = cluster.url, cluster.node_urls, cluster.pids
        else:
            plain = RedisProcess(work_dir / "redis")
            plain.start()
            assert plain.proc is not None
            url, node_urls, redis_pids = plain.url, [plain.url], {"redis node1": plain.proc.pid}
        tubeq = TubeqOn(work_dir / "logs", url, processes=TUBEQ_PROCESSES, code_dir=code_dir,
                        flags=("--shards", str(config.shards), "--events", "off"))
        tubeq.start()
        yield Servers(node_urls, redis_pids, tubeq, tubeq.prefix)
    finally:
        if tubeq is not None:
            tubeq.stop()
        if cluster is not None:
            cluster.stop()
        if plain is not None:
            plain.stop()


def shard_layout(servers: Servers, shards: int) -> dict[str, dict[str, int]]:
    """Per node URL: how many shards and how many of the load's tubes it holds."""
    owners = _slot_owners(servers.node_urls[0]) if len(servers.node_urls) > 1 else None

    def node_of(shard: int) -> str:
        if owners is None:
            return servers.node_urls[0]
        root = f"{servers.prefix}#{shard}/{shards}" if shards > 1 else servers.prefix
        slot = key_slot(("{" + root + "}:").encode())
        return next(url for (start, end), url in owners if start <= slot <= end)

    layout = {url: {"shards": 0, "tubes": 0} for url in servers.node_urls}
    for shard in range(shards):
        layout[node_of(shard)]["shards"] += 1
    for tube in range(TUBES):  # tubeq.store.shards.shard_of_tube: crc32(name) mod n
        layout[node_of(zlib.crc32(f"bench.{tube}".encode()) % shards)]["tubes"] += 1
    return layout


def _slot_owners(url: str) -> list[tuple[tuple[int, int], str]]:
    reply = redis_command(url, "CLUSTER", "SLOTS")
    assert isinstance(reply, list)
    owners = []
    for entry in reply:
        assert isinstance(entry, list)
        start, end, primary = entry[0], entry[1], entry[2]
        assert isinstance(start, int) and isinstance(end, int) and isinstance(primary, list)
        host, port = primary[0], primary[1]
        assert isinstance(host, bytes) and isinstance(port, int)
        owners.append(((start, end), f"redis://{host.decode()}:{port}/0"))
    return owners


# -- one run ----------------------------------------------------------------------------------

def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def measure(config: Config, load: Load, scale: ClusterScale, work_dir: Path, code_dir: Path,
            gate: QuietGate) -> dict[str, Any]:
    with running(config, work_dir, code_dir) as servers:
        layout = shard_layout(servers, config.shards)
        quiet = gate.wait()
        load_before = loadavg()
        result = run_load(spec_for(load, scale, servers.tubeq.ports), servers.pids,
                          node_urls=servers.node_urls)
        load_after = loadavg()
    return {"config": config.label, "load": load.label, "ok": result.ok,
            "loadavg_before": load_before, "loadavg_after": load_after,
            "quiet_cores_at_start": round(quiet, 2), "layout": layout,
            "node_urls": servers.node_urls, "result": asdict(result),
            "figures": figures(result, servers.node_urls)}


def figures(result: LoadResult, node_urls: list[str]) -> dict[str, Any]:
    """CPU per job of each process and each node's evalsha per job, from one run."""
    rate = result.jobs_per_s

    def us_per_job(pct: float | None) -> float | None:
        return None if pct is None or rate <= 0 else pct / 100.0 * 1e6 / rate

    cpu = result.cpu_pct
    nodes = []
    for index, url in enumerate(node_urls):
        stats = result.extra.get("redis_nodes", {}).get(url, {})
        # Script calls, EVALSHA or FCALL (tubeq.store.scripts): (name, calls, usec) per job.
        scripts = [row for row in stats.get("by_command", []) if row[0] in SCRIPT_RUNNERS]
        evalsha = ("scripts", sum(r[1] for r in scripts), sum(r[2] for r in scripts))
        nodes.append({"node": f"node{index + 1}",
                      "cpu_pct": cpu.get(f"redis node{index + 1}"),
                      "cpu_us_per_job": us_per_job(cpu.get(f"redis node{index + 1}")),
                      "evalsha_calls_per_job": evalsha[1], "evalsha_us_per_job": evalsha[2],
                      "top_level_us_per_job": stats.get("top_level_usec_per_job"),
                      "by_command": stats.get("by_command", [])})
    tubeq_pcts = [v for k, v in cpu.items() if k.startswith("tubeq")]
    redis_pcts = [n["cpu_pct"] for n in nodes]
    return {"jobs_per_s": rate, "other_cores": result.other_cores,
            "generator_cpu_pct": result.generator_cpu_pct, "tubeq_cpu_pct": tubeq_pcts,
            "tubeq_us_per_job": _summed_per_job(tubeq_pcts, us_per_job),
            "redis_us_per_job": _summed_per_job(redis_pcts, us_per_job), "nodes": nodes}


def _summed_per_job(pcts: list[float | None],
                    us_per_job: Callable[[float | None], float | None]) -> float | None:
    """Several processes' CPU per job together; None if one of them was lost."""
    known = [v for v in pcts if v is not None]
    return us_per_job(sum(known)) if known and len(known) == len(pcts) else None


# -- the whole section ------------------------------------------------------------------------

def run_all(scale: ClusterScale, stamp: str) -> dict[str, Any]:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    gate = QuietGate(QUIET_CORES, scale.quiet_wait_s, BUSY_STREAK_GIVE_UP)
    runs: list[dict[str, Any]] = []
    started = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="tubeq-cluster-bench-") as tmp:
        code_dir = snapshot_tubeq(Path(tmp) / "code")
        for repetition in range(scale.repetitions):
            # interleaved: a noisy minute hurts one repetition of each row
            order = alternate([(c, ld) for c in CONFIGS for ld in LOADS], repetition)
            for number, (config, load) in enumerate(order):
                work = Path(tmp) / f"r{repetition}-{number}"
                try:
                    run = measure(config, load, scale, work, code_dir, gate)
                except Exception as error:  # a failed run is reported, the rest still runs
                    run = {"config": config.label, "load": load.label, "ok": False,
                           "error": f"{type(error).__name__}: {error}"}
                run["repetition"] = repetition
                runs.append(run)
                _progress(run)
    finished = datetime.now(UTC)
    data = {"scale": asdict(scale), "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"), "machine": machine_and_versions(),
            "cpu_model": cpu_model(), "tubeq_tree": tubeq_tree(), "runs": runs}
    (OUT_DIR / f"cluster-{stamp}.json").write_text(json.dumps(data, indent=1))
    return data


def tubeq_tree() -> str:
    """The last commit that changed tubeq/ (the code measured: the run snapshots it)."""
    done = subprocess.run(["git", "-C", str(BENCH_DIR.parent), "log", "-1", "--format=%h %cs",
                           "--", "tubeq"], capture_output=True, text=True, timeout=30,
                          check=False)
    return done.stdout.strip()


def _progress(run: dict[str, Any]) -> None:
    if "error" in run:
        print(f"  {run['config']} / {run['load']}: FAILED {run['error']}", file=sys.stderr)
        return
    f = run["figures"]
    nodes = ", ".join(f"{_n(n['cpu_us_per_job'])}" for n in f["nodes"])
    print(f"  {run['config']} / {run['load']}: {f['jobs_per_s']:,.0f} jobs/s, tubeq "
          f"{_n(f['tubeq_us_per_job'])} us/job, Redis {_n(f['redis_us_per_job'])} us/job "
          f"(nodes: {nodes}), other {f['other_cores']}, load {run['loadavg_before']}"
          f"{'' if run['ok'] else ' NOT OK: ' + str(run['result']['error_samples'])}",
          file=sys.stderr)


# -- the report -------------------------------------------------------------------------------

def _n(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return _n(values[0])
    return f"{_n(statistics.median(values))} ({_n(min(values))}-{_n(max(values))})"


def _runs(data: dict[str, Any], config: Config, load: Load) -> list[dict[str, Any]]:
    return [r for r in data["runs"] if r["config"] == config.label and r["load"] == load.label
            and r.get("ok")]


def _fig(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r["figures"][key] for r in runs if r["figures"].get(key) is not None]


def _node_fig(runs: list[dict[str, Any]], index: int, key: str) -> list[float]:
    return [r["figures"]["nodes"][index][key] for r in runs
            if r["figures"]["nodes"][index].get(key) is not None]


def render(data: dict[str, Any]) -> str:
    scale = data["scale"]
    machine = data["machine"]
    loads = [r["loadavg_before"] for r in data["runs"] if "loadavg_before" in r]
    failed = [r for r in data["runs"] if not r.get("ok")]
    lines = [
        f"## Run of {data['started'].replace('T', ' ').replace('+00:00', ' UTC')}"
        f" ({scale['name']})", "",
        f"CPU: **{machine['cpu']}** (shared with other work); {machine['os']}; "
        f"{machine['redis-server']}; Python {machine['python']}; tubeq {machine['tubeq']}"
        f"{' (tubeq/ as of ' + data['tubeq_tree'] + ')' if data.get('tubeq_tree') else ''}.",
        f"Load average (1/5/15 min) at the runs' starts: {loads[0] if loads else 'n/a'} first, "
        f"{loads[-1] if loads else 'n/a'} last (every run's is in the JSON); "
        f"{scale['repetitions']} repetition(s), interleaved; windows of {scale['window_s']} s "
        f"after {scale['warmup_s']} s of warm-up; fresh servers for every run.", "",
        "Setup: 2 tubeq processes (`--events off`) on one prefix; generator process i (of 2) "
        "talks to tubeq i. 100 B bodies, 64 connections x 16 in flight (cycle: 64 producers "
        "and 64 consumers). The load is spread over **64 tubes so that it reaches every "
        "shard**: connection n uses (and in cycle consumer n watches) tube `bench.<n mod 64>` "
        "only; in `watch all` every consumer watches all 64 and producers use them round "
        "robin. Redis without persistence. **This 2-core machine cannot show a throughput "
        "gain from a cluster**: three nodes, two tubeq processes and two generators share 2 "
        "cores, so jobs/s is bounded by the box, not by one Redis thread. The reading is CPU "
        "per job (`/proc/PID/stat` over the window / jobs counted in it) and how the Redis "
        "work splits across the nodes.", ""]
    if failed:
        lines += [f"**{len(failed)} run(s) failed or reported errors** (left out of the "
                  "medians): " + "; ".join(
                      f"{r['config']} / {r['load']}: "
                      + (r.get("error") or str(r.get("result", {}).get("error_samples")))
                      for r in failed), ""]
    lines += ["### CPU per job", "",
              "Medians (min-max) over the repetitions. `Redis` sums every redis-server; "
              "`tubeq` sums both tubeq processes. `other` is what the rest of the machine used, "
              "in cores.", "",
              "| config | load | jobs/s | tubeq us/job | Redis us/job (all nodes) | busiest "
              "node us/job | script calls/job (all nodes) | other cores |",
              "|---|---|---|---|---|---|---|---|"]
    for load in LOADS:
        for config in CONFIGS:
            runs = _runs(data, config, load)
            if not runs:
                lines.append(f"| {config.label} | {load.label} | failed | | | | | |")
                continue
            busiest = [max(n["cpu_us_per_job"] for n in r["figures"]["nodes"]) for r in runs]
            calls = [sum(n["evalsha_calls_per_job"] for n in r["figures"]["nodes"])
                     for r in runs]
            lines.append(
                f"| {config.label} | {load.label} | {_spread(_fig(runs, 'jobs_per_s'))} | "
                f"{_spread(_fig(runs, 'tubeq_us_per_job'))} | "
                f"{_spread(_fig(runs, 'redis_us_per_job'))} | {_spread(busiest)} | "
                f"{_spread(calls)} | {_spread(_fig(runs, 'other_cores'))} |")
    lines += ["", *_split_table(data), "", *_split_cost(data), "", *_capacity(data), ""]
    return "\n".join(lines)


def _split_table(data: dict[str, Any]) -> list[str]:
    cluster = CONFIGS[2]
    lines = ["### How the Lua work splits across the cluster's nodes", "",
             f"{cluster.label}: each node's redis-server CPU per job (of all the cluster's "
             "jobs), its share of the cluster's Redis CPU, and its INFO commandstats "
             "script calls (`cmdstat_evalsha` or `cmdstat_fcall`) and usec per job (reset at "
             "the window's start); medians "
             "over the repetitions. `shards / tubes` is where crc16 put the 16 shards' slots "
             "and crc32 the 64 tubes. Each connection keeps 16 commands in flight, so a node "
             "that answers sooner gets more of the jobs than its share of tubes: `CPU us per "
             "script call` (the node's CPU over its script calls) is the per-node cost that "
             "does not depend on that. commandstats' usec is time inside the command by the "
             "wall clock, which on this oversubscribed machine includes time the Redis thread "
             "was preempted: it can exceed the node's CPU; the CPU columns are the reading.", "",
             "| load | node | shards / tubes | CPU us/job | share of Redis CPU | evalsha "
             "calls/job | CPU us per script call | script usec/job (commandstats) |",
             "|---|---|---|---|---|---|---|---|"]
    for load in LOADS:
        runs = _runs(data, cluster, load)
        if not runs:
            continue
        for index in range(CLUSTER_NODES):
            layout = list(runs[0]["layout"].values())[index]
            shares = [r["figures"]["nodes"][index]["cpu_us_per_job"]
                      / r["figures"]["redis_us_per_job"] * 100 for r in runs
                      if r["figures"]["redis_us_per_job"]]
            per_call = [r["figures"]["nodes"][index]["cpu_us_per_job"]
                        / r["figures"]["nodes"][index]["evalsha_calls_per_job"] for r in runs
                        if r["figures"]["nodes"][index]["evalsha_calls_per_job"]
                        and r["figures"]["nodes"][index]["cpu_us_per_job"] is not None]
            lines.append(
                f"| {load.label} | node{index + 1} | {layout['shards']} / {layout['tubes']} | "
                f"{_spread(_node_fig(runs, index, 'cpu_us_per_job'))} | "
                f"{_n(median_of(shares), 0)} % | "
                f"{_n(median_of(_node_fig(runs, index, 'evalsha_calls_per_job')), 2)} | "
                f"{_n(median_of(per_call))} | "
                f"{_n(median_of(_node_fig(runs, index, 'evalsha_us_per_job')), 1)} |")
    return lines


def _split_cost(data: dict[str, Any]) -> list[str]:
    one, sixteen = CONFIGS[0], CONFIGS[1]
    lines = ["### The cost of the split itself: --shards 1 vs --shards 16 on one Redis", "",
             "| load | Redis us/job, 1 shard | 16 shards | ratio | script calls/job, 1 shard |"
             " 16 shards | tubeq us/job, 1 shard | 16 shards |",
             "|---|---|---|---|---|---|---|---|"]
    for load in LOADS:
        a, b = _runs(data, one, load), _runs(data, sixteen, load)
        if not a or not b:
            continue
        ra, rb = median_of(_fig(a, "redis_us_per_job")), median_of(_fig(b, "redis_us_per_job"))
        ratio = f"{rb / ra:.2f}x" if ra and rb else "n/a"
        lines.append(
            f"| {load.label} | {_n(ra)} | {_n(rb)} | {ratio} | "
            f"{_n(median_of(_node_fig(a, 0, 'evalsha_calls_per_job')), 2)} | "
            f"{_n(median_of(_node_fig(b, 0, 'evalsha_calls_per_job')), 2)} | "
            f"{_n(median_of(_fig(a, 'tubeq_us_per_job')))} | "
            f"{_n(median_of(_fig(b, 'tubeq_us_per_job')))} |")
    return lines


def _capacity(data: dict[str, Any]) -> list[str]:
    """The capacity model from this run's cluster medians (README "Scaling out" quotes it)."""
    cluster = CONFIGS[2]
    counts = [n["tubes"] for r in data["runs"] if r["config"] == cluster.label and "layout" in r
              for n in r["layout"].values()]
    tubes_range = f"{min(counts)}-{max(counts)}" if counts else "n/a"
    lines = ["### Capacity model from this run", "",
             "One Redis thread is one core, so a node serves at most ~1e6 / R jobs/s, R = the "
             "Redis CPU per job summed over the nodes (each job's Lua work is done once, on "
             "whichever node holds its shards); a tubeq process serves ~1e6 / T, T = tubeq CPU per"
             " job. With the work spread evenly, N nodes serve N x 1e6 / R, and a target rate "
             "needs target x R / 1e6 nodes (rounded up). The spread is not even: 16 shards over 3 "
             f"nodes and 64 tubes by crc32 put {tubes_range} of the 64 tubes on one node in these "
             "runs (each run has its own prefix, so its own layout). With the same rate into every"
             " tube, the node with the most tubes saturates first, at 1e6 / (R x its share of the "
             "tubes) jobs/s for the 3 nodes (the closed-loop load here does not show that share: a"
             " node that answers sooner simply gets more jobs). CPU only: clients, network and "
             "round trips come first on real machines.", "",
             "| load | R: Redis us/job | jobs/s per node (1e6 / R) | T: tubeq us/job | tubeq "
             "processes per node (T / R) | most tubes on one node | ceiling of these 3 nodes "
             "at that spread, jobs/s | " + " | ".join(f"nodes for {t // 1000}k jobs/s (even)"
                                                     for t in TARGET_RATES) + " |",
             "|---|---|---|---|---|---|---|" + "---|" * len(TARGET_RATES)]
    for load in LOADS:
        runs = _runs(data, cluster, load)
        r, t = median_of(_fig(runs, "redis_us_per_job")), median_of(_fig(runs, "tubeq_us_per_job"))
        if not r or not t:
            continue
        busiest = median_of([max(n["tubes"] for n in run["layout"].values()) / TUBES
                        for run in runs])
        assert busiest is not None
        needed = [str(math.ceil(target * r / 1e6)) for target in TARGET_RATES]
        lines.append(f"| {load.label} | {_n(r)} | {1e6 / r:,.0f} | {_n(t)} | {t / r:.2f} | "
                     f"{busiest * 100:.0f} % | {1e6 / (r * busiest):,.0f} | "
                     + " | ".join(needed) + " |")
    return lines


def write_report(data: dict[str, Any], quick: bool, stamp: str) -> Path:
    section = render(data)
    if quick:
        path = OUT_DIR / f"RESULTS-cluster-{stamp}.md"
        path.write_text(section + "\n")
        return path
    header = ("# tubeq on one Redis and on a Redis Cluster: CPU per job and the split across "
              "nodes\n\nWritten by `make bench-cluster` (bench/cluster_bench.py; its module "
              "header says what runs). Each run appends a dated section.\n")
    existing = RESULTS.read_text() if RESULTS.exists() else header
    RESULTS.write_text(existing.rstrip("\n") + "\n\n" + section + "\n")
    return RESULTS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_bench",
                                description=(__doc__ or "").split("\n", 1)[0])
    p.add_argument("--quick", action="store_true", help="1 repetition, short windows, bench/out/")
    p.add_argument("--render", type=Path, default=None,
                   help="re-render a raw JSON from bench/out/ to stdout, run nothing")
    args = p.parse_args(argv)
    if args.render is not None:
        print(render(json.loads(args.render.read_text())))
        return 0
    scale = QUICK if args.quick else FULL
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    print(f"cluster section ({scale.name}): {len(CONFIGS) * len(LOADS) * scale.repetitions} "
          f"runs, load average {loadavg()}, pid {os.getpid()}", file=sys.stderr)
    t0 = time.monotonic()
    data = run_all(scale, stamp)
    path = write_report(data, args.quick, stamp)
    print(f"wrote {path} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if all(r.get("ok") for r in data["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
