// harmony_official.mjs KILN NODE_MODULES — gpt-oss's output format parsed by
// kiln against OpenAI's harmony library.
//
// The truth: openai-harmony (npm; OpenAI's Rust openai-harmony compiled to
// WebAssembly) tokenizes each completion below with the o200k_harmony
// encoding and parses it with parseMessagesFromCompletionTokens, as an
// OpenAI harness reads what gpt-oss wrote after "<|start|>assistant". Its
// vocabulary file (o200k_base.tiktoken, which the library checks by
// SHA-256) is rebuilt from the npm tiktoken package's copy of the same
// ranks, and handed to the library through fetch (no network).
//
// kiln's answer: `kiln parse-output --tool-call-parser harmony
// --reasoning-parser gpt_oss`, the server's own parsers, on the same text
// whole and in deltas of 1, 2 and 7 bytes. What kiln promises
// (src/chat/harmony.h), applied to the library's messages: a message with
// a recipient is a tool call (its name the recipient less "functions.",
// its arguments the body), the analysis channel is reasoning_content, any
// other channel content, each in order; content is null when the answer
// is calls only.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const [kiln, nodeModules] = process.argv.slice(2);
if (!kiln || !nodeModules) {
  console.error('usage: node harmony_official.mjs KILN NODE_MODULES');
  process.exit(2);
}

// o200k_base.tiktoken: "base64(token) rank" lines, rebuilt from tiktoken's
// encoders/o200k_base.json ("! OFFSET tok tok ..." runs of ranks)
function o200kVocab() {
  const j = JSON.parse(fs.readFileSync(path.join(nodeModules, 'tiktoken/encoders/o200k_base.json'), 'utf8'));
  const lines = [];
  for (const run of j.bpe_ranks.split('\n')) {
    if (!run) continue;
    const parts = run.split(' ');
    const off = Number(parts[1]);
    for (let i = 2; i < parts.length; i++) lines.push(`${parts[i]} ${off + i - 2}\n`);
  }
  const text = lines.join('');
  const sha = crypto.createHash('sha256').update(text).digest('hex');
  assert.equal(sha, '446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d', 'o200k_base.tiktoken rebuilt exactly');
  return text;
}

const vocab = o200kVocab();
// The library loads its .wasm beside its module (a file: URL, which Node's
// fetch does not read) and its vocabulary by URL: both served here.
globalThis.fetch = async (input) => {
  const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
  let r;
  if (url.startsWith('file:'))
    r = new Response(fs.readFileSync(fileURLToPath(url)), { headers: { 'content-type': 'application/wasm' } });
  else if (url.endsWith('/o200k_base.tiktoken')) r = new Response(vocab);
  else throw new Error(`no network in this test: ${url}`);
  Object.defineProperty(r, 'url', { value: url });
  return r;
};
const harmony = await import(pathToFileURL(path.join(nodeModules, 'openai-harmony/dist/openai_harmony.js')).href);
const enc = await harmony.load_harmony_encoding('HarmonyGptOss', 'http://vocab.invalid');
const special = enc.specialTokens();

// Completions as gpt-oss writes them after the prompt's "<|start|>assistant".
const W = '{"location": "Paris, France", "unit": "celsius"}';
const cases = [
  '<|channel|>final<|message|>Hello! How can I help you today?<|return|>',
  '<|channel|>analysis<|message|>The user greets. Respond politely.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!<|return|>',
  `<|channel|>analysis<|message|>Need the weather; call the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>${W}<|call|>`,
  `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>${W}<|call|>`,
  `<|channel|>commentary to=functions.get_weather<|message|>${W}<|call|>`,
  ` to=functions.get_weather<|channel|>commentary json<|message|>${W}<|call|>`,
  `<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check both cities.<|end|>` +
    `<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>${W}<|call|>` +
    '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "Asia/Tokyo"}<|call|>',
  '<|channel|>analysis<|message|>Line one.\n\n- a bullet\n- `code` and **bold**\n\nDone thinking.<|end|><|start|>assistant<|channel|>final<|message|># Title\n\nParagraph with\ttab and trailing space \n<|return|>',
  '<|channel|>final<|message|>Unicode: café, 日本語, emoji 🚀, math ∑ᵢ xᵢ² — and a lone <| that is text.<|return|>',
  '<|channel|>analysis<|message|>Search first.<|end|><|start|>assistant<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "gpt-oss release date"}<|call|>',
  '<|channel|>commentary to=functions.create_event <|constrain|>json<|message|>{"title": "Sync", "attendees": ["a@x.io", "b@y.io"], "when": {"start": "2026-12-01T10:00:00Z", "minutes": 30}, "notes": null, "urgent": false}<|call|>',
  '<|channel|>analysis<|message|>Nothing to call.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 42.<|end|>',
  '<|channel|>analysis<|message|>  spaced reasoning  <|end|><|start|>assistant<|channel|>final<|message|>  spaced answer  <|return|>',
  '<|channel|>final<|message|>{"json": "as plain content", "n": [1, 2, 3]}<|return|>',
];

function truth(text) {
  const toks = enc.encode(text, special);
  const msgs = JSON.parse(enc.parseMessagesFromCompletionTokens(toks, 'assistant'));
  let reasoning = '';
  let content = '';
  const calls = [];
  for (const m of msgs) {
    const body = typeof m.content === 'string' ? m.content : m.content.map((c) => c.text).join('');
    if (m.recipient) calls.push({ name: m.recipient.replace(/^functions\./, ''), arguments: JSON.parse(body) });
    else if (m.channel === 'analysis') reasoning += body;
    else content += body;
  }
  return { content: calls.length && !content ? null : content, reasoning_content: reasoning || null, tool_calls: calls };
}

function kilnParse(texts, chunk) {
  const out = execFileSync(
    kiln,
    ['parse-output', '--tool-call-parser', 'harmony', '--reasoning-parser', 'gpt_oss', '--chunk', String(chunk)],
    { input: texts.map((t) => JSON.stringify(t)).join('\n') + '\n', encoding: 'utf8' },
  );
  return out.trim().split('\n').map((l) => {
    const m = JSON.parse(l);
    assert.equal(m.role, 'assistant');
    return {
      content: m.content,
      reasoning_content: m.reasoning_content,
      tool_calls: (m.tool_calls || []).map((c) => {
        assert.equal(c.type, 'function');
        assert.match(c.id, /^call_/);
        return { name: c.function.name, arguments: JSON.parse(c.function.arguments) };
      }),
    };
  });
}

const want = cases.map(truth);
let calls = 0;
for (const chunk of [0, 1, 2, 7]) {
  const got = kilnParse(cases, chunk);
  assert.equal(got.length, cases.length);
  cases.forEach((text, i) => {
    assert.deepEqual(got[i], want[i], `case ${i} (deltas of ${chunk || 'the whole'} bytes): ${JSON.stringify(text)}`);
  });
}
for (const w of want) calls += w.tool_calls.length;
console.log(`harmony: ${cases.length} completions (${calls} tool calls) split as openai-harmony parses them, whole and in 1-, 2- and 7-byte deltas`);
