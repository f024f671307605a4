/* cmd_profile_report.c — `kiln profile-report`: GPU traces → time by kernel
 * category, as an HTML page (stacked bars) and a CSV (src/profile/kernel_report.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "cli/options.h"
#include "profile/kernel_report.h"

int cmd_profile_report(int argc, char **argv) {
    const char *rules_path = NULL, *engine = "kiln", *model = "default", *title = "GPU kernel time", *out = "result";
    const struct cli_opt opts[] = {
        CLI_OPT_STR("--rules", &rules_path, "FILE",
                    "kernel → category rules, {\"ENGINE\": {\"MODEL\": {\"regex\": \"category\"}}}\n"
                    "(SGLang gputrc2graph's layout; default: built-in rules for kiln and\n"
                    "the common libraries)"),
        CLI_OPT_STR("--engine", &engine, "NAME", "the rules' engine (default kiln)"),
        CLI_OPT_STR("--model", &model, "NAME", "the rules' model (default default)"),
        CLI_OPT_STR("--title", &title, "TEXT", "the page's title (default \"GPU kernel time\")"),
        CLI_OPT_STR("--out", &out, "PREFIX", "writes PREFIX.html and PREFIX.csv (default result)"),
    };
    const struct cli_group groups[] = {{NULL, opts, sizeof opts / sizeof opts[0]}};
    const struct cli_command cmd = {
        .name = "profile-report", .usage = "[options] TRACE[,LABEL[,ELAPSED_S]] ...",
        .about = "TRACE: Nsight Systems' cuda_gpu_trace as CSV (nsys stats --report cuda_gpu_trace\n"
                 "--format csv), scripts/gpu/cupti_trace.c's records, or a Chrome trace JSON (PyTorch\n"
                 "profiler). ELAPSED_S: the run's wall time; the GPU's idle time is reported beside it.",
        .groups = groups, .n_groups = 1, .max_positional = -1};
    const char **inputs = xcalloc((size_t)argc + 1, sizeof *inputs);
    int n_in, rc = cli_parse(&cmd, argc, argv, inputs, &n_in);
    if (rc) {
        free(inputs);
        return rc == 1 ? 0 : rc;
    }
    rc = 1;
    if (!n_in) {
        fprintf(stderr, "kiln profile-report: no trace given (see --help)\n");
        free(inputs);
        return 2;
    }
    struct kiln_error err = {0};
    struct kr_rules rules;
    struct kr_trace *traces = xcalloc((size_t)n_in, sizeof *traces);
    struct kr_report *reps = xcalloc((size_t)n_in, sizeof *reps);
    int n_loaded = 0;
    if (rules_path ? kr_rules_load(&rules, rules_path, engine, model, &err) : kr_rules_default(&rules, &err)) {
        fprintf(stderr, "kiln profile-report: %s\n", err.msg);
        free(traces), free(reps), free(inputs);
        return 1;
    }
    for (int i = 0; i < n_in; i++) {
        /* PATH[,LABEL[,ELAPSED_S]] */
        char *spec = xstrdup(inputs[i]), *label = NULL, *elapsed = NULL;
        char *c1 = strchr(spec, ',');
        if (c1) {
            *c1 = 0, label = c1 + 1;
            char *c2 = strchr(label, ',');
            if (c2) *c2 = 0, elapsed = c2 + 1;
        }
        double el = 0;
        if (elapsed) {
            char *e;
            errno = 0;
            el = strtod(elapsed, &e);
            if (!*elapsed || *e || errno || !(el > 0)) {
                fprintf(stderr, "kiln profile-report: '%s': ELAPSED_S must be a positive number of seconds\n",
                        inputs[i]);
                free(spec);
                goto out;
            }
        }
        int bad = kr_trace_load(&traces[i], spec, label, el, &err);
        free(spec);
        if (bad) {
            fprintf(stderr, "kiln profile-report: %s\n", err.msg);
            goto out;
        }
        n_loaded++;
        kr_analyze(&traces[i], &rules, &reps[i]);
    }
    char *html = xmalloc(strlen(out) + 8), *csv = xmalloc(strlen(out) + 8);
    sprintf(html, "%s.html", out);
    sprintf(csv, "%s.csv", out);
    FILE *fh = fopen(html, "w"), *fc = fh ? fopen(csv, "w") : NULL;
    if (!fh || !fc) {
        fprintf(stderr, "kiln profile-report: cannot write %s: %s\n", fh ? csv : html, strerror(errno));
        if (fh) fclose(fh);
        free(html), free(csv);
        goto out;
    }
    kr_write_html(fh, title, reps, n_in);
    kr_write_csv(fc, reps, n_in);
    int werr = ferror(fh) | ferror(fc);
    werr |= fclose(fh) | fclose(fc);
    if (werr) {
        fprintf(stderr, "kiln profile-report: writing %s / %s failed\n", html, csv);
        free(html), free(csv);
        goto out;
    }
    for (int i = 0; i < n_in; i++) {
        const struct kr_report *r = &reps[i];
        printf("%s: GPU busy %.3f ms (%ld activities, span %.3f ms)\n", r->trace->label, r->busy_ns / 1e6,
               r->trace->n, r->span_ns / 1e6);
        for (int c = 0; c < r->n_categories; c++)
            printf("  %-20s %12.3f ms  %5.1f%%\n", r->categories[c].category, r->categories[c].gpu_ns / 1e6,
                   r->busy_ns > 0 ? 100.0 * r->categories[c].gpu_ns / r->busy_ns : 0.0);
        if (r->trace->elapsed_ns > r->busy_ns)
            printf("  %-20s %12.3f ms  (of the run's %.3f ms)\n", "idle", (r->trace->elapsed_ns - r->busy_ns) / 1e6,
                   r->trace->elapsed_ns / 1e6);
    }
    printf("wrote %s and %s\n", html, csv);
    free(html), free(csv);
    rc = 0;
out:
    for (int i = 0; i < n_loaded; i++) kr_report_free(&reps[i]), kr_trace_free(&traces[i]);
    kr_rules_free(&rules);
    free(traces), free(reps), free(inputs);
    return rc;
}
