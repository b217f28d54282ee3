// `ctx replay --html`: draws the report embedded in the file (the JSON
// `ctx replay --json` prints), offline.
'use strict';

(function () {
  const V = CtxView;
  const el = V.el;
  const app = document.getElementById('app');
  let r;
  try {
    r = JSON.parse(document.getElementById('report').textContent);
  } catch (e) {
    app.replaceChildren(el('p', {class: 'error'}, 'The embedded report does not parse: ' + e.message));
    return;
  }
  const t = r.totals;
  const TRIGGER = {preflight: 'before', post_tool: 'after tools, before', manual: 'manual, before'};

  const parts = [
    el('h1', {}, r.file || 'replay'),
    el('p', {class: 'muted'},
      `${V.num(t.calls)} model calls replayed through engine “${r.engine}”; window ${V.num(r.context_length)} tokens, ` +
      `compaction at ${V.num(r.threshold_tokens)} tokens; prices: ${r.price.name}.`),
    el('div', {class: 'cards'},
      V.card('model calls', V.num(t.calls), 'calls'),
      V.card('prompt tokens without engine', V.num(t.prompt_tokens_without_engine), 'prompt_tokens_without_engine'),
      V.card('prompt tokens with engine', V.num(t.prompt_tokens_with_engine), 'prompt_tokens_with_engine',
        V.change(t.prompt_tokens_without_engine, t.prompt_tokens_with_engine)),
      V.card('largest request', V.num(t.largest_request_with_engine), 'largest_request_with_engine',
        `without engine ${V.num(t.largest_request_without_engine)}`),
      V.card('estimated cost', V.money(t.estimated_cost_with_engine), 'estimated_cost_with_engine',
        `without engine ${V.money(t.estimated_cost_without_engine)}`),
      V.card('prompt-cache hits', V.pct(t.cache_hit_share), 'cache_hit_share',
        `without engine ${V.pct(t.cache_hit_share_without_engine)}`),
      V.card('compactions', V.num(t.compactions), 'compactions',
        t.thrash_calls && t.thrash_calls.length ? `${t.thrash_calls.length} thrash (calls ${t.thrash_calls.join(', ')})` : ''),
      t.ledger_cut_calls && t.ledger_cut_calls.length ? V.card('state record cut', V.num(t.ledger_cut_calls.length),
        'ledger_cut_calls', `the window could not hold it whole: calls ${t.ledger_cut_calls.join(', ')}`) : null,
      V.card('digested requests', V.num(t.selected), 'selected', `pruned before ${V.num(t.prunes)} calls`)),
    el('h2', {}, 'Prompt tokens per model call'),
    V.chart(r.calls.map(c => ({
      client: c.tokens_without_engine,
      upstream: c.tokens_with_engine,
      compaction: !!c.compaction,
      digest: !!c.selected,
      prune: c.pruned > 0,
    })), {window: r.context_length, threshold: r.threshold_tokens}),
    r.costs ? el('h2', {}, 'The bill of three policies') : null,
    r.costs ? V.costTable(r.costs) : null,
    el('h2', {}, `Compactions (${r.compactions.length})`),
    r.compactions.length ? null : el('p', {class: 'muted'}, 'The session never compacted.'),
    r.compactions.map(c => V.compaction({
      call: c.call + 1,
      title: `${TRIGGER[c.trigger] || c.trigger} call ${c.call + 1}: request ${V.num(c.request_tokens_before)} → ${V.num(c.request_tokens_after)} tokens`,
      facts: `history ${V.num(c.tokens_before)} → ${V.num(c.tokens_after)} tokens, ${c.messages_before} → ${c.messages_after} messages, ` +
        `${c.passes} pass(es); right after it ${c.retention.lost} of ${c.retention.probes} facts lost, ${c.retention.recallable} recallable`,
      summary: c.summary,
      passes: c.archived,
      note: 'not archived: replayed without a session store (--no-store)',
    })),
    el('h2', {}, 'What survived'),
    V.retention(r.retention),
  ];
  app.replaceChildren(...parts.flat().filter(Boolean));
})();
