// procledger's web view: live rows, a live process page and its output, from Server-Sent
// Events (docs/design.md §16). Everything a process says is written with textContent, never
// as HTML. window.procledger.seen lists the id of every change applied, for the tests.
"use strict";
(function () {
  // The page's state for the tests (``seen``), and what the timeline's script shares.
  const state = { seen: [] };
  window.procledger = state;
  const live = document.getElementById("live");

  function indicate(word) {
    if (!live) return;
    live.dataset.state = word;
    live.textContent = word === "live" ? "● live" : word + "…";
  }

  function follow(url, handlers) {
    const source = new EventSource(url);
    source.onopen = () => indicate("live");
    // The browser retries by itself; it gives up only when refused (a 401 after the server
    // was restarted with another token): then only a new token URL helps.
    source.onerror = () =>
      indicate(source.readyState === EventSource.CLOSED ? "disconnected: open the token URL" : "reconnecting");
    for (const [kind, handle] of Object.entries(handlers)) {
      source.addEventListener(kind, (event) => handle(JSON.parse(event.data), event, source));
    }
    return source;
  }

  function age(ms) {
    const s = Math.max(0, Math.floor((Date.now() - ms) / 1000));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor(s / 3600) % 24).padStart(2, "0") + "h";
  }

  // A stretch of time as `ps` writes it (wording.span): 1.2s, 29s, 4m05s, 2h03m, 3d04h.
  function span(ms) {
    ms = Math.max(0, ms);
    if (ms < 10000) return (ms / 1000).toFixed(1) + "s";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
    return Math.floor(s / 86400) + "d" + String(Math.floor(s / 3600) % 24).padStart(2, "0") + "h";
  }

  state.follow = follow;
  state.span = span;

  // A service's attempt waiting out its backoff counts down to its start (the server wrote
  // the row when it changed; nothing changes in the ledger while it waits).
  function tickBackoffs() {
    const now = Date.now();
    for (const tr of document.querySelectorAll("#processes tbody tr[data-starts-at]")) {
      const at = Number(tr.dataset.startsAt);
      const waits = at > now;
      tr.querySelector("td.state").textContent = waits ? "backoff" : tr.dataset.state;
      tr.querySelector("td.outcome").textContent =
        (waits ? "next in " + span(at - now) + " · " : "") + "attempt " + tr.dataset.attempt;
    }
    for (const dd of document.querySelectorAll("dd[data-until]")) {
      const left = span(Number(dd.dataset.until) - now);
      dd.textContent = dd.textContent.replace(/\(in [^)]*\)$/, "(in " + left + ")");
    }
  }

  function tickAges() {
    for (const tr of document.querySelectorAll("#processes tbody tr")) {
      const cell = tr.querySelector("td.age");
      if (cell) cell.textContent = age(Number(tr.dataset.created));
    }
  }

  const COLUMNS = ["id", "name", "state", "status", "outcome", "age", "updated", "command"];

  function fill(tr, row) {
    // A service is one row (its newest attempt, as `ps` shows it): keyed by its first id.
    tr.id = "p-" + row.service;
    tr.dataset.service = row.service;
    tr.dataset.attempt = String(row.attempt);
    tr.dataset.id = row.id;
    tr.dataset.created = String(row.created_ms);
    tr.dataset.state = row.state;
    if (row.starts_at_ms) tr.dataset.startsAt = String(row.starts_at_ms);
    else delete tr.dataset.startsAt;
    tr.className = row.ended ? "ended" : "active";
    for (const name of COLUMNS) {
      let cell = tr.querySelector("td." + name);
      if (!cell) {
        cell = document.createElement("td");
        cell.className = name;
        tr.appendChild(cell);
      }
      if (name === "id") {
        const link = document.createElement("a");
        link.href = "/processes/" + encodeURIComponent(row.service); // a service: all of it
        link.textContent = row.id;
        cell.replaceChildren(link);
      } else if (name === "age") {
        cell.textContent = age(row.created_ms);
      } else if (name === "state") {
        cell.textContent = row.shown_state;
      } else {
        cell.textContent = row[name];
      }
    }
  }

  // The counts per status over the whole ledger, which the server sends when they change.
  function showCounts(counts) {
    for (const link of document.querySelectorAll("#counts a[data-status]")) {
      const n = counts[link.dataset.status];
      if (typeof n !== "number") continue;
      link.querySelector(".n").textContent = String(n);
      link.classList.toggle("zero", n === 0);
    }
  }

  function processesPage(table) {
    const body = table.tBodies[0];
    const firstPage = table.dataset.firstPage === "true";
    const empty = document.getElementById("empty");
    const onRow = (change, event) => {
      state.seen.push(event.lastEventId);
      if (!change.match) {
        const shown = Array.from(body.rows).find((tr) => tr.dataset.id === change.id);
        if (shown) shown.remove();
      } else {
        const key = change.row.service;
        const existing = document.getElementById("p-" + key);
        if (existing) {
          // An older attempt's change never replaces the newer attempt the row shows.
          if (change.row.attempt >= Number(existing.dataset.attempt)) fill(existing, change.row);
        } else if (firstPage) {
          const tr = document.createElement("tr");
          fill(tr, change.row);
          const after = Array.from(body.rows).find((other) => other.dataset.service < key);
          body.insertBefore(tr, after || null);
          tr.classList.add("flash");
        }
      }
      if (empty) empty.hidden = body.rows.length > 0;
    };
    follow(table.dataset.stream, { row: onRow, counts: showCounts });
    tickAges();
    setInterval(tickAges, 1000);
    setInterval(tickBackoffs, 250);
  }

  async function refreshProcess(addOutputs) {
    // The server renders the record, attempts and events; take them from a fresh copy of
    // this page, parsed inertly (DOMParser runs no script). A service's page learns there of
    // a new attempt's output, followed once the one before has all been shown.
    const response = await fetch(location.pathname, { credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ["record", "service", "attempts", "events", "actions", "command"]) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) now.replaceWith(document.importNode(next, true));
    }
    const section = fresh.getElementById("process");
    if (section) addOutputs(JSON.parse(section.dataset.outputs || "[]"), section.dataset.over === "true");
  }

  // The output of the process, or of each attempt of a service in turn (each after a header
  // line, as `procledger logs` prints a service's): one stream at a time, in order.
  function outputPane(section) {
    const pane = document.getElementById("output");
    const note = document.getElementById("output-note");
    const decode = (chunk) => {
      if (chunk.encoding === "utf-8") return chunk.data;
      const bytes = Uint8Array.from(atob(chunk.data), (c) => c.charCodeAt(0));
      return new TextDecoder().decode(bytes);
    };
    const say = (text) => { note.textContent = text; note.hidden = false; };
    const write = (text, kind) => {
      const span = document.createElement("span");
      span.className = kind;
      span.textContent = text;
      const atEnd = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 4;
      pane.appendChild(span);
      if (atEnd) pane.scrollTop = pane.scrollHeight;
    };
    const known = new Set();
    const queue = [];
    let following = false;
    let over = section.dataset.over === "true"; // no attempt of the service follows
    let last = null;

    // Once everything queued was shown: say whether more may come.
    function settle() {
      if (following || !last) return;
      if (last.attempt === null) say("the process ended; this is all of its output");
      else if (over) say("the service is over; this is all of its output");
      else say("attempt " + last.attempt + " ended; the next attempt's output follows here once it starts");
    }

    function next() {
      const output = queue.shift();
      following = Boolean(output);
      if (!output) return settle();
      last = output;
      note.hidden = true;
      if (output.attempt !== null) {
        const text = pane.textContent;
        const lead = text === "" ? "" : text.endsWith("\n") ? "\n" : "\n\n";
        write(lead + "==> attempt " + output.attempt + " (" + output.id + ") <==\n", "attempt");
      }
      follow(output.url, {
        chunk: (chunk) => write(decode(chunk), chunk.stream),
        end: (_, __, source) => { source.close(); next(); },
        unavailable: (info, __, source) => {
          source.close();
          write((info.tail.stdout || "") + (info.tail.stderr || ""), "stdout");
          say(info.message);
          next();
        },
      });
    }

    function add(outputs, isOver) {
      over = isOver;
      for (const output of outputs) {
        if (known.has(output.url)) continue;
        known.add(output.url);
        queue.push(output);
      }
      if (!following) next();
    }

    add(JSON.parse(section.dataset.outputs || "[]"), over);
    return add;
  }

  function processPage(section) {
    let pending = Promise.resolve();
    const addOutputs = outputPane(section);
    const refresh = () => refreshProcess(addOutputs);
    follow(section.dataset.stream, {
      row: (change, event) => {
        state.seen.push(event.lastEventId);
        pending = pending.then(refresh, refresh);
      },
    });
    setInterval(tickBackoffs, 250);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("processes");
    if (table) processesPage(table);
    const section = document.getElementById("process");
    if (section) processPage(section);
  });
})();
