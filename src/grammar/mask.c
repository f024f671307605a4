/* mask.c — token masks and the per-vocabulary cache behind them. */
#include <stdlib.h>

#include "grammar/grammar_internal.h"

struct gr_cache {
    struct gr_cache *next;
};

void gr_cache_free(struct gr_cache *c) { free(c); }

int grammar_prepare(struct grammar *g, const struct grammar_vocab *v, struct kiln_error *err) { return 0; }

void grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *bits) { gr_fill_mask_nocache(m, bits); }
