// Casts between element types, fills, and the store of a tensor into weight bytes (round to nearest even, or
// stochastic rounding seeded per element).

extern "C" __global__ void cast(const void* src, int sdt, void* dst, int ddt, i64 n) {
    GRID_STRIDE(i, n) { st(dst, ddt, i, ld(src, sdt, i)); }
}

// A quantized weight in type `ddt`, as ComfyUI dequantizes a per-tensor scaled one: each stored value (exact in
// f32) times the scale already rounded to `ddt` by the host, the product rounded once to `ddt`.
extern "C" __global__ void cast_scaled(const void* src, int sdt, void* dst, int ddt, i64 n, float scale) {
    GRID_STRIDE(i, n) { st(dst, ddt, i, ld(src, sdt, i) * scale); }
}

// The common weight cast, four values a thread: fp8 (e4m3 or e5m2, four to a 32-bit word) into f16 or bf16 (four to a
// 64-bit word), each times `scale` (1 for a plain cast: exact) and rounded once, as `cast` and `cast_scaled` do one
// value at a time. `n4` words; the host sends only aligned buffers whose length is a multiple of four.
extern "C" __global__ void cast_f8x4(const u32* src, int sdt, u64* dst, int ddt, i64 n4, float scale) {
    GRID_STRIDE(i, n4) {
        const u32 w = src[i];
        u64 out = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u8 b = (u8)(w >> (8 * k));
            const float v = (sdt == DT_E4M3 ? e4m3_to_f32(b) : e5m2_to_f32(b)) * scale;
            out |= (u64)(ddt == DT_BF16 ? f32_to_bf16(v) : f32_to_f16(v)) << (16 * k);
        }
        dst[i] = out;
    }
}

extern "C" __global__ void fill(void* dst, int dt, i64 n, float value) {
    GRID_STRIDE(i, n) { st(dst, dt, i, value); }
}

// Stochastic rounding, a line-by-line transliteration of the CPU backend's reference (`backend/cpu/store.rs`:
// `mix`, `uniform`, `stochastic`), whose tests pin known cases and check that this file keeps the lines marked
// [spec] verbatim, so both backends store the same bytes for the same seed, index and value:
// - the draw for element `index` is u = (mix(seed + mix(index + 0x9e3779b97f4a7c15)) >> 40) * 2^-24, with mix the
//   SplitMix64 finaliser and all arithmetic mod 2^64;
// - a value v between two neighbours lo < |v| < hi of the target type becomes hi when u < (|v| - lo) / (hi - lo),
//   else lo;
// - it rounds to nearest even instead when v is exact, zero, NaN or infinite, and when its nearest rounding is not
//   finite (an f16, bf16 or e5m2 value past the largest finite stays infinite, as on the CPU); hi is never taken
//   when it is not finite (just below infinity, or e4m3's NaN code above 448).
__device__ __forceinline__ u64 sr_mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // [spec]
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;  // [spec]
    return z ^ (z >> 31);                         // [spec]
}

__device__ __forceinline__ float sr_uniform(u64 seed, u64 index) {
    u64 z = sr_mix(seed + sr_mix(index + 0x9e3779b97f4a7c15ull));  // [spec]
    return (float)(z >> 40) * 5.9604644775390625e-8f;              // [spec] 24 bits in [0, 1)
}

// `v` in the encoding of `dt` (sign included), rounded to nearest even, and back.
__device__ __forceinline__ u32 enc(int dt, float v) {
    switch (dt) {
    case DT_F16: return f32_to_f16(v);
    case DT_BF16: return f32_to_bf16(v);
    case DT_E4M3: return f32_to_e4m3(v);
    default: return f32_to_e5m2(v);
    }
}

__device__ __forceinline__ float dec(int dt, u32 bits) {
    switch (dt) {
    case DT_F16: return f16_to_f32((u16)bits);
    case DT_BF16: return bf16_to_f32((u16)bits);
    case DT_E4M3: return e4m3_to_f32((u8)bits);
    default: return e5m2_to_f32((u8)bits);
    }
}

__device__ __forceinline__ void put(void* p, int dt, i64 i, u32 bits) {
    if (dt == DT_F16 || dt == DT_BF16) ((u16*)p)[i] = (u16)bits;
    else ((u8*)p)[i] = (u8)bits;
}

__device__ __forceinline__ bool sr_finite(float x) { return fabsf(x) < __int_as_float(0x7f800000); }

// `v` as `dt` (not f32), rounded stochastically with draw `u`; every encoding is sign-magnitude, so +-1 on the bits
// moves one step in magnitude.
__device__ __forceinline__ u32 sr_round(int dt, float v, float u) {
    u32 nearest = enc(dt, v);
    float r = dec(dt, nearest);
    if (!sr_finite(v) || r == v || !sr_finite(r)) return nearest;  // [spec]
    u32 lo = fabsf(r) < fabsf(v) ? nearest : nearest - 1u;          // [spec]
    u32 hi = fabsf(r) < fabsf(v) ? nearest + 1u : nearest;          // [spec]
    float lo_v = fabsf(dec(dt, lo)), hi_v = fabsf(dec(dt, hi));
    if (!sr_finite(hi_v)) return lo;                                // [spec]
    float p = (fabsf(v) - lo_v) / (hi_v - lo_v);                    // [spec]
    return u < p ? hi : lo;                                         // [spec]
}

// Writes `src` into `dst` as `ddt`: to nearest even, or with `stochastic` rounded as `sr_round` says, drawing per
// element index from `seed`.
extern "C" __global__ void store(const void* src, int sdt, void* dst, int ddt, i64 n, int stochastic, u64 seed) {
    GRID_STRIDE(i, n) {
        float v = ld(src, sdt, i);
        if (ddt == DT_F32) {
            ((float*)dst)[i] = v;
            continue;
        }
        // Integer bytes (a re-quantized int8 weight's values, rounded by the caller): to nearest, clamped.
        if (ddt == DT_I8 || ddt == DT_U8) {
            st(dst, ddt, i, v);
            continue;
        }
        put(dst, ddt, i, stochastic ? sr_round(ddt, v, sr_uniform(seed, (u64)i)) : enc(ddt, v));  // [spec]
    }
}
