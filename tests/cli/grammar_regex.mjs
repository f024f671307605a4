// grammar_regex.mjs — regular expressions compiled by kiln (`kiln grammar
// --regex P --check ...`) against JavaScript's RegExp: for each pattern P
// and candidate text T, kiln's grammar accepts T exactly when
// new RegExp('^(?:' + P + ')$', 'u') matches it.
//
// The same patterns are then checked as JSON Schema string patterns
// ({"type": "string", "pattern": P} against JSON.stringify(T)), which are
// unanchored: the truth there is new RegExp(P, 'u').test(T).
//
// Patterns: a hand-written table (escapes, classes, negation, quantifier
// forms, alternation, Unicode) and patterns drawn at random from a small
// regex grammar (seeded: the run is the same every time). Candidates: texts
// drawn from the pattern (they match), those texts mutated by one edit
// (they mostly do not), and short random texts.
//
// usage: node grammar_regex.mjs KILN
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const kiln = process.argv[2];

// a small deterministic generator (mulberry32)
let seed = 0x6b696c6e;
function rnd() {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

// ---- random patterns, each with a sampler of matching texts ----
const litChars = ['a', 'b', 'c', 'x', '0', '7', ' ', '-', 'é', '€', '😀'];
const metaEsc = ['.', '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '\\', '^', '$', '/'];
const sets = {
    '\\d': '0123456789', '\\w': 'abcxyzABZ019_', '\\s': ' \t\n\r\v\f\u00a0\u2028\u3000',
};
function genNode(depth) {
    const r = rnd();
    if (depth > 2 || r < 0.35) {
        const k = rnd();
        if (k < 0.4) { const ch = pick(litChars); return { src: ch, sample: () => ch }; }
        if (k < 0.5) { const ch = pick(metaEsc); return { src: '\\' + ch, sample: () => ch }; }
        if (k < 0.6) { const e = pick(Object.keys(sets)); return { src: e, sample: () => pick([...sets[e]]) }; }
        if (k < 0.65) return { src: '.', sample: () => pick(['a', 'é', '😀', ' ', '\t']) };
        if (k < 0.7) return { src: '\\t', sample: () => '\t' };
        if (k < 0.75) return { src: '\\u00e9', sample: () => 'é' };
        // a class
        const items = [];
        const members = [];
        for (let i = int(1, 3); i > 0; i--) {
            const c = rnd();
            if (c < 0.4) { items.push('a-f'); members.push(...'abcdef'); }
            else if (c < 0.55) { items.push('0-9'); members.push(...'0123456789'); }
            else if (c < 0.7) { items.push('\\d'); members.push(...'0123456789'); }
            else if (c < 0.8) { items.push('\\-'); members.push('-'); }
            else if (c < 0.9) { items.push('é-ë'); members.push(...'éêë'); }
            else { items.push('.'); members.push('.'); }
        }
        if (rnd() < 0.3) {
            const outside = ['x', 'Z', '😀', '_', ' ', '€'].filter((ch) => !members.includes(ch));
            return { src: '[^' + items.join('') + ']', sample: () => pick(outside) };
        }
        return { src: '[' + items.join('') + ']', sample: () => pick(members) };
    }
    if (r < 0.55) { // concatenation
        const parts = Array.from({ length: int(2, 3) }, () => genNode(depth + 1));
        return { src: parts.map((p) => p.src).join(''), sample: () => parts.map((p) => p.sample()).join(''), cat: true };
    }
    if (r < 0.7) { // alternation in a group
        const parts = Array.from({ length: int(2, 3) }, () => genNode(depth + 1));
        const open = pick(['(', '(?:', '(?<g' + int(0, 99) + '>']);
        return { src: open + parts.map((p) => p.src).join('|') + ')', sample: () => pick(parts).sample() };
    }
    // a quantifier over an atom (grouped when it is more than one)
    const inner = genNode(depth + 1);
    const atom = inner.cat || inner.quant || inner.src.length > 2 && !inner.src.startsWith('(') && !inner.src.startsWith('[')
        ? '(?:' + inner.src + ')' : inner.src;
    const q = pick([['*', 0, 3], ['+', 1, 3], ['?', 0, 1], ['{2}', 2, 2], ['{1,3}', 1, 3], ['{2,}', 2, 4], ['{0,2}', 0, 2]]);
    const lazy = rnd() < 0.2 ? '?' : '';
    return {
        src: atom + q[0] + lazy,
        quant: true,
        sample: () => { let s = ''; for (let i = int(q[1], q[2]); i > 0; i--) s += inner.sample(); return s; },
    };
}

const table = [
    ['abc', ['abc', 'ab', 'abcd', '']],
    ['a|b|', ['a', 'b', '', 'ab']],
    ['^\\d{3}-\\d{4}$', ['555-1234', '5551234', '55-1234']],
    ['[A-Z][a-z]+', ['Hello', 'hello', 'H', 'HeLlo']],
    ['[^a-c]*', ['xyz', 'xaz', '', '😀é']],
    ['\\w+@\\w+\\.com', ['me@x.com', 'me@x.org', '@x.com']],
    ['(ab)+?c', ['abc', 'ababc', 'c', 'abab']],
    ['x{0}y', ['y', 'xy']],
    ['(?:a|bc){2,3}', ['aa', 'abc', 'bcbcbc', 'a', 'aaaa']],
    ['\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\^\\$\\/', ['.*+?()[]{}|\\^$/', 'x']],
    ['[\\]\\-\\\\]+', [']-\\', 'a']],
    ['\\x41\\u00e9\\u{1F600}', ['Aé😀', 'Ae😀']],
    ['\\uD83D\\uDE00', ['😀', '\ud83d']],
    ['.', ['a', '\n', '\r', '\u2028', '😀', '', 'ab']],
    ['\\s', [' ', '\t', '\u00a0', '\ufeff', 'a', '\u200b']],
    ['\\S\\D\\W', ['aa!', ' a!', 'a1!', 'aa_']],
    ['[\\s\\d]', [' ', '5', 'a']],
    ['[^\\s]', ['a', ' ', '😀']],
    ['[é-ë]', ['é', 'ê', 'ë', 'e', 'ì']],
    ['[\\b]', ['\b', 'b']],
    ['a{2,}b{,2}', ['aab{,2}', 'aab', 'ab{,2}']],
    ['{', ['{', '']],
    ['a}', ['a}']],
    ['(a|b)*c(d|e)?', ['c', 'abbacd', 'ce', 'cde']],
    ['[-a]', ['-', 'a', 'b']],
    ['[a-]', ['-', 'a']],
    ['\\0', ['\0', '0']],
    ['[0-9]{4}-[0-9]{2}-[0-9]{2}', ['2024-01-31', '2024-1-31']],
    ['(?<year>\\d{4})', ['2024', '202']],
    ['\\n\\r\\t\\f\\v', ['\n\r\t\f\v', 'nrtfv']],
    ['[\\n]', ['\n', 'n']],
    ['a*?b+?c??', ['b', 'aabbc', 'ac']],
    ['[a-z&&[^x]]', ['a]', '&]', '[]', '^]', 'a']],
];

const patterns = [];
for (const [p, cands] of table) patterns.push({ src: p, cands: [...cands] });
for (let i = 0; i < 120; i++) {
    const g = genNode(0);
    const cands = new Set();
    for (let k = 0; k < 6; k++) {
        const s = g.sample();
        cands.add(s);
        const chars = [...s];
        const at = int(0, chars.length);
        const ed = rnd();
        if (ed < 0.33) chars.splice(at, 0, pick(litChars.concat(['\n', '!', 'q'])));
        else if (ed < 0.66 && chars.length) chars.splice(Math.min(at, chars.length - 1), 1);
        else if (chars.length) chars[Math.min(at, chars.length - 1)] = pick(litChars.concat(['\n', '!']));
        cands.add(chars.join(''));
    }
    for (let k = 0; k < 3; k++) cands.add(Array.from({ length: int(0, 4) }, () => pick(litChars)).join(''));
    patterns.push({ src: g.src, cands: [...cands] });
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-regex-'));
let pass = 0, fail = 0;
try {
    for (const [pi, p] of patterns.entries()) {
        let re;
        try {
            re = new RegExp('^(?:' + p.src + ')$', 'u');
        } catch (e) {
            // a lone '{', '}' or ']' is a syntax error under the u flag;
            // without it (ECMAScript Annex B) each is a literal, as in Python
            re = new RegExp('^(?:' + p.src + ')$');
        }
        const files = p.cands.map((c, k) => {
            const f = path.join(tmp, `p${pi}_${k}`);
            fs.writeFileSync(f, c);
            return f;
        });
        const verdicts = (args, fs2) => {
            const r = spawnSync(kiln, ['grammar', ...args, '--check', ...fs2], { encoding: 'utf8' });
            const verdict = new Map();
            for (const line of r.stdout.split('\n')) {
                const m = /^(.*): (accepted|rejected.*|incomplete.*)$/.exec(line);
                if (m) verdict.set(m[1], m[2] === 'accepted');
            }
            if (verdict.size !== fs2.length) {
                fail++;
                console.log(`FAIL /${p.src}/ (${args[0]}): kiln gave no verdicts (status ${r.status}): ${r.stderr.trim()}`);
                return null;
            }
            return verdict;
        };
        const compare = (verdict, fs2, truth, how) => p.cands.forEach((c, k) => {
            const want = truth(c);
            const got = verdict.get(fs2[k]);
            if (want === got) pass++;
            else {
                fail++;
                console.log(`FAIL /${p.src}/ ${how} on ${JSON.stringify(c)}: RegExp says ${want}, kiln says ${got}`);
            }
        });
        const whole = verdicts(['--regex', p.src], files);
        if (whole) compare(whole, files, (c) => re.test(c), 'whole text');
        // as a JSON Schema pattern: unanchored, over the JSON string's value
        let search;
        try {
            search = new RegExp(p.src, 'u');
        } catch (e) {
            search = new RegExp(p.src);
        }
        const schemaFile = path.join(tmp, `p${pi}.schema.json`);
        fs.writeFileSync(schemaFile, JSON.stringify({ type: 'string', pattern: p.src }));
        const jfiles = p.cands.map((c, k) => {
            const f = path.join(tmp, `p${pi}_${k}.json`);
            fs.writeFileSync(f, JSON.stringify(c));
            return f;
        });
        const inJson = verdicts(['--json-schema', schemaFile], jfiles);
        if (inJson) compare(inJson, jfiles, (c) => search.test(c), 'as a schema pattern');
    }
} finally {
    fs.rmSync(tmp, { recursive: true, force: true });
}
console.log(`${patterns.length} patterns`);
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
