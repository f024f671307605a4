// trace.js — OpenTelemetry tracing of requests: kiln serve with
// --otlp-traces-endpoint sends OTLP/HTTP JSON spans to a collector; a
// caller's W3C traceparent makes the request's spans part of its trace.
// The reference is the OpenTelemetry JS SDK: its tracer makes the caller's
// span and injects the traceparent, and its OTLP JSON serializer gives
// the encoding kiln's spans must follow.
// Usage: node trace.js KILN MODEL_DIR CHAT_TEMPLATE
'use strict';
const http = require('http');
const { spawn, spawnSync } = require('child_process');
const api = require('@opentelemetry/api');
const sdk = require('@opentelemetry/sdk-trace');
const { W3CTraceContextPropagator } = require('@opentelemetry/core');
const { JsonTraceSerializer } = require('@opentelemetry/otlp-transformer');
const { test, run, client, post, get, metrics, sleep, assert } = require('./lib');

const [KILN, MODEL, TEMPLATE] = process.argv.slice(2);
const MODEL_NAME = 'stories260K';

// ---- the collector ----------------------------------------------------------

const collector = { bodies: [], status: 200, server: null, port: 0 };
function startCollector() {
  collector.server = http.createServer((req, res) => {
    let data = '';
    req.setEncoding('utf8');
    req.on('data', (c) => { data += c; });
    req.on('end', () => {
      collector.bodies.push({ path: req.url, type: req.headers['content-type'], body: data });
      res.writeHead(collector.status, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  return new Promise((resolve) => collector.server.listen(0, '127.0.0.1', () => {
    collector.port = collector.server.address().port;
    resolve();
  }));
}
// every span received so far, with its resource
function spans() {
  const out = [];
  for (const b of collector.bodies) {
    const doc = JSON.parse(b.body);
    for (const rs of doc.resourceSpans) for (const ss of rs.scopeSpans) for (const s of ss.spans) out.push({ ...s, resource: rs.resource });
  }
  return out;
}
async function spansOf(traceId, atLeast, ms = 5000) {
  const t0 = Date.now();
  for (;;) {
    const got = spans().filter((s) => s.traceId === traceId);
    if (got.length >= atLeast || Date.now() - t0 > ms) return got;
    await sleep(25);
  }
}
const attr = (s, k) => {
  const a = s.attributes.find((x) => x.key === k);
  if (!a) return undefined;
  const v = a.value;
  return v.stringValue !== undefined ? v.stringValue : v.intValue !== undefined ? Number(v.intValue) : v.boolValue;
};

// ---- kiln serve -------------------------------------------------------------

const procs = [];
function startKiln(extra) {
  return new Promise((resolve, reject) => {
    const p = spawn(KILN, ['serve', '--model', MODEL, '--port', '0', '--threads', '1', '--skip-sampler-warmup',
      '--chat-template', TEMPLATE, ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
    procs.push(p);
    let out = '', log = '';
    const exited = new Promise((r) => p.on('exit', (code, sig) => r(code === null ? sig : code)));
    p.stdout.on('data', (c) => {
      out += c;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve({ url: m[1], proc: p, exited, log: () => log });
    });
    p.stderr.on('data', (c) => { log += c; });
    exited.then((code) => reject(new Error(`kiln serve exited (${code}) before listening:\n${log}`)));
  });
}

// ---- the caller's side: a span of the OpenTelemetry SDK ------------------------

const exporter = new sdk.InMemorySpanExporter();
const provider = new sdk.TracerProvider({ spanProcessors: [new sdk.SimpleSpanProcessor({ exporter })] });
const tracer = provider.getTracer('kiln-test');
const propagator = new W3CTraceContextPropagator();
function callerSpan(name) {
  const span = tracer.startSpan(name, { kind: api.SpanKind.CLIENT });
  const headers = {};
  propagator.inject(api.trace.setSpan(api.ROOT_CONTEXT, span), headers, api.defaultTextMapSetter);
  return { span, headers, traceId: span.spanContext().traceId, spanId: span.spanContext().spanId };
}
// the SDK's own OTLP JSON of a finished span with a parent: the shape kiln must follow
async function referenceSpan() {
  const parent = tracer.startSpan('reference-parent');
  const s = tracer.startSpan('reference', { attributes: { i: 1, s: 'x', b: true } }, api.trace.setSpan(api.ROOT_CONTEXT, parent));
  s.end();
  parent.end();
  await provider.forceFlush();
  const doc = JSON.parse(Buffer.from(JsonTraceSerializer.serializeRequest(exporter.getFinishedSpans())).toString());
  const ref = doc.resourceSpans[0].scopeSpans[0].spans.find((x) => x.name === 'reference');
  assert.ok(ref.parentSpanId, 'the reference has a parent');
  return ref;
}

const HEX32 = /^[0-9a-f]{32}$/, HEX16 = /^[0-9a-f]{16}$/;
// kiln's span against the SDK's encoding of a span
function checkEncoding(s, ref) {
  for (const k of Object.keys(s)) {
    if (k === 'resource') continue;
    assert.ok(k in ref, `span field '${k}' is not one the OTLP JSON encoding has (${Object.keys(ref)})`);
    assert.strictEqual(typeof s[k], typeof ref[k], `field ${k}: ${typeof s[k]} vs the SDK's ${typeof ref[k]}`);
  }
  for (const k of ['traceId', 'spanId', 'name', 'kind', 'startTimeUnixNano', 'endTimeUnixNano', 'attributes', 'status', 'flags'])
    assert.ok(k in s, `span without ${k}: ${JSON.stringify(s)}`);
  assert.match(s.traceId, HEX32);
  assert.match(s.spanId, HEX16);
  if (s.parentSpanId !== undefined) assert.match(s.parentSpanId, HEX16);
  assert.match(s.startTimeUnixNano, /^[0-9]{19}$/);
  assert.match(s.endTimeUnixNano, /^[0-9]{19}$/);
  assert.ok(BigInt(s.endTimeUnixNano) >= BigInt(s.startTimeUnixNano), 'ends before it starts');
  assert.strictEqual(typeof s.status.code, 'number');
  assert.strictEqual(s.flags & 0xff, 1, 'sampled');
  for (const a of s.attributes) {
    assert.strictEqual(typeof a.key, 'string');
    const kinds = Object.keys(a.value);
    assert.strictEqual(kinds.length, 1, JSON.stringify(a));
    assert.ok(['stringValue', 'intValue', 'boolValue'].includes(kinds[0]), JSON.stringify(a));
    if (kinds[0] === 'intValue') assert.match(String(a.value.intValue), /^-?[0-9]+$/);
  }
  const svc = s.resource.attributes.find((a) => a.key === 'service.name');
  assert.ok(svc && svc.value.stringValue, 'resource without service.name');
}
const within = (c, root) => BigInt(c.startTimeUnixNano) >= BigInt(root.startTimeUnixNano) &&
  BigInt(c.endTimeUnixNano) <= BigInt(root.endTimeUnixNano);

let K; // the traced server
let REF;

test('a chat completion with a traceparent: its spans join the caller\'s trace, in the OTLP JSON encoding', async () => {
  const c = callerSpan('caller');
  const t0 = BigInt(Date.now()) * 1000000n;
  const oa = client(K.url);
  const { data, response } = await oa.chat.completions.create({ model: MODEL_NAME, messages: [{ role: 'user', content: 'Tell a story' }],
    max_tokens: 12, temperature: 0 }, { headers: c.headers }).withResponse();
  c.span.end();
  // the response names the request's span in the caller's trace
  const tp = response.headers.get('traceparent');
  assert.match(tp, new RegExp(`^00-${c.traceId}-[0-9a-f]{16}-01$`), tp);
  const got = await spansOf(c.traceId, 5);
  const root = got.find((s) => s.name === 'POST /v1/chat/completions');
  assert.ok(root, `no request span among ${got.map((s) => s.name)}`);
  assert.strictEqual(root.spanId, tp.split('-')[2]);
  assert.strictEqual(root.parentSpanId, c.spanId);
  assert.strictEqual(root.kind, 2); // SERVER
  assert.strictEqual(root.flags & 0x300, 0x300, 'a remote parent');
  assert.ok(BigInt(root.startTimeUnixNano) >= t0 - 1000000000n && BigInt(root.endTimeUnixNano) <= BigInt(Date.now()) * 1000000n + 1000000000n,
    'request span times are Unix nanoseconds of now');
  assert.strictEqual(attr(root, 'http.response.status_code'), 200);
  assert.strictEqual(attr(root, 'http.request.method'), 'POST');
  assert.strictEqual(attr(root, 'gen_ai.request.model'), MODEL_NAME);
  assert.strictEqual(attr(root, 'gen_ai.usage.input_tokens'), data.usage.prompt_tokens);
  assert.strictEqual(attr(root, 'gen_ai.usage.output_tokens'), data.usage.completion_tokens);
  const byName = {};
  for (const s of got) byName[s.name] = s;
  for (const n of ['tokenize', 'queue', 'prefill', 'decode']) {
    const s = byName[n];
    assert.ok(s, `no ${n} span among ${got.map((x) => x.name)}`);
    assert.strictEqual(s.parentSpanId, root.spanId, n);
    assert.strictEqual(s.kind, 1, n); // INTERNAL
    assert.ok(within(s, root), `${n} outside the request span`);
  }
  // the stages follow each other
  assert.strictEqual(byName.queue.endTimeUnixNano, byName.prefill.startTimeUnixNano);
  assert.strictEqual(byName.prefill.endTimeUnixNano, byName.decode.startTimeUnixNano);
  assert.ok(BigInt(byName.tokenize.endTimeUnixNano) <= BigInt(byName.queue.startTimeUnixNano), 'tokenized before queued');
  assert.strictEqual(attr(byName.tokenize, 'kiln.tokenize.thread'), 'pool'); // body > --tokenizer-inline-bytes 100
  assert.strictEqual(attr(byName.prefill, 'gen_ai.usage.input_tokens'), data.usage.prompt_tokens);
  assert.strictEqual(attr(byName.decode, 'gen_ai.usage.output_tokens'), data.usage.completion_tokens);
  assert.strictEqual(attr(byName.decode, 'gen_ai.response.finish_reasons'), data.choices[0].finish_reason);
  for (const s of got) checkEncoding(s, REF);
  assert.ok(collector.bodies.every((b) => b.path === '/v1/traces' && /application\/json/.test(b.type)));
});

test('a streamed completion with n = 2 and a prompt tokenized on the pool: one request span, two engine requests', async () => {
  const c = callerSpan('caller-stream');
  const oa = client(K.url);
  const prompt = 'Once upon a time there was a little dog. '.repeat(4); // > --tokenizer-inline-bytes 100: the pool
  const stream = await oa.completions.create({ model: MODEL_NAME, prompt, max_tokens: 6, n: 2, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true }, { headers: c.headers });
  let usage = null;
  for await (const ch of stream) if (ch.usage) usage = ch.usage;
  c.span.end();
  const got = await spansOf(c.traceId, 8);
  const root = got.find((s) => s.name === 'POST /v1/completions');
  assert.ok(root);
  const kids = got.filter((s) => s.parentSpanId === root.spanId);
  const names = kids.map((s) => `${s.name}${attr(s, 'kiln.index') !== undefined ? attr(s, 'kiln.index') : ''}`).sort();
  assert.deepStrictEqual(names, ['decode0', 'decode1', 'prefill0', 'prefill1', 'queue0', 'queue1', 'tokenize']);
  assert.strictEqual(attr(kids.find((s) => s.name === 'tokenize'), 'kiln.tokenize.thread'), 'pool');
  assert.strictEqual(attr(root, 'gen_ai.usage.output_tokens'), usage.completion_tokens);
  for (const s of kids) assert.ok(within(s, root), s.name);
});

test('no traceparent, or a malformed one: a trace of its own', async () => {
  const bad = [undefined, '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331', // too short
    '00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01', // upper case
    '00-00000000000000000000000000000000-b7ad6b7169203331-01', // zero trace id
    '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01', // zero parent
    'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', // version ff
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra']; // version 00 is exactly 55
  const seen = new Set();
  for (const h of bad) {
    const r = await post(K.url, '/v1/completions', { prompt: 'Hi', max_tokens: 2 }, h ? { traceparent: h } : {});
    assert.strictEqual(r.status, 200, r.text);
    const tp = r.headers.traceparent;
    assert.match(tp, /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/, `${h}: ${tp}`);
    const tid = tp.split('-')[1];
    assert.notStrictEqual(tid, '0af7651916cd43dd8448eb211c80319c', `${h} was taken`);
    assert.ok(!seen.has(tid), 'trace ids repeat');
    seen.add(tid);
    const got = await spansOf(tid, 5);
    const root = got.find((s) => s.name === 'POST /v1/completions');
    assert.ok(root, h);
    assert.strictEqual(root.parentSpanId, undefined, `${h}: a parent`);
    // a body under --tokenizer-inline-bytes tokenizes on the loop thread
    assert.strictEqual(attr(got.find((s) => s.name === 'tokenize'), 'kiln.tokenize.thread'), 'loop');
  }
  // a later version may carry more fields: its trace is taken
  const later = 'cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-whatever';
  const r = await post(K.url, '/v1/completions', { prompt: 'Hi', max_tokens: 2 }, { traceparent: later });
  assert.match(r.headers.traceparent, /^00-0af7651916cd43dd8448eb211c80319c-[0-9a-f]{16}-01$/);
});

test('errors are traced with their status; health and metrics probes are not', async () => {
  const c = callerSpan('caller-errors');
  const r400 = await post(K.url, '/v1/chat/completions', { messages: 'no' }, c.headers);
  assert.strictEqual(r400.status, 400);
  const r404 = await post(K.url, '/v1/nothing', {}, c.headers);
  assert.strictEqual(r404.status, 404);
  await get(K.url, '/health', c.headers);
  await get(K.url, '/metrics', c.headers);
  c.span.end();
  const got = await spansOf(c.traceId, 2);
  await sleep(300); // nothing more may come
  const roots = spans().filter((s) => s.traceId === c.traceId && s.parentSpanId === c.spanId);
  assert.deepStrictEqual(roots.map((s) => `${s.name} ${attr(s, 'http.response.status_code')}`).sort(),
    ['POST /v1/chat/completions 400', 'POST /v1/nothing 404']);
  for (const s of roots) assert.strictEqual(s.status.code, 0, '4xx is not a server error');
  assert.ok(got.length >= 2);
  // every span the collector took (and answered 200) is counted as exported
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(K.url);
    if (m['kiln:trace_spans_exported_total'] === spans().length) break;
    await sleep(20);
  }
  assert.strictEqual(m['kiln:trace_spans_exported_total'], spans().length);
  assert.strictEqual(m['kiln:trace_spans_dropped_total'], 0);
});

test('a collector that refuses or is gone costs no request; the spans are counted as dropped', async () => {
  collector.status = 500;
  const r = await post(K.url, '/v1/completions', { prompt: 'Hi', max_tokens: 2 });
  assert.strictEqual(r.status, 200);
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(K.url);
    if (m['kiln:trace_spans_dropped_total'] > 0) break;
    await sleep(20);
  }
  assert.ok(m['kiln:trace_spans_dropped_total'] >= 5, `dropped ${m['kiln:trace_spans_dropped_total']}`);
  collector.status = 200;
  // a server whose collector port has nobody listening
  const dead = await new Promise((resolve) => { const s = http.createServer(); s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); }); });
  const D = await startKiln(['--otlp-traces-endpoint', `127.0.0.1:${dead}`, '--otlp-export-interval', '20']);
  const oa = client(D.url);
  for (let i = 0; i < 3; i++) {
    const res = await oa.completions.create({ model: MODEL_NAME, prompt: 'The dog', max_tokens: 4 });
    assert.strictEqual(res.choices.length, 1);
  }
  for (let i = 0; i < 100; i++) {
    m = await metrics(D.url);
    if (m['kiln:trace_spans_dropped_total'] >= 15) break;
    await sleep(20);
  }
  assert.ok(m['kiln:trace_spans_dropped_total'] >= 15, `dropped ${m['kiln:trace_spans_dropped_total']}`);
  assert.strictEqual(m['kiln:trace_spans_exported_total'], 0);
  D.proc.kill('SIGTERM');
  assert.strictEqual(await D.exited, 0, D.log());
});

test('SIGTERM: the spans of a request still streaming are sent before the server exits', async () => {
  const c = callerSpan('caller-sigterm');
  const oa = client(K.url);
  const stream = await oa.completions.create({ model: MODEL_NAME, prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true,
    stream: true }, { headers: c.headers });
  let n = 0;
  const done = (async () => { for await (const ch of stream) n += ch.choices.length; })();
  while (n < 3) await sleep(5);
  K.proc.kill('SIGTERM');
  await done;
  assert.strictEqual(await K.exited, 0, K.log());
  const got = spans().filter((s) => s.traceId === c.traceId);
  const root = got.find((s) => s.name === 'POST /v1/completions');
  assert.ok(root, `spans: ${got.map((s) => s.name)}`);
  assert.ok(got.some((s) => s.name === 'decode' && s.parentSpanId === root.spanId));
});

test('bad tracing options: a clear error naming the option', async () => {
  for (const [args, re] of [[['--otlp-traces-endpoint', 'https://collector:4318'], /--otlp-traces-endpoint.*https/],
    [['--otlp-traces-endpoint', 'http://host:99999'], /--otlp-traces-endpoint.*port/],
    [['--otlp-export-interval', 'soon'], /--otlp-export-interval/]]) {
    const r = spawnSync(KILN, ['serve', '--model', MODEL, '--port', '0', '--skip-sampler-warmup', ...args], { encoding: 'utf8', timeout: 30000 });
    assert.strictEqual(r.status, 2, `${args}: exit ${r.status}`);
    assert.ok(!/listening/.test(r.stdout), 'checked before the server starts');
    assert.match(r.stderr + r.stdout, re);
  }
});

(async () => {
  await startCollector();
  REF = await referenceSpan();
  K = await startKiln(['--otlp-traces-endpoint', `http://127.0.0.1:${collector.port}/v1/traces`, '--otlp-export-interval', '20',
    '--tokenizer-inline-bytes', '100']);
  process.on('exit', () => { for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL'); });
  await run();
})().catch((e) => { console.error(e); for (const p of procs) p.kill('SIGKILL'); process.exit(1); });
