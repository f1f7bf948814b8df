// SplitMQ dashboard: polls /api/state every second and draws the view named by the URL hash (#/cluster, ...).
// Plain JS, no framework and no network beyond this server: the page must work on a machine without internet.
"use strict";

const POLL_MS = 1000;
const COLORS = ["#0b5cad", "#cf222e", "#1a7f37", "#8250df", "#9a6700", "#0a7b83", "#bf3989", "#57606a"];
let state = null;
let lastError = null;
let metricsTimer = null;
let historyRange = "";          // seconds of history the charts cover ("" = the last 5 minutes, every sample)
const admin = { accessKey: "", secretKey: "" };   // kept in this page's memory only, sent with each action

function esc(v) {
  return String(v === null || v === undefined ? "" : v)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
function num(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); }
function time(ms) { return ms ? new Date(ms).toLocaleTimeString("en-GB") : "–"; }
function bytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let x = Number(v), i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (i ? x.toFixed(1) : x) + " " + units[i];
}
function localStamp(ms) {
  const d = new Date(ms), pad = n => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function route() {
  const h = location.hash.replace(/^#\/?/, "");
  const [view, query] = h.split("?");
  return { view: view || "cluster", params: new URLSearchParams(query || "") };
}
function shortError(e) {
  const text = String(e || "");
  if (/refused/i.test(text)) return "connection refused";
  if (/closed the connection|connection reset/i.test(text)) return "connection closed without an answer";
  if (/timeout|timed out/i.test(text)) return "no answer in time";
  return text.slice(0, 60);
}
function badge(ok, yes, no) { return `<span class="badge ${ok ? "up" : "down"}">${ok ? yes : no}</span>`; }
function roleBadge(id) {
  if (id === null || id === undefined) return `<span class="muted">none yet</span>`;
  return id === 0 ? `<span class="badge master">0 master</span>` : `<span class="badge slave">${esc(id)} slave</span>`;
}

// A small SVG line chart: series = [{name, points: [[t_ms, value], ...]}].
function lineChart(series, opts) {
  const w = (opts && opts.width) || 540, h = (opts && opts.height) || 140, pad = 64;
  const fmt = (opts && opts.format) || num;
  const pts = series.flatMap(s => s.points);
  if (pts.length === 0) return `<p class="muted">no samples yet</p>`;
  let t0 = Math.min(...pts.map(p => p[0])), t1 = Math.max(...pts.map(p => p[0]));
  let v1 = Math.max(1, ...pts.map(p => p[1]));
  if (t1 === t0) t1 = t0 + 1000;
  const x = t => pad + (t - t0) / (t1 - t0) * (w - pad - 8);
  const y = v => h - 18 - v / v1 * (h - 28);
  let svg = `<svg class="chart" width="${w}" height="${h}" viewBox="0 0 ${w} ${h}" role="img">`;
  svg += `<line x1="${pad}" y1="${h - 18}" x2="${w - 8}" y2="${h - 18}" stroke="#aaa"/>`;
  svg += `<line x1="${pad}" y1="10" x2="${pad}" y2="${h - 18}" stroke="#aaa"/>`;
  svg += `<text x="${pad - 4}" y="14" font-size="10" text-anchor="end">${esc(fmt(v1))}</text>`;
  svg += `<text x="${pad - 4}" y="${h - 18}" font-size="10" text-anchor="end">0</text>`;
  svg += `<text x="${pad}" y="${h - 4}" font-size="10">${esc(time(t0))}</text>`;
  svg += `<text x="${w - 8}" y="${h - 4}" font-size="10" text-anchor="end">${esc(time(t1))}</text>`;
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    svg += `<polyline fill="none" stroke-width="2" stroke="${COLORS[i % COLORS.length]}" points="${d}"/>`;
  });
  svg += "</svg>";
  const legend = series.map((s, i) => `<span><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`);
  return svg + `<div class="legend">${legend.join("")}</div>`;
}

// --- views drawn from the polled state ---

function viewCluster(s) {
  if (!s.groups.length) return `<p class="muted">No broker group is registered with the nameserver.</p>`;
  return `<h2>Cluster topology</h2><div class="cards">` + s.groups.map(g => {
    const rows = g.members.map(m => `<tr data-member="${esc(g.name)}/${m.id}" data-up="${m.up}">
      <td>${m.id}</td><td>${m.up && m.role ? esc(m.role) : (m.id === 0 ? "master" : "slave")}</td><td>${esc(m.addr)}</td>
      <td title="${esc(m.error || "")}">${badge(m.up, "UP", "DOWN")}${m.inRoute ? "" : ` <span class="muted">left the route</span>`}</td>
      <td class="num">${num(m.commitLogMaxOffset)}</td><td class="num">${m.up ? Number(m.putTps || 0).toFixed(1) : "–"}</td>
      <td>${m.up ? (m.slaveReadEnable ? "on" : "off") : "–"}</td>
      <td>${m.id === 0 ? "" : (m.masterLinkUp === true ? "up" : m.masterLinkUp === false ? "down" : "–")}</td>
      <td class="err">${m.error ? esc(m.up ? m.error : shortError(m.error)) : ""}</td></tr>`).join("");
    let peers = "";
    if (g.dledger) {
      peers = `<h3>DLedger peers</h3><table><tr><th>peer</th><th>role</th><th>state</th><th>term</th>
        <th>broker id</th><th>peer address</th><th class="num">end index</th><th class="num">committed</th>
        <th class="num">lag (entries)</th></tr>` + g.peers.map(p =>
        `<tr><td>${esc(p.peerId)}</td><td>${esc(p.role || "")}</td><td>${badge(p.up, "UP", "DOWN")}</td>
         <td>${esc(p.term ?? "")}</td><td>${esc(p.brokerId ?? "")}</td><td>${esc(p.peerAddr || "")}</td>
         <td class="num">${num(p.ledgerEndIndex)}</td><td class="num">${num(p.committedIndex)}</td>
         <td class="num">${num(p.lag)}</td></tr>`).join("") + `</table>`;
    }
    return `<div class="card wide" data-group="${esc(g.name)}"><h3>${esc(g.name)} <span class="muted">${esc(g.cluster)}${g.dledger ? " · DLedger" : ""}</span></h3>
      <table><tr><th>id</th><th>role</th><th>address</th><th>state</th><th class="num">commit log max</th>
      <th class="num">put tps</th><th>slave reads</th><th>master link</th><th></th></tr>${rows}</table>${peers}</div>`;
  }).join("") + `</div>`;
}

function viewReplication(s) {
  if (!s.replication.length) return `<h2>Replication</h2><p class="muted">No master/slave group (DLedger groups show their peers' progress in the cluster view).</p>`;
  return `<h2>Replication per slave</h2><div class="cards">` + s.replication.map(r => `
    <div class="card" data-slave="${esc(r.group)}/${r.slaveId}" data-diff="${r.diffBytes ?? ""}" data-lag-s="${r.lagS ?? ""}">
      <h3>${esc(r.group)} slave ${r.slaveId} <span class="muted">${esc(r.addr)}</span> ${badge(r.up, "UP", "NOT ANSWERING")}</h3>
      <table><tr><th class="num">master max</th><th class="num">slave ack</th><th class="num">offset diff</th>
      <th class="num">lag (time)</th><th>in sync</th><th>HA link</th></tr>
      <tr><td class="num">${num(r.masterMaxOffset)}</td><td class="num">${num(r.ackOffset)}</td>
      <td class="num lag-bytes">${bytes(r.diffBytes)}</td><td class="num">${r.lagS === null ? "–" : esc(r.lagS) + " s"}</td>
      <td>${badge(r.inSync, "in sync", "behind")}</td><td>${r.masterUp ? badge(r.connected, "connected", "none") : badge(false, "", "master down")}</td></tr></table>
      ${lineChart([{ name: "offset diff (bytes)", points: r.history }], { format: bytes })}</div>`).join("") + `</div>`;
}

function systemTopics(s) {
  const names = s.systemTopics || [];
  if (!names.length) return "";
  return `<section class="system" id="system-topics"><h3>System topics <span class="badge sys">system</span>
    <span class="muted">the cluster's own, not swept</span></h3><p>${names.map(esc).join(" · ")}</p></section>`;
}

function viewTopics(s) {
  if (!s.topics.length) return `<h2>Topics</h2><p class="muted">No user topic yet.</p>` + systemTopics(s);
  return `<h2>Topics and queues</h2><div class="cards">` + s.topics.map(t => `
    <div class="card" data-topic="${esc(t.name)}"><h3>${esc(t.name)} <span class="muted">${Number(t.rate).toFixed(1)} msgs/s</span>
    <a class="act" href="#/actions?topic=${encodeURIComponent(t.name)}&queueNums=${t.queues.length ? Math.max(...t.queues.map(q => q.queueId)) + 1 : 4}">update</a></h3>
    ${t.error ? `<p class="err">${esc(t.error)}</p>` : ""}
    <table><tr><th>broker</th><th class="num">queue</th><th class="num">min offset</th><th class="num">max offset</th><th class="num">write rate</th></tr>
    ${t.queues.map(q => `<tr><td>${esc(q.broker)}</td><td class="num">${q.queueId}</td><td class="num">${num(q.min)}</td>
      <td class="num">${num(q.max)}</td><td class="num">${Number(q.rate).toFixed(1)}/s</td></tr>`).join("")}</table>
    ${lineChart([{ name: "messages stored", points: t.history || [] }])}</div>`).join("") + `</div>` + systemTopics(s);
}

function systemGroups(s) {
  const groups = s.systemGroups || [];
  if (!groups.length) return "";
  return `<section class="system" id="system-groups"><h3>System groups <span class="badge sys">system</span>
    <span class="muted">the cluster's and tools' own (transaction checks, retries, this dashboard's browser): not swept</span></h3>
    <table><tr><th>group</th><th>topics with an offset</th></tr>${groups.map(g => `<tr data-system-group="${esc(g.group)}">
    <td>${esc(g.group)}</td><td class="wrap">${g.topics.map(esc).join(" · ")}</td></tr>`).join("")}</table></section>`;
}

function viewConsumers(s) {
  if (!s.consumers.length) return `<h2>Consumer groups</h2><p class="muted">No group has committed an offset yet.</p>` + systemGroups(s);
  return `<h2>Consumer groups</h2><div class="cards">` + s.consumers.map(c => {
    const rows = c.queues.map(q => {
      const changes = q.servedByChanges.map(x => `${x[1]} at ${time(x[0])}`).join(" → ");
      return `<tr data-queue="${esc(q.broker)}/${q.queueId}" data-served-by="${q.servedBy ?? ""}"><td>${esc(q.broker)}</td>
        <td class="num">${q.queueId}</td><td class="num">${num(q.brokerOffset)}</td><td class="num">${num(q.consumerOffset)}</td>
        <td class="num">${num(q.lag)}</td><td class="served">${roleBadge(q.servedBy)}</td><td class="muted wrap">${esc(changes)}</td></tr>`;
    }).join("");
    const series = historyRange ? [{ name: "lag, all queues", points: c.history || [] }]
      : c.queues.map(q => ({ name: `${q.broker}/${q.queueId}`, points: q.history }));
    return `<div class="card wide" data-consumer="${esc(c.group)}/${esc(c.topic)}">
      <h3>${esc(c.group)} <span class="muted">on ${esc(c.topic)} · lag ${num(c.lag)}</span>
      <a class="act" href="#/actions?group=${encodeURIComponent(c.group)}&topic=${encodeURIComponent(c.topic)}">reset offsets</a></h3>
      ${c.error ? `<p class="err">${esc(c.error)}</p>` : ""}
      <table class="consumer"><tr><th>broker</th><th class="num">queue</th><th class="num">broker offset</th><th class="num">consumer offset</th>
      <th class="num">lag</th><th>last pulls served by</th><th>changes</th></tr>${rows}</table>
      ${lineChart(series)}</div>`;
  }).join("") + `</div>` + systemGroups(s);
}

function viewDlq(s) {
  const dead = s.deadLetters || [];
  if (!dead.length) return `<h2>Dead letters</h2><p class="muted">No dead-letter topic: no group has given up on a message.</p>`;
  return `<h2>Dead letters <span class="muted">messages a group gave up on after its retries (%DLQ%&lt;group&gt;)</span></h2>
    <div class="cards">` + dead.map(d => `<div class="card" data-dlq="${esc(d.topic)}" data-count="${d.count}">
    <h3>${esc(d.group)} <span class="muted">${esc(d.topic)} · ${num(d.count)} message(s)</span></h3>
    ${d.error ? `<p class="err">${esc(d.error)}</p>` : ""}
    <table><tr><th>broker</th><th class="num">queue</th><th class="num">min offset</th><th class="num">max offset</th><th></th></tr>
    ${d.queues.map(q => `<tr><td>${esc(q.broker)}</td><td class="num">${q.queueId}</td><td class="num">${num(q.min)}</td>
      <td class="num">${num(q.max)}</td><td>${q.max > q.min ? `<a class="browse" href="#/messages?${new URLSearchParams({ topic: d.topic,
        broker: q.broker, queue: q.queueId, offset: q.min, max: 16 })}">browse</a>` : ""}</td></tr>`).join("")}</table></div>`).join("") + `</div>`;
}

// --- views with their own requests ---

function viewMessages() {
  const p = route().params;
  const v = k => esc(p.get(k) || "");
  return `<h2>Message browser</h2>
    <form data-mode="queue"><b>By queue</b><label>topic<input name="topic" value="${v("topic")}"></label>
      <label>broker<input name="broker" value="${v("broker")}"></label><label>queue<input name="queue" size="4" value="${v("queue")}"></label>
      <label>offset<input name="offset" size="8" value="${v("offset") || "0"}"></label><label>max<input name="max" size="4" value="${v("max") || "16"}"></label>
      <button>Browse</button></form>
    <form data-mode="key"><b>By key</b><label>topic<input name="topic" value="${v("topic")}"></label>
      <label>key<input name="key" value="${v("key")}"></label><button>Find</button></form>
    <form data-mode="time"><b>By time</b><label>topic<input name="topic" value="${v("topic")}"></label>
      <label>stored at or after<input name="at" type="datetime-local" step="1" value="${p.get("time") ? localStamp(Number(p.get("time"))) : ""}"></label>
      <label>max<input name="max" size="4" value="${v("max") || "16"}"></label><button>Find</button></form>
    <form data-mode="id"><b>By msgId</b><label>msgId<input name="msgId" size="36" value="${v("msgId")}"></label>
      <label>topic (for a unique key)<input name="topic" value="${v("topic")}"></label><button>Find</button></form>
    <div id="results"></div>`;
}

async function runQuery(params) {
  const out = document.getElementById("results");
  out.innerHTML = `<p class="muted">Searching…</p>`;
  try {
    const resp = await fetch("/api/messages?" + params.toString());
    const body = await resp.json();
    if (!resp.ok) { out.innerHTML = `<p class="err">${esc(body.remark || resp.statusText)}</p>`; return; }
    if (!body.messages.length) { out.innerHTML = `<p class="muted">No message found.</p>`; return; }
    out.innerHTML = `<p>${body.messages.length} message(s)</p><table><tr><th>topic</th><th>broker</th><th class="num">queue</th>
      <th class="num">offset</th><th>msgId</th><th>offset msgId</th><th>tags</th><th>keys</th><th>stored</th><th>body</th></tr>` +
      body.messages.map(m => `<tr class="msg"><td>${esc(m.topic)}</td><td>${esc(m.broker)}</td><td class="num">${m.queueId}</td>
        <td class="num">${m.queueOffset}</td><td>${esc(m.msgId)}</td><td>${esc(m.offsetMsgId)}</td><td>${esc(m.tags || "")}</td>
        <td>${esc(m.keys.join(" "))}</td><td>${esc(time(m.storeTimestamp))}</td>
        <td><pre>${esc(m.body)}${m.bodyTruncated ? "…" : ""}</pre></td></tr>`).join("") + `</table>`;
  } catch (e) {
    out.innerHTML = `<p class="err">dashboard server unreachable: ${esc(e)}</p>`;
  }
}

function bindMessages() {
  document.querySelectorAll("#main form").forEach(f => f.addEventListener("submit", ev => {
    ev.preventDefault();
    const params = new URLSearchParams();
    new FormData(f).forEach((val, key) => { if (String(val).trim()) params.set(key, String(val).trim()); });
    if (params.has("at")) { params.set("time", String(new Date(params.get("at")).getTime())); params.delete("at"); }
    history.replaceState(null, "", "#/messages?" + params.toString());
    runQuery(params);
  }));
  const p = route().params;
  if (p.get("msgId") || p.get("key") || p.get("queue") || p.get("time")) runQuery(p);
}

// --- actions: deliberate POSTs with the page's token, written with the account typed here ---

function viewActions(s) {
  const p = route().params;
  const v = (k, d) => esc(p.get(k) || d || "");
  if (!s) return `<h2>Actions</h2><p class="muted">Loading…</p>`;
  const acts = s.actions || {};
  if (acts.readOnly) return `<h2>Actions</h2><p class="muted">This dashboard was started with --read-only: it changes nothing.</p>`;
  const acl = acts.signed ? `<p class="muted">The cluster has the ACL on: actions are written with the admin account given here
      (kept in this page only), never with the dashboard's own.</p>` : `<p class="muted">Without the ACL, leave the account empty.</p>`;
  return `<h2>Actions</h2><div id="action-result" class="result" hidden></div>
    <form id="admin-account" class="account"><b>Admin account</b><label>access key<input name="accessKey" autocomplete="off" value="${esc(admin.accessKey)}"></label>
      <label>secret key<input name="secretKey" type="password" autocomplete="off" value="${esc(admin.secretKey)}"></label></form>${acl}
    <form data-action="topic"><b>Create or update a topic</b><label>topic<input name="topic" value="${v("topic")}"></label>
      <label>queues<input name="queueNums" size="4" value="${v("queueNums", "4")}"></label>
      <label>perm<select name="perm"><option value="6">6 read and write</option><option value="4">4 read only</option><option value="2">2 write only</option></select></label>
      <button>Create / update</button></form>
    <form data-action="group"><b>Create or update a subscription group</b><label>group<input name="group" value="${v("group")}"></label>
      <label>retry max times<input name="retryMaxTimes" size="4" value="16"></label>
      <label>when consuming slowly, read from<input name="whichBrokerWhenConsumeSlowly" size="4" value="1"></label>
      <label>consume enabled<select name="consumeEnable"><option value="true">yes</option><option value="false">no</option></select></label>
      <button>Create / update</button></form>
    <form data-action="reset-offset"><b>Reset a group's offsets</b><label>group<input name="group" value="${v("group")}"></label>
      <label>topic<input name="topic" value="${v("topic")}"></label>
      <label>to<select name="to"><option value="earliest">earliest</option><option value="latest">latest</option><option value="timestamp">a time</option></select></label>
      <label>time (for "a time")<input name="at" type="datetime-local" step="1"></label>
      <button>Reset</button></form>
    <p class="muted">A reset needs the group's consumers stopped (they would write their own positions back); it sets every queue of the topic.</p>`;
}

function showResult(ok, text) {
  const out = document.getElementById("action-result");
  out.hidden = false;
  out.className = "result " + (ok ? "ok" : "err");
  out.textContent = text;
}

async function act(kind, body) {
  const token = document.querySelector('meta[name="splitmq-token"]').content;
  showResult(true, "working…");
  try {
    const resp = await fetch("/api/actions/" + kind, {
      method: "POST", cache: "no-store",
      headers: { "Content-Type": "application/json", "Authorization": "SplitMQ-Dashboard " + token },
      body: JSON.stringify(Object.assign({}, body, admin.accessKey ? admin : {})),
    });
    const answer = await resp.json();
    if (resp.ok) showResult(true, answer.did);
    else showResult(false, `${answer.codeName || answer.code} (${answer.code}): ${answer.remark}`);
  } catch (e) {
    showResult(false, "dashboard server unreachable: " + e);
  }
}

function bindActions() {
  const account = document.getElementById("admin-account");
  if (!account) return;
  account.addEventListener("input", () => {
    admin.accessKey = account.elements.accessKey.value.trim();
    admin.secretKey = account.elements.secretKey.value;
  });
  account.addEventListener("submit", ev => ev.preventDefault());
  document.querySelectorAll("#main form[data-action]").forEach(f => f.addEventListener("submit", ev => {
    ev.preventDefault();
    const body = {};
    new FormData(f).forEach((val, key) => { body[key] = String(val).trim(); });
    for (const k of ["queueNums", "perm", "retryMaxTimes", "whichBrokerWhenConsumeSlowly"]) if (k in body) body[k] = Number(body[k]);
    if ("consumeEnable" in body) body.consumeEnable = body.consumeEnable === "true";
    if (f.dataset.action === "reset-offset") {
      if (body.to === "timestamp") body.timestampMs = body.at ? new Date(body.at).getTime() : -1;
      delete body.at;
    }
    act(f.dataset.action, body);
  }));
}

function viewMetrics(s) {
  const addr = route().params.get("addr") || "";
  const opts = (s ? s.groups : []).flatMap(g => g.members.map(m =>
    `<option value="${esc(m.addr)}" ${m.addr === addr ? "selected" : ""}>${esc(g.name)}[${m.id}] ${esc(m.addr)}</option>`));
  return `<h2>Broker metrics</h2><form><label>broker<select id="metrics-addr"><option value="">pick a broker</option>${opts.join("")}</select></label>
    <label>filter<input id="metrics-filter" value="${esc(route().params.get("filter") || "")}" placeholder="e.g. pull"></label></form>
    <div id="metrics"><p class="muted">Pick a broker.</p></div>`;
}

async function loadMetrics() {
  const addr = document.getElementById("metrics-addr");
  const out = document.getElementById("metrics");
  if (!addr || !out || !addr.value) return;
  const filter = (document.getElementById("metrics-filter").value || "").toLowerCase();
  try {
    const resp = await fetch("/api/metrics?addr=" + encodeURIComponent(addr.value));
    const body = await resp.json();
    if (!resp.ok) { out.innerHTML = `<p class="err">${esc(body.remark || resp.statusText)}</p>`; return; }
    const rows = body.samples.filter(m => !filter || (m.name + JSON.stringify(m.labels)).toLowerCase().includes(filter));
    out.innerHTML = `<p class="muted">${esc(addr.value)} · ${rows.length} samples · ${esc(time(Date.now()))}</p><table>
      <tr><th>metric</th><th>labels</th><th class="num">value</th></tr>` + rows.map(m => `<tr class="metric"><td>${esc(m.name)}</td>
      <td class="muted">${esc(Object.entries(m.labels).filter(([k]) => !["cluster", "node_type"].includes(k)).map(([k, v]) => k + "=" + v).join(" "))}</td>
      <td class="num">${esc(typeof m.value === "number" ? Number(m.value.toPrecision(6)) : m.value)}</td></tr>`).join("") + `</table>`;
  } catch (e) {
    out.innerHTML = `<p class="err">dashboard server unreachable: ${esc(e)}</p>`;
  }
}

function bindMetrics() {
  const sync = () => {
    const a = document.getElementById("metrics-addr").value, f = document.getElementById("metrics-filter").value;
    history.replaceState(null, "", "#/metrics?" + new URLSearchParams({ addr: a, filter: f }).toString());
    loadMetrics();
  };
  document.getElementById("metrics-addr").addEventListener("change", sync);
  document.getElementById("metrics-filter").addEventListener("input", sync);
  loadMetrics();
  metricsTimer = setInterval(loadMetrics, 2 * POLL_MS);
}

// --- the loop ---

const LIVE = { cluster: viewCluster, replication: viewReplication, topics: viewTopics, consumers: viewConsumers, dlq: viewDlq };

function drawHeader() {
  const banner = document.getElementById("banner");
  const problem = lastError || (state && !state.ok ? state.error : null);
  banner.hidden = !problem;
  banner.textContent = problem || "";
  if (state) {
    document.getElementById("namesrv").textContent = "nameserver " + state.namesrv;
    document.getElementById("updated").textContent = state.updatedMs ? "updated " + time(state.updatedMs) : "";
    const acts = state.actions || {}, mode = document.getElementById("mode");
    mode.textContent = acts.readOnly ? "read-only" : "actions on";
    mode.className = "badge " + (acts.readOnly ? "ro" : "rw");
  }
}

function drawLive() {
  const view = route().view;
  const draw = LIVE[view];
  if (draw && state) {
    const warnings = (state.warnings || []).map(w => `<p class="muted">${esc(w)}</p>`).join("");
    document.getElementById("main").innerHTML = draw(state) + warnings;
  }
}

function onRoute() {
  const view = route().view;
  document.querySelectorAll("#nav a").forEach(a => a.classList.toggle("active", a.dataset.view === view));
  if (metricsTimer) { clearInterval(metricsTimer); metricsTimer = null; }
  document.body.dataset.view = view;
  if (view === "messages") { document.getElementById("main").innerHTML = viewMessages(); bindMessages(); }
  else if (view === "metrics") { document.getElementById("main").innerHTML = viewMetrics(state); bindMetrics(); }
  else if (view === "actions") { document.getElementById("main").innerHTML = viewActions(state); bindActions(); }
  else if (!LIVE[view]) { document.getElementById("main").innerHTML = `<p class="err">No view named ${esc(view)}.</p>`; }
  else drawLive();
}

async function refresh() {
  try {
    const resp = await fetch("/api/state" + (historyRange ? "?range=" + historyRange : ""), { cache: "no-store" });
    state = await resp.json();
    lastError = null;
  } catch (e) {
    lastError = "dashboard server unreachable (" + e + "); retrying every second";
  }
  try {
    drawHeader();
    drawLive();
    const pick = document.getElementById("metrics-addr");
    if (route().view === "metrics" && pick && pick.options.length <= 1 && state && state.groups.length) onRoute();
    if (route().view === "actions" && state && !document.getElementById("admin-account") && !state.actions.readOnly) onRoute();
    document.body.dataset.updated = state ? String(state.updatedMs) : "";
  } catch (e) {
    lastError = "the page failed to draw this view: " + e;
    drawHeader();
  }
}

async function poll() {
  try {
    await refresh();
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

window.addEventListener("hashchange", onRoute);
document.getElementById("range").addEventListener("change", ev => { historyRange = ev.target.value; refresh(); });
onRoute();
poll();
