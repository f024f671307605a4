/* cli_job.h — the ranks of a model-running command (--tp, --nnodes,
 * --node-rank, --dist-init-addr): started with dist/launch.h; rank 0 runs
 * the command with the job's communicator as runner_options.ctrl and
 * model_options.par.comm, every other rank follows it (runner_follow) and
 * prints nothing of the command's own.
 *
 *   struct cli_job job;
 *   if ((rc = cli_job_start(&job, &ma, "verify", argc, argv)) >= 0) return rc; // not rank 0
 *   ... bo.device = job.device_index; mo.par = job.par; ro.ctrl = job.ctrl; ...
 *   return cli_job_end(&job, rc);
 */
#ifndef KILN_CLI_JOB_H
#define KILN_CLI_JOB_H

#include "cli/cli_common.h"
#include "dist/launch.h"
#include "model/model.h"

struct cli_job {
    struct dist_job job;
    int started;              /* several ranks */
    struct model_parallel par; /* model_options.par (zeroed: one rank) */
    struct dist_comm stage_comm; /* pipeline parallel with tp > 1: the stage's tensor parallel group */
    struct dist_comm *ctrl;   /* runner_options.ctrl (NULL: one rank) */
    int device_index;         /* backend_options.device: the local rank */
};

/* After model_args_finish. With one rank, returns -1 at once. Otherwise
 * starts the job (rank 0 and each node's first process start their node's
 * other ranks; --threads defaults to the cores shared among the node's
 * ranks) and logs the layout; then rank 0 returns -1 to run the command,
 * and any other rank follows rank 0 to the job's end and returns the status
 * to exit with, as does a job that cannot start (after printing why).
 * argv[0] is the subcommand's name ("serve"): the other ranks run
 * `kiln argv...`; pre, when not NULL, goes before it ("bench"). */
int cli_job_start(struct cli_job *j, struct model_args *a, const char *cmd, const char *pre, int argc,
                  char **argv);

/* Rank 0 at the command's end (after the runners are freed): tells the
 * other ranks, waits for them and returns the status to exit with. */
int cli_job_end(struct cli_job *j, int rc);

/* The backend options of every rank (threads, device index, determinism,
 * KV type). */
void cli_job_backend_options(const struct cli_job *j, const struct model_args *a, struct backend_options *bo);

#endif
