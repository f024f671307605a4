// check_result.mjs — checks one `kiln bench` run: its report block (stdout)
// and the last JSON line of its --output-file, against bench_serving's
// field names, internal consistency, and the expectations given.
//
// Usage: node check_result.mjs REPORT.txt RESULT.jsonl 'EXPECT-JSON'
// EXPECT keys: num_prompts, completed, failed (numbers), min_failed,
//   source ("usage"|"retokenized"|...), error (substring of first_errors[0]),
//   ranges {field: [lo, hi]}, max_concurrency, details (bool),
//   itl_per_request (ITL entries per successful request), equal [[a, b]].
// Exits 1 with one line per failed check.
import fs from 'node:fs';

const [reportPath, jsonPath, expectArg] = process.argv.slice(2);
const report = fs.readFileSync(reportPath, 'utf8');
const lines = fs.readFileSync(jsonPath, 'utf8').trim().split('\n');
const r = JSON.parse(lines[lines.length - 1]);
const exp = JSON.parse(expectArg || '{}');
const fails = [];
const check = (ok, msg) => { if (!ok) fails.push(msg); };
const near = (a, b, tol = 1e-6) => Math.abs(a - b) <= tol * Math.max(1, Math.abs(a), Math.abs(b));

// Every field of bench_serving's JSON line (and ours).
const stats = (name, extra = []) => ['mean', 'median', 'std', 'p99', ...extra].map((s) => `${s}_${name}`);
const keys = ['backend', 'dataset_name', 'request_rate', 'max_concurrency', 'duration', 'completed', 'failed',
  'total_input_tokens', 'total_output_tokens', 'total_output_tokens_retokenized', 'output_tokens_source',
  'request_throughput', 'input_throughput', 'output_throughput', 'total_throughput', 'concurrency',
  ...stats('ttft_ms'), ...stats('tpot_ms'), ...stats('itl_ms', ['p95', 'max']), ...stats('e2e_latency_ms', ['p90']),
  'first_errors', 'random_input_len', 'random_output_len', 'random_range_ratio'];
for (const k of keys) check(k in r, `JSON line lacks "${k}"`);
for (const [k, v] of Object.entries(r))
  if (typeof v === 'number') check(Number.isFinite(v) && v >= 0, `${k} = ${v} is not a finite non-negative number`);

// Counts add up.
if (exp.num_prompts !== undefined)
  check(r.completed + r.failed === exp.num_prompts, `completed ${r.completed} + failed ${r.failed} != ${exp.num_prompts}`);
for (const k of ['completed', 'failed'])
  if (exp[k] !== undefined) check(r[k] === exp[k], `${k} = ${r[k]}, expected ${exp[k]}`);
if (exp.min_failed !== undefined) check(r.failed >= exp.min_failed, `failed = ${r.failed} < ${exp.min_failed}`);
if (r.failed > 0) check(r.first_errors.length > 0, 'failures without first_errors');
if (exp.error) check((r.first_errors[0] || '').includes(exp.error), `first error "${r.first_errors[0]}" lacks "${exp.error}"`);
if (exp.source) check(r.output_tokens_source === exp.source, `output_tokens_source ${r.output_tokens_source} != ${exp.source}`);

// Percentiles are ordered; mean within [0, max].
for (const s of ['ttft_ms', 'tpot_ms', 'itl_ms', 'e2e_latency_ms'])
  check(r[`median_${s}`] <= r[`p99_${s}`] + 1e-9, `median_${s} > p99_${s}`);
check(r.p95_itl_ms <= r.p99_itl_ms + 1e-9 && r.p99_itl_ms <= r.max_itl_ms + 1e-9, 'ITL p95 <= p99 <= max violated');
check(r.mean_itl_ms <= r.max_itl_ms + 1e-9, 'mean ITL > max ITL');
check(r.p90_e2e_latency_ms <= r.p99_e2e_latency_ms + 1e-9, 'p90 E2E > p99 E2E');
if (r.completed) {
  check(r.mean_ttft_ms <= r.mean_e2e_latency_ms + 1e-9, 'mean TTFT > mean E2E');
  check(r.median_e2e_latency_ms <= r.duration * 1000 + 1, 'median E2E longer than the whole run');
}

// Throughputs are totals over the duration; concurrency = Σ latency / duration.
const d = r.duration;
check(d > 0, 'duration <= 0');
check(near(r.request_throughput * d, r.completed), 'request_throughput != completed / duration');
check(near(r.input_throughput * d, r.total_input_tokens), 'input_throughput != total_input_tokens / duration');
check(near(r.output_throughput * d, r.total_output_tokens), 'output_throughput != total_output_tokens / duration');
check(near(r.total_throughput * d, r.total_input_tokens + r.total_output_tokens), 'total_throughput mismatch');
check(near(r.concurrency * d, r.mean_e2e_latency_ms / 1000 * r.completed, 1e-6), 'concurrency != sum(latency) / duration');
if (exp.max_concurrency) check(r.concurrency <= exp.max_concurrency + 0.01, `concurrency ${r.concurrency} > cap`);
if (r.output_tokens_source === 'retokenized')
  check(r.total_output_tokens === r.total_output_tokens_retokenized, 'retokenized source but totals differ');

for (const [k, [lo, hi]] of Object.entries(exp.ranges || {}))
  check(r[k] >= lo && r[k] <= hi, `${k} = ${r[k]} outside [${lo}, ${hi}]`);
for (const [a, b] of exp.equal || []) check(r[a] === r[b], `${a} (${r[a]}) != ${b} (${r[b]})`);

if (exp.details) {
  for (const k of ['input_lens', 'output_lens', 'ttfts', 'itls', 'generated_texts', 'errors'])
    check(Array.isArray(r[k]) && r[k].length === exp.num_prompts, `details: ${k} missing or not ${exp.num_prompts} long`);
  if (exp.itl_per_request !== undefined && Array.isArray(r.itls))
    r.itls.forEach((v, i) => r.errors[i] === '' &&
      check(v.length === exp.itl_per_request, `request ${i}: ${v.length} ITLs, expected ${exp.itl_per_request}`));
}

// The report block: bench_serving's names, and the same numbers.
const row = (name) => {
  const m = report.match(new RegExp(`^${name.replace(/[()/.]/g, '\\$&')}\\s+(\\S+)`, 'm'));
  return m ? m[1] : undefined;
};
check(/^=+ Serving Benchmark Result =+$/m.test(report), 'report lacks its title rule');
for (const t of ['End-to-End Latency', 'Time to First Token', 'Time per Output Token \\(excl\\. 1st token\\)', 'Inter-Token Latency'])
  check(new RegExp(`^-+${t}-+$`, 'm').test(report), `report lacks the "${t}" rule`);
const pairs = [
  ['Successful requests:', 'completed'], ['Failed requests:', 'failed'], ['Total input tokens:', 'total_input_tokens'],
  ['Total generated tokens:', 'total_output_tokens'], ['Total generated tokens (retokenized):', 'total_output_tokens_retokenized'],
  ['Benchmark duration (s):', 'duration'], ['Request throughput (req/s):', 'request_throughput'],
  ['Input token throughput (tok/s):', 'input_throughput'], ['Output token throughput (tok/s):', 'output_throughput'],
  ['Total token throughput (tok/s):', 'total_throughput'], ['Concurrency:', 'concurrency'],
  ['Mean E2E Latency (ms):', 'mean_e2e_latency_ms'], ['Median E2E Latency (ms):', 'median_e2e_latency_ms'],
  ['P99 E2E Latency (ms):', 'p99_e2e_latency_ms'], ['Mean TTFT (ms):', 'mean_ttft_ms'],
  ['Median TTFT (ms):', 'median_ttft_ms'], ['P99 TTFT (ms):', 'p99_ttft_ms'], ['Mean TPOT (ms):', 'mean_tpot_ms'],
  ['Median TPOT (ms):', 'median_tpot_ms'], ['P99 TPOT (ms):', 'p99_tpot_ms'], ['Mean ITL (ms):', 'mean_itl_ms'],
  ['Median ITL (ms):', 'median_itl_ms'], ['P95 ITL (ms):', 'p95_itl_ms'], ['P99 ITL (ms):', 'p99_itl_ms'],
  ['Max ITL (ms):', 'max_itl_ms'],
];
for (const [name, key] of pairs) {
  const v = row(name);
  if (v === undefined) { fails.push(`report lacks "${name}"`); continue; }
  check(Math.abs(Number(v) - r[key]) <= 0.0051 + 1e-9 * Math.abs(r[key]), `report "${name}" ${v} != JSON ${key} ${r[key]}`);
}
check(row('Backend:') === r.backend, `report backend ${row('Backend:')} != ${r.backend}`);
const rate = row('Traffic request rate:');
check(rate === (r.request_rate === 'inf' ? 'inf' : String(Number(rate))) || Number(rate) === r.request_rate,
  `report rate ${rate} != JSON ${r.request_rate}`);

if (fails.length) {
  for (const f of fails) console.log(`  check failed: ${f}`);
  process.exit(1);
}
