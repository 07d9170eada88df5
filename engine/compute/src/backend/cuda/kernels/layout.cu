// Data movement: concat and slice (a copy between runs of one dimension), pad, permute (and its batched
// transposes), nearest 2x upsampling, patchify and unpatchify, and the embedding gather. Byte moves keep the element
// type; pad and embedding convert.

// dst[o, doff + j, r] = src[o, soff + j, r] for o < outer, j < len, r < inner.
extern "C" __global__ void copy_dim(const void* src, void* dst, i64 outer, i64 len, i64 inner, i64 sdim, i64 soff,
                                    i64 ddim, i64 doff, int esize) {
    i64 n = outer * len * inner;
    GRID_STRIDE(i, n) {
        i64 r = imod(i, inner);
        i64 j = imod(idiv(i, inner), len);
        i64 o = idiv(i, inner * len);
        mv(dst, (o * ddim + doff + j) * inner + r, src, (o * sdim + soff + j) * inner + r, esize);
    }
}

// Pads the middle dimension of src [outer, sdim, inner] to before + sdim + after. mode 0: constant, 1: circular,
// 2: replicate.
extern "C" __global__ void pad(const void* src, void* dst, int dt, i64 outer, i64 sdim, i64 inner, i64 before,
                               i64 after, int mode, float value) {
    i64 ddim = before + sdim + after;
    i64 n = outer * ddim * inner;
    GRID_STRIDE(i, n) {
        i64 r = imod(i, inner);
        i64 j = imod(idiv(i, inner), ddim);
        i64 o = idiv(i, inner * ddim);
        i64 s = j - before;
        if (s < 0 || s >= sdim) {
            if (mode == 0) {
                st(dst, dt, i, value);
                continue;
            }
            if (mode == 1) s = ((s % sdim) + sdim) % sdim;
            else s = s < 0 ? 0 : sdim - 1;
        }
        st(dst, dt, i, ld(src, dt, (o * sdim + s) * inner + r));
    }
}

// out (shape `dims`) [i] = src[sum over d of index_d · strides[d]], strides being the source strides of the
// permuted dimensions.
extern "C" __global__ void permute(const void* src, void* dst, i64 n, int rank, Dims8 dims, Dims8 strides,
                                   int esize) {
    GRID_STRIDE(i, n) {
        i64 rem = i, si = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 size = (i64)dims.v[d];
            si += imod(rem, size) * (i64)strides.v[d];
            rem = idiv(rem, size);
        }
        mv(dst, i, src, si, esize);
    }
}

// dst [batch, cols, rows] = src [batch, rows, cols] transposed through 32 × 32 tiles of shared memory, so both the
// reads and the writes are coalesced (`permute` reads one of them at a stride). Block (32, 8); grid x over column
// tiles, y over row tiles, z over the batch (each looping past the grid's limits).
template <typename T>
__device__ void transpose_tiles(const T* src, T* dst, i64 batch, i64 rows, i64 cols) {
    __shared__ T tile[32][33];
    for (i64 b = blockIdx.z; b < batch; b += gridDim.z) {
        const T* s = src + b * rows * cols;
        T* d = dst + b * rows * cols;
        for (i64 r0 = (i64)blockIdx.y * 32; r0 < rows; r0 += (i64)gridDim.y * 32) {
            for (i64 c0 = (i64)blockIdx.x * 32; c0 < cols; c0 += (i64)gridDim.x * 32) {
                for (int j = threadIdx.y; j < 32; j += 8) {
                    const i64 r = r0 + j, c = c0 + threadIdx.x;
                    if (r < rows && c < cols) tile[j][threadIdx.x] = s[r * cols + c];
                }
                __syncthreads();
                for (int j = threadIdx.y; j < 32; j += 8) {
                    const i64 c = c0 + j, r = r0 + threadIdx.x;
                    if (r < rows && c < cols) d[c * rows + r] = tile[threadIdx.x][j];
                }
                __syncthreads();  // the tile is read before the next one is written
            }
        }
    }
}

extern "C" __global__ void transpose(const void* src, void* dst, i64 batch, i64 rows, i64 cols, int esize) {
    if (esize == 4) transpose_tiles((const u32*)src, (u32*)dst, batch, rows, cols);
    else if (esize == 2) transpose_tiles((const u16*)src, (u16*)dst, batch, rows, cols);
    else transpose_tiles((const u8*)src, (u8*)dst, batch, rows, cols);
}

// src [planes, H, W] -> dst [planes, 2H, 2W].
extern "C" __global__ void upsample2x(const void* src, void* dst, i64 planes, i64 h, i64 w, int esize) {
    i64 n = planes * 4 * h * w;
    GRID_STRIDE(i, n) {
        i64 x = imod(i, 2 * w);
        i64 y = imod(idiv(i, 2 * w), 2 * h);
        i64 pl = idiv(i, 4 * h * w);
        mv(dst, i, src, (pl * h + y / 2) * w + x / 2, esize);
    }
}

// x [B, C, H, W] -> tokens [B, (H/p)(W/p), p·p·C], feature (py·p + px)·C + c of token (r, s) = x[c, p·r + py, p·s + px].
extern "C" __global__ void patchify(const void* src, void* dst, i64 batch, i64 c, i64 h, i64 w, i64 p, int esize) {
    i64 wp = w / p;
    i64 tokens = (h / p) * wp;
    i64 feats = p * p * c;
    i64 n = batch * tokens * feats;
    GRID_STRIDE(i, n) {
        i64 f = imod(i, feats);
        i64 t = imod(idiv(i, feats), tokens);
        i64 b = idiv(i, feats * tokens);
        i64 ch = imod(f, c), px = imod(idiv(f, c), p), py = idiv(f, c * p);
        i64 y = idiv(t, wp) * p + py, x = imod(t, wp) * p + px;
        mv(dst, i, src, ((b * c + ch) * h + y) * w + x, esize);
    }
}

// The inverse of patchify: tokens [B, (H/p)(W/p), p·p·C] -> x [B, C, H, W].
extern "C" __global__ void unpatchify(const void* src, void* dst, i64 batch, i64 c, i64 h, i64 w, i64 p, int esize) {
    i64 wp = w / p;
    i64 tokens = (h / p) * wp;
    i64 feats = p * p * c;
    i64 n = batch * c * h * w;
    GRID_STRIDE(i, n) {
        i64 x = imod(i, w);
        i64 y = imod(idiv(i, w), h);
        i64 ch = imod(idiv(i, w * h), c);
        i64 b = idiv(i, w * h * c);
        i64 t = idiv(y, p) * wp + idiv(x, p);
        i64 f = (imod(y, p) * p + imod(x, p)) * c + ch;
        mv(dst, i, src, (b * tokens + t) * feats + f, esize);
    }
}

// out[i, :] = table[ids[i], :] converted to the output type.
extern "C" __global__ void embedding(const u32* ids, const void* table, int tdt, void* out, int odt, i64 count,
                                     i64 dim) {
    i64 n = count * dim;
    GRID_STRIDE(i, n) {
        i64 row = idiv(i, dim), col = imod(i, dim);
        st(out, odt, i, ld(table, tdt, (i64)ids[row] * dim + col));
    }
}
