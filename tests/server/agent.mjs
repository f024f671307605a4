// agent.mjs — a tool-calling agent loop of the Vercel AI SDK (npm `ai` with
// `@ai-sdk/openai-compatible`, tool parameters as `zod` schemas) against
// kiln serve, non-streaming (generateText) and streaming (streamText).
//
// Step 1 forces a call (toolChoice "required", or the tool named): kiln's
// grammar must make the random-weights model write a call whose arguments
// match the tool's schema, which the SDK parses, validates with zod and
// executes. Step 2 (prepareStep: toolChoice "none" or "auto") sends the
// call and the tool's result back, and the model answers in text. Checked:
// what the tool got is what kiln returned and satisfies the schema; the
// second request's messages carry the assistant's call and the tool
// result under the call's id; the finish reasons; usage on every step.
//
// Usage: node agent.mjs URL NPM_DIR (a server with the real Qwen3 chat
// template and --tool-call-parser auto; NPM_DIR is what
// scripts/fetch-npm.sh prints). The SDK is ESM, which NODE_PATH does not
// reach: each package is imported by the path of its "import" entry.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const { test, run, post, assert } = createRequire(import.meta.url)('./lib.js');
const [url, npmDir] = process.argv.slice(2);

async function importPackage(name) {
  const dir = path.join(npmDir, 'node_modules', name);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
  let entry = pkg.exports && (pkg.exports['.'] ?? pkg.exports);
  while (entry && typeof entry === 'object') entry = entry.import ?? entry.default;
  return import(pathToFileURL(path.join(dir, entry || pkg.module || pkg.main)).href);
}
const { generateText, streamText, tool, stepCountIs } = await importPackage('ai');
const { createOpenAICompatible } = await importPackage('@ai-sdk/openai-compatible');
const { z } = await importPackage('zod');

// Every string, number and array is bounded, so the longest call the
// grammar allows (about 230 bytes: a character of a string costs up to 6,
// \u00XX) fits in FORCED_TOKENS even at a token per byte, as the tiny
// model's byte-level tokenizer may spend; the answer step is kept short.
// (JSON Schema's string lengths count code points and zod's UTF-16 units:
// a character beyond the BMP in a string with a length would fail zod's
// check, not kiln's; the greedy answers of the fixture model have none.)
const FORCED_TOKENS = 256;
const ANSWER_TOKENS = 8;

const WEATHER = z.object({ city: z.string().max(12) });
const FORECAST = z.object({
  unit: z.enum(['celsius', 'fahrenheit']),
  days: z.number().int().min(1).max(14),
  alerts: z.boolean(),
  place: z.object({ city: z.string().regex(/^[A-Z][a-z]{0,7}$/), country: z.string().length(2) }),
  tags: z.array(z.enum(['rain', 'wind', 'sun'])).max(2),
  note: z.string().max(6).optional(),
});

// The tools, their executions recorded.
function makeTools() {
  const executed = [];
  const tools = {
    get_weather: tool({ description: 'Weather of a city', inputSchema: WEATHER,
      execute: async (input, { toolCallId }) => {
        executed.push({ toolName: 'get_weather', toolCallId, input });
        return { temp: 20, sky: 'clear' };
      } }),
    forecast: tool({ description: 'Forecast', inputSchema: FORECAST,
      execute: async (input, { toolCallId }) => {
        executed.push({ toolName: 'forecast', toolCallId, input });
        return { days: input.days, summary: 'mild' };
      } }),
  };
  return { tools, executed };
}

// The provider, with every HTTP exchange recorded: the request body and
// the response (its text read after the run).
function makeModel() {
  const wire = [];
  const provider = createOpenAICompatible({
    name: 'kiln', baseURL: url + '/v1', includeUsage: true,
    fetch: async (u, init) => {
      const res = await fetch(u, init);
      wire.push({ url: String(u), body: JSON.parse(init.body), res: res.clone() });
      return res;
    },
  });
  return { model: provider.chatModel('qwen3'), wire };
}

// One agent run: step 1 forced by `choice`, step 2 with `then`.
// `extra`: fields of the request body the SDK has no option for.
async function agent({ stream, tools, choice, then, prompt, extra = {} }) {
  const { model, wire } = makeModel();
  const opts = {
    model, tools, prompt, toolChoice: choice, temperature: 0, maxOutputTokens: FORCED_TOKENS, maxRetries: 0,
    stopWhen: stepCountIs(2),
    prepareStep: ({ stepNumber }) => (stepNumber === 0 ? {} : { toolChoice: then, maxOutputTokens: ANSWER_TOKENS }),
    // no thinking: a random model would never close a <think> block, and
    // the forced call starts after it (docs/server.md)
    providerOptions: { kiln: Object.assign({ chat_template_kwargs: { enable_thinking: false } }, extra) },
  };
  if (!stream) {
    const result = await generateText(opts);
    return { result: {
      steps: result.steps, text: result.text, finishReason: result.finishReason,
      totalUsage: result.totalUsage, response: result.response }, wire, parts: null };
  }
  const parts = [];
  const errors = [];
  const s = streamText(Object.assign({ onError: ({ error }) => errors.push(error) }, opts));
  for await (const p of s.fullStream) parts.push(p);
  if (errors.length) throw errors[0];
  const result = { steps: await s.steps, text: await s.text, finishReason: await s.finishReason,
    totalUsage: await s.totalUsage, response: await s.response };
  return { result, wire, parts };
}

function checkUsage(u, where) {
  for (const k of ['inputTokens', 'outputTokens', 'totalTokens'])
    assert.ok(Number.isInteger(u[k]) && u[k] > 0, `${where}: usage.${k} ${u[k]}`);
  assert.strictEqual(u.totalTokens, u.inputTokens + u.outputTokens, `${where}: total`);
}

// The checks every run gets. `toolNames`: the tools step 1 may call.
async function check({ result, wire, parts }, executed, { stream, toolNames, wireChoice, then }) {
  const schemas = { get_weather: WEATHER, forecast: FORECAST };
  const { steps } = result;
  assert.strictEqual(steps.length, 2, `steps: ${JSON.stringify(steps.map((s) => [s.rawFinishReason, s.content]))}`);
  assert.strictEqual(wire.length, 2, 'two requests');
  for (const w of wire) assert.ok(w.url.endsWith('/v1/chat/completions'), w.url);
  for (const w of wire) assert.strictEqual(w.body.stream, stream ? true : undefined);
  if (stream) for (const w of wire) assert.deepStrictEqual(w.body.stream_options, { include_usage: true });
  // the tools go out as JSON Schemas, in both requests
  for (const w of wire) {
    const sent = Object.fromEntries(w.body.tools.map((t) => [t.function.name, t.function.parameters]));
    assert.deepStrictEqual(Object.keys(sent).sort(), Object.keys(schemas).sort());
    assert.strictEqual(sent.forecast.properties.days.type, 'integer');
    assert.deepStrictEqual(sent.forecast.properties.unit.enum, ['celsius', 'fahrenheit']);
  }
  assert.deepStrictEqual(wire[0].body.tool_choice, wireChoice);
  assert.strictEqual(wire[1].body.tool_choice, then);

  // step 1: the calls, valid, executed with what kiln returned
  const s1 = steps[0];
  assert.strictEqual(s1.finishReason, 'tool-calls', `step 1 finish ${s1.finishReason} (${s1.rawFinishReason}), ` +
    `text ${JSON.stringify(s1.text)}`);
  assert.strictEqual(s1.rawFinishReason, 'tool_calls');
  assert.ok(s1.toolCalls.length >= 1, 'step 1 called a tool');
  const errs = s1.content.filter((c) => c.type === 'tool-error');
  assert.deepStrictEqual(errs, [], 'the SDK accepted every call');
  assert.strictEqual(s1.text, '', 'a forced call has no text around it');
  assert.deepStrictEqual(executed.map((e) => e.toolCallId), s1.toolCalls.map((c) => c.toolCallId), 'each call ran once');
  let raw;
  if (!stream) {
    raw = (await wire[0].res.json()).choices[0].message.tool_calls;
  } else {
    // the streamed calls: their deltas joined, by index
    const calls = new Map();
    for (const line of (await wire[0].res.text()).split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      for (const ch of JSON.parse(line.slice(6)).choices)
        for (const d of (ch.delta && ch.delta.tool_calls) || []) {
          const c = calls.get(d.index) || { id: '', function: { name: '', arguments: '' } };
          c.id += d.id || '';
          c.function.name += (d.function && d.function.name) || '';
          c.function.arguments += (d.function && d.function.arguments) || '';
          calls.set(d.index, c);
        }
    }
    raw = [...calls.values()];
  }
  assert.strictEqual(raw.length, s1.toolCalls.length, 'the SDK saw every call kiln returned');
  s1.toolCalls.forEach((c, i) => {
    assert.ok(toolNames.includes(c.toolName), `called ${c.toolName}`);
    assert.strictEqual(c.toolCallId, raw[i].id);
    assert.strictEqual(c.toolName, raw[i].function.name);
    assert.deepStrictEqual(c.input, JSON.parse(raw[i].function.arguments), 'the arguments kiln wrote');
    const ok = schemas[c.toolName].safeParse(c.input);
    assert.ok(ok.success, `arguments ${JSON.stringify(c.input)}: ${ok.error}`);
    assert.deepStrictEqual(executed[i], { toolName: c.toolName, toolCallId: c.toolCallId, input: c.input });
    const r = s1.toolResults[i];
    assert.strictEqual(r.toolCallId, c.toolCallId);
    const output = c.toolName === 'forecast' ? { days: c.input.days, summary: 'mild' } : { temp: 20, sky: 'clear' };
    assert.deepStrictEqual(r.output, output);
  });
  if (stream) {
    const types = parts.map((p) => p.type);
    for (const t of ['start-step', 'tool-call', 'tool-result', 'finish-step', 'finish'])
      assert.ok(types.includes(t), `stream part ${t} in ${types}`);
    assert.ok(!types.includes('error'), `no error part: ${types}`);
    assert.strictEqual(types.filter((t) => t === 'finish-step').length, 2);
  }

  // step 2's request: the history with the assistant's calls and the
  // results, tied by the call ids
  const msgs = wire[1].body.messages;
  assert.strictEqual(msgs.length, 2 + s1.toolCalls.length, JSON.stringify(msgs));
  assert.deepStrictEqual(msgs[0], wire[0].body.messages[0]);
  assert.strictEqual(msgs[1].role, 'assistant');
  assert.strictEqual(msgs[1].content, null);
  assert.strictEqual(msgs[1].tool_calls.length, s1.toolCalls.length);
  s1.toolCalls.forEach((c, i) => {
    const tc = msgs[1].tool_calls[i];
    assert.strictEqual(tc.id, c.toolCallId);
    assert.strictEqual(tc.type, 'function');
    assert.strictEqual(tc.function.name, c.toolName);
    assert.deepStrictEqual(JSON.parse(tc.function.arguments), c.input);
    const m = msgs[2 + i];
    assert.deepStrictEqual(m, { role: 'tool', tool_call_id: c.toolCallId, content: JSON.stringify(s1.toolResults[i].output) });
  });

  // step 2: an answer in text
  const s2 = steps[1];
  assert.ok(['stop', 'length'].includes(s2.finishReason), `step 2 finish ${s2.finishReason} (${s2.rawFinishReason})`);
  assert.strictEqual(typeof s2.text, 'string');
  assert.deepStrictEqual(s2.toolCalls, []);
  assert.strictEqual(result.text, s2.text);
  assert.strictEqual(result.finishReason, s2.finishReason);

  // usage: each step's, and the sum
  checkUsage(s1.usage, 'step 1');
  checkUsage(s2.usage, 'step 2');
  checkUsage(result.totalUsage, 'total');
  assert.ok(s1.usage.outputTokens <= FORCED_TOKENS);
  assert.ok(s2.usage.outputTokens <= ANSWER_TOKENS);
  if (s2.finishReason === 'length') assert.strictEqual(s2.usage.outputTokens, ANSWER_TOKENS);
  // each prompt is the whole request rendered: history, tools and all
  for (const [i, w] of wire.entries()) {
    const { messages, tools, chat_template_kwargs } = w.body;
    const r = await post(url, '/tokenize', { messages, tools, chat_template_kwargs });
    assert.strictEqual(r.status, 200, r.text);
    assert.strictEqual(steps[i].usage.inputTokens, r.json.count, `step ${i + 1}: prompt tokens`);
  }
  assert.ok(s2.usage.inputTokens > s1.usage.inputTokens, 'step 2 carries step 1');
  for (const k of ['inputTokens', 'outputTokens'])
    assert.strictEqual(result.totalUsage[k], s1.usage[k] + s2.usage[k], `total ${k}`);

  // the messages the SDK keeps for the next turn
  const rm = result.response.messages;
  assert.deepStrictEqual(rm.map((m) => m.role), ['assistant', 'tool', 'assistant']);
  assert.deepStrictEqual(rm[0].content.filter((p) => p.type === 'tool-call').map((p) => p.toolCallId),
    s1.toolCalls.map((c) => c.toolCallId));
  assert.deepStrictEqual(rm[1].content.map((p) => [p.type, p.toolCallId]), s1.toolCalls.map((c) => ['tool-result', c.toolCallId]));
  assert.strictEqual(rm[2].content.filter((p) => p.type === 'text').map((p) => p.text).join(''), s2.text);
}

for (const stream of [false, true]) {
  const mode = stream ? 'streamText' : 'generateText';
  test(`${mode}: toolChoice required, the tool runs, its result goes back, then an answer (toolChoice none)`, async () => {
    const { tools, executed } = makeTools();
    // one call: "required" lets calls follow one another, and a random
    // model does not stop calling before max_tokens cuts the last one
    const r = await agent({ stream, tools, choice: 'required', then: 'none', prompt: 'Weather in Paris?',
      extra: { parallel_tool_calls: false } });
    await check(r, executed, { stream, toolNames: ['get_weather', 'forecast'], wireChoice: 'required', then: 'none' });
    assert.strictEqual(r.wire[0].body.parallel_tool_calls, false);
    assert.strictEqual(executed.length, 1);
  });

  test(`${mode}: a named tool whose arguments have an enum, a bounded integer, a boolean, ` +
    'a nested object with a pattern, an array and an optional field', async () => {
    const { tools, executed } = makeTools();
    const r = await agent({ stream, tools, choice: { type: 'tool', toolName: 'forecast' }, then: 'auto',
      prompt: 'Forecast for Lyon, FR?' });
    await check(r, executed, { stream, toolNames: ['forecast'],
      wireChoice: { type: 'function', function: { name: 'forecast' } }, then: 'auto' });
    assert.strictEqual(executed.length, 1, 'a named tool is called once');
  });
}

run();
