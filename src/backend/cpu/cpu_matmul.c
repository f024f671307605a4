/* Placeholder reference kernel until the tuned kernel lands (branch cpuk). */
#include "backend/cpu/cpu_matmul.h"

#include "base/threadpool.h"

struct mm_job {
    float *y;
    long ldy;
    const float *x;
    long ldx;
    const void *w;
    enum dtype wt;
    const float *bias;
    long n, m, k;
};

static float wval(const void *w, enum dtype wt, long i) {
    switch (wt) {
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)w)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

static void mm_worker(void *arg, int ith, int nth) {
    const struct mm_job *j = arg;
    long lo, hi;
    threadpool_split(j->m, ith, nth, &lo, &hi);
    for (long c = lo; c < hi; c++)
        for (long r = 0; r < j->n; r++) {
            float acc[8] = {0};
            const float *x = j->x + r * j->ldx;
            for (long k = 0; k < j->k; k++) acc[k & 7] += x[k] * wval(j->w, j->wt, c * j->k + k);
            float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            j->y[r * j->ldy + c] = s + (j->bias ? j->bias[c] : 0.0f);
        }
}

void cpu_matmul(struct threadpool *tp, float *y, long ldy, const float *x, long ldx, const void *w,
                enum dtype wt, const float *bias, long n, long m, long k) {
    struct mm_job j = {y, ldy, x, ldx, w, wt, bias, n, m, k};
    threadpool_run(tp, mm_worker, &j);
}
