// shutdown.js — SIGTERM while requests are in flight: every stream and
// every waiting non-streamed request ends with a finish_reason, requests on
// open connections get 503, new connections are refused, a request still
// arriving when the grace ends gets 503.
// Usage: node shutdown.js URL PID (the server runs with --shutdown-timeout 0)
'use strict';
const net = require('net');
const { test, run, client, post, raw, parseRaw, sleep, assert } = require('./lib');

const url = process.argv[2];
const pid = Number(process.argv[3]);
const u = new URL(url);
const MODEL = 'stories260K';

test('SIGTERM: in-flight requests finish with a reason, later ones get 503 or are refused', async () => {
  const oa = client(url);
  // a keep-alive connection opened before the signal
  const sock = await new Promise((resolve, reject) => { const s = net.connect(Number(u.port), u.hostname, () => resolve(s)); s.on('error', reject); });
  let sockData = '';
  sock.on('data', (c) => { sockData += c; });
  sock.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
  let started = 0;
  const streams = Array.from({ length: 6 }, async (_, i) => {
    const s = await oa.completions.create({ model: MODEL, prompt: `Once upon a time ${i}`, max_tokens: 450, ignore_eos: true,
      temperature: 0, stream: true });
    let finish = null, first = true, text = '';
    for await (const c of s) {
      if (first) { started++; first = false; }
      for (const ch of c.choices) { text += ch.text; if (ch.finish_reason) finish = ch.finish_reason; }
    }
    return finish;
  });
  const plain = Array.from({ length: 3 }, (_, i) => post(url, '/v1/completions', { prompt: `The dog ${i}`, max_tokens: 450, ignore_eos: true }));
  while (started < 6) await sleep(10);
  await sleep(50);
  // a request whose head and part of its body are in before the signal, and
  // the rest never: it is waited for until the grace (0 s here) is over
  const stalled = await new Promise((resolve, reject) => {
    const s = net.connect(Number(u.port), u.hostname, () => {
      s.write('POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"prompt":', () => resolve(s));
    });
    s.on('error', reject);
  });
  let stalledData = '';
  stalled.setEncoding('latin1');
  stalled.on('data', (c) => { stalledData += c; });
  const stalledClosed = new Promise((resolve) => stalled.on('close', resolve));
  process.kill(pid, 'SIGTERM');
  const finishes = await Promise.all(streams);
  for (const f of finishes) assert.ok(f === 'abort' || f === 'length', `stream finish ${f}`);
  assert.ok(finishes.includes('abort'), `finishes ${finishes}`);
  for (const r of await Promise.all(plain)) {
    assert.ok(r.status === 200 || r.status === 503, r.text);
    if (r.status === 200) assert.ok(['abort', 'length'].includes(r.json.choices[0].finish_reason), r.text);
  }
  await stalledClosed;
  const st = parseRaw(stalledData);
  assert.ok(st, JSON.stringify(stalledData));
  assert.strictEqual(st.status, 503, stalledData);
  assert.strictEqual(st.json.error.code, 'shutting_down', stalledData);
  // the connection opened before: one more request gets 503 (or the connection is gone)
  sockData = '';
  await new Promise((resolve) => {
    sock.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n', () => {});
    sock.on('close', resolve);
    setTimeout(resolve, 2000);
  });
  if (sockData) assert.strictEqual(parseRaw(sockData).status, 503, sockData);
  await assert.rejects(raw(url, 'GET /health HTTP/1.1\r\n\r\n', { waitMs: 500 }).then((t) => { if (!t) throw new Error('refused'); return t; }));
});

run();
