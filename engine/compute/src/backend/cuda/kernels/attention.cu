// Attention: the flash kernel (softmax(q·kᵀ·scale + mask)·v with an online softmax, O(N) memory, f32 accumulation)
// and the GEMM path's row softmax (attention_softmax, at the end; attention.rs says which runs when).
//
// Grid (ceil(Nq / QB), Hq, B); block = `warps` warps; QB = warps × ATT_R query rows, ATT_R per warp. Each step loads
// a tile of ATT_BK = 32 keys and values into shared memory as f32; lane j of a warp scores key j against the warp's
// rows, the row maximum and sum come from warp reductions, and each lane accumulates the output features
// lane, lane + 32, … (Dv ≤ 256). Keys are stored with an odd row stride so the lanes' reads hit distinct banks.
// Causal: query i sees keys 0 ..= i + (Nk − Nq); a row that sees no key is written as zeros.
// Dynamic shared memory: (QB·D + ATT_BK·(D | 1) + ATT_BK·Dv) floats.

#define ATT_R 4
#define ATT_BK 32
#define ATT_DV_CHUNKS 8  // 256 / 32

extern "C" __global__ void attention(const void* q, const void* k, const void* v, void* o, int qdt, int kdt, int vdt, int hq, int hkv,
                                     i64 nq, i64 nk, int d, int dv, float scale, int causal) {
    extern __shared__ float smem[];
    const int warps = blockDim.x >> 5;
    const int qb = warps * ATT_R;
    const int kstride = d | 1;
    float* qs = smem;
    float* ks = qs + qb * d;
    float* vs = ks + ATT_BK * kstride;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (hq / hkv);
    const i64 q0 = (i64)blockIdx.x * qb;
    const i64 qbase = ((i64)b * hq + h) * nq;
    const i64 kbase = ((i64)b * hkv + hk) * nk;

    for (int i = threadIdx.x; i < qb * d; i += blockDim.x) {
        int r = i / d, c = i - r * d;
        i64 qi = q0 + r;
        qs[i] = qi < nq ? ld(q, qdt, (qbase + qi) * d + c) * scale : 0.0f;
    }

    float m[ATT_R], l[ATT_R], acc[ATT_R][ATT_DV_CHUNKS];
#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_DV_CHUNKS; ++c) acc[r][c] = 0.0f;
    }

    i64 qlast = q0 + qb < nq ? q0 + qb - 1 : nq - 1;
    i64 kend = nk;
    if (causal) {
        i64 e = qlast + (nk - nq) + 1;
        kend = e < nk ? e : nk;
        if (kend < 0) kend = 0;
    }
    const float* qrow = qs + warp * ATT_R * d;

    for (i64 k0 = 0; k0 < kend; k0 += ATT_BK) {
        __syncthreads();  // the previous tile is consumed (first pass: the query tile is written)
        for (int i = threadIdx.x; i < ATT_BK * d; i += blockDim.x) {
            int j = i / d, c = i - j * d;
            i64 kj = k0 + j;
            ks[j * kstride + c] = kj < nk ? ld(k, kdt, (kbase + kj) * d + c) : 0.0f;
        }
        for (int i = threadIdx.x; i < ATT_BK * dv; i += blockDim.x) {
            int j = i / dv, c = i - j * dv;
            i64 kj = k0 + j;
            vs[i] = kj < nk ? ld(v, vdt, (kbase + kj) * dv + c) : 0.0f;
        }
        __syncthreads();

        float s[ATT_R];
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) s[r] = 0.0f;
        const float* krow = ks + lane * kstride;
        for (int c = 0; c < d; ++c) {
            float kv = krow[c];
#pragma unroll
            for (int r = 0; r < ATT_R; ++r) s[r] += qrow[r * d + c] * kv;
        }

        const i64 kj = k0 + lane;
        float p[ATT_R];
#pragma unroll
        for (int r = 0; r < ATT_R; ++r) {
            i64 qi = q0 + warp * ATT_R + r;
            bool ok = kj < nk && qi < nq && (!causal || kj <= qi + (nk - nq));
            float sr = ok ? s[r] : NEG_INF;
            float mnew = fmaxf(m[r], warp_max(sr));
            p[r] = ok ? expf(sr - mnew) : 0.0f;
            float corr = m[r] == NEG_INF ? 0.0f : expf(m[r] - mnew);
            l[r] = l[r] * corr + warp_sum(p[r]);
            m[r] = mnew;
#pragma unroll
            for (int c = 0; c < ATT_DV_CHUNKS; ++c) acc[r][c] *= corr;
        }

        for (int j = 0; j < ATT_BK; ++j) {
            const float* vrow = vs + j * dv;
            float vv[ATT_DV_CHUNKS];
#pragma unroll
            for (int c = 0; c < ATT_DV_CHUNKS; ++c) {
                int col = lane + 32 * c;
                vv[c] = col < dv ? vrow[col] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < ATT_R; ++r) {
                float pj = __shfl_sync(FULL_MASK, p[r], j);
#pragma unroll
                for (int c = 0; c < ATT_DV_CHUNKS; ++c) acc[r][c] += pj * vv[c];
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ATT_R; ++r) {
        i64 qi = q0 + warp * ATT_R + r;
        if (qi >= nq) continue;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_DV_CHUNKS; ++c) {
            int col = lane + 32 * c;
            if (col < dv) st(o, qdt, (qbase + qi) * dv + col, acc[r][c] * inv);
        }
    }
}

// The GEMM path's softmax (attention.rs): `rows` rows of f32 scores `s` (nk of them, rows `ld` apart; the chunk
// holds `per_head` rows of each head, so row r is query q0 + r % per_head) → probabilities `p` (the same layout)
// in `dt`: softmax(s·scale) over the keys the query sees (every key, or with `causal` keys 0 ..= qi + (Nk − Nq)),
// zeros at the others and across a row that sees none (as `attention`).
extern "C" __global__ void attention_softmax(const float* s, void* p, int dt, i64 rows, i64 per_head, i64 nk, i64 ld,
                                             i64 nq, i64 q0, float scale, int causal) {
    __shared__ float scratch[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* sr = s + row * ld;
        i64 seen = nk;
        if (causal) {
            i64 e = q0 + row % per_head + (nk - nq) + 1;
            seen = e < 0 ? 0 : (e < nk ? e : nk);
        }
        float m = NEG_INF;
        for (i64 c = threadIdx.x; c < seen; c += blockDim.x) m = fmaxf(m, sr[c] * scale);
        m = block_max(m, scratch);
        float sum = 0.0f;
        for (i64 c = threadIdx.x; c < seen; c += blockDim.x) sum += expf(sr[c] * scale - m);
        sum = block_sum(sum, scratch);
        float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (i64 c = threadIdx.x; c < nk; c += blockDim.x) {
            st(p, dt, row * ld + c, c < seen ? expf(sr[c] * scale - m) * inv : 0.0f);
        }
    }
}
