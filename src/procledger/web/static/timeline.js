// procledger's timeline (docs/design.md §16.3): every attempt of every process as a bar over
// time, one row per process or service, drawn as SVG by this script from /api/timeline and
// kept live from /stream/changes: a batch of changes makes it fetch those processes' spans
// again. Text is written with textContent only; nothing a process says becomes markup.
// window.procledgerTimeline counts the loads and applied batches, for the tests.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const LABEL_W = 200;
  const ROW_H = 26;
  const BAR_H = 14;
  const AXIS_H = 28;
  const RIGHT = 12;
  const MOST_IDS = 200;
  const STEPS = [1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    .map((s) => s * 1000);
  const state = { spans: new Map(), loads: 0, batches: 0, offset: 0, windowMs: 3600000 };
  window.procledgerTimeline = state;
  // The live indicator's stream and `ps`'s way of writing a stretch of time: app.js's
  // (base.html loads it first, on every page).
  const { follow: stream, span } = window.procledger;

  function node(name, attrs, parent) {
    const made = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs)) made.setAttribute(key, String(value));
    if (parent) parent.appendChild(made);
    return made;
  }

  function titled(element, text) {
    node("title", {}, element).textContent = text;
    return element;
  }

  const pad = (n) => String(n).padStart(2, "0");
  function clock(ms, seconds) {
    const d = new Date(ms);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (seconds ? ":" + pad(d.getSeconds()) : "");
  }

  function say(text) {
    const note = document.getElementById("timeline-note");
    note.textContent = text;
    note.hidden = !text;
  }

  // Keep the newer of two copies of a span (two fetches may answer out of order).
  function keep(incoming) {
    const held = state.spans.get(incoming.id);
    if (!held || incoming.change_seq >= held.change_seq) state.spans.set(incoming.id, incoming);
  }

  async function load(section) {
    const response = await fetch(section.dataset.api, { credentials: "same-origin" });
    if (!response.ok) {
      say("could not read the timeline (" + response.status + ")");
      return null;
    }
    const data = await response.json();
    state.offset = data.now_ms - Date.now(); // draw by the server's clock, which timed them
    state.windowMs = data.window_ms;
    data.spans.forEach(keep);
    state.loads += 1;
    if (data.truncated) say("a busy window: only the newest changes are drawn");
    return data.cursor;
  }

  // Changes come in batches; the spans of the processes a batch named are fetched once it
  // settles, one fetch at a time.
  function follow(cursor) {
    const pending = new Set();
    let timer = null;
    let busy = false;
    async function refresh() {
      timer = null;
      if (busy) return;
      busy = true;
      const ids = Array.from(pending).slice(0, MOST_IDS);
      ids.forEach((id) => pending.delete(id));
      try {
        const url = "/api/timeline?ids=" + ids.map(encodeURIComponent).join(",");
        const response = await fetch(url, { credentials: "same-origin" });
        if (response.ok) {
          (await response.json()).spans.forEach(keep);
          state.batches += 1;
          draw();
        } else {
          ids.forEach((id) => pending.add(id));
        }
      } finally {
        busy = false;
        if (pending.size && !timer) timer = setTimeout(refresh, 150);
      }
    }
    stream("/stream/changes?cursor=" + encodeURIComponent(cursor), {
      row: (change) => {
        pending.add(change.match ? change.row.id : change.id);
        if (!timer) timer = setTimeout(refresh, 100);
      },
    });
  }

  function rowsOf(from) {
    const rows = new Map();
    const ordered = Array.from(state.spans.values()).sort(
      (a, b) => (a.service < b.service ? -1 : a.service > b.service ? 1 : (a.attempt || 0) - (b.attempt || 0)),
    );
    for (const s of ordered) {
      if (s.end_ms !== null && s.end_ms < from - state.windowMs) {
        state.spans.delete(s.id); // two windows old: no gap of the window reaches it
        continue;
      }
      if (!rows.has(s.service)) rows.set(s.service, []);
      rows.get(s.service).push(s);
    }
    // A row is drawn while one of its attempts reaches into the window.
    return Array.from(rows.values()).filter((spans) =>
      spans.some((s) => s.end_ms === null || s.end_ms >= from),
    );
  }

  function axis(svg, from, now, x, height, plotW) {
    const step = STEPS.find((s) => state.windowMs / s <= Math.max(2, plotW / 110)) || STEPS[STEPS.length - 1];
    const zone = -new Date(now).getTimezoneOffset() * 60000; // ticks on the local clock
    for (let t = Math.ceil((from + zone) / step) * step - zone; t <= now; t += step) {
      node("rect", { class: "grid", x: x(t), y: AXIS_H - 4, width: 1, height: height - AXIS_H + 4 }, svg);
      const label = node("text", { class: "tick-label", x: x(t), y: AXIS_H - 10, "text-anchor": "middle" }, svg);
      label.textContent = clock(t, step < 60000);
    }
    const mark = node("rect", { class: "now", x: x(now) - 1, y: AXIS_H - 4, width: 2, height: height - AXIS_H + 4 }, svg);
    titled(mark, "now");
  }

  function describe(s, now) {
    const what = s.outcome === "running" ? "running" : s.text || s.state;
    const end = s.end_ms === null ? now : s.end_ms;
    const number = s.attempt ? " · attempt " + s.attempt : "";
    return s.label + number + " · " + what + " · " + clock(s.start_ms, true) + "–" +
      (s.end_ms === null ? "now" : clock(s.end_ms, true)) + " (" + span(end - s.start_ms) + ")";
  }

  function gaps(group, spans, x, now) {
    for (let i = 1; i < spans.length; i++) {
      const before = spans[i - 1];
      const after = spans[i];
      if (before.end_ms === null || after.attempt !== before.attempt + 1) continue;
      const until = after.start_ms === null ? now : after.start_ms;
      if (until <= before.end_ms) continue;
      const left = x(before.end_ms);
      const gap = node("rect", {
        class: "gap", "data-service": after.service, x: left, y: (ROW_H - BAR_H) / 2 + 2,
        width: Math.max(1, x(until) - left), height: BAR_H - 4,
      }, group);
      titled(gap, "backoff " + span(until - before.end_ms) + " before attempt " + after.attempt);
    }
  }

  function bar(group, s, x, now) {
    const left = x(s.start_ms);
    const link = node("a", { href: s.href, class: "bar-link" }, group);
    const rect = node("rect", {
      class: "bar " + s.outcome, "data-id": s.id, "data-service": s.service, "data-outcome": s.outcome,
      x: left, y: (ROW_H - BAR_H) / 2, width: Math.max(2, x(s.end_ms === null ? now : s.end_ms) - left),
      height: BAR_H, rx: 2,
    }, link);
    titled(rect, describe(s, now));
  }

  function marks(group, s, x) {
    if (s.stop_ms !== null) {
      const tick = node("rect", { class: "stop-mark", "data-id": s.id, x: x(s.stop_ms) - 1.5, y: 1, width: 3, height: ROW_H - 2 }, group);
      titled(tick, "stop asked at " + clock(s.stop_ms, true));
    }
    if (s.ready_ms !== null) {
      const tick = node("rect", { class: "ready-mark", "data-id": s.id, x: x(s.ready_ms) - 1, y: 2, width: 2, height: ROW_H - 4 }, group);
      titled(tick, "ready at " + clock(s.ready_ms, true));
    }
  }

  function label(group, first) {
    const link = node("a", { href: "/processes/" + encodeURIComponent(first.service), class: "row-link" }, group);
    const text = node("text", { class: "row-label", x: 8, y: ROW_H / 2 + 4 }, link);
    text.textContent = first.label.length > 26 ? first.label.slice(0, 25) + "…" : first.label;
    titled(text, first.label + " (" + first.service + ")");
  }

  function draw() {
    const chart = document.getElementById("timeline-chart");
    const now = Date.now() + state.offset;
    const from = now - state.windowMs;
    const rows = rowsOf(from);
    const width = Math.max(600, chart.clientWidth);
    const plotW = width - LABEL_W - RIGHT;
    const height = AXIS_H + rows.length * ROW_H + 4;
    const x = (t) => LABEL_W + (Math.min(Math.max(t, from), now) - from) / state.windowMs * plotW;
    const svg = node("svg", { width, height, viewBox: "0 0 " + width + " " + height, id: "timeline-svg" });
    const hatch = node("pattern", {
      id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)",
    }, node("defs", {}, svg));
    node("rect", { class: "hatch-line", x: 0, y: 0, width: 2, height: 6 }, hatch);
    const at = (index) => "translate(0," + (AXIS_H + index * ROW_H) + ")";
    rows.forEach((spans, index) => {
      const group = node("g", { transform: at(index) }, svg);
      node("rect", { class: index % 2 ? "stripe odd" : "stripe", x: 0, y: 0, width, height: ROW_H }, group);
      label(group, spans[spans.length - 1]);
    });
    axis(svg, from, now, x, height, plotW); // over the stripes, under the bars
    rows.forEach((spans, index) => {
      const group = node("g", { class: "row", "data-service": spans[0].service, transform: at(index) }, svg);
      gaps(group, spans, x, now);
      for (const s of spans) if (s.start_ms !== null) bar(group, s, x, now);
      for (const s of spans) marks(group, s, x);
    });
    chart.replaceChildren(svg);
    document.getElementById("timeline-empty").hidden = rows.length > 0;
  }

  document.addEventListener("DOMContentLoaded", async () => {
    const section = document.getElementById("timeline");
    if (!section) return;
    const cursor = await load(section);
    draw();
    if (cursor === null) return;
    follow(cursor);
    setInterval(() => { if (!document.hidden) draw(); }, 1000); // running bars grow, time moves
    window.addEventListener("resize", draw);
  });
})();
