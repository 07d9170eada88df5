// ComfyUI's quantized weight formats (weight-formats.md §4), transliterating the CPU's decoding (`crate::quant`,
// `backend/cpu/quant.rs`): the row and block formats dequantized into a compute type, and int8's own linear layer
// as comfy-kitchen's `int8_linear` runs it (activations quantized per row, an exact integer product, scaled).

// cuBLAS's "128x4" block-scale layout: the offset of row r, block c in a table of `cols` (padded) columns.
__device__ __forceinline__ i64 swizzled(i64 r, i64 c, i64 cols) {
    return (r / 128 * (cols / 4) + c / 4) * 512 + (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4;
}

// An e8m0 exponent: 2^(e - 127); 0 decodes to 0 and 255 to infinity (comfy-kitchen's `e8m0_to_f32`).
__device__ __forceinline__ float e8m0_to_f32(u8 e) { return e == 0 ? 0.0f : __uint_as_float(((u32)e) << 23); }

// The E2M1 values by 4-bit code.
__device__ __forceinline__ float e2m1_to_f32(u32 code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}

// MXFP8: dst[r, c] = e4m3(q[r, c]) * 2^(e - 127) per block of 32 along a row, exact in f32, rounded once to `ddt`.
// `row0` is the table row of row 0 (a view of some rows of a weight).
extern "C" __global__ void dequant_mxfp8(const u8* q, const u8* table, void* dst, int ddt, i64 rows, i64 cols,
                                         i64 row0) {
    i64 tcols = (cols / 32 + 3) / 4 * 4;
    GRID_STRIDE(i, rows * cols) {
        i64 r = idiv(i, cols), c = imod(i, cols);
        st(dst, ddt, i, e4m3_to_f32(q[i]) * e8m0_to_f32(table[swizzled(row0 + r, c / 32, tcols)]));
    }
}

// NVFP4: two codes per byte, the even value in the high nibble; as comfy-kitchen's eager dequantization in the
// destination type: E2M1[code] * (T(global) * T(block scale)), the scale product rounded to T, then the value.
extern "C" __global__ void dequant_nvfp4(const u8* q, const u8* table, float global, void* dst, int ddt, i64 rows,
                                         i64 cols, i64 row0) {
    i64 tcols = (cols / 16 + 3) / 4 * 4;
    float g = round_to(ddt, global);
    GRID_STRIDE(i, rows * cols) {
        i64 r = idiv(i, cols), c = imod(i, cols);
        u8 byte = q[r * (cols / 2) + c / 2];
        u32 code = (c % 2 == 0) ? (u32)(byte >> 4) : (u32)(byte & 15u);
        float block = round_to(ddt, e4m3_to_f32(table[swizzled(row0 + r, c / 16, tcols)]));
        st(dst, ddt, i, e2m1_to_f32(code) * round_to(ddt, g * block));
    }
}

// int8: dst[r, c] = f32(q[r, c]) * scale of row r (`per_row`) or the one scale, in f32. A ConvRot weight is
// rotated back by the caller (a GEMM with the Hadamard matrix).
extern "C" __global__ void dequant_int8(const signed char* q, const float* scales, int per_row, float* dst, i64 rows,
                                        i64 cols) {
    GRID_STRIDE(i, rows * cols) { dst[i] = (float)q[i] * scales[per_row ? idiv(i, cols) : 0]; }
}

// comfy-kitchen's per-row quantization of activations: s = max(max|x| / 127, 1e-30) in f32, kept in `scales`; the
// quotient by s rounded to x's type (as torch divides x by s cast to x's type, the smallest normal where that cast
// gives 0), then rounded half to even and clamped to [-128, 127]. One block per row.
extern "C" __global__ void quantize_rows_i8(const void* x, int xdt, signed char* q, float* scales, i64 rows, i64 k,
                                            float tiny) {
    __shared__ float scratch[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        float m = 0.0f;
        for (i64 t = threadIdx.x; t < k; t += blockDim.x) m = fmaxf(m, fabsf(ld(x, xdt, r * k + t)));
        m = block_max(m, scratch);
        float s = fmaxf(m / 127.0f, 1e-30f);
        float sd = round_to(xdt, s);
        if (sd == 0.0f) sd = tiny;
        for (i64 t = threadIdx.x; t < k; t += blockDim.x) {
            float v = rintf(round_to(xdt, ld(x, xdt, r * k + t) / sd));
            q[r * k + t] = (signed char)fminf(fmaxf(v, -128.0f), 127.0f);
        }
        if (threadIdx.x == 0) scales[r] = s;
    }
}

// out[i, j] = T(f32(sum over t of a[i, t] * w[j, t]) * (sa[i] * sw[j])) for int8 a [m, k] and w [n, k], the sum
// exact in 32-bit integers; `per_row` says whether w has a scale per row or one (sw[0]). 16 x 16 tiles.
#define QT 16
extern "C" __global__ void gemm_i8(const signed char* a, const signed char* w, const float* sa, const float* sw,
                                   int per_row, void* out, int odt, i64 m, i64 n, i64 k) {
    __shared__ int as[QT][QT + 1];
    __shared__ int ws[QT][QT + 1];
    i64 i = (i64)blockIdx.y * QT + threadIdx.y;
    i64 j = (i64)blockIdx.x * QT + threadIdx.x;
    i64 jw = (i64)blockIdx.x * QT + threadIdx.y;
    int acc = 0;
    for (i64 t0 = 0; t0 < k; t0 += QT) {
        i64 t = t0 + threadIdx.x;
        as[threadIdx.y][threadIdx.x] = (i < m && t < k) ? (int)a[i * k + t] : 0;
        ws[threadIdx.y][threadIdx.x] = (jw < n && t < k) ? (int)w[jw * k + t] : 0;
        __syncthreads();
#pragma unroll
        for (int u = 0; u < QT; ++u) acc += as[threadIdx.y][u] * ws[threadIdx.x][u];
        __syncthreads();
    }
    if (i < m && j < n) st(out, odt, i * n + j, (float)acc * (sa[i] * sw[per_row ? j : 0]));
}
