/* kernel_report.c — GPU trace → time by kernel category. See kernel_report.h. */
#include "profile/kernel_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>

#include "base/error.h"
#include "base/file.h"
#include "base/mem.h"

/* ---- traces ------------------------------------------------------------------ */

static void add(struct kr_trace *t, const char *name, size_t len, double start, double end) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->a = xrealloc(t->a, (size_t)t->cap * sizeof *t->a);
    }
    t->a[t->n++] = (struct kr_activity){xstrndup(name, len), start, end};
}

/* One CSV record from *p (RFC 4180: quoted fields, "" inside quotes);
 * fields are written NUL-terminated into buf (>= line length + 1), their
 * starts into f. Returns the number of fields, -1 at the end of the data,
 * -2 for an unterminated quote. */
static int csv_record(const char **p, const char *end, char *buf, char **f, int max_fields) {
    const char *s = *p;
    if (s >= end) return -1;
    int n = 0;
    char *o = buf;
    for (;;) {
        if (n < max_fields) f[n] = o;
        n++;
        if (s < end && *s == '"') {
            s++;
            for (;;) {
                if (s >= end) return -2;
                if (*s == '"') {
                    if (s + 1 < end && s[1] == '"') *o++ = '"', s += 2;
                    else {
                        s++;
                        break;
                    }
                } else {
                    *o++ = *s++;
                }
            }
            while (s < end && *s != ',' && *s != '\n' && *s != '\r') s++; /* junk after the quote */
        } else {
            while (s < end && *s != ',' && *s != '\n' && *s != '\r') *o++ = *s++;
        }
        *o++ = 0;
        if (s < end && *s == ',') {
            s++;
            continue;
        }
        if (s < end && *s == '\r') s++;
        if (s < end && *s == '\n') s++;
        break;
    }
    *p = s;
    return n;
}

static int parse_num(const char *s, double *v) {
    char *e;
    while (*s == ' ') s++;
    if (!*s) return -1;
    *v = strtod(s, &e);
    while (*e == ' ') e++;
    return *e || !isfinite(*v) ? -1 : 0;
}

enum { MAX_FIELDS = 64 };

static int parse_nsys_csv(struct kr_trace *t, const char *data, size_t len, const char *what,
                          struct kiln_error *err) {
    const char *p = data, *end = data + len;
    char *buf = xmalloc(len + 1), *f[MAX_FIELDS];
    int c_start = -1, c_dur = -1, c_name = -1, rc = 0;
    long line = 0;
    /* the header: the first record naming the three columns (nsys may print notes before it) */
    for (;;) {
        int n = csv_record(&p, end, buf, f, MAX_FIELDS);
        line++;
        if (n < 0) {
            rc = kiln_errorf(err, "%s: no header with the columns \"Start (ns)\", \"Duration (ns)\" and \"Name\"", what);
            goto out;
        }
        for (int i = 0; i < n && i < MAX_FIELDS; i++) {
            if (!strcmp(f[i], "Start (ns)")) c_start = i;
            else if (!strcmp(f[i], "Duration (ns)")) c_dur = i;
            else if (!strcmp(f[i], "Name")) c_name = i;
        }
        if (c_start >= 0 && c_dur >= 0 && c_name >= 0) break;
        c_start = c_dur = c_name = -1;
    }
    for (;;) {
        int n = csv_record(&p, end, buf, f, MAX_FIELDS);
        line++;
        if (n == -1) break;
        if (n == -2) {
            rc = kiln_errorf(err, "%s: record %ld: a quoted field is not closed", what, line);
            goto out;
        }
        if (n == 1 && !f[0][0]) continue; /* empty line */
        int need = c_start > c_dur ? c_start : c_dur;
        if (c_name > need) need = c_name;
        double s, d;
        if (n <= need || parse_num(f[c_start], &s) || parse_num(f[c_dur], &d) || d < 0) {
            rc = kiln_errorf(err, "%s: record %ld: expected numbers in \"Start (ns)\" and \"Duration (ns)\"", what,
                             line);
            goto out;
        }
        add(t, f[c_name], strlen(f[c_name]), s, s + d);
    }
out:
    free(buf);
    return rc;
}

/* scripts/gpu/cupti_trace.c: KIND,start,end,correlation,graph,grid,block,smem,regs,name */
static int parse_cupti(struct kr_trace *t, const char *data, size_t len, const char *what, struct kiln_error *err) {
    const char *p = data, *end = data + len;
    long line = 0;
    while (p < end) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        line++;
        size_t n = (size_t)(e - p);
        if (n && p[n - 1] == '\r') n--;
        if (n) {
            if (n < 2 || (p[0] != 'K' && p[0] != 'M' && p[0] != 'S') || p[1] != ',')
                return kiln_errorf(err, "%s: line %ld: expected a K, M or S record", what, line);
            const char *field[10];
            int k = 0;
            field[k++] = p;
            for (const char *q = p; q < p + n && k < 10; q++)
                if (*q == ',') field[k++] = q + 1;
            if (k < 10) return kiln_errorf(err, "%s: line %ld: expected 10 fields", what, line);
            char num[32];
            double v[2];
            for (int i = 0; i < 2; i++) {
                size_t fl = (size_t)(field[i + 2] - 1 - field[i + 1]);
                if (fl == 0 || fl >= sizeof num) return kiln_errorf(err, "%s: line %ld: bad time", what, line);
                memcpy(num, field[i + 1], fl);
                num[fl] = 0;
                if (parse_num(num, &v[i])) return kiln_errorf(err, "%s: line %ld: bad time '%s'", what, line, num);
            }
            if (v[1] < v[0]) return kiln_errorf(err, "%s: line %ld: ends before it starts", what, line);
            add(t, field[9], (size_t)(p + n - field[9]), v[0], v[1]);
        }
        p = e < end ? e + 1 : end;
    }
    return 0;
}

static int gpu_category(const char *cat) {
    static const char *const gpu[] = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"};
    for (size_t i = 0; i < sizeof gpu / sizeof gpu[0]; i++)
        if (!strcasecmp(cat, gpu[i])) return 1;
    return 0;
}

static int parse_chrome(struct kr_trace *t, const char *data, size_t len, const char *what, struct kiln_error *err) {
    json_error_t je;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!root) return kiln_errorf(err, "%s: not JSON (line %d: %s)", what, je.line, je.text);
    json_t *ev = json_is_array(root) ? root : json_object_get(root, "traceEvents");
    int rc = 0;
    if (!json_is_array(ev)) {
        rc = kiln_errorf(err, "%s: a Chrome trace needs a \"traceEvents\" array (or is one)", what);
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) {
        if (!json_is_object(e)) continue;
        json_t *ph = json_object_get(e, "ph"), *cat = json_object_get(e, "cat"), *name = json_object_get(e, "name");
        if (!json_is_string(ph) || strcmp(json_string_value(ph), "X") || !json_is_string(cat) ||
            !gpu_category(json_string_value(cat)))
            continue;
        json_t *ts = json_object_get(e, "ts"), *dur = json_object_get(e, "dur");
        if (!json_is_number(ts) || !json_is_number(dur) || !json_is_string(name) || json_number_value(dur) < 0 ||
            !isfinite(json_number_value(ts)) || !isfinite(json_number_value(dur))) {
            rc = kiln_errorf(err, "%s: traceEvents[%zu]: a GPU event needs a name and numbers ts and dur", what, i);
            goto out;
        }
        double s = json_number_value(ts) * 1e3, d = json_number_value(dur) * 1e3; /* µs → ns */
        add(t, json_string_value(name), json_string_length(name), s, s + d);
    }
out:
    json_decref(root);
    return rc;
}

int kr_trace_parse(struct kr_trace *t, const char *data, size_t len, const char *what, struct kiln_error *err) {
    size_t i = 0;
    while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')) i++;
    if (i == len) return kiln_errorf(err, "%s: empty", what);
    if (data[i] == '{' || data[i] == '[') return parse_chrome(t, data, len, what, err);
    if (len - i >= 2 && (data[i] == 'K' || data[i] == 'M' || data[i] == 'S') && data[i + 1] == ',')
        return parse_cupti(t, data + i, len - i, what, err);
    return parse_nsys_csv(t, data, len, what, err);
}

int kr_trace_load(struct kr_trace *t, const char *path, const char *label, double elapsed_s,
                  struct kiln_error *err) {
    memset(t, 0, sizeof *t);
    char *data;
    size_t len;
    if (file_read_all(path, &data, &len, err)) return -1;
    int rc = kr_trace_parse(t, data, len, path, err);
    free(data);
    if (rc) {
        kr_trace_free(t);
        return -1;
    }
    if (!t->n) {
        kr_trace_free(t);
        return kiln_errorf(err, "%s: no GPU activity in the trace", path);
    }
    t->label = xstrdup(label && *label ? label : path);
    t->elapsed_ns = elapsed_s > 0 ? elapsed_s * 1e9 : 0;
    return 0;
}

void kr_trace_free(struct kr_trace *t) {
    for (long i = 0; i < t->n; i++) free(t->a[i].name);
    free(t->a);
    free(t->label);
    memset(t, 0, sizeof *t);
}

/* ---- rules ------------------------------------------------------------------ */

static int rule_add(struct kr_rules *r, const char *re, const char *category, const char *what,
                    struct kiln_error *err) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    if (!code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kiln_errorf(err, "%s: rule '%s': %s at offset %zu", what, re, (const char *)msg, (size_t)eo);
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 16;
        r->re = xrealloc(r->re, (size_t)r->cap * sizeof *r->re);
        r->category = xrealloc(r->category, (size_t)r->cap * sizeof *r->category);
    }
    r->re[r->n] = code;
    r->category[r->n++] = xstrdup(category);
    return 0;
}

/* an identifier that starts here: not inside a longer one (mangled names
 * put its length, a digit, before it) */
#define ID "(?<![A-Za-z_])"

int kr_rules_default(struct kr_rules *r, struct kiln_error *err) {
    static const char *const rules[][2] = {
        {"nccl|[Aa]ll_?[Rr]educe|[Aa]ll_?[Gg]ather|[Rr]educe_?[Ss]catter|cross_device", "communication"},
        {"[Mm]emcpy|[Mm]emset|^memcpy|^memset", "memory"},
        {"moe|MoE|[Ee]xpert", "moe"},
        {"[Aa]ttention|attn|[Ff]lash|fmha|FMHA|flashinfer|paged|" ID "ad_kernel|" ID "fa_prefill|" ID
         "split_kernel|split_combine",
         "attention"},
        {"gemm|Gemm|GEMM|gemv|Gemv|wgmma|cublas|cutlass|xmma|matmul|" ID "det_mma|" ID "det_simple", "gemm"},
        {"[Nn]orm", "norm"},
        {"rope|[Rr]otary|kv_store|KVStore", "rope / kv store"},
        {"silu|gelu|act_and_mul|swiglu|SwiGLU", "activation"},
        {"sample|[Ss]ampling|argmax|top_?k|top_?p|softmax|" ID "row_kernel", "sampling"},
        {"embed|gather_rows|to16|split16|" ID "add_kernel|bias_add|gated_add|elementwise|[Cc]opy", "elementwise"},
    };
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rule_add(r, rules[i][0], rules[i][1], "default rules", err)) return -1;
    return rule_add(r, ".*", "misc", "default rules", err);
}

int kr_rules_parse_object(struct kr_rules *r, const char *json, size_t len, const char *what,
                          struct kiln_error *err) {
    json_error_t je;
    json_t *o = json_loadb(json, len, 0, &je);
    if (!o) return kiln_errorf(err, "%s: not JSON (line %d: %s)", what, je.line, je.text);
    int rc = 0;
    if (!json_is_object(o) || json_object_size(o) == 0) {
        rc = kiln_errorf(err, "%s: expected an object of \"regex\": \"category\"", what);
        goto out;
    }
    const char *k;
    json_t *v;
    int catch_all = 0;
    /* jansson keeps insertion order: the file's order is the rules' order */
    json_object_foreach(o, k, v) {
        if (!json_is_string(v)) {
            rc = kiln_errorf(err, "%s: rule '%s': the category must be a string", what, k);
            goto out;
        }
        if ((rc = rule_add(r, k, json_string_value(v), what, err))) goto out;
        catch_all |= !strcmp(k, ".*");
    }
    if (!catch_all) rc = rule_add(r, ".*", "misc", what, err);
out:
    json_decref(o);
    return rc;
}

int kr_rules_load(struct kr_rules *r, const char *path, const char *engine, const char *model,
                  struct kiln_error *err) {
    memset(r, 0, sizeof *r);
    char *data;
    size_t len;
    if (file_read_all(path, &data, &len, err)) return -1;
    json_error_t je;
    json_t *root = json_loadb(data, len, 0, &je);
    free(data);
    if (!root) return kiln_errorf(err, "%s: not JSON (line %d: %s)", path, je.line, je.text);
    json_t *e = json_object_get(root, engine), *m = json_is_object(e) ? json_object_get(e, model) : NULL;
    int rc;
    if (!json_is_object(m)) {
        rc = kiln_errorf(err, "%s: no rules for engine '%s', model '%s' (expected {\"%s\": {\"%s\": {\"regex\": "
                              "\"category\"}}})", path, engine, model, engine, model);
    } else {
        char *text = json_dumps(m, JSON_PRESERVE_ORDER);
        char what[600];
        snprintf(what, sizeof what, "%s (%s/%s)", path, engine, model);
        rc = kr_rules_parse_object(r, text, strlen(text), what, err);
        free(text);
    }
    json_decref(root);
    if (rc) kr_rules_free(r);
    return rc;
}

const char *kr_classify(const struct kr_rules *r, const char *name) {
    pcre2_match_data *md = NULL;
    const char *cat = "misc";
    for (int i = 0; i < r->n; i++) {
        if (!md) md = pcre2_match_data_create_from_pattern(r->re[i], NULL);
        int rc = pcre2_match(r->re[i], (PCRE2_SPTR)name, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
        if (rc >= 0) {
            cat = r->category[i];
            break;
        }
    }
    pcre2_match_data_free(md);
    return cat;
}

void kr_rules_free(struct kr_rules *r) {
    for (int i = 0; i < r->n; i++) pcre2_code_free(r->re[i]), free(r->category[i]);
    free(r->re);
    free(r->category);
    memset(r, 0, sizeof *r);
}

/* ---- analysis ------------------------------------------------------------------ */

static int by_start(const void *a, const void *b) {
    const struct kr_activity *x = *(const struct kr_activity *const *)a, *y = *(const struct kr_activity *const *)b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name); /* identical intervals: a fixed order */
}

/* an activity with its non-overlapped share */
struct share {
    const struct kr_activity *a;
    double excl;
};

static int share_by_name(const void *a, const void *b) {
    return strcmp(((const struct share *)a)->a->name, ((const struct share *)b)->a->name);
}

static int kernel_by_gpu(const void *a, const void *b) {
    const struct kr_kernel_row *x = a, *y = b;
    if (x->gpu_ns != y->gpu_ns) return x->gpu_ns > y->gpu_ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int category_by_gpu(const void *a, const void *b) {
    const struct kr_category_row *x = a, *y = b;
    if (x->gpu_ns != y->gpu_ns) return x->gpu_ns > y->gpu_ns ? -1 : 1;
    return strcmp(x->category, y->category);
}

void kr_analyze(const struct kr_trace *t, const struct kr_rules *r, struct kr_report *out) {
    memset(out, 0, sizeof *out);
    out->trace = t;
    if (!t->n) return;
    /* each activity's exclusive share: sorted by start, the part not covered so far */
    const struct kr_activity **s = xmalloc((size_t)t->n * sizeof *s);
    double *excl = xmalloc((size_t)t->n * sizeof *excl);
    for (long i = 0; i < t->n; i++) s[i] = &t->a[i];
    qsort(s, (size_t)t->n, sizeof *s, by_start);
    double covered = -INFINITY, first = s[0]->start, last = -INFINITY;
    for (long i = 0; i < t->n; i++) {
        double from = s[i]->start > covered ? s[i]->start : covered;
        excl[i] = s[i]->end > from ? s[i]->end - from : 0;
        if (s[i]->end > covered) covered = s[i]->end;
        if (s[i]->end > last) last = s[i]->end;
        out->busy_ns += excl[i];
    }
    out->span_ns = last - first;
    /* per kernel name: the shares sorted by name */
    struct share *pairs = xmalloc((size_t)t->n * sizeof *pairs);
    for (long i = 0; i < t->n; i++) pairs[i] = (struct share){s[i], excl[i]};
    qsort(pairs, (size_t)t->n, sizeof *pairs, share_by_name);
    out->kernels = xmalloc((size_t)t->n * sizeof *out->kernels);
    for (long i = 0; i < t->n;) {
        long j = i;
        struct kr_kernel_row k = {pairs[i].a->name, kr_classify(r, pairs[i].a->name), 0, 0, 0};
        for (; j < t->n && !strcmp(pairs[j].a->name, k.name); j++) {
            k.count++;
            k.total_ns += pairs[j].a->end - pairs[j].a->start;
            k.gpu_ns += pairs[j].excl;
        }
        out->kernels[out->n_kernels++] = k;
        i = j;
    }
    qsort(out->kernels, (size_t)out->n_kernels, sizeof *out->kernels, kernel_by_gpu);
    out->categories = xmalloc((size_t)(r->n + 1) * sizeof *out->categories);
    for (long i = 0; i < out->n_kernels; i++) {
        const struct kr_kernel_row *k = &out->kernels[i];
        int c = 0;
        while (c < out->n_categories && strcmp(out->categories[c].category, k->category)) c++;
        if (c == out->n_categories) out->categories[out->n_categories++] = (struct kr_category_row){k->category, 0, 0};
        out->categories[c].gpu_ns += k->gpu_ns;
        out->categories[c].count += k->count;
    }
    qsort(out->categories, (size_t)out->n_categories, sizeof *out->categories, category_by_gpu);
    free(pairs);
    free(excl);
    free(s);
}

void kr_report_free(struct kr_report *rep) {
    free(rep->kernels);
    free(rep->categories);
    memset(rep, 0, sizeof *rep);
}

/* ---- output ----------------------------------------------------------------------- */

static void csv_field(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

void kr_write_csv(FILE *f, const struct kr_report *reps, int n) {
    fprintf(f, "trace,category,kernel,count,total_ms,gpu_ms\n");
    for (int i = 0; i < n; i++) {
        const struct kr_report *r = &reps[i];
        for (long k = 0; k < r->n_kernels; k++) {
            const struct kr_kernel_row *kr = &r->kernels[k];
            csv_field(f, r->trace->label);
            fputc(',', f);
            csv_field(f, kr->category);
            fputc(',', f);
            csv_field(f, kr->name);
            fprintf(f, ",%ld,%.6f,%.6f\n", kr->count, kr->total_ns / 1e6, kr->gpu_ns / 1e6);
        }
        if (r->trace->elapsed_ns > 0) {
            double idle = r->trace->elapsed_ns - r->busy_ns;
            csv_field(f, r->trace->label);
            fprintf(f, ",\"idle\",\"(no GPU activity)\",0,%.6f,%.6f\n", (idle > 0 ? idle : 0) / 1e6,
                    (idle > 0 ? idle : 0) / 1e6);
        }
    }
}

static void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* A category's colour: a fixed palette by first appearance over all traces. */
static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                      "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#d37295"};

static int category_index(const char **seen, int *n_seen, const char *c) {
    for (int i = 0; i < *n_seen; i++)
        if (!strcmp(seen[i], c)) return i;
    seen[*n_seen] = c;
    return (*n_seen)++;
}

void kr_write_html(FILE *f, const char *title, const struct kr_report *reps, int n) {
    /* the categories of every trace (plus idle), in order of first appearance */
    int cap = 1;
    for (int i = 0; i < n; i++) cap += reps[i].n_categories;
    const char **seen = xmalloc((size_t)cap * sizeof *seen);
    int n_seen = 0;
    double max_ms = 0;
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < reps[i].n_categories; c++) category_index(seen, &n_seen, reps[i].categories[c].category);
        double total = reps[i].trace->elapsed_ns > reps[i].busy_ns ? reps[i].trace->elapsed_ns : reps[i].busy_ns;
        if (total / 1e6 > max_ms) max_ms = total / 1e6;
    }
    int idle = category_index(seen, &n_seen, "idle");
    fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    html_text(f, title);
    fprintf(f, "</title>\n<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
               "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td.l,th.l{text-align:left}"
               "code{font-size:85%%}</style></head><body>\n<h1>");
    html_text(f, title);
    fprintf(f, "</h1>\n<p>GPU time by kernel category, without overlap (each moment of GPU activity counted "
               "once)%s.</p>\n", reps[0].trace->elapsed_ns > 0 ? "; idle: the rest of the run's wall time" : "");
    /* stacked bars: one row per trace */
    const int W = 900, bar_h = 28, gap = 14, left = 160;
    int h = n * (bar_h + gap) + 40 + 20 * ((n_seen + 3) / 4);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-size=\"12\">\n",
            left + W + 40, h);
    for (int i = 0; i < n; i++) {
        const struct kr_report *r = &reps[i];
        int y = i * (bar_h + gap) + 10;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", left - 6, y + bar_h / 2 + 4);
        html_text(f, r->trace->label);
        fprintf(f, "</text>\n");
        double x = left;
        for (int c = 0; c <= r->n_categories; c++) {
            const char *name;
            double ms;
            int ci;
            if (c < r->n_categories) {
                name = r->categories[c].category, ms = r->categories[c].gpu_ns / 1e6;
                ci = category_index(seen, &n_seen, name);
            } else {
                if (r->trace->elapsed_ns <= r->busy_ns) break;
                name = "idle", ms = (r->trace->elapsed_ns - r->busy_ns) / 1e6, ci = idle;
            }
            double w = max_ms > 0 ? ms / max_ms * W : 0;
            fprintf(f, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>", x, y, w, bar_h,
                    ci == idle ? "#dddddd" : palette[ci % (int)(sizeof palette / sizeof palette[0])]);
            html_text(f, name);
            fprintf(f, ": %.6f ms</title></rect>\n", ms);
            x += w;
        }
    }
    int ly = n * (bar_h + gap) + 24;
    for (int c = 0; c < n_seen; c++) {
        int lx = left + (c % 4) * 220, y = ly + (c / 4) * 20;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">", lx,
                y - 10, c == idle ? "#dddddd" : palette[c % (int)(sizeof palette / sizeof palette[0])], lx + 16, y);
        html_text(f, seen[c]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    /* tables */
    for (int i = 0; i < n; i++) {
        const struct kr_report *r = &reps[i];
        fprintf(f, "<h2>");
        html_text(f, r->trace->label);
        fprintf(f, "</h2>\n<p>%ld activities; GPU busy %.3f ms of a %.3f ms span", r->trace->n, r->busy_ns / 1e6,
                r->span_ns / 1e6);
        if (r->trace->elapsed_ns > 0) fprintf(f, "; run %.3f ms", r->trace->elapsed_ns / 1e6);
        fprintf(f, ".</p>\n<table><tr><th class=\"l\">category</th><th>GPU ms</th><th>share</th><th>activities</th></tr>\n");
        double denom = r->trace->elapsed_ns > r->busy_ns ? r->trace->elapsed_ns : r->busy_ns;
        for (int c = 0; c < r->n_categories; c++) {
            fprintf(f, "<tr><td class=\"l\">");
            html_text(f, r->categories[c].category);
            fprintf(f, "</td><td>%.3f</td><td>%.1f%%</td><td>%ld</td></tr>\n", r->categories[c].gpu_ns / 1e6,
                    denom > 0 ? 100.0 * r->categories[c].gpu_ns / denom : 0.0, r->categories[c].count);
        }
        if (r->trace->elapsed_ns > r->busy_ns)
            fprintf(f, "<tr><td class=\"l\">idle</td><td>%.3f</td><td>%.1f%%</td><td></td></tr>\n",
                    (r->trace->elapsed_ns - r->busy_ns) / 1e6, 100.0 * (r->trace->elapsed_ns - r->busy_ns) / denom);
        fprintf(f, "</table>\n<table><tr><th class=\"l\">kernel</th><th class=\"l\">category</th><th>count</th>"
                   "<th>total ms</th><th>GPU ms</th></tr>\n");
        for (long k = 0; k < r->n_kernels; k++) {
            const struct kr_kernel_row *kr = &r->kernels[k];
            fprintf(f, "<tr><td class=\"l\"><code>");
            html_text(f, kr->name);
            fprintf(f, "</code></td><td class=\"l\">");
            html_text(f, kr->category);
            fprintf(f, "</td><td>%ld</td><td>%.3f</td><td>%.3f</td></tr>\n", kr->count, kr->total_ns / 1e6,
                    kr->gpu_ns / 1e6);
        }
        fprintf(f, "</table>\n");
    }
    fprintf(f, "</body></html>\n");
    free(seen);
}
