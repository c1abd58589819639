// clef-bridge playground: the request on screen as a curl command, as Python for the official SDK
// (typesafe-sdk) and as its JSON body; the views shorten base64, the copies are whole.

const shellQuote = (s) => `'${String(s).replace(/'/g, `'\\''`)}'`;

export function bodyJSON(body, shorten) {
  return JSON.stringify(body, (k, v) => (shorten && k === 'data_base64' && typeof v === 'string' && v.length > 48
    ? `${v.slice(0, 24)}…(${v.length} base64 characters)` : v), 2);
}

// withKey: the server wants a key; the command reads it from $CLEF_API_KEY, never holds it
export function curlText(body, { shorten = false, withKey = false } = {}) {
  const url = `${location.origin}/v1/systemone`;
  const lines = [`curl -sS --fail-with-body ${shellQuote(url)} \\`, `  -H 'Content-Type: application/json' \\`];
  if (withKey) lines.push(`  -H "Authorization: Bearer $CLEF_API_KEY" \\`);
  lines.push(`  --data-binary @- <<'JSON'`, bodyJSON(body, shorten), 'JSON');
  return lines.join('\n');
}

// A JSON value as a Python literal (JSON string escapes are valid Python string escapes).
function py(value, indent = 0) {
  const pad = ' '.repeat(indent + 4);
  const end = ' '.repeat(indent);
  if (value === null || value === undefined) return 'None';
  if (value === true) return 'True';
  if (value === false) return 'False';
  if (typeof value === 'number' || typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return '[]';
    const flat = `[${value.map((v) => py(v)).join(', ')}]`;
    if (flat.length <= 80 - indent && !flat.includes('\n')) return flat;
    return `[\n${value.map((v) => pad + py(v, indent + 4)).join(',\n')},\n${end}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return '{}';
  const flat = `{${entries.map(([k, v]) => `${JSON.stringify(k)}: ${py(v)}`).join(', ')}}`;
  if (flat.length <= 80 - indent && !flat.includes('\n')) return flat;
  return `{\n${entries.map(([k, v]) => `${pad}${JSON.stringify(k)}: ${py(v, indent + 4)}`).join(',\n')},\n${end}}`;
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
  out.push(`    base_url=${JSON.stringify(location.origin)},`);
  out.push(') as client:');
  for (const model of models) {
    const target = models.length > 1 ? `results[${JSON.stringify(model)}]` : 'result';
    if (models.length > 1 && model === models[0]) out.push('    results = {}');
    out.push(`    ${target} = client.system_one(`);
    out.push(`        model=${JSON.stringify(model)},`);
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
      out.push(`            ${JSON.stringify(id)}: ${call},`);
    }
    out.push('        },');
    if (images.length) {
      out.push('        assets={');
      for (const m of images) out.push(`            ${JSON.stringify(m.name)}: Image(Path(${JSON.stringify(m.file.name)})),`);
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
