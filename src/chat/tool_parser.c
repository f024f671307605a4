/* tool_parser.c — the streaming tool-call parsers (see tool_parser.h).
 *
 * One state machine serves every format. Text waits in `pend` until it is
 * decided; every decision depends only on the bytes read so far, never on
 * where the deltas were split, so feeding a text in any pieces decides the
 * same content and calls as feeding it whole (the tests check every split).
 * A call that turns out malformed gives its opening marker back as content
 * and scanning resumes right after that marker.
 */
#include "chat/tool_parser.h"

#include <string.h>

#include <jansson.h>

#include "base/mem.h"
#include "base/utf8.h"

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"
#define MI_OPEN "[TOOL_CALLS]"
#define MI_ARGS "[ARGS]"
#define MI_CALL_ID "[CALL_ID]"

#define JSON_MAX_DEPTH 512
#define NAME_MAX_BYTES 512

enum {
    TP_CONTENT, /* content; looking for a call's opening marker */
    TP_TEXT,    /* content for good (llama3_json once the output is not a call) */
    TP_LSTART,  /* llama3_json: nothing but whitespace read yet */
    TP_LSEP,    /* llama3_json: after a call, waiting for ";" */
    TP_CALL,    /* a call body ended by a marker (hermes, deepseek) */
    TP_MNAME,   /* mistral: after [TOOL_CALLS], the name or the array */
    TP_JSON,    /* a call ended by the end of a JSON value */
};

enum { J_LLAMA, J_MISTRAL_ARRAY, J_MISTRAL_ARGS };

/* ---- names ---------------------------------------------------------------- */

static const struct {
    const char *name;
    enum tool_format fmt;
} k_names[] = {
    {"hermes", TOOL_FORMAT_HERMES},           {"qwen25", TOOL_FORMAT_HERMES},
    {"qwen", TOOL_FORMAT_HERMES},             {"llama3_json", TOOL_FORMAT_LLAMA3_JSON},
    {"llama3", TOOL_FORMAT_LLAMA3_JSON},      {"deepseek_v3", TOOL_FORMAT_DEEPSEEK_V3},
    {"deepseekv3", TOOL_FORMAT_DEEPSEEK_V3},  {"deepseek_v31", TOOL_FORMAT_DEEPSEEK_V31},
    {"deepseekv31", TOOL_FORMAT_DEEPSEEK_V31}, {"mistral", TOOL_FORMAT_MISTRAL},
    {"harmony", TOOL_FORMAT_HARMONY},         {"openai", TOOL_FORMAT_HARMONY},
    {"gpt_oss", TOOL_FORMAT_HARMONY},         {"gpt-oss", TOOL_FORMAT_HARMONY},
};

int tool_format_from_name(const char *name, enum tool_format *out) {
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i].name)) {
            *out = k_names[i].fmt;
            return 0;
        }
    return -1;
}

const char *tool_format_choices(void) {
    return "auto, hermes (qwen25, qwen), llama3_json (llama3), deepseek_v3 (deepseekv3), deepseek_v31 "
           "(deepseekv31), mistral, harmony (openai, gpt_oss, gpt-oss)";
}

const char *tool_format_name(enum tool_format f) {
    switch (f) {
    case TOOL_FORMAT_HERMES: return "hermes";
    case TOOL_FORMAT_LLAMA3_JSON: return "llama3_json";
    case TOOL_FORMAT_DEEPSEEK_V3: return "deepseek_v3";
    case TOOL_FORMAT_DEEPSEEK_V31: return "deepseek_v31";
    case TOOL_FORMAT_MISTRAL: return "mistral";
    case TOOL_FORMAT_HARMONY: return "harmony";
    default: return "none";
    }
}

enum tool_format tool_format_detect(const char *t) {
    if (!t) return TOOL_FORMAT_NONE;
    if (strstr(t, HERMES_OPEN)) return TOOL_FORMAT_HERMES;
    /* V3 fences the arguments in ```json; V3.1 writes them bare */
    if (strstr(t, DS_CALL_BEGIN)) return strstr(t, "```json") ? TOOL_FORMAT_DEEPSEEK_V3 : TOOL_FORMAT_DEEPSEEK_V31;
    if (strstr(t, MI_OPEN)) return TOOL_FORMAT_MISTRAL;
    if (strstr(t, "<|channel|>") && strstr(t, "to=")) return TOOL_FORMAT_HARMONY;
    if (strstr(t, PYTHON_TAG) || (strstr(t, "\"parameters\"") && strstr(t, "ipython"))) return TOOL_FORMAT_LLAMA3_JSON;
    return TOOL_FORMAT_NONE;
}

int tool_format_frame(enum tool_format f, struct tool_call_frame *o) {
    switch (f) {
    case TOOL_FORMAT_HERMES:
        *o = (struct tool_call_frame){HERMES_OPEN, HERMES_OPEN "\n{\"name\": \"", "\", \"arguments\": ",
                                      "}\n" HERMES_CLOSE, "\n"};
        return 0;
    case TOOL_FORMAT_LLAMA3_JSON:
        *o = (struct tool_call_frame){"{", "{\"name\": \"", "\", \"parameters\": ", "}", "; "};
        return 0;
    case TOOL_FORMAT_DEEPSEEK_V3:
        *o = (struct tool_call_frame){DS_CALLS_BEGIN, DS_CALLS_BEGIN DS_CALL_BEGIN "function" DS_SEP,
                                      "\n```json\n", "\n```" DS_CALL_END DS_CALLS_END, ""};
        return 0;
    case TOOL_FORMAT_DEEPSEEK_V31:
        *o = (struct tool_call_frame){DS_CALLS_BEGIN, DS_CALLS_BEGIN DS_CALL_BEGIN, DS_SEP, DS_CALL_END DS_CALLS_END,
                                      ""};
        return 0;
    case TOOL_FORMAT_MISTRAL:
        *o = (struct tool_call_frame){MI_OPEN, MI_OPEN, MI_ARGS, "", ""};
        return 0;
    default: return -1;
    }
}

/* ---- events ----------------------------------------------------------------- */

void tool_events_clear(struct tool_events *e) {
    for (int i = 0; i < e->n; i++) {
        free(e->v[i].text);
        free(e->v[i].name);
    }
    e->n = 0;
}

void tool_events_free(struct tool_events *e) {
    tool_events_clear(e);
    free(e->v);
    e->v = NULL;
    e->cap = 0;
}

static struct tool_event *push_event(struct tool_events *e) {
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 4;
        e->v = xrealloc(e->v, (size_t)e->cap * sizeof *e->v);
    }
    struct tool_event *v = &e->v[e->n++];
    memset(v, 0, sizeof *v);
    return v;
}

static char *dup_n(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Content, merged into the previous event when that is content too. */
static void emit_content(struct tool_parser *p, const char *s, size_t n) {
    if (!n) return;
    struct tool_events *e = &p->ev;
    for (size_t i = 0; i < n; i++)
        if (!is_ws(s[i])) {
            p->last_was_call = 0;
            break;
        }
    if (e->n && e->v[e->n - 1].kind == TOOL_EVENT_CONTENT) {
        struct tool_event *v = &e->v[e->n - 1];
        v->text = xrealloc(v->text, v->len + n + 1);
        memcpy(v->text + v->len, s, n);
        v->len += n;
        v->text[v->len] = 0;
        return;
    }
    struct tool_event *v = push_event(e);
    v->kind = TOOL_EVENT_CONTENT;
    v->text = dup_n(s, n);
    v->len = n;
}

static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void emit_call(struct tool_parser *p, const char *name, size_t nlen, const char *args, size_t alen) {
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    struct tool_event *v = push_event(&p->ev);
    v->kind = TOOL_EVENT_CALL;
    v->index = p->n_calls++;
    v->name = dup_n(name, nlen);
    v->text = dup_n(args, alen);
    v->len = alen;
    int n = p->fmt == TOOL_FORMAT_MISTRAL ? 9 : 24, o = 0;
    if (p->fmt != TOOL_FORMAT_MISTRAL) o = (int)strlen(strcpy(v->id, "call_"));
    for (int i = 0; i < n; i++) v->id[o + i] = alnum[next_rand(&p->rng) % 62];
    v->id[o + n] = 0;
    p->last_was_call = 1;
}

/* A call read well: what opened it is no longer needed. */
static void call_done(struct tool_parser *p) {
    buf_clear(&p->held);
    buf_clear(&p->opener);
}

/* ---- strict JSON ------------------------------------------------------------ */

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

#define JFAIL ((size_t)-1)

static size_t j_string(const char *s, size_t n, size_t i) {
    if (i >= n || s[i] != '"') return JFAIL;
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return JFAIL;
        if (c != '\\') continue;
        if (++i >= n) return JFAIL;
        if (strchr("\"\\/bfnrt", s[i]) && s[i]) continue;
        if (s[i] != 'u' || i + 4 >= n) return JFAIL;
        for (int k = 1; k <= 4; k++)
            if (!strchr("0123456789abcdefABCDEF", s[i + k]) || !s[i + k]) return JFAIL;
        i += 4;
    }
    return JFAIL;
}

static size_t j_digits(const char *s, size_t n, size_t i) {
    size_t st = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    return i == st ? JFAIL : i;
}

static size_t j_number(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if ((i = j_digits(s, n, i)) == JFAIL) return JFAIL;
    if (i < n && s[i] == '.' && (i = j_digits(s, n, i + 1)) == JFAIL) return JFAIL;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if ((i = j_digits(s, n, i)) == JFAIL) return JFAIL;
    }
    return i;
}

/* The end of the JSON value at s[i] (whitespace before it skipped). */
static size_t j_value(const char *s, size_t n, size_t i, int depth) {
    i = skip_ws(s, n, i);
    if (i >= n || depth > JSON_MAX_DEPTH) return JFAIL;
    char c = s[i];
    if (c == '"') return j_string(s, n, i);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, n, i + 1);
        if (i < n && s[i] == close) return i + 1;
        for (;;) {
            if (c == '{') {
                if ((i = j_string(s, n, skip_ws(s, n, i))) == JFAIL) return JFAIL;
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != ':') return JFAIL;
                i++;
            }
            if ((i = j_value(s, n, i, depth + 1)) == JFAIL) return JFAIL;
            i = skip_ws(s, n, i);
            if (i >= n) return JFAIL;
            if (s[i] == close) return i + 1;
            if (s[i] != ',') return JFAIL;
            i++;
        }
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (n - i >= l && !memcmp(s + i, lits[k], l)) return i + l;
    }
    return j_number(s, n, i);
}

/* A JSON string token's value; NULL when it holds a NUL or is not valid. */
static char *j_decode_string(const char *s, size_t n, size_t *len) {
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
    char *out = NULL;
    if (json_is_string(v)) {
        *len = json_string_length(v);
        out = dup_n(json_string_value(v), *len);
    }
    json_decref(v);
    return out;
}

static int j_key_is(const char *s, size_t n, const char *want) {
    size_t len;
    char *k = j_decode_string(s, n, &len);
    int eq = k && len == strlen(want) && !memcmp(k, want, len);
    free(k);
    return eq;
}

/* s[0..n) is, whitespace around it aside, one object with "name" (a
 * string) and "arguments" or "parameters" (an object; absent: {}). */
static int parse_call_object(struct tool_parser *p, const char *s, size_t n) {
    size_t i = skip_ws(s, n, 0);
    size_t end = j_value(s, n, i, 0);
    if (end == JFAIL || s[i] != '{' || skip_ws(s, n, end) != n) return -1;
    char *name = NULL;
    size_t nlen = 0, a0 = 0, a1 = 0;
    i = skip_ws(s, n, i + 1);
    while (i < end && s[i] != '}') {
        size_t k0 = i, k1 = j_string(s, n, i);
        size_t v0 = skip_ws(s, n, skip_ws(s, n, k1) + 1), v1 = j_value(s, n, v0, 1);
        if (j_key_is(s + k0, k1 - k0, "name")) {
            free(name);
            name = s[v0] == '"' ? j_decode_string(s + v0, v1 - v0, &nlen) : NULL;
            if (!name) return -1;
        } else if (j_key_is(s + k0, k1 - k0, "arguments") || j_key_is(s + k0, k1 - k0, "parameters")) {
            if (s[v0] != '{') {
                free(name);
                return -1;
            }
            a0 = v0, a1 = v1;
        }
        i = skip_ws(s, n, v1);
        if (s[i] == ',') i = skip_ws(s, n, i + 1);
    }
    if (!name || !nlen) {
        free(name);
        return -1;
    }
    if (a1) emit_call(p, name, nlen, s + a0, a1 - a0);
    else emit_call(p, name, nlen, "{}", 2);
    free(name);
    return 0;
}

/* A bare arguments object (deepseek, mistral v11): s[0..n) trimmed. */
static int args_object(const char *s, size_t n, size_t *a0, size_t *a1) {
    size_t i = skip_ws(s, n, 0), e = j_value(s, n, i, 0);
    if (e == JFAIL || s[i] != '{' || skip_ws(s, n, e) != n) return -1;
    *a0 = i, *a1 = e;
    return 0;
}

static int name_ok(const char *s, size_t n) {
    if (!n || n > NAME_MAX_BYTES) return 0;
    for (size_t i = 0; i < n; i++)
        if (is_ws(s[i]) || s[i] == '<' || s[i] == '>' || s[i] == '"' || !s[i]) return 0;
    return 1;
}

static const char *find(const char *h, size_t hn, const char *nd) {
    size_t n = strlen(nd);
    if (n > hn) return NULL;
    for (size_t i = 0; i + n <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, n)) return h + i;
    return NULL;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* TYPE<sep>NAME\n```json\n{...}\n``` (V3) or NAME<sep>{...} (V3.1). */
static int parse_deepseek(struct tool_parser *p, const char *s, size_t n) {
    const char *sep = find(s, n, DS_SEP);
    if (!sep) return -1;
    const char *left = s, *right = sep + strlen(DS_SEP);
    size_t ln = (size_t)(sep - s), rn = n - (size_t)(right - s);
    const char *fence = find(right, rn, "```json");
    const char *name, *args;
    size_t nn, an;
    if (fence) {
        name = right, nn = (size_t)(fence - right);
        trim(&name, &nn);
        if (!nn) name = left, nn = ln;
        args = fence + 7, an = rn - (size_t)(args - right);
        trim(&args, &an);
        if (an < 3 || memcmp(args + an - 3, "```", 3)) return -1;
        an -= 3;
    } else {
        name = left, nn = ln, args = right, an = rn;
    }
    trim(&name, &nn);
    size_t a0, a1;
    if (!name_ok(name, nn) || args_object(args, an, &a0, &a1)) return -1;
    emit_call(p, name, nn, args + a0, a1 - a0);
    return 0;
}

/* [{"name": ..., "arguments": {...}}, ...]: all or nothing. */
static int parse_mistral_array(struct tool_parser *p, const char *s, size_t n) {
    size_t i = skip_ws(s, n, 0), end = j_value(s, n, i, 0);
    if (end == JFAIL || s[i] != '[' || skip_ws(s, n, end) != n) return -1;
    int first = p->ev.n, calls0 = p->n_calls, last0 = p->last_was_call;
    i = skip_ws(s, n, i + 1);
    if (s[i] == ']') return -1;
    while (s[i] != ']') {
        size_t e = j_value(s, n, i, 1);
        if (parse_call_object(p, s + i, e - i)) {
            /* undo the calls of this array already made */
            while (p->ev.n > first) {
                struct tool_event *v = &p->ev.v[--p->ev.n];
                free(v->text);
                free(v->name);
            }
            p->n_calls = calls0;
            p->last_was_call = last0;
            return -1;
        }
        i = skip_ws(s, n, e);
        if (s[i] == ',') i = skip_ws(s, n, i + 1);
    }
    return 0;
}

/* ---- the state machine ------------------------------------------------------ */

static int content_state(const struct tool_parser *p) {
    return p->fmt == TOOL_FORMAT_LLAMA3_JSON ? TP_TEXT : TP_CONTENT;
}

/* The call being read is not one: its marker (and the whitespace before
 * it) becomes content and the rest is read again as content. */
static void fail_call(struct tool_parser *p) {
    emit_content(p, p->held.data, p->held.len);
    emit_content(p, p->opener.data, p->opener.len);
    buf_clear(&p->held);
    buf_clear(&p->opener);
    p->state = content_state(p);
    p->scan = 0;
}

static size_t ws_back(const char *s, size_t k) {
    while (k && is_ws(s[k - 1])) k--;
    return k;
}

/* The longest tail of s[0..n) that is a proper prefix of m. */
static size_t partial_tail(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t l = ml - 1 < n ? ml - 1 : n; l; l--)
        if (!memcmp(s + n - l, m, l)) return l;
    return 0;
}

static void begin_call(struct tool_parser *p, size_t ws0, size_t at, const char *marker, size_t mlen, int state) {
    emit_content(p, p->pend.data, ws0);
    buf_clear(&p->held);
    buf_append(&p->held, p->pend.data + ws0, at - ws0);
    buf_clear(&p->opener);
    buf_append(&p->opener, marker, mlen);
    buf_consume(&p->pend, at + mlen);
    p->state = state;
    p->scan = 0;
    p->depth = p->in_str = p->esc = p->jstart = 0;
}

static int step_content(struct tool_parser *p, int final) {
    static const char *const hermes[] = {HERMES_OPEN, NULL};
    static const char *const deepseek[] = {DS_CALL_BEGIN, DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_END, NULL};
    static const char *const mistral[] = {MI_OPEN, NULL};
    static const char *const none[] = {NULL};
    const char *const *marks = p->state == TP_TEXT                  ? none
                               : p->fmt == TOOL_FORMAT_HERMES       ? hermes
                               : p->fmt == TOOL_FORMAT_MISTRAL      ? mistral
                               : p->fmt == TOOL_FORMAT_DEEPSEEK_V3 ||
                                         p->fmt == TOOL_FORMAT_DEEPSEEK_V31
                                   ? deepseek
                                   : none;
    const char *s = p->pend.data;
    size_t n = p->pend.len, best = n;
    int which = -1;
    for (int k = 0; marks[k]; k++) {
        const char *f = find(s, n, marks[k]);
        if (f && (size_t)(f - s) < best) best = (size_t)(f - s), which = k;
    }
    if (which > 0) {
        /* deepseek's section markers: dropped. What comes before them is
         * decided first (whitespace aside), so that no text joined across
         * a dropped marker can form a new one. */
        size_t ml = strlen(marks[which]), w = ws_back(s, best);
        emit_content(p, s, w);
        memmove(p->pend.data + best, p->pend.data + best + ml, n - best - ml);
        buf_truncate(&p->pend, n - ml);
        buf_consume(&p->pend, w);
        return 1;
    }
    if (which == 0) {
        int st = p->fmt == TOOL_FORMAT_MISTRAL ? TP_MNAME : TP_CALL;
        begin_call(p, ws_back(s, best), best, marks[0], strlen(marks[0]), st);
        return 1;
    }
    if (final) {
        if (!(p->last_was_call && ws_back(s, n) == 0)) emit_content(p, s, n);
        buf_clear(&p->pend);
        return 0;
    }
    size_t hold = 0;
    for (int k = 0; marks[k]; k++) {
        size_t h = partial_tail(s, n, marks[k]);
        if (h > hold) hold = h;
    }
    size_t k = utf8_cut(s, ws_back(s, n - hold));
    emit_content(p, s, k);
    buf_consume(&p->pend, k);
    return 0;
}

static int step_llama_start(struct tool_parser *p, int final) {
    const char *s = p->pend.data;
    size_t n = p->pend.len, i = skip_ws(s, n, 0);
    if (i == n) {
        if (final) p->state = TP_TEXT;
        return final;
    }
    if (s[i] == '{') {
        begin_call(p, 0, i, "", 0, TP_JSON);
        return 1;
    }
    size_t tl = strlen(PYTHON_TAG), m = n - i < tl ? n - i : tl;
    if (!memcmp(s + i, PYTHON_TAG, m)) {
        if (m == tl) {
            begin_call(p, 0, i, PYTHON_TAG, tl, TP_JSON);
            return 1;
        }
        if (!final) return 0;
    }
    p->state = TP_TEXT;
    return 1;
}

static int step_llama_sep(struct tool_parser *p, int final) {
    const char *s = p->pend.data;
    size_t n = p->pend.len, i = skip_ws(s, n, 0);
    if (i == n) {
        if (final) p->state = TP_TEXT;
        return final;
    }
    if (s[i] == ';') {
        /* the whitespace before ";" is held with it: content again if no
         * call follows */
        begin_call(p, 0, i, ";", 1, TP_JSON);
        return 1;
    }
    p->state = TP_TEXT;
    return 1;
}

static int step_call(struct tool_parser *p, int final) {
    const char *close = p->fmt == TOOL_FORMAT_HERMES ? HERMES_CLOSE : DS_CALL_END;
    size_t cl = strlen(close), from = p->scan >= cl ? p->scan - (cl - 1) : 0;
    const char *s = p->pend.data;
    const char *f = find(s + from, p->pend.len - from, close);
    if (!f && !final) {
        p->scan = p->pend.len;
        return 0;
    }
    size_t body = f ? (size_t)(f - s) : p->pend.len;
    int rc = p->fmt == TOOL_FORMAT_HERMES ? parse_call_object(p, s, body) : parse_deepseek(p, s, body);
    if (rc) {
        fail_call(p);
        return 1;
    }
    call_done(p);
    buf_consume(&p->pend, f ? body + cl : body);
    p->state = TP_CONTENT;
    return 1;
}

static int is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* 2: s starts with marker m; 1: s is a proper prefix of it; 0: neither. */
static int marker_at(const char *s, size_t n, const char *m) {
    size_t ml = strlen(m);
    if (n >= ml) return memcmp(s, m, ml) ? 0 : 2;
    return memcmp(s, m, n) ? 0 : 1;
}

static int step_mistral_name(struct tool_parser *p, int final) {
    const char *s = p->pend.data;
    size_t n = p->pend.len, i = skip_ws(s, n, 0), j = i;
    if (i < n && s[i] == '[') {
        p->state = TP_JSON, p->jkind = J_MISTRAL_ARRAY;
        return 1;
    }
    while (j < n && j - i <= NAME_MAX_BYTES &&
           (is_alnum(s[j]) || s[j] == '_' || s[j] == '-' || s[j] == '.'))
        j++;
    if (j - i > NAME_MAX_BYTES || (j == i && j < n)) {
        fail_call(p);
        return 1;
    }
    size_t k = j;
    if (k < n && s[k] == '[') {
        int r = marker_at(s + k, n - k, MI_CALL_ID);
        if (r == 1 && !final) return 0;
        if (r == 2) {
            k += strlen(MI_CALL_ID);
            while (k < n && is_alnum(s[k])) k++;
        }
    }
    if (k < n && s[k] == '[') {
        int r = marker_at(s + k, n - k, MI_ARGS);
        if (r == 1 && !final) return 0;
        if (r == 2) k += strlen(MI_ARGS);
    }
    if (k == n && !final) return 0;
    if (k == n || s[k] != '{' || j == i) {
        fail_call(p);
        return 1;
    }
    buf_clear(&p->name);
    buf_append(&p->name, s + i, j - i);
    /* the text up to the object stays readable if the call fails */
    buf_append(&p->opener, s, k);
    buf_consume(&p->pend, k);
    p->state = TP_JSON, p->jkind = J_MISTRAL_ARGS;
    return 1;
}

static int step_json(struct tool_parser *p, int final) {
    const char *s = p->pend.data;
    size_t n = p->pend.len, end = 0;
    char want = p->jkind == J_MISTRAL_ARRAY ? '[' : '{';
    for (size_t i = p->scan; i < n && !end; i++) {
        char c = s[i];
        if (!p->jstart) {
            if (is_ws(c)) continue;
            if (c != want) {
                fail_call(p);
                return 1;
            }
            p->jstart = 1, p->depth = 1;
        } else if (p->in_str) {
            if (p->esc) p->esc = 0;
            else if (c == '\\') p->esc = 1;
            else if (c == '"') p->in_str = 0;
        } else if (c == '"') {
            p->in_str = 1;
        } else if (c == '{' || c == '[') {
            p->depth++;
        } else if ((c == '}' || c == ']') && --p->depth == 0) {
            end = i + 1;
        }
    }
    p->scan = n;
    if (!end) {
        if (final) fail_call(p);
        return final;
    }
    int rc;
    if (p->jkind == J_LLAMA) {
        rc = parse_call_object(p, s, end);
    } else if (p->jkind == J_MISTRAL_ARRAY) {
        rc = parse_mistral_array(p, s, end);
    } else {
        size_t a0, a1;
        rc = args_object(s, end, &a0, &a1);
        if (!rc) emit_call(p, p->name.data, p->name.len, s + a0, a1 - a0);
    }
    if (rc) {
        fail_call(p);
        return 1;
    }
    call_done(p);
    buf_consume(&p->pend, end);
    p->state = p->fmt == TOOL_FORMAT_LLAMA3_JSON ? TP_LSEP : TP_CONTENT;
    p->scan = 0;
    return 1;
}

/* harmony: the splitter's parts as events; a call whose arguments are
 * not a JSON object is content, in the template's form */
static void hm_content(void *ctx, const char *s, size_t n) { emit_content(ctx, s, n); }
static void hm_call(void *ctx, const char *name, size_t nlen, const char *recipient, size_t rlen, const char *args,
                    size_t alen) {
    struct tool_parser *p = ctx;
    size_t a0, a1;
    if (name_ok(name, nlen) && !args_object(args, alen, &a0, &a1) && a0 == 0 && a1 == alen) {
        emit_call(p, name, nlen, args, alen);
        return;
    }
    struct buf t = {0};
    harmony_call_text(&t, recipient, rlen, args, alen);
    emit_content(p, t.data, t.len);
    buf_free(&t);
}

static void run(struct tool_parser *p, int final) {
    if (p->fmt == TOOL_FORMAT_HARMONY) {
        /* without a reasoning parser the thoughts are content */
        const struct harmony_sink k = {p, hm_content, hm_content, hm_call};
        struct buf in = p->pend;
        p->pend = (struct buf){0};
        harmony_feed(&p->hp, in.data, in.len, final, &k);
        buf_free(&in);
        return;
    }
    for (;;) {
        int progress;
        switch (p->state) {
        case TP_LSTART: progress = step_llama_start(p, final); break;
        case TP_LSEP: progress = step_llama_sep(p, final); break;
        case TP_CALL: progress = step_call(p, final); break;
        case TP_MNAME: progress = step_mistral_name(p, final); break;
        case TP_JSON: progress = step_json(p, final); break;
        default: progress = step_content(p, final); break;
        }
        if (!progress) return;
    }
}

void tool_parser_init(struct tool_parser *p, enum tool_format fmt, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->rng = seed;
    p->state = fmt == TOOL_FORMAT_LLAMA3_JSON ? TP_LSTART : fmt == TOOL_FORMAT_NONE ? TP_TEXT : TP_CONTENT;
    p->jkind = J_LLAMA;
    harmony_init(&p->hp);
}

void tool_parser_free(struct tool_parser *p) {
    buf_free(&p->pend);
    buf_free(&p->held);
    buf_free(&p->opener);
    buf_free(&p->name);
    harmony_free(&p->hp);
    tool_events_free(&p->ev);
}

const struct tool_events *tool_parser_feed(struct tool_parser *p, const char *text, size_t len) {
    tool_events_clear(&p->ev);
    buf_append(&p->pend, text, len);
    run(p, 0);
    return &p->ev;
}

const struct tool_events *tool_parser_finish(struct tool_parser *p) {
    tool_events_clear(&p->ev);
    run(p, 1);
    return &p->ev;
}

static void merge_events(struct tool_events *out, struct buf *content, const struct tool_events *ev) {
    for (int i = 0; i < ev->n; i++) {
        const struct tool_event *v = &ev->v[i];
        if (v->kind == TOOL_EVENT_CONTENT) {
            buf_append(content, v->text, v->len);
            continue;
        }
        struct tool_event *c = push_event(out);
        *c = *v;
        c->text = dup_n(v->text, v->len);
        c->name = dup_n(v->name, strlen(v->name));
    }
}

void tool_parse_whole(enum tool_format fmt, uint64_t seed, const char *text, size_t len, struct tool_events *out) {
    struct tool_parser p;
    struct buf content = {0};
    struct tool_events calls = {0};
    tool_events_clear(out);
    tool_parser_init(&p, fmt, seed);
    merge_events(&calls, &content, tool_parser_feed(&p, text, len));
    merge_events(&calls, &content, tool_parser_finish(&p));
    tool_parser_free(&p);
    if (content.len) {
        struct tool_event *v = push_event(out);
        v->kind = TOOL_EVENT_CONTENT;
        v->len = content.len;
        v->text = buf_take(&content);
    }
    buf_free(&content);
    for (int i = 0; i < calls.n; i++) *push_event(out) = calls.v[i];
    free(calls.v);
}
