"""report.html: the report's tables as one self-contained page an operator keeps open.

Owns the page: the charts for all tubes together, then the same charts for each tube (small
multiples, the busiest tube first), and the tables. The rows come in as plain dicts (the
written Parquet tables, read back), so the page shows exactly what the tables hold.

Rules:

* One file, no network: the charts are drawn in the browser from the embedded JSON by the small
  script below, which marks ``<body data-rendered="N" data-width="W">`` once its N charts are
  drawn, W being the page's laid-out width (what the browser test reads).
* Every bucket between the first and the last is on a chart's time axis: a minute (or hour)
  without events is a zero in a count series, so a rate drops to zero where nothing happened,
  and a gap in a percentile series (no sample, no figure).
* Axes read at a glance: time ticks at round minutes or hours, labelled (the date where it
  changes), and y ticks at round steps (1, 2 or 5 times a power of ten).
* Series that coincide stay visible: the first is drawn wide and light under the others, the
  next dashed or dotted.
* The per-tube tables fit a 1,500 px window: counts and times are two tables, each with its
  columns grouped under a heading (jobs, time-outs by reason, buries by reason, the ends: jobs
  finished, fails and the results' bytes; one group per measure).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tubeq.pipeline.tables import (
    ALL_TUBES,
    HOUR_MS,
    MEASURES,
    MINUTE_MS,
    PERCENTILES,
    STATES,
)

Row = Mapping[str, Any]

# Beyond this many buckets a chart uses hours instead of minutes (a page stays light).
MAX_CHART_POINTS: Final = 3000
# The rows of a ranking shown in report.html (the Parquet table has them all).
MAX_RANKED_ROWS: Final = 20
# Tubes past this many (the least busy) get no charts of their own; the tables list them all.
MAX_TUBE_CHARTS: Final = 24

THROUGHPUT: Final = ("put", "reserved", "deleted")
WAIT: Final = tuple(f"wait_ms_p{round(fraction * 100)}" for fraction in PERCENTILES)
BACKLOG: Final = (*STATES, "total")

# The per-tube counts table: (group heading, [(column, heading)]).
COUNT_GROUPS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    ("jobs", (("put", "put"), ("promoted", "promoted"), ("reserved", "reserved"),
              ("released", "released"), ("touched", "touched"), ("kicked", "kicked"),
              ("deleted", "deleted"))),
    ("time-outs", (("timed_out", "TTR"), ("disconnected", "disconnect"), ("reaped", "reaped"))),
    ("buries", (("buried", "all"), ("buried_deliberate", "deliberate"),
                ("buried_max_tries", "max-tries"), ("buried_expired", "expired"))),
    ("ends", (("finished", "finished"), ("failed", "failed"), ("result_bytes", "result bytes"))),
)
_MEASURE_HEADINGS: Final = {"wait_ms": "queue wait, ms", "processing_ms": "processing, ms",
                            "lateness_ms": "delay lateness, ms"}
TIME_GROUPS: Final = tuple(
    (_MEASURE_HEADINGS[measure],
     (*((f"{measure}_p{round(fraction * 100)}", f"p{round(fraction * 100)}")
        for fraction in PERCENTILES), (f"{measure}_n", "samples")))
    for measure in MEASURES)


def render_html(tables: Mapping[str, Sequence[Row]]) -> str:
    """The self-contained page from the tables' rows (as dicts); no external resource."""
    grain_ms, grain, metrics = MINUTE_MS, "minute", tables["by_minute"]
    if _span(metrics, MINUTE_MS) > MAX_CHART_POINTS:
        grain_ms, grain, metrics = HOUR_MS, "hour", tables["by_hour"]
    axis = _axis(metrics, grain_ms)
    backlog_axis = _axis(tables["backlog"], MINUTE_MS)
    if len(backlog_axis) > MAX_CHART_POINTS:  # the state at the end of every n-th minute
        step = math.ceil(len(backlog_axis) / MAX_CHART_POINTS)
        backlog_axis = backlog_axis[step - 1::step]
    by_bucket = _by_tube_and_bucket(metrics)
    backlog = _by_tube_and_bucket(tables["backlog"])
    by_tube = {str(row["tube"]): row for row in tables["by_tube"]}
    tubes = sorted((tube for tube in by_tube if tube != ALL_TUBES),
                   key=lambda tube: (-_busyness(by_tube[tube]), tube))
    charted = tubes[:MAX_TUBE_CHARTS]

    charts: list[dict[str, Any]] = []

    def chart(chart_id: str, x: list[int], rows: Mapping[int, Row], columns: Sequence[str],
              *, filled: bool, small: bool = False) -> str:
        charts.append({"id": chart_id, "x": x, "grain": grain_ms, "small": small,
                       "series": [{"name": column, "values": [
                           _value(rows.get(bucket), column, filled) for bucket in x]}
                           for column in columns]})
        kind = "chart small" if small else "chart"
        return f'<svg class="{kind}" id="{chart_id}" role="img"></svg>'

    total = by_tube.get(ALL_TUBES, {})
    span = ""
    if axis:
        span = f"{_utc(axis[0])} to {_utc(axis[-1] + grain_ms)} UTC, "
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>tubeq report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>tubeq report</h1>",
        f'<p class="note">{html.escape(span)}{_fmt(total.get("put", 0))} jobs put, '
        f'{_fmt(total.get("deleted", 0))} deleted, {len(tubes)} tubes. '
        "Times in milliseconds; percentiles are exact. Tube * is all tubes together.</p>",
        "<h2>All tubes</h2>",
        '<div class="row">',
        f"<figure><figcaption>Jobs per {grain}</figcaption>",
        chart("chart-throughput", axis, by_bucket.get(ALL_TUBES, {}), THROUGHPUT, filled=True),
        "</figure>",
        f"<figure><figcaption>Queue wait per {grain}, ms (ready to reserved)</figcaption>",
        chart("chart-wait", axis, by_bucket.get(ALL_TUBES, {}), WAIT, filled=False),
        "</figure>",
        "<figure><figcaption>Backlog at the end of each minute</figcaption>",
        chart("chart-backlog", backlog_axis, backlog.get(ALL_TUBES, {}), BACKLOG, filled=True),
        "</figure></div>",
        f"<h2>Per tube, the busiest first (jobs, queue wait and backlog per {grain})</h2>",
    ]
    if len(tubes) > len(charted):
        parts.append(f'<p class="note">The {len(charted)} busiest of {len(tubes)} tubes; the '
                     "tables below list every tube.</p>")
    for index, tube in enumerate(charted):
        parts += [
            f'<h3 class="tube">{html.escape(tube)}</h3><div class="row">',
            chart(f"chart-tube-{index}-throughput", axis, by_bucket.get(tube, {}), THROUGHPUT,
                  filled=True, small=True),
            chart(f"chart-tube-{index}-wait", axis, by_bucket.get(tube, {}), WAIT,
                  filled=False, small=True),
            chart(f"chart-tube-{index}-backlog", backlog_axis, backlog.get(tube, {}), BACKLOG,
                  filled=True, small=True),
            "</div>",
        ]
    ordered = [by_tube[tube] for tube in ([ALL_TUBES] if total else []) + tubes]
    tries = sorted((row for row in tables["tries"] if row["tube"] == ALL_TUBES),
                   key=lambda row: int(row["tries"]))
    failing_tubes = sorted(tables["failing_tubes"], key=lambda row: int(row["rank"]))
    failing_hours = sorted(tables["failing_hours"], key=lambda row: int(row["rank"]))
    payload = json.dumps({"charts": charts}).replace("</", "<\\/")
    parts += [
        "<h2>Per tube: jobs</h2>",
        _grouped_table(ordered, COUNT_GROUPS, "table-counts"),
        '<p class="note">time-outs: TTR is a TTR running out (the server\'s job-timeouts); '
        "disconnect and reaped are jobs given back because their connection closed or their "
        "process died, not failures. buries: all of them, then by who buried the job (a "
        "client, deliberately; a job policy, at max-tries or at its expiry). ends: jobs "
        "finished (also counted in deleted) and their results' bytes; failed counts every fail, "
        "and the job's move after it (released, buried) is counted there too.</p>",
        "<h2>Per tube: times</h2>",
        _grouped_table(ordered, TIME_GROUPS, "table-times"),
        "<h2>Tubes that fail most (TTR time-outs + fails + buries)</h2>",
        _table(failing_tubes[:MAX_RANKED_ROWS], ["rank", "tube", "timed_out", "failed",
                                                 "buried", "failures"], "table-failing-tubes"),
        "<h2>Hours that fail most</h2>",
        _table(failing_hours[:MAX_RANKED_ROWS], ["rank", "tube", "bucket_ms", "timed_out",
                                                 "failed", "buried", "failures"],
               "table-failing-hours"),
        "<h2>Tries per job (all tubes)</h2>",
        _table(tries, ["tries", "jobs"], "table-tries"),
        f'<script type="application/json" id="report-data">{payload}</script>',
        f"<script>{_CHART_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _span(rows: Sequence[Row], grain_ms: int) -> int:
    """How many buckets of ``grain_ms`` the rows' first to last bucket covers."""
    buckets = [int(row["bucket_ms"]) for row in rows]
    return (max(buckets) - min(buckets)) // grain_ms + 1 if buckets else 0


def _axis(rows: Sequence[Row], grain_ms: int) -> list[int]:
    """Every bucket from the rows' first to their last (whatever tube), in order."""
    buckets = [int(row["bucket_ms"]) for row in rows]
    if not buckets:
        return []
    return list(range(min(buckets), max(buckets) + 1, grain_ms))


def _by_tube_and_bucket(rows: Sequence[Row]) -> dict[str, dict[int, Row]]:
    out: dict[str, dict[int, Row]] = {}
    for row in rows:
        out.setdefault(str(row["tube"]), {})[int(row["bucket_ms"])] = row
    return out


def _value(row: Row | None, column: str, filled: bool) -> float | None:
    """A chart point: the row's figure; with none, 0 for a count (``filled``), else a gap."""
    value = None if row is None else row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0 if filled else None
    return float(value) if isinstance(value, float) else int(value)


def _busyness(row: Row) -> int:
    return sum(int(row.get(column) or 0) for column in THROUGHPUT)


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.1f}"
    return str(value)


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def _cell(column: str, value: Any) -> str:
    text = _utc(value) if column == "bucket_ms" and value is not None else _fmt(value)
    return f"<td>{html.escape(text)}</td>"


def _table(rows: Sequence[Row], columns: Sequence[str], table_id: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(c, row.get(c)) for c in columns) + "</tr>"
                   for row in rows)
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _grouped_table(rows: Sequence[Row],
                   groups: Sequence[tuple[str, Sequence[tuple[str, str]]]],
                   table_id: str) -> str:
    """A table with a tube column, then each group's columns under the group's heading."""
    top = '<th rowspan="2">tube</th>' + "".join(
        f'<th colspan="{len(columns)}" class="group">{html.escape(heading)}</th>'
        for heading, columns in groups)
    second = "".join(f'<th data-column="{column}">{html.escape(heading)}</th>'
                     for _, columns in groups for column, heading in columns)
    body = "".join(
        "<tr>" + _cell("tube", row.get("tube"))
        + "".join(_cell(column, row.get(column)) for _, columns in groups for column, _ in columns)
        + "</tr>" for row in rows)
    return (f'<table id="{table_id}"><thead><tr>{top}</tr><tr>{second}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


_STYLE: Final = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1440px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
h3.tube { font-size: 1em; margin: 1em 0 0.2em; font-family: monospace; }
.row { display: flex; flex-wrap: wrap; gap: 10px; }
figure { margin: 0; } figcaption { font-size: 0.85em; color: #444; }
svg.chart { width: 460px; height: auto; border: 1px solid #ddd; }
svg.chart.small { width: 360px; }
table { border-collapse: collapse; font-size: 0.8em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 5px; text-align: right; }
th { background: #f3f3f3; font-weight: normal; } th.group { font-weight: bold; text-align: center; }
td:first-child, th:first-child { text-align: left; }
.note { color: #666; font-size: 0.85em; max-width: 1100px; }
"""

_CHART_SCRIPT: Final = r"""
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  // The first series wide and light, under the rest; the others thin, dashed or dotted.
  const STYLES = [
    {color: "#9ecae1", width: 4.5, dash: ""},
    {color: "#d62728", width: 1.5, dash: "6 3"},
    {color: "#2ca02c", width: 1.2, dash: ""},
    {color: "#ff7f0e", width: 1.2, dash: "2 2"},
    {color: "#444444", width: 1.2, dash: "8 2 2 2"},
  ];
  const MINUTE = 60000, HOUR = 3600000, DAY = 86400000;
  const TIME_STEPS = [MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
                      HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY];
  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const key in attrs) node.setAttribute(key, attrs[key]);
    if (parent) parent.appendChild(node);
    return node;
  }
  // A round step (1, 2 or 5 times a power of ten) that cuts span into at most count parts.
  function niceStep(span, count) {
    const raw = span / count;
    const magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * magnitude >= raw) return m * magnitude;
    return 10 * magnitude;
  }
  function number(v, step) {
    const digits = step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step)));
    return v.toLocaleString("en-US", {minimumFractionDigits: digits,
                                      maximumFractionDigits: digits});
  }
  function iso(ms) { return new Date(ms).toISOString(); }
  function draw(svg, chart) {
    const small = chart.small;
    const W = small ? 360 : 460, H = small ? 170 : 230, L = 52, R = 10, T = 8;
    const B = small ? 44 : 48;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const xs = chart.x;
    let top = 0;
    chart.series.forEach(s => s.values.forEach(v => { if (v !== null && v > top) top = v; }));
    const yStep = niceStep(top > 0 ? top : 1, small ? 3 : 4);
    const yTop = Math.max(yStep, Math.ceil(top / yStep) * yStep);
    const x0 = xs.length ? xs[0] : 0;
    const x1 = Math.max(xs.length ? xs[xs.length - 1] : x0, x0 + chart.grain);
    const px = v => L + (W - L - R) * (v - x0) / (x1 - x0);
    const py = v => H - B - (H - T - B) * v / yTop;
    for (let v = 0; v <= yTop + yStep / 2; v += yStep) {
      el("line", {x1: L, y1: py(v), x2: W - R, y2: py(v), stroke: "#eee"}, svg);
      el("text", {x: L - 4, y: py(v) + 3, "text-anchor": "end", "font-size": 9,
                  class: "tick-y"}, svg).textContent = number(v, yStep);
    }
    const maxTicks = small ? 4 : 6;
    const tStep = TIME_STEPS.find(s => (x1 - x0) / s <= maxTicks) || 30 * DAY;
    let lastDay = "";
    for (let t = Math.ceil(x0 / tStep) * tStep; t <= x1; t += tStep) {
      const text = iso(t), day = text.slice(5, 10), clock = text.slice(11, 16);
      el("line", {x1: px(t), y1: H - B, x2: px(t), y2: H - B + 3, stroke: "#444"}, svg);
      const label = el("text", {x: px(t), y: H - B + 13, "text-anchor": "middle",
                                "font-size": 9, class: "tick-x"}, svg);
      label.textContent = tStep >= DAY ? day : clock;
      if (tStep < DAY && day !== lastDay) {
        el("text", {x: px(t), y: H - B + 23, "text-anchor": "middle", "font-size": 9,
                    class: "tick-date"}, svg).textContent = day;
      }
      lastDay = day;
    }
    el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#444", class: "axis"}, svg);
    el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#444", class: "axis"}, svg);
    chart.series.forEach((s, i) => {
      const style = STYLES[i % STYLES.length];
      let d = "", pen = false;
      s.values.forEach((v, j) => {
        if (v === null) { pen = false; return; }
        d += (pen ? "L" : "M") + px(xs[j]).toFixed(1) + "," + py(v).toFixed(1);
        pen = true;
      });
      el("path", {d: d, fill: "none", stroke: style.color, "stroke-width": style.width,
                  "stroke-dasharray": style.dash, "stroke-linejoin": "round",
                  class: "series", "data-name": s.name}, svg);
      const lx = L + i * (small ? 62 : 82), ly = H - 8;
      el("line", {x1: lx, y1: ly - 3, x2: lx + 16, y2: ly - 3, stroke: style.color,
                  "stroke-width": Math.min(style.width, 3), "stroke-dasharray": style.dash},
         svg);
      el("text", {x: lx + 19, y: ly, "font-size": 9}, svg).textContent = s.name;
    });
    svg.setAttribute("data-points", String(xs.length));
  }
  let drawn = 0;
  data.charts.forEach(chart => {
    const svg = document.getElementById(chart.id);
    if (svg) { draw(svg, chart); drawn++; }
  });
  document.body.setAttribute("data-rendered", String(drawn));
  // How wide the page is laid out (px): a browser test holds it to the window's width.
  document.body.setAttribute("data-width", String(document.documentElement.scrollWidth));
})();
"""
