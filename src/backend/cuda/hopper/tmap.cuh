/* tmap.cuh — TMA tensor maps for the Hopper kernels (host side, CUDA C++,
 * included by the .cu files of hopper/ only): the driver's encoder, found at run time
 * (cudaGetDriverEntryPointByVersion: no -lcuda), and the one map layout
 * the kernels load, rows in boxes of one 128-byte swizzle atom (64 16-bit
 * or 128 e4m3 columns) by `box` rows. */
#ifndef KILN_BACKEND_CUDA_HOPPER_TMAP_CUH
#define KILN_BACKEND_CUDA_HOPPER_TMAP_CUH

#include <cuda.h> /* CUtensorMap and its enums (header only) */
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_backend.h"

namespace hopper {

/* The encoder where the device runs sm_90a code (compute capability 9.0)
 * and the driver has it; NULL otherwise. */
static inline PFN_cuTensorMapEncodeTiled_v12000 tmap_encoder(int device) {
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major != 9 || minor != 0) return NULL; /* sm_90a code runs on 9.0 only */
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* *m = the map of a [rows][cols] bf16, f16 or e4m3 matrix (row stride ld
 * elements) in boxes of one 128-byte row (64 16-bit or 128 e4m3 columns)
 * × box rows, 128-byte swizzle, zeros past its edges. 1 when encoded. */
static inline int tmap_2d(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *m, const void *p, long rows,
                          long cols, long ld, int dtype, int box) {
    const int es1 = dtype == DTYPE_F8_E4M3 ? 1 : 2;
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t stride[1] = {(cuuint64_t)ld * (cuuint64_t)es1};
    cuuint32_t boxd[2] = {(cuuint32_t)(128 / es1), (cuuint32_t)box}, es[2] = {1, 1};
    CUtensorMapDataType t = dtype == DTYPE_F8_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                            : dtype == DTYPE_BF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUresult r = encode(m, t, 2, (void *)p, dim, stride, boxd, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
}

} // namespace hopper

#endif
