// clef-bridge playground: what the page shows back, the answers as probability bars (side by side with their
// differences when two models answer) and the errors as the server words them; and the DOM helpers.

const DELTA_SCALE = 0.2; // the difference a half Δ track stands for

export const $ = (id) => document.getElementById(id);
export const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'text') node.textContent = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
};

// The server's error shapes (bridge/server/middleware.py): {"detail": {"error_type", "message"}}, a 422's
// {"detail": [{"loc", "msg", "type"}]}, the Workers AI envelope {"errors": [{"message", "code"}]},
// and, for other Jev servers, {"error": {...}} or {"error": "..."}.
export function describeError(status, body, text) {
  const out = { title: status ? `HTTP ${status}` : 'Network error', type: '', message: '', problems: [] };
  const detail = body && typeof body === 'object' ? body.detail : undefined;
  if (Array.isArray(detail)) {
    out.type = 'invalid request';
    out.message = `${detail.length} problem${detail.length === 1 ? '' : 's'} with the request`;
    out.problems = detail.map((p) => ({ loc: locText(p.loc), msg: p.msg ?? JSON.stringify(p), type: p.type ?? '' }));
  } else if (detail && typeof detail === 'object') {
    out.type = detail.error_type ?? '';
    out.message = detail.message ?? JSON.stringify(detail);
  } else if (typeof detail === 'string') {
    out.message = detail;
  } else if (body && Array.isArray(body.errors)) {
    out.message = body.errors.map((e) => e.message ?? JSON.stringify(e)).join('; ');
  } else if (body && body.error) {
    const e = body.error;
    out.type = typeof e === 'object' ? (e.type ?? e.error_type ?? e.code ?? '') : '';
    out.message = typeof e === 'object' ? (e.message ?? JSON.stringify(e)) : String(e);
  } else {
    out.message = (text || '').slice(0, 2000);
  }
  if (out.type) out.title += ` · ${out.type}`;
  return out;
}

function locText(loc) {
  if (!Array.isArray(loc)) return String(loc ?? '');
  const parts = loc[0] === 'body' ? loc.slice(1) : loc;
  return parts.map((p) => (typeof p === 'number' ? `[${p}]` : p)).join('.').replace(/\.\[/g, '[') || 'body';
}

// A failed request leaves the last answers on screen, marked as belonging to an earlier request.
export function markStale() {
  const box = $('answers');
  if (!box.querySelector('.answer') || box.classList.contains('stale')) return;
  box.classList.add('stale');
  box.prepend(el('p', { class: 'stale-note', text: 'Below: the answers to an earlier request.' }));
}

export function hideError() {
  $('error').hidden = true;
  $('error').replaceChildren();
}

export function showError(info) {
  const box = $('error');
  box.replaceChildren(el('p', { class: 'error-title', text: info.title }));
  if (info.message) box.append(el('p', { text: info.message }));
  if (info.problems?.length) {
    box.append(el('ul', {}, ...info.problems.map((p) => el('li', {},
      p.loc ? el('code', { text: p.loc }) : null, p.loc ? ' ' : null, p.msg,
      p.type ? el('span', { class: 'dim', text: ` (${p.type})` }) : null))));
  }
  box.hidden = false;
}

// --- answers ----------------------------------------------------------------------------------

const pct = (p) => `${(p * 100).toFixed(2)}%`;
function delta(d) {
  const v = (d * 100).toFixed(2);
  if (Number(v) === 0) return '±0.00 pp';
  return `${d > 0 ? '+' : '−'}${v.replace('-', '')} pp`;
}

// Options of one answer as [{key, label, p}] in the answer's order.
function optionsOf(answer) {
  if (!answer) return [];
  if (answer.type === 'noul') {
    return [{ key: 'true', label: 'true', p: answer.noul }, { key: 'false', label: 'false', p: 1 - answer.noul }];
  }
  const probs = answer.probabilities || {};
  return Object.keys(probs).map((k) => ({
    key: k,
    label: answer.type === 'score' && answer.legend ? `${k} · ${answer.legend[k] ?? ''}` : k,
    p: probs[k],
  }));
}

function summaryOf(answer) {
  if (!answer) return el('span', { class: 'dim', text: 'no answer' });
  if (answer.type === 'noul') {
    const yes = answer.noul >= 0.5;
    return el('span', {}, el('b', { text: yes ? 'true' : 'false' }),
      el('span', { class: 'dim', text: ` · p(true) ${pct(answer.noul)}` }));
  }
  if (answer.type === 'choice') {
    return el('span', {}, el('b', { text: answer.choice }),
      el('span', { class: 'dim', text: ` · confidence ${pct(answer.confidence)}` }));
  }
  if (answer.type === 'score') {
    const legend = answer.legend || {};
    const best = Object.entries(answer.probabilities || {}).sort((a, b) => b[1] - a[1])[0]?.[0];
    return el('span', {}, 'score ', el('b', { text: Number(answer.score).toFixed(2) }),
      el('span', { class: 'dim', text: ` · most likely ${best}${legend[best] ? ` (${legend[best]})` : ''} · confidence ${pct(answer.confidence)}` }));
  }
  return el('span', { text: JSON.stringify(answer) });
}

function meter(qid, opt, model, index, top) {
  const fill = el('span', { class: `fill fill-${index}${top ? ' top' : ''}` });
  fill.style.width = `${Math.max(0, Math.min(1, opt.p)) * 100}%`;
  return el('div', {
    class: 'bar', role: 'meter', 'aria-label': `${qid} ${opt.key}${index ? ` (${model})` : ''}`,
    'aria-valuemin': '0', 'aria-valuemax': '1', 'aria-valuenow': String(opt.p), 'aria-valuetext': pct(opt.p),
    'data-question': qid, 'data-option': opt.key, 'data-model': model, 'data-value': String(opt.p),
  }, fill);
}

export function renderAnswers(body, results) {
  const box = $('answers');
  box.replaceChildren();
  box.classList.remove('stale');
  const compare = results.length > 1;
  if (compare) {
    box.append(el('div', { class: 'legend' },
      ...results.map((r, i) => el('span', { class: 'legend-item' }, el('span', { class: `swatch fill-${i}` }),
        el('span', { text: r.model }))),
      el('span', { class: 'legend-item dim', text: `Δ = ${results[1].model} − ${results[0].model}` })));
  }
  for (const qid of Object.keys(body.questions)) {
    const answers = results.map((r) => r.response.answers?.[qid]);
    const type = answers.find(Boolean)?.type ?? body.questions[qid].type;
    const card = el('article', { class: 'answer', 'data-question': qid, 'aria-label': `Answer to ${qid}` });
    const head = el('header', {}, el('h3', {}, el('span', { text: qid }), ' ',
      el('span', { class: `badge badge-${type}`, text: type })));
    const summaries = el('div', { class: 'summaries' },
      ...answers.map((a, i) => el('div', { class: 'summary' },
        compare ? el('span', { class: `swatch fill-${i}` }) : null, summaryOf(a))));
    head.append(summaries);
    const instr = body.questions[qid].instructions;
    if (instr) head.append(el('p', { class: 'instructions', text: typeof instr === 'string' ? instr : JSON.stringify(instr) }));
    card.append(head);
    const rows = optionsOf(answers[0] || answers[1]);
    const table = el('div', { class: `bars${compare ? ' compare' : ''}`, role: 'group', 'aria-label': `${qid} probabilities` });
    if (compare) {
      table.append(el('span', { class: 'col-head', text: 'option' }), el('span', { class: 'col-head', text: 'probability' }),
        el('span', { class: 'col-head right', text: 'Δ (scale ±20 pp)' }));
    }
    for (const row of rows) {
      const opts = answers.map((a) => optionsOf(a).find((o) => o.key === row.key));
      const line = el('div', { class: 'bar-row', 'data-option': row.key });
      line.append(el('span', { class: 'opt-label', title: row.label, text: row.label }));
      const cells = el('div', { class: 'bar-cells' });
      opts.forEach((o, i) => {
        if (!o) return;
        const top = isTop(answers[i], o);
        cells.append(el('div', { class: 'bar-line' }, meter(qid, o, results[i].model, i, top),
          el('span', { class: `value${top ? ' top' : ''}`, 'aria-hidden': 'true', text: pct(o.p) })));
      });
      line.append(cells);
      if (compare && opts[0] && opts[1]) {
        const d = opts[1].p - opts[0].p;
        // half the track is 20 percentage points; a larger difference fills it and is marked
        const dBar = el('span', { class: `dfill ${d >= 0 ? 'pos' : 'neg'}${Math.abs(d) > DELTA_SCALE ? ' clamped' : ''}` });
        dBar.style.width = `${Math.min(50, (Math.abs(d) / DELTA_SCALE) * 50)}%`;
        line.append(el('div', { class: 'delta', 'data-delta': String(d), 'aria-label': `${qid} ${row.key} difference` },
          el('span', { class: 'dtrack', 'aria-hidden': 'true' }, dBar),
          el('span', { class: `dvalue ${Math.abs(d) < 0.00005 ? '' : d > 0 ? 'pos' : 'neg'}`, text: delta(d) })));
      }
      table.append(line);
    }
    card.append(table);
    box.append(card);
  }
  renderMeta(results);
}

function isTop(answer, opt) {
  if (!answer) return false;
  if (answer.type === 'noul') return (opt.key === 'true') === (answer.noul >= 0.5);
  if (answer.type === 'choice') return opt.key === answer.choice;
  const best = Object.entries(answer.probabilities || {}).sort((a, b) => b[1] - a[1])[0]?.[0];
  return opt.key === best;
}

function renderMeta(results) {
  const meta = $('meta');
  meta.replaceChildren();
  for (const [i, r] of results.entries()) {
    const res = r.response;
    const dl = el('dl', {});
    const add = (k, v) => dl.append(el('dt', { text: k }), el('dd', { text: v }));
    if (res.model) add('model', res.model);
    if (res.usage) {
      for (const [k, v] of Object.entries(res.usage)) add(k.replace(/_/g, ' '), String(v));
    }
    if (res.x_latency_ms !== undefined) add('latency', `${res.x_latency_ms} ms`);
    for (const [k, v] of Object.entries(res.x_timings || {})) {
      if (k === 'total_ms') continue;
      add(k.replace(/_ms$/, '').replace(/_/g, ' '), k.endsWith('_ms') ? `${v} ms` : String(v));
    }
    const section = el('section', { class: 'meta-block', 'aria-label': `Usage and timings${results.length > 1 ? ` of ${r.model}` : ''}` },
      el('h3', {}, results.length > 1 ? el('span', { class: `swatch fill-${i}` }) : null,
        results.length > 1 ? `${r.model}: usage and timings` : 'Usage and timings'), dl);
    const warnings = res.x_warnings;
    if (Array.isArray(warnings) && warnings.length) {
      section.append(el('ul', { class: 'warnings' }, ...warnings.map((w) => el('li', { text: typeof w === 'string' ? w : JSON.stringify(w) }))));
    }
    meta.append(section);
  }
  meta.hidden = false;
}
