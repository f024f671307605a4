/* launch.c — starting a job's processes, watching them, tagging their
 * output and reporting their crashes (launch.h). */
#include "dist/launch.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/knob.h"
#include "base/log.h"
#include "base/mem.h"
#include "dist/net.h"

extern char **environ;

/* ---- small async-signal-safe text ------------------------------------- */

/* Appends s to buf[*n] (cap bytes); no allocation, no locale. */
static void put_s(char *buf, size_t cap, size_t *n, const char *s) {
    while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
    buf[*n] = 0;
}
static void put_d(char *buf, size_t cap, size_t *n, long v) {
    char t[24];
    int k = 0;
    unsigned long u = v < 0 ? 0UL - (unsigned long)v : (unsigned long)v;
    do t[k++] = (char)('0' + u % 10); while ((u /= 10) && k < 22);
    if (v < 0) t[k++] = '-';
    while (k > 0 && *n + 1 < cap) buf[(*n)++] = t[--k];
    buf[*n] = 0;
}
static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;
        p += k, n -= (size_t)k;
    }
}

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    case SIGQUIT: return "SIGQUIT";
    default: return "signal";
    }
}

/* Starts a thread that takes no asynchronous signal (SIGTERM, SIGINT, ...
 * stay the command's threads' to handle). */
static int thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    static const int sync_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sync_sigs / sizeof sync_sigs[0]; i++) sigdelset(&all, sync_sigs[i]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* ---- output tagging and the crash handler ------------------------------
 *
 * Process-wide by nature (file descriptors 1 and 2, signal dispositions),
 * so their state is too: one tagger and one crash report per process. */

static struct {
    int on;
    int rank;
    int err_fd, out_fd;  /* the original stderr and stdout */
    int pipe_rd;
    pthread_t thread;
} g_tag = {.err_fd = 2};

static struct {
    int rank;
    int fd;              /* where the report goes: the original stderr */
    char *altstack;
} g_crash = {.fd = 2};

static void tag_prefix(char *buf, size_t cap, size_t *n, int rank) {
    put_s(buf, cap, n, "[rank ");
    put_d(buf, cap, n, rank);
    put_s(buf, cap, n, "] ");
}

/* Copies the pipe to the original stderr, a tag before every line. */
static void *tag_main(void *arg) {
    (void)arg;
    char in[8192], line[8192 + 32];
    size_t ln = 0;
    int at_start = 1;
    for (;;) {
        ssize_t k = read(g_tag.pipe_rd, in, sizeof in);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        for (ssize_t i = 0; i < k; i++) {
            if (at_start) {
                tag_prefix(line, sizeof line, &ln, g_tag.rank);
                at_start = 0;
            }
            line[ln++] = in[i];
            if (in[i] == '\n' || ln >= sizeof line - 1) {
                write_all(g_tag.err_fd, line, ln);
                ln = 0;
                at_start = in[i] == '\n';
            }
        }
    }
    if (ln) {
        line[ln++] = '\n';
        write_all(g_tag.err_fd, line, ln);
    }
    return NULL;
}

static void tag_end(void);

int dist_tag_output(int rank) {
    if (g_tag.on) return 0;
    int p[2];
    int err_fd = fcntl(2, F_DUPFD_CLOEXEC, 3), out_fd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (err_fd < 0 || out_fd < 0 || pipe2(p, O_CLOEXEC)) {
        if (err_fd >= 0) close(err_fd);
        if (out_fd >= 0) close(out_fd);
        return -1;
    }
    g_tag.rank = rank, g_tag.err_fd = err_fd, g_tag.out_fd = out_fd, g_tag.pipe_rd = p[0];
    if (thread_start(&g_tag.thread, tag_main, NULL)) {
        close(p[0]), close(p[1]), close(err_fd), close(out_fd);
        g_tag.err_fd = 2;
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[1]);
    /* line by line through the pipe, as a terminal would see it */
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_tag.on = 1;
    g_crash.fd = err_fd;
    atexit(tag_end);
    return 0;
}

/* At exit: puts the original stdout and stderr back and lets the copier
 * drain the pipe, so no line is lost. */
static void tag_end(void) {
    if (!g_tag.on) return;
    fflush(stdout);
    fflush(stderr);
    g_crash.fd = 2;
    dup2(g_tag.out_fd, 1); /* the last writers of the pipe go: the copier sees its end */
    dup2(g_tag.err_fd, 2);
    pthread_join(g_tag.thread, NULL);
    close(g_tag.pipe_rd);
    close(g_tag.out_fd);
    close(g_tag.err_fd);
    g_tag.on = 0;
    g_tag.err_fd = 2;
}

static void on_crash(int sig) {
    char msg[256];
    size_t n = 0;
    tag_prefix(msg, sizeof msg, &n, g_crash.rank);
    put_s(msg, sizeof msg, &n, "kiln: rank ");
    put_d(msg, sizeof msg, &n, g_crash.rank);
    put_s(msg, sizeof msg, &n, " (pid ");
    put_d(msg, sizeof msg, &n, (long)getpid());
    put_s(msg, sizeof msg, &n, ") caught ");
    put_s(msg, sizeof msg, &n, sig_name(sig));
    put_s(msg, sizeof msg, &n, "; stack trace:\n");
    write_all(g_crash.fd, msg, n);
    void *frames[64];
    int nf = backtrace(frames, 64);
    for (int i = 0; i < nf; i++) { /* one tagged line a frame */
        n = 0;
        tag_prefix(msg, sizeof msg, &n, g_crash.rank);
        put_s(msg, sizeof msg, &n, "  #");
        put_d(msg, sizeof msg, &n, i);
        put_s(msg, sizeof msg, &n, " ");
        write_all(g_crash.fd, msg, n);
        backtrace_symbols_fd(frames + i, 1, g_crash.fd);
    }
    /* die of the same signal, so the watcher says how */
    struct sigaction sa = {.sa_handler = SIG_DFL};
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    raise(sig);
}

static void crash_install(int rank) {
    g_crash.rank = rank;
    void *warm[2];
    backtrace(warm, 2); /* loads the unwinder now: not in the handler */
    if (!g_crash.altstack) { /* a stack overflow still gets its report */
        size_t sz = 1 << 16;
        g_crash.altstack = malloc(sz);
        stack_t ss = {.ss_sp = g_crash.altstack, .ss_size = sz};
        if (g_crash.altstack) sigaltstack(&ss, NULL);
    }
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa = {.sa_handler = on_crash, .sa_flags = SA_ONSTACK};
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

int dist_launched_rank(void) { return (int)knob_int(KNOB_DIST_RANK); }

/* ---- the watcher ------------------------------------------------------- */

struct dist_job_watch {
    pthread_t thread;
    int started;
    atomic_int ending;            /* the job ends: closes and exits are expected */
    pthread_mutex_t mu;
    struct pollfd *pfd;           /* remote peers' connections to watch */
    int *pfd_rank;
    int n_pfd;
    int *status;                  /* [local_size]: wait status of a reaped child; -1: running */
    struct dist_job *j;
};

/* "exited with status 3" / "was killed by SIGKILL (signal 9)" */
static void how_ended(int st, char *buf, size_t n) {
    if (WIFEXITED(st)) snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(buf, n, "was killed by %s (signal %d)", sig_name(WTERMSIG(st)), WTERMSIG(st));
    else snprintf(buf, n, "ended (wait status %d)", st);
}

/* The node's other ranks: SIGKILL, then reaped. */
static void kill_children(struct dist_job *j) {
    struct dist_job_watch *w = j->watch;
    if (!j->pid) return;
    for (int l = 1; l < j->local_size; l++)
        if (j->pid[l] > 0 && w->status[l] < 0) kill(j->pid[l], SIGKILL);
    for (int l = 1; l < j->local_size; l++) {
        if (j->pid[l] <= 0 || w->status[l] >= 0) continue;
        int st;
        while (waitpid(j->pid[l], &st, 0) < 0 && errno == EINTR) {}
        w->status[l] = st;
    }
}

/* Ends this node's processes with a message (on the original stderr, so
 * nothing is lost in the tag pipe). */
static void fatal(struct dist_job *j, const char *what) {
    char msg[512];
    size_t n = 0;
    if (j->rank != 0) tag_prefix(msg, sizeof msg, &n, j->rank);
    put_s(msg, sizeof msg, &n, "kiln: ");
    put_s(msg, sizeof msg, &n, what);
    put_s(msg, sizeof msg, &n, j->rank == 0 ? "; ending the job\n" : "; ending this node's ranks\n");
    write_all(g_tag.on ? g_tag.err_fd : 2, msg, n);
    kill_children(j);
    _exit(1);
}

static void *watch_main(void *arg) {
    struct dist_job_watch *w = arg;
    struct dist_job *j = w->j;
    while (!atomic_load(&w->ending)) {
        pthread_mutex_lock(&w->mu);
        int n = w->n_pfd;
        pthread_mutex_unlock(&w->mu);
        if (n > 0) {
            int r = poll(w->pfd, (nfds_t)n, 100);
            for (int i = 0; r > 0 && i < n; i++) {
                if (!(w->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) || atomic_load(&w->ending)) continue;
                char what[DIST_ADDR_MAX + 96];
                int p = w->pfd_rank[i];
                snprintf(what, sizeof what, "rank %d (%s) closed its connection", p, j->group.addr[p]);
                fatal(j, what);
            }
        } else {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        for (int l = 1; j->pid && l < j->local_size; l++) {
            if (j->pid[l] <= 0 || w->status[l] >= 0) continue;
            int st;
            pid_t got = waitpid(j->pid[l], &st, WNOHANG);
            if (got != j->pid[l]) continue;
            w->status[l] = st;
            if (atomic_load(&w->ending)) continue;
            char how[96], what[160];
            how_ended(st, how, sizeof how);
            snprintf(what, sizeof what, "rank %d (pid %ld) %s", j->node_rank * j->local_size + l, (long)j->pid[l], how);
            fatal(j, what);
        }
    }
    return NULL;
}

/* ---- start and end ------------------------------------------------------ */

/* The child's environment: ours without KILN_DIST_RANK / KILN_DIST_INIT_ADDR,
 * plus this child's. */
static char **child_env(int rank, const char *addr) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = xcalloc(n + 3, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "KILN_DIST_RANK=", 15) && strncmp(environ[i], "KILN_DIST_INIT_ADDR=", 20))
            env[k++] = environ[i];
    char r[48], *a = xmalloc(strlen(addr) + 32);
    snprintf(r, sizeof r, "KILN_DIST_RANK=%d", rank);
    sprintf(a, "KILN_DIST_INIT_ADDR=%s", addr);
    env[k++] = xstrdup(r);
    env[k++] = a;
    env[k] = NULL;
    return env;
}

static void child_env_free(char **env) {
    size_t n = 0;
    while (env[n]) n++;
    free(env[n - 1]);
    free(env[n - 2]);
    free(env);
}

/* fork + exec of local rank l; between them only async-signal-safe calls. */
static int spawn(struct dist_job *j, int l, char *const *argv, struct kiln_error *err) {
    int rank = j->node_rank * j->local_size + l;
    char **env = child_env(rank, j->init_addr);
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1); /* the parent died before the request */
        struct sigaction ign = {.sa_handler = SIG_IGN};
        sigemptyset(&ign.sa_mask);
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGTERM, &ign, NULL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve("/proc/self/exe", argv, env);
        char msg[128];
        size_t n = 0;
        put_s(msg, sizeof msg, &n, "kiln: rank ");
        put_d(msg, sizeof msg, &n, rank);
        put_s(msg, sizeof msg, &n, ": cannot exec /proc/self/exe\n");
        write_all(2, msg, n);
        _exit(127);
    }
    int e = errno;
    child_env_free(env);
    if (pid < 0) return kiln_errorc(err, KILN_ERR_IO, "cannot start rank %d: fork: %s", rank, strerror(e));
    j->pid[l] = pid;
    return 0;
}

static int check_layout(const struct dist_launch *l, struct kiln_error *err) {
    if (l->world_size < 1 || l->world_size > DIST_WORLD_MAX)
        return kiln_errorf(err, "the world size %d is not 1..%d", l->world_size, DIST_WORLD_MAX);
    if (l->nnodes < 1 || l->nnodes > l->world_size)
        return kiln_errorf(err, "--nnodes %d: expected 1 to the ranks' count (%d)", l->nnodes, l->world_size);
    if (l->world_size % l->nnodes)
        return kiln_errorf(err, "--tp %d is not divisible by --nnodes %d", l->world_size, l->nnodes);
    if (l->node_rank < 0 || l->node_rank >= l->nnodes)
        return kiln_errorf(err, "--node-rank %d: expected 0 to %d (--nnodes %d)", l->node_rank, l->nnodes - 1,
                           l->nnodes);
    if (l->nnodes > 1 && !l->init_addr)
        return kiln_errorf(err, "--nnodes %d needs --dist-init-addr HOST:PORT (node 0's address)", l->nnodes);
    return 0;
}

int dist_job_start(struct dist_job *j, const struct dist_launch *l, struct kiln_error *err) {
    memset(j, 0, sizeof *j);
    if (check_layout(l, err)) return -1;
    double timeout = l->timeout_s > 0 ? l->timeout_s : 300;
    j->size = l->world_size, j->nnodes = l->nnodes, j->node_rank = l->node_rank;
    j->local_size = l->world_size / l->nnodes;
    int lfd = -1, launched = dist_launched_rank();
    if (launched > 0) { /* a rank a node's first process started */
        const char *a = knob_str(KNOB_DIST_INIT_ADDR);
        j->rank = launched;
        if (j->rank >= j->size || j->rank / j->local_size != j->node_rank || j->rank % j->local_size == 0)
            return kiln_errorf(err, "KILN_DIST_RANK=%d does not fit the layout (%d ranks, node %d of %d)", j->rank,
                               j->size, j->node_rank, j->nnodes);
        snprintf(j->init_addr, sizeof j->init_addr, "%s", *a ? a : l->init_addr ? l->init_addr : "");
        prctl(PR_SET_NAME, "kiln"); /* exec of /proc/self/exe named it "exe" */
        if (!j->init_addr[0]) return kiln_errorf(err, "rank %d: no rendezvous address (KILN_DIST_INIT_ADDR)", j->rank);
    } else {
        j->rank = j->node_rank * j->local_size;
        if (l->init_addr) snprintf(j->init_addr, sizeof j->init_addr, "%s", l->init_addr);
        if (j->size > 1 && j->rank == 0) {
            int port;
            lfd = dist_listen(l->init_addr ? l->init_addr : "127.0.0.1:0", &port, err);
            if (lfd < 0) return kiln_error_prefix(err, "rank 0: the rendezvous address");
            if (!l->init_addr) snprintf(j->init_addr, sizeof j->init_addr, "127.0.0.1:%d", port);
        }
    }
    j->local_rank = j->rank % j->local_size;
    if (j->size == 1) return 0;

    struct dist_job_watch *w = j->watch = xcalloc(1, sizeof *w);
    w->j = j;
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->ending, 0);
    if (j->local_rank == 0) {
        j->pid = xcalloc((size_t)j->local_size, sizeof *j->pid);
        w->status = xmalloc((size_t)j->local_size * sizeof *w->status);
        for (int i = 0; i < j->local_size; i++) w->status[i] = -1;
        j->pid[0] = getpid();
        for (int i = 1; i < j->local_size; i++)
            if (spawn(j, i, l->argv, err)) goto fail;
        /* remote peers to watch: node 0 watches every other node's ranks,
         * the others rank 0 */
        int n_remote = j->node_rank == 0 ? j->size - j->local_size : 1;
        w->pfd = xcalloc((size_t)n_remote, sizeof *w->pfd);
        w->pfd_rank = xcalloc((size_t)n_remote, sizeof *w->pfd_rank);
        if (thread_start(&w->thread, watch_main, w)) {
            kiln_errorc(err, KILN_ERR_IO, "cannot start the thread that watches the ranks");
            goto fail;
        }
        w->started = 1;
    }
    if (j->rank != 0) dist_tag_output(j->rank);
    crash_install(j->rank);

    struct dist_rdv_config cfg = {.init_addr = j->init_addr, .rank = j->rank, .world_size = j->size,
                                  .timeout_s = timeout, .listen_fd = lfd};
    lfd = -1; /* the rendezvous closes it */
    if (dist_rendezvous(&cfg, &j->group, err)) goto fail;
    if (dist_comm_tcp_init(&j->comm, &j->group, timeout, err)) goto fail;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        int n = 0;
        for (int p = 0; p < j->size; p++) {
            if (p / j->local_size == j->node_rank || (j->node_rank != 0 && p != 0)) continue;
            w->pfd[n] = (struct pollfd){.fd = j->group.fd[p], .events = POLLRDHUP};
            w->pfd_rank[n++] = p;
        }
        w->n_pfd = n;
        pthread_mutex_unlock(&w->mu);
    }
    return 0;
fail:
    if (lfd >= 0) close(lfd);
    dist_job_end(j, 1);
    return -1;
}

/* Waits for the node's other ranks until the deadline, then kills the rest.
 * Returns how many did not exit 0, each reported. */
static int reap_children(struct dist_job *j, double deadline) {
    struct dist_job_watch *w = j->watch;
    int bad = 0;
    for (int l = 1; l < j->local_size; l++) {
        if (j->pid[l] <= 0) continue;
        while (w->status[l] < 0) {
            int st;
            pid_t got = waitpid(j->pid[l], &st, WNOHANG);
            if (got == j->pid[l]) {
                w->status[l] = st;
                break;
            }
            if (got < 0 && errno != EINTR) break;
            if (time_now() > deadline) {
                log_error("rank %d (pid %ld) did not exit after the job ended: killed",
                          j->node_rank * j->local_size + l, (long)j->pid[l]);
                kill(j->pid[l], SIGKILL);
                deadline = time_now() + 5;
            }
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        int st = w->status[l];
        if (st >= 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            char how[96];
            how_ended(st, how, sizeof how);
            log_error("rank %d (pid %ld) %s", j->node_rank * j->local_size + l, (long)j->pid[l], how);
            bad++;
        }
    }
    return bad;
}

int dist_job_end(struct dist_job *j, int rc) {
    struct dist_job_watch *w = j->watch;
    if (w) {
        if (rc == 0 && j->comm.ops) {
            atomic_store(&w->ending, 1);
            struct kiln_error err;
            if (dist_comm_barrier(&j->comm, &err)) {
                log_error("the job's end: %s", err.msg);
                rc = 1;
            }
        }
        atomic_store(&w->ending, 1);
        if (w->started) pthread_join(w->thread, NULL);
        if (j->pid) {
            if (rc != 0) kill_children(j);
            else if (reap_children(j, time_now() + 30)) rc = 1;
        }
        pthread_mutex_destroy(&w->mu);
        free(w->pfd);
        free(w->pfd_rank);
        free(w->status);
        free(w);
        j->watch = NULL;
    }
    dist_comm_free(&j->comm);
    dist_group_free(&j->group);
    free(j->pid);
    j->pid = NULL;
    return rc;
}
