// spec.js — a server with speculative decoding (NGRAM) answers greedy
// requests, streamed and not, with the same text as one without, and
// counts its drafts in /metrics; /get_server_info says how it runs.
// Usage: node spec.js URL_PLAIN URL_SPEC
'use strict';
const { test, run, client, get, metrics, assert } = require('./lib');

const [urlA, urlB] = process.argv.slice(2);
const MODEL = 'stories260K';
const names = ['Lily', 'Tom', 'Sue', 'Max', 'Ben', 'Anna'];
const prompt = (i) => `Once upon a time, ${names[i % 6]} went to the park. ${names[(i + 1) % 6]} said`;

async function texts(url, n, stream) {
  const oa = client(url);
  return Promise.all(Array.from({ length: n }, async (_, i) => {
    const req = { model: MODEL, prompt: prompt(i), max_tokens: 20 + (i * 7) % 40, temperature: 0 };
    if (!stream) return (await oa.completions.create(req)).choices[0].text;
    let t = '';
    for await (const c of await oa.completions.create({ ...req, stream: true })) t += c.choices[0].text;
    return t;
  }));
}

test('the same greedy texts with drafts, streamed and not; drafts counted', async () => {
  const N = 16;
  const [a, b, bs] = await Promise.all([texts(urlA, N, false), texts(urlB, N, false), texts(urlB, N, true)]);
  for (let i = 0; i < N; i++) {
    assert.strictEqual(b[i], a[i], `request ${i}`);
    assert.strictEqual(bs[i], a[i], `request ${i}, streamed`);
  }
  const ma = await metrics(urlA), mb = await metrics(urlB);
  assert.strictEqual(ma['kiln:spec_draft_tokens_total'], 0);
  assert.ok(mb['kiln:spec_draft_tokens_total'] > 0);
  assert.ok(mb['kiln:spec_accepted_tokens_total'] > 0);
  assert.ok(mb['kiln:spec_accepted_tokens_total'] <= mb['kiln:spec_draft_tokens_total']);
  const ia = (await get(urlA, '/get_server_info')).json, ib = (await get(urlB, '/get_server_info')).json;
  assert.strictEqual(ia.speculative_algorithm, null);
  assert.strictEqual(ib.speculative_algorithm, 'NGRAM');
  assert.strictEqual(ib.speculative_num_draft_tokens, 5);
});

run();
