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
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
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
    const a = document.createElement("a");
    a.href = "/tubes/" + encodeURIComponent(name) +
      (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : "");
    a.textContent = name;
    td.appendChild(a);
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

const STATES = ["ready", "delayed", "buried", "reserved"];

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
                  buried: stats["current-jobs-buried"], reserved: stats["current-jobs-reserved"]};
  for (const state of STATES) {
    document.getElementById("count-" + state).textContent = counts[state];
    const data = await api("GET", "/api/tubes/" + enc + "/jobs?state=" + state);
    const rows = data.jobs.map((j) => {
      const tr = document.createElement("tr");
      tr.id = "job-" + j.id;
      tr.appendChild(cell(j.id));
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
    document.getElementById("peek").textContent =
      "job " + job.id + " (" + job.state + ", pri " + job.pri + ", reserves " + job.reserves +
      ")\n\n" + (job.body !== null ? job.body : "(binary, base64) " + job.body_base64);
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
