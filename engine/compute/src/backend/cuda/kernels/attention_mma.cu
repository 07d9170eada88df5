// Attention on tensor cores (sm_80 and later): softmax(q·kᵀ·scale + mask)·v for 16-bit q, k, v with heads of D = 64
// or 128 features (FlashAttention-2's forward pass): the scores never leave registers.
//
// Grid (ceil(Nq / 64), Hq, B); block = 4 warps, each owning 16 query rows. Per tile of 64 keys the block loads the
// keys and values into shared memory (rows padded by 8 elements, so the fragment reads below hit distinct banks);
// each warp computes its 16 × 64 scores with mma.sync m16n8k16 (f32 accumulation), updates its rows' running
// maximum and sum (an online softmax in base 2), rounds the probabilities to the input type (as FlashAttention
// does) and accumulates p·v with mma.sync into 16 × D f32 accumulators. Fragment layouts are PTX's for
// m16n8k16: lane = 4·g + t; A (16×16, row) holds rows g and g + 8 at columns 2t, 2t+1 and 2t+8, 2t+9; B (16×8, col)
// holds rows (k) 2t, 2t+1 and 2t+8, 2t+9 of column (n) g; C holds rows g and g + 8 at columns 2t, 2t+1. The C
// fragments of two adjacent score tiles are exactly the A fragment of p for the next product.
// Causal: query i sees keys 0 ..= i + (Nk − Nq); a row that sees no key is written as zeros.

#define MMA_ROWS 64
#define MMA_KEYS 64
#define MMA_PAD 8

__device__ __forceinline__ u32 pack2(float lo, float hi, int dt) {
    u16 a = dt == DT_F16 ? f32_to_f16(lo) : f32_to_bf16(lo);
    u16 b = dt == DT_F16 ? f32_to_f16(hi) : f32_to_bf16(hi);
    return (u32)a | ((u32)b << 16);
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1, int dt) {
    if (dt == DT_F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

template <int D>
__device__ void attention_mma(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv, i64 nq,
                              i64 nk, float scale, int causal) {
    constexpr int KS = D / 16;  // k-steps of q·kᵀ
    constexpr int NT = D / 8;   // 8-wide column tiles of the output
    constexpr int STRIDE = D + MMA_PAD;
    extern __shared__ __align__(16) u16 tiles[];
    u16* ks = tiles;
    u16* vs = tiles + MMA_KEYS * STRIDE;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (hq / hkv);
    const i64 q0 = (i64)blockIdx.x * MMA_ROWS;
    const u16* qh = q + ((i64)b * hq + h) * nq * D;
    const u16* kh = k + ((i64)b * hkv + hk) * nk * D;
    const u16* vh = v + ((i64)b * hkv + hk) * nk * D;
    const i64 row0 = q0 + warp * 16 + g, row1 = row0 + 8;

    // This warp's q rows as A fragments, straight from global memory (zeros past the last query).
    u32 qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        int c = s * 16 + 2 * t;
        qa[s][0] = row0 < nq ? *(const u32*)(qh + row0 * D + c) : 0u;
        qa[s][1] = row1 < nq ? *(const u32*)(qh + row1 * D + c) : 0u;
        qa[s][2] = row0 < nq ? *(const u32*)(qh + row0 * D + c + 8) : 0u;
        qa[s][3] = row1 < nq ? *(const u32*)(qh + row1 * D + c + 8) : 0u;
    }

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const float scale2 = scale * 1.4426950408889634f;  // log2(e): exp(x) = exp2(x·log2 e)

    i64 kend = nk;
    if (causal) {
        i64 qlast = q0 + MMA_ROWS - 1 < nq ? q0 + MMA_ROWS - 1 : nq - 1;
        i64 e = qlast + (nk - nq) + 1;
        kend = e < 0 ? 0 : (e < nk ? e : nk);
    }
    const i64 lim0 = causal ? row0 + (nk - nq) : nk - 1;  // the last key each row sees
    const i64 lim1 = causal ? row1 + (nk - nq) : nk - 1;

    for (i64 k0 = 0; k0 < kend; k0 += MMA_KEYS) {
        __syncthreads();  // the previous tile is consumed
        for (int i = threadIdx.x; i < MMA_KEYS * D / 2; i += blockDim.x) {
            int j = i / (D / 2), c = (i - j * (D / 2)) * 2;
            i64 kj = k0 + j;
            u32 kv = kj < nk ? *(const u32*)(kh + kj * D + c) : 0u;
            u32 vv = kj < nk ? *(const u32*)(vh + kj * D + c) : 0u;
            *(u32*)(ks + j * STRIDE + c) = kv;
            *(u32*)(vs + j * STRIDE + c) = vv;
        }
        __syncthreads();

        // Scores: 8 tiles of 8 keys, each a 16 × 8 C fragment.
        float sc[MMA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < MMA_KEYS / 8; ++n) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
            const u16* krow = ks + (n * 8 + g) * STRIDE + 2 * t;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                u32 b0 = *(const u32*)(krow + s * 16);
                u32 b1 = *(const u32*)(krow + s * 16 + 8);
                mma16816(sc[n], qa[s], b0, b1, dt);
            }
        }

        // Mask, then the online softmax of rows g (elements 0, 1) and g + 8 (elements 2, 3).
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int n = 0; n < MMA_KEYS / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                i64 kj = k0 + n * 8 + 2 * t + (e & 1);
                i64 lim = e < 2 ? lim0 : lim1;
                float s2 = (kj < nk && kj <= lim) ? sc[n][e] * scale2 : NEG_INF;
                sc[n][e] = s2;
                if (e < 2) mx0 = fmaxf(mx0, s2);
                else mx1 = fmaxf(mx1, s2);
            }
        }
#pragma unroll
        for (int lanes = 1; lanes < 4; lanes <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, lanes));
            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, lanes));
        }
        float new0 = fmaxf(m0, mx0), new1 = fmaxf(m1, mx1);
        float base0 = new0 == NEG_INF ? 0.0f : new0, base1 = new1 == NEG_INF ? 0.0f : new1;
        float corr0 = exp2f(m0 - base0), corr1 = exp2f(m1 - base1);
        m0 = new0;
        m1 = new1;
        float sum0 = 0.0f, sum1 = 0.0f;
        u32 pa[MMA_KEYS / 16][4];
#pragma unroll
        for (int n = 0; n < MMA_KEYS / 8; ++n) {
            float p0 = exp2f(sc[n][0] - base0), p1 = exp2f(sc[n][1] - base0);
            float p2 = exp2f(sc[n][2] - base1), p3 = exp2f(sc[n][3] - base1);
            sum0 += p0 + p1;
            sum1 += p2 + p3;
            // Tile n is keys 8n .. 8n + 7: the low (n even) or high (n odd) half of k-step n / 2.
            pa[n / 2][(n & 1) * 2 + 0] = pack2(p0, p1, dt);
            pa[n / 2][(n & 1) * 2 + 1] = pack2(p2, p3, dt);
        }
#pragma unroll
        for (int lanes = 1; lanes < 4; lanes <<= 1) {
            sum0 += __shfl_xor_sync(FULL_MASK, sum0, lanes);
            sum1 += __shfl_xor_sync(FULL_MASK, sum1, lanes);
        }
        l0 = l0 * corr0 + sum0;
        l1 = l1 * corr1 + sum1;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            acc[n][0] *= corr0;
            acc[n][1] *= corr0;
            acc[n][2] *= corr1;
            acc[n][3] *= corr1;
        }

        // p·v: k-steps of 16 keys; B fragments gather two keys' values of column 8n + g.
#pragma unroll
        for (int s = 0; s < MMA_KEYS / 16; ++s) {
            const u16* v0 = vs + (s * 16 + 2 * t) * STRIDE + g;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const u16* vc = v0 + n * 8;
                u32 b0 = (u32)vc[0] | ((u32)vc[STRIDE] << 16);
                u32 b1 = (u32)vc[8 * STRIDE] | ((u32)vc[9 * STRIDE] << 16);
                mma16816(acc[n], pa[s], b0, b1, dt);
            }
        }
    }

    // Rows past the last query are not written; a row that saw no key is zeros.
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    u16* oh = o + ((i64)b * hq + h) * nq * D;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        int c = n * 8 + 2 * t;
        if (row0 < nq) *(u32*)(oh + row0 * D + c) = pack2(acc[n][0] * inv0, acc[n][1] * inv0, dt);
        if (row1 < nq) *(u32*)(oh + row1 * D + c) = pack2(acc[n][2] * inv1, acc[n][3] * inv1, dt);
    }
}

extern "C" __global__ void attention_mma_64(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                            i64 nq, i64 nk, float scale, int causal) {
    attention_mma<64>(q, k, v, o, dt, hq, hkv, nq, nk, scale, causal);
}

extern "C" __global__ void attention_mma_128(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                             i64 nq, i64 nk, float scale, int causal) {
    attention_mma<128>(q, k, v, o, dt, hq, hkv, nq, nk, scale, causal);
}
