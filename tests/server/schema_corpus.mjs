// schema_corpus.mjs — the official JSON-Schema-Test-Suite's draft-4 schemas
// (tests/cli/schema_suite.mjs reads them as grammar_schema_suite.mjs does)
// as a corpus for structured outputs end to end: every distinct schema goes
// to every server as response_format json_schema (strict), greedy and
// sampled, and
//  - a schema kiln supports must give finish_reason "stop" and a text that
//    JSON.parse reads and ajv accepts, on every model, in every mode;
//  - a schema kiln does not support must get HTTP 400 with an OpenAI error
//    body whose message says what is not supported (and where), on every
//    model alike: never a 200 that ignores a keyword.
// It prints the share of schemas supported and the counts per model and
// mode, and fails on any output that is not valid.
//
// The judge. ajv 8 speaks draft-07 and later, not draft 4, so each schema
// is rewritten the way draft 4 means it before ajv compiles it: a boolean
// exclusiveMaximum / exclusiveMinimum becomes draft-07's numeric bound,
// `id` becomes `$id`, a draft-04 `$schema` is dropped (the other keywords
// the suite's schemas use read the same in both drafts). The judge must
// agree with the suite on every instance of every supported schema before
// any output is judged, which checks that rewriting. ajv has no format
// definitions of its own (they live in ajv-formats, not installed here), so
// the formats kiln supports are judged by the definitions below, written
// from their RFCs and strict where the RFCs allow forms kiln never writes
// (quoted or address-literal mailboxes, leap seconds). A text with a
// duplicated object name is judged twice, once with the last occurrence of
// each name (JSON.parse) and once with the first.
//
// Why the requests push towards an end. A schema that does not bound a
// value lets the grammar continue it forever, and models with random
// weights (and stories260K, trained on stories only) have no reason to
// stop: greedy decoding loops on one allowed token ("2000000…", "?????",
// "…………"), and sampling closes an unbounded string only when it happens to
// draw one of the two tokens of the tiny models' 1024 that can close it,
// about one step in 450 to 750, so that half of such strings are still open
// after 450 tokens (the context is 512; no max_tokens is enough).
// stories260K never writes '@' or '}' at all: its tokenizer has them as
// byte-fallback tokens it never saw in training, whose logits sit about 20
// below the top. So every request carries the same push: logit_bias +6 on
// the model's end-of-sequence ids and on the tokens of '"', ']', '}', ':'
// and '@' (what ends a string, an array, an object, a URI's scheme, an
// e-mail's local part), +20 where that token is a byte-fallback one, and
// frequency_penalty 0.5 against loops. The grammar's mask comes before both
// (masked tokens are -inf whatever their bias), so the push changes which
// valid text is drawn, never whether it is valid, and the check stays:
// every output must end with "stop" and validate. KILN_SCHEMA_CORPUS_PUSH=0
// sends the requests without it: then outputs are cut at max_tokens (and
// fail), and every output that does end must still validate.
//
// usage: node schema_corpus.mjs SUITE_DRAFT4_DIR URL... [--min-share X]
import { createRequire } from 'node:module';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { suiteGroups } from '../cli/schema_suite.mjs';

const require = createRequire(import.meta.url);
const { get, post } = require('./lib.js');
const Ajv = require('ajv');

const args = process.argv.slice(2);
const minShareAt = args.indexOf('--min-share');
const minShare = minShareAt >= 0 ? Number(args.splice(minShareAt, 2)[1]) : 0;
const [suiteDir, ...urls] = args;
const PUSH = process.env.KILN_SCHEMA_CORPUS_PUSH !== '0';
const MAX_TOKENS = 400; // the models' context is 512 tokens, the prompts about 10
const MODES = [
    { name: 'greedy', api: 'chat', temperature: 0 },
    { name: 'T=1 seed 1', api: 'chat', temperature: 1, seed: 1 },
    { name: 'T=1 seed 2', api: 'completions', temperature: 1, seed: 2 },
    { name: 'T=1 seed 3', api: 'chat', temperature: 1, seed: 3 },
    { name: 'T=1 seed 4', api: 'completions', temperature: 1, seed: 4 },
];

const failures = [];
function fail(msg) {
    failures.push(msg);
    if (failures.length <= 40) console.log(`FAIL ${msg}`);
}

// ---- the corpus: distinct schemas, with every instance the suite has for them

const corpus = new Map(); // JSON text -> {name, schema, tests}
for (const g of suiteGroups(suiteDir)) {
    const key = JSON.stringify(g.schema);
    if (!corpus.has(key)) corpus.set(key, { name: g.name, schema: g.schema, tests: [] });
    corpus.get(key).tests.push(...g.tests.map((t) => ({ ...t, group: g.name })));
}
const schemas = [...corpus.values()];

// ---- the judge

const isObj = (x) => x !== null && typeof x === 'object' && !Array.isArray(x);
const mapValues = (o, f) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, f(v)]));

// A draft-4 schema as draft-07 says the same (see the top of the file).
function fromDraft4(s) {
    if (!isObj(s)) return s;
    const o = {};
    for (const [k, v] of Object.entries(s)) {
        if (k === 'id' && typeof v === 'string') o.$id = v;
        else if (k === '$schema' && /draft-04/.test(v)) continue;
        else if (k === 'exclusiveMaximum' || k === 'exclusiveMinimum') { if (typeof v !== 'boolean') o[k] = v; }
        else if ((k === 'properties' || k === 'patternProperties' || k === 'definitions') && isObj(v)) o[k] = mapValues(v, fromDraft4);
        else if (k === 'items') o[k] = Array.isArray(v) ? v.map(fromDraft4) : fromDraft4(v);
        else if (k === 'additionalItems' || k === 'additionalProperties' || k === 'not') o[k] = fromDraft4(v);
        else if ((k === 'allOf' || k === 'anyOf' || k === 'oneOf') && Array.isArray(v)) o[k] = v.map(fromDraft4);
        else if (k === 'dependencies' && isObj(v)) o[k] = mapValues(v, (d) => (Array.isArray(d) ? d : fromDraft4(d)));
        else o[k] = v;
    }
    for (const [ex, bound] of [['exclusiveMaximum', 'maximum'], ['exclusiveMinimum', 'minimum']]) {
        if (s[ex] === true && typeof s[bound] === 'number') {
            o[ex] = s[bound];
            delete o[bound];
        }
    }
    return o;
}

// Formats (RFC 3339 date / time / date-time, RFC 5321 mailbox, RFC 3986 URI,
// RFC 2673 dotted quad via node's net.isIPv4, RFC 4122 UUID).
const DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
function isDate(s) {
    const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
    if (!m) return false;
    const [y, mo, d] = [+m[1], +m[2], +m[3]];
    const leap = y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0);
    return mo >= 1 && mo <= 12 && d >= 1 && d <= (mo === 2 && leap ? 29 : DAYS[mo - 1]);
}
function isTime(s) {
    const m = /^(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))$/.exec(s);
    return !!m && +m[1] <= 23 && +m[2] <= 59 && +m[3] <= 59 && (m[4] === undefined || (+m[4] <= 23 && +m[5] <= 59));
}
const isDateTime = (s) => /^[^Tt]*[Tt][^Tt]*$/.test(s) && isDate(s.split(/[Tt]/)[0]) && isTime(s.split(/[Tt]/)[1]);
const ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
const LABEL = '[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?';
const EMAIL = new RegExp(`^${ATOM}(?:\\.${ATOM})*@${LABEL}(?:\\.${LABEL})*$`);
const PCT = '%[0-9A-Fa-f]{2}';
const UNRES_SUB = "A-Za-z0-9\\-._~!$&'()*+,;=";
const PCHAR = `(?:[${UNRES_SUB}:@]|${PCT})`;
const URI = new RegExp(
    `^[A-Za-z][A-Za-z0-9+.-]*:` + // scheme
    `(?://(?:(?:[${UNRES_SUB}:]|${PCT})*@)?(?:(\\[[^\\]]*\\])|(?:[${UNRES_SUB}]|${PCT})*)(?::[0-9]*)?(?:/${PCHAR}*)*` + // authority path-abempty
    `|/(?:${PCHAR}+(?:/${PCHAR}*)*)?` + // path-absolute
    `|${PCHAR}+(?:/${PCHAR}*)*` + // path-rootless
    `|)` + // path-empty
    `(?:\\?(?:${PCHAR}|[/?])*)?(?:#(?:${PCHAR}|[/?])*)?$`);
function isUri(s) {
    const m = URI.exec(s);
    if (!m) return false;
    const lit = m[1]; // an IP-literal host: IPv6address or IPvFuture
    return lit === undefined || (/^[0-9A-Fa-f:.]+$/.test(lit.slice(1, -1)) && net.isIPv6(lit.slice(1, -1))) || new RegExp(`^v[0-9A-Fa-f]+\\.[${UNRES_SUB}:]+$`).test(lit.slice(1, -1));
}
const FORMATS = {
    date: isDate, time: isTime, 'date-time': isDateTime, email: (s) => EMAIL.test(s), uri: isUri,
    ipv4: (s) => net.isIPv4(s), uuid: (s) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s),
};

const warnings = [];
const ajv = new Ajv({ strict: false, allErrors: true, logger: { log() {}, warn: (m) => warnings.push(String(m)), error: (m) => warnings.push(String(m)) } });
for (const [name, f] of Object.entries(FORMATS)) ajv.addFormat(name, { type: 'string', validate: f });

// A strict JSON reader that keeps the first occurrence of a duplicated
// name (JSON.parse keeps the last) and counts duplicates.
function parseFirstWins(text) {
    let i = 0, dups = 0;
    const ws = () => { while (/[ \t\n\r]/.test(text[i])) i++; };
    const value = () => {
        ws();
        const c = text[i];
        if (c === '{') {
            i++;
            const o = {};
            ws();
            if (text[i] === '}') { i++; return o; }
            for (;;) {
                ws();
                const k = str();
                ws();
                if (text[i++] !== ':') throw new Error(`':' expected at ${i - 1}`);
                const v = value();
                if (Object.hasOwn(o, k)) dups++;
                else Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
                ws();
                if (text[i] === ',') { i++; continue; }
                if (text[i++] === '}') return o;
                throw new Error(`',' or '}' expected at ${i - 1}`);
            }
        }
        if (c === '[') {
            i++;
            const a = [];
            ws();
            if (text[i] === ']') { i++; return a; }
            for (;;) {
                a.push(value());
                ws();
                if (text[i] === ',') { i++; continue; }
                if (text[i++] === ']') return a;
                throw new Error(`',' or ']' expected at ${i - 1}`);
            }
        }
        if (c === '"') return str();
        const m = /^(?:true|false|null|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)/.exec(text.slice(i));
        if (!m) throw new Error(`a value expected at ${i}`);
        i += m[0].length;
        return JSON.parse(m[0]);
    };
    const str = () => {
        const m = /^"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9A-Fa-f]{4})*"/.exec(text.slice(i));
        if (!m) throw new Error(`a string expected at ${i}`);
        i += m[0].length;
        return JSON.parse(m[0]);
    };
    const v = value();
    ws();
    if (i !== text.length) throw new Error(`text after the value at ${i}`);
    return { v, dups };
}

const validators = new Map(); // corpus entry -> ajv validate function
function judge(entry) {
    if (!validators.has(entry)) {
        warnings.length = 0;
        const fn = ajv.compile(fromDraft4(entry.schema));
        const unknown = warnings.filter((w) => /unknown format/.test(w));
        if (unknown.length) throw new Error(`the judge has no definition: ${unknown.join('; ')}`);
        validators.set(entry, fn);
    }
    return validators.get(entry);
}

// null when text is valid for entry's schema, else why not
let nDupTexts = 0;
function verdict(entry, text) {
    let v, first;
    try { v = JSON.parse(text); } catch (e) { return `not JSON (${e.message})`; }
    try { first = parseFirstWins(text); } catch (e) { return `not JSON (${e.message})`; }
    const validate = judge(entry);
    if (!validate(v)) return `ajv: ${ajv.errorsText(validate.errors)}`;
    if (first.dups) {
        nDupTexts++;
        if (!validate(first.v)) return `ajv, first of duplicated names: ${ajv.errorsText(validate.errors)}`;
    }
    return null;
}

// ---- the requests

const PROMPT = 'Reply in JSON.';

async function modelInfo(url) {
    const info = (await get(url, '/get_server_info')).json;
    const bias = {};
    if (PUSH) {
        const dir = info.model_path;
        let eos;
        for (const f of ['generation_config.json', 'config.json']) {
            const p = path.join(dir, f);
            if (eos === undefined && fs.existsSync(p)) eos = JSON.parse(fs.readFileSync(p, 'utf8')).eos_token_id;
        }
        for (const id of [].concat(eos ?? [])) bias[id] = 6;
        const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')).model.vocab;
        const fallback = new Set(Object.entries(vocab).filter(([k]) => /^<0x[0-9A-F]{2}>$/.test(k)).map(([, id]) => id));
        const tok = async (text) => (await post(url, '/tokenize', { prompt: text, add_special_tokens: false })).json.tokens;
        const base = await tok('a');
        for (const ch of ['"', ']', '}', ':', '@']) {
            // the token the character is after a letter
            const t = await tok('a' + ch);
            if (t.length !== base.length + 1 || base.some((x, k) => t[k] !== x))
                throw new Error(`${info.served_model_name}: '${ch}' is not one token after 'a' (${t})`);
            const id = t[base.length];
            bias[id] = fallback.has(id) ? 20 : 6;
        }
    }
    return { url, model: info.served_model_name, bias };
}

async function ask(m, entry, mode) {
    const body = {
        model: m.model, max_tokens: MAX_TOKENS, temperature: mode.temperature,
        response_format: { type: 'json_schema', json_schema: { name: 'suite', schema: entry.schema, strict: true } },
    };
    if (mode.seed !== undefined) body.seed = mode.seed;
    if (PUSH) Object.assign(body, { logit_bias: m.bias, frequency_penalty: 0.5 });
    let r;
    if (mode.api === 'chat') {
        body.messages = [{ role: 'user', content: PROMPT }];
        r = await post(m.url, '/v1/chat/completions', body);
    } else {
        body.prompt = PROMPT;
        r = await post(m.url, '/v1/completions', body);
    }
    const c = r.status === 200 ? r.json.choices[0] : null;
    return {
        status: r.status, json: r.json, text: r.text, finish: c && c.finish_reason,
        out: c && (mode.api === 'chat' ? c.message.content : c.text), tokens: c && r.json.usage.completion_tokens,
    };
}

// ---- the run

// All at once, so that each engine batches them, but at most IN_FLIGHT
// connections to a server (one file descriptor each, here and there).
const IN_FLIGHT = 64;
async function askAll(m) {
    const queue = [];
    for (const mode of MODES) for (const entry of schemas) queue.push({ m, entry, mode });
    const out = [];
    const worker = async () => {
        for (let job; (job = queue.shift());) out.push({ ...job, res: await ask(m, job.entry, job.mode) });
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
    return out;
}

const t0 = Date.now();
const models = await Promise.all(urls.map(modelInfo));
const answers = (await Promise.all(models.map(askAll))).flat();
const tRequests = Date.now() - t0;
const order = (x) => (models.indexOf(x.m) * MODES.length + MODES.indexOf(x.mode)) * schemas.length + schemas.indexOf(x.entry);
const results = answers.sort((a, b) => order(a) - order(b));

// which schemas are supported: the same answer on every model and mode
const support = new Map(); // entry -> Set of statuses
for (const { entry, res } of results) {
    if (!support.has(entry)) support.set(entry, new Set());
    support.get(entry).add(res.status === 200 ? 'supported' : res.status === 400 ? 'refused' : `HTTP ${res.status}`);
}
const supported = new Set();
for (const [entry, st] of support) {
    if (st.size !== 1) fail(`${entry.name}: answered ${[...st].join(' and ')} on different models or modes`);
    else if (st.has('supported')) supported.add(entry);
    else if (!st.has('refused')) fail(`${entry.name}: ${[...st][0]}`);
}

// the judge agrees with the suite on every instance of the supported schemas
let nInstances = 0;
for (const entry of supported) {
    for (const t of entry.tests) {
        nInstances++;
        const why = verdict(entry, JSON.stringify(t.data));
        if ((why === null) !== t.valid)
            fail(`the judge says ${why === null ? 'valid' : why} for ${t.group} / "${t.description}" ` +
                `(${JSON.stringify(t.data)}), the suite says ${t.valid ? 'valid' : 'invalid'}`);
    }
}
const judgeOk = failures.length === 0;

// every output
const counts = new Map(); // "model / mode" -> {valid, n, tokens, max, length}
for (const m of models)
    for (const mode of MODES) counts.set(`${m.model} / ${mode.name}`, { valid: 0, n: 0, tokens: 0, max: 0, length: 0 });
const refusedBy = new Map();
for (const { m, entry, mode, res } of results) {
    const where = `${m.model} / ${mode.name} / ${entry.name}`;
    if (res.status === 400) {
        const e = res.json && res.json.error;
        if (!e || typeof e.message !== 'string' || typeof e.type !== 'string' || !('param' in e) || !('code' in e)) {
            fail(`${where}: 400 without an OpenAI error body: ${res.text}`);
            continue;
        }
        if (e.param !== 'response_format.json_schema.schema' || e.code !== 'unsupported' ||
            !/json_schema: .*(is not supported|only .* supported)/.test(e.message) ||
            !/ at (the root|\/)/.test(e.message) || !/'[^']+'/.test(e.message)) {
            fail(`${where}: the refusal does not say what is not supported, and where: ${JSON.stringify(e)}`);
            continue;
        }
        if (m === models[0] && mode === MODES[0]) {
            const kw = /'([^']+)'/.exec(e.message.replace(/^'[^']*': /, ''))[1];
            refusedBy.set(kw, (refusedBy.get(kw) || 0) + 1);
            if (process.env.VERBOSE) console.log(`refused ${entry.name}: ${e.message}`);
        }
        continue;
    }
    if (res.status !== 200) continue; // counted above
    const k = counts.get(`${m.model} / ${mode.name}`);
    k.n++;
    k.tokens += res.tokens;
    k.max = Math.max(k.max, res.tokens);
    if (res.finish !== 'stop') {
        k.length += res.finish === 'length';
        fail(`${where}: finish_reason ${res.finish} after ${res.tokens} tokens: ${JSON.stringify(res.out).slice(0, 300)}`);
        continue;
    }
    const why = judgeOk ? verdict(entry, res.out) : 'not judged (the judge disagrees with the suite)';
    if (why !== null) {
        fail(`${where}: ${why}: ${JSON.stringify(res.out).slice(0, 300)}`);
        continue;
    }
    k.valid++;
    if (process.env.VERBOSE) console.log(`ok ${where}: ${res.out.slice(0, 200)}`);
}

const share = supported.size / schemas.length;
console.log(`schemas: ${schemas.length} distinct (draft 4), supported: ${supported.size} ` +
    `(${(100 * share).toFixed(1)}%), refused with a 400: ${schemas.length - supported.size} ` +
    `(${[...refusedBy].map(([k, n]) => `${k}: ${n}`).join(', ')})`);
console.log(`judge: agrees with the suite on ${nInstances} instances of the supported schemas`);
console.log(`outputs (valid / supported schemas, mean and longest output in tokens; max_tokens ${MAX_TOKENS}` +
    `${PUSH ? '' : ', no push'}):`);
for (const [key, k] of counts) {
    if (!k.n) continue;
    console.log(`  ${key}: ${k.valid}/${k.n} valid, ${(k.tokens / k.n).toFixed(1)} tokens mean, ${k.max} longest` +
        `${k.length ? `, ${k.length} cut at max_tokens` : ''}`);
}
console.log(`${results.length} requests in ${(tRequests / 1000).toFixed(1)} s; ${nDupTexts} outputs with a duplicated name`);
if (share < minShare) fail(`the share supported fell below ${minShare}`);
if (failures.length) console.log(`${failures.length} failures`);
process.exit(failures.length ? 1 : 0);
