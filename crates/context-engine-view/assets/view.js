// The view components both pages share: the per-call chart, figure cards,
// the cost table, a compaction (its summary beside the messages it
// replaced), the retention lists, a message. DOM calls only: every text is
// set as text (createTextNode / textContent), never parsed as HTML.
'use strict';

const CtxView = (function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const STATE_RECORD = '## State record';

  // An element: el('td', {class: 'num'}, 'text', child, ...).
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null && v !== false) node.setAttribute(k, String(v));
    }
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
    }
  }

  // 1234567 -> "1,234,567"; figures are whole numbers.
  function num(n) {
    return Math.round(Number(n) || 0).toLocaleString('en-US');
  }

  function pct(x) {
    return (Number(x) * 100).toFixed(0) + '%';
  }

  function money(x) {
    x = Number(x) || 0;
    return '$' + (x < 0.1 ? x.toFixed(4) : x.toFixed(2));
  }

  // "-42%" from before to after.
  function change(before, after) {
    if (!(before > 0)) return '';
    const p = (after - before) / before * 100;
    return Math.abs(p) < 0.05 ? 'same' : (p > 0 ? '+' : '') + p.toFixed(0) + '%';
  }

  // A figure card; `key` names the figure for tests (data-figure).
  function card(label, value, key, sub) {
    return el('div', {class: 'card'},
      el('div', {class: 'label'}, label),
      el('div', {class: 'value', 'data-figure': key}, value),
      sub ? el('div', {class: 'sub'}, sub) : null);
  }

  // The per-call chart. `calls`: [{client, upstream, compaction, digest,
  // prune, label}], one point per call; `opts`: {window, threshold}.
  function chart(calls, opts) {
    opts = opts || {};
    const W = 1000, H = 300, L = 64, R = 16, T = 14, B = 34;
    const n = calls.length;
    const top = Math.max(1, opts.window || 0, ...calls.map(c => Math.max(c.client || 0, c.upstream || 0))) * 1.05;
    const x = i => L + (n <= 1 ? (W - L - R) / 2 : i * (W - L - R) / (n - 1));
    const y = v => T + (H - T - B) * (1 - v / top);
    const root = svg('svg', {class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': 'prompt tokens per call: what the client sent and what went upstream'});
    // Axes and grid.
    for (let k = 0; k <= 4; k++) {
      const v = top / 1.05 * k / 4;
      root.appendChild(svg('line', {class: 'axis', x1: L, x2: W - R, y1: y(v), y2: y(v)}));
      root.appendChild(svg('text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end'}, num(v)));
    }
    const ticks = Math.min(n, 10);
    for (let k = 0; k < ticks; k++) {
      const i = Math.round(k * (n - 1) / Math.max(1, ticks - 1));
      root.appendChild(svg('text', {x: x(i), y: H - B + 16, 'text-anchor': 'middle'}, String(i + 1)));
    }
    root.appendChild(svg('text', {x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle'}, 'model call'));
    // Window and threshold.
    const level = (v, cls, label) => {
      if (!(v > 0)) return;
      root.appendChild(svg('line', {class: cls, x1: L, x2: W - R, y1: y(v), y2: y(v)}));
      root.appendChild(svg('text', {x: W - R - 4, y: y(v) - 4, 'text-anchor': 'end'}, `${label} ${num(v)}`));
    };
    level(opts.window, 'window', 'window');
    level(opts.threshold, 'threshold', 'threshold');
    // Compactions: a line across, before the call they ran before.
    calls.forEach((c, i) => {
      if (c.compaction) {
        root.appendChild(svg('line', {class: 'mark-compaction', x1: x(i), x2: x(i), y1: T, y2: H - B},
          svg('title', {}, `compaction before call ${i + 1}`)));
      }
    });
    const path = key => calls.map((c, i) => `${x(i).toFixed(1)},${y(c[key] || 0).toFixed(1)}`).join(' ');
    if (n > 0) {
      root.appendChild(svg('polyline', {class: 'client', points: path('client')}));
      root.appendChild(svg('polyline', {class: 'upstream', points: path('upstream')}));
    }
    // One point per call, with its figures; digests and prunes marked
    // under the axis.
    const g = svg('g', {class: 'points'});
    calls.forEach((c, i) => {
      const tip = `call ${i + 1}: client ${num(c.client)}, upstream ${num(c.upstream)} tokens` +
        (c.compaction ? ', after a compaction' : '') + (c.digest ? ', digested' : '') + (c.prune ? ', pruned' : '') +
        (c.label ? ` (${c.label})` : '');
      g.appendChild(svg('circle', {class: 'point', cx: x(i), cy: y(c.upstream || 0), r: n > 200 ? 1.6 : 3,
        'data-call': i + 1}, svg('title', {}, tip)));
      if (c.digest) g.appendChild(svg('rect', {class: 'mark-digest', x: x(i) - 1.5, y: H - B - 6, width: 3, height: 5}));
      if (c.prune) g.appendChild(svg('path', {class: 'mark-prune', d: `M${x(i) - 3},${H - B - 8} l6,0 l-3,-6 z`}));
    });
    root.appendChild(g);
    const legend = el('div', {class: 'legend'},
      el('span', {style: '--c: var(--client)'}, 'sent by the client'),
      el('span', {style: '--c: var(--upstream)'}, 'sent upstream'),
      el('span', {style: '--c: var(--compaction)'}, 'compaction'),
      el('span', {style: '--c: var(--digest)'}, 'digested'),
      el('span', {style: '--c: var(--prune)'}, 'pruned'),
      opts.window > 0 ? el('span', {style: '--c: var(--window)'}, 'window') : null,
      opts.threshold > 0 ? el('span', {style: '--c: var(--threshold)'}, 'compaction threshold') : null);
    return el('div', {class: 'panel'}, root, legend);
  }

  // A table from a header row and rows of cells (strings or nodes); cells
  // whose header starts with '#' are numeric.
  function table(header, rows, attrs) {
    const numeric = header.map(h => h.startsWith('#'));
    return el('table', attrs || {},
      el('thead', {}, el('tr', {}, header.map((h, i) => el('th', {class: numeric[i] ? 'num' : null}, h.replace(/^#/, ''))))),
      el('tbody', {}, rows.map(r => el('tr', {}, r.map((c, i) => el('td', {class: numeric[i] ? 'num' : null}, c))))));
  }

  // The bill of the three policies (the replay's `costs`).
  function costTable(costs) {
    const lines = [
      ['unmanaged agent', costs.unmanaged],
      ['digest every call', costs.every_call_digest],
      ['scheduled (this engine)', costs.scheduled],
    ];
    return el('div', {class: 'panel'}, table(
      ['policy', '#estimated cost', '#change', '#prompt tokens', '#cache hits', '#cache breaks', '#re-sent after breaks', '#compactions'],
      lines.map(([name, l]) => [name, money(l.estimated_cost), change(costs.unmanaged.estimated_cost, l.estimated_cost),
        num(l.prompt_tokens), pct(l.cache_hit_share), String(l.cache_breaks), num(l.resent_tokens) + ' tokens',
        String(l.compactions)]),
      {class: 'costs'}));
  }

  // A message's text: its content (a string or text parts), then its tool
  // calls as name(arguments).
  function messageText(m) {
    let text = '';
    if (typeof m.content === 'string') text = m.content;
    else if (Array.isArray(m.content)) {
      text = m.content.map(p => typeof p === 'string' ? p : (p.text ?? (p.type ? `[${p.type}]` : ''))).join('\n');
    }
    for (const call of m.tool_calls || []) {
      const f = call.function || {};
      text += (text ? '\n' : '') + `→ ${f.name || '?'}(${f.arguments || ''})`;
    }
    return text;
  }

  function message(m, index) {
    const role = String(m.role || '?');
    const who = [role, m.name, m.tool_call_id ? `result of ${m.tool_call_id}` : null,
      index !== undefined ? `#${index}` : null].filter(Boolean).join(' · ');
    return el('div', {class: `message ${role}`}, el('div', {class: 'role'}, who), el('pre', {}, messageText(m)));
  }

  // A summary message as the model received it: the prose, then its state
  // record apart.
  function summaryMessage(m) {
    const text = messageText(m);
    const at = text.indexOf(STATE_RECORD);
    const body = at < 0 ? [el('pre', {class: 'summary-text'}, text)]
      : [el('pre', {class: 'summary-text'}, text.slice(0, at).trimEnd()),
        el('pre', {class: 'state-record'}, text.slice(at))];
    return el('div', {class: `message ${m.role} summary`}, el('div', {class: 'role'}, `${m.role} · summary`), body);
  }

  // One compaction: `c` = {title, facts: [..], summary: [messages],
  // passes: [{seq, handle, start, end, replaced: [messages]}], note}.
  function compaction(c) {
    const replaced = (c.passes || []).flatMap(p => p.replaced || []);
    const left = el('div', {class: 'summary'}, el('h3', {}, 'Summary as the model received it'),
      c.summary && c.summary.length ? c.summary.map(summaryMessage) : el('p', {class: 'muted'}, 'no summary message in the request'));
    const right = el('div', {class: 'replaced'},
      el('h3', {}, `Messages it replaced (${replaced.length})`),
      (c.passes || []).map(p => el('p', {class: 'muted small'},
        `pass ${p.seq}: input messages ${p.start}–${p.end - 1}, archived under `, el('code', {}, p.handle),
        ` (${num(p.tokens_before)} → ${num(p.tokens_after)} tokens)`)),
      replaced.length ? el('div', {class: 'list'}, replaced.map((m, i) => message(m, i)))
        : el('p', {class: 'muted'}, c.note || 'not archived: no session store'));
    return el('section', {class: 'compaction', 'data-call': c.call},
      el('h3', {}, c.title), c.facts ? el('p', {class: 'muted small'}, c.facts) : null,
      el('div', {class: 'sides'}, left, right));
  }

  const KIND = {user_ask: 'user ask', file_path: 'file', command: 'command', error_message: 'error'};

  // The retention counts and every lost or recallable fact.
  function retention(r) {
    const rows = [['verbatim in the request', r.verbatim], ['in a summary', r.in_summary],
      ['recallable through a handle', r.recallable], ['lost', r.lost]];
    const probes = (list, cls) => list.length
      ? table(['kind', '#message', 'fact'], list.map(p => [KIND[p.kind] || p.kind, String(p.source_index), el('code', {}, p.text)]), {class: cls})
      : el('p', {class: 'muted ' + cls}, 'none');
    return el('div', {class: 'panel retention'},
      el('p', {}, `Of ${num(r.probes)} facts in the session (user asks, files touched, commands, errors), the last request has:`),
      table(['where', '#facts'], rows.map(([k, v]) => [k, el('span', {'data-figure': 'retention_' + k.split(' ')[0]}, num(v))])),
      el('h3', {style: 'margin-top: 12px'}, `Lost (${r.lost})`), probes(r.lost_probes || [], 'lost'),
      el('h3', {style: 'margin-top: 12px'}, `Recallable (${r.recallable})`), probes(r.recallable_probes || [], 'recallable'));
  }

  return {el, svg, num, pct, money, change, card, chart, table, costTable, message, messageText, summaryMessage,
    compaction, retention};
})();
