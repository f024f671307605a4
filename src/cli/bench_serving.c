/* bench_serving.c — the HTTP runner: one thread, one poll() loop over every
 * open request.
 *
 * Requests start in dataset order once their arrival time has come and a
 * concurrency slot is free (bench_serving's semaphore: a request's clock
 * starts when it gets its slot, not when it arrived). Each has its own
 * deadline (--timeout); a request that passes it is closed and counted as
 * failed, so the loop always ends. Chunk times are taken right after
 * poll() returns, before any parsing, so a slow parse of one response does
 * not shift another's timestamps by more than one loop turn.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/mem.h"
#include "cli/bench.h"
#include "cli/bench_api.h"
#include "cli/bench_http.h"

struct slot {
    struct http_conn conn;
    struct bench_api_stream st;
    double deadline;
    int active;
};

static void slot_on_body(void *user, const char *data, size_t n, double now) {
    struct slot *s = user;
    bench_api_on_body(&s->st, s->conn.status, data, n, now);
}

/* bench_serving raises the soft open-file limit too: with --request-rate
 * inf and no concurrency cap every request holds a socket at once. */
static void raise_fd_limit(int need) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    rlim_t want = (rlim_t)need + 64;
    if (rl.rlim_cur >= want) return;
    rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
}

struct serving_loop {
    struct bench_run *run;
    struct http_url url;
    struct slot *slots;
    struct bench_progress progress;
    int active, done;
};

static void slot_end(struct serving_loop *L, int i, int step, double now) {
    struct slot *s = &L->slots[i];
    struct bench_result *r = &L->run->results[i];
    if (step > 0) {
        bench_api_finish(&s->st, s->conn.status, now);
    } else if (step < 0) {
        bench_result_fail(r, "%s", s->conn.error);
    }
    http_conn_close(&s->conn);
    bench_api_stream_free(&s->st);
    s->active = 0;
    L->active--;
    L->done++;
    bench_progress_update(&L->progress, L->done, 0);
}

static void slot_start(struct serving_loop *L, int i, double now) {
    struct bench_run *run = L->run;
    const struct bench_options *o = run->opt;
    struct slot *s = &L->slots[i];
    struct bench_result *r = &run->results[i];
    struct kiln_error err = {0};
    r->start = now;
    r->prompt_len = run->prompts[i].prompt_len;
    r->usage_output_len = r->usage_prompt_len = -1;
    s->deadline = now + o->timeout_s;
    s->active = 1;
    L->active++;
    size_t body_len, req_len;
    char *body = bench_api_payload(o, run->model_name, &run->prompts[i], run->output_lens[i], &body_len, &err);
    if (!body) {
        bench_result_fail(r, "%s", err.msg);
        s->conn.fd = -1;
        slot_end(L, i, 0, now);
        return;
    }
    char *req = http_build_request(&L->url, "POST", bench_api_path(o->api), body, body_len, &req_len);
    free(body);
    bench_api_stream_init(&s->st, o->api, !o->disable_stream, run->prompts[i].n_items, r);
    if (http_conn_start(&s->conn, &L->url, req, req_len, slot_on_body, s, &err)) {
        bench_result_fail(r, "%s", err.msg);
        s->conn.fd = -1;
        slot_end(L, i, 0, now);
        return;
    }
    if (s->conn.phase == HTTP_FAILED) slot_end(L, i, -1, now);
}

int bench_serving_run(struct bench_run *run, struct kiln_error *err) {
    struct serving_loop L = {0};
    L.run = run;
    if (http_url_parse(&L.url, run->opt->base_url, err)) return -1;
    int n = run->n, next = 0;
    int cap = run->max_concurrency > 0 && run->max_concurrency < n ? run->max_concurrency : n;
    raise_fd_limit(cap);
    L.slots = xcalloc((size_t)n, sizeof *L.slots);
    struct pollfd *pfd = xcalloc((size_t)cap + 1, sizeof *pfd);
    int *who = xcalloc((size_t)cap + 1, sizeof *who);
    bench_progress_init(&L.progress, n, run->show_progress);
    bench_progress_update(&L.progress, 0, 1);
    double t0 = time_now(), now = t0;
    while (L.done < n) {
        now = time_now();
        while (next < n && t0 + run->arrivals[next] <= now && L.active < cap) slot_start(&L, next++, now);
        int np = 0;
        double wake = INFINITY;
        if (next < n && L.active < cap) wake = t0 + run->arrivals[next];
        for (int i = 0; i < next; i++) {
            struct slot *s = &L.slots[i];
            if (!s->active) continue;
            pfd[np].fd = s->conn.fd;
            pfd[np].events = http_conn_events(&s->conn);
            pfd[np].revents = 0;
            who[np++] = i;
            if (s->deadline < wake) wake = s->deadline;
        }
        if (L.done >= n) break;
        if (L.progress.enabled && now + 0.1 < wake) wake = now + 0.1;
        int timeout_ms = wake == INFINITY ? 1000 : (int)ceil((wake - now) * 1000.0);
        if (timeout_ms < 0) timeout_ms = 0;
        int pr = poll(pfd, (nfds_t)np, timeout_ms);
        now = time_now();
        if (pr < 0 && errno != EINTR) {
            kiln_errorf(err, "poll: %s", strerror(errno));
            break;
        }
        for (int k = 0; pr > 0 && k < np; k++) {
            if (!pfd[k].revents) continue;
            struct slot *s = &L.slots[who[k]];
            int st = http_conn_step(&s->conn, pfd[k].revents, now);
            /* A response already known to be bad (an error chunk, a broken
             * chunk) is not read to its end. */
            if (st != 0 || s->st.failed) slot_end(&L, who[k], st, now);
        }
        for (int k = 0; k < np; k++) {
            struct slot *s = &L.slots[who[k]];
            if (s->active && now >= s->deadline) {
                bench_result_fail(&run->results[who[k]], "timed out after %g s (--timeout)", run->opt->timeout_s);
                slot_end(&L, who[k], 0, now);
            }
        }
        bench_progress_update(&L.progress, L.done, 0);
    }
    run->duration = now - t0;
    /* Only a broken poll() leaves requests open; they are failed, not lost. */
    for (int i = 0; i < n; i++) {
        if (L.slots[i].active) {
            bench_result_fail(&run->results[i], "benchmark loop stopped: %s", err->msg);
            slot_end(&L, i, 0, now);
        } else if (i >= next) {
            bench_result_fail(&run->results[i], "never sent: %s", err->msg);
        }
    }
    bench_progress_end(&L.progress);
    free(pfd);
    free(who);
    free(L.slots);
    return 0;
}

/* GET one small JSON document (model list); blocking, with a deadline. */
static void collect(void *user, const char *data, size_t n, double now) {
    buf_append(user, data, n);
}

char *bench_serving_model_name(const struct bench_options *opt, struct kiln_error *err) {
    struct http_url url;
    if (http_url_parse(&url, opt->base_url, err)) return NULL;
    size_t len;
    char *req = http_build_request(&url, "GET", "/v1/models", "", 0, &len);
    struct http_conn c;
    struct buf buf = {0};
    if (http_conn_start(&c, &url, req, len, collect, &buf, err)) return NULL;
    double deadline = time_now() + (opt->timeout_s < 10 ? opt->timeout_s : 10);
    int st = c.phase == HTTP_FAILED ? -1 : 0;
    while (st == 0) {
        double now = time_now();
        if (now >= deadline) {
            snprintf(c.error, sizeof c.error, "timed out");
            st = -1;
            break;
        }
        struct pollfd p = {.fd = c.fd, .events = http_conn_events(&c)};
        if (poll(&p, 1, (int)ceil((deadline - now) * 1000)) < 0 && errno != EINTR) break;
        st = http_conn_step(&c, p.revents, time_now());
    }
    char *name = NULL;
    if (st < 0) {
        kiln_errorf(err, "GET %s/v1/models: %s", opt->base_url, c.error);
    } else if (c.status != 200) {
        kiln_errorf(err, "GET %s/v1/models: HTTP %d", opt->base_url, c.status);
    } else {
        json_t *j = json_loadb(buf.data ? buf.data : "", buf.len, 0, NULL);
        const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (id) name = xstrdup(id);
        else kiln_errorf(err, "GET %s/v1/models: no model in the answer", opt->base_url);
        json_decref(j);
    }
    http_conn_close(&c);
    buf_free(&buf);
    return name;
}
