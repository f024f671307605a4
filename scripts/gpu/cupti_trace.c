/* cupti_trace.c — a kernel timeline of any CUDA program, graph replays
 * included, for the GPU machine (which has no Nsight Systems). Built as a
 * shared library and loaded by the CUDA driver through
 * CUDA_INJECTION64_PATH, it turns on CUPTI's concurrent-kernel and memcpy
 * activity records and, at exit, writes one CSV line per record to
 * $KILN_TRACE_OUT (default trace.csv):
 *   kind,start_ns,end_ns,correlation,graph_id,grid,block,smem,regs,name
 * Kernels of one graph replay share the correlation id of its
 * cudaGraphLaunch. scripts/gpu/trace_summary.py reads the file. Not part of kiln:
 * built on the GPU machine by scripts/gpu/trace.sh against the CUPTI
 * that comes with the CUDA toolkit there. KERNEL_REC, MEMCPY_REC and
 * MEMSET_REC name the newest record structs of that CUPTI (the script
 * finds them). */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KERNEL_REC
#define KERNEL_REC CUpti_ActivityKernel9
#endif
#ifndef MEMCPY_REC
#define MEMCPY_REC CUpti_ActivityMemcpy5
#endif
#ifndef MEMSET_REC
#define MEMSET_REC CUpti_ActivityMemset4
#endif

enum { BUF = 16 << 20 };

static FILE *out;

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = (uint8_t *)aligned_alloc(64, BUF);
    *size = *buf ? BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_complete(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                  size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const KERNEL_REC *k = (const KERNEL_REC *)r;
            fprintf(out, "K,%llu,%llu,%u,%u,%dx%dx%d,%d,%d,%u,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->correlationId, k->graphId, k->gridX, k->gridY,
                    k->gridZ, k->blockX, k->dynamicSharedMemory, k->registersPerThread,
                    k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const MEMCPY_REC *m = (const MEMCPY_REC *)r;
            fprintf(out, "M,%llu,%llu,%u,%u,%llu,0,0,0,memcpy%d\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->correlationId, m->graphId,
                    (unsigned long long)m->bytes, (int)m->copyKind);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const MEMSET_REC *m = (const MEMSET_REC *)r;
            fprintf(out, "S,%llu,%llu,%u,%u,%llu,0,0,0,memset\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->correlationId, m->graphId,
                    (unsigned long long)m->bytes);
        }
    }
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

int InitializeInjection(void) {
    const char *path = getenv("KILN_TRACE_OUT");
    out = fopen(path && *path ? path : "trace.csv", "w");
    if (!out) return 0;
    if (cuptiActivityRegisterCallbacks(buf_request, buf_complete) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "cupti_trace: cannot enable kernel records\n");
        return 0;
    }
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    atexit(finish);
    return 1;
}
