// lib.js — helpers for the server tests: a tiny test runner, the official
// openai client, raw HTTP over node's http/net, and a safetensors reader.
'use strict';
const assert = require('assert');
const http = require('http');
const net = require('net');
const fs = require('fs');

const tests = [];
function test(name, fn) { tests.push({ name, fn }); }

async function run() {
  let failed = 0;
  const only = process.env.KILN_TEST_ONLY;
  for (const t of tests) {
    if (only && !t.name.includes(only)) continue;
    const t0 = Date.now();
    try {
      await t.fn();
      console.log(`ok: ${t.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      console.log(`FAIL: ${t.name}\n  ${(e && e.stack) || e}`);
    }
  }
  console.log(`${tests.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

function client(url, opts = {}) {
  const OpenAI = require('openai');
  return new OpenAI({ baseURL: url + '/v1', apiKey: opts.apiKey || 'none', maxRetries: 0, timeout: 300000 });
}

// One HTTP request; resolves {status, headers, text, json}.
function request(url, method, path, body, headers = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : (typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body));
    const h = Object.assign({}, headers);
    if (data !== undefined && !('content-type' in h)) h['content-type'] = 'application/json';
    if (data !== undefined) h['content-length'] = Buffer.byteLength(data);
    const req = http.request({ host: u.hostname, port: u.port, method, path, headers: h, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json;
        try { json = JSON.parse(text); } catch (_) { json = undefined; }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    if (data !== undefined) req.write(data);
    req.end();
  });
}
const post = (url, path, body, headers) => request(url, 'POST', path, body, headers);
const get = (url, path, headers) => request(url, 'GET', path, undefined, headers);

// Raw bytes over a socket; resolves with everything the server sent before
// closing (or before `waitMs` of silence). `halfClose` ends our side after writing.
function raw(url, bytes, { halfClose = false, waitMs = 3000 } = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const sock = net.connect(Number(u.port), u.hostname);
    const chunks = [];
    let timer;
    const finish = () => { clearTimeout(timer); sock.destroy(); resolve(Buffer.concat(chunks).toString('utf8')); };
    const arm = () => { clearTimeout(timer); timer = setTimeout(finish, waitMs); };
    sock.on('connect', () => {
      sock.write(bytes);
      if (halfClose) sock.end();
      arm();
    });
    sock.on('data', (c) => { chunks.push(c); arm(); });
    sock.on('end', finish);
    sock.on('close', finish);
    sock.on('error', (e) => (chunks.length ? finish() : reject(e)));
  });
}

// Parses "HTTP/1.1 400 ...\r\nheaders\r\n\r\nbody" (Content-Length bodies).
function parseRaw(text) {
  const m = /^HTTP\/1\.[01] (\d{3})[^\r]*\r\n([\s\S]*?)\r\n\r\n([\s\S]*)$/.exec(text);
  if (!m) return null;
  let json;
  try { json = JSON.parse(m[3]); } catch (_) { json = undefined; }
  return { status: Number(m[1]), head: m[2], body: m[3], json };
}

function assertErrorShape(json, where) {
  assert.ok(json && json.error, `${where}: no error object in ${JSON.stringify(json)}`);
  const e = json.error;
  assert.strictEqual(typeof e.message, 'string', `${where}: message`);
  assert.ok(e.message.length > 0, `${where}: empty message`);
  assert.strictEqual(typeof e.type, 'string', `${where}: type`);
  assert.ok('param' in e && 'code' in e, `${where}: param/code missing`);
}

// safetensors: 8-byte little-endian header length, JSON header, data.
function readSafetensors(path) {
  const buf = fs.readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n;
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [a, b] = t.data_offsets;
    const bytes = buf.subarray(base + a, base + b);
    const copy = new Uint8Array(bytes).buffer;
    let data;
    if (t.dtype === 'F32') data = new Float32Array(copy);
    else if (t.dtype === 'I32') data = new Int32Array(copy);
    else if (t.dtype === 'I64') data = Array.from(new BigInt64Array(copy), Number);
    else throw new Error(`dtype ${t.dtype}`);
    out[name] = { shape: t.shape, data };
  }
  return out;
}

// Server-sent events of a raw streaming response: the JSON payloads and whether [DONE] came.
function parseSSE(text) {
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    const line = block.trim();
    if (!line.startsWith('data: ')) continue;
    const payload = line.slice(6);
    if (payload === '[DONE]') done = true;
    else events.push(JSON.parse(payload));
  }
  return { events, done };
}

async function metrics(url, headers) {
  const r = await get(url, '/metrics', headers);
  assert.strictEqual(r.status, 200);
  const m = {};
  for (const line of r.text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const mm = /^([^{ ]+)(\{[^}]*\})? (\S+)$/.exec(line);
    if (!mm) continue;
    m[mm[1] + (mm[2] && /finished_reason|code/.test(mm[2]) ? mm[2].replace(/model_name="[^"]*",?/, '') : '')] = Number(mm[3]);
  }
  return m;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls `cond()` (sync or async) until it is truthy; throws after `ms`.
// The limits are generous on purpose: a loaded or sanitizer build is slow,
// and a test waits for the event, never for a guessed time.
async function until(cond, ms, what) {
  const t0 = Date.now();
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(20);
  }
}

// Waits until the server's log file (stderr) has a line matching `re`; returns it.
function waitLog(path, re, ms = 60000) {
  return until(() => {
    const text = fs.existsSync(path) ? fs.readFileSync(path, 'utf8') : '';
    return text.split('\n').find((l) => re.test(l));
  }, ms, `a log line ${re} in ${path}`);
}

// Resolves when the socket closes, or throws after `ms`.
function closed(sock, ms, what) {
  return new Promise((resolve, reject) => {
    if (sock.destroyed && sock.closed) { resolve(); return; }
    const t = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what} to close`)), ms);
    sock.once('close', () => { clearTimeout(t); resolve(); });
  });
}

module.exports = { test, run, client, request, post, get, raw, parseRaw, assertErrorShape, readSafetensors, parseSSE, metrics, sleep, until, waitLog, closed, assert };
