// fake_server.mjs — an LLM server with known timings, for testing
// `kiln bench serving` (tests/cli/bench_fake.sh). No npm packages.
//
// Every generation streams its first token FIRST_MS after the request
// arrived and one more token every GAP_MS, exactly max_tokens tokens, so
// the expected metrics are known: TTFT ≈ FIRST_MS, ITL ≈ TPOT ≈ GAP_MS,
// E2E ≈ FIRST_MS + (n-1)·GAP_MS. Each token's text is TOKEN_TEXT.
//
// A path prefix picks a behaviour (the client's --base-url ends with it):
//   (none)      normal; usage in the last chunk (stream_options.include_usage)
//   /nousage    never sends usage (the client must re-tokenize)
//   /error      HTTP 500 with an OpenAI-style error body
//   /flaky      every second request gets HTTP 503
//   /hang       sends the headers, then nothing (tests --timeout)
//   /malformed  the second chunk is not JSON
//   /midfail    an {"error": ...} chunk after two tokens
//   /nul        each token's text holds a NUL character ("\u0000" in the
//               JSON: valid, and a model can generate the byte)
// Routes: GET /v1/models, POST /v1/completions, /v1/chat/completions,
// /generate (SGLang: cumulative text + meta_info, two tokens per chunk
// after the first), /v1/score.
//
// Usage: node fake_server.mjs [FIRST_MS] [GAP_MS]; prints "PORT <n>".
import http from 'node:http';

const FIRST_MS = Number(process.argv[2] ?? 50);
const GAP_MS = Number(process.argv[3] ?? 20);
const TOKEN_TEXT_NORMAL = ' the';
let flakyCount = 0;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function readBody(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.setEncoding('utf8');
    req.on('data', (c) => (data += c));
    req.on('end', () => resolve(data));
    req.on('error', reject);
  });
}

function sendJson(res, status, obj) {
  const body = JSON.stringify(obj);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

const usage = (prompt, n) => ({ prompt_tokens: prompt, completion_tokens: n, total_tokens: prompt + n });

// One streamed generation. `chunk(k, n)` renders the chunk that brings
// the token count to k (n tokens in it).
async function streamTokens(res, mode, total, perChunk, chunk, finalChunk, preamble) {
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  if (preamble) res.write(`data: ${JSON.stringify(preamble)}\n\n`);
  await sleep(FIRST_MS);
  let sent = 0;
  while (sent < total) {
    if (res.destroyed) return;
    const n = sent === 0 ? 1 : Math.min(perChunk, total - sent);
    if (sent > 0) await sleep(GAP_MS * n);
    sent += n;
    if (mode === 'malformed' && sent > 1) {
      res.write('data: {"choices": [ this is not json\n\n');
      res.end();
      return;
    }
    if (mode === 'midfail' && sent > 2) {
      res.write(`data: ${JSON.stringify({ error: { message: 'fake failure mid-stream', code: 500 } })}\n\n`);
      res.end();
      return;
    }
    res.write(`data: ${JSON.stringify(chunk(sent, n))}\n\n`);
  }
  if (finalChunk) res.write(`data: ${JSON.stringify(finalChunk)}\n\n`);
  res.write('data: [DONE]\n\n');
  res.end();
}

async function handle(req, res) {
  const m = req.url.match(/^\/(nousage|error|flaky|hang|malformed|midfail|nul)(\/.*)$/);
  const mode = m ? m[1] : 'normal';
  const path = m ? m[2] : req.url;
  const body = req.method === 'POST' ? await readBody(req) : '';

  if (req.method === 'GET' && path === '/v1/models')
    return sendJson(res, 200, { object: 'list', data: [{ id: 'fake-model', object: 'model' }] });
  if (req.method !== 'POST') return sendJson(res, 404, { error: { message: `no route ${req.method} ${path}` } });

  let p;
  try {
    p = JSON.parse(body);
  } catch {
    return sendJson(res, 400, { error: { message: 'body is not JSON' } });
  }
  if (mode === 'error') return sendJson(res, 500, { error: { message: 'fake internal error', code: 500 } });
  if (mode === 'flaky' && flakyCount++ % 2 === 1)
    return sendJson(res, 503, { error: { message: 'fake overload', code: 503 } });
  if (mode === 'hang') {
    res.writeHead(200, { 'Content-Type': 'text/event-stream' });
    res.flushHeaders();
    return; // never writes again; the client must time out
  }
  const withUsage = mode !== 'nousage';

  if (path === '/v1/score') {
    if (typeof p.query !== 'string' || !Array.isArray(p.items) || !Array.isArray(p.label_token_ids))
      return sendJson(res, 400, { error: { message: 'query, items and label_token_ids are required' } });
    await sleep(FIRST_MS);
    const k = p.label_token_ids.length;
    return sendJson(res, 200, {
      object: 'scoring', model: p.model,
      scores: p.items.map(() => Array(k).fill(1 / k)),
      usage: withUsage ? usage(p.items.length, 0) : undefined,
    });
  }

  const TOKEN_TEXT = mode === 'nul' ? ' \u0000' : TOKEN_TEXT_NORMAL;
  if (path === '/v1/completions' || path === '/v1/chat/completions') {
    const chat = path.endsWith('chat/completions');
    const total = p.max_tokens;
    if (!Number.isInteger(total) || total < 1) return sendJson(res, 400, { error: { message: 'max_tokens' } });
    if (!p.stream) {
      await sleep(FIRST_MS + (total - 1) * GAP_MS);
      const text = TOKEN_TEXT.repeat(total);
      const choice = chat ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: 'length' }
                          : { index: 0, text, finish_reason: 'length' };
      return sendJson(res, 200, { id: 'x', object: chat ? 'chat.completion' : 'text_completion', model: p.model,
                                  choices: [choice], usage: withUsage ? usage(7, total) : undefined });
    }
    const include = withUsage && p.stream_options && p.stream_options.include_usage;
    const chunk = (k) => chat
      ? { id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content: TOKEN_TEXT }, finish_reason: k === total ? 'length' : null }] }
      : { id: 'x', object: 'text_completion', choices: [{ index: 0, text: TOKEN_TEXT, finish_reason: k === total ? 'length' : null }] };
    const final = include ? { id: 'x', choices: [], usage: usage(7, total) } : null;
    // Chat opens with a role-only chunk at once: it has no content, so it
    // must not count as the first token.
    const role = chat ? { id: 'x', choices: [{ index: 0, delta: { role: 'assistant' } }] } : null;
    return streamTokens(res, mode, total, 1, chunk, final, role);
  }

  if (path === '/generate') {
    const sp = p.sampling_params || {};
    const total = sp.max_new_tokens;
    if (typeof p.text !== 'string' || !Number.isInteger(total) || total < 1)
      return sendJson(res, 400, { error: { message: 'text and sampling_params.max_new_tokens are required' } });
    const meta = (k) => (withUsage ? { prompt_tokens: 7, completion_tokens: k } : {});
    if (!p.stream) {
      await sleep(FIRST_MS + (total - 1) * GAP_MS);
      return sendJson(res, 200, { text: TOKEN_TEXT.repeat(total), meta_info: meta(total) });
    }
    return streamTokens(res, mode, total, 2, (k) => ({ text: TOKEN_TEXT.repeat(k), meta_info: meta(k) }), null);
  }
  return sendJson(res, 404, { error: { message: `no route ${path}` } });
}

const server = http.createServer({ noDelay: true, keepAliveTimeout: 1000 }, (req, res) => {
  handle(req, res).catch((e) => {
    if (!res.headersSent) sendJson(res, 500, { error: { message: String(e) } });
    else res.destroy();
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(`PORT ${server.address().port}`);
});
process.on('SIGTERM', () => process.exit(0));
