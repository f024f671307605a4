/* launch.h — the processes of a multi-rank kiln job: one per rank, started
 * by the process the user ran on each node, their lives tied together,
 * their output tagged with their rank, a stack trace when one crashes.
 *
 * Layout: world_size ranks on nnodes nodes, local_size = world_size /
 * nnodes on each; node n holds the global ranks n * local_size + l, l =
 * 0 .. local_size - 1 (its local ranks). Local rank 0 is the process the
 * user started on that node (node 0's is rank 0, which leads the job).
 * It starts the node's other ranks: fork, then exec of /proc/self/exe with
 * the same command line, the environment plus KILN_DIST_RANK (the child's
 * global rank) and KILN_DIST_INIT_ADDR (the rendezvous address: with one
 * node and no --dist-init-addr, 127.0.0.1 and a port rank 0 has bound). A
 * child asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG, kept
 * across exec), exits at once when the parent is already gone (the race
 * before the request), and ignores SIGINT and SIGTERM: the job is stopped
 * through its first rank, which tells the others.
 *
 * Every rank then runs the rendezvous (dist/rendezvous.h) and builds the
 * TCP communicator over it (dist/comm.h). A node's first process watches,
 * from a thread: a local rank that exits or dies, or (node 0) a rank of
 * another node whose connection closes, or (other nodes) rank 0's
 * connection closing, ends the node's processes: one message naming the
 * rank, its pid or address and how it ended (exit status, signal), SIGKILL
 * to the node's other ranks, and _exit(1). That is deliberate: a job with
 * a dead rank cannot go on, and the watcher owns the process's end.
 *
 * Every rank other than 0 sends its stdout and stderr through a pipe that a
 * thread copies to the original stderr line by line, each line opening
 * with "[rank N] " (until exit, when the pipe is drained). SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT print
 * "[rank N] kiln: rank N (pid P) caught SIGSEGV" and the stack trace
 * (glibc's backtrace) straight to the original stderr, then die of the same
 * signal (the watcher reports it).
 *
 *   struct dist_job j;
 *   struct dist_launch l = {.world_size = 2, .nnodes = 1, .argc = argc, .argv = argv};
 *   if (dist_job_start(&j, &l, &err)) ...;
 *   ... j.comm, j.rank ...
 *   rc = dist_job_end(&j, rc);
 */
#ifndef KILN_DIST_LAUNCH_H
#define KILN_DIST_LAUNCH_H

#include <sys/types.h>

#include "dist/comm.h"
#include "dist/rendezvous.h"

struct kiln_error;
struct dist_job_watch;

struct dist_launch {
    int world_size;          /* ranks in all (--tp) */
    int nnodes, node_rank;   /* --nnodes (1), --node-rank (0) */
    const char *init_addr;   /* --dist-init-addr HOST:PORT; NULL with one node: 127.0.0.1 and a free port */
    double timeout_s;        /* the rendezvous and every collective; <= 0: 300 s */
    int argc;                /* the command line the node's other ranks run: */
    char *const *argv;       /* argv[0] is their name, argv[1..] the arguments */
};

struct dist_job {
    int rank, size;                  /* global rank, world size */
    int local_rank, local_size, node_rank, nnodes;
    char init_addr[DIST_ADDR_MAX];   /* the rendezvous address in use */
    struct dist_group group;
    struct dist_comm comm;           /* the TCP communicator over group */
    pid_t *pid;                      /* [local_size]: the node's processes (first process: all; others: NULL) */
    struct dist_job_watch *watch;    /* private */
};

/* Checks the layout (world_size divisible by nnodes, node_rank below it,
 * an address for several nodes), starts the node's other ranks when this
 * is its first process, tags the output, installs the crash handler, runs
 * the rendezvous and builds the communicator. Returns 0, or -1 with err
 * (the ranks started so far are killed). World size 1 starts nothing and
 * opens no socket. */
int dist_job_start(struct dist_job *j, const struct dist_launch *l, struct kiln_error *err);

/* Ends the job with this process's result rc and returns the status to
 * exit with. rc 0: a barrier with every rank (after it, connections that
 * close are no failure), then the node's first process waits for its
 * children (up to 30 s, then SIGKILL) and turns any that did not exit 0
 * into a message and status 1. rc != 0: no barrier; the node's other ranks
 * are killed. Accepts a zeroed job. */
int dist_job_end(struct dist_job *j, int rc);

/* The global rank KILN_DIST_RANK gives this process (a rank another
 * process started), or 0 for a process the user started. */
int dist_launched_rank(void);

/* Tags this process's stdout and stderr "[rank N] " (see above); a second
 * call does nothing. Returns 0, or -1 when the pipe or thread cannot be
 * made (the output then stays as it was). */
int dist_tag_output(int rank);

#endif
