// hybrid.js — a model with sliding and full layers served with its hybrid
// KV pool: the options show in /get_server_info and /metrics, and greedy
// outputs of concurrent requests sharing long prefixes (far longer than
// the window of 8) are the same with the hybrid pool, with one pool for
// every layer, and with the fewest sliding pages in a small pool (where
// the prefix cache sheds sliding pages, counted in /metrics, and requests
// wait for pages); the
// prefix cache serves the repeated prompts; every pool is free afterwards.
// Usage: node hybrid.js URL_HYBRID URL_ONE_POOL URL_TIGHT
'use strict';
const { test, run, client, get, metrics, sleep, assert } = require('./lib');

const [urlA, urlB, urlC] = process.argv.slice(2);
const MODEL = 'gemma3';
const system = 'You are a careful assistant who answers in short sentences and never repeats itself. ';
const asks = ['Name a color.', 'Count to three.', 'Say hello.', 'Pick a fruit.', 'Name a river.', 'Tell a joke.'];
const prompt = (i) => system.repeat(1 + (i % 3)) + asks[i % asks.length] + ' #' + i;

async function settle(url) {
  let m;
  for (let i = 0; i < 200; i++) {
    m = await metrics(url);
    if (m['kiln:num_requests_running'] === 0 && m['kiln:num_requests_waiting'] === 0) break;
    await sleep(25);
  }
  return m;
}

async function greedy(url, n, max_tokens = 24) {
  const oa = client(url);
  return Promise.all(Array.from({ length: n }, async (_, i) => {
    const r = await oa.completions.create({ model: MODEL, prompt: prompt(i), max_tokens, temperature: 0, ignore_eos: true });
    assert.strictEqual(r.usage.completion_tokens, max_tokens);
    return { text: r.choices[0].text, cached: (r.usage.prompt_tokens_details || {}).cached_tokens || 0 };
  }));
}

test('the hybrid pool and its options show in /get_server_info and /metrics', async () => {
  const a = (await get(urlA, '/get_server_info')).json, b = (await get(urlB, '/get_server_info')).json;
  const c = (await get(urlC, '/get_server_info')).json;
  assert.strictEqual(a.swa_full_tokens_ratio, 0.8);
  assert.strictEqual(a.disable_hybrid_swa_memory, false);
  assert.strictEqual(b.disable_hybrid_swa_memory, true);
  assert.strictEqual(c.swa_full_tokens_ratio, 0.01);
  const ma = await metrics(urlA), mb = await metrics(urlB), mc = await metrics(urlC);
  assert.ok(ma['kiln:swa_kv_pages_total'] > 0);
  assert.strictEqual(ma['kiln:swa_kv_pages_free'], ma['kiln:swa_kv_pages_total']);
  assert.strictEqual(ma['kiln:swa_kv_pages_shed_total'], 0);
  assert.strictEqual(mb['kiln:swa_kv_pages_total'], undefined);
  assert.strictEqual(mb['kiln:swa_kv_pages_shed_total'], undefined);
  // the fewest: one request's window (2 x 8 + 2 pages of 4) beside a batch of 16 + 8 rows
  assert.strictEqual(mc['kiln:swa_kv_pages_total'], (2 * 8 + 2 * 4 + 24) / 4);
  assert.ok(mc['kiln:swa_kv_pages_total'] < mc['kiln:kv_pages_total']);
});

test('greedy outputs agree across the hybrid pool, one pool and the fewest sliding pages', async () => {
  const N = 18;
  const [ta, tb, tc] = await Promise.all([greedy(urlA, N), greedy(urlB, N), greedy(urlC, N)]);
  for (let i = 0; i < N; i++) {
    assert.strictEqual(ta[i].text, tb[i].text, `prompt ${i}: hybrid vs one pool`);
    assert.strictEqual(tc[i].text, tb[i].text, `prompt ${i}: fewest sliding pages vs one pool`);
  }
  // the same prompts again: the hybrid pool's prefix cache serves them
  const again = await greedy(urlA, N);
  let cached = 0;
  for (let i = 0; i < N; i++) {
    assert.strictEqual(again[i].text, ta[i].text, `prompt ${i} again`);
    cached += again[i].cached;
  }
  assert.ok(cached > N * 20, `only ${cached} prompt tokens cached`);
  for (const url of [urlA, urlB, urlC]) {
    const m = await settle(url);
    assert.strictEqual(m['kiln:kv_pages_used_by_requests'], 0, url);
    assert.strictEqual(m['kiln:kv_pages_free'] + m['kiln:kv_pages_cached'], m['kiln:kv_pages_total'], url);
  }
  // sliding pages to spare: none shed; the fewest: the prefix cache shed some
  assert.strictEqual((await metrics(urlA))['kiln:swa_kv_pages_shed_total'], 0);
  assert.ok((await metrics(urlC))['kiln:swa_kv_pages_shed_total'] > 0);
});

run();
