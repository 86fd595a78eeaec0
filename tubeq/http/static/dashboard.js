// tubeq dashboard: keeps the server-rendered pages live through the JSON API (/api/...).
// No framework and no network access beyond this server: it must work offline.
"use strict";

const REFRESH_MS = 1000;

// With an access file (tubeq --auth), the page was opened as /?token=<token>: every API call
// carries it as a bearer token, and links between pages keep it.
const TOKEN = new URLSearchParams(window.location.search).get("token");

function keepToken() {
  if (!TOKEN) return;
  for (const link of document.querySelectorAll('a[href^="/"]')) {
    const url = new URL(link.getAttribute("href"), window.location.origin);
    url.searchParams.set("token", TOKEN);
    link.setAttribute("href", url.pathname + url.search);
  }
}

async function api(method, path, body) {
  const init = {method: method, headers: {}};
  if (TOKEN) init.headers["Authorization"] = "Bearer " + TOKEN;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const data = await response.json();
  if (!response.ok) {
    const error = new Error(data.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return data;
}

function withToken(path) {
  return path + (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : "");
}

function tubePath(name) {
  return withToken("/tubes/" + encodeURIComponent(name));
}

function jobPath(id) {
  return withToken("/jobs/" + encodeURIComponent(id));
}

function link(text, href) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

// A body or a result: its text, else (not UTF-8) its base64.
function dataText(text, base64) {
  if (text === null) return "(binary, base64) " + base64;
  return text === "" ? "(empty)" : text;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// A null figure (the summed row of the tubes past the cap has no deletes or waiting) is "-".
function rate(now, before, seconds) {
  if (now === null || before === undefined || before === null || seconds <= 0) return "\u2013";
  return Math.max(0, (now - before) / seconds).toFixed(1);
}

// -- the tube list --------------------------------------------------------------------------

let previous = null;  // {time_ms, tubes: {name: row}}

function tubeLink(name) {
  const td = document.createElement("td");
  if (name === null) {
    const em = document.createElement("em");
    em.textContent = "other tubes";
    td.appendChild(em);
  } else {
    td.appendChild(link(name, tubePath(name)));
  }
  return td;
}

function waitText(now, before) {
  if (!now.wait || !before || !before.wait) return "\u2013";
  const n = now.wait.count - before.wait.count;
  if (n <= 0) return "\u2013";
  return ((now.wait.sum_s - before.wait.sum_s) / n * 1000).toFixed(1) + " ms";
}

async function refreshTubes() {
  const data = await api("GET", "/api/tubes");
  const seconds = previous ? (data.time_ms - previous.time_ms) / 1000 : 0;
  const body = document.querySelector("#tubes tbody");
  const rows = [];
  const byName = {};
  for (const t of data.tubes) {
    const key = t.name === null ? "" : t.name;
    byName[key] = t;
    const before = previous ? previous.tubes[key] : undefined;
    const tr = document.createElement("tr");
    tr.dataset.tube = key;
    tr.appendChild(tubeLink(t.name));
    tr.appendChild(cell(t.ready, "ready"));
    tr.appendChild(cell(t.urgent, "urgent"));
    tr.appendChild(cell(t.reserved, "reserved"));
    tr.appendChild(cell(t.delayed, "delayed"));
    tr.appendChild(cell(t.buried, "buried"));
    // null in the row that sums the tubes past the cap: their counters are not summed
    tr.appendChild(cell(t.finished === null ? "\u2013" : t.finished, "finished"));
    tr.appendChild(cell(t.failed === null ? "\u2013" : t.failed, "failed"));
    tr.appendChild(cell(rate(t.total_jobs, before && before.total_jobs, seconds), "puts"));
    tr.appendChild(cell(rate(t.deletes, before && before.deletes, seconds), "deletes"));
    tr.appendChild(cell(waitText(t, before), "wait"));
    tr.appendChild(cell(t.waiting === null ? "\u2013" : t.waiting, "waiting"));
    tr.appendChild(cell(t.paused ? "yes" : "", "paused"));
    rows.push(tr);
  }
  body.replaceChildren(...rows);
  document.getElementById("tube-count").textContent = data.count;
  previous = {time_ms: data.time_ms, tubes: byName};
}

async function refreshServers() {
  const data = await api("GET", "/api/servers");
  const rows = data.servers.map((s) => {
    const tr = document.createElement("tr");
    tr.appendChild(cell(s.id + (s.self ? " (this one)" : "")));
    tr.appendChild(cell(s.addr));
    tr.appendChild(cell(s.http));
    tr.appendChild(cell(s.heartbeat_age_ms + " ms"));
    tr.appendChild(cell(s.connections));
    tr.appendChild(cell(s.workers));
    tr.appendChild(cell(s.waiting));
    return tr;
  });
  document.querySelector("#servers tbody").replaceChildren(...rows);
}

// -- one tube -------------------------------------------------------------------------------

const STATES = ["ready", "delayed", "buried", "reserved", "held"];

function button(action, id) {
  const b = document.createElement("button");
  b.type = "button";
  b.dataset.action = action;
  b.dataset.job = id;
  b.id = action + "-" + id;
  b.textContent = action;
  return b;
}

function status(text, isError) {
  const el = document.getElementById("status");
  el.textContent = text;
  el.className = isError ? "error" : "";
}

async function refreshTube(tube) {
  const enc = encodeURIComponent(tube);
  let stats;
  try {
    stats = await api("GET", "/api/tubes/" + enc);
  } catch (e) {
    status("tube gone: " + e.message, true);
    return;
  }
  document.getElementById("paused").hidden = !stats.pause;
  const counts = {ready: stats["current-jobs-ready"], delayed: stats["current-jobs-delayed"],
                  buried: stats["current-jobs-buried"], reserved: stats["current-jobs-reserved"],
                  held: stats["current-jobs-held"]};
  document.getElementById("count-groups").textContent = stats.groups;
  document.querySelector("#groups-busiest tbody").replaceChildren(...stats.groups_busiest.map(
    (g) => {
      const tr = document.createElement("tr");
      for (const v of [g.group, g.ready, g.reserved]) tr.appendChild(cell(v));
      return tr;
    }));
  for (const state of STATES) {
    document.getElementById("count-" + state).textContent = counts[state];
    const data = await api("GET", "/api/tubes/" + enc + "/jobs?state=" + state);
    const rows = data.jobs.map((j) => {
      const tr = document.createElement("tr");
      tr.id = "job-" + j.id;
      const id = document.createElement("td");
      id.appendChild(link(j.id, jobPath(j.id)));
      tr.appendChild(id);
      tr.appendChild(cell(j.pri));
      tr.appendChild(cell(j.reserves));
      tr.appendChild(cell(j.body !== null ? j.body : "(binary) " + j.body_base64, "body"));
      const actions = document.createElement("td");
      actions.appendChild(button("peek", j.id));
      if (state === "buried" || state === "delayed") actions.appendChild(button("kick", j.id));
      if (state !== "reserved") actions.appendChild(button("delete", j.id));
      tr.appendChild(actions);
      return tr;
    });
    document.querySelector("#jobs-" + state + " tbody").replaceChildren(...rows);
  }
}

async function jobAction(action, id, tube) {
  if (action === "peek") {
    const job = await api("GET", "/api/jobs/" + id);
    if (job.ended !== undefined) {
      document.getElementById("peek").textContent =
        "job " + job.id + " ended: " + job.ended + "\n\n" + dataText(job.data, job.data_base64);
    } else {
      const failed = job.failures ?
        ", failures " + job.failures + ", last error: " + job.error : "";
      document.getElementById("peek").textContent =
        "job " + job.id + " (" + job.state + ", pri " + job.pri + ", reserves " + job.reserves +
        failed + ")\n\n" + (job.body !== null ? job.body : "(binary, base64) " + job.body_base64);
    }
  } else if (action === "kick") {
    await api("POST", "/api/jobs/" + id + "/kick");
    status("kicked job " + id);
  } else if (action === "delete") {
    await api("DELETE", "/api/jobs/" + id);
    status("deleted job " + id);
  }
  await refreshTube(tube);
}

async function tubeAction(id, tube) {
  const enc = encodeURIComponent(tube);
  if (id === "pause" || id === "resume") {
    const delay = id === "resume" ? 0 : Number(document.getElementById("pause-delay").value);
    await api("POST", "/api/tubes/" + enc + "/pause", {delay: delay});
    status(delay ? "paused for " + delay + " s" : "resumed");
  } else if (id === "kick-tube") {
    const bound = Number(document.getElementById("kick-bound").value);
    const data = await api("POST", "/api/tubes/" + enc + "/kick", {bound: bound});
    status("kicked " + data.kicked + " job(s)");
  }
  await refreshTube(tube);
}

// -- one job --------------------------------------------------------------------------------

// One long poll of the job's progress and end (the route takes up to 600000 ms).
const FOLLOW_MS = 25000;
// Fields of the job JSON shown apart from its table.
const JOB_APART = new Set(["id", "body", "body_base64", "data", "data_base64"]);

function jobStatus(text) {
  document.getElementById("status").textContent = text;
  document.getElementById("status").className = text ? "error" : "";
}

// The job's fields, body and result from its JSON (GET /api/jobs/<id>): as the page was
// served, so a job that ends shows how, and its result, without a reload.
async function refreshJob(id) {
  let job;
  try {
    job = await api("GET", "/api/jobs/" + id);
  } catch (e) {
    jobStatus(e.status === 404 ? "no job " + id + ", and no end of it kept" : e.message);
    return;
  }
  jobStatus("");
  const rows = [];
  for (const [key, value] of Object.entries(job)) {
    if (JOB_APART.has(key)) continue;
    const tr = document.createElement("tr");
    tr.dataset.key = key;
    const th = document.createElement("th");
    th.textContent = key;
    tr.appendChild(th);
    if (key === "tube") {
      const td = document.createElement("td");
      td.appendChild(link(value, tubePath(value)));
      tr.appendChild(td);
    } else {
      tr.appendChild(cell(value));
    }
    rows.push(tr);
  }
  document.querySelector("#job-fields tbody").replaceChildren(...rows);
  const ended = job.ended !== undefined;
  document.getElementById("job-state").textContent = ended ? "ended: " + job.ended : job.state;
  document.getElementById("result").textContent =
    ended ? dataText(job.data, job.data_base64) : "not ended yet";
  document.getElementById("body").textContent =
    ended ? "(gone with the job)" : dataText(job.body, job.body_base64);
}

// Follow the job's progress and its end through the result route's long poll (a wait: the
// job is marked, so its end is kept for --result-ttl, which the page says). Each answer with
// progress P asks for the reports after P; an end refreshes the fields at once.
async function followJob(id) {
  let seen = 0;
  for (;;) {
    let answer;
    try {
      answer = await api("GET", "/api/jobs/" + id + "/result?wait-ms=" + FOLLOW_MS +
                         "&progress=" + seen);
    } catch (e) {
      if (e.status === 404) return;  // no such job, no end kept: refreshJob says so
      await sleep(REFRESH_MS);  // the server away, or Redis: ask again
      continue;
    }
    if (answer === null) continue;  // 204: nothing new within FOLLOW_MS
    if (answer.progress !== undefined) {
      seen = answer.progress;
      document.getElementById("progress").textContent =
        "report " + seen + ": " + dataText(answer.data, answer.data_base64);
      continue;
    }
    await refreshJob(id);
    if (answer.ended !== "buried") return;
    // A buried job answers "buried" at once while it lies there: ask again in a while (a kick
    // makes it wait again).
    await sleep(REFRESH_MS);
  }
}

// -- start ----------------------------------------------------------------------------------

function every(fn) {
  const run = () => fn().catch((e) => console.error(e)).finally(() => setTimeout(run, REFRESH_MS));
  run();
}

document.addEventListener("DOMContentLoaded", () => {
  keepToken();
  const page = document.body.dataset.page;
  if (page === "index") {
    every(refreshTubes);
    every(refreshServers);
    document.getElementById("find-job").addEventListener("submit", (event) => {
      event.preventDefault();
      window.location.href = jobPath(document.getElementById("find-job-id").value);
    });
  } else if (page === "job") {
    const id = document.body.dataset.job;
    every(() => refreshJob(id));
    followJob(id).catch((e) => console.error(e));
  } else if (page === "tube") {
    const tube = document.body.dataset.tube;
    every(() => refreshTube(tube));
    document.addEventListener("click", (event) => {
      const target = event.target.closest("button");
      if (!target) return;
      const job = target.dataset.job;
      const work = job ? jobAction(target.dataset.action, job, tube) : tubeAction(target.id, tube);
      work.catch((e) => status(e.message, true));
    });
  }
});
