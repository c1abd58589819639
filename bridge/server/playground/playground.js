// clef-bridge playground: one page, no build step, no dependencies. It talks only to its own origin
// (the clef-bridge server that serves it), with the same API and the same key a curl would use.
// ES modules (strict by themselves): this one holds the state and the wiring; playground-view.js draws the
// answers and errors, playground-code.js writes the request as curl, Python and JSON.

import { bodyJSON, curlTexts, openaiText, pythonText } from './playground-code.js';
import { $, describeError, el, hideError, markStale, renderAnswers, showError } from './playground-view.js';

const KEY_STORE = 'clef-bridge.playground.api-key';
// The router request of the API page (docs/api.md, "A router request"), its model aside: the picker names that
const ROUTER_EXAMPLE = {
  state: { prompt: 'Write a SQL query that finds duplicate invoices', history: [] },
  questions: {
    needs_tools: { type: 'noul', instructions: 'Does answering need tools or live data?' },
    model: {
      type: 'choice', instructions: 'Which model should answer?',
      criteria: { small: 'fast and cheap', large: 'strongest reasoning', code: 'programming' },
    },
    difficulty: {
      type: 'score', instructions: 'How hard is it?', criteria: ['trivial', 'easy', 'medium', 'hard', 'expert'],
    },
    domain: {
      type: 'choice', instructions: 'Which domain?',
      criteria: { tech: 'technical work', biz: 'business', chat: 'small talk' },
    },
  },
};
const MEDIA_TYPES = { image: 'image', audio: 'audio', video: 'video' };
// each kind's file input (its list and field ids follow: images-list, images-field)
const MEDIA_INPUTS = { image: 'images', audio: 'audio', video: 'videos' };

// --- state ------------------------------------------------------------------------------------

const ui = {
  models: [],          // /v1/models entries
  questions: [],       // {uid, id, type, instructions, criteria}
  images: [],          // {name, file, format, base64}
  audio: [],
  videos: [],
  nextUid: 1,
  busy: false,
  modelsKey: null,     // the API key the model list was last asked with
};

// --- API --------------------------------------------------------------------------------------

function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || '';
}

function headers(json) {
  const h = { Accept: 'application/json' };
  if (json) h['Content-Type'] = 'application/json';
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

class ApiError extends Error {
  constructor(status, body, text) {
    super(describeError(status, body, text).title);
    this.status = status;
    this.body = body;
    this.text = text;
  }
}

async function call(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (err) {
    throw new ApiError(0, null, `the server could not be reached (${err.message})`);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (response.status === 401) showKeyField();
  if (!response.ok) throw new ApiError(response.status, data, text);
  return data;
}

// --- models -----------------------------------------------------------------------------------

// Media a model takes: a list in x_media (or x_modalities / x_input_modalities); none when absent.
function mediaOf(model) {
  if (!model) return [];
  const list = model.x_media ?? model.x_modalities ?? model.x_input_modalities;
  return Array.isArray(list) ? list.filter((m) => m in MEDIA_TYPES) : [];
}

function modelByName(name) {
  return ui.models.find((m) => m.name === name);
}

async function loadModels() {
  ui.modelsKey = apiKey();
  const status = $('models-status');
  status.textContent = 'Loading models…';
  status.className = 'status-line';
  try {
    const data = await call('GET', '/v1/models');
    ui.models = Array.isArray(data?.models) ? data.models : [];
    fillModelPickers();
    status.textContent = ui.models.length ? '' : 'The server lists no models.';
    const warned = ui.models.filter((m) => Array.isArray(m.x_warnings) && m.x_warnings.length);
    if (warned.length) {
      status.className = 'status-line warn';
      // "model — warnings": a warning starts with its own code ("demo: ..."), so "name: " before it read "demo: demo:"
      status.textContent = `⚠ ${warned.map((m) => `${m.name} — ${m.x_warnings.join('; ')}`).join(' · ')}`;
    }
  } catch (err) {
    status.className = 'status-line bad';
    status.textContent = err.status === 401
      ? (apiKey() ? 'The server refused this API key: enter a valid one to list the models.'
        : 'This server wants an API key: enter it to list the models.')
      : `Could not list the models: ${err.message}`;
  }
  updateMedia();
  renderCode();
}

function fillModelPickers() {
  const primary = $('model');
  const compare = $('compare-model');
  const keepA = primary.value;
  const keepB = compare.value;
  primary.replaceChildren();
  compare.replaceChildren(el('option', { value: '', text: 'none' }));
  for (const m of ui.models) {
    const down = m.x_status && m.x_status !== 'ready' ? ` (${m.x_status})` : '';
    const label = m.name + down;
    primary.append(el('option', { value: m.name, text: label, title: m.description || '' }));
    compare.append(el('option', { value: m.name, text: label, title: m.description || '' }));
  }
  if (keepA && modelByName(keepA)) primary.value = keepA;
  if (keepB && modelByName(keepB)) compare.value = keepB;
  primary.disabled = !ui.models.length;
  compare.disabled = ui.models.length < 1;
}

function selectedModels() {
  const a = $('model').value;
  const b = $('compare-model').value;
  return b ? [a, b] : [a];
}

// --- API key ----------------------------------------------------------------------------------

function showKeyField(message) {
  const field = $('key-field');
  if (field.hidden) {
    field.hidden = false;
    $('api-key').value = apiKey();
    if (message) $('models-status').textContent = message;
    $('api-key').focus();
  }
}

function onKeyChange() {
  const key = $('api-key').value.trim();
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
  renderCode();
}

// --- media ------------------------------------------------------------------------------------

function updateMedia() {
  const picked = selectedModels().map(modelByName);
  const takes = (kind) => picked.length > 0 && picked.every((m) => mediaOf(m).includes(kind));
  $('images-field').hidden = !takes('image');
  $('audio-field').hidden = !takes('audio');
  $('videos-field').hidden = !takes('video');
  $('media').hidden = $('images-field').hidden && $('audio-field').hidden && $('videos-field').hidden;
}

function activeMedia() {
  const out = [];
  if (!$('images-field').hidden) out.push(...ui.images);
  if (!$('audio-field').hidden) out.push(...ui.audio);
  if (!$('videos-field').hidden) out.push(...ui.videos);
  return out;
}

// The formats the server takes, by kind, from a file's MIME type or its extension: the Jev asset's `format`
// (the server judges the real format from the bytes). Audio goes as WAV or MP3, what Clef-omni reads.
const FORMATS = {
  image: { 'image/png': 'png', 'image/jpeg': 'jpeg', 'image/webp': 'webp', png: 'png', jpg: 'jpeg', jpeg: 'jpeg',
    webp: 'webp' },
  audio: { 'audio/wav': 'wav', 'audio/x-wav': 'wav', 'audio/wave': 'wav', 'audio/vnd.wave': 'wav',
    'audio/mpeg': 'mp3', 'audio/mp3': 'mp3', wav: 'wav', mp3: 'mp3' },
  video: { 'video/mp4': 'mp4', 'video/quicktime': 'mov', 'video/webm': 'webm', 'video/x-matroska': 'mkv', mp4: 'mp4',
    m4v: 'mp4', mov: 'mov', webm: 'webm', mkv: 'mkv' },
};
const FORMAT_NAMES = { image: 'PNG, JPEG or WebP', audio: 'WAV or MP3', video: 'MP4, WebM or Matroska' };
const listOf = (kind) => (kind === 'image' ? ui.images : kind === 'audio' ? ui.audio : ui.videos);

function formatOf(kind, file) {
  const table = FORMATS[kind];
  return table[file.type] || table[(file.name.split('.').pop() || '').toLowerCase()] || '';
}

function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

async function onFiles(kind) {
  const input = $(MEDIA_INPUTS[kind]);
  const list = listOf(kind);
  const refused = [];
  for (const file of input.files) {
    const format = formatOf(kind, file);
    if (!format) {
      refused.push(file.name);
      continue;
    }
    const base64 = toBase64(await file.arrayBuffer());
    list.push({ kind, file, format, base64, name: `<${kind}${list.length + 1}>`, url: URL.createObjectURL(file) });
  }
  input.value = '';
  const note = $('media-error');
  note.hidden = !refused.length;
  note.textContent = refused.length
    ? `Left out ${refused.join(', ')}: ${MEDIA_INPUTS[kind]} go as ${FORMAT_NAMES[kind]}; convert first.`
    : '';
  renderMedia(kind);
  renderCode();
}

function renderMedia(kind) {
  const list = listOf(kind);
  const box = $(`${MEDIA_INPUTS[kind]}-list`);
  box.replaceChildren(...list.map((item, i) => el('div', { class: 'media-item' },
    kind === 'image' ? el('img', { src: item.url, alt: item.file.name })
                     : el(kind, { src: item.url, controls: true, 'aria-label': item.file.name }),
    el('code', { text: item.name }),
    el('span', { class: 'dim', text: `${item.file.name} · ${kb(item.file.size)}` }),
    el('button', { type: 'button', class: 'icon', 'aria-label': `Remove ${item.file.name}`, text: '✕',
      onclick: () => {
        URL.revokeObjectURL(item.url);
        list.splice(i, 1);
        list.forEach((it, j) => { it.name = `<${kind}${j + 1}>`; });
        renderMedia(kind);
        renderCode();
      } }))));
}

const kb = (n) => (n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`);

// --- questions --------------------------------------------------------------------------------

function newQuestion(type, init = {}) {
  const taken = new Set(ui.questions.map((q) => q.id));
  let n = ui.questions.length + 1;
  while (taken.has(`q${n}`)) n += 1;
  const criteria = type === 'choice' ? [{ name: '', desc: '' }, { name: '', desc: '' }]
    : type === 'score' ? ['', '', ''] : { true: '', false: '' };
  return { uid: ui.nextUid++, id: `q${n}`, type, instructions: '', criteria, ...init };
}

function addQuestion(type, init) {
  ui.questions.push(newQuestion(type, init));
  renderQuestions();
  renderCode();
  const items = $('questions').querySelectorAll('.question');
  items[items.length - 1]?.querySelector('.q-instructions')?.focus();
}

function renderQuestions() {
  const list = $('questions');
  list.replaceChildren(...ui.questions.map((q, i) => questionNode(q, i + 1)));
  $('no-questions').hidden = ui.questions.length > 0;
}

function questionNode(q, n) {
  const node = $('question-template').content.firstElementChild.cloneNode(true);
  const prefix = `Question ${n}`;
  node.dataset.uid = q.uid;
  node.dataset.type = q.type;
  node.querySelector('.q-title').textContent = prefix;
  node.querySelector('.badge').textContent = q.type;
  node.querySelector('.badge').classList.add(`badge-${q.type}`);
  const idInput = node.querySelector('.q-id');
  const instr = node.querySelector('.q-instructions');
  idInput.id = `q${q.uid}-id`;
  instr.id = `q${q.uid}-instructions`;
  node.querySelector('.lbl-id').htmlFor = idInput.id;
  node.querySelector('.lbl-instructions').htmlFor = instr.id;
  idInput.setAttribute('aria-label', `${prefix} id`);
  instr.setAttribute('aria-label', `${prefix} instructions`);
  idInput.value = q.id;
  instr.value = q.instructions;
  instr.placeholder = { noul: 'A yes/no question, e.g. Does the customer ask for a refund?',
    choice: 'e.g. Which team should handle it?', score: 'e.g. How urgent is it?' }[q.type];
  idInput.addEventListener('input', () => { q.id = idInput.value; renderCode(); });
  instr.addEventListener('input', () => { q.instructions = instr.value; renderCode(); });
  const tools = [['.q-up', `Move ${prefix} up`, -1], ['.q-down', `Move ${prefix} down`, 1]];
  for (const [sel, label, delta] of tools) {
    const b = node.querySelector(sel);
    b.setAttribute('aria-label', label);
    b.title = label;
    const j = n - 1 + delta;
    b.disabled = j < 0 || j >= ui.questions.length;
    b.addEventListener('click', () => {
      const [moved] = ui.questions.splice(n - 1, 1);
      ui.questions.splice(j, 0, moved);
      renderQuestions();
      renderCode();
    });
  }
  const remove = node.querySelector('.q-remove');
  remove.setAttribute('aria-label', `Remove ${prefix}`);
  remove.title = `Remove ${prefix}`;
  remove.addEventListener('click', () => {
    ui.questions = ui.questions.filter((x) => x !== q);
    renderQuestions();
    renderCode();
  });
  node.querySelector('.criteria').append(criteriaEditor(q, prefix));
  return node;
}

function textInput(label, value, onInput, attrs = {}) {
  const input = el('input', { type: 'text', 'aria-label': label, autocomplete: 'off', ...attrs });
  input.value = value;
  input.addEventListener('input', () => { onInput(input.value); renderCode(); });
  return input;
}

function criteriaEditor(q, prefix) {
  if (q.type === 'noul') {
    const details = el('details', { class: 'noul-criteria' },
      el('summary', { text: 'Describe true / false (optional)' }),
      el('div', { class: 'rows' },
        ...['true', 'false'].map((k) => el('div', { class: 'row' },
          el('span', { class: `pill pill-${k}`, text: k }),
          textInput(`${prefix} ${k} description`, q.criteria[k], (v) => { q.criteria[k] = v; },
            { placeholder: `the server's default: the answer is ${k === 'true' ? 'yes' : 'no'}`, class: 'grow' })))));
    if (q.criteria.true || q.criteria.false) details.open = true;
    return details;
  }
  if (q.type === 'choice') {
    const rows = el('div', { class: 'rows' });
    q.criteria.forEach((opt, i) => {
      const label = `${prefix} option ${i + 1}`;
      rows.append(el('div', { class: 'row' },
        textInput(`${label} name`, opt.name, (v) => { opt.name = v; },
          { placeholder: `option ${i + 1}`, class: 'opt-name', spellcheck: 'false' }),
        textInput(`${label} description`, opt.desc, (v) => { opt.desc = v; },
          { placeholder: 'description (optional)', class: 'grow' }),
        removeRowButton(`Remove ${label}`, q, i)));
    });
    rows.append(el('button', { type: 'button', class: 'small', text: '+ option',
      'aria-label': `${prefix}: add option`,
      onclick: () => { q.criteria.push({ name: '', desc: '' }); rerenderAndFocus(q, 'option'); } }));
    return rows;
  }
  const rows = el('ol', { class: 'rows levels', start: 0 });
  q.criteria.forEach((level, i) => {
    const label = `${prefix} level ${i}`;
    rows.append(el('li', { class: 'row' },
      el('span', { class: 'level-num', text: String(i), 'aria-hidden': 'true' }),
      textInput(label, level, (v) => { q.criteria[i] = v; },
        { placeholder: i === 0 ? 'lowest level, e.g. not at all' : `level ${i}`, class: 'grow' }),
      removeRowButton(`Remove ${label}`, q, i)));
  });
  return el('div', { class: 'rows' }, rows, el('button', { type: 'button', class: 'small', text: '+ level',
    'aria-label': `${prefix}: add level`,
    onclick: () => { q.criteria.push(''); rerenderAndFocus(q, 'level'); } }));
}

function removeRowButton(label, q, i) {
  return el('button', { type: 'button', class: 'icon', 'aria-label': label, title: label, text: '✕',
    onclick: () => { q.criteria.splice(i, 1); renderQuestions(); renderCode(); } });
}

function rerenderAndFocus(q) {
  renderQuestions();
  renderCode();
  const node = $('questions').querySelector(`[data-uid="${q.uid}"]`);
  const inputs = node?.querySelectorAll('.criteria input[type=text]');
  if (q.type === 'choice') inputs?.[inputs.length - 2]?.focus();
  else inputs?.[inputs.length - 1]?.focus();
}

// --- the request ------------------------------------------------------------------------------

function stateFormat() {
  return document.querySelector('input[name=state-format]:checked').value;
}

// The body for one model, or {problems} when the form cannot make a valid request yet.
function buildBody(model) {
  const problems = [];
  let state = $('state').value;
  $('state-error').hidden = true;
  if (stateFormat() === 'json') {
    try {
      state = JSON.parse(state);
    } catch (err) {
      problems.push(`state: not valid JSON (${err.message})`);
      $('state-error').textContent = `Not valid JSON: ${err.message}`;
      $('state-error').hidden = false;
    }
  }
  const questions = {};
  const ids = new Set();
  ui.questions.forEach((q, i) => {
    const where = `question ${i + 1}`;
    if (ids.has(q.id)) problems.push(`${where}: the id "${q.id}" is used twice`);
    ids.add(q.id);
    const out = { type: q.type };
    if (q.instructions.trim()) out.instructions = q.instructions;
    if (q.type === 'noul') {
      const c = {};
      for (const k of ['true', 'false']) if (q.criteria[k].trim()) c[k] = q.criteria[k];
      if (Object.keys(c).length) out.criteria = c;
    } else if (q.type === 'choice') {
      const c = {};
      for (const opt of q.criteria) {
        const name = opt.name.trim();
        if (!name) continue;
        if (name in c) problems.push(`${where}: the option "${name}" is listed twice`);
        c[name] = opt.desc.trim() ? opt.desc : null;
      }
      if (Object.keys(c).length < 2) problems.push(`${where}: a choice needs at least 2 named options`);
      out.criteria = c;
    } else {
      const levels = q.criteria.filter((l) => l.trim());
      if (levels.length < 2) problems.push(`${where}: a score needs at least 2 levels`);
      out.criteria = levels;
    }
    questions[q.id] = out;
  });
  if (!ui.questions.length) problems.push('add at least one question');
  const body = { model, state, questions };
  const media = activeMedia();
  if (media.length) {
    // Jev assets: {"type": "image", "format": "png" | "jpeg" | "webp", "data_base64"} and
    // {"type": "audio", "format": "wav" | "mp3", "data_base64"}, {"type": "video", "format": "mp4" | "webm" | ...},
    // named <image1>, <audio1>, <video1>, ... in the state
    body.assets = Object.fromEntries(media.map((m) => [m.name,
      { type: m.kind, format: m.format, data_base64: m.base64 }]));
  }
  return { body, problems };
}

function renderCode() {
  const models = selectedModels().filter(Boolean);
  const { body } = buildBody(models[0] || 'MODEL');
  $('code-curl').textContent = curlCommands(models.length ? models : ['MODEL'], true);
  $('code-python').textContent = pythonText(body, models.length ? models : ['MODEL'], activeMedia());
  $('code-json').textContent = bodyJSON(body, true);
  $('code-openai').textContent = openaiText(body, models.length ? models : ['MODEL'], activeMedia());
}

function selectTab(tab) {
  for (const t of document.querySelectorAll('[role=tab]')) {
    const on = t === tab;
    t.setAttribute('aria-selected', String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute('aria-controls')).hidden = !on;
  }
}

async function copyText(text, what) {
  const status = $('copy-status');
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    const area = el('textarea', { 'aria-hidden': 'true', class: 'offscreen' });
    area.value = text;
    document.body.append(area);
    area.select();
    try { ok = document.execCommand('copy'); } catch { ok = false; }
    area.remove();
  }
  status.textContent = ok ? `Copied ${what}.` : `Could not copy: select the text below instead.`;
  setTimeout(() => { if (status.textContent.startsWith('Copied')) status.textContent = ''; }, 4000);
}

// The curl command for each model, the screen's (shortened) and the copy's alike; every name goes into the body
// (JSON in a quoted here-document), never into shell text of its own.
function curlCommands(models, shorten) {
  return curlTexts(models.map((m) => buildBody(m).body), { shorten, withKey: Boolean(apiKey()) });
}

function fullCurl() {
  return curlCommands(selectedModels().filter(Boolean), false);
}

// --- sending ----------------------------------------------------------------------------------

async function send() {
  if (ui.busy) return;
  const models = selectedModels().filter(Boolean);
  const status = $('send-status');
  if (!models.length) {
    status.textContent = 'Pick a model first.';
    return;
  }
  const bodies = models.map((m) => buildBody(m));
  if (bodies[0].problems.length) {
    showError({ title: 'The request is not complete', message: '', problems: bodies[0].problems.map((p) => ({ loc: '', msg: p })) });
    return;
  }
  ui.busy = true;
  $('send').disabled = true;
  $('send').setAttribute('aria-busy', 'true');
  status.textContent = models.length > 1 ? `Asking ${models.join(' and ')}…` : `Asking ${models[0]}…`;
  hideError();
  const started = performance.now();
  const settled = await Promise.allSettled(bodies.map((b) => call('POST', '/v1/systemone', b.body)));
  const elapsed = performance.now() - started;
  ui.busy = false;
  $('send').disabled = false;
  $('send').removeAttribute('aria-busy');
  const failed = settled.map((s, i) => [s, models[i]]).filter(([s]) => s.status === 'rejected');
  if (failed.length) {
    const [s, model] = failed[0];
    const err = s.reason;
    const info = err instanceof ApiError ? describeError(err.status, err.body, err.text)
      : { title: 'Error', message: String(err), problems: [] };
    if (models.length > 1) info.title = `${model}: ${info.title}`;
    showError(info);
    markStale();
  }
  const ok = settled.map((s, i) => ({ model: models[i], response: s.status === 'fulfilled' ? s.value : null }));
  if (ok.some((r) => r.response)) {
    renderAnswers(bodies[0].body, ok.filter((r) => r.response));
    status.textContent = `Answered in ${Math.round(elapsed)} ms.`;
  } else {
    status.textContent = 'No answer.';
  }
}

// --- example ----------------------------------------------------------------------------------

function loadExample() {
  $('state').value = JSON.stringify(ROUTER_EXAMPLE.state);
  document.querySelector('input[name=state-format][value=json]').checked = true;
  ui.questions = [];
  for (const [id, q] of Object.entries(ROUTER_EXAMPLE.questions)) {
    const init = { instructions: q.instructions };
    if (q.type === 'choice') init.criteria = Object.entries(q.criteria).map(([name, desc]) => ({ name, desc }));
    if (q.type === 'score') init.criteria = [...q.criteria];
    ui.questions.push({ ...newQuestion(q.type, init), id });
  }
  renderQuestions();
  renderCode();
}

// --- wiring -----------------------------------------------------------------------------------

function init() {
  for (const b of document.querySelectorAll('[data-add]')) {
    b.setAttribute('aria-label', `Add ${b.dataset.add} question`);
    b.addEventListener('click', () => addQuestion(b.dataset.add));
  }
  $('load-example').addEventListener('click', loadExample);
  $('state').addEventListener('input', renderCode);
  for (const r of document.querySelectorAll('input[name=state-format]')) r.addEventListener('change', renderCode);
  $('model').addEventListener('change', () => { updateMedia(); renderCode(); });
  $('compare-model').addEventListener('change', () => { updateMedia(); renderCode(); });
  $('api-key').addEventListener('input', onKeyChange);
  // a new key reloads the models; the change event that leaving the field fires again does not (a reload
  // there shifts the page under the click that left it)
  $('api-key').addEventListener('change', () => { onKeyChange(); if (apiKey() !== ui.modelsKey) loadModels(); });
  $('images').addEventListener('change', () => onFiles('image'));
  $('audio').addEventListener('change', () => onFiles('audio'));
  $('videos').addEventListener('change', () => onFiles('video'));
  $('send').addEventListener('click', send);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
  });
  for (const t of document.querySelectorAll('[role=tab]')) {
    t.addEventListener('click', () => selectTab(t));
    t.addEventListener('keydown', (e) => {
      if (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft') return;
      const tabs = [...document.querySelectorAll('[role=tab]')];
      const next = tabs[(tabs.indexOf(t) + (e.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length];
      selectTab(next);
      next.focus();
    });
  }
  $('copy-curl').addEventListener('click', () => copyText(fullCurl(), 'the curl command'));
  $('copy-python').addEventListener('click', () => {
    const models = selectedModels().filter(Boolean);
    copyText(pythonText(buildBody(models[0] || 'MODEL').body, models.length ? models : ['MODEL'], activeMedia()), 'the Python code');
  });
  $('copy-openai').addEventListener('click', () => copyText($('code-openai').textContent, 'the OpenAI code'));
  if (apiKey()) { $('key-field').hidden = false; $('api-key').value = apiKey(); }
  renderQuestions();
  renderCode();
  loadModels();
}

init();
