// Rotary position embedding of x [B, N, H, D] by cos, sin [N, D/2]: pair m of a head is rotated by angle m, the
// pair being (2m, 2m + 1) when interleaved, else (m, m + D/2) ("rotate_half").

extern "C" __global__ void rope(const void* x, int xdt, const void* cs, const void* sn, int cdt, void* out, i64 batch,
                                i64 tokens, i64 heads, i64 dim, int interleaved) {
    i64 half = dim / 2;
    i64 pairs = batch * tokens * heads * half;
    GRID_STRIDE(i, pairs) {
        i64 m = imod(i, half);
        i64 row = idiv(i, half);  // (b, n, h)
        i64 n = imod(idiv(row, heads), tokens);
        i64 base = row * dim;
        i64 i0 = interleaved ? base + 2 * m : base + m;
        i64 i1 = interleaved ? base + 2 * m + 1 : base + m + half;
        float c = ld(cs, cdt, n * half + m), s = ld(sn, cdt, n * half + m);
        float a = ld(x, xdt, i0), b = ld(x, xdt, i1);
        st(out, xdt, i0, a * c - b * s);
        st(out, xdt, i1, a * s + b * c);
    }
}
