// Attention on tensor cores (sm_80 and later): softmax(q·kᵀ·scale + mask)·v for 16-bit q, k, v with heads of D = 64
// or 128 features (FlashAttention-2's forward pass): the scores never leave registers.
//
// Grid (ceil(Nq / 64), Hq, B); block = 4 warps, each owning 16 query rows. The keys and values come in tiles of 64
// rows, copied into shared memory with cp.async one tile ahead of its use (double buffering: the copy of tile
// i + 1 runs while tile i is computed; rows padded by 8 elements, so the 8 rows ldmatrix reads at once hit distinct
// banks). Per tile each warp computes its 16 × 64 scores with mma.sync m16n8k16 (f32 accumulation; the B fragments of
// kᵀ by ldmatrix.x4), updates its rows' running maximum and sum (an online softmax in base 2), rounds the
// probabilities to the input type (as FlashAttention does) and accumulates p·v with mma.sync into 16 × D f32
// accumulators (the B fragments of v by ldmatrix.x4.trans). Fragment layouts are PTX's for m16n8k16: lane = 4·g + t;
// A (16×16, row) holds rows g and g + 8 at columns 2t, 2t+1 and 2t+8, 2t+9; B (16×8, col) holds rows (k) 2t, 2t+1
// and 2t+8, 2t+9 of column (n) g; C holds rows g and g + 8 at columns 2t, 2t+1. The C fragments of two adjacent
// score tiles are exactly the A fragment of p for the next product.
// Causal: query i sees keys 0 ..= i + (Nk − Nq); a row that sees no key is written as zeros.

// Blocks per SM the register budget is sized for: three 68 KB blocks fit Hopper's shared memory; on sm_8x (100 to
// 164 KB) one or two do, and a tighter register cap would only spill.
#if __CUDA_ARCH__ >= 900
#define MMA_MIN_BLOCKS 3
#else
#define MMA_MIN_BLOCKS 2
#endif

#define MMA_ROWS 64
#define MMA_KEYS 64
#define MMA_PAD 8

// Two f32 values rounded to nearest even into one register of two 16-bit values (lo in the low half).
template <bool F16>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if (F16) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}

template <bool F16>
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    if (F16) {
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

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8×8 matrices of 16-bit values from shared memory: lanes 8i .. 8i + 7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16 bytes from global to shared memory without the registers; `bytes` 0 fills the 16 bytes with zeros.
__device__ __forceinline__ void copy16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;"); }

// Waits until at most `N` committed groups of this thread's copies are still in flight.
template <int N>
__device__ __forceinline__ void copies_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

template <int D, bool F16>
__device__ void attention_mma(const u16* q, const u16* k, const u16* v, u16* o, int hq, int hkv, i64 nq, i64 nk,
                              float scale, int causal) {
    constexpr int KS = D / 16;  // k-steps of q·kᵀ
    constexpr int NT = D / 8;   // 8-wide column tiles of the output
    constexpr int STRIDE = D + MMA_PAD;
    constexpr int TILE = MMA_KEYS * STRIDE;  // elements of one tile of keys (or values)
    constexpr int CHUNKS = D / 8;            // 16-byte pieces of a row
    extern __shared__ __align__(16) u16 tiles[];  // [stage][k, v][MMA_KEYS][STRIDE]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (hq / hkv);
    const i64 q0 = (i64)blockIdx.x * MMA_ROWS;
    const u16* qh = q + ((i64)b * hq + h) * nq * D;
    const u16* kh = k + ((i64)b * hkv + hk) * nk * D;
    const u16* vh = v + ((i64)b * hkv + hk) * nk * D;
    const i64 row0 = q0 + warp * 16 + g, row1 = row0 + 8;
    const u32 base = shared_address(tiles);

    i64 kend = nk;
    if (causal) {
        i64 qlast = q0 + MMA_ROWS - 1 < nq ? q0 + MMA_ROWS - 1 : nq - 1;
        i64 e = qlast + (nk - nq) + 1;
        kend = e < 0 ? 0 : (e < nk ? e : nk);
    }
    const i64 tiles_n = (kend + MMA_KEYS - 1) / MMA_KEYS;

    // Queues the copy of tile `i` (keys and values; zeros past the last key) into stage i % 2.
    auto load = [&](i64 i) {
        const u32 ks = base + (u32)((i & 1) * 2 * TILE) * 2, vs = ks + TILE * 2;
        for (int c = threadIdx.x; c < MMA_KEYS * CHUNKS; c += blockDim.x) {
            const int j = c / CHUNKS, col = (c - j * CHUNKS) * 8;
            const i64 kj = i * MMA_KEYS + j;
            const bool in = kj < nk;
            const i64 at = (in ? kj : 0) * D + col;
            const u32 off = (u32)(j * STRIDE + col) * 2;
            copy16(ks + off, kh + at, in ? 16 : 0);
            copy16(vs + off, vh + at, in ? 16 : 0);
        }
        copies_commit();
    };
    if (tiles_n > 0) load(0);

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
    // The last key each row sees.
    const i64 last0 = causal && row0 + (nk - nq) < nk - 1 ? row0 + (nk - nq) : nk - 1;
    const i64 last1 = causal && row1 + (nk - nq) < nk - 1 ? row1 + (nk - nq) : nk - 1;

    // ldmatrix row addresses (lane l gives row l % 8 of matrix l / 8):
    // kᵀ: matrix i of k-steps s, s + 1 is keys 8n + (l % 8), features 16s + 8i ..;
    // v: matrix i of k-step s, column tiles n, n + 1 is keys 16s + 8(i & 1) + (l % 8), features 8(n + i / 2) ...
    const int lr = lane & 7, li = lane >> 3;
    const u32 k_lane = (u32)(lr * STRIDE + li * 8) * 2;
    const u32 v_lane = (u32)(((li & 1) * 8 + lr) * STRIDE + (li >> 1) * 8) * 2;

    for (i64 i = 0; i < tiles_n; ++i) {
        const i64 k0 = i * MMA_KEYS;
        if (i + 1 < tiles_n) {
            load(i + 1);
            copies_wait<1>();
        } else {
            copies_wait<0>();
        }
        __syncthreads();  // tile i is in shared memory for every warp
        const u32 ks = base + (u32)((i & 1) * 2 * TILE) * 2, vs = ks + TILE * 2;

        // Scores: 8 tiles of 8 keys, each a 16 × 8 C fragment.
        float sc[MMA_KEYS / 8][4];
#pragma unroll
        for (int n = 0; n < MMA_KEYS / 8; ++n) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int s = 0; s < KS; s += 2) {
                u32 kb[4];
                ldmatrix_x4(kb, ks + k_lane + (u32)(n * 8 * STRIDE + s * 16) * 2);
                mma16816<F16>(sc[n], qa[s], kb[0], kb[1]);
                mma16816<F16>(sc[n], qa[s + 1], kb[2], kb[3]);
            }
        }

        // Mask (each row sees the tile's first `seen` keys), then the online softmax of rows g (elements 0, 1)
        // and g + 8 (elements 2, 3).
        const i64 r0 = last0 - k0 + 1, r1 = last1 - k0 + 1;
        const int seen0 = r0 < 0 ? 0 : (r0 > MMA_KEYS ? MMA_KEYS : (int)r0);
        const int seen1 = r1 < 0 ? 0 : (r1 > MMA_KEYS ? MMA_KEYS : (int)r1);
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int n = 0; n < MMA_KEYS / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = n * 8 + 2 * t + (e & 1);
                float s2 = j < (e < 2 ? seen0 : seen1) ? sc[n][e] * scale2 : NEG_INF;
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
            pa[n / 2][(n & 1) * 2 + 0] = pack2<F16>(p0, p1);
            pa[n / 2][(n & 1) * 2 + 1] = pack2<F16>(p2, p3);
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

        // p·v: k-steps of 16 keys; each ldmatrix.x4.trans gives the B fragments of two column tiles.
#pragma unroll
        for (int s = 0; s < MMA_KEYS / 16; ++s) {
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, vs + v_lane + (u32)(s * 16 * STRIDE + n * 8) * 2);
                mma16816<F16>(acc[n], pa[s], vb[0], vb[1]);
                mma16816<F16>(acc[n + 1], pa[s], vb[2], vb[3]);
            }
        }
        __syncthreads();  // every warp is done with stage i % 2 before tile i + 2 is copied into it
    }

    // Rows past the last query are not written; a row that saw no key is zeros.
    float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    u16* oh = o + ((i64)b * hq + h) * nq * D;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        int c = n * 8 + 2 * t;
        if (row0 < nq) *(u32*)(oh + row0 * D + c) = pack2<F16>(acc[n][0] * inv0, acc[n][1] * inv0);
        if (row1 < nq) *(u32*)(oh + row1 * D + c) = pack2<F16>(acc[n][2] * inv1, acc[n][3] * inv1);
    }
}

extern "C" __launch_bounds__(128, MMA_MIN_BLOCKS) __global__ void attention_mma_64(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                            i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<64, true>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<64, false>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}

extern "C" __launch_bounds__(128, MMA_MIN_BLOCKS) __global__ void attention_mma_128(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                             i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<128, true>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<128, false>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}
