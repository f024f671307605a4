// errors.js — every error class over raw HTTP (node's http and net), the
// OpenAI error body shape, and that the server keeps answering afterwards.
// The server runs with --api-key sk-test --max-body-bytes 65536
// --max-connections 16 --max-running-requests 1 --max-queued-requests 1.
// Usage: node errors.js URL
'use strict';
const net = require('net');
const { test, run, client, post, get, request, raw, parseRaw, assertErrorShape, metrics, sleep, assert } = require('./lib');

const url = process.argv[2];
const KEY = 'sk-test';
const AUTH = { authorization: `Bearer ${KEY}` };
const u = new URL(url);
const HOST = `${u.hostname}:${u.port}`;

async function expectError(status, path, body, { headers = AUTH, param, code, method = 'POST' } = {}) {
  const r = await request(url, method, path, body, headers);
  assert.strictEqual(r.status, status, `${path} ${JSON.stringify(body)} -> ${r.status} ${r.text}`);
  assertErrorShape(r.json, `${path} ${JSON.stringify(body)}`);
  if (param !== undefined) assert.strictEqual(r.json.error.param, param, r.text);
  if (code !== undefined) assert.strictEqual(r.json.error.code, code, r.text);
  return r;
}

async function stillAlive() {
  const h = await get(url, '/health');
  assert.strictEqual(h.status, 200);
  const r = await post(url, '/v1/completions', { prompt: 'Hello', max_tokens: 2 }, AUTH);
  assert.strictEqual(r.status, 200, r.text);
}

test('401 without or with a wrong API key; /health stays open; the openai client works with the key', async () => {
  await expectError(401, '/v1/completions', { prompt: 'x' }, { headers: {}, code: 'invalid_api_key' });
  await expectError(401, '/v1/completions', { prompt: 'x' }, { headers: { authorization: 'Bearer sk-tesu' } });
  await expectError(401, '/v1/completions', { prompt: 'x' }, { headers: { authorization: `Bearer ${KEY}x` } });
  await expectError(401, '/v1/models', undefined, { headers: { authorization: KEY }, method: 'GET' });
  const h = await get(url, '/health');
  assert.strictEqual(h.status, 200);
  const ok = await client(url, { apiKey: KEY }).completions.create({ model: 'stories260K', prompt: 'Hi', max_tokens: 2 });
  assert.strictEqual(ok.choices.length, 1);
  await assert.rejects(client(url, { apiKey: 'wrong' }).models.list(), (e) => e.status === 401);
});

test('404 unknown route, 405 wrong method (with Allow)', async () => {
  await expectError(404, '/v1/nothing', { a: 1 }, { code: 'not_found' });
  await expectError(404, '/v2/completions', undefined, { method: 'GET' });
  const r = await expectError(405, '/v1/completions', undefined, { method: 'GET', code: 'method_not_allowed' });
  assert.strictEqual(r.headers.allow, 'POST');
  await expectError(405, '/v1/models', { a: 1 }, { method: 'POST' });
});

test('400 for malformed JSON, empty and non-object bodies, invalid UTF-8', async () => {
  let r = await expectError(400, '/v1/completions', '{"prompt": "x",', { code: 'invalid_json' });
  assert.match(r.json.error.message, /JSON/);
  await expectError(400, '/v1/completions', '', { code: 'invalid_json' });
  await expectError(400, '/v1/completions', '[1, 2]', { code: 'invalid_json' });
  await expectError(400, '/v1/completions', '{"prompt": "x"} trailing', { code: 'invalid_json' });
  await expectError(400, '/v1/completions', Buffer.from('{"prompt": "\xff\xfe abc"}', 'latin1'), { code: 'invalid_json' });
  await expectError(400, '/v1/completions', '{"prompt": "\\ud800"}');
  await expectError(400, '/generate', Buffer.from([0x7b, 0x22, 0x74, 0x65, 0x78, 0x74, 0x22, 0x3a, 0x22, 0xc3, 0x28, 0x22, 0x7d]));
  await expectError(400, '/v1/completions', '{"prompt": "x", "max_tokens": 99999999999999999999999}');
  await expectError(400, '/v1/completions', '['.repeat(5000) + ']'.repeat(5000));
  await stillAlive();
});

test('400 for invalid fields, naming the field', async () => {
  const P = { prompt: 'Hello', max_tokens: 2 };
  const cases = [
    [{ temperature: 'hot' }, 'temperature'], [{ temperature: -0.5 }, 'temperature'], [{ top_p: 0 }, 'top_p'],
    [{ top_p: 1.5 }, 'top_p'], [{ n: 0 }, 'n'], [{ n: 129 }, 'n'], [{ max_tokens: -1 }, 'max_tokens'],
    [{ max_tokens: 'many' }, 'max_tokens'], [{ logprobs: 21 }, 'logprobs'], [{ model: 'gpt-4' }, 'model'],
    [{ stop: 5 }, 'stop'], [{ stop: ['a', 7] }, 'stop'], [{ logit_bias: { 99999: 1 } }, 'logit_bias'],
    [{ logit_bias: { 5: 1000 } }, 'logit_bias'], [{ presence_penalty: 3 }, 'presence_penalty'],
    [{ frequency_penalty: -2.5 }, 'frequency_penalty'], [{ seed: 'x' }, 'seed'], [{ stream: 'yes' }, 'stream'],
    [{ stop_token_ids: [-1] }, 'stop_token_ids'], [{ min_p: 2 }, 'min_p'], [{ repetition_penalty: 0 }, 'repetition_penalty'],
    [{ prompt: 42 }, 'prompt'], [{ prompt: [] }, 'prompt'], [{ prompt: [1, 'a'] }, 'prompt'], [{ prompt: [999999] }, 'prompt'],
    [{ prompt: null }, 'prompt'], [{ cache_salt: 3 }, 'cache_salt'], [{ priority: 1.5 }, 'priority'],
  ];
  for (const [extra, param] of cases) await expectError(400, '/v1/completions', Object.assign({}, P, extra), { param });
  // chat fields of OpenAI's API for what kiln does not do: refused, naming the field
  const M = { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
  const refused = [
    [{ functions: [{ name: 'f', parameters: {} }] }, 'functions', 'unsupported'],
    [{ function_call: 'auto' }, 'function_call', 'unsupported'],
    [{ modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } }, 'audio', 'unsupported'],
    [{ modalities: ['text', 'audio'] }, 'modalities', 'unsupported'], [{ modalities: 'text' }, 'modalities', 'invalid_type'],
    [{ prediction: { type: 'content', content: 'Hello' } }, 'prediction', 'unsupported'],
    [{ web_search_options: {} }, 'web_search_options', 'unsupported'],
  ];
  for (const [extra, param, code] of refused)
    await expectError(400, '/v1/chat/completions', Object.assign({}, M, extra), { param, code });
  await expectError(400, '/generate', { text: 'x', sampling_params: { max_new_tokens: -3 } }, { param: 'max_new_tokens' });
  await expectError(400, '/generate', { sampling_params: {} }, { param: 'text' });
  await expectError(400, '/generate', { text: 'x', input_ids: [1] }, { param: 'text' });
  await expectError(400, '/generate', { text: 'x', sampling_params: 3 }, { param: 'sampling_params' });
  await expectError(400, '/detokenize', { tokens: [1, 'a'] }, { param: 'tokens' });
  await expectError(400, '/tokenize', {}, { param: 'prompt' });
  await expectError(400, '/v1/score', { query: 'a', items: ['b'] }, { param: 'label_token_ids' });
  // the engine's own checks: prompt plus max_tokens beyond the context of 512
  const long = 'Once upon a time there was a dog. '.repeat(80);
  let r = await expectError(400, '/v1/completions', { prompt: long, max_tokens: 4 });
  assert.match(r.json.error.message, /context/);
  r = await expectError(400, '/v1/completions', { prompt: 'Hello', max_tokens: 600 });
  assert.match(r.json.error.message, /context/);
  // the openai client surfaces them as BadRequestError
  await assert.rejects(client(url, { apiKey: KEY }).completions.create({ model: 'stories260K', prompt: 'x', temperature: -1 }),
    (e) => e.status === 400 && e.error && e.error.param === 'temperature');
  await stillAlive();
});

test('413 for bodies over --max-body-bytes, by Content-Length and chunked', async () => {
  const big = JSON.stringify({ prompt: 'x'.repeat(70000) });
  await expectError(413, '/v1/completions', big, { code: 'payload_too_large' });
  const chunk = 'a'.repeat(40000);
  const text = await raw(url, `POST /v1/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${KEY}\r\n` +
    `Transfer-Encoding: chunked\r\n\r\n${(40000).toString(16)}\r\n${chunk}\r\n${(40000).toString(16)}\r\n${chunk}\r\n0\r\n\r\n`);
  const p = parseRaw(text);
  assert.strictEqual(p.status, 413, text.slice(0, 200));
  assertErrorShape(p.json, 'chunked 413');
  await stillAlive();
});

test('truncated bodies: 400 to a half-closed client, nothing breaks when it just leaves', async () => {
  const body = '{"prompt": "Hello", "max_tokens": 2}';
  const head = `POST /v1/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\n`;
  const t1 = await raw(url, head + `Content-Length: ${body.length + 50}\r\n\r\n${body}`, { halfClose: true });
  const p1 = parseRaw(t1);
  assert.strictEqual(p1.status, 400, t1);
  assert.strictEqual(p1.json.error.code, 'truncated_body');
  const t2 = await raw(url, head + `Transfer-Encoding: chunked\r\n\r\n10\r\n{"prompt": "Hell`, { halfClose: true });
  assert.strictEqual(parseRaw(t2).status, 400, t2);
  // truncated JSON text with a correct length
  await expectError(400, '/v1/completions', '{"prompt": "Hel', { code: 'invalid_json' });
  // a client that vanishes mid-body
  await new Promise((resolve) => {
    const s = net.connect(Number(u.port), u.hostname, () => { s.write(head + 'Content-Length: 1000\r\n\r\n{"pro'); setTimeout(() => { s.destroy(); resolve(); }, 50); });
    s.on('error', resolve);
  });
  await stillAlive();
});

test('malformed HTTP: request line, headers, lengths, oversized head; pipelining works', async () => {
  const bad = [
    'BLAH\r\n\r\n', 'GET /health HTTP/9.9\r\n\r\n', 'GET  /health HTTP/1.1\r\n\r\n', 'GET health HTTP/1.1\r\n\r\n',
    `POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n`,
    `POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n`,
    `POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n`,
    `POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n`,
    `GET /health HTTP/1.1\r\nBad Header: x\r\n\r\n`, `GET /health HTTP/1.1\r\n folded\r\n\r\n`,
    `POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`,
  ];
  for (const b of bad) {
    const t = await raw(url, b);
    const p = parseRaw(t);
    assert.ok(p && p.status >= 400 && p.status < 600, `${JSON.stringify(b)} -> ${JSON.stringify(t.slice(0, 100))}`);
    assertErrorShape(p.json, JSON.stringify(b));
  }
  const huge = await raw(url, `GET /health HTTP/1.1\r\nX-Big: ${'a'.repeat(70000)}\r\n\r\n`);
  assert.strictEqual(parseRaw(huge).status, 431);
  const two = await raw(url, `GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
  assert.strictEqual((two.match(/HTTP\/1\.1 200/g) || []).length, 2, two);
  const chunked = await raw(url, `POST /tokenize HTTP/1.1\r\nAuthorization: Bearer ${KEY}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n` +
    `a\r\n{"prompt":\r\n9\r\n "Hello"}\r\n0\r\n\r\n`);
  assert.strictEqual(parseRaw(chunked.replace(/\r\n[0-9a-f]+\r\n/, '\r\n')).status, 200, chunked);
  const h10 = await raw(url, 'GET /health HTTP/1.0\r\n\r\n');
  assert.match(h10, /^HTTP\/1\.0 200/);
  // random garbage
  for (let i = 0; i < 20; i++) {
    const junk = Buffer.from(Array.from({ length: 1 + ((i * 7919) % 300) }, (_, k) => (k * 31 + i * 17) % 256));
    await raw(url, junk, { waitMs: 100 }).catch(() => {});
  }
  await stillAlive();
});

test('429 when the engine queue is full', async () => {
  const body = { prompt: 'Once upon a time', max_tokens: 300, ignore_eos: true };
  const rs = await Promise.all(Array.from({ length: 8 }, () => post(url, '/v1/completions', body, AUTH)));
  const codes = rs.map((r) => r.status);
  assert.ok(codes.includes(429), `statuses ${codes}`);
  assert.ok(codes.includes(200), `statuses ${codes}`);
  for (const r of rs) if (r.status === 429) { assertErrorShape(r.json, '429'); assert.strictEqual(r.json.error.code, 'queue_full'); }
  await stillAlive();
});

test('503 beyond --max-connections, and connections come back', async () => {
  const socks = [];
  for (let i = 0; i < 16; i++) {
    socks.push(await new Promise((resolve, reject) => { const s = net.connect(Number(u.port), u.hostname, () => resolve(s)); s.on('error', reject); }));
  }
  // the server takes the 16 in its own time (a slow build, a busy machine):
  // a 17th gets 503 once it holds them all
  let t, p;
  for (let tries = 0; tries < 100; tries++) {
    await sleep(100);
    t = await raw(url, 'GET /health HTTP/1.1\r\n\r\n');
    p = parseRaw(t);
    if (p.status === 503) break;
  }
  assert.strictEqual(p.status, 503, t);
  assert.strictEqual(p.json.error.code, 'too_many_connections');
  for (const s of socks) s.destroy();
  await sleep(200);
  await stillAlive();
});

test('a client that disconnects mid-stream is aborted and its KV freed', async () => {
  const before = await metrics(url, AUTH);
  await new Promise((resolve, reject) => {
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, stream: true });
    const s = net.connect(Number(u.port), u.hostname, () => s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`));
    let got = '';
    s.on('data', (c) => { got += c; if (got.includes('data: ')) { s.destroy(); resolve(); } });
    s.on('error', reject);
  });
  let m;
  for (let i = 0; i < 100; i++) {
    await sleep(50);
    m = await metrics(url, AUTH);
    if (m['kiln:num_requests_running'] === 0 && m['kiln:client_disconnects_total'] > (before['kiln:client_disconnects_total'] || 0)) break;
  }
  assert.strictEqual(m['kiln:num_requests_running'], 0);
  assert.ok(m['kiln:client_disconnects_total'] >= 1);
  assert.ok(m['kiln:request_success_total{finished_reason="abort"}'] >= 1, JSON.stringify(m));
  assert.strictEqual(m['kiln:kv_pages_free'] + m['kiln:kv_pages_cached'], m['kiln:kv_pages_total']);
  await stillAlive();
});

run();
