// chat_score.js — chat completions through the model's ChatML template, and
// /v1/score against the oracle's reference logits, for a tiny oracle model.
// Usage: node chat_score.js URL MODEL_DIR [score-only]
'use strict';
const path = require('path');
const { test, run, client, post, readSafetensors, assert } = require('./lib');

const url = process.argv[2];
const dir = process.argv[3];
const scoreOnly = process.argv[4] === 'score-only';
const MODEL = path.basename(dir);
const oa = client(url);
const MSGS = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello to the world.' }];

async function tokens(body) {
  const r = await post(url, '/tokenize', body);
  assert.strictEqual(r.status, 200, r.text);
  return r.json.tokens;
}

if (!scoreOnly) {
  test('chat: the ChatML prompt, tokenized without extra special tokens', async () => {
    const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 6, temperature: 0, ignore_eos: true });
    assert.strictEqual(r.object, 'chat.completion');
    assert.strictEqual(r.choices[0].message.role, 'assistant');
    assert.strictEqual(typeof r.choices[0].message.content, 'string');
    assert.strictEqual(r.choices[0].finish_reason, 'length');
    const rendered = '<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hello to the world.<|im_end|>\n<|im_start|>assistant\n';
    const want = await tokens({ prompt: rendered, add_special_tokens: false });
    assert.strictEqual(want[0], 1, '<|im_start|> is one special token');
    assert.deepStrictEqual(await tokens({ messages: MSGS }), want);
    assert.strictEqual(r.usage.prompt_tokens, want.length);
    assert.strictEqual(r.usage.completion_tokens, 6);
  });

  test('chat streaming: role first, same text as non-streaming, usage', async () => {
    const full = await oa.chat.completions.create({ model: MODEL, messages: MSGS, max_completion_tokens: 10, temperature: 0, ignore_eos: true });
    const stream = await oa.chat.completions.create({ model: MODEL, messages: MSGS, max_completion_tokens: 10, temperature: 0,
      ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    let text = '', first = true, finish = null, usage = null;
    for await (const c of stream) {
      assert.strictEqual(c.object, 'chat.completion.chunk');
      if (c.usage) usage = c.usage;
      for (const ch of c.choices) {
        if (first) { assert.strictEqual(ch.delta.role, 'assistant'); first = false; }
        text += ch.delta.content || '';
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert.strictEqual(text, full.choices[0].message.content);
    assert.strictEqual(finish, 'length');
    assert.strictEqual(usage.completion_tokens, 10);
    assert.strictEqual(usage.prompt_tokens, full.usage.prompt_tokens);
  });

  test('chat logprobs with top_logprobs, n > 1, content parts, tools and chat_template_kwargs', async () => {
    const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 5, temperature: 0, logprobs: true,
      top_logprobs: 3, n: 2, ignore_eos: true });
    assert.strictEqual(r.choices.length, 2);
    for (const ch of r.choices) {
      const lp = ch.logprobs.content;
      assert.strictEqual(lp.length, 5);
      for (const e of lp) {
        assert.strictEqual(e.top_logprobs.length, 3);
        assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5, 'greedy picks the top token');
        assert.ok(Array.isArray(e.bytes));
      }
    }
    const parts = await oa.chat.completions.create({ model: MODEL, max_tokens: 5, temperature: 0, ignore_eos: true,
      messages: [MSGS[0], { role: 'user', content: [{ type: 'text', text: 'Say hello to the world.' }] }] });
    assert.strictEqual(parts.choices[0].message.content, r.choices[0].message.content);
    const tools = await oa.chat.completions.create({ model: MODEL, messages: MSGS, max_tokens: 3, temperature: 0,
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
      chat_template_kwargs: { enable_thinking: false } });
    assert.strictEqual(tools.choices.length, 1);
    await assert.rejects(oa.chat.completions.create({ model: MODEL, messages: [] }), (e) => e.status === 400 && e.error.param === 'messages');
    await assert.rejects(oa.chat.completions.create({ model: MODEL, messages: [{ content: 'x' }] }), (e) => e.status === 400);
    await assert.rejects(oa.chat.completions.create({ model: MODEL, messages: MSGS, top_logprobs: 21, logprobs: true }), (e) => e.status === 400);
  });
}

function softmax(row, ids, labelsOnly) {
  const xs = labelsOnly ? ids.map((i) => row[i]) : Array.from(row);
  const m = Math.max(...xs);
  const sum = xs.reduce((a, x) => a + Math.exp(x - m), 0);
  return ids.map((i) => Math.exp(row[i] - m) / sum);
}

test('/v1/score equals softmax of the oracle logits (1e-4)', async () => {
  const ref = readSafetensors(path.join(dir, 'reference.safetensors'));
  const labels = [0, 5, 17, 100, 513, 1023];
  let checked = 0;
  for (let p = 0; `p${p}.ids` in ref; p++) {
    const ids = Array.from(ref[`p${p}.ids`].data);
    const logits = ref[`p${p}.logits`];
    const V = logits.shape[1];
    const row = (pos) => logits.data.subarray(pos * V, (pos + 1) * V);
    const k = Math.max(1, Math.floor(ids.length / 2));
    const items = [ids.slice(k), ids.slice(k, ids.length - 1), [ids[k]]];
    for (const apply_softmax of [false, true]) {
      const r = await post(url, '/v1/score', { model: MODEL, query: ids.slice(0, k), items, label_token_ids: labels, apply_softmax });
      assert.strictEqual(r.status, 200, r.text);
      assert.strictEqual(r.json.object, 'scoring');
      assert.strictEqual(r.json.scores.length, items.length);
      items.forEach((it, j) => {
        const want = softmax(row(k + it.length - 1), labels, apply_softmax);
        r.json.scores[j].forEach((x, l) => assert.ok(Math.abs(x - want[l]) < 1e-4, `p${p} item ${j} label ${labels[l]}: ${x} vs ${want[l]}`));
        checked++;
      });
      const total = items.reduce((a, it) => a + k + it.length, 0);
      assert.strictEqual(r.json.usage.prompt_tokens, total);
    }
    // item_first: item + query
    const r2 = await post(url, '/v1/score', { query: ids.slice(k), items: [ids.slice(0, k)], label_token_ids: labels, item_first: true });
    const want = softmax(row(ids.length - 1), labels, false);
    r2.json.scores[0].forEach((x, l) => assert.ok(Math.abs(x - want[l]) < 1e-4));
  }
  assert.ok(checked >= 12, `checked ${checked}`);
  const t = await post(url, '/v1/score', { query: 'Hello', items: ['world', 'there'], label_token_ids: [3, 4], apply_softmax: true });
  assert.strictEqual(t.status, 200, t.text);
  for (const s of t.json.scores) assert.ok(Math.abs(s[0] + s[1] - 1) < 1e-5);
});

run();
