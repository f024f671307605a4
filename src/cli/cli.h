/* cli.h — the `kiln` command's subcommands.
 *
 * Each subcommand is one file cmd_<name>.c exporting
 * `int cmd_<name>(int argc, char **argv)` (argv[0] is the subcommand name)
 * that returns the process exit code: 0 success, 1 bad input or failed
 * check (with one clear line on stderr), 2 usage error.
 */
#ifndef KILN_CLI_CLI_H
#define KILN_CLI_CLI_H

int cmd_chat_template(int argc, char **argv);

int cmd_verify(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_profile_report(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_knobs(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_parse_output(int argc, char **argv);

#endif
