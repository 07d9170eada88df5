// im2col for conv2d: one sample's x [C, H, W] -> col [C·kh·kw, P] for the output pixels p0 .. p0 + P (row-major
// over H' × W'), zeros where the window leaves the padded input. A GEMM with the weight [O, C·kh·kw] finishes it.
// Grid: x over the chunk's pixels, y over the C·kh·kw rows (a row's channel and tap are worked out once per block,
// so an element costs one division, its pixel's row and column).

extern "C" __global__ void im2col(const void* x, void* col, i64 c, i64 h, i64 w, i64 kh, i64 kw, i64 stride,
                                  i64 pad_top, i64 pad_left, i64 wo, i64 p0, i64 np, int esize) {
    const i64 rows = c * kh * kw;
    for (i64 row = blockIdx.y; row < rows; row += gridDim.y) {
        const i64 kx = imod(row, kw), ky = imod(idiv(row, kw), kh), ch = idiv(row, kw * kh);
        const void* plane = (const char*)x + ch * h * w * esize;
        for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < np; p += (i64)gridDim.x * blockDim.x) {
            const i64 op = p0 + p, i = row * np + p;
            const i64 oy = idiv(op, wo), ox = op - oy * wo;
            const i64 iy = oy * stride - pad_top + ky, ix = ox * stride - pad_left + kx;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                if (esize == 4) ((u32*)col)[i] = 0u;
                else if (esize == 2) ((u16*)col)[i] = 0;
                else ((u8*)col)[i] = 0;
            } else {
                mv(col, i, plane, iy * w + ix, esize);
            }
        }
    }
}
