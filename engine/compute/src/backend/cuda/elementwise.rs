//! Elementwise ops on CUDA: unary, binary with numpy broadcasting, affine, gated, modulate (`elementwise.cu`).

use super::Cuda;
use super::kernels::{Arg, Grid, KernelFile, dims8, dtype_code};
use crate::backend::{BinaryOp, UnaryOp};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The kernels' code of a unary op (`OP_*` in common.cu).
pub(crate) fn unary_code(op: UnaryOp) -> i32 {
    match op {
        UnaryOp::Silu => 0,
        UnaryOp::Gelu => 1,
        UnaryOp::GeluTanh => 2,
        UnaryOp::Tanh => 3,
        UnaryOp::Sigmoid => 4,
        UnaryOp::Exp => 5,
        UnaryOp::Neg => 6,
        UnaryOp::Relu => 7,
        UnaryOp::NanToNum => 8,
    }
}

fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    }
}

/// Broadcasts `a` and `b` (numpy rules): the output shape and each input's element strides per output
/// dimension (0 where it repeats), with runs of dimensions that are contiguous in all three merged so the
/// kernel's index arithmetic stays short.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() < rank { 1 } else { s[i + s.len() - rank] };
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let (x, y) = (at(a, i), at(b, i));
        out.push(match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => return None,
        });
    }
    let strides = |s: &[usize]| {
        let mut st = vec![0usize; rank];
        let mut acc = 1;
        for i in (0..rank).rev() {
            let d = at(s, i);
            st[i] = if d == 1 && out[i] != 1 { 0 } else { acc };
            acc *= d;
        }
        st
    };
    let (sa, sb) = (strides(a), strides(b));
    // Merge a dimension into the previous kept one when, for both inputs, a step of the previous one equals a
    // whole run of this one.
    let (mut dims, mut da, mut db): (Vec<usize>, Vec<usize>, Vec<usize>) =
        (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rank {
        if out[i] == 1 {
            continue;
        }
        if let Some(last) = dims.len().checked_sub(1)
            && da[last] == sa[i] * out[i]
            && db[last] == sb[i] * out[i]
        {
            dims[last] *= out[i];
            da[last] = sa[i];
            db[last] = sb[i];
            continue;
        }
        dims.push(out[i]);
        da.push(sa[i]);
        db.push(sb[i]);
    }
    if dims.is_empty() {
        dims.push(1);
        da.push(0);
        db.push(0);
    }
    // The kernel gets the merged dims; the caller uses `out` for the tensor's shape.
    Some((out, dims, [da, db].concat()))
}

impl Cuda {
    pub(crate) fn op_unary(&self, x: &Tensor<Cuda>, op: UnaryOp) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("unary", x.dtype())?;
        let out = self.empty(x.shape().to_vec(), dt)?;
        let n = x.numel();
        self.launch(
            KernelFile::Elementwise,
            "unary",
            Grid::linear(n),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::n(n),
                Arg::I32(unary_code(op)),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_binary(
        &self,
        a: &Tensor<Cuda>,
        b: &Tensor<Cuda>,
        op: BinaryOp,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("binary", a.dtype())?;
        Self::compute_type("binary", b.dtype())?;
        let Some((shape, dims, strides)) = broadcast(a.shape(), b.shape()) else {
            return Err(Error::shape(
                "binary",
                format!("{:?} and {:?} do not broadcast", a.shape(), b.shape()),
            ));
        };
        if dims.len() > 8 {
            return Err(Error::shape(
                "binary",
                format!("{shape:?} has more than 8 broadcast dimensions"),
            ));
        }
        let r = dims.len();
        let out = self.empty(shape, dt)?;
        let n = out.numel();
        self.launch(
            KernelFile::Elementwise,
            "binary",
            Grid::linear(n),
            &[
                Arg::Ptr(a.buf().ptr().0),
                Arg::I32(dtype_code(a.dtype())),
                Arg::Ptr(b.buf().ptr().0),
                Arg::I32(dtype_code(b.dtype())),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::n(n),
                Arg::I32(r as i32),
                dims8(&dims),
                dims8(&strides[..r]),
                dims8(&strides[r..]),
                Arg::I32(binary_code(op)),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_affine(&self, x: &Tensor<Cuda>, mul: f32, add: f32) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("affine", x.dtype())?;
        let out = self.empty(x.shape().to_vec(), dt)?;
        let n = x.numel();
        self.launch(
            KernelFile::Elementwise,
            "affine",
            Grid::linear(n),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::n(n),
                Arg::F32(mul),
                Arg::F32(add),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_gated(
        &self,
        gate: &Tensor<Cuda>,
        up: &Tensor<Cuda>,
        act: UnaryOp,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("gated", gate.dtype())?;
        Self::compute_type("gated", up.dtype())?;
        if gate.shape() != up.shape() {
            return Err(Error::shape(
                "gated",
                format!("gate {:?} and up {:?} differ", gate.shape(), up.shape()),
            ));
        }
        let out = self.empty(gate.shape().to_vec(), dt)?;
        let n = gate.numel();
        self.launch(
            KernelFile::Elementwise,
            "gated",
            Grid::linear(n),
            &[
                Arg::Ptr(gate.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::Ptr(up.buf().ptr().0),
                Arg::I32(dtype_code(up.dtype())),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(n),
                Arg::I32(unary_code(act)),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_modulate(
        &self,
        x: &Tensor<Cuda>,
        scale: &Tensor<Cuda>,
        shift: Option<&Tensor<Cuda>>,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("modulate", x.dtype())?;
        let [b, n, d] = *x.shape() else {
            return Err(Error::shape("modulate", format!("x {:?} is not [B, N, D]", x.shape())));
        };
        let ok = |t: &Tensor<Cuda>| {
            t.dtype().is_compute() && t.numel() == b * d && t.shape().last() == Some(&d)
        };
        if !ok(scale) || shift.is_some_and(|s| !ok(s)) {
            return Err(Error::shape(
                "modulate",
                format!(
                    "x {:?}, scale {:?}, shift {:?}",
                    x.shape(),
                    scale.shape(),
                    shift.map(|s| s.shape())
                ),
            ));
        }
        let out = self.empty(x.shape().to_vec(), dt)?;
        let (sp, sdt) = match shift {
            Some(s) => (s.buf().ptr().0, dtype_code(s.dtype())),
            None => (0, 0),
        };
        self.launch(
            KernelFile::Elementwise,
            "modulate",
            Grid::linear(x.numel()),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::Ptr(scale.buf().ptr().0),
                Arg::I32(dtype_code(scale.dtype())),
                Arg::Ptr(sp),
                Arg::I32(sdt),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(b),
                Arg::n(n),
                Arg::n(d),
            ],
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::broadcast;

    /// The input element the merged index maps output element `i` to, for checking against plain numpy indexing.
    fn source(i: usize, dims: &[usize], strides: &[usize]) -> usize {
        let mut rem = i;
        let mut at = 0;
        for d in (0..dims.len()).rev() {
            at += (rem % dims[d]) * strides[d];
            rem /= dims[d];
        }
        at
    }

    fn reference(i: usize, out: &[usize], input: &[usize]) -> usize {
        let rank = out.len();
        let mut idx = vec![0; rank];
        let mut rem = i;
        for d in (0..rank).rev() {
            idx[d] = rem % out[d];
            rem /= out[d];
        }
        let mut at = 0;
        for (k, &size) in input.iter().enumerate() {
            let d = rank - input.len() + k;
            at = at * size + if size == 1 { 0 } else { idx[d] };
        }
        at
    }

    #[test]
    fn broadcast_strides_address_the_numpy_element() {
        let cases: [(&[usize], &[usize]); 6] = [
            (&[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[2, 1, 4], &[1, 3, 1]),
            (&[5], &[1]),
            (&[2, 3, 1, 4], &[2, 1, 5, 4]),
        ];
        for (a, b) in cases {
            let (out, dims, strides) = broadcast(a, b).expect("broadcasts");
            let r = dims.len();
            let n: usize = out.iter().product();
            assert_eq!(dims.iter().product::<usize>(), n);
            for i in 0..n {
                assert_eq!(
                    source(i, &dims, &strides[..r]),
                    reference(i, &out, a),
                    "{a:?} {b:?} a at {i}"
                );
                assert_eq!(
                    source(i, &dims, &strides[r..]),
                    reference(i, &out, b),
                    "{a:?} {b:?} b at {i}"
                );
            }
        }
        assert_eq!(
            broadcast(&[2, 3, 4], &[2, 3, 4]).expect("same").1,
            vec![24],
            "same shapes merge to one run"
        );
        assert!(broadcast(&[2, 3], &[4]).is_none());
    }
}
