/* rope.c — rotary position tables for the rope types of config.json:
 * default, linear, llama3 (frequency-dependent scaling) and yarn (DeepSeek).
 *
 * Angles are formed in fp32 exactly as the reference computes them
 * (inv_freq in fp32, position × inv_freq rounded to fp32) and only the
 * cos/sin are evaluated in double, so long positions round like the
 * reference does rather than drifting from it. */
#include <math.h>

#include "model/model_internal.h"

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double n_rot, int dim, double base, double max_pos) {
    return (dim * log(max_pos / (n_rot * 2.0 * M_PI))) / (2.0 * log(base));
}

/* The scale on cos/sin (yarn's "attention factor"). */
static double yarn_attention_factor(const struct rope_config *rc) {
    if (rc->attention_factor > 0) return rc->attention_factor;
    if (rc->mscale > 0 && rc->mscale_all_dim > 0)
        return yarn_get_mscale(rc->factor, rc->mscale) / yarn_get_mscale(rc->factor, rc->mscale_all_dim);
    return yarn_get_mscale(rc->factor, 1.0);
}

double rope_softmax_mscale(const struct rope_config *rc) {
    if (rc->type != ROPE_YARN || rc->mscale_all_dim <= 0) return 1.0;
    double m = yarn_get_mscale(rc->factor, rc->mscale_all_dim);
    return m * m;
}

void rope_table_build(const struct rope_config *rc, int dim, int max_pos,
                      int max_position_embeddings, float *out) {
    int half = dim / 2;
    float inv_freq[1024];
    for (int i = 0; i < half; i++)
        inv_freq[i] = (float)(1.0 / pow(rc->theta, (double)(2 * i) / dim));
    double attn_factor = 1.0;
    switch (rc->type) {
    case ROPE_DEFAULT: break;
    case ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv_freq[i] = (float)(inv_freq[i] / rc->factor);
        break;
    case ROPE_LLAMA3: {
        double old = rc->original_max_positions;
        double low_wl = old / rc->low_freq_factor, high_wl = old / rc->high_freq_factor;
        for (int i = 0; i < half; i++) {
            double f = inv_freq[i], wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = f / rc->factor;
            } else if (wl >= high_wl) {
                double smooth = (old / wl - rc->low_freq_factor) /
                                (rc->high_freq_factor - rc->low_freq_factor);
                f = (1.0 - smooth) * f / rc->factor + smooth * f;
            }
            inv_freq[i] = (float)f;
        }
        break;
    }
    case ROPE_YARN: {
        double orig = rc->original_max_positions > 0 ? rc->original_max_positions
                                                     : max_position_embeddings;
        double beta_fast = rc->beta_fast > 0 ? rc->beta_fast : 32.0;
        double beta_slow = rc->beta_slow > 0 ? rc->beta_slow : 1.0;
        double low = yarn_correction_dim(beta_fast, dim, rc->theta, orig);
        double high = yarn_correction_dim(beta_slow, dim, rc->theta, orig);
        if (!rc->no_truncate) low = floor(low), high = ceil(high);
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            double pos_freq = pow(rc->theta, (double)(2 * i) / dim);
            double extra = 1.0 / pos_freq, inter = 1.0 / (rc->factor * pos_freq);
            double ramp = (i - low) / (high - low);
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            double extra_factor = 1.0 - ramp;
            inv_freq[i] = (float)(inter * (1.0 - extra_factor) + extra * extra_factor);
        }
        attn_factor = yarn_attention_factor(rc);
        break;
    }
    }
    for (int p = 0; p < max_pos; p++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)p * inv_freq[i];
            out[((size_t)p * half + i) * 2] = (float)(cos((double)angle) * attn_factor);
            out[((size_t)p * half + i) * 2 + 1] = (float)(sin((double)angle) * attn_factor);
        }
    }
}
