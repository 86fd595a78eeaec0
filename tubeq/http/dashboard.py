"""The web dashboard: server-rendered pages that a little JavaScript keeps live.

``/`` lists the tubes with their counts (jobs finished and failures reported among them) and
live rates (put/s and delete/s from the tubes' counters, the mean ready->reserved wait of this
process's reservations) and the servers of the namespace; ``/tubes/<tube>`` shows a tube's jobs
by state with peek, kick and delete buttons, and pause, resume and kick for the tube;
``/jobs/<id>`` one job: its stats, failures and last error, body, latest progress, and once it
ended how, with its result. Every action is a call of the JSON API (tubeq.http.api)
from ``static/dashboard.js``, so the dashboard can do nothing the API cannot. No CDN, no build
step: the page, its script and its stylesheet are package data served from here, and it works
offline. Everything from Redis (tube names, job bodies) is escaped.
"""

from __future__ import annotations

import html
import time
from importlib import resources
from typing import Final
from urllib.parse import quote

from aiohttp import web

from tubeq import __version__
from tubeq.http.api import STATES, job_document, tube_ends
from tubeq.http.common import HttpError, job_id, namespace_of, server_of, tube_name
from tubeq.model.admin import TubeGroups
from tubeq.server import ops

STATIC: Final = {
    "dashboard.js": "application/javascript",
    "dashboard.css": "text/css",
}
# Rows a tube page shows per state.
JOBS_PER_STATE: Final = 20


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/tubes/{tube}", tube_page)
    app.router.add_get("/jobs/{id}", job_page)
    app.router.add_get("/static/{name}", static)


def tube_path(tube: str) -> str:
    """The path of a tube's page: the name percent-encoded whole (a tube may hold '/', '+',
    ';' ...), as the script's encodeURIComponent does; the route decodes it back."""
    return "/tubes/" + quote(tube, safe="")


def job_path(jid: int) -> str:
    return f"/jobs/{jid}"


def _page(title: str, body: str, *, data: str = "") -> web.Response:
    text = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="/static/dashboard.css">
</head>
<body {data}>
{body}
<script src="/static/dashboard.js"></script>
</body>
</html>
"""
    return web.Response(text=text, content_type="text/html")


def _header(request: web.Request) -> str:
    server = server_of(request)
    ctx = namespace_of(request)
    uptime = int(time.monotonic() - ctx.identity.started)
    draining = ' <span class="badge warn">draining</span>' if ctx.draining else ""
    return (f'<header><h1><a href="/">tubeq</a></h1><p class="meta">{html.escape(__version__)}'
            f' &middot; namespace <code>{html.escape(ctx.store.keys.prefix)}</code> &middot; '
            f'server <code>{html.escape(server.instance_id)}</code> &middot; up {uptime} s'
            f'{draining}</p></header>')


async def index(request: web.Request) -> web.Response:
    server = server_of(request)
    ctx = namespace_of(request)
    count, rows = await ops.tube_overview(ctx, server.config.metrics_max_tubes)
    ends = await tube_ends(ctx, [row.name for row in rows])
    now = ctx.store.clock()
    body_rows = []
    for row in rows:
        name = row.name
        link = (f'<a href="{html.escape(tube_path(name), quote=True)}">{html.escape(name)}</a>'
                if name else "<em>other tubes</em>")
        paused = "yes" if row.pause_until_ms > now else ""
        finished, failed = ends.get(name, ("&ndash;", "&ndash;"))
        body_rows.append(
            f'<tr data-tube="{html.escape(name, quote=True)}"><td>{link}</td>'
            f'<td class="ready">{row.ready}</td><td class="urgent">{row.urgent}</td>'
            f'<td class="reserved">{row.reserved}</td><td class="delayed">{row.delayed}</td>'
            f'<td class="buried">{row.buried}</td><td class="finished">{finished}</td>'
            f'<td class="failed">{failed}</td><td class="puts">&ndash;</td>'
            f'<td class="deletes">&ndash;</td><td class="wait">&ndash;</td>'
            f'<td class="waiting">{row.waiting if name else "&ndash;"}</td>'
            f'<td class="paused">{paused}</td></tr>')
    servers = await ctx.store.instances()
    server_rows = [
        f'<tr><td><code>{html.escape(i.id)}</code>'
        f'{" (this one)" if i.id == server.instance_id else ""}</td>'
        f'<td>{html.escape(i.addr)}</td><td>{html.escape(i.http)}</td>'
        f'<td>{max(0, now - i.heartbeat_ms)} ms</td><td>{i.connections}</td>'
        f'<td>{i.workers}</td><td>{i.waiting}</td></tr>' for i in servers]
    body = f"""{_header(request)}
<main>
<section>
<h2>Tubes <span class="count" id="tube-count">{count}</span></h2>
<table id="tubes">
<thead><tr><th>tube</th><th>ready</th><th>urgent</th><th>reserved</th><th>delayed</th>
<th>buried</th><th>finished</th><th>failed</th><th>put/s</th><th>delete/s</th><th>wait</th>
<th>waiting</th><th>paused</th></tr>
</thead>
<tbody>{"".join(body_rows)}</tbody>
</table>
<p class="note">Finished counts the jobs finished with a result, failed the failures workers
reported (a job may fail several times). Rates are measured between refreshes (every second);
wait is the mean time from ready to reserved of the jobs this server's clients reserved
meanwhile.</p>
<form id="find-job">
<label>job id <input id="find-job-id" type="number" min="1" required></label>
<button type="submit" id="find-job-show">Show</button>
</form>
</section>
<section>
<h2>Servers of the namespace</h2>
<table id="servers">
<thead><tr><th>server</th><th>protocol</th><th>http</th><th>last heartbeat</th>
<th>connections</th><th>workers</th><th>waiting</th></tr></thead>
<tbody>{"".join(server_rows)}</tbody>
</table>
</section>
</main>"""
    return _page("tubeq", body, data='data-page="index"')


async def tube_page(request: web.Request) -> web.Response:
    ctx = namespace_of(request)
    assert ctx is not None
    try:
        tube = tube_name(request.match_info["tube"])
    except HttpError as exc:
        return _not_found(request, exc.message, status=400)
    counts = await ctx.store.tube_counts(tube)
    if counts is None:
        return _not_found(request, f"No tube named {tube!r}.")
    name = html.escape(tube)
    sections = []
    for state in STATES:
        jobs = await ctx.store.browse(tube, state, JOBS_PER_STATE)
        rows = "".join(_job_row(state, j.id, j.pri, j.reserves, j.body_head) for j in jobs)
        sections.append(
            f'<section class="state" data-state="{state}"><h3>{state} '
            f'<span class="count" id="count-{state}"></span></h3>'
            f'<table class="jobs" id="jobs-{state}"><thead><tr><th>id</th><th>pri</th>'
            f'<th>reserves</th><th>body</th><th></th></tr></thead><tbody>{rows}</tbody>'
            f'</table></section>')
    body = f"""{_header(request)}
<main>
<h2>Tube <code id="tube-name">{name}</code>
<span id="paused" class="badge warn" hidden>paused</span></h2>
<form id="tube-actions" onsubmit="return false">
<label>pause for <input id="pause-delay" type="number" min="0" value="60"> s</label>
<button type="button" id="pause">Pause</button>
<button type="button" id="resume">Resume</button>
<label>kick up to <input id="kick-bound" type="number" min="1" value="10"> jobs</label>
<button type="button" id="kick-tube">Kick</button>
<span id="status" role="status"></span>
</form>
{"".join(sections)}
{_groups_section(await ctx.store.tube_groups(tube))}
<section><h3>Peeked job</h3><pre id="peek">Press peek on a job to see its body.</pre></section>
</main>"""
    return _page(f"tubeq: {tube}", body,
                 data=f'data-page="tube" data-tube="{html.escape(tube, quote=True)}"')


def _groups_section(groups: TubeGroups) -> str:
    """The tube's groups (put-with group=): how many have ready jobs, the busiest first."""
    rows = "".join(f"<tr><td>{html.escape(g.group)}</td><td>{g.ready}</td><td>{g.reserved}</td>"
                   f"</tr>" for g in groups.busiest)
    return (f'<section id="groups"><h3>groups <span class="count" id="count-groups">'
            f'{groups.count}</span></h3><table class="jobs" id="groups-busiest"><thead><tr>'
            f'<th>group</th><th>ready</th><th>reserved</th></tr></thead><tbody>{rows}</tbody>'
            f'</table></section>')


def _job_row(state: str, job_id: int, pri: int, reserves: int, body: bytes) -> str:
    actions = [f'<button type="button" data-action="peek" data-job="{job_id}" '
               f'id="peek-{job_id}">peek</button>']
    if state in ("buried", "delayed"):
        actions.append(f'<button type="button" data-action="kick" data-job="{job_id}" '
                       f'id="kick-{job_id}">kick</button>')
    if state != "reserved":
        actions.append(f'<button type="button" data-action="delete" data-job="{job_id}" '
                       f'id="delete-{job_id}">delete</button>')
    text = body.decode(errors="replace")
    return (f'<tr id="job-{job_id}"><td><a href="{job_path(job_id)}">{job_id}</a></td>'
            f'<td>{pri}</td><td>{reserves}</td>'
            f'<td class="body">{html.escape(text)}</td><td>{"".join(actions)}</td></tr>')


# Fields of the job JSON shown apart from its table of fields.
_JOB_APART: Final = frozenset({"id", "body", "body_base64", "data", "data_base64"})


async def job_page(request: web.Request) -> web.Response:
    """One job: its fields as the API's job JSON has them (stats-job's, ``failures`` and
    ``error``; a job gone, how it ended), its body, its result once it ended; the script adds
    its latest progress, following it (and the end) through the result route's long poll."""
    ctx = namespace_of(request)
    try:
        jid = job_id(request.match_info["id"])
    except HttpError as exc:
        return _not_found(request, exc.message, status=400)
    try:
        job = await job_document(ctx, jid)
    except HttpError as exc:
        return _not_found(request, f"No job {jid}, and no end of it kept.", status=exc.status)
    ended = "ended" in job
    rows = "".join(
        f'<tr data-key="{html.escape(key, quote=True)}"><th>{html.escape(key)}</th>'
        f'<td>{_field_html(key, value)}</td></tr>'
        for key, value in job.items() if key not in _JOB_APART)
    state = f"ended: {job['ended']}" if ended else str(job["state"])
    result = _data_text(job["data"], job["data_base64"]) if ended else "not ended yet"
    body = "(gone with the job)" if ended else _data_text(job["body"], job["body_base64"])
    # The latest progress is on the living job only (the script reads it); an end keeps none.
    progress = "not kept after the end" if ended else "none reported"
    ttl_s = ctx.result_ttl_ms // 1000
    page = f"""{_header(request)}
<main>
<h2>Job <code id="job-id">{jid}</code>
<span id="job-state" class="badge">{html.escape(state)}</span>
<span id="status" role="status"></span></h2>
<table id="job-fields" class="fields"><tbody>{rows}</tbody></table>
<section><h3>Latest progress</h3><pre id="progress">{progress}</pre></section>
<section><h3>Result</h3><pre id="result">{html.escape(result)}</pre></section>
<section><h3>Body</h3><pre id="body">{html.escape(body)}</pre></section>
<p class="note">This page waits for the job as <code>GET /api/jobs/{jid}/result</code> does, to
show its progress and its end as they come: while it is open the job is waited for, so its
end is kept for the result lifetime (--result-ttl, {ttl_s} s here) even when it ends without
a result.</p>
</main>"""
    return _page(f"tubeq: job {jid}", page, data=f'data-page="job" data-job="{jid}"')


def _field_html(key: str, value: object) -> str:
    """One field of the job JSON as a table cell's content: the tube links to its page."""
    if key == "tube" and isinstance(value, str):
        return f'<a href="{html.escape(tube_path(value), quote=True)}">{html.escape(value)}</a>'
    return html.escape(str(value))


def _data_text(text: str | None, base64: str) -> str:
    """A body or a result as the page shows it: its text, else (not UTF-8) its base64."""
    if text is None:
        return f"(binary, base64) {base64}"
    return text or "(empty)"


def _not_found(request: web.Request, message: str, status: int = 404) -> web.Response:
    response = _page("tubeq: not found", f'{_header(request)}<main><p class="error">'
                     f'{html.escape(message)}</p><p><a href="/">All tubes</a></p></main>')
    response.set_status(status)
    return response


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise HttpError(404, f"no static file {name!r}")
    text = resources.files("tubeq.http").joinpath("static", name).read_text()
    return web.Response(text=text, content_type=STATIC[name],
                        headers={"Cache-Control": "no-cache"})
