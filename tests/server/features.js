// features.js — serving features through the official `openai` client and
// plain HTTP, against the bundled stories260K model.
// Usage: node features.js URL LOG URL_GREEDY_DEFAULTS URL_OPENAI_DEFAULTS URL_CORS
//   URL     a server with --decode-log-interval 1 whose stderr is LOG
//   URL_G   a stories260K copy whose generation_config.json says top_k 1
//   URL_O   the same copy with --sampling-defaults openai
//   URL_C   --allowed-origins "http://allowed.example, http://other.example"
'use strict';
const fs = require('fs');
const { test, run, client, post, get, request, assert, sleep } = require('./lib');

const [url, logPath, urlG, urlO, urlC] = process.argv.slice(2);
const oa = client(url);
const MODEL = 'stories260K';

const close = (a, b, what) => assert.ok(Math.abs(a - b) < 1e-4, `${what}: ${a} vs ${b}`);

test('the first output token keeps its leading space; echo joins; a stop string with the space matches', async () => {
  const r = await oa.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 3, temperature: 0, logprobs: 0 });
  const c = r.choices[0];
  // the logprob tokens are the independent truth: the text is their concatenation
  assert.strictEqual(c.text, c.logprobs.tokens.join(''));
  assert.ok(c.text.startsWith(' upon'), JSON.stringify(c.text));
  const e = await oa.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 3, temperature: 0, echo: true });
  assert.strictEqual(e.choices[0].text, 'Once' + c.text);
  const s = await oa.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 3, temperature: 0, stop: [' upon'] });
  assert.strictEqual(s.choices[0].finish_reason, 'stop');
  assert.strictEqual(s.choices[0].text, '');
  assert.strictEqual(s.usage.completion_tokens, 1);
  const g = await post(url, '/generate', { text: 'Once', sampling_params: { max_new_tokens: 3, temperature: 0 } });
  assert.strictEqual(g.json.text, c.text);
});

test('echo + logprobs: the prompt tokens\' logprobs (first null), equal to those of generating them', async () => {
  // generating "Once" -> " upon" -> " a" greedily gives the logprobs of those tokens ...
  const gen = await oa.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 3, temperature: 0, logprobs: 2 });
  const gl = gen.choices[0].logprobs;
  // ... and echoing the prompt "Once upon a" must give the same numbers for them
  const prompt = 'Once' + gl.tokens.slice(0, 2).join('');
  for (const max_tokens of [0, 2]) {
    const r = await oa.completions.create({ model: MODEL, prompt, max_tokens, temperature: 0, echo: true, logprobs: 2 });
    const c = r.choices[0];
    const lp = c.logprobs;
    const n = r.usage.prompt_tokens;
    assert.strictEqual(lp.tokens.length, n + max_tokens);
    assert.strictEqual(lp.token_logprobs[0], null);
    assert.strictEqual(lp.top_logprobs[0], null);
    for (let k = 1; k < lp.tokens.length; k++) {
      assert.strictEqual(typeof lp.token_logprobs[k], 'number');
      assert.ok(lp.token_logprobs[k] <= 0);
      assert.ok(lp.tokens[k] in lp.top_logprobs[k]);
    }
    close(lp.token_logprobs[n - 2], gl.token_logprobs[0], '" upon"');
    close(lp.token_logprobs[n - 1], gl.token_logprobs[1], '" a"');
    assert.deepStrictEqual(Object.keys(lp.top_logprobs[n - 1]).sort(), Object.keys(gl.top_logprobs[1]).sort());
    if (max_tokens) close(lp.token_logprobs[n], gl.token_logprobs[2], 'first output token');
    // offsets are cumulative over the token texts
    for (let k = 1; k < lp.tokens.length; k++)
      assert.strictEqual(lp.text_offset[k], lp.text_offset[k - 1] + lp.tokens[k - 1].length);
    // a second time the prompt is cached, and the logprobs must not change
    const again = await oa.completions.create({ model: MODEL, prompt, max_tokens, temperature: 0, echo: true, logprobs: 2 });
    assert.deepStrictEqual(again.choices[0].logprobs.token_logprobs, lp.token_logprobs);
  }
  // streamed: the echo chunk carries the prompt's logprobs
  const stream = await oa.completions.create({ model: MODEL, prompt, max_tokens: 1, temperature: 0, echo: true, logprobs: 1, stream: true });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  const first = chunks[0].choices[0];
  assert.ok(first.text.startsWith('Once'));
  assert.strictEqual(first.logprobs.token_logprobs[0], null);
  close(first.logprobs.token_logprobs.at(-1), gl.token_logprobs[1], 'streamed " a"');
});

test('/generate: return_logprob + logprob_start_len gives input_token_logprobs', async () => {
  const ids = (await post(url, '/tokenize', { prompt: 'Once upon a time' })).json.tokens;
  const echo = await oa.completions.create({ model: MODEL, prompt: ids, max_tokens: 0, echo: true, logprobs: 1 });
  const want = echo.choices[0].logprobs.token_logprobs;
  for (const start of [0, 2]) {
    const r = await post(url, '/generate', {
      input_ids: ids, sampling_params: { max_new_tokens: 1, temperature: 0 },
      return_logprob: true, logprob_start_len: start, top_logprobs_num: 2,
    });
    assert.strictEqual(r.status, 200, r.text);
    const m = r.json.meta_info;
    assert.strictEqual(m.input_token_logprobs.length, ids.length - start);
    assert.strictEqual(m.input_top_logprobs.length, ids.length - start);
    m.input_token_logprobs.forEach(([lp, id], k) => {
      assert.strictEqual(id, ids[start + k]);
      if (start + k === 0) assert.strictEqual(lp, null);
      else close(lp, want[start + k], `position ${start + k}`);
    });
    assert.strictEqual(m.input_top_logprobs[0] === null, start === 0);
    assert.strictEqual(m.input_top_logprobs.at(-1).length, 2);
  }
  // SGLang's default (-1): output tokens only
  const d = await post(url, '/generate', { input_ids: ids, sampling_params: { max_new_tokens: 1 }, return_logprob: true });
  assert.ok(!('input_token_logprobs' in d.json.meta_info));
});

test('generation_config.json sampling defaults apply to unset fields; --sampling-defaults openai ignores them', async () => {
  const greedy = (await client(urlG).completions.create({ model: 'greedy-model', prompt: 'Once', max_tokens: 24, temperature: 0 })).choices[0].text;
  const texts = async (u, extra) => {
    const out = [];
    for (let seed = 1; seed <= 4; seed++)
      out.push((await client(u).completions.create(Object.assign({ model: 'greedy-model', prompt: 'Once', max_tokens: 24, seed }, extra))).choices[0].text);
    return out;
  };
  // the model's top_k 1 makes them greedy, whatever the seed
  for (const t of await texts(urlG, {})) assert.strictEqual(t, greedy);
  // chat-style native request: the same defaults
  const g = await post(urlG, '/generate', { text: 'Once', sampling_params: { max_new_tokens: 24, sampling_seed: 7 } });
  assert.strictEqual(g.json.text, greedy);
  // a request that sets top_k samples
  assert.ok((await texts(urlG, { top_k: 0 })).some((t) => t !== greedy));
  assert.ok((await texts(urlO, {})).some((t) => t !== greedy));
  const info = (await get(urlG, '/get_server_info')).json;
  assert.strictEqual(info.sampling_defaults, 'model');
  assert.deepStrictEqual(info.default_sampling_params, { top_k: 1 });
  const infoO = (await get(urlO, '/get_server_info')).json;
  assert.strictEqual(infoO.sampling_defaults, 'openai');
  assert.deepStrictEqual(infoO.default_sampling_params, {});
});

test('/health_generate runs a token through the engine', async () => {
  const before = (await get(url, '/get_server_info')).json;
  const r = await get(url, '/health_generate');
  assert.strictEqual(r.status, 200, r.text);
  // it went through the engine: the log shows its one-token prefill
  await sleep(100);
  const log = fs.readFileSync(logPath, 'utf8');
  assert.ok(/Prefill batch\. #new-seq: 1, #new-token: 1, /.test(log), 'no one-token prefill in the log');
  assert.strictEqual(before.model_path.endsWith('stories260K'), true);
});

test('/get_server_info: the effective configuration', async () => {
  const r = await get(url, '/get_server_info');
  assert.strictEqual(r.status, 200);
  const v = r.json;
  assert.strictEqual(v.served_model_name, MODEL);
  assert.strictEqual(v.context_length, 512);
  assert.strictEqual(v.port, Number(new URL(url).port));
  assert.strictEqual(v.decode_log_interval, 1);
  assert.strictEqual(v.chunked_prefill_size, 512);
  assert.strictEqual(v.schedule_policy, 'fcfs');
  assert.strictEqual(v.api_key, null);
  assert.strictEqual(v.allowed_origins, '*');
  assert.ok(v.max_total_tokens > 0);
});

test('/v1/models/{id}: the model, or an OpenAI 404', async () => {
  const m = await oa.models.retrieve(MODEL);
  assert.strictEqual(m.id, MODEL);
  assert.strictEqual(m.object, 'model');
  let err;
  try { await oa.models.retrieve('no-such-model'); } catch (e) { err = e; }
  assert.ok(err, 'no error for an unknown model');
  assert.strictEqual(err.status, 404);
  assert.strictEqual(err.code, 'model_not_found');
  const raw = await request(url, 'DELETE', '/v1/models/' + MODEL);
  assert.strictEqual(raw.status, 405);
});

test('a prompt longer than the context: 400 context_length_exceeded', async () => {
  let err;
  try {
    await oa.completions.create({ model: MODEL, prompt: Array(600).fill(300), max_tokens: 1 });
  } catch (e) { err = e; }
  assert.ok(err);
  assert.strictEqual(err.status, 400);
  assert.strictEqual(err.code, 'context_length_exceeded');
});

test('CORS: preflight and simple requests, all origins by default, a list with --allowed-origins', async () => {
  const pre = (u, origin) => request(u, 'OPTIONS', '/v1/chat/completions', undefined, {
    origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type',
  });
  let r = await pre(url, 'http://anywhere.example');
  assert.strictEqual(r.status, 200);
  assert.strictEqual(r.headers['access-control-allow-origin'], 'http://anywhere.example');
  assert.ok(/POST/.test(r.headers['access-control-allow-methods']));
  assert.strictEqual(r.headers['access-control-allow-headers'], 'authorization, content-type');
  r = await get(url, '/v1/models', { origin: 'http://anywhere.example' });
  assert.strictEqual(r.status, 200);
  assert.strictEqual(r.headers['access-control-allow-origin'], 'http://anywhere.example');
  r = await get(url, '/v1/models');
  assert.ok(!('access-control-allow-origin' in r.headers));
  r = await pre(urlC, 'http://other.example');
  assert.strictEqual(r.status, 200);
  assert.strictEqual(r.headers['access-control-allow-origin'], 'http://other.example');
  r = await pre(urlC, 'http://evil.example');
  assert.strictEqual(r.status, 400);
  assert.ok(!('access-control-allow-origin' in r.headers));
  r = await get(urlC, '/v1/models', { origin: 'http://evil.example' });
  assert.strictEqual(r.status, 200);
  assert.ok(!('access-control-allow-origin' in r.headers));
});

test('periodic log lines: Prefill and Decode batch, as SGLang prints them', async () => {
  await oa.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 });
  await sleep(100);
  const log = fs.readFileSync(logPath, 'utf8');
  assert.ok(/Prefill batch\. #new-seq: \d+, #new-token: \d+, #cached-token: \d+, token usage: \d+\.\d\d, #running-req: \d+, #queue-req: \d+/.test(log));
  const m = /Decode batch\. #running-req: (\d+), #token: (\d+), token usage: (\d+\.\d\d), gen throughput \(token\/s\): (\d+\.\d\d), #queue-req: (\d+)/.exec(log);
  assert.ok(m, 'no Decode batch line');
  assert.ok(Number(m[1]) >= 1 && Number(m[2]) > 0 && Number(m[4]) > 0);
});

run();
