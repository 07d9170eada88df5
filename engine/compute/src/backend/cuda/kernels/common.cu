// Shared by every kernel file: NVRTC compiles each op family as `common.cu` followed by the family's file, with no
// toolkit headers (no include directives at all). Element types are runtime codes so one kernel serves every dtype pairing;
// the codes match `DType` (see `dtype_code` in kernels.rs). Every conversion is by hand on the bit patterns and
// rounds to nearest even exactly as `crate::dtype` does on the host, so CPU and CUDA casts agree bit for bit.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_E4M3 3
#define DT_E5M2 4
#define DT_I8 5
#define DT_U8 6

#define NEG_INF (__int_as_float(0xff800000))
#define FULL_MASK 0xffffffffu

// Up to 8 dimensions passed by value (matches `[u64; 8]` on the host).
struct Dims8 {
    u64 v[8];
};

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 e = ((u32)h >> 10) & 0x1fu;
    u32 m = (u32)h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -v : v;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (u16)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN stays NaN
    if (ax >= 0x477ff000u) return (u16)(sign | 0x7c00u);                         // >= 65520: infinity
    if (ax >= 0x38800000u) {                                                      // normal (>= 2^-14)
        u32 r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (u16)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u) return (u16)sign;  // <= 2^-25: ties to even give zero
    // Subnormal: the value in units of 2^-24 (exact scaling), rounded to nearest even; 1024 is the smallest normal.
    u32 q = __float2uint_rn(__uint_as_float(ax) * 16777216.0f);
    return (u16)(sign | q);
}

__device__ __forceinline__ float e4m3_to_f32(u8 b) {
    u32 sign = (u32)(b & 0x80u);
    u32 e = ((u32)b >> 3) & 0xfu;
    u32 m = (u32)b & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u | (sign << 24));
    float v = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return sign ? -v : v;
}

// Saturates to +-448 as `dtype::f32_to_f8e4m3` does; NaN is 0x7f.
__device__ __forceinline__ u8 f32_to_e4m3(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 24) & 0x80u;
    u32 ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (u8)0x7f;
    if (ax >= 0x43e00000u) return (u8)(sign | 0x7eu);
    if (ax >= 0x3c800000u) {  // normal (>= 2^-6)
        u32 r = ax - 0x3c000000u;
        r += 0x7ffffu + ((r >> 20) & 1u);
        u32 q = r >> 20;
        if (q > 0x7eu) q = 0x7eu;
        return (u8)(sign | q);
    }
    u32 q = __float2uint_rn(__uint_as_float(ax) * 512.0f);  // units of 2^-9; 8 is the smallest normal
    return (u8)(sign | q);
}

__device__ __forceinline__ float e5m2_to_f32(u8 b) { return f16_to_f32((u16)((u32)b << 8)); }

// The top byte of the f16 rounding, rounded to nearest even on the dropped byte (as `dtype::f32_to_f8e5m2`).
__device__ __forceinline__ u8 f32_to_e5m2(float f) {
    u32 h = f32_to_f16(f);
    if ((h & 0x7fffu) > 0x7c00u) return (u8)((h >> 8) | 0x02u);
    u32 lower = h & 0xffu;
    u32 upper = h >> 8;
    if (lower > 0x80u || (lower == 0x80u && (upper & 1u))) upper += 1u;
    return (u8)upper;
}

__device__ __forceinline__ float ld(const void* p, int dt, i64 i) {
    switch (dt) {
    case DT_F32: return ((const float*)p)[i];
    case DT_F16: return f16_to_f32(((const u16*)p)[i]);
    case DT_BF16: return bf16_to_f32(((const u16*)p)[i]);
    case DT_E4M3: return e4m3_to_f32(((const u8*)p)[i]);
    case DT_I8: return (float)((const signed char*)p)[i];
    case DT_U8: return (float)((const u8*)p)[i];
    default: return e5m2_to_f32(((const u8*)p)[i]);
    }
}

__device__ __forceinline__ void st(void* p, int dt, i64 i, float v) {
    switch (dt) {
    case DT_F32: ((float*)p)[i] = v; break;
    case DT_F16: ((u16*)p)[i] = f32_to_f16(v); break;
    case DT_BF16: ((u16*)p)[i] = f32_to_bf16(v); break;
    case DT_E4M3: ((u8*)p)[i] = f32_to_e4m3(v); break;
    case DT_I8: ((signed char*)p)[i] = (signed char)fminf(fmaxf(rintf(v), -128.0f), 127.0f); break;
    case DT_U8: ((u8*)p)[i] = (u8)fminf(fmaxf(rintf(v), 0.0f), 255.0f); break;
    default: ((u8*)p)[i] = f32_to_e5m2(v); break;
    }
}

// `v` rounded to the compute type `dt` and back (what storing it and loading it again gives).
__device__ __forceinline__ float round_to(int dt, float v) {
    switch (dt) {
    case DT_F16: return f16_to_f32(f32_to_f16(v));
    case DT_BF16: return bf16_to_f32(f32_to_bf16(v));
    default: return v;
    }
}

// The unary ops (codes as `unary_code` in elementwise.rs), in f32; `dt` is the type the result is stored in.
#define OP_SILU 0
#define OP_GELU 1
#define OP_GELU_TANH 2
#define OP_TANH 3
#define OP_SIGMOID 4
#define OP_EXP 5
#define OP_NEG 6
#define OP_RELU 7
#define OP_NAN_TO_NUM 8

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The largest finite value of compute type `dt` (what `nan_to_num` turns +inf into).
__device__ __forceinline__ float max_finite(int dt) {
    return dt == DT_F16 ? 65504.0f : dt == DT_BF16 ? 3.3895313892515355e38f : 3.4028234663852886e38f;
}

__device__ __forceinline__ float apply_unary(int op, int dt, float x) {
    switch (op) {
    case OP_SILU: return x * sigmoid(x);
    case OP_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case OP_GELU_TANH: {
        float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    case OP_TANH: return tanhf(x);
    case OP_SIGMOID: return sigmoid(x);
    case OP_EXP: return expf(x);
    case OP_RELU: return fmaxf(x, 0.0f);
    case OP_NAN_TO_NUM: return isnan(x) ? 0.0f : fminf(fmaxf(x, -max_finite(dt)), max_finite(dt));
    default: return -x;
    }
}

// Moves one element of `esize` bytes (1, 2 or 4) without conversion.
__device__ __forceinline__ void mv(void* dst, i64 di, const void* src, i64 si, int esize) {
    if (esize == 4) ((u32*)dst)[di] = ((const u32*)src)[si];
    else if (esize == 2) ((u16*)dst)[di] = ((const u16*)src)[si];
    else ((u8*)dst)[di] = ((const u8*)src)[si];
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. `scratch` holds 32
// floats of shared memory; the call begins and ends with a barrier so it can be used back to back.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}

__device__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : NEG_INF;
    t = warp_max(t);
    __syncthreads();
    return t;
}

// i / d and i % d for the index arithmetic of the element loops. A 64-bit division is a long software routine on
// the GPU (tens of instructions; a copy decomposing its index into four dimensions spends far more time dividing
// than moving bytes). When i and d both fit in 31 bits (every index of a tensor under 2^31 elements) the 32-bit
// division gives the same quotient and remainder for a fraction of that; otherwise, or for a negative i, the 64-bit
// one runs. The test is uniform across a warp in practice, so both branches cost nothing extra.
__device__ __forceinline__ i64 idiv(i64 i, i64 d) { return ((i | d) >> 31) == 0 ? (i64)((u32)i / (u32)d) : i / d; }
__device__ __forceinline__ i64 imod(i64 i, i64 d) { return ((i | d) >> 31) == 0 ? (i64)((u32)i % (u32)d) : i % d; }

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
