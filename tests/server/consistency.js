// consistency.js — many concurrent streams, and greedy outputs that do not
// depend on batching, the prefix cache or KV pressure.
// Usage: node consistency.js URL_DEFAULT URL_NO_RADIX URL_TINY_POOL
'use strict';
const { test, run, client, metrics, sleep, assert } = require('./lib');

const [urlA, urlB, urlC] = process.argv.slice(2);
const MODEL = 'stories260K';
const names = ['Lily', 'Tom', 'Sue', 'Max', 'Ben', 'Anna', 'Tim', 'Mia'];
const things = ['a red ball', 'a big tree', 'a small cat', 'the sea', 'a toy car', 'a cake', 'the moon', 'a dog'];
const prompt = (i) => `Once upon a time, ${names[i % 8]} saw ${things[(i * 5 + 3) % 8]}. ${names[(i + 3) % 8]} said`;

async function settle(url) {
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(url);
    if (m['kiln:num_requests_running'] === 0 && m['kiln:num_requests_waiting'] === 0) break;
    await sleep(50);
  }
  return m;
}

function assertPoolFree(m, where) {
  assert.strictEqual(m['kiln:num_requests_running'], 0, where);
  assert.strictEqual(m['kiln:num_requests_waiting'], 0, where);
  assert.strictEqual(m['kiln:kv_pages_used_by_requests'], 0, `${where}: pages still held by requests`);
  assert.strictEqual(m['kiln:kv_pages_free'] + m['kiln:kv_pages_cached'], m['kiln:kv_pages_total'], where);
}

async function greedyText(oa, i, max_tokens = 40) {
  const r = await oa.completions.create({ model: MODEL, prompt: prompt(i), max_tokens, temperature: 0, ignore_eos: true });
  assert.strictEqual(r.usage.completion_tokens, max_tokens);
  return r.choices[0].text;
}

test('200 concurrent streams all finish with consistent token counts; then the KV pool is free', async () => {
  const oa = client(urlA);
  const N = 200;
  const runs = Array.from({ length: N }, async (_, i) => {
    const max_tokens = 4 + ((i * 37) % 29);
    const stream = await oa.completions.create({ model: MODEL, prompt: prompt(i), max_tokens, temperature: i % 3 ? 0.8 : 0,
      seed: i, logprobs: 0, ignore_eos: i % 2 === 0, stream: true, stream_options: { include_usage: true } });
    let text = '', tokens = 0, finish = null, usage = null;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        text += ch.text;
        if (ch.logprobs) tokens += ch.logprobs.tokens.length;
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert.ok(finish === 'length' || finish === 'stop', `request ${i}: finish ${finish}`);
    assert.ok(usage, `request ${i}: usage`);
    assert.strictEqual(tokens, usage.completion_tokens, `request ${i}: logprobs vs usage`);
    if (i % 2 === 0) assert.strictEqual(usage.completion_tokens, max_tokens, `request ${i}`);
    else assert.ok(usage.completion_tokens <= max_tokens);
    return usage.completion_tokens;
  });
  const counts = await Promise.all(runs);
  assert.strictEqual(counts.length, N);
  const m = await settle(urlA);
  assertPoolFree(m, 'after 200 streams');
  assert.ok(m['kiln:time_to_first_token_seconds_count'] >= N);
  assert.ok(m['kiln:generation_tokens_total'] >= counts.reduce((a, b) => a + b, 0));
});

const BATCH = 32;
let alone = [];

test('greedy output alone equals greedy output in a batch of 32 concurrent requests', async () => {
  const oa = client(urlA);
  alone = [];
  for (let i = 0; i < BATCH; i++) alone.push(await greedyText(oa, i));
  const batch = await Promise.all(Array.from({ length: BATCH }, (_, i) => greedyText(oa, i)));
  for (let i = 0; i < BATCH; i++) assert.strictEqual(batch[i], alone[i], `prompt ${i}`);
  assertPoolFree(await settle(urlA), 'after the batch');
});

test('greedy output is the same with --disable-radix-cache', async () => {
  const oa = client(urlB);
  const batch = await Promise.all(Array.from({ length: BATCH }, (_, i) => greedyText(oa, i)));
  for (let i = 0; i < BATCH; i++) assert.strictEqual(batch[i], alone[i], `prompt ${i}`);
  const m = await settle(urlB);
  assert.strictEqual(m['kiln:kv_pages_cached'], 0);
  assertPoolFree(m, 'no radix');
});

test('a tiny KV pool forces retraction, yet every request finishes with the same greedy output', async () => {
  const oa = client(urlC);
  const before = await metrics(urlC);
  const batch = await Promise.all(Array.from({ length: BATCH }, (_, i) => greedyText(oa, i)));
  for (let i = 0; i < BATCH; i++) assert.strictEqual(batch[i], alone[i], `prompt ${i}`);
  const m = await settle(urlC);
  assert.ok(m['kiln:num_retractions_total'] > before['kiln:num_retractions_total'], `retractions: ${m['kiln:num_retractions_total']}`);
  assertPoolFree(m, 'tiny pool');
});

run();
