// schema_suite.mjs — the official JSON-Schema-Test-Suite (npm
// json-schema-test-suite) as kiln's tests read it: which files and tests
// are used, shared by grammar_schema_suite.mjs (the translator against the
// suite's instances) and tests/server/schema_corpus.mjs (the served models'
// outputs over the suite's schemas).
//
// Left out, with the reason:
//  - optional/bignum.json: integers beyond 2^53 and their float forms, which
//    JSON.parse cannot carry to the grammar unchanged;
//  - optional/zeroTerminatedFloats.json: draft 4 alone holds 1.0 not to be
//    an integer; JSON.parse reads it as 1, which every later draft accepts;
//  - "a valid protocol-relative URI" (format uri): draft 4's suite took
//    "//foo.bar/..." for a URI; from draft 6 on it is a uri-reference and
//    not a uri, the reading kiln follows.
import fs from 'node:fs';
import path from 'node:path';

export const skipFiles = new Set(['optional/bignum.json', 'optional/zeroTerminatedFloats.json']);
export const skipTests = new Set(['optional/format.json / validation of URIs / a valid protocol-relative URI']);

// The suite's files in dir (a draft's folder), optional/ last, sorted.
export function suiteFiles(dir) {
    const out = [];
    for (const f of fs.readdirSync(dir).sort()) {
        if (f.endsWith('.json')) out.push(f);
    }
    if (fs.existsSync(path.join(dir, 'optional')))
        for (const f of fs.readdirSync(path.join(dir, 'optional')).sort()) out.push('optional/' + f);
    return out.filter((f) => !skipFiles.has(f));
}

// Every group (one schema and its instances) of the suite in dir, in order:
// {file, index, name, description, schema, tests}, tests without the
// skipped ones.
export function* suiteGroups(dir) {
    for (const f of suiteFiles(dir)) {
        const groups = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
        for (const [gi, g] of groups.entries()) {
            yield {
                file: f,
                index: gi,
                name: `${f} #${gi} "${g.description}"`,
                description: g.description,
                schema: g.schema,
                tests: g.tests.filter((t) => !skipTests.has(`${f} / ${g.description} / ${t.description}`)),
            };
        }
    }
}
