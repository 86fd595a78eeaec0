"""RESULTS.md from a results file of bench/run.py: tables, ratios, targets met or missed.

Owns: which figure each target is judged on, the layout of the report and every
section of it, the batches section included (bench/batch_bench.py renders it in
RESULTS-batches.md too), and the names of the rows it judges by name (MANY_TUBES_64...). Figures
are summarised as bench/harness/summary.py does (median and min-max over repetitions, ratio =
tubeq median / beanstalkd median from the same run). It computes nothing that is not in the
results file, and it never fills a missing figure: an absent or failed row shows as "n/a" with
the reason in the notes. It imports the harness only, never a scenario: scenarios import it.

The section "What the profile points to" points at bench/PROFILE_NOTES.md, written by hand from
runs' profiles (not copied into the report: one text, one place). Each of its sections names the
tubeq source fingerprint it was read from; the report says which section read this run's code, or
that none did, so a stale reading is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness import machine
from bench.harness.paths import BENCH_DIR
from bench.harness.profiling import SCRIPT_RUNNERS
from bench.harness.summary import (
    SHARED_BOX_CORES,
    Results,
    Runs,
    fmt_ms,
    fmt_pct,
    fmt_rate,
    fmt_x,
    median_of,
    noise_cell,
    ratio_of,
    redis_cpu_pct,
    table,
    tubeq_cpu_pct,
)

PROFILE_NOTES = BENCH_DIR / "PROFILE_NOTES.md"
# The batch rows' body size (bench/batch_bench.py): the single-job rows they are judged against
# are the 100 B ones.
BATCH_BODY = 100
# Issue 8: tubeq's memory per connection blocked in reserve, at most 4 kB.
IDLE_TARGET_B = 4000
# Issue 9: put and cycle throughput with lifecycle events on, at least this share of events off.
EVENTS_TARGET = 0.85
# Issue 12: "near-zero cost": throughput with every metrics hook on, at least this share of
# none (within this machine's run-to-run noise, which is itself a few percent).
METRICS_TARGET = 0.95

# -- sections ---------------------------------------------------------------------------------

def _header(results: Results) -> list[str]:
    meta = results["meta"]
    scale = meta["scale"]
    minutes, seconds = divmod(int(meta["elapsed_s"]), 60)
    lines = [
        "# tubeq vs beanstalkd 1.12: benchmark results",
        "",
        f"Written by `{'make bench' if scale['name'] == 'full' else 'python -m bench.run --quick'}`"
        f" (bench/run.py) on {meta['started']} (UTC); the run took {minutes} min {seconds} s. "
        f"Scale: **{scale['name']}**, {scale['repetitions']} interleaved repetition(s) per row, "
        f"{scale['window_s']} s measurement window after {scale['warmup_s']} s of warm-up.",
        "",
        "## Machine and versions",
        "",
    ]
    machine_rows = [[k, str(v)] for k, v in meta["machine"].items()]
    if meta.get("tubeq_source_sha256"):
        machine_rows.append(["tubeq source (sha256 of tubeq/, first 12)",
                             meta["tubeq_source_sha256"]])
    lines += table(["what", "value"], machine_rows)
    for note in results.get("notes", []):
        if "tubeq/" in note:
            lines += [f"> {note}", ""]
    lines += [
        "## Method",
        "",
        "* Every run starts a fresh server on a free 127.0.0.1 port and stops it by PID: "
        "`beanstalkd -l 127.0.0.1 -p PORT` (no binlog), or tubeq (`python -m tubeq ... --redis "
        "URL --prefix NAME --events on`) on its own private redis-server (no persistence, "
        "`hash-max-listpack-value 8192`, as `tubeq.redisio.process` configures it). Both keep "
        "jobs in memory only. tubeq writes its lifecycle events, as it does by default with "
        "its private redis-server, except in the memory rows (backlog, 4 KiB, idle "
        "connections): the event stream is capped by `--events-maxlen`, not a cost per job.",
        "* The load generator is `bench/harness/loadgen.py` (asyncio + uvloop, one Protocol per "
        "connection, one write per connection per read). Rows with 64 connections use 2 "
        "generator processes, each on its own tube.",
        "* Throughput = jobs completed inside the measurement window / window. A put counts at "
        "INSERTED, a cycle job at DELETED. put latency is the put round trip; cycle latency is "
        "put sent -> RESERVED received (from a timestamp in the body); in saturated cycle runs "
        "producers outrun consumers, so it measures queue depth, not service time.",
        "* Each cell is the **median over repetitions, with min-max**; the ratio is tubeq's "
        "median / beanstalkd's median, measured in the same run. Repetitions are interleaved "
        "(each repetition walks every row, alternating which server goes first).",
        "* CPU is % of one core over the window, from /proc/PID/stat: beanstalkd; tubeq "
        "process / its redis-server. `us/job` = server CPU (tubeq + redis summed) per job. "
        "`gen` is each generator process's CPU: a generator near 100 % (marked `bound`) was "
        "itself the bottleneck. `other` is the CPU, in cores, of everything else on the "
        "machine (other tenants); each run first waits up to "
        f"{scale['quiet_wait_s']} s for the machine to use < 0.3 cores, and rows whose median "
        f"`other` is >= {SHARED_BOX_CORES} are marked `shared`: their figures are depressed.",
        "",
    ]
    return lines


def _throughput(results: Results, runs: Runs) -> list[str]:
    lines = ["## 1. put, and put+reserve+delete cycles", "",
             "Rows are `mode connections x in-flight body`. Latency p50 / p99 in ms. CPU % "
             "beanstalkd | tubeq / redis.", ""]
    rows = []
    keys = [r["row"] for r in results["runs"] if r["scenario"] == "throughput"]
    for key in dict.fromkeys(keys):
        lat_b, lat_t = runs.latency(key, "beanstalkd"), runs.latency(key, "tubeq")
        ratio = ratio_of(runs.rate(key, "tubeq"), runs.rate(key, "beanstalkd"))
        rows.append([
            key, runs.rate_cell(key, "beanstalkd"), runs.rate_cell(key, "tubeq"),
            f"**{fmt_x(ratio)}**",
            f"{fmt_ms(lat_b['p50_ms'])} / {fmt_ms(lat_b['p99_ms'])}",
            f"{fmt_ms(lat_t['p50_ms'])} / {fmt_ms(lat_t['p99_ms'])}",
            f"{runs.server_cpu_cell(key, 'beanstalkd')} | {runs.server_cpu_cell(key, 'tubeq')}",
            f"{fmt_rate(runs.us_per_job(key, 'beanstalkd'))} / "
            f"{fmt_rate(runs.us_per_job(key, 'tubeq'))}",
            f"{runs.generator_cpu(key, 'beanstalkd')} / {runs.generator_cpu(key, 'tubeq')}",
            noise_cell(runs, key, ("beanstalkd", "tubeq")),
        ])
    lines += table(["row", "beanstalkd jobs/s", "tubeq jobs/s", "tubeq / beanstalkd",
                     "latency beanstalkd", "latency tubeq", "CPU %", "us/job b / t",
                     "gen CPU % b / t", "other cores b / t"], rows)
    cycle_keys = [k for k in dict.fromkeys(keys) if k.startswith("cycle")]
    lines += ["Who got served in the cycle rows: puts acknowledged per second (producers) next "
              "to completed cycles per second (consumers), medians. A server that is fair "
              "between connections keeps the two close; a gap means consumers were starved "
              "while producers filled the queue.", ""]
    fairness = []
    for key in cycle_keys:
        cells = [key]
        for server in ("beanstalkd", "tubeq"):
            puts = median_of(r["puts_per_s"] for r in runs.ok(key, server))
            cells += [fmt_rate(puts), fmt_rate(runs.rate(key, server))]
        fairness.append(cells)
    lines += table(["row", "beanstalkd puts/s", "beanstalkd cycles/s", "tubeq puts/s",
                     "tubeq cycles/s"], fairness)
    return lines


def _delayed(runs: Runs) -> list[str]:
    key = "delayed 0-2 s, 1000/s"
    lines = ["## 2. Delayed jobs: lateness against the due time", "",
             "One producer puts 1000 jobs/s with a random delay of 0, 1 or 2 s (the protocol's "
             "unit is the second); 8 consumers wait in reserve-with-timeout. Lateness = RESERVED "
             "received - (put sent + delay), ms, median over repetitions (p99 min-max).", ""]
    rows = []
    for server in ("beanstalkd", "tubeq"):
        all_jobs = runs.latency(key, server)
        later = runs.latency(key, server, "later_latency")
        p99s = [r["latency"]["p99_ms"] for r in runs.ok(key, server)]
        spread = f" ({fmt_ms(min(p99s))}-{fmt_ms(max(p99s))})" if len(p99s) > 1 else ""
        delivered = median_of(r["completed"] for r in runs.ok(key, server))
        rows.append([server, fmt_ms(all_jobs["p50_ms"]), fmt_ms(all_jobs["p99_ms"]) + spread,
                     fmt_ms(all_jobs["max_ms"]),
                     f"{fmt_ms(later['p50_ms'])} / {fmt_ms(later['p99_ms'])} / "
                     f"{fmt_ms(later['max_ms'])}",
                     fmt_rate(delivered), runs.server_cpu_cell(key, server),
                     noise_cell(runs, key, (server,))])
    return lines + table(["server", "p50", "p99", "max", "delay >= 1 s: p50 / p99 / max",
                           "jobs delivered", "CPU %", "other cores"], rows)


def _delayed_ms(runs: Runs) -> list[str]:
    """The delayed-ms row (put-with delay-ms; tubeq only, beanstalkd has no ms delays)."""
    key = "delayed-ms 0-2000 ms, 1000/s"
    lines = ["", "Millisecond delays (tubeq's put-with `delay-ms`, a random 0-2000 ms): the same "
             "load and measure; beanstalkd has no millisecond delay to compare with.", ""]
    all_jobs = runs.latency(key, "tubeq")
    if all_jobs["p99_ms"] is None:
        return []  # an older results file, without the row
    later = runs.latency(key, "tubeq", "later_latency")
    delivered = median_of(r["completed"] for r in runs.ok(key, "tubeq"))
    row = ["tubeq", fmt_ms(all_jobs["p50_ms"]), fmt_ms(all_jobs["p99_ms"]),
           fmt_ms(all_jobs["max_ms"]),
           f"{fmt_ms(later['p50_ms'])} / {fmt_ms(later['p99_ms'])} / {fmt_ms(later['max_ms'])}",
           fmt_rate(delivered), runs.server_cpu_cell(key, "tubeq"),
           noise_cell(runs, key, ("tubeq",))]
    return lines + table(["server", "p50", "p99", "max", "delay > 0: p50 / p99 / max",
                           "jobs delivered", "CPU %", "other cores"], [row])


def _wake(runs: Runs) -> list[str]:
    key = "wake, 4 blocked consumers"
    lines = ["## 3. Wake latency: put -> RESERVED for a consumer already blocked in reserve", "",
             "4 consumers wait in reserve; one producer puts one job 1-3 ms after the previous "
             "one was delivered. `tubeq x2`: the consumers are on one tubeq process, the "
             "producer on another (same Redis, same prefix), so the wake-up crosses processes "
             "through Redis pub/sub. beanstalkd is one process: its figure is the reference for "
             "both tubeq rows. ms, median over repetitions.", ""]
    rows = []
    for server in ("beanstalkd", "tubeq", "tubeq x2"):
        lat = runs.latency(key, server)
        rows.append([server, fmt_ms(lat["p50_ms"]), fmt_ms(lat["p99_ms"]), fmt_ms(lat["max_ms"]),
                     runs.server_cpu_cell(key, server), noise_cell(runs, key, (server,))])
    return lines + table(["server", "p50", "p99", "max", "CPU %", "other cores"], rows)


MANY_TUBES_64 = "64x16, 100 tubes"
# Its base: section 1's plain cycle 64x16 100B (no `use`, each generator process on a tube of
# its own), measured again in the many-tubes pass, interleaved with the 100-tube row.
MANY_TUBES_64_BASE = "64x16, plain cycle"
# The 64x16 load over 100 tubes keeps at least this share of the plain cycle's rate.
MANY_TUBES_64_TARGET = 0.7


def _many_tubes(results: Results, runs: Runs) -> list[str]:
    lines = ["## 4. Reserve across many watched tubes", "",
             "Rows `T tubes`: 8 producer connections put round robin over T tubes (a `use` "
             "before every put, unless the row says "
             "otherwise); 8 consumer connections each watch all T tubes; 16 commands in flight "
             "per connection. Row `64x16, 100 tubes`: 64 producer connections, each "
             "sending `use` of the next of the 100 tubes before every put (each starts at its "
             "own tube), and 64 consumers watching all 100, each with 16 "
             "reserve-with-timeout in flight; 2 generator processes sharing the tubes. Its base "
             "`64x16, plain cycle` is section 1's `cycle 64x16 100B` (no `use`, one tube per "
             "generator process, consumers watching it alone), measured again in this pass, "
             "interleaved with it. Rows `64x16, 100 tubes, N consumers`: the same load with N "
             "consumer connections instead of 64 (issue 33 item 7: how the cost grows with "
             "watchers; bench/RESULTS-watchers.md). \"vs 1 tube\" compares each server with "
             "itself, against the `1 tube` row of its set (the 64x16 rows': the plain cycle); "
             f"target: tubeq >= {MANY_TUBES_64_TARGET}x for the 64-consumer row.", ""]
    keys = list(dict.fromkeys(r["row"] for r in results["runs"]
                              if r["scenario"] == "many-tubes"))
    rows = []
    for key in keys:
        base = MANY_TUBES_64_BASE if key.startswith("64x16") else "1 tube"
        base_b, base_t = runs.rate(base, "beanstalkd"), runs.rate(base, "tubeq")
        rate_b, rate_t = runs.rate(key, "beanstalkd"), runs.rate(key, "tubeq")
        lat_t = runs.latency(key, "tubeq")
        rows.append([key, runs.rate_cell(key, "beanstalkd"), runs.rate_cell(key, "tubeq"),
                     f"**{fmt_x(ratio_of(rate_t, rate_b))}**", fmt_x(ratio_of(rate_b, base_b)),
                     f"**{fmt_x(ratio_of(rate_t, base_t))}**",
                     f"{fmt_ms(lat_t['p50_ms'])} / {fmt_ms(lat_t['p99_ms'])}",
                     f"{runs.server_cpu_cell(key, 'beanstalkd')} | "
                     f"{runs.server_cpu_cell(key, 'tubeq')}",
                     f"{fmt_rate(runs.us_per_job(key, 'beanstalkd'))} / "
                     f"{fmt_rate(runs.us_per_job(key, 'tubeq'))}",
                     noise_cell(runs, key, ("beanstalkd", "tubeq"))])
    lines += table(["tubes", "beanstalkd jobs/s", "tubeq jobs/s", "tubeq / beanstalkd",
                     "beanstalkd vs 1 tube", "tubeq vs 1 tube", "tubeq latency p50/p99",
                     "CPU %", "us/job b / t", "other cores b / t"], rows)
    return lines


@dataclass(frozen=True)
class OnOffPass:
    """A pass of tubeq-only rows run with a feature on and off, interleaved: sections 4b, 4c."""

    scenario: str  # the rows' scenario, also their key prefix and the columns' word
    heading: str
    intro: str
    on: str  # the server labels of the two sides
    off: str


EVENTS_PASS = OnOffPass(
    "events", "## 4b. The cost of lifecycle events (issue 9)",
    "The rows below run on tubeq only, once with lifecycle events on (one XADD inside every "
    "transition's script, `--events on`) and once with `--events off`, interleaved in their own "
    "pass. on / off = median with events on / median with events off; target >= "
    f"{EVENTS_TARGET}x.", on="tubeq", off="tubeq events off")
METRICS_PASS = OnOffPass(
    "metrics", "## 4c. The cost of metrics (issue 12)",
    "The rows below run on tubeq only (events on), once with `--metrics 127.0.0.1:0` (the HTTP "
    "listener; every hook: outcomes per reply, slow-command timing, wait, run and lateness "
    "histograms from the scripts' results, the Redis round-trip probe) and once with "
    "`--slow-ms 0` (no hook at all), interleaved in their own pass. Nobody scrapes during the "
    "runs: a scrape's cost is off the hot path. on / off = median with metrics on / median off; "
    f"target >= {METRICS_TARGET}x.", on="tubeq metrics on", off="tubeq metrics off")


def _on_off(results: Results, runs: Runs, section: OnOffPass) -> list[str]:
    """One row per key of ``section``'s pass: both sides' rates, their ratio, latency, CPU."""
    lines = [section.heading, "", section.intro, ""]
    keys = list(dict.fromkeys(r["row"] for r in results["runs"]
                              if r["scenario"] == section.scenario))
    on, off = section.on, section.off
    rows = []
    for key in keys:
        lat_on, lat_off = runs.latency(key, on), runs.latency(key, off)
        rows.append([key.removeprefix(f"{section.scenario} "), runs.rate_cell(key, on),
                     runs.rate_cell(key, off),
                     f"**{fmt_x(ratio_of(runs.rate(key, on), runs.rate(key, off)))}**",
                     f"{fmt_ms(lat_on['p50_ms'])} / {fmt_ms(lat_on['p99_ms'])}",
                     f"{fmt_ms(lat_off['p50_ms'])} / {fmt_ms(lat_off['p99_ms'])}",
                     f"{runs.server_cpu_cell(key, on)} vs {runs.server_cpu_cell(key, off)}",
                     f"{fmt_rate(runs.us_per_job(key, on))} / "
                     f"{fmt_rate(runs.us_per_job(key, off))}",
                     noise_cell(runs, key, (on, off))])
    word = section.scenario
    return lines + table(["row", f"{word} on jobs/s", f"{word} off jobs/s", "on / off",
                           "latency on", "latency off", "CPU % tubeq / redis, on vs off",
                           "us/job on / off", "other cores on / off"], rows)


# Issue 13 part 2, targets set for the Intel Xeon machine: CPU microseconds per job.
CPU_TARGETS_US = {("put", "tubeq"): 7.0, ("put", "redis"): 7.0, ("cycle", "redis"): 22.0}
# (row key, server, what the row is) of the CPU per job table, in order.
CPU_ROWS = (
    ("{load} 64x16 100B", "tubeq", "events on (section 1)"),
    ("events {load} 64x16 100B", "tubeq", "events on (section 4b pass)"),
    ("events {load} 64x16 100B", "tubeq events off", "events off (section 4b pass)"),
    ("workers {load} 64x16 100B", "tubeq --workers 1", "--workers 1, events on (4e)"),
    ("workers {load} 64x16 100B", "tubeq --workers 2", "--workers 2, events on (4e)"),
)


def _judged(value: float | None, load: str, part: str) -> str:
    target = CPU_TARGETS_US.get((load, part))
    if value is None:
        return "n/a"
    cell = f"{value:.1f}"
    if target is None:
        return cell
    return f"{cell} ({'met' if value <= target else '**missed**'})"


def cpu_per_job(runs: Runs, load: str) -> list[tuple[str, str, dict[str, float | None]]]:
    """(row, server, figures) for the CPU per job table's rows of ``load`` (put or cycle)."""
    out = []
    for pattern, server, _ in CPU_ROWS:
        key = pattern.format(load=load)
        if not runs.ok(key, server):
            continue
        out.append((key, server, {
            "jobs_per_s": runs.rate(key, server),
            "tubeq": runs.per_job_us(key, server, tubeq_cpu_pct),
            "redis": runs.per_job_us(key, server, redis_cpu_pct),
            "redis_commands": runs.redis_command_us(key, server),
        }))
    return out


def _cpu_per_job(results: Results, runs: Runs) -> list[str]:
    """Issue 13 part 2: CPU per put and per cycle, tubeq and Redis, against the targets."""
    if not any(r["row"].startswith("events ") for r in results["runs"]) and \
            not runs.ok("put 64x16 100B", "tubeq"):
        return []
    model = cpu_model_of(results)
    lines = ["## 4d. CPU per job: tubeq and Redis, put and cycle 64x16 (issue 13)", "",
             f"CPU model: **{model}**. Targets (issue 13, set for the Intel Xeon machine): "
             "Redis <= 7 us per put and <= 22 us per cycle, tubeq <= 7 us per put (with "
             "lifecycle events off; with them on, the pipeline issue's bound applies on top). "
             "Each figure is the median over the row's repetitions of (CPU % of one core over "
             "the measurement window / jobs per second): `tubeq` sums every tubeq process "
             "(a --workers supervisor and its workers), `Redis CPU` is the redis-server "
             "process (/proc/PID/stat: command execution plus the event loop, socket reads and "
             "writes), `Redis commands` is Redis's own command time in the same window (INFO "
             "commandstats reset at the window's start: the script calls, each including the "
             "commands it runs, counted once). Redis times a command by the wall clock, so "
             "when redis-server is preempted mid-command (a busy machine) that figure exceeds "
             "its CPU; the targets are judged on the process CPU. A cycle is put + reserve + "
             "delete, counted at DELETED; the Redis time of puts the consumers had not caught "
             "up with is in it. "
             f"beanstalkd, for reference: {_rate_us(runs, 'put 64x16 100B')} us per put, "
             f"{_rate_us(runs, 'cycle 64x16 100B')} us per cycle (section 1, its process CPU).",
             ""]
    if "Intel" not in model:
        lines += [f"> The targets were set on an Intel Xeon machine; this run is on {model}, "
                  "so met / missed below compares figures from different CPUs.", ""]
    rows = []
    for load in ("put", "cycle"):
        for key, server, fig in cpu_per_job(runs, load):
            label = next(what for pattern, srv, what in CPU_ROWS
                         if pattern.format(load=load) == key and srv == server)
            total = None if fig["tubeq"] is None or fig["redis"] is None else \
                fig["tubeq"] + fig["redis"]
            rows.append([f"{load} 64x16 100B", label, fmt_rate(fig["jobs_per_s"]),
                         _judged(fig["tubeq"], load, "tubeq"),
                         _judged(fig["redis"], load, "redis"),
                         "n/a" if fig["redis_commands"] is None
                         else f"{fig['redis_commands']:.1f}",
                         "n/a" if total is None else f"{total:.1f}",
                         noise_cell(runs, key, (server,))])
    return lines + table(["load", "tubeq", "jobs/s", "tubeq CPU us/job", "Redis CPU us/job",
                           "Redis commands us/job", "tubeq + Redis us/job", "other cores"],
                          rows)


def _rate_us(runs: Runs, key: str) -> str:
    value = runs.us_per_job(key, "beanstalkd")
    return "n/a" if value is None else f"{value:.1f}"


def _workers(results: Results, runs: Runs) -> list[str]:
    """Issue 13 part 3: one tubeq process against `--workers 2`, one Redis."""
    keys = list(dict.fromkeys(r["row"] for r in results["runs"] if r["scenario"] == "workers"))
    if not keys:
        return []
    one, two = "tubeq --workers 1", "tubeq --workers 2"
    lines = ["## 4e. One tubeq process or two (`--workers 2`), on one Redis (issue 13)", "",
             "The 64x16 put and cycle loads against `tubeq --workers 1` and `tubeq --workers "
             "2` (a supervisor and two worker processes sharing the port through SO_REUSEPORT; "
             "the kernel spreads the 128 connections over them), each on a fresh private "
             "Redis, events on, interleaved in their own pass. CPU %: the tubeq processes "
             "summed (the supervisor and its workers) / redis-server.", ""]
    rows = []
    for key in keys:
        cells = [key.removeprefix("workers ")]
        for server in (one, two):
            tubeq = median_of(tubeq_cpu_pct(r) for r in runs.ok(key, server))
            cells += [runs.rate_cell(key, server),
                      f"{fmt_pct(tubeq)} / {fmt_pct(runs.cpu(key, server, 'redis'))}"]
        cells += [f"**{fmt_x(ratio_of(runs.rate(key, two), runs.rate(key, one)))}**",
                  noise_cell(runs, key, (one, two))]
        rows.append(cells)
    return lines + table(["row", "1 worker jobs/s", "CPU % tubeq / redis", "2 workers jobs/s",
                           "CPU % tubeq / redis", "2 / 1", "other cores 1 / 2"], rows)


def _bytes(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _backlog(results: Results, runs: Runs) -> list[str]:
    section = results.get("backlog") or {}
    cycle = section.get("cycle", {})
    lines = ["## 5. Backlog: throughput with jobs already queued, and memory per queued job", "",
             f"Both servers are filled with N jobs of 100 B (same priority) in one tube, then "
             f"a cycle load of {cycle.get('connections', '?')} producer + "
             f"{cycle.get('connections', '?')} consumer connections x "
             f"{cycle.get('in_flight', '?')} in flight runs on that tube, so consumers take the "
             "oldest queued jobs first. Repetitions are interleaved on the same filled pair. "
             "`Redis us/job / per script`: Redis's own command time (INFO commandstats) per "
             "completed cycle, and per script call (EVALSHA or FCALL): what a larger backlog "
             "costs inside Redis.",
             ""]
    big, reason = section.get("big"), section.get("big_reason", "")
    if section.get("requested_big") and big != section.get("requested_big"):
        ran = f"run with {big:,} jobs, " if big else ""
        lines += [f"**The issue's 10M row:** {ran}{reason}. No figure for 10M is extrapolated.",
                  ""]
    sizes = section.get("sizes", [])
    base_b, base_t = runs.rate("backlog 0", "beanstalkd"), runs.rate("backlog 0", "tubeq")
    rows = []
    for size in sizes:
        key = f"backlog {size:,}"
        rate_b, rate_t = runs.rate(key, "beanstalkd"), runs.rate(key, "tubeq")
        redis = [r["redis"] for r in runs.of(key, "tubeq") if r.get("redis")]
        redis_cell = "n/a"
        if redis:
            usec = median_of(r["total_usec_per_job"] for r in redis)
            evalsha = median_of(next((u / c for n, c, u in r["by_command"]
                                    if n in SCRIPT_RUNNERS and c), None) for r in redis)
            redis_cell = f"{usec:.1f} / {evalsha:.1f}" if usec and evalsha else "n/a"
        rows.append([f"{size:,}", runs.rate_cell(key, "beanstalkd"), runs.rate_cell(key, "tubeq"),
                     f"**{fmt_x(ratio_of(rate_t, rate_b))}**", fmt_x(ratio_of(rate_b, base_b)),
                     f"**{fmt_x(ratio_of(rate_t, base_t))}**",
                     f"{runs.server_cpu_cell(key, 'beanstalkd')} | "
                     f"{runs.server_cpu_cell(key, 'tubeq')}",
                     f"{fmt_rate(runs.us_per_job(key, 'beanstalkd'))} / "
                     f"{fmt_rate(runs.us_per_job(key, 'tubeq'))}", redis_cell,
                     noise_cell(runs, key, ("beanstalkd", "tubeq"))])
    lines += table(["queued jobs", "beanstalkd jobs/s", "tubeq jobs/s", "tubeq / beanstalkd",
                     "beanstalkd vs empty", "tubeq vs empty", "CPU %", "us/job b / t",
                     "Redis us/job / per script", "other cores b / t"], rows)
    lines += ["Memory per queued job = (after filling - before) / N: beanstalkd's VmRSS; for "
              "tubeq, Redis `used_memory` (what the target is judged on), Redis's RSS and the "
              "tubeq process's RSS (which should not grow: jobs live in Redis). Fill rate = "
              "puts/s while filling (8 connections x 64 in flight).", ""]
    mem_rows = []
    fills = [*section.get("fills", []), *[dict(f, body=4096) for f in results.get("memory_4k", [])]]
    for size in sorted({(f.get("body", 100), f["size"]) for f in fills if f["size"]}):
        body, n = size
        bs = next((f for f in fills if f.get("body", 100) == body and f["size"] == n
                   and f["server"] == "beanstalkd"), None)
        tq = next((f for f in fills if f.get("body", 100) == body and f["size"] == n
                   and f["server"] == "tubeq"), None)
        rss_b = bs["bytes_per_job"].get("rss:beanstalkd") if bs else None
        used = tq["bytes_per_job"].get("redis:used_memory") if tq else None
        mem_rows.append([f"{body} B", f"{n:,}", _bytes(rss_b), _bytes(used),
                         _bytes(tq["bytes_per_job"].get("redis:used_memory_rss") if tq else None),
                         _bytes(tq["bytes_per_job"].get("rss:tubeq") if tq else None),
                         f"**{fmt_x(ratio_of(used, rss_b))}**",
                         f"{fmt_rate(bs['fill_jobs_per_s'] if bs else None)} / "
                         f"{fmt_rate(tq['fill_jobs_per_s'] if tq else None)}"])
    return lines + table(["body", "jobs", "beanstalkd RSS B/job", "Redis used_memory B/job",
                           "Redis RSS B/job", "tubeq RSS B/job", "used_memory / beanstalkd",
                           "fill jobs/s b / t"], mem_rows)


def _idle_connections(results: Results) -> list[str]:
    measured = results.get("idle_connections") or []
    if not measured:
        return []
    lines = ["## 5b. Idle connections: memory per connection blocked in reserve", "",
             "N connections each send `reserve` on an empty tube and wait; 100 such connections "
             "are opened first, so what a process makes once is in the baseline. Bytes per "
             "connection = (server RSS after - before) / N; for tubeq also Redis `used_memory` "
             "per connection (its connection record and waiter entry). Target (issue 8): tubeq "
             "at most 4 kB (4,000 B) of RSS per connection.", ""]
    rows = [[m["server"], f"{m['connections']:,}", f"{m['rss_before_kb'] / 1024:.1f}",
             f"{m['rss_after_kb'] / 1024:.1f}", f"**{_bytes(m['bytes_per_connection'])}**",
             _bytes(m.get("redis_bytes_per_connection")), f"{m['open_and_settle_s']}"]
            for m in measured]
    return lines + table(["server", "connections", "RSS before MiB", "RSS after MiB",
                           "B per connection", "Redis B per connection",
                           "open + settle s"], rows)


def _profiles(results: Results) -> list[str]:
    lines = ["## 6. Profile: where tubeq's CPU goes", "",
             "Each main row was run once more against tubeq only, with py-spy sampling the tubeq "
             "process (250 Hz, non-blocking, busy samples only) and Redis's INFO commandstats "
             "reset before the load. Throughput here is with py-spy attached (it takes some "
             "CPU on the same 2 cores). Redis time per job is Redis's own accounting of "
             "command execution (Lua included), per completed job. A function's own time "
             "includes the C code it calls (future creation, callbacks, `transport.write`); "
             "time inside uvloop's own C loop shows as the event loop.", ""]
    for profile in results.get("profiles", []):
        result, spy, redis = profile["result"], profile["py_spy"], profile["redis"]
        cpu = result["cpu_pct"]
        lines += [f"### {profile['row']}", "",
                  f"{result['jobs_per_s']:,.0f} jobs/s; CPU: tubeq process "
                  f"{fmt_pct(cpu.get('tubeq'))} %, redis-server {fmt_pct(cpu.get('redis'))} %, "
                  f"generators {'+'.join(fmt_pct(v) for v in result['generator_cpu_pct'])} %, "
                  f"other {result['other_cores']:.2f} cores.", ""]
        if redis:
            by_command = redis["by_command"][:6]
            top = redis.get("top_level_usec_per_job")
            head = (f"{top} us of command time per job (script calls, which include the "
                    "commands they run; the list below counts those inner commands again, "
                    f"{redis['total_usec_per_job']} us summed)" if top is not None
                    else f"{redis['total_usec_per_job']} us")
            lines += [f"Redis: {head} and "
                      f"{redis['total_calls_per_job']} calls per job: "
                      + "; ".join(f"`{name}` {calls} calls, {usec} us" for name, calls, usec
                                  in by_command) + ".", ""]
        if "problem" in spy:
            lines += [f"py-spy: {spy['problem']}", ""]
            continue
        lines += [f"py-spy ({spy['samples']} busy samples) by source area: "
                  + ", ".join(f"{area} {share} %" for area, share in spy["areas"]) + ".", ""]
        own = spy["own"][:8]
        inclusive = spy["inclusive_tubeq"][:8]
        width = max(len(own), len(inclusive))
        rows = []
        for i in range(width):
            a = own[i] if i < len(own) else ("", "")
            b = inclusive[i] if i < len(inclusive) else ("", "")
            rows.append([f"`{a[0]}`" if a[0] else "", f"{a[1]}" if a[0] else "",
                         f"`{b[0]}`" if b[0] else "", f"{b[1]}" if b[0] else ""])
        lines += table(["top own time", "%", "top tubeq functions incl. callees", "%"], rows)
    return lines


# -- targets ----------------------------------------------------------------------------------

Target = tuple[str, str, bool | None, str]


def targets(results: Results, runs: Runs) -> list[Target]:
    """(target, measured, met?, basis) for every target of issues 4, 8 and 9."""
    out: list[Target] = []

    def ratio_target(label: str, key: str, floor: float) -> None:
        ratio = ratio_of(runs.rate(key, "tubeq"), runs.rate(key, "beanstalkd"))
        out.append((f"{label} >= {floor}x", fmt_x(ratio), None if ratio is None else ratio >= floor,
                    key))

    ratio_target("64 x 16 cycles, 100 B", "cycle 64x16 100B", 0.85)
    ratio_target("64 x 16 puts, 100 B", "put 64x16 100B", 0.75)
    ratio_target("64 x 1 cycles, 100 B", "cycle 64x1 100B", 0.45)
    ratio_target("64 x 1 puts, 100 B", "put 64x1 100B", 0.45)

    def latency_target(label: str, key: str, server: str, ceiling: float) -> None:
        p99 = runs.latency(key, server)["p99_ms"]
        out.append((f"{label} p99 <= {ceiling:g} ms", "n/a" if p99 is None else f"{fmt_ms(p99)} ms",
                    None if p99 is None else p99 <= ceiling, f"{key}, {server}"))

    latency_target("delayed-job lateness", "delayed 0-2 s, 1000/s", "tubeq", 2.0)
    latency_target("ms-delayed-job lateness", "delayed-ms 0-2000 ms, 1000/s", "tubeq", 2.0)
    latency_target("wake latency, one process", "wake, 4 blocked consumers", "tubeq", 2.0)
    latency_target("wake latency, across processes", "wake, 4 blocked consumers", "tubeq x2", 5.0)
    for key in dict.fromkeys(r["row"] for r in results["runs"] if r["scenario"] == "events"):
        kept = ratio_of(runs.rate(key, "tubeq"), runs.rate(key, "tubeq events off"))
        out.append((f"{key.removeprefix('events ')} with events on >= {EVENTS_TARGET}x events "
                    "off", fmt_x(kept), None if kept is None else kept >= EVENTS_TARGET,
                    f"{key}, tubeq"))
    for key in dict.fromkeys(r["row"] for r in results["runs"] if r["scenario"] == "metrics"):
        kept = ratio_of(runs.rate(key, "tubeq metrics on"), runs.rate(key, "tubeq metrics off"))
        out.append((f"{key.removeprefix('metrics ')} with metrics on >= {METRICS_TARGET}x "
                    "metrics off", fmt_x(kept), None if kept is None else kept >= METRICS_TARGET,
                    f"{key}, tubeq"))
    tubes = ratio_of(runs.rate("100 tubes", "tubeq"), runs.rate("1 tube", "tubeq"))
    out.append(("100 watched tubes >= 0.8x tubeq's 1-tube throughput", fmt_x(tubes),
                None if tubes is None else tubes >= 0.8, "many-tubes, tubeq"))
    if runs.of(MANY_TUBES_64, "tubeq"):  # issue 13 part 4
        kept = ratio_of(runs.rate(MANY_TUBES_64, "tubeq"), runs.rate(MANY_TUBES_64_BASE, "tubeq"))
        own_b = ratio_of(runs.rate(MANY_TUBES_64, "beanstalkd"),
                       runs.rate(MANY_TUBES_64_BASE, "beanstalkd"))
        out.append((f"64x16 cycles over 100 tubes (a `use` before every put) >= "
                    f"{MANY_TUBES_64_TARGET}x tubeq's plain cycle 64x16 100B (same pass)",
                    f"{fmt_x(kept)} (beanstalkd: {fmt_x(own_b)} of its own)",
                    None if kept is None else kept >= MANY_TUBES_64_TARGET,
                    f"{MANY_TUBES_64}, tubeq"))
    for load, part, label in (("put", "tubeq", "tubeq CPU per put"),
                              ("put", "redis", "Redis CPU per put"),
                              ("cycle", "redis", "Redis CPU per cycle")):
        key = f"events {load} 64x16 100B"
        if not runs.of(key, "tubeq events off"):
            continue
        value = runs.per_job_us(key, "tubeq events off",
                                tubeq_cpu_pct if part == "tubeq" else redis_cpu_pct)
        target = CPU_TARGETS_US[(load, part)]
        out.append((f"{label} <= {target:g} us (64x16, events off; set for Intel Xeon)",
                    "n/a" if value is None else f"{value:.1f} us",
                    None if value is None else value <= target, f"{key}, tubeq events off"))
    section = results.get("backlog") or {}
    sizes = [s for s in section.get("sizes", []) if s]
    if sizes:
        largest = max(sizes)
        kept = ratio_of(runs.rate(f"backlog {largest:,}", "tubeq"), runs.rate("backlog 0", "tubeq"))
        note = "" if largest >= 10_000_000 else f" (measured at {largest:,}, not 10M)"
        out.append((f"throughput with 10M queued >= 0.9x empty{note}", fmt_x(kept),
                    None if kept is None else kept >= 0.9, f"backlog {largest:,}, tubeq"))
    step = [f for f in section.get("fills", []) if f["size"] == min(sizes, default=0)]
    rss_b = next((f["bytes_per_job"].get("rss:beanstalkd") for f in step
                  if f["server"] == "beanstalkd"), None)
    used = next((f["bytes_per_job"].get("redis:used_memory") for f in step
                 if f["server"] == "tubeq"), None)
    mem = ratio_of(used, rss_b)
    out.append(("Redis memory per queued 100 B job <= 1.3x beanstalkd RSS per job",
                f"{'n/a' if mem is None else f'{mem:.3f}x'} ({_bytes(used)} vs {_bytes(rss_b)} B)",
                None if mem is None else mem <= 1.3,
                f"backlog {min(sizes, default=0):,} fill"))
    idle = next((m for m in results.get("idle_connections") or [] if m["server"] == "tubeq"),
                None)
    if idle is not None:  # issue 8's target
        per = idle["bytes_per_connection"]
        out.append((f"tubeq RSS per idle connection (blocked in reserve) <= {IDLE_TARGET_B:,} B",
                    f"{_bytes(per)} B", per <= IDLE_TARGET_B,
                    f"idle connections, {idle['connections']:,}"))
    return out


def _targets(results: Results, runs: Runs) -> list[str]:
    rows = [[label, measured, "n/a" if met is None else "**met**" if met else "**missed**",
             basis] for label, measured, met, basis in targets(results, runs)]
    return ["## Targets of issues 4, 8, 9 and 13 (measured in this run)", "",
            *table(["target", "measured", "", "row"], rows),
            "Why each missed target is missed, and the change its profile points to: section 7.",
            ""]


def _notes_section(results: Results) -> list[str]:
    lines = ["## 7. What the profile points to", ""]
    if PROFILE_NOTES.exists():
        fingerprint = results["meta"].get("tubeq_source_sha256")
        rounds = [line.removeprefix("## ") for line in PROFILE_NOTES.read_text().splitlines()
                  if line.startswith("## ")]
        this_run = next((r for r in rounds if fingerprint and fingerprint in r), None)
        lines += ["Read by hand from the profiles, one section per round, newest first, in "
                  "bench/PROFILE_NOTES.md (not copied here)."]
        if this_run is not None:
            lines += [f"Its section \"{this_run.split(':')[0]}\" was read from the tubeq this "
                      f"run measured (source {fingerprint}).", ""]
        else:
            lines += ["", f"> None of its sections was read from the tubeq this run measured "
                          f"(source {fingerprint}): its figures and pointers may be stale; "
                          "re-read it against the tables above.", ""]
    else:
        lines += ["(bench/PROFILE_NOTES.md is missing: no hand-written reading of the profile.)",
                  ""]
    notes = results.get("notes") or []
    failed = [r for r in results["runs"] if not r["result"]["ok"]]
    if notes or failed:
        lines += ["## Notes and failed runs", ""]
        lines += [f"* {note}" for note in notes]
        lines += [f"* {r['row']}, {r['server']}, repetition {r['rep']}: "
                  f"{r['result']['error_samples'][:2]} (stop: {r['result']['stop_reasons']})"
                  for r in failed]
        lines.append("")
    return lines


# -- batches (issue 10): tubeq's batch rows and consume() deleting in batches; bench/batch_bench.py
# renders this section in RESULTS-batches.md too ----------------------------------------------

def _best_single(runs: Runs, results: dict[str, Any], prefix: str,
          server: str = "beanstalkd") -> tuple[float | None, str]:
    """The best median among ``server``'s single-job rows of ``prefix`` ("put ", "cycle ")."""
    keys = dict.fromkeys(r["row"] for r in results["runs"]
                         if r["server"] == server and r["row"].startswith(prefix)
                         and r["row"].endswith(f" {BATCH_BODY}B") and r["scenario"] == "throughput")
    rates = {key: runs.rate(key, server) for key in keys}
    measured = {k: v for k, v in rates.items() if v}
    if not measured:
        return None, "n/a"
    key = max(measured, key=lambda k: measured[k])
    return measured[key], key


def batches_section(results: dict[str, Any], runs: Runs) -> list[str]:
    """The batches section: each batch row against beanstalkd's best pipelined put / cycle."""
    keys = list(dict.fromkeys(r["row"] for r in results["runs"] if r["scenario"] == "batches"))
    consume = results.get("batches_consume") or []
    if not keys and not consume:
        return []
    best_put, put_key = _best_single(runs, results, "put ")
    best_cycle, cycle_key = _best_single(runs, results, "cycle ")
    own_put, own_put_key = _best_single(runs, results, "put ", "tubeq")
    own_cycle, own_cycle_key = _best_single(runs, results, "cycle ", "tubeq")
    lines = ["## Batches: put-many, reserve-many, delete-many (issue 10)", "",
             "tubeq only (beanstalkd has no batch commands). Rows are `mode connections x "
             "in-flight commands, b<jobs per command>, body` (bench/harness/batch_load.py): "
             "`put-batch` counts a job at its INSERTED (latency: the put-many round trip); "
             "`reserve-batch` fills the tube first, then consumers keep reserve-many in flight "
             "and answer each batch with one delete-many, a job counts at its DELETED (latency: "
             "put -> RESERVED, so it includes the time queued); `cycle-batch` runs put-many "
             "producers and reserve-many consumers together (one reserve-many in flight per "
             "consumer, so no delete-many waits behind a waiting reserve-many). The ratio "
             "divides by beanstalkd's "
             f"best pipelined put ({fmt_rate(best_put)} jobs/s, `{put_key}`) for put rows "
             f"and best pipelined cycle ({fmt_rate(best_cycle)} jobs/s, `{cycle_key}`) for "
             "the others, same run; `/ tubeq single` divides by tubeq's own best single-job "
             f"row (put: {fmt_rate(own_put)} jobs/s, `{own_put_key}`; cycle: "
             f"{fmt_rate(own_cycle)} jobs/s, `{own_cycle_key}`): what batching gains.", ""]
    rows = []
    for key in keys:
        ref = best_put if key.startswith("put") else best_cycle
        own = own_put if key.startswith("put") else own_cycle
        lat = runs.latency(key, "tubeq")
        rows.append([key, runs.rate_cell(key, "tubeq"),
                     f"**{fmt_x(ratio_of(runs.rate(key, 'tubeq'), ref))}**",
                     fmt_x(ratio_of(runs.rate(key, "tubeq"), own)),
                     f"{fmt_ms(lat['p50_ms'])} / {fmt_ms(lat['p99_ms'])}",
                     runs.server_cpu_cell(key, "tubeq"),
                     fmt_rate(runs.us_per_job(key, "tubeq")),
                     runs.generator_cpu(key, "tubeq"),
                     noise_cell(runs, key, ("tubeq",))])
    lines += table(["row", "tubeq jobs/s", "/ beanstalkd best", "/ tubeq single",
                            "latency p50 / p99 ms",
                            "CPU % tubeq / redis", "us/job", "gen CPU %", "other cores"], rows)
    if consume:
        lines += _consume_table(consume, best_cycle, cycle_key)
    return lines


def _consume_table(entries: list[dict[str, Any]], best_cycle: float | None,
                   cycle_key: str) -> list[str]:
    lines = ["consume() with batched deletes: one worker process, `Client.consume(tube, "
             "concurrency=256)`, a handler that only returns, on a pre-filled tube (bench/"
             "consume_bench.py's worker and clock: 90 % of the jobs). The deletes of the jobs "
             "finished in one loop turn leave as one delete-many per connection (tubeq) or as "
             "pipelined deletes (beanstalkd, which has no delete-many). Ratio: against "
             f"beanstalkd's best pipelined cycle ({fmt_rate(best_cycle)} jobs/s, "
             f"`{cycle_key}`).", ""]
    rows = []
    for key in dict.fromkeys(e["row"] for e in entries):
        ok = [e for e in entries if e["row"] == key and e.get("ok")]
        done = [e for e in entries if e["row"] == key]
        rates = [e["jobs_per_s"] for e in ok]
        cell = "n/a" if not rates else fmt_rate(median_of(rates))
        if len(rates) > 1:
            cell += f" ({fmt_rate(min(rates))}-{fmt_rate(max(rates))})"
        if len(ok) < len(done):
            cell += f", {len(done) - len(ok)} of {len(done)} runs failed"
        scripts = median_of((e.get("redis_scripts") or {}).get("calls_per_job")
                                 for e in ok)
        cpu = [(e.get("cpu_pct") or {}) for e in ok]
        server = " / ".join(fmt_pct(median_of(c.get(label) for c in cpu))
                            for label in (("beanstalkd",) if key.startswith("beanstalkd")
                                          else ("tubeq", "redis")))
        worker = fmt_pct(median_of((e.get("worker_cpu_pct") or [None])[0]
                                            for e in ok))
        other = median_of(e.get("other_cores") for e in done)
        ratio = ratio_of(median_of(rates), best_cycle)
        rows.append([key, cell, f"**{fmt_x(ratio)}**",
                     "-" if scripts is None else f"{scripts:.2f}", server, worker,
                     "n/a" if other is None else f"{other:.2f}"])
    return lines + table(["row", "jobs/s", "/ beanstalkd best cycle",
                                  "Redis script calls/job", "CPU % server (tubeq / redis)",
                                  "CPU % worker", "other cores"], rows)


# The figures a RESULTS.md carries in its summary line, for later runs on the same CPU model.
COMPARED_ROWS = ("put 64x16 100B", "cycle 64x16 100B", "put 64x1 100B", "cycle 64x1 100B",
                 "put 1x1 100B", "cycle 1x1 100B")


def cpu_model_of(results: Results) -> str:
    """The run's CPU model; results written before it was recorded: the machine's cpu line."""
    meta = results["meta"]
    return str(meta.get("cpu_model") or meta["machine"]["cpu"].rsplit(", ", 1)[0])


def summary_figures(runs: Runs) -> dict[str, float | None]:
    figures: dict[str, float | None] = {}
    for row in COMPARED_ROWS:
        for server in ("beanstalkd", "tubeq"):
            rate = runs.rate(row, server)
            figures[f"{row} {server} jobs/s"] = None if rate is None else round(rate)
    return figures


def _comparison(results: Results, runs: Runs) -> list[str]:
    if "committed" not in results["meta"]:  # results written before the check existed
        return []
    return machine.comparison("bench/RESULTS.md", cpu_model_of(results), summary_figures(runs),
                              results["meta"]["committed"])


def render(results: Results) -> str:
    """The whole RESULTS.md."""
    runs = Runs(results)
    sections: list[Callable[[], list[str]]] = [
        lambda: _header(results),
        lambda: _comparison(results, runs),
        lambda: _targets(results, runs),
        lambda: _throughput(results, runs),
        lambda: _delayed(runs),
        lambda: _delayed_ms(runs),
        lambda: _wake(runs),
        lambda: _many_tubes(results, runs),
        lambda: _on_off(results, runs, EVENTS_PASS),
        lambda: _on_off(results, runs, METRICS_PASS),
        lambda: _cpu_per_job(results, runs),
        lambda: _workers(results, runs),
        lambda: batches_section(results, runs),
        lambda: _backlog(results, runs),
        lambda: _idle_connections(results),
        lambda: _profiles(results),
        lambda: _notes_section(results),
        lambda: [machine.summary_line(cpu_model_of(results), summary_figures(runs))],
    ]
    return "\n".join(line for section in sections for line in section()).rstrip() + "\n"
