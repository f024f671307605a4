// soak.js — N requests of random lengths, half streamed, ~20% of clients
// disconnecting at a random moment, C at a time. Prints the server's RSS
// and KV figures; fails on leaked KV pages or RSS growth after warm-up.
// Usage: node soak.js URL PID [N=5000] [C=48]
'use strict';
const http = require('http');
const fs = require('fs');
const { metrics, sleep } = require('./lib');

const [url, pidArg, nArg, cArg] = process.argv.slice(2);
const pid = Number(pidArg), N = Number(nArg || 5000), C = Number(cArg || 48);
const u = new URL(url);
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const words = 'the a cat dog sun moon tree ball girl boy happy big small red blue went saw said played ran jumped'.split(' ');
const rss = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024;

function one(i) {
  const n = 1 + Math.floor(rnd() * 120);
  const prompt = Array.from({ length: n }, () => words[Math.floor(rnd() * words.length)]).join(' ');
  const body = JSON.stringify({ prompt, max_tokens: 1 + Math.floor(rnd() * 96), temperature: rnd() < 0.5 ? 0 : 0.9,
    stream: rnd() < 0.5, ignore_eos: rnd() < 0.5, logprobs: rnd() < 0.2 ? 2 : null });
  const disconnect = rnd() < 0.2 ? 1 + Math.floor(rnd() * 200) : 0;
  return new Promise((resolve) => {
    const req = http.request({ host: u.hostname, port: u.port, method: 'POST', path: '/v1/completions', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      res.on('data', () => {});
      res.on('end', () => resolve(res.statusCode));
      res.on('error', () => resolve('reset'));
    });
    req.on('error', () => resolve('gone'));
    if (disconnect) setTimeout(() => { req.destroy(); resolve('disconnected'); }, disconnect);
    req.end(body);
  });
}

(async () => {
  const counts = {};
  let next = 0, done = 0, plateau = 0;
  const t0 = Date.now();
  const worker = async () => {
    while (next < N) {
      const s = await one(next++);
      counts[s] = (counts[s] || 0) + 1;
      done++;
      if (done === Math.floor(N / 5)) plateau = rss();
      if (done % 1000 === 0) console.log(`soak: ${done}/${N} requests, RSS ${rss().toFixed(1)} MiB`);
    }
  };
  await Promise.all(Array.from({ length: C }, worker));
  let m;
  for (let k = 0; k < 200; k++) {
    m = await metrics(url);
    if (m['kiln:num_requests_running'] === 0 && m['kiln:num_requests_waiting'] === 0) break;
    await sleep(50);
  }
  await sleep(500);
  const end = rss();
  console.log(`soak: ${N} requests in ${((Date.now() - t0) / 1000).toFixed(1)} s; outcomes ${JSON.stringify(counts)}`);
  console.log(`soak: KV pages total ${m['kiln:kv_pages_total']}, free ${m['kiln:kv_pages_free']}, radix cache ${m['kiln:kv_pages_cached']}, held by requests ${m['kiln:kv_pages_used_by_requests']}`);
  console.log(`soak: retractions ${m['kiln:num_retractions_total']}, client disconnects ${m['kiln:client_disconnects_total']}, finished ${JSON.stringify(Object.fromEntries(Object.entries(m).filter(([k]) => k.includes('request_success'))))}`);
  console.log(`soak: RSS after warm-up ${plateau.toFixed(1)} MiB, at the end ${end.toFixed(1)} MiB`);
  let ok = true;
  if (m['kiln:kv_pages_used_by_requests'] !== 0 || m['kiln:num_requests_running'] !== 0) { console.log('FAIL: KV pages leaked'); ok = false; }
  if (end > plateau * 1.15 + 16) { console.log('FAIL: resident memory kept growing'); ok = false; }
  console.log(ok ? 'soak: ok' : 'soak: FAILED');
  process.exit(ok ? 0 : 1);
})();
