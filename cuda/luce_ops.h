/* The one C ABI of the luce kernel library (CUDA: libluce_cuda.so, HIP: libluce_hip.so).
 *
 * Plain C: luce/_cuda.pyx includes it to marshal parameters. Every entry point takes a
 * pointer to a POD params struct and a stream, launches without synchronizing or allocating
 * (so it can be captured in a graph) and returns 0 or the runtime's error code, which
 * luce_error_string() names. Device pointers are raw addresses; shapes are in the comments.
 */
#ifndef LUCE_OPS_H
#define LUCE_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUCE_ABI_VERSION 1

int luce_abi_version(void);
const char *luce_error_string(int status);
int luce_device_synchronize(void);

/* RMSNorm over the last axis (reference: luce/ref/rmsnorm.py).
 * x [rows, cols] f32, weight [cols] f32, out [rows, cols] f32 (may alias x).
 * out = x / sqrt(mean(x^2) + eps) * weight. One block per row: batch-invariant. */
typedef struct {
    const float *x;
    const float *weight;
    float *out;
    int64_t rows;
    int64_t cols;
    float eps;
} luce_rmsnorm_params;
int luce_rmsnorm(const luce_rmsnorm_params *p, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* LUCE_OPS_H */
