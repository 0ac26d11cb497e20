// The Mythic dashboard: polls GET /v1/dashboard and redraws its tables.
// Everything the server sends is text (NPC lines are untrusted): it goes into the page through
// textContent only, never as HTML.
"use strict";

const POLL_MS = 1000;

function cell(row, value, className) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "–" : String(value);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fill(tableId, items, drawRow) {
  const body = document.querySelector(`#${tableId} tbody`);
  const rows = items.map((item) => {
    const tr = document.createElement("tr");
    drawRow(tr, item);
    return tr;
  });
  body.replaceChildren(...rows);
}

function setText(id, value) {
  document.getElementById(id).textContent =
    value === null || value === undefined ? "–" : String(value);
}

function ms(value) {
  return value === null || value === undefined ? null : `${value} ms`;
}

const LATENCY_NAMES = {
  first_token: "first token (text)",
  voice_first_token: "first token (voice)",
  first_audio: "first audio (voice)",
  retrieval: "retrieval + packing",
  memory_prefetch: "memory prefetch",
};

function draw(data) {
  setText("world", data.world);
  const t = data.totals;
  setText("turns", t.turns);
  setText("sessions-count", t.sessions);
  setText("connections", t.connections);
  setText("npc-actors", t.npc_actors);
  setText("errors", t.errors);
  setText("breakers-open", t.breakers_open);
  setText("blocked", t.safety_violations);
  setText("uptime", `${Math.round(data.uptime_s)} s`);
  document.getElementById("breakers-open").className = t.breakers_open ? "bad" : "";

  fill("latency", Object.entries(data.latency), (tr, [name, l]) => {
    tr.dataset.measure = name;
    cell(tr, LATENCY_NAMES[name] || name);
    cell(tr, ms(l.p50_ms), "p50");
    cell(tr, ms(l.p95_ms), "p95");
    cell(tr, l.samples, "samples");
  });
  fill("engines", data.engines, (tr, e) => {
    cell(tr, e.name);
    cell(tr, e.running);
    cell(tr, e.waiting);
    cell(tr, e.tokens_per_s);
    cell(tr, e.generated_tokens);
    cell(tr, e.kv_used === null ? null : `${Math.round(e.kv_used * 100)}%`);
  });
  fill("tiers", data.tiers, (tr, tier) => {
    cell(tr, tier.name);
    cell(tr, tier.requests);
    const td = cell(tr, "");
    td.textContent = "";
    for (const ep of tier.endpoints) {
      const span = document.createElement("span");
      span.className = "span" + (ep.healthy && ep.breaker === "closed" ? "" : " bad");
      span.textContent =
        `${ep.name}: ${ep.healthy ? "up" : "down"}, ${ep.breaker}, ${ep.outstanding}, ${ep.failures}`;
      td.appendChild(span);
    }
  });
  fill("npcs", data.npcs, (tr, npc) => {
    tr.dataset.npc = npc.npc_id;
    cell(tr, npc.npc_id);
    cell(tr, npc.name);
    cell(tr, npc.state, "state");
    cell(tr, npc.tiers.length ? npc.tiers.join(", ") : null);
    cell(tr, npc.zone);
    cell(tr, npc.sessions);
  });
  fill("sessions", data.sessions, (tr, s) => {
    cell(tr, s.session_id);
    cell(tr, s.player_id);
    cell(tr, s.connected ? "yes" : "no");
    cell(tr, s.npcs.join(", "));
  });
  setText(
    "tracing",
    "Each turn's trace: its hops (gateway, actor, retrieval, engine, TTS) and their durations; " +
      (data.traces_exported
        ? "every span is exported over OTLP too."
        : "kept on this server only (observability.otlp_endpoint exports them)."),
  );
  fill("recent", data.turns, (tr, turn) => {
    tr.dataset.turn = turn.turn_id;
    cell(tr, new Date(turn.at * 1000).toLocaleTimeString());
    cell(tr, turn.npc_id);
    cell(tr, turn.session_id);
    cell(tr, turn.turn_id);
    cell(tr, turn.text, "line");
    cell(tr, turn.safety && turn.safety.length ? `${turn.finish} (blocked: ${turn.safety.join(", ")})` : turn.finish);
    const td = cell(tr, turn.trace ? "" : null, "trace");
    if (turn.trace) {
      td.textContent = "";
      td.title = turn.trace.trace_id;
      for (const span of turn.trace.spans) {
        const s = document.createElement("span");
        s.className = "span";
        s.textContent = `${span.name} ${span.ms} ms`;
        td.appendChild(s);
      }
    }
  });
}

function status(state, text) {
  const el = document.getElementById("status");
  el.dataset.state = state;
  el.textContent = text;
}

async function poll() {
  try {
    const response = await fetch("/v1/dashboard", { cache: "no-store" });
    if (!response.ok) {
      status("down", `server answered ${response.status}`);
    } else {
      draw(await response.json());
      status("live", `live, updated ${new Date().toLocaleTimeString()}`);
    }
  } catch (err) {
    status("down", `server unreachable (${err.message})`);
  }
  setTimeout(poll, POLL_MS);
}

poll();
