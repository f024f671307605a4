/* test_matmul_heads.c — backend_ops.matmul_heads on the CPU backend: every
 * head's product in one operation, the same bits as one matmul per head
 * (the absorbed MLA form relies on it: `kiln verify` on the DeepSeek
 * oracles keeps today's logits). DeepSeek-shaped strides at small sizes:
 * q_nope → latent with x heads of 24 (16 used) and y heads of 40 (32
 * written), and W_UV as strided views into a kv_b_proj-like tensor; bf16,
 * f16 and f32 weights; 1, 3 and 17 rows. The columns between heads must
 * stay untouched. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/registry.h"
#include "base/error.h"
#include "base/mem.h"
#include "tensor/backend.h"
#include "tensor/dtype.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* H heads of [rows][cols], head_rows rows apart, off_rows rows into the
 * tensor; x head stride hx, y head stride hy. */
static void check(const struct backend *be, enum dtype dt, int H, long rows, long cols,
                  long head_rows, long off_rows, long hx, long hy, long n) {
    size_t es = dtype_size(dt), count = (size_t)(H * head_rows * cols);
    unsigned char *w = xaligned_alloc(count * es);
    for (size_t i = 0; i < count; i++) {
        float v = frand();
        if (dt == DTYPE_BF16) ((uint16_t *)w)[i] = f32_to_bf16(v);
        else if (dt == DTYPE_F16) ((uint16_t *)w)[i] = f32_to_f16(v);
        else ((float *)w)[i] = v;
    }
    struct backend_weight wv = {.data = w + (size_t)(off_rows * cols) * es, .dtype = dt, .rows = rows, .cols = cols};
    long w_stride = head_rows * cols, ldx = H * hx, ldy = H * hy;
    float *x = xmalloc((size_t)(n * ldx) * 4), *y = xmalloc((size_t)(n * ldy) * 4),
          *y1 = xmalloc((size_t)(n * ldy) * 4);
    for (long i = 0; i < n * ldx; i++) x[i] = frand();
    for (long i = 0; i < n * ldy; i++) y[i] = y1[i] = NAN;
    be->ops->matmul_heads(be->ctx, y, ldy, hy, x, ldx, hx, &wv, w_stride, H, n);
    for (int h = 0; h < H; h++) {
        struct backend_weight wh = wv;
        wh.data = (const unsigned char *)wv.data + (size_t)(h * w_stride) * es;
        be->ops->matmul(be->ctx, y1 + h * hy, ldy, x + h * hx, ldx, &wh, NULL, n);
    }
    assert_memory_equal(y, y1, (size_t)(n * ldy) * 4);
    /* and the products are the right ones: the last head's first output of
     * row 0, in double */
    double ref = 0;
    long hl = H - 1;
    for (long k = 0; k < cols; k++) {
        size_t at = (size_t)((hl * head_rows + off_rows) * cols + k);
        double wk = dt == DTYPE_BF16 ? bf16_to_f32(((uint16_t *)w)[at])
                    : dt == DTYPE_F16 ? f16_to_f32(((uint16_t *)w)[at])
                                      : ((float *)w)[at];
        ref += wk * x[hl * hx + k];
    }
    assert_true(fabs(ref - y[hl * hy]) <= 1e-4 * (1 + fabs(ref)));
    for (long i = 0; i < n; i++)
        for (int h = 0; h < H; h++)
            for (long k = rows; k < hy; k++) assert_true(isnan(y[i * ldy + h * hy + k]));
    free(w), free(x), free(y), free(y1);
}

static void test_matmul_heads_cpu(void **state) {
    (void)state;
    struct kiln_error err = {0};
    struct backend be;
    struct backend_options bo = {.n_threads = 2};
    assert_int_equal(backend_create(&be, "cpu", &bo, &err), 0);
    const enum dtype dts[] = {DTYPE_BF16, DTYPE_F16, DTYPE_F32};
    const long ns[] = {1, 3, 17};
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < 3; i++) {
            check(&be, dts[d], 4, 32, 16, 32, 0, 24, 40, ns[i]); /* q_nope·W_UK into q2 */
            check(&be, dts[d], 4, 16, 32, 32, 16, 32, 16, ns[i]); /* att·W_UV, views */
            check(&be, dts[d], 1, 8, 8, 8, 0, 8, 8, ns[i]);      /* one head */
        }
    backend_destroy(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matmul_heads_cpu)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
