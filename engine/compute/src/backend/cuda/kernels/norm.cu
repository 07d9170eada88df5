// Normalisations and softmax: one block per row (or per group), f32 statistics, two passes for mean and variance.

// RMSNorm over rows of length `dim`: x / sqrt(mean(x^2) + eps) * w (w may be null).
extern "C" __global__ void rms_norm(const void* x, int xdt, const void* w, int wdt, void* out, i64 rows, i64 dim,
                                    float eps) {
    __shared__ float scratch[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 base = row * dim;
        float ss = 0.0f;
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float v = ld(x, xdt, base + c);
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float v = ld(x, xdt, base + c) * inv;
            if (w) v *= ld(w, wdt, c);
            st(out, xdt, base + c, v);
        }
    }
}

// LayerNorm over rows of length `dim` (biased variance), optional affine w and b.
extern "C" __global__ void layer_norm(const void* x, int xdt, const void* w, int wdt, const void* b, int bdt,
                                      void* out, i64 rows, i64 dim, float eps) {
    __shared__ float scratch[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 base = row * dim;
        float s = 0.0f;
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) s += ld(x, xdt, base + c);
        float mean = block_sum(s, scratch) / (float)dim;
        float ss = 0.0f;
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float d = ld(x, xdt, base + c) - mean;
            ss += d * d;
        }
        float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) {
            float v = (ld(x, xdt, base + c) - mean) * inv;
            if (w) v *= ld(w, wdt, c);
            if (b) v += ld(b, bdt, c);
            st(out, xdt, base + c, v);
        }
    }
}

// The same two for rows of at most a few thousand values (every hidden state, a head's q or k, a VAE pixel's
// channels): a warp per row, its statistics by shuffles alone. With a block per row, a 128-value row left half the
// block idle and waited at six barriers; hundreds of thousands of such rows a call ran a few hundred at a time.
extern "C" __global__ void rms_norm_rows(const void* x, int xdt, const void* w, int wdt, void* out, i64 rows, i64 dim,
                                         float eps) {
    const int lane = threadIdx.x & 31;
    const i64 per_block = blockDim.x >> 5, warps = (i64)gridDim.x * per_block;
    for (i64 row = (i64)blockIdx.x * per_block + (threadIdx.x >> 5); row < rows; row += warps) {
        const i64 base = row * dim;
        float ss = 0.0f;
        for (i64 c = lane; c < dim; c += 32) {
            const float v = ld(x, xdt, base + c);
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)dim + eps);
        for (i64 c = lane; c < dim; c += 32) {
            float v = ld(x, xdt, base + c) * inv;
            if (w) v *= ld(w, wdt, c);
            st(out, xdt, base + c, v);
        }
    }
}

extern "C" __global__ void layer_norm_rows(const void* x, int xdt, const void* w, int wdt, const void* b, int bdt,
                                           void* out, i64 rows, i64 dim, float eps) {
    const int lane = threadIdx.x & 31;
    const i64 per_block = blockDim.x >> 5, warps = (i64)gridDim.x * per_block;
    for (i64 row = (i64)blockIdx.x * per_block + (threadIdx.x >> 5); row < rows; row += warps) {
        const i64 base = row * dim;
        float s = 0.0f;
        for (i64 c = lane; c < dim; c += 32) s += ld(x, xdt, base + c);
        const float mean = warp_sum(s) / (float)dim;
        float ss = 0.0f;
        for (i64 c = lane; c < dim; c += 32) {
            const float d = ld(x, xdt, base + c) - mean;
            ss += d * d;
        }
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)dim + eps);
        for (i64 c = lane; c < dim; c += 32) {
            float v = (ld(x, xdt, base + c) - mean) * inv;
            if (w) v *= ld(w, wdt, c);
            if (b) v += ld(b, bdt, c);
            st(out, xdt, base + c, v);
        }
    }
}

// GroupNorm of x [B, C, S] (S = the product of the spatial dims): block (b, g) normalises the contiguous run of
// C/G channels × S values of group g, then applies the per-channel affine.
extern "C" __global__ void group_norm(const void* x, int xdt, const void* w, int wdt, const void* b, int bdt,
                                      void* out, i64 batch, i64 channels, i64 spatial, i64 groups, float eps) {
    __shared__ float scratch[32];
    i64 cpg = channels / groups;
    i64 len = cpg * spatial;
    for (i64 bg = blockIdx.x; bg < batch * groups; bg += gridDim.x) {
        i64 g = imod(bg, groups);
        i64 base = bg * len;
        float s = 0.0f;
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(x, xdt, base + j);
        float mean = block_sum(s, scratch) / (float)len;
        float ss = 0.0f;
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
            float d = ld(x, xdt, base + j) - mean;
            ss += d * d;
        }
        float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)len + eps);
        for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
            i64 c = g * cpg + idiv(j, spatial);
            float v = (ld(x, xdt, base + j) - mean) * inv;
            if (w) v *= ld(w, wdt, c);
            if (b) v += ld(b, bdt, c);
            st(out, xdt, base + j, v);
        }
    }
}

// Softmax over rows of length `dim`.
extern "C" __global__ void softmax(const void* x, int dt, void* out, i64 rows, i64 dim) {
    __shared__ float scratch[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 base = row * dim;
        float m = NEG_INF;
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) m = fmaxf(m, ld(x, dt, base + c));
        m = block_max(m, scratch);
        float s = 0.0f;
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) s += expf(ld(x, dt, base + c) - m);
        float inv = 1.0f / block_sum(s, scratch);
        for (i64 c = threadIdx.x; c < dim; c += blockDim.x) st(out, dt, base + c, expf(ld(x, dt, base + c) - m) * inv);
    }
}
