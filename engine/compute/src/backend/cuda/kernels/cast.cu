// Casts between element types, fills, and the store of a tensor into weight bytes (round to nearest even, or
// stochastic rounding seeded per element).

extern "C" __global__ void cast(const void* src, int sdt, void* dst, int ddt, i64 n) {
    GRID_STRIDE(i, n) { st(dst, ddt, i, ld(src, sdt, i)); }
}

extern "C" __global__ void fill(void* dst, int dt, i64 n, float value) {
    GRID_STRIDE(i, n) { st(dst, dt, i, value); }
}

__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The encoded magnitude (sign bit cleared) and the largest finite magnitude of a narrow type.
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

// Stochastic rounding: a value between two neighbours lo < |v| < hi of the narrow type becomes hi with probability
// (|v| - lo) / (hi - lo), the draw being splitmix64(seed ^ splitmix64(index)). Exact values, NaN and infinities
// round to nearest even, and the result never moves past the largest finite value the nearest rounding gives.
extern "C" __global__ void store(const void* src, int sdt, void* dst, int ddt, i64 n, int stochastic, u64 seed) {
    GRID_STRIDE(i, n) {
        float v = ld(src, sdt, i);
        if (ddt == DT_F32) {
            ((float*)dst)[i] = v;
            continue;
        }
        u32 bits = enc(ddt, v);
        float a = fabsf(v);
        if (!stochastic || !(a < __int_as_float(0x7f800000))) {
            put(dst, ddt, i, bits);
            continue;
        }
        u32 sign_bit = (ddt == DT_F16 || ddt == DT_BF16) ? 0x8000u : 0x80u;
        u32 mag = bits & ~sign_bit;
        u32 sign = bits & sign_bit;
        float r = fabsf(dec(ddt, mag));
        if (r == a) {
            put(dst, ddt, i, bits);
            continue;
        }
        u32 other;
        if (r > a) {
            if (mag == 0u) {
                put(dst, ddt, i, bits);
                continue;
            }
            other = mag - 1u;
        } else {
            // Moving away from zero must stay finite: the largest finite magnitude per type.
            u32 max_finite = ddt == DT_F16 ? 0x7bffu : ddt == DT_BF16 ? 0x7f7fu : ddt == DT_E4M3 ? 0x7eu : 0x7bu;
            if (mag >= max_finite) {
                put(dst, ddt, i, bits);
                continue;
            }
            other = mag + 1u;
        }
        float o = fabsf(dec(ddt, other));
        float lo = fminf(r, o), hi = fmaxf(r, o);
        u32 lo_bits = r < o ? mag : other;
        u32 hi_bits = r < o ? other : mag;
        float p_up = (a - lo) / (hi - lo);
        u64 h = splitmix64(seed ^ splitmix64((u64)i));
        float u = (float)(h >> 40) * 5.9604644775390625e-8f;  // 24 bits in [0, 1)
        put(dst, ddt, i, sign | (u < p_up ? hi_bits : lo_bits));
    }
}
