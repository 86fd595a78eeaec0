"""The report of bench.peers.call: calls per second, latency quantiles, CPU per call, targets.

Owns: how a call run's figures are derived (a phase's rate = calls answered / its wall time;
latency quantiles over every call of every repetition, nearest rank; CPU per call of the
servers, the worker and the callers over the phase), summarised (rates: median over
repetitions, with min-max) and judged (issue 32's targets: tubeq at least 2x the calls per
second of the fastest Redis-backed peer and a lower p99 than any of them; and within 2x of
beanstalkd's reply-tube pattern), and the Markdown it renders. A failed system stays in every
table, marked FAILED, with its error below.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.harness.summary import SHARED_BOX_CORES, fmt_ms, fmt_rate, fmt_x, ratio_of, table

PHASES = ("single", "parallel")
TARGET_PEERS = 2.0  # tubeq / fastest Redis-backed peer, calls per second
TARGET_BEANSTALKD = 0.5  # tubeq / beanstalkd's reply tubes, calls per second ("within 2x")

Run = dict[str, Any]


# -- one run's figures --------------------------------------------------------------------------

def _phase(run: Run, phase: str) -> dict[str, Any] | None:
    if run.get("error"):
        return None
    p = run.get(phase)
    return p if p and p.get("calls") else None


def rate(run: Run, phase: str) -> float | None:
    p = _phase(run, phase)
    return None if p is None or p["seconds"] <= 0 else float(p["calls"] / p["seconds"])


def cpu_us(run: Run, phase: str, side: str) -> float | None:
    """CPU per call in us of ``side``: "server" (every server process), "worker", "caller"."""
    p = _phase(run, phase)
    if p is None:
        return None
    if side == "caller":
        return float(p["cpu_s"] / p["calls"] * 1e6)
    cpu = (run.get("cpu") or {}).get(phase) or {}
    labels = ["worker"] if side == "worker" else [k for k in cpu if k not in ("worker",
                                                                              "machine")]
    values = [cpu.get(k) for k in labels]
    if not values or any(v is None for v in values):
        return None
    return float(sum(v for v in values if v is not None) / p["calls"] * 1e6)


def other_cores(run: Run, phase: str) -> float | None:
    """Cores used by everything but this system's processes during the phase."""
    p = _phase(run, phase)
    cpu = (run.get("cpu") or {}).get(phase) or {}
    if p is None or cpu.get("machine") is None or p["seconds"] <= 0:
        return None
    ours = sum(v or 0.0 for k, v in cpu.items() if k != "machine") + p["cpu_s"]
    return max(0.0, float((cpu["machine"] - ours) / p["seconds"]))


def quantile_ms(latencies_us: list[int], q: float) -> float | None:
    """The ``q`` quantile (nearest rank) of latencies in us, in ms."""
    if not latencies_us:
        return None
    ordered = sorted(latencies_us)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1000.0


def run_line(run: Run) -> str:
    """One line for the console."""
    if run.get("error"):
        return f"FAILED: {str(run['error'])[:300]}"
    parts = []
    for phase in PHASES:
        p = run.get(phase) or {}
        lat = p.get("latencies_us") or []
        parts.append(f"{phase} {fmt_rate(rate(run, phase))} calls/s (n {p.get('calls', 0)}, "
                     f"{p.get('stopped_by', '?')}) p50 {fmt_ms(quantile_ms(lat, 0.5))} "
                     f"p99 {fmt_ms(quantile_ms(lat, 0.99))} ms"
                     + (f", {p['errors']} errors" if p.get("errors") else ""))
    return "; ".join(parts)


# -- over repetitions ---------------------------------------------------------------------------

class CallRuns:
    """The runs of a results file by system."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.names = [s["name"] for s in results["systems"]]
        self.by_system: dict[str, list[Run]] = {n: [] for n in self.names}
        for run in results["runs"]:
            self.by_system.setdefault(run["system"], []).append(run)

    def ok(self, name: str) -> list[Run]:
        return [r for r in self.by_system.get(name, []) if not r.get("error")]

    def failed(self, name: str) -> bool:
        return bool(self.by_system.get(name)) and not self.ok(name)

    def rate(self, name: str, phase: str) -> float | None:
        values = [v for v in (rate(r, phase) for r in self.ok(name)) if v is not None]
        return statistics.median(values) if values else None

    def rate_cell(self, name: str, phase: str) -> str:
        values = [v for v in (rate(r, phase) for r in self.ok(name)) if v is not None]
        if not values:
            return "**FAILED**" if self.failed(name) else "n/a"
        text = fmt_rate(statistics.median(values))
        if len(values) > 1:
            text += f" ({fmt_rate(min(values))}-{fmt_rate(max(values))})"
        return text

    def latencies(self, name: str, phase: str) -> list[int]:
        return [v for r in self.ok(name) for v in (_phase(r, phase) or {}).get(
            "latencies_us", [])]

    def quantile(self, name: str, phase: str, q: float) -> float | None:
        return quantile_ms(self.latencies(name, phase), q)

    def count(self, name: str, phase: str, key: str) -> int:
        return sum(int((r.get(phase) or {}).get(key) or 0) for r in self.ok(name))

    def median(self, name: str, figure: Any) -> float | None:
        values = [v for v in (figure(r) for r in self.ok(name)) if v is not None]
        return statistics.median(values) if values else None


# -- targets ------------------------------------------------------------------------------------

def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else "**met**" if ok else "**missed**"


def targets(results: dict[str, Any]) -> list[list[str]]:
    s = CallRuns(results)
    servers = {sy["name"]: sy["server"] for sy in results["systems"]}
    peers = [n for n in s.names if servers[n] == "redis"]
    rows = []
    for phase, label in (("single", "1 caller"), ("parallel", f"{_callers(results)} callers")):
        tubeq = s.rate("tubeq", phase)
        fastest = max(((s.rate(n, phase), n) for n in peers if s.rate(n, phase) is not None),
                      default=None)
        ratio = ratio_of(tubeq, fastest[0]) if fastest else None
        rows.append([f"{label}: calls/s >= {TARGET_PEERS:g}x the fastest Redis-backed peer",
                     fmt_rate(tubeq),
                     f"{fastest[1]} {fmt_rate(fastest[0])}" if fastest else "none",
                     fmt_x(ratio), _met(None if ratio is None else ratio >= TARGET_PEERS)])
        tubeq_p99 = s.quantile("tubeq", phase, 0.99)
        lowest = min(((s.quantile(n, phase, 0.99), n) for n in peers
                      if s.quantile(n, phase, 0.99) is not None), default=None)
        p99_ratio = ratio_of(tubeq_p99, lowest[0]) if lowest else None
        rows.append([f"{label}: p99 below every Redis-backed peer's", f"{fmt_ms(tubeq_p99)} ms",
                     f"{lowest[1]} {fmt_ms(lowest[0])} ms" if lowest else "none",
                     fmt_x(p99_ratio), _met(None if p99_ratio is None else p99_ratio < 1.0)])
        beanstalkd = s.rate("beanstalkd", phase)
        b_ratio = ratio_of(tubeq, beanstalkd)
        rows.append([f"{label}: calls/s within 2x of beanstalkd's reply tubes",
                     fmt_rate(tubeq), f"beanstalkd {fmt_rate(beanstalkd)}", fmt_x(b_ratio),
                     _met(None if b_ratio is None else b_ratio >= TARGET_BEANSTALKD)])
    return rows


def _callers(results: dict[str, Any]) -> int:
    return int(results["meta"].get("callers", 32))


# -- the report ---------------------------------------------------------------------------------

def _hop_line(meta: dict[str, Any]) -> str:
    """What one hop cost before the run (bench.harness.hops), where it was measured."""
    hop = meta.get("hop_rtt_us")
    if not hop:
        return ""
    return (f" One hop here: a python <-> python round trip over loopback took "
            f"**{hop['free']} us** with the two processes free to run on either CPU, "
            f"{hop['one_cpu']} us with both on one CPU (`python -m bench.probes.hop_cost`); "
            f"one caller's call crosses eight hops with tubeq, about four with BullMQ or "
            f"beanstalkd's reply tubes.")


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    scale = meta["scale"]
    s = CallRuns(results)
    callers = _callers(results)
    minutes, seconds = divmod(int(meta.get("elapsed_s", 0)), 60)
    machine_ = meta["machine"]
    command = "python -m bench.peers.call" + ("" if scale["name"] == "full" else " --quick")
    if meta.get("tubeq_version"):
        command += " --revision ..."
    lines = [
        "## Request/reply: calls per second and latency of a call",
        "",
        f"`{command}` (bench/peers/call.py), {meta['started']} (UTC), {minutes} min "
        f"{seconds} s. Scale **{scale['name']}**: {scale['repetitions']} interleaved "
        f"repetition(s), each: {scale['warmup']} warm-up calls, then **1 caller** "
        f"({scale['single']:,} calls, each awaited before the next), then **{callers} callers** "
        f"at once ({scale['parallel']:,} calls), each phase bounded at "
        f"{scale['phase_limit_s']:g} s; one worker process, concurrency "
        f"{meta['concurrency']}, answering each request upper-cased.",
        "",
        f"**CPU model: `{meta['cpu_model']}`** ({machine_.get('cpu', '')}); "
        f"{machine_.get('os', '')}; Python {machine_.get('python', '')}; every Redis "
        f"`{machine_.get('redis-server', '').split(' sha=')[0]}`, private, without persistence. "
        f"Load when the run started: `{meta.get('uptime_before', 'unknown')}`; when it ended: "
        f"`{meta.get('uptime_after', 'unknown')}`.{_hop_line(meta)}",
        "",
        "### Targets (issue 32), in this run",
        "",
        "Rates are medians over repetitions; p99 over every call of the phase.",
        "",
    ]
    lines += table(["target", "tubeq", "against", "ratio", ""], targets(results))
    lines += ["### Calls", "",
              "**calls/s** = calls answered / the phase's wall time, median over repetitions "
              "(min-max). **p50, p99** = latency of one call (request sent to answer in hand, "
              "with what the caller does before its next call), over every call of every "
              "repetition; **n** = calls measured (fewer than asked where the phase's time "
              "bound cut it). A call that failed or timed out is counted in **errors** and not "
              "in the latencies.", ""]
    rows = []
    for name in s.names:
        row = [f"**{name}**"]
        for phase in PHASES:
            row += [s.rate_cell(name, phase),
                    fmt_ms(s.quantile(name, phase, 0.5)), fmt_ms(s.quantile(name, phase, 0.99)),
                    f"{s.count(name, phase, 'calls'):,}"]
        errors = sum(s.count(name, ph, "errors") + s.count(name, ph, "wrong") for ph in PHASES)
        row.append(str(errors))
        rows.append(row)
    lines += table(["system", "1 caller: calls/s", "p50 ms", "p99 ms", "n",
                    f"{callers} callers: calls/s", "p50 ms", "p99 ms", "n", "errors"], rows)
    lines += [f"### CPU per call ({callers} callers)", "",
              "From /proc over the phase: **server** = redis-server; tubeq + its redis-server; "
              "beanstalkd. **worker** = the worker process, **caller** = the caller process. "
              "**other** = cores used by everything else on the machine meanwhile (other "
              f"tenants; >= {SHARED_BOX_CORES} marks a shared run).", ""]
    cpu_rows = []
    for name in s.names:
        cells = [s.median(name, lambda r, side=side: cpu_us(r, "parallel", side))
                 for side in ("server", "worker", "caller")]
        total = None if any(c is None for c in cells) else sum(c for c in cells if c)
        other = s.median(name, lambda r: other_cores(r, "parallel"))
        other_single = s.median(name, lambda r: other_cores(r, "single"))
        cpu_rows.append([name, *(fmt_rate(c) for c in cells), fmt_rate(total),
                         "n/a" if other_single is None else f"{other_single:.2f}",
                         "n/a" if other is None else f"{other:.2f}"])
    lines += table(["system", "server us/call", "worker us/call", "caller us/call",
                    "total us/call", "other cores: 1 caller", f"{callers} callers"], cpu_rows)
    lines += ["### How each system was called", ""]
    how_rows = []
    for sy in results["systems"]:
        setup = results["setup"].get(sy["name"], {})
        versions = setup.get("versions") or {}
        how_rows.append([sy["name"], sy["how"], sy["worker"],
                         ", ".join(f"{k} {v}" for k, v in versions.items())
                         or setup.get("error", "n/a")])
    lines += table(["system", "call", "worker", "versions"], how_rows)
    failures = [r for r in results["runs"] if r.get("error")]
    partial = [(r, ph) for r in results["runs"] if not r.get("error") for ph in PHASES
               if (r.get(ph) or {}).get("first_error")]
    if failures or partial:
        lines += ["### Failures and errors", ""]
        lines += [f"* **{r['system']}**, repetition {r['rep']}: FAILED: {str(r['error'])[:600]}"
                  for r in failures]
        lines += [f"* **{r['system']}**, repetition {r['rep']}, {ph}: "
                  f"{r[ph]['errors']} errors, {r[ph]['wrong']} wrong answers; first: "
                  f"{r[ph]['first_error']}" for r, ph in partial]
        lines.append("")
    return "\n".join(lines)
