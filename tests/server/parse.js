// parse.js — SGLang's native parser endpoints on kiln serve:
// /separate_reasoning ({text, reasoning_parser} -> {reasoning_text, text})
// and /parse_function_call ({text, tool_call_parser, tools} ->
// {normal_text, calls: [{tool_index, name, parameters}]}), in SGLang's
// shapes (sglang/srt/entrypoints/http_server.py): tool_index is the
// function's place in `tools`, parameters the arguments' JSON text, a call
// of a function not among the tools is left out; SGLang's parser names;
// bad requests are 400s naming the field.
// Usage: node parse.js URL
'use strict';
const { test, run, post, assertErrorShape, assert } = require('./lib');

const [url] = process.argv.slice(2);
const tools = [
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } },
];

test('/separate_reasoning: qwen3, deepseek-r1 (starts in thought), gpt-oss', async () => {
  let r = await post(url, '/separate_reasoning', { text: '<think>Add them.</think>It is 4.', reasoning_parser: 'qwen3' });
  assert.strictEqual(r.status, 200);
  assert.deepStrictEqual(r.json, { reasoning_text: 'Add them.', text: 'It is 4.' });
  r = await post(url, '/separate_reasoning', { text: 'Add them.</think>It is 4.', reasoning_parser: 'deepseek-r1' });
  assert.deepStrictEqual(r.json, { reasoning_text: 'Add them.', text: 'It is 4.' });
  r = await post(url, '/separate_reasoning', {
    text: '<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>',
    reasoning_parser: 'gpt-oss',
  });
  assert.deepStrictEqual(r.json, { reasoning_text: 'Add them.', text: 'It is 4.' });
  r = await post(url, '/separate_reasoning', { text: 'No thoughts.', reasoning_parser: 'qwen3' });
  assert.deepStrictEqual(r.json, { reasoning_text: '', text: 'No thoughts.' });
});

test('/parse_function_call: qwen25, llama3, gpt-oss; unknown functions left out', async () => {
  const call = (name, args) => `<tool_call>\n{"name": "${name}", "arguments": ${args}}\n</tool_call>`;
  let r = await post(url, '/parse_function_call', {
    text: `Let me look.\n${call('get_weather', '{"city": "Paris"}')}\n${call('launch', '{}')}\n${call('get_time', '{"tz": "UTC"}')}`,
    tool_call_parser: 'qwen25', tools,
  });
  assert.strictEqual(r.status, 200);
  assert.strictEqual(r.json.normal_text, 'Let me look.');
  assert.deepStrictEqual(r.json.calls.map((c) => [c.tool_index, c.name, JSON.parse(c.parameters)]),
    [[1, 'get_weather', { city: 'Paris' }], [0, 'get_time', { tz: 'UTC' }]]);
  r = await post(url, '/parse_function_call', {
    text: '{"name": "get_time", "parameters": {"tz": "CET"}}', tool_call_parser: 'llama3', tools,
  });
  assert.deepStrictEqual(r.json.calls.map((c) => [c.tool_index, c.name, JSON.parse(c.parameters)]),
    [[0, 'get_time', { tz: 'CET' }]]);
  r = await post(url, '/parse_function_call', {
    text: '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
    tool_call_parser: 'gpt-oss', tools,
  });
  assert.strictEqual(r.json.normal_text, '');
  assert.deepStrictEqual(r.json.calls.map((c) => [c.tool_index, c.name, JSON.parse(c.parameters)]),
    [[1, 'get_weather', { city: 'Oslo' }]]);
  r = await post(url, '/parse_function_call', { text: 'Just words.', tool_call_parser: 'qwen25', tools });
  assert.deepStrictEqual(r.json, { normal_text: 'Just words.', calls: [] });
});

test('bad requests: 400 naming the field', async () => {
  const cases = [
    ['/separate_reasoning', { reasoning_parser: 'qwen3' }, 'text'],
    ['/separate_reasoning', { text: 7, reasoning_parser: 'qwen3' }, 'text'],
    ['/separate_reasoning', { text: 'x' }, 'reasoning_parser'],
    ['/separate_reasoning', { text: 'x', reasoning_parser: 'nope' }, 'reasoning_parser'],
    ['/parse_function_call', { text: 'x', tools }, 'tool_call_parser'],
    ['/parse_function_call', { text: 'x', tool_call_parser: 'nope', tools }, 'tool_call_parser'],
    ['/parse_function_call', { text: 'x', tool_call_parser: 'qwen25' }, 'tools'],
    ['/parse_function_call', { text: 'x', tool_call_parser: 'qwen25', tools: [{ type: 'function' }] }, 'tools'],
  ];
  for (const [path, body, param] of cases) {
    const r = await post(url, path, body);
    assert.strictEqual(r.status, 400, `${path} ${JSON.stringify(body)}`);
    assertErrorShape(r.json, path);
    assert.strictEqual(r.json.error.param, param, `${path} ${JSON.stringify(body)}`);
  }
  const r = await post(url, '/parse_function_call', '{not json');
  assert.strictEqual(r.status, 400);
});

run();
