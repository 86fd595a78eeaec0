"""How a run's figures are summarised over repetitions and written as table cells.

Owns: the median (of the values present), the ratio (None when a side is missing), the cell
formats (jobs/s, ms, ratio, % of a core), Markdown tables, and :class:`Runs`: the runs of a
results file of bench.harness.loadgen loads, looked up by (row, server), with the median and
min-max cells, latency quantiles and CPU per job every report builds on.

Rules: a missing or failed figure is "n/a", never filled in; a row whose other tenants used at
least SHARED_BOX_CORES is marked "shared" (its figures are depressed).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# A run whose other tenants used at least this many cores shared the box (the performance
# baseline's threshold, ../shared/research/perf-baseline.md section 1).
SHARED_BOX_CORES = 0.5

Results = dict[str, Any]
Run = dict[str, Any]


# -- medians, ratios and cells ----------------------------------------------------------------

def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values present (None: there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def fmt_rate(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def ratio_of(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is 0."""
    return None if a is None or b is None or b == 0 else a / b


def fmt_x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def fmt_pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], *,
          blank_after: bool = True) -> list[str]:
    """A Markdown table's lines, followed by a blank line unless ``blank_after`` is false."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""] if blank_after else lines


# -- selecting and summarising runs -----------------------------------------------------------

class Runs:
    """The runs of one results file, looked up by (row, server)."""

    def __init__(self, results: Results) -> None:
        self.all: list[Run] = results["runs"]

    def of(self, row: str, server: str) -> list[Run]:
        return [r for r in self.all if r["row"] == row and r["server"] == server]

    def ok(self, row: str, server: str) -> list[dict[str, Any]]:
        return [r["result"] for r in self.of(row, server) if r["result"]["ok"]]

    def rate(self, row: str, server: str) -> float | None:
        return median_of(r["jobs_per_s"] for r in self.ok(row, server))

    def rate_cell(self, row: str, server: str) -> str:
        runs = self.of(row, server)
        ok = self.ok(row, server)
        if not ok:
            return f"n/a ({len(runs)} runs, none ok)" if runs else "n/a"
        rates = [r["jobs_per_s"] for r in ok]
        cell = fmt_rate(statistics.median(rates))
        if len(rates) > 1:
            cell += f" ({fmt_rate(min(rates))}-{fmt_rate(max(rates))})"
        if len(ok) < len(runs):
            cell += f", {len(runs) - len(ok)} of {len(runs)} runs failed"
        return cell

    def latency(self, row: str, server: str, key: str = "latency") -> dict[str, float | None]:
        ok = [r[key] for r in self.ok(row, server) if r.get(key)]
        return {q: median_of(lat.get(q) for lat in ok)
                for q in ("p50_ms", "p90_ms", "p99_ms", "max_ms")}

    def cpu(self, row: str, server: str, label: str) -> float | None:
        return median_of(r["cpu_pct"].get(label) for r in self.ok(row, server))

    def server_cpu_total(self, result: dict[str, Any]) -> float | None:
        values = [v for v in result["cpu_pct"].values() if v is not None]
        return sum(values) if values else None

    def us_per_job(self, row: str, server: str) -> float | None:
        per_run = []
        for r in self.ok(row, server):
            total = self.server_cpu_total(r)
            if total is not None and r["jobs_per_s"] > 0:
                per_run.append(total / 100.0 / r["jobs_per_s"] * 1e6)
        return median_of(per_run)

    def generator_cpu(self, row: str, server: str) -> str:
        ok = self.ok(row, server)
        if not ok:
            return "n/a"
        procs = len(ok[0]["generator_cpu_pct"])
        medians = [median_of(r["generator_cpu_pct"][i] for r in ok
                           if len(r["generator_cpu_pct"]) > i) for i in range(procs)]
        bound = any(r["generator_bound"] for r in ok)
        return "+".join(fmt_pct(m) for m in medians) + (" (bound)" if bound else "")

    def other_cores(self, row: str, server: str) -> float | None:
        return median_of(r["result"]["other_cores"] for r in self.of(row, server))

    def per_job_us(self, row: str, server: str,
                   cpu_pct: Callable[[dict[str, Any]], float | None]) -> float | None:
        """Median over the row's ok runs of ``cpu_pct(result)`` (% of a core) per job, in us."""
        per_run = []
        for r in self.ok(row, server):
            pct = cpu_pct(r)
            if pct is not None and r["jobs_per_s"] > 0:
                per_run.append(pct / 100.0 / r["jobs_per_s"] * 1e6)
        return median_of(per_run)

    def redis_command_us(self, row: str, server: str) -> float | None:
        """Median of Redis's own command time per job in the window (top-level commands)."""
        return median_of(r["extra"]["redis"].get("top_level_usec_per_job")
                       for r in self.ok(row, server)
                       if r.get("extra", {}).get("redis"))

    def server_cpu_cell(self, row: str, server: str) -> str:
        if server == "beanstalkd":
            return fmt_pct(self.cpu(row, server, "beanstalkd"))
        tubeq = [self.cpu(row, server, label) for label in ("tubeq", "tubeq2")]
        parts = "+".join(fmt_pct(v) for v in tubeq if v is not None) or "n/a"
        return f"{parts} / {fmt_pct(self.cpu(row, server, 'redis'))}"


def tubeq_cpu_pct(result: dict[str, Any]) -> float | None:
    """CPU % of every tubeq process of a run (a --workers supervisor and its workers)."""
    values = [v for k, v in result["cpu_pct"].items() if k.startswith("tubeq")]
    return None if not values or None in values else sum(values)


def redis_cpu_pct(result: dict[str, Any]) -> float | None:
    value: float | None = result["cpu_pct"].get("redis")
    return value


def noise_cell(runs: Runs, row: str, servers: Sequence[str]) -> str:
    values = [runs.other_cores(row, s) for s in servers]
    cell = " / ".join("n/a" if v is None else f"{v:.2f}" for v in values)
    if any(v is not None and v >= SHARED_BOX_CORES for v in values):
        cell += " (shared)"
    return cell
