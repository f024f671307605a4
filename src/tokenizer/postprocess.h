/* postprocess.h — the `post_processor` of tokenizer.json, for one sequence.
 *
 * Supported types: TemplateProcessing (its "single" template),
 * BertProcessing and RobertaProcessing (cls + text + sep), ByteLevel (which
 * only adjusts offsets, so nothing here) and Sequence. Others fail to load,
 * naming the type. Pair templates are parsed for validity but unused: the
 * API encodes single texts.
 */
#ifndef KILN_TOKENIZER_POSTPROCESS_H
#define KILN_TOKENIZER_POSTPROCESS_H

#include <jansson.h>
#include <stdint.h>

#include "kiln/tokenizer.h"

struct kiln_error;

enum postprocess_type {
    POSTPROCESS_TYPE_SEQUENCE,
    POSTPROCESS_TYPE_TEMPLATE, /* Bert and Roberta become templates */
    POSTPROCESS_TYPE_NONE,     /* ByteLevel */
};

/* One element of a template: the text (ids == NULL) or fixed ids. */
struct postprocess_piece {
    int32_t *ids;
    size_t n_ids;
};

struct postprocess {
    enum postprocess_type type;
    struct postprocess *children;
    size_t n_children;
    struct postprocess_piece *single;
    size_t n_single;
};

int postprocess_parse(struct postprocess **out, json_t *json, const char *path, struct kiln_error *err);
void postprocess_free(struct postprocess *p);
/* Adds the special tokens around ids (in place). */
void postprocess_apply(const struct postprocess *p, struct kiln_token_ids *ids);

#endif
