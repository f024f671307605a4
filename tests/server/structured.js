// structured.js — structured outputs end to end against the bundled
// stories260K model, whose weights know nothing of JSON: every output that
// parses and validates does so because the grammar forced it. Outputs are
// checked by independent judges: JSON.parse and the `ajv` validator for
// JSON Schemas, JavaScript's RegExp for regular expressions.
// Usage: node structured.js URL (a server with a chat template)
'use strict';
const { test, run, client, post, metrics, assert } = require('./lib');
const Ajv = require('ajv');

const url = process.argv[2];
const oa = client(url);
const MODEL = 'stories260K';
const ajv = new Ajv({ strict: false, allErrors: true });

// A schema whose every value is bounded, so that a model with no idea of
// JSON still reaches the end within max_tokens.
const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    mood: { enum: ['happy', 'sad', 'tired'] },
    ok: { type: 'boolean' },
    pets: { type: 'array', items: { enum: ['cat', 'dog'] }, maxItems: 2 },
  },
  required: ['name', 'mood', 'ok', 'pets'],
  additionalProperties: false,
};
const validate = ajv.compile(SCHEMA);
const MSGS = [{ role: 'user', content: 'Tell me about Lily as JSON.' }];
const RF = { type: 'json_schema', json_schema: { name: 'lily', schema: SCHEMA, strict: true } };

function checkJson(text, why) {
  let v;
  try { v = JSON.parse(text); } catch (e) { assert.fail(`${why}: not JSON: ${JSON.stringify(text)}`); }
  assert.ok(validate(v), `${why}: ${JSON.stringify(text)} fails the schema: ${ajv.errorsText(validate.errors)}`);
  return v;
}

async function chatStream(params) {
  const stream = await oa.chat.completions.create(Object.assign({ stream: true }, params));
  const texts = {}, finish = {};
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      texts[c.index] = (texts[c.index] || '') + (c.delta.content || '');
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  return { texts, finish };
}

test('chat response_format json_schema (strict), greedy: valid JSON that ajv accepts, finish stop', async () => {
  const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, response_format: RF, temperature: 0,
                                               max_tokens: 300 });
  assert.strictEqual(r.choices[0].finish_reason, 'stop');
  checkJson(r.choices[0].message.content, 'greedy');
  // the same request again (the grammar cache's answer) gives the same text
  const again = await oa.chat.completions.create({ model: MODEL, messages: MSGS, response_format: RF,
                                                   temperature: 0, max_tokens: 300 });
  assert.strictEqual(again.choices[0].message.content, r.choices[0].message.content);
});

test('a small request with a constraint compiles its grammar on the tokenizer pool, not the HTTP loop', async () => {
  // the server runs with the default --tokenizer-inline-bytes: a small
  // body without a constraint stays on the loop, one with a constraint
  // goes to the pool (a new schema can take seconds to meet a vocabulary)
  const jobs = async () => (await metrics(url))['kiln:tokenizer_batch_size_sum'] || 0;
  const j0 = await jobs();
  const plain = await post(url, '/v1/completions', { model: MODEL, prompt: 'Lily', max_tokens: 2 });
  assert.strictEqual(plain.status, 200, plain.text);
  const j1 = await jobs();
  assert.strictEqual(j1, j0, 'a small plain request went to the pool');
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['n'] };
  const rf = { type: 'json_schema', json_schema: { name: 'n', schema, strict: true } };
  const r = await post(url, '/v1/completions', { model: MODEL, prompt: 'Lily', max_tokens: 20, response_format: rf });
  assert.strictEqual(r.status, 200, r.text);
  assert.ok(JSON.stringify(rf).length < 4096);
  assert.strictEqual(await jobs(), j1 + 1, 'the constrained request did not go through the pool');
  const g = await post(url, '/generate', { text: 'Lily', sampling_params: { max_new_tokens: 8, regex: '[ab]{3}' } });
  assert.strictEqual(g.status, 200, g.text);
  assert.strictEqual(await jobs(), j1 + 2, '/generate with a regex did not go through the pool');
});

test('chat json_schema sampled: seeds, n=2, streaming and not, every choice validates', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, response_format: RF, temperature: 1.2,
                                                 seed, n: 2, max_tokens: 300 });
    assert.strictEqual(r.choices.length, 2);
    for (const c of r.choices) {
      assert.strictEqual(c.finish_reason, 'stop', `seed ${seed}`);
      checkJson(c.message.content, `seed ${seed} choice ${c.index}`);
    }
    const s = await chatStream({ model: MODEL, messages: MSGS, response_format: RF, temperature: 1.2, seed, n: 2,
                                 max_tokens: 300 });
    for (const i of [0, 1]) {
      assert.strictEqual(s.finish[i], 'stop');
      checkJson(s.texts[i], `stream seed ${seed} choice ${i}`);
      assert.strictEqual(s.texts[i], r.choices[i].message.content, 'a seeded stream repeats the answer');
    }
  }
});

test('completions: response_format json_schema and vLLM guided_json, greedy and sampled', async () => {
  for (const extra of [{ response_format: RF }, { guided_json: SCHEMA }, { structured_outputs: { json: SCHEMA } }]) {
    for (const temperature of [0, 1]) {
      const r = await oa.completions.create(Object.assign({ model: MODEL, prompt: 'Lily was', max_tokens: 300,
                                                            temperature, seed: 7 }, extra));
      assert.strictEqual(r.choices[0].finish_reason, 'stop', JSON.stringify(extra));
      checkJson(r.choices[0].text, `${Object.keys(extra)[0]} t=${temperature}`);
    }
  }
});

test('json_object: the output is one compact JSON object', async () => {
  let stops = 0;
  for (const seed of [11, 12, 13, 14, 15, 16]) {
    // the model writes stories, also inside JSON strings: a push towards
    // '}' (id 128, the byte token 0x7D) lets most objects end in time
    const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, temperature: 1, seed, max_tokens: 400,
                                                 logit_bias: { 128: 8 }, response_format: { type: 'json_object' } });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue; // one endless string
    assert.strictEqual(c.finish_reason, 'stop');
    stops++;
    const v = JSON.parse(c.message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), c.message.content);
    assert.strictEqual(c.message.content, JSON.stringify(v), 'compact');
  }
  assert.ok(stops >= 3, `only ${stops} of 6 objects ended`);
});

test('/generate regex (SGLang), greedy and sampled: the whole output matches RegExp', async () => {
  const re = '(cat|dog)-[0-9]{2,4}( [a-z]{1,5})?';
  const judge = new RegExp(`^(?:${re})$`);
  for (const [temperature, seed] of [[0, 0], [1, 5], [1, 6], [1.5, 7]]) {
    const r = await post(url, '/generate', { text: 'Once upon a time', sampling_params: {
      regex: re, temperature, seed, max_new_tokens: 64 } });
    assert.strictEqual(r.status, 200, r.text);
    assert.ok(judge.test(r.json.text), `${JSON.stringify(r.json.text)} does not match /${re}/`);
    assert.strictEqual(r.json.meta_info.finish_reason.type, 'stop');
  }
  // the OpenAI spellings of the same constraint
  for (const extra of [{ guided_regex: re }, { structured_outputs: { regex: re } }, { regex: re }]) {
    const r = await oa.completions.create(Object.assign({ model: MODEL, prompt: 'Lily', max_tokens: 64,
                                                          temperature: 1, seed: 3 }, extra));
    assert.ok(judge.test(r.choices[0].text), `${JSON.stringify(extra)}: ${JSON.stringify(r.choices[0].text)}`);
  }
});

test('/generate json_schema (a JSON string, SGLang) and ebnf', async () => {
  const r = await post(url, '/generate', { text: 'Lily', sampling_params: {
    json_schema: JSON.stringify(SCHEMA), temperature: 1, seed: 9, max_new_tokens: 300 } });
  assert.strictEqual(r.status, 200, r.text);
  checkJson(r.json.text, '/generate json_schema');
  const g = await post(url, '/generate', { text: 'Lily', sampling_params: {
    ebnf: 'root ::= "yes" | "no" | num\nnum ::= [1-9] [0-9]?', temperature: 1, seed: 4, max_new_tokens: 16 } });
  assert.strictEqual(g.status, 200, g.text);
  assert.ok(/^(yes|no|[1-9][0-9]?)$/.test(g.json.text), JSON.stringify(g.json.text));
});

// A recursive grammar (the pushdown part: nesting the automaton cannot
// inline) and a recogniser of its language written by hand.
const ARITH = 'root ::= expr\n' +
  'expr ::= term (("+" | "-") term)*\n' +
  'term ::= factor ("*" factor)*\n' +
  'factor ::= [0-9] [0-9]? | "(" expr ")" | "[" expr ("," expr)* "]"\n';
function arithOk(t) {
  let i = 0;
  const digits = () => { const s = i; while (i < t.length && i - s < 2 && t[i] >= '0' && t[i] <= '9') i++; return i > s; };
  const factor = () => {
    if (t[i] === '(') { i++; if (!expr() || t[i] !== ')') return false; i++; return true; }
    if (t[i] === '[') {
      i++;
      if (!expr()) return false;
      while (t[i] === ',') { i++; if (!expr()) return false; }
      if (t[i] !== ']') return false;
      i++;
      return true;
    }
    return digits();
  };
  const term = () => { if (!factor()) return false; while (t[i] === '*') { i++; if (!factor()) return false; } return true; };
  const expr = () => {
    if (!term()) return false;
    while (t[i] === '+' || t[i] === '-') { i++; if (!term()) return false; }
    return true;
  };
  return expr() && i === t.length;
}

test('a recursive EBNF (/generate ebnf, vLLM guided_grammar): every output is in its language', async () => {
  assert.ok(arithOk('(1+2)*[3,(4)]-56') && !arithOk('(1+2') && !arithOk('123') && !arithOk('[1,]'), 'the recogniser');
  // stories260K seldom writes a bracket: a logit_bias towards them (closing
  // ones more) makes the outputs nest, so the recursion (a call the
  // automaton cannot inline) is exercised; the grammar alone decides what
  // is valid, the bias only which valid text is drawn
  const bias = {};
  for (const [ch, b] of [['(', 3], ['[', 3], [')', 5], [']', 5]]) {
    const t = await post(url, '/tokenize', { prompt: ch, add_special_tokens: false });
    bias[t.json.tokens[t.json.tokens.length - 1]] = b;
  }
  const depth = (t) => { let d = 0, m = 0; for (const c of t) { d += '(['.includes(c) ? 1 : ')]'.includes(c) ? -1 : 0; m = Math.max(m, d); } return m; };
  let deepest = 0;
  for (const seed of [0, 2, 4, 6, 8, 10]) {
    const g = await post(url, '/generate', { text: 'Lily', sampling_params: { ebnf: ARITH, temperature: 1, seed,
                                                                                 max_new_tokens: 256, logit_bias: bias } });
    assert.strictEqual(g.status, 200, g.text);
    assert.strictEqual(g.json.meta_info.finish_reason.type, 'stop', JSON.stringify(g.json));
    assert.ok(arithOk(g.json.text), `${JSON.stringify(g.json.text)} is not in the language`);
    deepest = Math.max(deepest, depth(g.json.text));
    const c = await oa.completions.create({ model: MODEL, prompt: 'Lily', max_tokens: 256, temperature: 1, seed,
                                            logit_bias: bias, guided_grammar: ARITH });
    assert.strictEqual(c.choices[0].finish_reason, 'stop');
    assert.ok(arithOk(c.choices[0].text), `guided_grammar: ${JSON.stringify(c.choices[0].text)}`);
    deepest = Math.max(deepest, depth(c.choices[0].text));
  }
  assert.ok(deepest >= 2, `brackets nested at most ${deepest} deep: the recursion was not exercised`);
});

test('guided_choice: the output is one of the choices (chat and completions, n=3)', async () => {
  const choices = ['red apple', 'blue "sky"', 'green\\tea', 'yellow'];
  const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, guided_choice: choices, temperature: 1,
                                               seed: 2, n: 3, max_tokens: 20 });
  for (const c of r.choices) assert.ok(choices.includes(c.message.content), JSON.stringify(c.message.content));
  const s = await oa.completions.create({ model: MODEL, prompt: 'The color', temperature: 0, max_tokens: 20,
                                          structured_outputs: { choice: choices } });
  assert.ok(choices.includes(s.choices[0].text), JSON.stringify(s.choices[0].text));
});

test('max_tokens before the structure ends: finish_reason length', async () => {
  const r = await oa.chat.completions.create({ model: MODEL, messages: MSGS, response_format: RF, temperature: 0,
                                               max_tokens: 3 });
  assert.strictEqual(r.choices[0].finish_reason, 'length');
  assert.strictEqual(r.usage.completion_tokens, 3);
  assert.throws(() => JSON.parse(r.choices[0].message.content));
});

async function expect400(path, body, re, param) {
  const r = await post(url, path, body);
  assert.strictEqual(r.status, 400, r.text);
  assert.ok(re.test(r.json.error.message), `message ${JSON.stringify(r.json.error.message)} !~ ${re}`);
  if (param) assert.strictEqual(r.json.error.param, param);
  return r;
}

test('invalid schemas, regexes and grammars: 400 whose message says where', async () => {
  const chat = (extra) => Object.assign({ model: MODEL, messages: MSGS, max_tokens: 5 }, extra);
  const bad = { type: 'object', properties: { a: { type: 'object', properties: { b: { not: { type: 'string' } } } } } };
  await expect400('/v1/chat/completions', chat({ response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: bad } } }), /\/properties\/a\/properties\/b/,
  'response_format.json_schema.schema');
  await expect400('/v1/completions', { model: MODEL, prompt: 'x', guided_json: { type: 'strnig' } }, /at the root/,
    'guided_json');
  await expect400('/v1/completions', { model: MODEL, prompt: 'x', guided_json: '{"type": ' }, /./, 'guided_json');
  await expect400('/generate', { text: 'x', sampling_params: { regex: 'ab(c' } }, /[0-9]/, 'regex');
  await expect400('/generate', { text: 'x', sampling_params: { ebnf: 'root ::= "a"\nfoo ::= ( "b"' } }, /grammar:2:/,
    'ebnf');
  await expect400('/v1/chat/completions', chat({ response_format: { type: 'structural_tag' } }), /structural_tag/);
  await expect400('/v1/chat/completions', chat({ response_format: { type: 'json_schema' } }), /schema/);
  await expect400('/v1/chat/completions', chat({ guided_choice: [] }), /guided_choice/);
  await expect400('/generate', { text: 'x', sampling_params: { structural_tag: '{}' } }, /not supported/);
});

test('two constraints at once: 400 naming both', async () => {
  await expect400('/v1/chat/completions', { model: MODEL, messages: MSGS, response_format: { type: 'json_object' },
    guided_regex: 'a+' }, /response_format.*guided_regex/);
  await expect400('/v1/completions', { model: MODEL, prompt: 'x', structured_outputs: { regex: 'a', choice: ['b'] } },
    /only one/);
  await expect400('/generate', { text: 'x', sampling_params: { regex: 'a', ebnf: 'root ::= "a"' } }, /regex.*ebnf/);
  // response_format text is no constraint
  const ok = await post(url, '/v1/chat/completions', { model: MODEL, messages: MSGS, max_tokens: 2,
    response_format: { type: 'text' }, guided_regex: '[ab]+' });
  assert.strictEqual(ok.status, 200, ok.text);
  assert.ok(/^[ab]+$/.test(ok.json.choices[0].message.content));
});

run();
