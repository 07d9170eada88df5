// im2col for conv2d: one sample's x [C, H, W] -> col [C·kh·kw, P] for the output pixels p0 .. p0 + P (row-major
// over H' × W'), zeros where the window leaves the padded input. A GEMM with the weight [O, C·kh·kw] finishes it.

extern "C" __global__ void im2col(const void* x, void* col, i64 c, i64 h, i64 w, i64 kh, i64 kw, i64 stride,
                                  i64 pad_top, i64 pad_left, i64 wo, i64 p0, i64 np, int esize) {
    i64 n = c * kh * kw * np;
    GRID_STRIDE(i, n) {
        i64 p = i % np;
        i64 row = i / np;
        i64 kx = row % kw, ky = (row / kw) % kh, ch = row / (kw * kh);
        i64 op = p0 + p;
        i64 oy = op / wo, ox = op % wo;
        i64 iy = oy * stride - pad_top + ky, ix = ox * stride - pad_left + kx;
        if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
            if (esize == 4) ((u32*)col)[i] = 0u;
            else if (esize == 2) ((u16*)col)[i] = 0;
            else ((u8*)col)[i] = 0;
        } else {
            mv(col, i, x, (ch * h + iy) * w + ix, esize);
        }
    }
}
