/* cli_job.c — starting the ranks of a command and following rank 0
 * (cli_job.h). */
#include "cli/cli_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/log.h"
#include "base/mem.h"
#include "runner/runner.h"

void cli_job_backend_options(const struct cli_job *j, const struct model_args *a, struct backend_options *bo) {
    *bo = (struct backend_options){.n_threads = a->threads, .device = j->device_index,
                                   .deterministic = a->deterministic, .kv_fp8 = a->kv_fp8};
}

/* Pipeline parallel: rank = stage · tp + tp rank; the stage's ranks make
 * its tensor parallel group, a communicator over their share of the job's
 * sockets; the job's communicator carries the stages' sends. */
static int pp_layout(struct cli_job *j, const struct model_args *a, struct kiln_error *err) {
    struct dist_job *d = &j->job;
    int tp = a->tp, stage = d->rank / tp;
    j->par = (struct model_parallel){.tp_size = tp, .tp_rank = d->rank % tp, .ep_size = a->ep,
                                     .pp_size = a->pp, .pp_rank = stage, .pp_comm = &d->comm};
    if (tp <= 1) return 0;
    int *ranks = xmalloc((size_t)tp * sizeof *ranks);
    for (int i = 0; i < tp; i++) ranks[i] = stage * tp + i;
    int rc = dist_comm_tcp_init_sub(&j->stage_comm, &d->group, ranks, tp, a->dist_timeout, err);
    free(ranks);
    j->par.comm = &j->stage_comm;
    return rc;
}

/* A rank other than 0: runners as rank 0 makes them, until its END. */
static int follow(struct cli_job *j, struct model_args *a, const char *cmd) {
    struct kiln_error err = {0};
    struct backend be = {0};
    struct backend_options bo;
    cli_job_backend_options(j, a, &bo);
    int rc = 1;
    if (backend_create(&be, a->device, &bo, &err)) goto out;
    struct model_options mo = {.par = j->par};
    struct runner_options ro = {.ctrl = j->ctrl};
    for (;;) {
        struct runner *r = NULL;
        int k = runner_follow_load(&r, &be, a->model_dir, &mo, &ro, &err);
        if (k == 1) {
            rc = 0;
            break;
        }
        if (k < 0) break;
        k = runner_follow(r, &err);
        runner_free(r);
        if (k) break;
    }
out:
    if (rc) fprintf(stderr, "kiln %s: rank %d: %s\n", cmd, j->job.rank, err.msg);
    backend_destroy(&be);
    dist_comm_free(&j->stage_comm);
    return dist_job_end(&j->job, rc);
}

int cli_job_start(struct cli_job *j, struct model_args *a, const char *cmd, const char *pre, int argc,
                  char **argv) {
    memset(j, 0, sizeof *j);
    if (a->tp <= 1 && a->pp <= 1 && a->nnodes <= 1) return -1;
    /* the other local ranks' command line: the same, after `kiln` */
    char **cargv = xcalloc((size_t)argc + 3, sizeof *cargv);
    int n = 0;
    cargv[n++] = "kiln";
    if (pre) cargv[n++] = (char *)pre;
    for (int i = 0; i < argc; i++) cargv[n++] = argv[i];
    struct dist_launch l = {.world_size = a->tp * a->pp, .nnodes = a->nnodes, .node_rank = a->node_rank,
                            .init_addr = a->dist_init_addr, .timeout_s = a->dist_timeout, .argc = n,
                            .argv = cargv};
    struct kiln_error err = {0};
    int rc = dist_job_start(&j->job, &l, &err);
    free(cargv);
    if (rc) {
        fprintf(stderr, "kiln %s: %s\n", cmd, err.msg);
        return 1;
    }
    struct dist_job *d = &j->job;
    j->started = 1;
    j->ctrl = &d->comm;
    j->par = (struct model_parallel){.tp_size = d->size, .tp_rank = d->rank, .ep_size = a->ep,
                                     .dp_size = a->dp > 1 ? a->dp : 0,
                                     .dp_rank = a->dp > 1 ? d->rank / (d->size / a->dp) : 0, .comm = &d->comm};
    if (a->pp > 1 && pp_layout(j, a, &err)) {
        fprintf(stderr, "kiln %s: rank %d: %s\n", cmd, d->rank, err.msg);
        return dist_job_end(d, 1);
    }
    j->device_index = d->local_rank;
    if (a->threads == 0 && d->local_size > 1) { /* the node's cores, shared */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        a->threads = cores > d->local_size ? (int)(cores / d->local_size) : 1;
    }
    char pids[512] = ""; /* a node's first process: the node's ranks */
    size_t o = 0;
    for (int i = 0; d->pid && i < d->local_size && o < sizeof pids - 32; i++)
        o += (size_t)snprintf(pids + o, sizeof pids - o, "%srank %d pid %ld", i ? ", " : "", d->rank + i,
                              (long)d->pid[i]);
    if (d->rank == 0) {
        char pp[32] = "";
        if (a->pp > 1) snprintf(pp, sizeof pp, "pp %d, ", a->pp);
        log_info("job: %d ranks (tp %d, %sep %d, dp %d) on %d node%s, %d each; rendezvous at %s; node 0: %s", d->size,
                 a->tp, pp, a->ep, a->dp, d->nnodes, d->nnodes > 1 ? "s" : "", d->local_size, d->init_addr, pids);
        return -1;
    }
    log_info("rank %d of %d: node %d, local rank %d, device index %d, pid %ld; following rank 0", d->rank, d->size,
             d->node_rank, d->local_rank, j->device_index, (long)getpid());
    if (d->pid) log_info("node %d: %s", d->node_rank, pids);
    return follow(j, a, cmd);
}

int cli_job_end(struct cli_job *j, int rc) {
    if (!j->started) return rc;
    struct kiln_error err = {0};
    if (rc == 0 && runner_job_end(j->ctrl, &err)) {
        fprintf(stderr, "kiln: %s\n", err.msg);
        rc = 1;
    }
    dist_comm_free(&j->stage_comm);
    return dist_job_end(&j->job, rc);
}
