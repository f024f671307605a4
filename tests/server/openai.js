// openai.js — the OpenAI-compatible and native routes through the official
// `openai` client (and plain HTTP for SGLang's routes), against the bundled
// stories260K model. Usage: node openai.js URL
'use strict';
const { test, run, client, post, get, assert } = require('./lib');

const url = process.argv[2];
const oa = client(url);
const MODEL = 'stories260K';
const PROMPT = 'Once upon a time, there was a little girl named Lily.';

async function tokenize(text) {
  const r = await post(url, '/tokenize', { prompt: text });
  assert.strictEqual(r.status, 200, r.text);
  return r.json.tokens;
}

async function greedy(prompt, max_tokens, extra = {}) {
  return oa.completions.create(Object.assign({ model: MODEL, prompt, max_tokens, temperature: 0 }, extra));
}

async function streamText(params) {
  const stream = await oa.completions.create(Object.assign({ stream: true }, params));
  const texts = {}, finish = {};
  let usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] || '') + c.text;
      if (c.finish_reason) {
        assert.ok(!(c.index in finish), `choice ${c.index} finished twice`);
        finish[c.index] = c.finish_reason;
      }
    }
  }
  return { texts, finish, usage, chunks };
}

test('GET /v1/models lists the served model', async () => {
  const list = await oa.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepStrictEqual(ids, [MODEL]);
  const h = await get(url, '/health');
  assert.strictEqual(h.status, 200);
});

test('completion: max_tokens gives finish_reason length, usage matches /tokenize', async () => {
  const r = await greedy(PROMPT, 12, { ignore_eos: true });
  assert.strictEqual(r.object, 'text_completion');
  assert.strictEqual(r.choices.length, 1);
  assert.strictEqual(r.choices[0].finish_reason, 'length');
  assert.ok(r.choices[0].text.length > 0);
  const ids = await tokenize(PROMPT);
  assert.strictEqual(r.usage.prompt_tokens, ids.length);
  assert.strictEqual(r.usage.completion_tokens, 12);
  assert.strictEqual(r.usage.total_tokens, ids.length + 12);
  assert.strictEqual(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('streaming equals non-streaming (greedy), with include_usage and one finish per choice', async () => {
  const full = await greedy(PROMPT, 20, { ignore_eos: true });
  const s = await streamText({ model: MODEL, prompt: PROMPT, max_tokens: 20, temperature: 0, ignore_eos: true,
    stream_options: { include_usage: true } });
  assert.strictEqual(s.texts[0], full.choices[0].text);
  assert.strictEqual(s.finish[0], 'length');
  assert.ok(s.usage, 'usage chunk');
  assert.strictEqual(s.usage.completion_tokens, 20);
  assert.strictEqual(s.usage.prompt_tokens, full.usage.prompt_tokens);
});

test('n > 1: indexed choices, streamed and not', async () => {
  const r = await oa.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 8, n: 3, temperature: 1, seed: 7,
    ignore_eos: true });
  assert.deepStrictEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.strictEqual(r.usage.completion_tokens, 24);
  assert.strictEqual(r.usage.prompt_tokens, (await tokenize(PROMPT)).length, 'the prompt counts once');
  const texts = new Set(r.choices.map((c) => c.text));
  assert.ok(texts.size > 1, 'seeded choices differ from each other');
  const s = await streamText({ model: MODEL, prompt: PROMPT, max_tokens: 8, n: 2, temperature: 0, ignore_eos: true });
  assert.deepStrictEqual(Object.keys(s.finish).sort(), ['0', '1']);
  assert.strictEqual(s.texts[0], s.texts[1], 'greedy choices agree');
});

test('several prompts (strings and token ids) and echo', async () => {
  const ids = await tokenize(PROMPT);
  const r = await oa.completions.create({ model: MODEL, prompt: [PROMPT, 'The cat'], max_tokens: 4, temperature: 0 });
  assert.strictEqual(r.choices.length, 2);
  const r2 = await oa.completions.create({ model: MODEL, prompt: [ids], max_tokens: 4, temperature: 0 });
  assert.strictEqual(r2.choices[0].text, r.choices[0].text, 'ids and text prompts agree');
  const r3 = await oa.completions.create({ model: MODEL, prompt: ids, max_tokens: 4, temperature: 0 });
  assert.strictEqual(r3.choices[0].text, r.choices[0].text);
  const e = await oa.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 4, temperature: 0, echo: true });
  assert.strictEqual(e.choices[0].text, PROMPT + r.choices[0].text);
});

test('logprobs: one entry per token, greedy picks the top one', async () => {
  const r = await greedy(PROMPT, 10, { logprobs: 3, ignore_eos: true });
  const lp = r.choices[0].logprobs;
  assert.strictEqual(lp.tokens.length, r.usage.completion_tokens);
  assert.strictEqual(lp.token_logprobs.length, 10);
  assert.strictEqual(lp.top_logprobs.length, 10);
  assert.strictEqual(lp.text_offset.length, 10);
  // the engine's text drops SentencePiece's first space, tokens keep it (decoded in context)
  assert.strictEqual(lp.tokens.join('').trimStart(), r.choices[0].text.trimStart());
  for (let i = 0; i < 10; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = Object.values(lp.top_logprobs[i]);
    assert.ok(top.length >= 3, 'three alternatives');
    assert.ok(Math.abs(Math.max(...top) - lp.token_logprobs[i]) < 1e-5, 'greedy token is the most likely');
  }
  const s = await oa.completions.create({ model: MODEL, prompt: PROMPT, max_tokens: 6, temperature: 0, logprobs: 2,
    stream: true, ignore_eos: true });
  let n = 0;
  for await (const c of s) for (const ch of c.choices) if (ch.logprobs) n += ch.logprobs.tokens.length;
  assert.strictEqual(n, 6, 'streamed logprobs cover every token');
});

test('stop strings: the text ends before the stop string, streamed too', async () => {
  const base = (await greedy(PROMPT, 40, { ignore_eos: true })).choices[0].text;
  const words = base.split(' ').filter((w) => w.length >= 3);
  assert.ok(words.length > 2, `not enough words in ${JSON.stringify(base)}`);
  const stop = words[2];
  const cut = base.slice(0, base.indexOf(stop));
  const r = await greedy(PROMPT, 40, { stop, ignore_eos: true });
  assert.strictEqual(r.choices[0].text, cut);
  assert.ok(!r.choices[0].text.includes(stop));
  assert.strictEqual(r.choices[0].finish_reason, 'stop');
  assert.strictEqual(r.choices[0].matched_stop, stop);
  const r2 = await greedy(PROMPT, 40, { stop: ['zzzz', stop], ignore_eos: true });
  assert.strictEqual(r2.choices[0].text, cut);
  const s = await streamText({ model: MODEL, prompt: PROMPT, max_tokens: 40, temperature: 0, stop: [stop], ignore_eos: true });
  assert.strictEqual(s.texts[0], cut);
  assert.strictEqual(s.finish[0], 'stop');
});

test('stop_token_ids and min_tokens', async () => {
  const g = await post(url, '/generate', { text: PROMPT, sampling_params: { max_new_tokens: 10, temperature: 0, ignore_eos: true } });
  const ids = g.json.output_ids;
  const stopId = ids[3];
  const first = ids.indexOf(stopId);
  const r = await post(url, '/generate', { text: PROMPT, sampling_params: { max_new_tokens: 10, temperature: 0, stop_token_ids: [stopId] } });
  assert.strictEqual(r.status, 200, r.text);
  assert.deepStrictEqual(r.json.output_ids, ids.slice(0, first + 1));
  assert.strictEqual(r.json.meta_info.finish_reason.type, 'stop');
  assert.strictEqual(r.json.meta_info.finish_reason.matched, stopId);
  const m = await post(url, '/generate', { text: PROMPT, sampling_params: { max_new_tokens: 10, min_new_tokens: 10, temperature: 0, stop_token_ids: [stopId] } });
  assert.strictEqual(m.json.output_ids.length, 10, 'min_new_tokens holds stop tokens back');
});

test('seed reproducibility; logit_bias; penalties accepted', async () => {
  const p = { model: MODEL, prompt: PROMPT, max_tokens: 16, temperature: 1.0, top_p: 0.95, top_k: 50, min_p: 0.01, ignore_eos: true };
  const a = await oa.completions.create(Object.assign({ seed: 42 }, p));
  const b = await oa.completions.create(Object.assign({ seed: 42 }, p));
  assert.strictEqual(a.choices[0].text, b.choices[0].text);
  const tok = (await tokenize(' the')).slice(-1)[0];
  const biased = await post(url, '/generate', { text: PROMPT, sampling_params: { max_new_tokens: 4, temperature: 0, logit_bias: { [tok]: 100 }, ignore_eos: true } });
  assert.deepStrictEqual(biased.json.output_ids, [tok, tok, tok, tok]);
  const pen = await oa.completions.create(Object.assign({ seed: 1, presence_penalty: 0.5, frequency_penalty: 0.5, repetition_penalty: 1.2 }, p));
  assert.strictEqual(pen.usage.completion_tokens, 16);
});

test('/generate: text and input_ids, streaming gives cumulative text', async () => {
  const sp = { max_new_tokens: 12, temperature: 0, ignore_eos: true };
  const a = await post(url, '/generate', { text: PROMPT, sampling_params: sp });
  assert.strictEqual(a.status, 200, a.text);
  assert.strictEqual(a.json.output_ids.length, 12);
  assert.strictEqual(a.json.meta_info.completion_tokens, 12);
  assert.strictEqual(a.json.meta_info.finish_reason.type, 'length');
  const ids = await tokenize(PROMPT);
  assert.strictEqual(a.json.meta_info.prompt_tokens, ids.length);
  const b = await post(url, '/generate', { input_ids: ids, sampling_params: sp });
  assert.strictEqual(b.json.text, a.json.text);
  const s = await post(url, '/generate', { text: PROMPT, sampling_params: sp, stream: true });
  const events = s.text.split('\n\n').filter((x) => x.startsWith('data: ')).map((x) => x.slice(6));
  assert.strictEqual(events[events.length - 1], '[DONE]');
  const last = JSON.parse(events[events.length - 2]);
  assert.strictEqual(last.text, a.json.text);
  assert.deepStrictEqual(last.output_ids, a.json.output_ids);
  const batch = await post(url, '/generate', { text: [PROMPT, 'The dog'], sampling_params: sp });
  assert.ok(Array.isArray(batch.json) && batch.json.length === 2);
  assert.strictEqual(batch.json[0].text, a.json.text);
  const lp = await post(url, '/generate', { text: PROMPT, sampling_params: sp, return_logprob: true, top_logprobs_num: 2 });
  assert.strictEqual(lp.json.meta_info.output_token_logprobs.length, 12);
  assert.strictEqual(lp.json.meta_info.output_top_logprobs[0].length, 2);
});

test('/tokenize and /detokenize round trip', async () => {
  const text = 'Tim and Sue went to the park. They saw a big red ball!';
  const t = await post(url, '/tokenize', { prompt: text });
  assert.strictEqual(t.status, 200);
  assert.strictEqual(t.json.count, t.json.tokens.length);
  assert.strictEqual(t.json.max_model_len, 512);
  assert.strictEqual(t.json.tokens[0], 1, 'BOS added like Hugging Face');
  const d = await post(url, '/detokenize', { tokens: t.json.tokens, skip_special_tokens: true });
  assert.strictEqual(d.status, 200);
  assert.strictEqual(d.json.text, text);
  const nob = await post(url, '/tokenize', { prompt: text, add_special_tokens: false });
  assert.deepStrictEqual(nob.json.tokens, t.json.tokens.slice(1));
  const many = await post(url, '/tokenize', { prompt: [text, 'hi'] });
  assert.strictEqual(many.json.tokens.length, 2);
});

test('prefix cache: a repeated prompt is cached, another cache_salt is not', async () => {
  const long = PROMPT + ' She liked to play outside with her friends in the big green park near her house.';
  const salt = `salt-${Date.now()}`;
  const a = await greedy(long, 2, { cache_salt: salt });
  const b = await greedy(long, 2, { cache_salt: salt });
  assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, 'repeat is cached');
  assert.ok(b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens, 'the last token is always computed');
  const c = await greedy(long, 2, { cache_salt: salt + '-other' });
  assert.strictEqual(c.usage.prompt_tokens_details.cached_tokens, 0, 'other salt shares nothing');
  const d = await greedy(long, 2, { cache_salt: salt, extra_key: 'tenant-b' });
  assert.strictEqual(d.usage.prompt_tokens_details.cached_tokens, 0, 'extra_key joins the salt');
  assert.strictEqual(a.choices[0].text, c.choices[0].text);
});

test('chat without a chat template is a clear 400', async () => {
  await assert.rejects(oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && /chat template/.test(e.message));
});

// With a second URL: a server started with --chat-template tests/server/chatml.jinja.
const urlT = process.argv[3];
if (urlT) {
  test('--chat-template FILE: chat works on a model without a template', async () => {
    const c = client(urlT);
    const messages = [{ role: 'user', content: 'Tell me a story.' }];
    const r = await c.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.strictEqual(r.choices[0].finish_reason, 'length');
    const want = await post(urlT, '/tokenize', { prompt: '<s>user: Tell me a story.\nassistant:', add_special_tokens: false });
    assert.strictEqual(want.json.tokens[0], 1, 'bos_token comes from the tokenizer');
    assert.strictEqual(r.usage.prompt_tokens, want.json.count);
    const g = await post(urlT, '/generate', { input_ids: want.json.tokens, sampling_params: { max_new_tokens: 8, temperature: 0, ignore_eos: true } });
    assert.strictEqual(r.choices[0].message.content, g.json.text);
  });
  test('chat fields with no effect on the answer (modalities text, user, metadata, store, service_tier) are accepted',
    async () => {
      const r = await client(urlT).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 2, modalities: ['text'], user: 'u1', metadata: { k: 'v' }, store: false, service_tier: 'auto' });
      assert.strictEqual(r.choices.length, 1);
    });
}

// With a third URL: a server started with --chat-template tests/server/effort.jinja,
// a template that reads `reasoning_effort` (as gpt-oss's harmony template does).
const urlE = process.argv[4];
if (urlE) {
  const messages = [{ role: 'user', content: 'Tell me a story.' }];
  // the prompt the template renders for an effort, and the greedy answer to it
  async function rendered(url, effort) {
    const want = await post(url, '/tokenize', { prompt: `<s>system: Reasoning: ${effort}\nuser: Tell me a story.\nassistant:`,
      add_special_tokens: false });
    const g = await post(url, '/generate', { input_ids: want.json.tokens, sampling_params: { max_new_tokens: 8,
      temperature: 0, ignore_eos: true } });
    return { count: want.json.count, text: g.json.text };
  }
  test('reasoning_effort reaches the chat template (default medium), also through chat_template_kwargs', async () => {
    const c = client(urlE);
    const cases = [
      ['low', { reasoning_effort: 'low' }],
      ['high', { reasoning_effort: 'high' }],
      ['medium', {}], // the template's default
      ['high', { reasoning_effort: 'high', chat_template_kwargs: { reasoning_effort: 'high' } }],
      ['low', { reasoning_effort: null, chat_template_kwargs: { reasoning_effort: 'low' } }],
    ];
    for (const [effort, extra] of cases) {
      const r = await c.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0,
        ignore_eos: true, ...extra });
      const want = await rendered(urlE, effort);
      assert.strictEqual(r.usage.prompt_tokens, want.count, JSON.stringify(extra));
      assert.strictEqual(r.choices[0].message.content, want.text, JSON.stringify(extra));
    }
  });
  test('reasoning_effort: bad values, a conflict, and a template without it are 400s', async () => {
    const cases = [
      [urlE, { reasoning_effort: 'extreme' }, 'invalid_value'],
      [urlE, { reasoning_effort: 3 }, 'invalid_type'],
      [urlE, { reasoning_effort: 'low', chat_template_kwargs: { reasoning_effort: 'high' } }, 'invalid_value'],
      [urlT, { reasoning_effort: 'high' }, 'unsupported'],
    ];
    for (const [url, extra, code] of cases) {
      await assert.rejects(client(url).chat.completions.create({ model: MODEL, messages, max_tokens: 2, ...extra }),
        (e) => e.status === 400 && e.code === code && e.param === 'reasoning_effort', JSON.stringify(extra));
    }
    // the server is still up
    const r = await client(urlE).chat.completions.create({ model: MODEL, messages, max_tokens: 2 });
    assert.strictEqual(r.choices.length, 1);
  });
}

run();
