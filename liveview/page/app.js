// a2a-bus live view: the page's only script. See index.html for the DOM
// hooks and docs/PROTOCOL.md ("The live view") for the endpoints.
'use strict';

(() => {
  const TOKEN_KEY = 'a2a-bus-live-view-token';
  const MAX_TIMELINE = 500;
  const REFRESH_MS = 4000; // the snapshot is read again this often anyway
  const HINT_MS = 300; // hints closer together than this make one read
  const SILENCE_MS = 40000; // a stream that says nothing this long is dead (pings come every 15 s)
  const OPEN_STATES = new Set(['submitted', 'working', 'input-required']);

  const $ = (id) => document.getElementById(id);
  const latest = new Map(); // taskId -> {state, at}: the latest state known
  let token = takeToken();
  let stopped = false;

  // takeToken takes the token from the address's fragment, keeps it in
  // sessionStorage and takes it out of the address bar; else it reads
  // the one kept.
  function takeToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (m) {
      const t = decodeURIComponent(m[1]);
      try { sessionStorage.setItem(TOKEN_KEY, t); } catch (e) { /* kept in memory only */ }
      history.replaceState(null, '', location.pathname + location.search);
      return t;
    }
    try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
  }

  function headers() { return { Authorization: 'Bearer ' + token }; }

  // Control characters and bidi controls, which a delegate may put in
  // its names and texts, are shown as escapes: they cannot reorder or
  // hide what the page shows (who waits on whom).
  const unsafe = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  function shown(s) {
    return s.replace(unsafe, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c !== null && c !== undefined && c !== '') e.append(typeof c === 'string' ? shown(c) : c);
    }
    return e;
  }

  function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

  function showProblem(text) {
    const p = $('problem');
    p.textContent = text || '';
    p.hidden = !text;
  }

  function setLive(live, why) {
    const s = $('status');
    s.dataset.live = String(live);
    s.textContent = live ? 'live' : (why || 'offline');
  }

  function unauthorized() {
    stopped = true;
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* nothing kept */ }
    setLive(false, 'no access');
    showProblem('This page has no valid token. Open the address a2a-bus gave (serve logs it, demo prints it; ' +
      'it ends with #token=…), or add #token=<uiToken from the connection file> to this address.');
  }

  async function errorText(res) {
    try { return (await res.json()).error || res.statusText; } catch (e) { return res.status + ' ' + res.statusText; }
  }

  // know records a task's state as of at; it reports whether it is newer
  // than what was known.
  function know(id, state, at) {
    const t = Date.parse(at) || 0;
    const k = latest.get(id);
    if (k && (k.at > t || (k.at === t && k.state === state))) return false;
    latest.set(id, { state, at: t });
    return true;
  }

  function stateOf(id, fallback) {
    const k = latest.get(id);
    return k ? k.state : fallback;
  }

  // restamp gives every element of a task its latest state.
  function restamp(id) {
    const s = stateOf(id);
    for (const e of document.querySelectorAll('[data-task-id="' + CSS.escape(id) + '"]')) e.dataset.state = s;
  }

  function short(id) { return id.length > 8 ? '…' + id.slice(-8) : id; }

  function fmtTime(at) {
    const d = new Date(at);
    if (isNaN(d)) return '';
    const p = (n, w) => String(n).padStart(w || 2, '0');
    return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds()) + '.' + p(d.getMilliseconds(), 3);
  }

  function fmtUptime(s) {
    s = Math.floor(s);
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + (s % 60) + 's';
    return Math.floor(s / 3600) + 'h' + Math.floor((s % 3600) / 60) + 'm';
  }

  function member(agentId, contextId) {
    return el('span', { class: 'member' }, el('b', null, agentId), el('span', { class: 'ctx' }, ' @ ' + contextId));
  }

  function badge(state, text) { return el('span', { class: 'badge s-' + state }, text || state); }

  // The snapshot: sessions with their agents, the open tasks.

  function renderSnapshot(s) {
    const i = s.info;
    $('broker').textContent = 'broker ' + i.version + ' · bus ' + i.bus + ' · epoch …' + i.epoch.slice(-8) +
      ' · up ' + fmtUptime(i.uptimeSeconds) + ' · ' + i.agents + ' agents in ' + i.sessions + ' sessions · ' +
      i.openTasks + ' open tasks' + (s.truncated ? ' · lists cut short' : '');
    const changed = [];
    for (const t of s.openTasks) if (know(t.id, t.state, t.updatedAt)) changed.push(t.id);

    const sessions = new Map();
    const session = (id) => {
      if (!sessions.has(id)) sessions.set(id, { info: null, agents: [] });
      return sessions.get(id);
    };
    for (const x of s.sessions) session(x.contextId).info = x;
    for (const a of s.agents) session(a.contextId).agents.push(a);
    const waits = new Map(); // agentId@session -> tasks it requested, still open
    const works = new Map(); // agentId@session -> open tasks assigned to it
    const add = (m, k, t) => { if (!m.has(k)) m.set(k, []); m.get(k).push(t); };
    for (const t of s.openTasks) {
      add(waits, t.requesterName + '\u0000' + t.contextId, t);
      add(works, t.agentName + '\u0000' + t.agentContextId, t);
    }

    const box = $('sessions');
    box.replaceChildren();
    for (const id of [...sessions.keys()].sort()) {
      const x = sessions.get(id);
      const facts = [x.agents.length + (x.agents.length === 1 ? ' agent' : ' agents')];
      if (x.info) {
        facts.push('seq ' + x.info.lastSeq);
        if (x.info.subscribers !== undefined) facts.push(x.info.subscribers + ' subscribed');
      }
      const list = el('ul');
      for (const a of x.agents) {
        const key = a.agentId + '\u0000' + a.contextId;
        const li = el('li', { 'data-agent-id': a.agentId, 'data-context-id': a.contextId, title: a.description || null },
          el('b', null, a.agentId), a.name !== a.agentId ? el('span', { class: 'dim' }, ' (card ' + a.name + ')') : null);
        for (const t of waits.get(key) || []) {
          li.append(el('div', { class: 'rel waits' }, 'waits on ', member(t.agentName, t.agentContextId), ' ', badge(t.state)));
        }
        for (const t of works.get(key) || []) {
          li.append(el('div', { class: 'rel works' }, 'works for ', member(t.requesterName, t.contextId), ' ', badge(t.state)));
        }
        list.append(li);
      }
      box.append(el('section', { class: 'session', 'data-context-id': id },
        el('h3', null, id, el('span', { class: 'dim' }, ' · ' + facts.join(' · '))),
        x.agents.length ? list : el('p', { class: 'dim' }, 'no live agent')));
    }
    if (!sessions.size) box.append(el('p', { class: 'dim' }, 'No session yet.'));

    const rows = $('open-tasks');
    rows.replaceChildren();
    for (const t of s.openTasks) {
      rows.append(el('tr', { 'data-task-id': t.id, 'data-state': stateOf(t.id, t.state) },
        el('td', null, badge(t.state)),
        el('td', null, member(t.requesterName, t.contextId)),
        el('td', { class: 'arrow' }, '→'),
        el('td', null, member(t.agentName, t.agentContextId)),
        el('td', null, el('time', { datetime: t.updatedAt }, fmtTime(t.updatedAt))),
        el('td', { class: 'task', title: t.id }, short(t.id))));
    }
    if (!s.openTasks.length) rows.append(el('tr', null, el('td', { colspan: '6', class: 'dim' }, 'No open task.')));
    for (const id of changed) restamp(id);

    // A task last seen open that the broker no longer lists as open
    // ended out of sight (while no page followed the view): its rows
    // keep the latest state known, marked so.
    const open = new Set(s.openTasks.map((t) => t.id));
    const at = Date.parse(s.at) || 0;
    for (const row of document.querySelectorAll('#timeline [data-task-id]')) {
      const k = latest.get(row.dataset.taskId);
      const unseen = k && !open.has(row.dataset.taskId) && OPEN_STATES.has(k.state) && k.at < at;
      row.classList.toggle('unseen-end', Boolean(unseen));
      if (unseen) row.title = 'ended while no page followed the view: its last state is not known';
    }
  }

  let reading = false, again = false, hintTimer = null;

  async function refresh() {
    if (stopped) return;
    if (reading) { again = true; return; }
    reading = true;
    try {
      const res = await fetch('api/snapshot', { headers: headers(), cache: 'no-store' });
      if (res.status === 401) { unauthorized(); return; }
      if (!res.ok) { showProblem(await errorText(res)); return; }
      renderSnapshot(await res.json());
      showProblem(null);
    } catch (e) {
      showProblem('The live view is unreachable: is a2a-bus serve still running?');
    } finally {
      reading = false;
      if (again) { again = false; hint(); }
    }
  }

  function hint() {
    if (hintTimer === null) hintTimer = setTimeout(() => { hintTimer = null; refresh(); }, HINT_MS);
  }

  // The timeline.

  function entryRow(e) {
    if (e.kind === 'gap') {
      return el('li', { 'data-kind': 'gap' }, el('time', { datetime: e.at }, fmtTime(e.at)),
        el('span', { class: 'dim' }, 'no page followed the view from ' + fmtTime(e.since) +
          ': what happened until ' + fmtTime(e.at) + ' is not shown'));
    }
    const attrs = { 'data-kind': e.kind };
    if (e.taskId) {
      attrs['data-task-id'] = e.taskId;
      attrs['data-state'] = stateOf(e.taskId, e.state);
      attrs['data-event-state'] = e.state;
    }
    let what = 'push';
    if (e.kind === 'created') what = 'new task';
    else if (e.kind === 'message') what = 'message';
    else if (e.kind === 'status') what = e.state;
    return el('li', attrs,
      el('time', { datetime: e.at }, fmtTime(e.at)),
      el('span', { class: 'who' }, member(e.from.agentId, e.from.contextId), ' → ', member(e.to.agentId, e.to.contextId)),
      badge(e.kind === 'push' ? 'push' : e.state, what),
      e.taskId ? el('span', { class: 'task', title: e.taskId }, short(e.taskId)) : null,
      e.text ? el('q', null, e.text) : null);
  }

  function reset(entries) {
    for (let i = entries.length - 1; i >= 0; i--) {
      const e = entries[i];
      if (e.taskId) know(e.taskId, e.state, e.at);
    }
    $('timeline').replaceChildren(...entries.slice(0, MAX_TIMELINE).map(entryRow));
    for (const row of document.querySelectorAll('#open-tasks [data-task-id]')) row.dataset.state = stateOf(row.dataset.taskId);
  }

  function addEntry(e) {
    const newer = e.taskId && know(e.taskId, e.state, e.at);
    const ol = $('timeline');
    ol.prepend(entryRow(e));
    while (ol.children.length > MAX_TIMELINE) ol.lastElementChild.remove();
    if (newer) restamp(e.taskId);
  }

  function handle(m) {
    switch (m.type) {
      case 'reset': reset(m.entries); hint(); break;
      case 'entry': addEntry(m.entry); break;
      case 'changed': hint(); break;
      default: break; // ping, and what a later version adds
    }
  }

  // follow reads the event stream, and reads it again when it ends.
  async function follow() {
    let wait = 1000;
    while (!stopped) {
      const abort = new AbortController();
      let silence = setTimeout(() => abort.abort(), SILENCE_MS);
      try {
        const res = await fetch('api/events', { headers: headers(), cache: 'no-store', signal: abort.signal });
        if (res.status === 401) { unauthorized(); return; }
        if (!res.ok) {
          setLive(false, await errorText(res));
          if (res.status === 503) wait = 5000;
        } else {
          setLive(true);
          wait = 1000;
          const reader = res.body.getReader();
          const dec = new TextDecoder();
          let buf = '';
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            clearTimeout(silence);
            silence = setTimeout(() => abort.abort(), SILENCE_MS);
            buf += dec.decode(value, { stream: true });
            let nl;
            while ((nl = buf.indexOf('\n')) >= 0) {
              const line = buf.slice(0, nl);
              buf = buf.slice(nl + 1);
              if (line) handle(JSON.parse(line));
            }
          }
          setLive(false, 'reconnecting');
        }
      } catch (e) {
        setLive(false, 'reconnecting');
      } finally {
        clearTimeout(silence);
      }
      if (stopped) return;
      await sleep(wait);
      wait = Math.min(wait * 2, 10000);
    }
  }

  if (!token) {
    unauthorized();
    return;
  }
  refresh();
  setInterval(refresh, REFRESH_MS);
  follow();
})();
