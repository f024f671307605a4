/* log.h — leveled logging to stderr.
 *
 * The level comes from the knob KILN_LOG (error, warn, info, debug;
 * default info; base/knob.h) the first time a message is logged. Lines carry a wall-clock timestamp. Prompts and other user
 * data are never logged here unless the caller was asked to (--log-requests).
 */
#ifndef KILN_BASE_LOG_H
#define KILN_BASE_LOG_H

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };

int log_enabled(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
