// dist.js — a server whose model runs over several ranks (--tp 2): many
// concurrent streams, and --deterministic results that do not depend on the
// batch; then a completion from a server spread over two nodes.
// Usage: node dist.js URL_TP2_DETERMINISTIC URL_TWO_NODES
'use strict';
const { test, run, client, post, metrics, sleep, assert } = require('./lib');

const [urlD, urlN] = process.argv.slice(2);
const MODEL = 'stories260K';
const names = ['Lily', 'Tom', 'Sue', 'Max', 'Ben', 'Anna', 'Tim', 'Mia'];
const things = ['a red ball', 'a big tree', 'a small cat', 'the sea', 'a toy car', 'a cake', 'the moon', 'a dog'];
const prompt = (i) => `Once upon a time, ${names[i % 8]} saw ${things[(i * 5 + 3) % 8]}. ${names[(i + 3) % 8]} said`;

test('50 concurrent streams (sampled and greedy, n = 2, logprobs) finish with consistent counts', async () => {
  const oa = client(urlD);
  const runs = Array.from({ length: 50 }, async (_, i) => {
    const max_tokens = 4 + ((i * 37) % 23), n = i % 5 === 0 ? 2 : 1;
    const stream = await oa.completions.create({ model: MODEL, prompt: prompt(i), max_tokens, n,
      temperature: i % 3 ? 0.8 : 0, seed: i, logprobs: 1, ignore_eos: true, stream: true,
      stream_options: { include_usage: true } });
    const tokens = {}, finish = {};
    let usage = null;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        if (ch.logprobs) tokens[ch.index] = (tokens[ch.index] || 0) + ch.logprobs.tokens.length;
        if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
      }
    }
    assert.ok(usage, `request ${i}: usage`);
    assert.strictEqual(usage.completion_tokens, n * max_tokens, `request ${i}`);
    for (let k = 0; k < n; k++) {
      assert.strictEqual(finish[k], 'length', `request ${i} choice ${k}`);
      assert.strictEqual(tokens[k], max_tokens, `request ${i} choice ${k}: logprobs`);
    }
  });
  await Promise.all(runs);
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics(urlD);
    if (m['kiln:num_requests_running'] === 0) break;
    await sleep(50);
  }
  assert.strictEqual(m['kiln:num_requests_running'], 0);
  assert.strictEqual(m['kiln:kv_pages_used_by_requests'], 0, 'pages still held by requests');
});

// /generate's output ids for prompt i, greedy or seeded sampling
async function ids(url, i, sampled) {
  const r = await post(url, '/generate', { text: prompt(i), sampling_params: { max_new_tokens: 24,
    temperature: sampled ? 0.9 : 0, seed: 1000 + i, ignore_eos: true } });
  assert.strictEqual(r.status, 200, r.text);
  assert.strictEqual(r.json.output_ids.length, 24);
  return r.json.output_ids;
}

test('--deterministic: a request alone and among 31 others gives the same tokens (greedy and sampled)', async () => {
  for (const sampled of [false, true]) {
    const alone = await ids(urlD, 0, sampled);
    const batch = await Promise.all(Array.from({ length: 32 }, (_, i) => ids(urlD, i, sampled)));
    assert.deepStrictEqual(batch[0], alone, sampled ? 'sampled' : 'greedy');
  }
});

test('two nodes: a completion', async () => {
  const r = await client(urlN).completions.create({ model: MODEL, prompt: prompt(1), max_tokens: 12, temperature: 0,
    ignore_eos: true });
  assert.strictEqual(r.usage.completion_tokens, 12);
  assert.ok(r.choices[0].text.length > 0);
  // the same model over one node gives the same text
  const one = await client(urlD).completions.create({ model: MODEL, prompt: prompt(1), max_tokens: 12, temperature: 0,
    ignore_eos: true });
  assert.strictEqual(r.choices[0].text, one.choices[0].text);
});

run();
