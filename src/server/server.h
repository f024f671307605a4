/* server.h — the OpenAI-compatible HTTP front end of an engine.
 *
 * server_run serves an already created engine on one libevent loop until
 * SIGINT or SIGTERM, then shuts down gracefully: the listening socket closes
 * and new requests on open connections get 503; requests in flight may
 * finish for `shutdown_timeout_s` seconds, after which they are aborted and
 * their clients see finish_reason "abort". It returns once every response
 * is out. It takes the engine over and destroys it before returning: the
 * engine's last events must land while the server can still receive them.
 * Routes: see server.c.
 */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <stddef.h>

struct engine;
struct kiln_error;

struct server_options {
    const char *host;              /* default 127.0.0.1 */
    int port;                      /* default 30000; 0 = any free port */
    int listen_fd;                 /* > 0: a socket already listening (bound by the caller before the
                                      model loaded); server_run takes it over, host and port only name it */
    const char *api_key;           /* NULL: no authentication */
    const char *served_model_name; /* NULL: the model folder's name */
    const char *model_dir;         /* for the chat template */
    const char *chat_template;     /* a Jinja file overriding the model's template */
    const char *tool_call_parser;  /* NULL: none; "auto": from the chat template; else a format's name */
    const char *reasoning_parser;  /* NULL: none; else a format's name (chat/reasoning.h) */
    const char *allowed_origins;   /* CORS: comma-separated origins, "*" any (default), "" none */
    size_t max_body_bytes;         /* default 32 MiB */
    int max_connections;           /* default 4096 */
    int idle_timeout_s;            /* keep-alive idle; default 60 */
    int head_timeout_s;            /* a request's whole head; default 30 */
    int body_timeout_s;            /* a request's whole body; default 300 */
    int max_queued_requests;       /* the engine's (n x prompts above it: 400); 0 = unbounded */
    double shutdown_timeout_s;     /* default 5 */
    int log_requests;
    int tokenizer_workers;         /* threads tokenizing off the loop; 0 = on the loop (default 1) */
    size_t tokenizer_inline_bytes; /* bodies smaller than this tokenize inline (default 4096) */
    /* OpenTelemetry (trace.h): spans of every request to this OTLP/HTTP
     * endpoint; NULL: tracing off */
    const char *otlp_traces_endpoint;
    double otlp_export_interval_s; /* default 0.5 */
    /* called once listening, with the bound port (the CLI prints the URL) */
    void (*on_listening)(void *arg, const char *host, int port);
    void *on_listening_arg;
};

void server_options_default(struct server_options *o);
int server_run(struct engine *e, const struct server_options *o, struct kiln_error *err);

#endif
