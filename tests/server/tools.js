// tools.js — tool calls and reasoning with the official openai client.
// Usage: node tools.js URL (a server with the real Qwen3 chat template,
// --tool-call-parser auto, --reasoning-parser qwen3).
'use strict';
const { test, run, client, post, assert } = require('./lib');

const url = process.argv[2];
const oa = client(url);
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
const HISTORY = [
  { role: 'user', content: 'weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function',
    function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
  { role: 'tool', tool_call_id: 'call_abc', content: '{"temp": 20}' },
];

async function tokens(body) {
  const r = await post(url, '/tokenize', body);
  assert.strictEqual(r.status, 200, r.text);
  return r.json.tokens;
}

test('a tool round trip in history renders as the Qwen3 template does', async () => {
  // the template's own text for these messages (the arguments string is
  // written as is; the tool result goes in a user turn)
  const rendered = '<|im_start|>user\nweather in Paris?<|im_end|>\n' +
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' +
    '<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response><|im_end|>\n<|im_start|>assistant\n';
  assert.deepStrictEqual(await tokens({ messages: HISTORY }), await tokens({ prompt: rendered, add_special_tokens: false }));
});

test('chat with tools and a tool history: an OpenAI-shaped answer', async () => {
  for (const stream of [false, true]) {
    const req = { model: 'qwen3', messages: HISTORY, tools: TOOLS, tool_choice: 'auto', max_tokens: 8, temperature: 0,
      ignore_eos: true, parallel_tool_calls: false };
    if (!stream) {
      const r = await oa.chat.completions.create(req);
      const m = r.choices[0].message;
      assert.strictEqual(m.role, 'assistant');
      assert.ok('reasoning_content' in m, 'the reasoning parser is on');
      assert.ok(['length', 'stop', 'tool_calls'].includes(r.choices[0].finish_reason));
      continue;
    }
    const s = await oa.chat.completions.create(Object.assign({ stream: true }, req));
    let finish = null;
    for await (const c of s) for (const ch of c.choices) if (ch.finish_reason) finish = ch.finish_reason;
    assert.strictEqual(finish, 'length');
  }
});

test('tool_choice and tool history are checked: 400 with an OpenAI error body', async () => {
  const bad = [
    [{ tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: [{ type: 'function' }] }, 'tools'],
    [{ tools: TOOLS, messages: [HISTORY[0], HISTORY[1], { role: 'tool', content: 'x' }] }, 'messages'],
    [{ messages: [HISTORY[0], { role: 'assistant', content: null }, { role: 'user', content: 'x' }] }, 'messages'],
  ];
  for (const [extra, param] of bad) {
    const req = Object.assign({ model: 'qwen3', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }, extra);
    await assert.rejects(oa.chat.completions.create(req), (e) => {
      assert.strictEqual(e.status, 400, JSON.stringify(extra));
      assert.strictEqual(typeof e.error.message, 'string');
      if (param) assert.strictEqual(e.error.param, param, e.error.message);
      return true;
    });
  }
  // the tool message names its call; "none" still renders the tools
  const r = await oa.chat.completions.create({ model: 'qwen3', messages: HISTORY, tools: TOOLS, tool_choice: 'none',
    max_tokens: 2, temperature: 0, ignore_eos: true });
  assert.strictEqual(typeof r.choices[0].message.content, 'string');
});

run();
