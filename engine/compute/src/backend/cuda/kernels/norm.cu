// Normalisations and softmax: a block per row (or per group; a warp per row for short rows; a block per 32
// positions for the channel norm), f32 statistics, two passes for mean and variance.

// One row of RMSNorm: x / sqrt(mean(x^2) + eps) * w (w may be null). The row's `dim` values are shared by the
// threads `first`, `first + step`, …, and `sum` adds a value over all of them (a block's or a warp's reduction).
template <typename Sum>
__device__ __forceinline__ void rms_norm_row(const void* x, int xdt, const void* w, int wdt, void* out, i64 base,
                                             i64 dim, float eps, i64 first, i64 step, Sum sum) {
    float ss = 0.0f;
    for (i64 c = first; c < dim; c += step) {
        const float v = ld(x, xdt, base + c);
        ss += v * v;
    }
    const float inv = 1.0f / sqrtf(sum(ss) / (float)dim + eps);
    for (i64 c = first; c < dim; c += step) {
        float v = ld(x, xdt, base + c) * inv;
        if (w) v *= ld(w, wdt, c);
        st(out, xdt, base + c, v);
    }
}

// One row of LayerNorm (biased variance), optional affine w and b; threads and `sum` as rms_norm_row's.
template <typename Sum>
__device__ __forceinline__ void layer_norm_row(const void* x, int xdt, const void* w, int wdt, const void* b,
                                               int bdt, void* out, i64 base, i64 dim, float eps, i64 first, i64 step,
                                               Sum sum) {
    float s = 0.0f;
    for (i64 c = first; c < dim; c += step) s += ld(x, xdt, base + c);
    const float mean = sum(s) / (float)dim;
    float ss = 0.0f;
    for (i64 c = first; c < dim; c += step) {
        const float d = ld(x, xdt, base + c) - mean;
        ss += d * d;
    }
    const float inv = 1.0f / sqrtf(sum(ss) / (float)dim + eps);
    for (i64 c = first; c < dim; c += step) {
        float v = (ld(x, xdt, base + c) - mean) * inv;
        if (w) v *= ld(w, wdt, c);
        if (b) v += ld(b, bdt, c);
        st(out, xdt, base + c, v);
    }
}

// A block per row (long rows).
extern "C" __global__ void rms_norm(const void* x, int xdt, const void* w, int wdt, void* out, i64 rows, i64 dim,
                                    float eps) {
    __shared__ float scratch[32];
    const auto sum = [&](float v) { return block_sum(v, scratch); };
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x)
        rms_norm_row(x, xdt, w, wdt, out, row * dim, dim, eps, threadIdx.x, blockDim.x, sum);
}

extern "C" __global__ void layer_norm(const void* x, int xdt, const void* w, int wdt, const void* b, int bdt,
                                      void* out, i64 rows, i64 dim, float eps) {
    __shared__ float scratch[32];
    const auto sum = [&](float v) { return block_sum(v, scratch); };
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x)
        layer_norm_row(x, xdt, w, wdt, b, bdt, out, row * dim, dim, eps, threadIdx.x, blockDim.x, sum);
}

// A warp per row, for rows of at most a few thousand values (every hidden state, a head's q or k, a VAE pixel's
// channels): statistics by shuffles alone. With a block per row, a 128-value row left half the block idle and
// waited at six barriers; hundreds of thousands of such rows a call ran a few hundred at a time.
extern "C" __global__ void rms_norm_rows(const void* x, int xdt, const void* w, int wdt, void* out, i64 rows, i64 dim,
                                         float eps) {
    const i64 per_block = blockDim.x >> 5, warps = (i64)gridDim.x * per_block;
    const auto sum = [](float v) { return warp_sum(v); };
    for (i64 row = (i64)blockIdx.x * per_block + (threadIdx.x >> 5); row < rows; row += warps)
        rms_norm_row(x, xdt, w, wdt, out, row * dim, dim, eps, threadIdx.x & 31, 32, sum);
}

extern "C" __global__ void layer_norm_rows(const void* x, int xdt, const void* w, int wdt, const void* b, int bdt,
                                           void* out, i64 rows, i64 dim, float eps) {
    const i64 per_block = blockDim.x >> 5, warps = (i64)gridDim.x * per_block;
    const auto sum = [](float v) { return warp_sum(v); };
    for (i64 row = (i64)blockIdx.x * per_block + (threadIdx.x >> 5); row < rows; row += warps)
        layer_norm_row(x, xdt, w, wdt, b, bdt, out, row * dim, dim, eps, threadIdx.x & 31, 32, sum);
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

// RMSNorm over the channels of x [B, C, S] (dimension 1; S the product of the spatial dims). A block of 32 x
// CN_LANES threads takes a tile of 32 neighbouring positions: lane y of position x sums the squares of channels
// y, y + CN_LANES, ... (a warp reads 32 neighbouring positions of one channel: coalesced), the lanes' partial sums
// meet in shared memory, and each lane writes its channels of x / sqrt(mean(x^2) + eps) * w[c] (w may be null).
// With `act` >= 0 that value, rounded to the type as the norm's output would be, goes through the unary op `act`
// first, as the separate ops compute it. The lanes keep a low-resolution map (few positions, up to a thousand
// channels) from running on a handful of threads.
#define CN_LANES 8

extern "C" __global__ void channel_rms_norm(const void* x, int xdt, const void* w, int wdt, void* out, i64 batch,
                                            i64 channels, i64 spatial, float eps, int act) {
    __shared__ float partial[CN_LANES][32];
    const i64 per_sample = (spatial + 31) / 32, tiles = batch * per_sample;
    for (i64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const i64 b = idiv(tile, per_sample);
        const i64 s = (tile - b * per_sample) * 32 + threadIdx.x;
        const bool inside = s < spatial;
        const i64 base = b * channels * spatial + s;
        float ss = 0.0f;
        if (inside) {
            for (i64 c = threadIdx.y; c < channels; c += CN_LANES) {
                const float v = ld(x, xdt, base + c * spatial);
                ss += v * v;
            }
        }
        partial[threadIdx.y][threadIdx.x] = ss;
        __syncthreads();
        float total = 0.0f;
        for (int lane = 0; lane < CN_LANES; ++lane) total += partial[lane][threadIdx.x];
        const float inv = 1.0f / sqrtf(total / (float)channels + eps);
        if (inside) {
            for (i64 c = threadIdx.y; c < channels; c += CN_LANES) {
                float v = ld(x, xdt, base + c * spatial) * inv;
                if (w) v *= ld(w, wdt, c);
                if (act >= 0) v = apply_unary(act, xdt, round_to(xdt, v));
                st(out, xdt, base + c * spatial, v);
            }
        }
        // Every lane has read the partial sums before the next tile writes them.
        __syncthreads();
    }
}
