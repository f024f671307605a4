// hicache.js — a server with the prefix cache's host tier against one
// without, both with a KV pool of 384 tokens: a long prompt, then enough
// other long prompts to evict it from the device pool, then the first
// again. With the tier it comes back from host memory (usage's
// cached_tokens, kiln:hicache_loaded_tokens_total); without it nothing is
// cached; the texts are the same. /get_server_info says it is on.
// Usage: node hicache.js URL_PLAIN URL_HICACHE
'use strict';
const { test, run, client, get, metrics, assert } = require('./lib');

const [urlA, urlB] = process.argv.slice(2);
const MODEL = 'stories260K';
const names = ['Lily', 'Tom', 'Sue', 'Max', 'Ben', 'Anna', 'Zoe', 'Sam'];
// about 150 tokens each, different from the first word on
const story = (i) => `${names[i]} ` + Array.from({ length: 24 }, (_, k) =>
  `${names[(i + k) % 8]} saw a ${['dog', 'cat', 'bird', 'tree', 'ball'][(i * 3 + k) % 5]}.`).join(' ');

async function ask(oa, i) {
  const r = await oa.completions.create({ model: MODEL, prompt: story(i), max_tokens: 12, temperature: 0 });
  return { text: r.choices[0].text, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0,
           prompt: r.usage.prompt_tokens };
}

async function sequence(url) {
  const oa = client(url);
  const first = await ask(oa, 0);
  for (let i = 1; i <= 4; i++) await ask(oa, i);
  const again = await ask(oa, 0);
  return { first, again };
}

test('evicted prompts come back from host memory, with the same texts', async () => {
  const a = await sequence(urlA), b = await sequence(urlB);
  assert.strictEqual(b.first.text, a.first.text);
  assert.strictEqual(a.again.text, a.first.text);
  assert.strictEqual(b.again.text, a.first.text);
  assert.strictEqual(a.again.cached, 0, 'without the tier the prompt was evicted');
  assert.ok(b.again.cached >= b.again.prompt - 4, `cached ${b.again.cached} of ${b.again.prompt}`);
  const ma = await metrics(urlA), mb = await metrics(urlB);
  assert.strictEqual(ma['kiln:hicache_pages_total'], undefined);
  assert.ok(mb['kiln:hicache_pages_total'] >= 4 * 384 / 4 - 4);
  assert.ok(mb['kiln:hicache_saved_pages_total'] > 0);
  assert.strictEqual(mb['kiln:hicache_loaded_tokens_total'], b.again.cached);
  const ib = (await get(urlB, '/get_server_info')).json;
  assert.strictEqual(ib.enable_hierarchical_cache, true);
});

run();
