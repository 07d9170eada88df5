// A plain tiled GEMM with f32 accumulation, for the shapes and alignments cuBLASLt has no algorithm for:
// c[b, i, j] = sum over t of a[b, i, t] · bm[b, t, j] (plus c's value with `accumulate`), each operand addressed by
// (batch, row, column) strides in elements, any element type. 16 × 16 tiles, one output per thread.

#define GT 16

extern "C" __global__ void gemm_fallback(const void* a, int adt, const void* bm, int bdt, void* c, int cdt, i64 m,
                                         i64 n, i64 k, i64 sa_b, i64 sa_r, i64 sa_c, i64 sb_b, i64 sb_r, i64 sb_c,
                                         i64 sc_b, i64 sc_r, int accumulate) {
    __shared__ float as[GT][GT + 1];
    __shared__ float bs[GT][GT + 1];
    i64 b = blockIdx.z;
    i64 i = (i64)blockIdx.y * GT + threadIdx.y;
    i64 j = (i64)blockIdx.x * GT + threadIdx.x;
    float acc = 0.0f;
    for (i64 t0 = 0; t0 < k; t0 += GT) {
        i64 ta = t0 + threadIdx.x, tb = t0 + threadIdx.y;
        as[threadIdx.y][threadIdx.x] = (i < m && ta < k) ? ld(a, adt, b * sa_b + i * sa_r + ta * sa_c) : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (tb < k && j < n) ? ld(bm, bdt, b * sb_b + tb * sb_r + j * sb_c) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < GT; ++t) acc += as[threadIdx.y][t] * bs[t][threadIdx.x];
        __syncthreads();
    }
    if (i < m && j < n) {
        const i64 at = b * sc_b + i * sc_r + j;
        st(c, cdt, at, accumulate ? acc + ld(c, cdt, at) : acc);
    }
}
