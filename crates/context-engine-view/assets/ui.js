// ctx serve's /ui: the proxy's overview, the caller's sessions, one
// session's per-call chart, what went upstream on its last calls and its
// compactions, polled every two seconds from the proxy's JSON (same
// origin; no reload).
//
// Access: the access token (x-ctx-token), the caller's provider key (its
// sessions are its identity's) and the operator's token can be typed in,
// or passed once in the address's fragment (#token=…&key=…&operator=…),
// which never leaves the browser; they are kept for this tab only
// (sessionStorage).
'use strict';

(function () {
  const V = CtxView;
  const el = V.el;
  const app = document.getElementById('app');
  const POLL_MS = 2000;
  const FIELDS = [['token', 'access token (x-ctx-token)'], ['key', 'your provider key (Authorization: Bearer …)'],
    ['operator', 'operator token']];

  const auth = {};
  for (const [k] of FIELDS) auth[k] = sessionStorage.getItem('ctx.' + k) || '';
  if (location.hash.length > 1) {
    const params = new URLSearchParams(location.hash.slice(1));
    for (const [k] of FIELDS) {
      if (params.has(k)) {
        auth[k] = params.get(k);
        sessionStorage.setItem('ctx.' + k, auth[k]);
      }
    }
    history.replaceState(null, '', location.pathname + location.search);
  }

  function headers() {
    const h = {};
    if (auth.token) h['x-ctx-token'] = auth.token;
    if (auth.key) h['Authorization'] = 'Bearer ' + auth.key;
    if (auth.operator) h['x-ctx-operator-token'] = auth.operator;
    return h;
  }

  async function get(path) {
    const r = await fetch(path, {headers: headers(), cache: 'no-store', credentials: 'omit'});
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((body.error && body.error.message) || `${path}: HTTP ${r.status}`);
    return body;
  }

  // The page's parts, filled in by the pollers.
  const status = el('p', {class: 'muted small', id: 'status'}, 'loading…');
  const overviewPart = el('section', {id: 'overview'});
  const sessionsPart = el('section', {id: 'sessions'});
  const sessionPart = el('section', {id: 'session'});
  let selected = null; // {scope, id}
  const searchPart = searchBox();
  const requestPart = el('div', {class: 'panel', id: 'request'});
  let shownRequest = null; // {scope, id, call}
  let sortBy = 'recent'; // or 'savings': the sessions list's order
  let shownCompactions = -1;
  let polls = 0;

  function accessForm() {
    const inputs = FIELDS.map(([k, label]) => {
      const input = el('input', {type: 'password', placeholder: label, 'aria-label': label, autocomplete: 'off'});
      input.value = auth[k];
      input.addEventListener('change', () => {
        auth[k] = input.value.trim();
        sessionStorage.setItem('ctx.' + k, auth[k]);
        shownCompactions = -1;
        poll();
      });
      return input;
    });
    const form = el('form', {class: 'toolbar', autocomplete: 'off'}, inputs);
    form.addEventListener('submit', e => e.preventDefault());
    return el('details', {class: 'panel'}, el('summary', {}, 'Access'),
      el('p', {class: 'muted small'}, 'You see the sessions of the key you give (the identity your agent sends), ' +
        'or every session with the operator token. Kept for this tab only.'),
      form);
  }

  app.replaceChildren(el('h1', {}, 'ctx serve'),
    el('p', {class: 'muted'}, 'What the engine did: tokens the agents sent against what went upstream, ' +
      'each session\u2019s calls, and what each compaction wrote and replaced.'),
    accessForm(), status, overviewPart, sessionsPart, sessionPart);

  function renderOverview(o) {
    const m = o.metrics;
    const saved = m.client_prompt_tokens > 0 ? V.change(m.client_prompt_tokens, m.managed_prompt_tokens) : '';
    const cache = m.prompt_tokens > 0 ? V.pct(m.cache_read_tokens / m.prompt_tokens) : '–';
    const latency = m.overhead_ms ? m.overhead_ms.map(v => v.toFixed(2)).join(' / ') + ' ms' : '–';
    const store = o.store.kind === 'none' ? 'none (this process only)'
      : o.store.kind === 'ok' ? 'healthy' : `degraded for ${o.store.for_s} s`;
    // Observe mode: the traffic went upstream untouched; the engine's
    // figures are what it would have sent.
    const observe = o.mode === 'observe';
    const parts = [
      el('h2', {}, observe ? 'Overview (observe mode: nothing was changed)' : 'Overview'),
      observe ? el('p', {class: 'muted small', id: 'observe-note'},
        'Every request went upstream exactly as the agent sent it. "Tokens the engine would send", the compactions and each call\'s request show what the engine would have done.') : null,
      el('div', {class: 'cards'},
        V.card('requests', V.num(m.requests), 'requests'),
        V.card('tokens the agents sent', V.num(m.client_prompt_tokens), 'client_prompt_tokens', 'counted, managed requests'),
        V.card(observe ? 'tokens the engine would send' : 'tokens sent upstream', V.num(m.managed_prompt_tokens), 'managed_prompt_tokens', saved ? `${saved} against the agents'` : ''),
        V.card('prompt tokens billed', V.num(m.prompt_tokens), 'prompt_tokens', `as the upstream reported; cache hits ${cache}`),
        o.cost ? V.card('estimated bill, with / without the engine',
          `${V.money(o.cost.with_engine)} / ${V.money(o.cost.without_engine)}`, 'cost',
          `${o.cost.price} prices; ${V.change(o.cost.without_engine, o.cost.with_engine)} with the engine`) : null,
        (m.summary_prompt_tokens || m.summary_completion_tokens) ? V.card('summary calls (the engine\'s own)',
          `${V.num(m.summary_prompt_tokens)} + ${V.num(m.summary_completion_tokens)}`, 'summary_tokens',
          'prompt + completion tokens the upstream reported for summaries; in the bill') : null,
        V.card('compactions', V.num(m.compactions), 'compactions',
          m.compaction_thrash ? `${V.num(m.compaction_thrash)} thrash (within 3 calls of the previous; compacted deeper)` : ''),
        m.ledger_cuts ? V.card('state record cut', V.num(m.ledger_cuts), 'ledger_cuts',
          'requests whose window could not hold the summary\'s state record whole') : null,
        V.card('fallbacks', V.num(m.fallbacks), 'fallbacks', 'sent unmanaged'),
        V.card('added latency p50 / p90 / p99', latency, 'overhead', 'last 1,024 requests'),
        V.card('sessions held', V.num(o.sessions), 'sessions', `store: ${store}`)),
    ];
    if (m.fallback_reasons && m.fallback_reasons.length) {
      parts.push(el('div', {class: 'panel'}, el('h3', {}, 'Last fallbacks'),
        V.table(['when', 'reason'], m.fallback_reasons.map(([ms, why]) => [new Date(ms).toLocaleTimeString(), why]))));
    }
    overviewPart.replaceChildren(...parts.filter(Boolean));
  }

  function renderSessions(list) {
    const operator = list.viewer === 'operator';
    const saved = s => s.client_tokens - s.upstream_tokens;
    const sessions = sortBy === 'savings'
      ? [...list.sessions].sort((a, b) => saved(b) - saved(a) || b.last_ms - a.last_ms)
      : list.sessions;
    const sorter = el('div', {class: 'toolbar', id: 'sort'}, el('span', {class: 'muted small'}, 'order:'),
      [['recent', 'most recent'], ['savings', 'largest savings']].map(([key, label]) => {
        const b = el('button', {type: 'button', 'data-sort': key, class: sortBy === key ? 'selected' : ''}, label);
        b.addEventListener('click', () => {
          sortBy = key;
          renderSessions(list);
        });
        return b;
      }));
    const rows = sessions.map(s => {
      const tr = el('tr', {class: 'clickable' + (selected && selected.id === s.id && selected.scope === s.scope ? ' selected' : ''),
        'data-id': s.id},
        el('td', {}, s.id), operator ? el('td', {}, el('code', {}, s.scope)) : null,
        el('td', {class: 'num'}, V.num(s.calls)), el('td', {class: 'num'}, V.num(s.client_tokens)),
        el('td', {class: 'num'}, V.num(s.upstream_tokens)), el('td', {class: 'num'}, V.change(s.client_tokens, s.upstream_tokens)),
        el('td', {class: 'num'}, String(s.compactions)),
        el('td', {}, s.last_ms ? new Date(s.last_ms).toLocaleTimeString() : '–'));
      tr.addEventListener('click', () => {
        selected = {scope: s.scope, id: s.id};
        shownCompactions = -1;
        shownRequest = null;
        requestPart.replaceChildren();
        searchPart.querySelector('.search-results').replaceChildren();
        poll();
      });
      return tr;
    });
    const head = ['session', operator ? 'identity' : null, 'calls', 'client tokens', 'upstream tokens', 'change',
      'compactions', 'last call'].filter(Boolean);
    sessionsPart.replaceChildren(el('h2', {}, `Sessions (${list.sessions.length})`),
      list.sessions.length
        ? el('div', {class: 'panel'}, sorter, el('table', {class: 'sessions'},
          el('thead', {}, el('tr', {}, head.map(h => el('th', {}, h)))), el('tbody', {}, rows)))
        : el('p', {class: 'muted'}, 'No session of yours yet: point your agent at this proxy and send a request.'));
  }

  function sessionPath(s) {
    return `/ui/api/sessions/${encodeURIComponent(s.scope)}/${encodeURIComponent(s.id)}`;
  }

  function renderSession(d) {
    const info = d.session || {};
    const figures = info.stats
      ? `${V.num(info.stats.requests)} requests, ${V.num(info.stats.managed)} managed, ${V.num(info.stats.fallbacks)} unmanaged` +
        (info.stats.last_fallback ? ` (last: ${info.stats.last_fallback})` : '') +
        `; engine “${info.engine}”, window ${V.num(info.window)} tokens, compaction at ${V.num(info.threshold)}`
      : 'the session is busy or asleep';
    const chartPart = d.calls.length
      ? V.chart(d.calls.map(c => ({client: c.client, upstream: c.upstream, compaction: c.compaction,
        digest: c.digest, prune: c.prune, label: `call ${c.n}`})), {window: info.window, threshold: info.threshold})
      : el('p', {class: 'muted'}, 'No call kept yet.');
    let compactionsPart = sessionPart.querySelector('#compactions');
    if (!compactionsPart) compactionsPart = el('div', {id: 'compactions'});
    sessionPart.replaceChildren(el('h2', {}, `Session ${d.id}`), el('p', {class: 'muted small'}, figures),
      el('h3', {}, `Prompt tokens per call (last ${d.calls.length})`), chartPart, requestCalls(d.requests || []),
      requestPart, searchPart, compactionsPart);
    return compactionsPart;
  }

  // The calls whose request the proxy still holds (the newest twenty), each
  // a button that opens it.
  function requestCalls(calls) {
    const shown = calls.slice(-20);
    if (!shown.length) return el('p', {class: 'muted small'}, 'No request kept to show (serve.ui.request_bytes).');
    return el('div', {class: 'toolbar', id: 'request-calls'}, el('span', {class: 'muted small'}, 'What went upstream on call'),
      shown.map(n => {
        const b = el('button', {type: 'button', 'data-call': String(n),
          class: shownRequest && shownRequest.call === n ? 'selected' : ''}, String(n));
        b.addEventListener('click', () => openRequest(n));
        return b;
      }));
  }

  const FATE = {kept: 'kept', changed: 'changed', summarized: 'summarized', left_out: 'left out'};

  // One message of a call's request, folded: role, tokens, what became of
  // it; the text inside.
  function viewMessage(m, index, tag, cls) {
    const text = V.messageText(m.message);
    const head = el('summary', {}, el('span', {class: 'role'}, `#${index} ${m.message.role}`),
      el('span', {class: `badge ${cls}`}, tag), el('span', {class: 'muted small'}, ` ${V.num(m.tokens)} tokens · `),
      el('span', {class: 'small'}, text.slice(0, 120)));
    return el('details', {class: `view-message ${cls}`, 'data-tag': cls}, head, el('pre', {}, text));
  }

  async function openRequest(n) {
    if (!selected) return;
    shownRequest = {scope: selected.scope, id: selected.id, call: n};
    try {
      const r = await get(sessionPath(selected) + '/calls/' + n);
      const sum = list => V.num(list.reduce((t, m) => t + m.tokens, 0));
      const fates = {};
      for (const m of r.client) fates[m.fate] = (fates[m.fate] || 0) + 1;
      const tally = Object.entries(fates).map(([f, k]) => `${k} ${FATE[f] || f}`).join(', ');
      const source = s => s.kind === 'kept' ? [`kept #${s.client}`, 'kept']
        : s.kind === 'changed' ? [`changed #${s.client}`, 'changed']
          : s.kind === 'summary' ? ['summary', 'summarized'] : ['added by the engine', 'added'];
      requestPart.replaceChildren(el('h3', {}, `Call ${r.call}: what the agent sent and what went upstream (${r.format})`),
        el('div', {class: 'sides'},
          el('div', {}, el('h4', {}, `What the agent sent: ${r.client.length} messages, ${sum(r.client)} tokens`),
            el('p', {class: 'muted small'}, tally),
            el('div', {class: 'list'}, r.client.map((m, i) => viewMessage(m, i, FATE[m.fate] || m.fate, m.fate)))),
          el('div', {}, el('h4', {}, `What went upstream: ${r.upstream.length} messages, ${sum(r.upstream)} tokens`),
            el('p', {class: 'muted small'}, 'texts redacted with the configured patterns'),
            el('div', {class: 'list'}, r.upstream.map((m, i) => {
              const [tag, cls] = source(m);
              return viewMessage(m, i, tag, cls);
            })))));
    } catch (err) {
      requestPart.replaceChildren(el('p', {class: 'error'}, String(err.message || err)));
    }
  }

  function renderCompactions(part, c, marks) {
    const byRecord = seq => marks.find(m => seq > m.last_record - m.passes && seq <= m.last_record);
    let items;
    if (c.store) {
      // Passes of one compaction share its mark.
      const groups = [];
      for (const a of c.archived) {
        const mark = byRecord(a.seq);
        const last = groups[groups.length - 1];
        if (mark && last && last.mark === mark) last.passes.push(a);
        else groups.push({mark, passes: [a]});
      }
      items = groups.reverse().map(g => V.compaction({
        call: g.mark ? g.mark.call : null,
        title: (g.mark ? `before call ${g.mark.call}: request ${V.num(g.mark.request_tokens_before)} → ${V.num(g.mark.request_tokens_after)} tokens`
          : `compaction ${g.passes[0].seq}`) + ` (${g.passes[0].trigger})`,
        facts: g.mark ? `${g.mark.messages_before} → ${g.mark.messages_after} messages, ${g.mark.passes} pass(es)` : null,
        summary: g.passes[g.passes.length - 1].summary,
        passes: g.passes,
      }));
    } else {
      items = c.summary.length ? [V.compaction({
        title: `latest summary (${marks.length} compaction(s) seen)`,
        summary: c.summary,
        passes: [],
        note: 'not archived: the proxy runs without a session store (--store keeps what compaction replaced)',
      })] : [];
    }
    part.replaceChildren(el('h3', {}, `Compactions (${c.store ? c.archived.length + ' archived' : marks.length})`),
      ...(items.length ? items : [el('p', {class: 'muted'}, 'No compaction yet.')]));
  }

  // One matched line of a search hit: its number, then its text with the
  // query's words marked (the ranges are byte offsets into the UTF-8 text).
  function matchedLine(line) {
    const bytes = new TextEncoder().encode(line.text);
    const text = (a, b) => new TextDecoder().decode(bytes.slice(a, b));
    const parts = [el('span', {class: 'muted'}, `${line.line}: `)];
    let at = 0;
    for (const [start, end] of line.ranges) {
      if (start > at) parts.push(text(at, start));
      parts.push(el('mark', {}, text(start, end)));
      at = end;
    }
    if (at < bytes.length) parts.push(text(at));
    return el('div', {class: 'hit-line'}, ...parts);
  }

  // The session's archive, searched (the store's full-text search, as
  // context_search reads it); kept across polls.
  function searchBox() {
    const input = el('input', {type: 'text', placeholder: 'search this session\u2019s archive', 'aria-label': 'search'});
    const results = el('div', {class: 'search-results'});
    const form = el('form', {class: 'toolbar search'}, input, el('button', {type: 'submit'}, 'Search'));
    form.addEventListener('submit', async e => {
      e.preventDefault();
      const q = input.value.trim();
      if (!q || !selected) return;
      try {
        const r = await get(sessionPath(selected) + '/search/' + encodeURIComponent(q));
        results.replaceChildren(!r.store
          ? el('p', {class: 'muted'}, 'Search needs a session store (ctx serve --store).')
          : r.hits.length
            ? V.table(['message', 'handle', 'match'], r.hits.map(h => [`${h.role} (${h.source})`, el('code', {}, h.handle),
              el('pre', {}, h.lines.map(matchedLine))]), {class: 'hits'})
            : el('p', {class: 'muted hits-none'}, `No match for \u201c${q}\u201d.`));
      } catch (err) {
        results.replaceChildren(el('p', {class: 'error'}, String(err.message || err)));
      }
    });
    return el('div', {class: 'panel', id: 'search'}, form, results);
  }

  async function poll() {
    try {
      const [o, list] = await Promise.all([get('/ui/api/overview'), get('/ui/api/sessions')]);
      renderOverview(o);
      if (!selected && list.sessions.length) selected = {scope: list.sessions[0].scope, id: list.sessions[0].id};
      if (selected && !list.sessions.some(s => s.id === selected.id && s.scope === selected.scope)) selected = null;
      renderSessions(list);
      if (selected) {
        const d = await get(sessionPath(selected));
        const part = renderSession(d);
        const count = d.compactions.length;
        if (count !== shownCompactions) {
          const c = await get(sessionPath(selected) + '/compactions');
          renderCompactions(part, c, c.marks);
          shownCompactions = count;
        }
      } else {
        sessionPart.replaceChildren();
      }
      polls += 1;
      app.dataset.polls = String(polls);
      // When the first poll that drew a session's chart ended, in ms from
      // the page's start (read by the page's benchmark).
      if (selected && !app.dataset.firstRenderMs) app.dataset.firstRenderMs = String(Math.round(performance.now()));
      status.textContent = `updated ${new Date().toLocaleTimeString()} · you are: ${o.viewer}`;
      status.className = 'muted small';
    } catch (e) {
      status.textContent = String(e.message || e);
      status.className = 'error small';
    }
  }

  poll();
  setInterval(poll, POLL_MS);
})();
