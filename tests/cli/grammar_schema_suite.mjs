// grammar_schema_suite.mjs — the official JSON-Schema-Test-Suite (npm
// json-schema-test-suite: drafts 3 and 4; draft 4 is used, whose keywords
// draft-07 and 2020-12 keep) against `kiln grammar --check`.
//
// For every schema kiln translates, each instance the suite marks valid must
// be accepted by the compiled grammar and each one marked invalid rejected.
// The grammar fixes what JSON leaves free (see src/grammar/json_schema.c):
// object keys in the schema's property order, canonical escapes and
// numbers. So an instance is written the way the grammar expects before it
// is checked: JSON.stringify's canonical form, with each object's keys in
// the order of the properties of the schema that applies to it (other keys
// after, in their order). Where anyOf/oneOf leave the applicable schema open,
// each branch's order is tried, and the instance counts as accepted when any
// of these writings is. That is sound for invalid instances too: every
// writing is the same JSON value, so none may be accepted.
//
// Schemas kiln refuses must be refused with a "json_schema: ..." message
// and exit status 1; they are counted and the share supported is printed.
//
// The files and tests left out, and why, are in schema_suite.mjs.
//
// usage: node grammar_schema_suite.mjs KILN SUITE_TESTS_DIR [--min-share X]
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { suiteGroups } from './schema_suite.mjs';

const [kiln, suiteDir] = process.argv.slice(2);
const minShare = Number(process.argv[process.argv.indexOf('--min-share') + 1] || 0);
const CAP = 16;
// A local reference ("#", "#/definitions/a") in root.
function resolve(root, ref) {
    if (typeof ref !== 'string' || !ref.startsWith('#')) return undefined;
    let cur = root;
    const p = decodeURIComponent(ref.slice(1));
    if (p === '') return root;
    for (const seg of p.split('/').slice(1)) {
        const k = seg.replace(/~1/g, '/').replace(/~0/g, '~');
        if (cur === null || typeof cur !== 'object' || !(k in cur)) return undefined;
        cur = cur[k];
    }
    return cur;
}

// Two schemas' property and item keywords together, in kiln's order: the
// first one's properties, then the second one's new ones.
function combine(a, b) {
    const o = (x) => (x !== null && typeof x === 'object' ? x : {});
    a = o(a), b = o(b);
    const props = { ...(a.properties || {}), ...(b.properties || {}) };
    return {
        properties: props,
        additionalProperties: a.additionalProperties ?? b.additionalProperties,
        items: a.items ?? b.items,
        prefixItems: a.prefixItems ?? b.prefixItems,
        additionalItems: a.additionalItems ?? b.additionalItems,
    };
}

// The schemas that may apply to a value, as kiln orders their keys: $ref
// followed, allOf merged into its owner, anyOf/oneOf branches each merged
// with the keywords next to them.
function applicable(root, s, depth = 0) {
    if (depth > 20 || s === null || typeof s !== 'object') return [s];
    if (s.$ref !== undefined) {
        const t = resolve(root, s.$ref);
        return t === undefined ? [s] : applicable(root, t, depth + 1);
    }
    if (Array.isArray(s.allOf)) {
        const { allOf, ...base } = s;
        let acc = applicable(root, base, depth + 1);
        for (const part of allOf) {
            const next = [];
            for (const a of acc) for (const b of applicable(root, part, depth + 1)) next.push(combine(a, b));
            acc = next.slice(0, CAP);
        }
        return acc;
    }
    const key = Array.isArray(s.anyOf) ? 'anyOf' : Array.isArray(s.oneOf) ? 'oneOf' : null;
    if (key) {
        const { [key]: alts, ...base } = s;
        return applicable(root, base, depth + 1).flatMap((a) =>
            alts.flatMap((b) => applicable(root, b, depth + 1).map((x) => combine(a, x))));
    }
    return [s];
}

function product(lists, join) {
    let acc = [[]];
    for (const l of lists) {
        const next = [];
        for (const a of acc) for (const x of l) if (next.length < CAP) next.push([...a, x]);
        acc = next;
    }
    return acc.map(join);
}

// The writings of value v the grammar of schema s may expect.
function writings(root, v, s) {
    if (v === null || typeof v !== 'object') return [JSON.stringify(v)];
    const out = new Set();
    for (const a of applicable(root, s)) {
        const sc = a !== null && typeof a === 'object' ? a : {};
        if (Array.isArray(v)) {
            const prefix = Array.isArray(sc.prefixItems) ? sc.prefixItems : Array.isArray(sc.items) ? sc.items : [];
            const rest = Array.isArray(sc.items) ? sc.additionalItems : sc.items;
            const lists = v.map((x, i) => writings(root, x, i < prefix.length ? prefix[i] : rest));
            for (const w of product(lists, (p) => '[' + p.join(',') + ']')) out.add(w);
        } else {
            const props = sc.properties && typeof sc.properties === 'object' ? sc.properties : {};
            const keys = Object.keys(props).filter((k) => Object.hasOwn(v, k));
            for (const k of Object.keys(v)) if (!Object.hasOwn(props, k)) keys.push(k);
            const lists = keys.map((k) =>
                writings(root, v[k], Object.hasOwn(props, k) ? props[k] : sc.additionalProperties).map(
                    (w) => JSON.stringify(k) + ':' + w));
            for (const w of product(lists, (p) => '{' + p.join(',') + '}')) out.add(w);
        }
        if (out.size >= CAP) break;
    }
    return [...out].slice(0, CAP);
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-schema-suite-'));
let nSchemas = 0, nSupported = 0, nPass = 0, nFail = 0;
const refusedBy = new Map();
try {
    for (const g of suiteGroups(suiteDir)) {
        nSchemas++;
        const name = g.name;
        const schemaFile = path.join(tmp, 'schema.json');
        fs.writeFileSync(schemaFile, JSON.stringify(g.schema));
        const texts = [];
        const owner = [];
        const tests = g.tests;
        tests.forEach((t, ti) => {
            for (const w of writings(g.schema, t.data, g.schema)) {
                const tf = path.join(tmp, `t${texts.length}.json`);
                fs.writeFileSync(tf, w);
                texts.push(tf);
                owner.push(ti);
            }
        });
        const r = spawnSync(kiln, ['grammar', '--json-schema', schemaFile, '--check', ...texts], { encoding: 'utf8' });
        const verdicts = new Map(); // file -> accepted
        for (const line of r.stdout.split('\n')) {
            const m = /^(.*): (accepted|rejected at byte \d+|incomplete.*)$/.exec(line);
            if (m) verdicts.set(m[1], m[2] === 'accepted');
        }
        if (verdicts.size === 0) {
            // refused: a clean error, never a crash
            const msg = r.stderr.trim();
            if (r.status !== 1 || !/json_schema: /.test(msg)) {
                console.log(`FAIL ${name}: no verdicts and no clean refusal (status ${r.status} ${r.signal || ''}): ${msg}`);
                nFail++;
                continue;
            }
            const kw = (/'([^']+)'/.exec(msg) || [, 'other'])[1];
            refusedBy.set(kw, (refusedBy.get(kw) || 0) + 1);
            if (process.env.VERBOSE) console.log(`refused ${name}: ${msg}`);
            continue;
        }
        nSupported++;
        tests.forEach((t, ti) => {
            const mine = texts.filter((_, k) => owner[k] === ti);
            const accepted = mine.some((tf) => verdicts.get(tf));
            if (accepted === t.valid) {
                nPass++;
            } else {
                nFail++;
                console.log(`FAIL ${name} / "${t.description}": valid=${t.valid} but the grammar ` +
                    `${accepted ? 'accepted' : 'rejected'} ${JSON.stringify(t.data)}`);
            }
        });
    }
} finally {
    fs.rmSync(tmp, { recursive: true, force: true });
}
const share = nSupported / nSchemas;
console.log(`schemas: ${nSchemas}, translated: ${nSupported} (${(100 * share).toFixed(1)}%), refused: ` +
    `${nSchemas - nSupported} (${[...refusedBy].map(([k, n]) => `${k}: ${n}`).join(', ')})`);
console.log(`instances: ${nPass} passed, ${nFail} failed`);
if (share < minShare) {
    console.log(`FAIL: the share translated fell below ${minShare}`);
    process.exit(1);
}
process.exit(nFail ? 1 : 0);
