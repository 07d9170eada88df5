// Elementwise ops: unary functions, binary ops with broadcasting, affine, the gated MLP activation, scale/shift
// modulation and a per-channel bias add. All compute in f32 and round once on store.

#define OP_SILU 0
#define OP_GELU 1
#define OP_GELU_TANH 2
#define OP_TANH 3
#define OP_SIGMOID 4
#define OP_EXP 5
#define OP_NEG 6
#define OP_RELU 7
#define OP_NAN_TO_NUM 8

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The largest finite value of compute type `dt` (what `nan_to_num` turns +inf into).
__device__ __forceinline__ float max_finite(int dt) {
    return dt == DT_F16 ? 65504.0f : dt == DT_BF16 ? 3.3895313892515355e38f : 3.4028234663852886e38f;
}

__device__ __forceinline__ float apply_unary(int op, int dt, float x) {
    switch (op) {
    case OP_SILU: return x * sigmoid(x);
    case OP_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case OP_GELU_TANH: {
        float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
    case OP_TANH: return tanhf(x);
    case OP_SIGMOID: return sigmoid(x);
    case OP_EXP: return expf(x);
    case OP_RELU: return fmaxf(x, 0.0f);
    case OP_NAN_TO_NUM: return isnan(x) ? 0.0f : fminf(fmaxf(x, -max_finite(dt)), max_finite(dt));
    default: return -x;
    }
}

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
        st(out, odt, i, ld(out, odt, i) + ld(bias, bdt, c));
    }
}
