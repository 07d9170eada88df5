// Elementwise ops: unary functions (`apply_unary`, in common.cu), binary ops with broadcasting, affine, the gated
// MLP activation, scale/shift modulation and a per-channel bias add. All compute in f32 and round once on store.

extern "C" __global__ void unary(const void* x, void* out, int dt, i64 n, int op) {
    GRID_STRIDE(i, n) { st(out, dt, i, apply_unary(op, dt, ld(x, dt, i))); }
}

// out (shape `dims`, rank `rank`) = a op b, where a and b are read at strides `as` and `bs` per output dimension
// (0 where they broadcast).
extern "C" __global__ void binary(const void* a, int adt, const void* b, int bdt, void* out, int odt, i64 n, int rank,
                                  Dims8 dims, Dims8 as, Dims8 bs, int op) {
    GRID_STRIDE(i, n) {
        i64 rem = i, ai = 0, bi = 0;
        for (int d = rank - 1; d >= 0; --d) {
            i64 size = (i64)dims.v[d];
            i64 c = imod(rem, size);
            rem = idiv(rem, size);
            ai += c * (i64)as.v[d];
            bi += c * (i64)bs.v[d];
        }
        float x = ld(a, adt, ai), y = ld(b, bdt, bi), r;
        switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        default: r = x / y; break;
        }
        st(out, odt, i, r);
    }
}

extern "C" __global__ void affine(const void* x, void* out, int dt, i64 n, float mul, float add) {
    GRID_STRIDE(i, n) { st(out, dt, i, ld(x, dt, i) * mul + add); }
}

extern "C" __global__ void gated(const void* gate, int gdt, const void* up, int udt, void* out, i64 n, int op) {
    GRID_STRIDE(i, n) { st(out, gdt, i, apply_unary(op, gdt, ld(gate, gdt, i)) * ld(up, udt, i)); }
}

// x [B, N, D] · (1 + scale[b, d]) + shift[b, d]; `shift` may be null.
extern "C" __global__ void modulate(const void* x, int xdt, const void* scale, int sdt, const void* shift, int hdt,
                                    void* out, i64 batch, i64 tokens, i64 dim) {
    i64 n = batch * tokens * dim;
    GRID_STRIDE(i, n) {
        i64 d = imod(i, dim);
        i64 b = idiv(i, tokens * dim);
        i64 p = b * dim + d;
        float v = ld(x, xdt, i) * (1.0f + ld(scale, sdt, p));
        if (shift) v += ld(shift, hdt, p);
        st(out, xdt, i, v);
    }
}

// In place: out[i] += bias[(i / inner) % channels] (a linear's bias with inner = 1, a conv's with inner = H'·W').
extern "C" __global__ void bias_add(void* out, int odt, const void* bias, int bdt, i64 n, i64 channels, i64 inner) {
    GRID_STRIDE(i, n) {
        i64 c = imod(idiv(i, inner), channels);
        // The bias in the output's type first, as ComfyUI casts it to the compute dtype (and as the GEMM epilogue
        // gets it).
        st(out, odt, i, ld(out, odt, i) + round_to(odt, ld(bias, bdt, c)));
    }
}
