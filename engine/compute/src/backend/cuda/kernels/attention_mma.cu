// Attention on tensor cores (sm_80 and later): softmax(q·kᵀ·scale + mask)·v for 16-bit q, k, v with heads of D = 64
// or 128 features (FlashAttention-2's forward pass): the scores never leave registers.
//
// Grid (ceil(Nq / (64·MT)), Hq, B); block = 4 warps, each owning MT m-tiles of 16 query rows (MT = 1: q's A fragments
// held in registers; MT = 2, FlashAttention-2's shape: q copied into shared memory once and its fragments read by
// ldmatrix.x4 per key tile, so every B fragment of k and v feeds two products). The keys and values come in tiles of
// KEYS rows (64; 32 for MT = 2 at D = 128, so the scores fit the registers), copied into shared memory with cp.async
// one tile ahead of its use (double buffering: the copy of tile i + 1 runs while tile i is computed; rows padded by 8
// elements, so the 8 rows ldmatrix reads at once hit distinct banks). Per tile each warp computes its 16 × KEYS scores
// per m-tile with mma.sync m16n8k16 (f32 accumulation; the B fragments of kᵀ by ldmatrix.x4), updates its rows' running
// maximum and sum (an online softmax in base 2), rounds the probabilities to the input type (as FlashAttention does)
// and accumulates p·v with mma.sync into 16 × D f32 accumulators per m-tile (the B fragments of v by
// ldmatrix.x4.trans). Fragment layouts are PTX's for m16n8k16: lane = 4·g + t; A (16×16, row) holds rows g and g + 8 at
// columns 2t, 2t+1 and 2t+8, 2t+9; B (16×8, col) holds rows (k) 2t, 2t+1 and 2t+8, 2t+9 of column (n) g; C holds rows g
// and g + 8 at columns 2t, 2t+1. The C fragments of two adjacent score tiles are exactly the A fragment of p for the
// next product.
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
// Keys per tile of the two-m-tile kernel at D = 128: 32, so its scores fit the registers beside 2 × 16 × 128
// accumulators.
#define MMA2_KEYS_128 32

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

template <int D, bool F16, int MT, int KEYS>
__device__ void attention_mma(const u16* q, const u16* k, const u16* v, u16* o, int hq, int hkv, i64 nq, i64 nk,
                              float scale, int causal) {
    constexpr int KS = D / 16;  // k-steps of q·kᵀ
    constexpr int NT = D / 8;   // 8-wide column tiles of the output
    constexpr int STRIDE = D + MMA_PAD;
    constexpr int TILE = KEYS * STRIDE;  // elements of one tile of keys (or values)
    constexpr int CHUNKS = D / 8;            // 16-byte pieces of a row
    constexpr int ROWS = MMA_ROWS * MT;      // query rows of the block
    constexpr bool QS = MT > 1;              // q's A fragments from shared memory (else held in registers)
    extern __shared__ __align__(16) u16 tiles[];  // [stage][k, v][KEYS][STRIDE], then q [ROWS][STRIDE] if QS

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (hq / hkv);
    const i64 q0 = (i64)blockIdx.x * ROWS;
    const u16* qh = q + ((i64)b * hq + h) * nq * D;
    const u16* kh = k + ((i64)b * hkv + hk) * nk * D;
    const u16* vh = v + ((i64)b * hkv + hk) * nk * D;
    // Row r (0 or 1: g or g + 8) of this warp's m-tile m.
    const i64 wrow = q0 + warp * 16 * MT + g;
    const u32 base = shared_address(tiles);
    const u32 qs = base + (u32)(4 * TILE) * 2;

    i64 kend = nk;
    if (causal) {
        i64 qlast = q0 + ROWS - 1 < nq ? q0 + ROWS - 1 : nq - 1;
        i64 e = qlast + (nk - nq) + 1;
        kend = e < 0 ? 0 : (e < nk ? e : nk);
    }
    const i64 tiles_n = (kend + KEYS - 1) / KEYS;

    // Queues the copy of tile `i` (keys and values; zeros past the last key) into stage i % 2.
    auto load = [&](i64 i) {
        const u32 ks = base + (u32)((i & 1) * 2 * TILE) * 2, vs = ks + TILE * 2;
        for (int c = threadIdx.x; c < KEYS * CHUNKS; c += blockDim.x) {
            const int j = c / CHUNKS, col = (c - j * CHUNKS) * 8;
            const i64 kj = i * KEYS + j;
            const bool in = kj < nk;
            const i64 at = (in ? kj : 0) * D + col;
            const u32 off = (u32)(j * STRIDE + col) * 2;
            copy16(ks + off, kh + at, in ? 16 : 0);
            copy16(vs + off, vh + at, in ? 16 : 0);
        }
        copies_commit();
    };
    if (tiles_n > 0) {
        if (QS) {
            // The block's q rows (zeros past the last query), in the same group of copies as tile 0.
            for (int c = threadIdx.x; c < ROWS * CHUNKS; c += blockDim.x) {
                const int j = c / CHUNKS, col = (c - j * CHUNKS) * 8;
                const bool in = q0 + j < nq;
                copy16(qs + (u32)(j * STRIDE + col) * 2, qh + (in ? q0 + j : 0) * D + col, in ? 16 : 0);
            }
        }
        load(0);
    }

    // Without QS, this warp's q rows as A fragments, straight from global memory (zeros past the last query).
    u32 qa[QS ? 1 : KS][4];
    if constexpr (!QS) {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            int c = s * 16 + 2 * t;
            qa[s][0] = wrow < nq ? *(const u32*)(qh + wrow * D + c) : 0u;
            qa[s][1] = wrow + 8 < nq ? *(const u32*)(qh + (wrow + 8) * D + c) : 0u;
            qa[s][2] = wrow < nq ? *(const u32*)(qh + wrow * D + c + 8) : 0u;
            qa[s][3] = wrow + 8 < nq ? *(const u32*)(qh + (wrow + 8) * D + c + 8) : 0u;
        }
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
    // Running maximum and sum of rows g (index 0) and g + 8 (index 1) of each m-tile.
    float mx[MT][2], sum[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) mx[m][0] = mx[m][1] = NEG_INF, sum[m][0] = sum[m][1] = 0.0f;
    // Keys past the last one every row sees, counted from k0 = 0: row wrow + x sees keys up to
    // causal_end + x − 1 (without a mask, all nk).
    const i64 causal_end = wrow + (nk - nq) + 1;
    const float scale2 = scale * 1.4426950408889634f;  // log2(e): exp(x) = exp2(x·log2 e)

    // ldmatrix row addresses (lane l gives row l % 8 of matrix l / 8):
    // kᵀ: matrix i of k-steps s, s + 1 is keys 8n + (l % 8), features 16s + 8i ..;
    // v: matrix i of k-step s, column tiles n, n + 1 is keys 16s + 8(i & 1) + (l % 8), features 8(n + i / 2) ..;
    // q (A of a 16 × 16 k-step): matrix i is rows 8(i & 1) + (l % 8), features 16s + 8(i / 2) .., the same
    // pattern as v's.
    const int lr = lane & 7, li = lane >> 3;
    const u32 k_lane = (u32)(lr * STRIDE + li * 8) * 2;
    const u32 v_lane = (u32)(((li & 1) * 8 + lr) * STRIDE + (li >> 1) * 8) * 2;
    const u32 q_lane = qs + v_lane + (u32)(warp * 16 * MT * STRIDE) * 2;

    for (i64 i = 0; i < tiles_n; ++i) {
        const i64 k0 = i * KEYS;
        if (i + 1 < tiles_n) {
            load(i + 1);
            copies_wait<1>();
        } else {
            copies_wait<0>();
        }
        __syncthreads();  // tile i (and with QS, q) is in shared memory for every warp
        const u32 ks = base + (u32)((i & 1) * 2 * TILE) * 2, vs = ks + TILE * 2;

        // Scores: per m-tile KEYS / 8 tiles of 8 keys, each a 16 × 8 C fragment; two k-steps at a time, each B
        // fragment of kᵀ serving every m-tile.
        float sc[MT][KEYS / 8][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < KEYS / 8; ++n) sc[m][n][0] = sc[m][n][1] = sc[m][n][2] = sc[m][n][3] = 0.0f;
        if constexpr (QS) {
#pragma unroll
            for (int s = 0; s < KS; s += 2) {
                u32 a[MT][2][4];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    ldmatrix_x4(a[m][0], q_lane + (u32)(m * 16 * STRIDE + s * 16) * 2);
                    ldmatrix_x4(a[m][1], q_lane + (u32)(m * 16 * STRIDE + (s + 1) * 16) * 2);
                }
#pragma unroll
                for (int n = 0; n < KEYS / 8; ++n) {
                    u32 kb[4];
                    ldmatrix_x4(kb, ks + k_lane + (u32)(n * 8 * STRIDE + s * 16) * 2);
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        mma16816<F16>(sc[m][n], a[m][0], kb[0], kb[1]);
                        mma16816<F16>(sc[m][n], a[m][1], kb[2], kb[3]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < KEYS / 8; ++n) {
#pragma unroll
                for (int s = 0; s < KS; s += 2) {
                    u32 kb[4];
                    ldmatrix_x4(kb, ks + k_lane + (u32)(n * 8 * STRIDE + s * 16) * 2);
                    mma16816<F16>(sc[0][n], qa[s], kb[0], kb[1]);
                    mma16816<F16>(sc[0][n], qa[s + 1], kb[2], kb[3]);
                }
            }
        }

        // Per m-tile: the mask (each row sees the tile's first `seen` keys), the online softmax of rows g
        // (elements 0, 1) and g + 8 (elements 2, 3), the probabilities as A fragments of p·v.
        u32 pa[MT][KEYS / 16][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            int seen[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // Within ±2³¹: the host sends this kernel fewer than 2³⁰ queries and keys.
                const int rs = (int)((causal ? min(causal_end + m * 16 + r * 8, nk) : nk) - k0);
                seen[r] = rs < 0 ? 0 : (rs > KEYS ? KEYS : rs);
            }
            float tmax[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int n = 0; n < KEYS / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = n * 8 + 2 * t + (e & 1);
                    const float s2 = j < seen[e >> 1] ? sc[m][n][e] * scale2 : NEG_INF;
                    sc[m][n][e] = s2;
                    tmax[e >> 1] = fmaxf(tmax[e >> 1], s2);
                }
            }
            float corr[2], base2[2], tsum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
#pragma unroll
                for (int lanes = 1; lanes < 4; lanes <<= 1)
                    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(FULL_MASK, tmax[r], lanes));
                const float now = fmaxf(mx[m][r], tmax[r]);
                base2[r] = now == NEG_INF ? 0.0f : now;
                corr[r] = exp2f(mx[m][r] - base2[r]);
                mx[m][r] = now;
            }
#pragma unroll
            for (int n = 0; n < KEYS / 8; ++n) {
                const float p0 = exp2f(sc[m][n][0] - base2[0]), p1 = exp2f(sc[m][n][1] - base2[0]);
                const float p2 = exp2f(sc[m][n][2] - base2[1]), p3 = exp2f(sc[m][n][3] - base2[1]);
                tsum[0] += p0 + p1;
                tsum[1] += p2 + p3;
                // Tile n is keys 8n .. 8n + 7: the low (n even) or high (n odd) half of k-step n / 2.
                pa[m][n / 2][(n & 1) * 2 + 0] = pack2<F16>(p0, p1);
                pa[m][n / 2][(n & 1) * 2 + 1] = pack2<F16>(p2, p3);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
#pragma unroll
                for (int lanes = 1; lanes < 4; lanes <<= 1)
                    tsum[r] += __shfl_xor_sync(FULL_MASK, tsum[r], lanes);
                sum[m][r] = sum[m][r] * corr[r] + tsum[r];
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                acc[m][n][0] *= corr[0];
                acc[m][n][1] *= corr[0];
                acc[m][n][2] *= corr[1];
                acc[m][n][3] *= corr[1];
            }
        }

        // p·v: k-steps of 16 keys; each ldmatrix.x4.trans gives the B fragments of two column tiles, for every
        // m-tile.
#pragma unroll
        for (int s = 0; s < KEYS / 16; ++s) {
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                u32 vb[4];
                ldmatrix_x4_trans(vb, vs + v_lane + (u32)(s * 16 * STRIDE + n * 8) * 2);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    mma16816<F16>(acc[m][n], pa[m][s], vb[0], vb[1]);
                    mma16816<F16>(acc[m][n + 1], pa[m][s], vb[2], vb[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with stage i % 2 before tile i + 2 is copied into it
    }

    // Rows past the last query are not written; a row that saw no key is zeros.
    u16* oh = o + ((i64)b * hq + h) * nq * D;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        const i64 row0 = wrow + m * 16, row1 = row0 + 8;
        const float inv0 = sum[m][0] > 0.0f ? 1.0f / sum[m][0] : 0.0f;
        const float inv1 = sum[m][1] > 0.0f ? 1.0f / sum[m][1] : 0.0f;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            int c = n * 8 + 2 * t;
            if (row0 < nq) *(u32*)(oh + row0 * D + c) = pack2<F16>(acc[m][n][0] * inv0, acc[m][n][1] * inv0);
            if (row1 < nq) *(u32*)(oh + row1 * D + c) = pack2<F16>(acc[m][n][2] * inv1, acc[m][n][3] * inv1);
        }
    }
}

// One m-tile per warp (64 query rows a block, q in registers; 68 KB of shared memory at D = 128).
extern "C" __launch_bounds__(128, MMA_MIN_BLOCKS) __global__ void attention_mma_64(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                            i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<64, true, 1, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<64, false, 1, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}

extern "C" __launch_bounds__(128, MMA_MIN_BLOCKS) __global__ void attention_mma_128(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                             i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<128, true, 1, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<128, false, 1, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}

// Two m-tiles per warp (128 query rows a block, FlashAttention-2's shape): every B fragment of k and v read from
// shared memory feeds two products; q's fragments are read from shared memory too, once per key tile, so the
// shared-memory reads per product fall by 25 % at D = 128 and 37.5 % at D = 64. 68 KB of shared memory at D = 128
// (32-key tiles), 55 KB at 64; about 255 registers, so two blocks (8 warps) an SM.
extern "C" __launch_bounds__(128, 2) __global__ void attention_mma2_64(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                            i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<64, true, 2, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<64, false, 2, MMA_KEYS>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}

extern "C" __launch_bounds__(128, 2) __global__ void attention_mma2_128(const u16* q, const u16* k, const u16* v, u16* o, int dt, int hq, int hkv,
                                             i64 nq, i64 nk, float scale, int causal) {
    if (dt == DT_F16) attention_mma<128, true, 2, MMA2_KEYS_128>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
    else attention_mma<128, false, 2, MMA2_KEYS_128>(q, k, v, o, hq, hkv, nq, nk, scale, causal);
}
