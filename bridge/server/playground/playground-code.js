// clef-bridge playground: the request on screen as a curl command, as Python for the official SDK
// (typesafe-sdk) and as its JSON body; the views shorten base64, the copies are whole.

// A value as one POSIX shell word: single quotes keep every character literal ($, `, \, newlines), and a quote
// itself closes the word, is escaped, and reopens it (' -> '\'').
export const shellQuote = (s) => `'${String(s).replace(/'/g, `'\\''`)}'`;

// JSON or Python text with every control, format (bidi among them), separator or unpaired surrogate character
// written as its \u escape, which both languages read back as the same string: what the page shows is what runs,
// and nothing in a name or a state can reorder or hide the text around it. A newline stays (the layout's own; in a
// string JSON.stringify has escaped it already). Beyond the BMP, JSON takes a surrogate pair, Python one \U escape.
const INVISIBLE = /(?!\n)[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/gu;
const hex = (n, width) => n.toString(16).padStart(width, '0');
const escaped = (ch, python) => (python && ch.length > 1 ? `\\U${hex(ch.codePointAt(0), 8)}`
  : Array.from({ length: ch.length }, (_, i) => `\\u${hex(ch.charCodeAt(i), 4)}`).join(''));
export const visible = (text, python = false) => text.replace(INVISIBLE, (ch) => escaped(ch, python));

const literal = (value) => visible(JSON.stringify(value), true); // a Python str literal

export function bodyJSON(body, shorten) {
  return visible(JSON.stringify(body, (k, v) => (shorten && k === 'data_base64' && typeof v === 'string'
    && v.length > 48 ? `${v.slice(0, 24)}…(${v.length} base64 characters)` : v), 2));
}

// withKey: the server wants a key; the command reads it from $CLEF_API_KEY, never holds it
export function curlText(body, { shorten = false, withKey = false } = {}) {
  const url = `${location.origin}/v1/systemone`;
  const lines = [`curl -sS --fail-with-body ${shellQuote(url)} \\`, `  -H 'Content-Type: application/json' \\`];
  if (withKey) lines.push(`  -H "Authorization: Bearer $CLEF_API_KEY" \\`);
  // the quoted delimiter keeps the body literal; pretty JSON indents every line but its braces, so no line of it
  // can end the here-document early
  lines.push(`  --data-binary @- <<'JSON'`, bodyJSON(body, shorten), 'JSON');
  return lines.join('\n');
}

// One curl command per body (compare mode sends the same request to each model), each complete, as a shell runs
// them one after the other: the screen shows the same commands as the copy, base64 shortened.
export function curlTexts(bodies, options = {}) {
  return bodies.map((body) => curlText(body, options)).join('\n\n');
}

// A JSON value as a Python literal (JSON string escapes are valid Python string escapes).
function py(value, indent = 0) {
  const pad = ' '.repeat(indent + 4);
  const end = ' '.repeat(indent);
  if (value === null || value === undefined) return 'None';
  if (value === true) return 'True';
  if (value === false) return 'False';
  if (typeof value === 'number' || typeof value === 'string') return literal(value);
  if (Array.isArray(value)) {
    if (!value.length) return '[]';
    const flat = `[${value.map((v) => py(v)).join(', ')}]`;
    if (flat.length <= 80 - indent && !flat.includes('\n')) return flat;
    return `[\n${value.map((v) => pad + py(v, indent + 4)).join(',\n')},\n${end}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return '{}';
  const flat = `{${entries.map(([k, v]) => `${literal(k)}: ${py(v)}`).join(', ')}}`;
  if (flat.length <= 80 - indent && !flat.includes('\n')) return flat;
  return `{\n${entries.map(([k, v]) => `${pad}${literal(k)}: ${py(v, indent + 4)}`).join(',\n')},\n${end}}`;
}

// media: the files sent with the request ({kind, name, file}), by their placeholder names
export function pythonText(body, models, media) {
  const cls = { noul: 'Noul', choice: 'Choice', score: 'Score' };
  const used = new Set(Object.values(body.questions).map((q) => cls[q.type]));
  const images = media.filter((m) => m.kind === 'image');
  const audio = media.filter((m) => m.kind === 'audio');
  const videos = media.filter((m) => m.kind === 'video');
  const imports = [...used, ...(images.length ? ['Image'] : []), 'TypeSafeClient'].sort();
  const out = ['import os'];
  if (images.length) out.push('from pathlib import Path');
  out.push('', `from typesafe_sdk import ${imports.join(', ')}`, '');
  out.push('with TypeSafeClient(');
  out.push('    api_key=os.environ.get("CLEF_API_KEY", "local"),  # any key when the server runs without auth');
  out.push(`    base_url=${literal(location.origin)},`);
  out.push(') as client:');
  for (const model of models) {
    const target = models.length > 1 ? `results[${literal(model)}]` : 'result';
    if (models.length > 1 && model === models[0]) out.push('    results = {}');
    out.push(`    ${target} = client.system_one(`);
    out.push(`        model=${literal(model)},`);
    out.push(`        state=${py(body.state, 8)},`);
    out.push('        questions={');
    for (const [id, q] of Object.entries(body.questions)) {
      const args = (indent) => [
        q.instructions !== undefined ? `instructions=${py(q.instructions, indent)}` : null,
        q.criteria !== undefined ? `criteria=${py(q.criteria, indent)}` : null,
      ].filter(Boolean);
      let call = `${cls[q.type]}(${args(12).join(', ')})`;
      if (call.length + id.length > 84 || call.includes('\n')) {
        call = `${cls[q.type]}(\n${args(16).map((a) => `                ${a},`).join('\n')}\n            )`;
      }
      out.push(`            ${literal(id)}: ${call},`);
    }
    out.push('        },');
    if (images.length) {
      out.push('        assets={');
      for (const m of images) out.push(`            ${literal(m.name)}: Image(Path(${literal(m.file.name)})),`);
      out.push('        },');
    }
    if (audio.length) {
      out.push('        # typesafe-sdk has no audio asset type: this request\'s audio is left out here');
    }
    if (videos.length) {
      out.push('        # typesafe-sdk has no video asset type: this request\'s videos are left out here');
    }
    out.push('    )');
  }
  if (models.length > 1) {
    out.push('for model, result in results.items():', '    print(model, result.answers)');
  } else {
    out.push('print(result.answers)');
  }
  return out.join('\n');
}

// A value as the server's prompt renders it: compact JSON with sorted keys (a string stays itself).
function rendered(value) {
  const sorted = (v) => (Array.isArray(v) ? v.map(sorted) : v && typeof v === 'object'
    ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted(v[k])])) : v);
  return typeof value === 'string' ? value : JSON.stringify(sorted(value));
}

// The request as Python for OpenAI's SDK (POST /v1/decisions): a text state and the questions read the same as
// in System One, so the probabilities are; images become a user message with input_image parts (another prompt).
export function openaiText(body, models, media) {
  const images = media.filter((m) => m.kind === 'image');
  const questions = Object.entries(body.questions).map(([name, q]) => {
    const out = { type: { noul: 'predicate' }[q.type] || q.type, name,
      instructions: q.instructions == null ? '' : rendered(q.instructions) };
    if (q.type === 'choice') {
      out.choices = Object.entries(q.criteria || {}).map(([value, d]) => (d == null ? { value }
        : { value, description: rendered(d) }));
    }
    if (q.type === 'score') {
      out.levels = (q.criteria || []).map((level) => (level && typeof level === 'object' && 'label' in level
        ? level : { label: rendered(level) }));
    }
    return out;
  });
  const text = rendered(body.state ?? '');
  const out = ['import os'];
  if (images.length) out.push('from base64 import b64encode', 'from pathlib import Path');
  out.push('', 'from openai import OpenAI', '');
  if (images.length) {
    out.push('def image(path, mime):', '    return {"type": "input_image", "image_url": f"data:{mime};base64,"'
      + ' + b64encode(Path(path).read_bytes()).decode()}', '', '');
  }
  out.push('client = OpenAI(');
  out.push('    api_key=os.environ.get("CLEF_API_KEY", "local"),  # any key when the server runs without auth');
  out.push(`    base_url=${literal(`${location.origin}/v1`)},`);
  out.push(')');
  const input = images.length
    ? `[{"role": "user", "content": [{"type": "input_text", "text": ${py(text)}}, ${images.map((m) =>
      `image(${literal(m.file.name)}, ${literal(m.file.type || 'image/png')})`).join(', ')}]}]`
    : py(text, 4);
  const many = models.length > 1;
  if (many) out.push(`for model in ${py(models)}:`);
  const pad = many ? '    ' : '';
  out.push(`${pad}decision = client.decisions.create(`);
  out.push(`${pad}    model=${many ? 'model' : literal(models[0])},`);
  out.push(`${pad}    input=${input},`);
  out.push(`${pad}    questions=${py(questions, pad.length + 4)},`);
  out.push(`${pad})`);
  if (media.some((m) => m.kind === 'audio')) out.push(`${pad}# OpenAI's shape has no audio: this request's audio is left out here`);
  out.push(`${pad}print(${many ? 'model, ' : ''}decision.answers)`);
  return out.join('\n');
}
