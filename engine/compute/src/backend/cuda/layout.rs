//! Data movement on CUDA (`layout.cu`): embedding, concat, slice, pad, permute, upsampling, patchify.

use super::Cuda;
use super::kernels::{Arg, Grid, KernelFile, dims8, dtype_code};
use crate::backend::PadMode;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, Weight, resolve_dim};

/// `shape` around dimension `d`: (product before, size, product after).
fn split(shape: &[usize], d: usize) -> (usize, usize, usize) {
    (shape[..d].iter().product(), shape[d], shape[d + 1..].iter().product())
}

impl Cuda {
    pub(crate) fn op_embedding(&self, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<Cuda>> {
        let (v, d) = table.matrix("embedding")?;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= v) {
            return Err(Error::shape("embedding", format!("id {bad} in a table of {v} rows")));
        }
        let dt = self.dtype;
        let out = self.empty(vec![ids.len(), d], dt)?;
        if ids.is_empty() || d == 0 {
            return Ok(out);
        }
        // A scaled table is dequantized whole first (rows looked up from it), as ComfyUI dequantizes before the
        // lookup outside its quantized-embedding path.
        let (table_ptr, table_dtype, _scratch) = match table.quant() {
            crate::quant::Quant::None => (table.ptr().0, table.dtype(), None),
            _ => {
                let (ptr, scratch) = self.weight_as(table, dt)?;
                (ptr, dt, scratch)
            }
        };
        let dev_ids = self.alloc((ids.len() * 4) as u64)?;
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        self.mem.upload(dev_ids.ptr(), bytes)?;
        self.launch(
            KernelFile::Layout,
            "embedding",
            Grid::linear(ids.len() * d),
            &[
                Arg::Ptr(dev_ids.ptr().0),
                Arg::Ptr(table_ptr),
                Arg::I32(dtype_code(table_dtype)),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::n(ids.len()),
                Arg::n(d),
            ],
        )?;
        Ok(out)
    }

    /// `dst[o, doff + j, r] = src[o, soff + j, r]`.
    #[allow(clippy::too_many_arguments)]
    fn copy_dim(
        &self,
        src: u64,
        dst: u64,
        (outer, len, inner): (usize, usize, usize),
        (sdim, soff): (usize, usize),
        (ddim, doff): (usize, usize),
        esize: usize,
    ) -> Result<()> {
        self.launch(
            KernelFile::Layout,
            "copy_dim",
            Grid::linear(outer * len * inner),
            &[
                Arg::Ptr(src),
                Arg::Ptr(dst),
                Arg::n(outer),
                Arg::n(len),
                Arg::n(inner),
                Arg::n(sdim),
                Arg::n(soff),
                Arg::n(ddim),
                Arg::n(doff),
                Arg::I32(esize as i32),
            ],
        )
    }

    pub(crate) fn op_concat(&self, xs: &[&Tensor<Cuda>], dim: isize) -> Result<Tensor<Cuda>> {
        let first = *xs.first().ok_or_else(|| Error::shape("concat", "no tensors"))?;
        let dt = Self::compute_type("concat", first.dtype())?;
        let rank = first.shape().len();
        let d = resolve_dim(dim, rank)?;
        let mut total = 0;
        for x in xs {
            let same = x.shape().len() == rank
                && x.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(i, (a, b))| i == d || a == b);
            if !same {
                return Err(Error::shape(
                    "concat",
                    format!("{:?} against {:?} on dim {d}", x.shape(), first.shape()),
                ));
            }
            total += x.shape()[d];
        }
        let mut shape = first.shape().to_vec();
        shape[d] = total;
        let out = self.empty(shape, dt)?;
        let (outer, _, inner) = split(first.shape(), d);
        let mut off = 0;
        for x in xs {
            let x = self.op_cast(x, dt)?;
            let len = x.shape()[d];
            self.copy_dim(
                x.buf().ptr().0,
                out.buf().ptr().0,
                (outer, len, inner),
                (len, 0),
                (total, off),
                dt.size(),
            )?;
            off += len;
        }
        Ok(out)
    }

    pub(crate) fn op_slice(
        &self,
        x: &Tensor<Cuda>,
        dim: isize,
        start: usize,
        len: usize,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("slice", x.dtype())?;
        let d = resolve_dim(dim, x.shape().len())?;
        let size = x.shape()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::shape(
                "slice",
                format!("{start}+{len} of dim {d} of {:?}", x.shape()),
            ));
        }
        let mut shape = x.shape().to_vec();
        shape[d] = len;
        let out = self.empty(shape, dt)?;
        let (outer, _, inner) = split(x.shape(), d);
        self.copy_dim(
            x.buf().ptr().0,
            out.buf().ptr().0,
            (outer, len, inner),
            (size, start),
            (len, 0),
            dt.size(),
        )?;
        Ok(out)
    }

    pub(crate) fn op_pad(
        &self,
        x: &Tensor<Cuda>,
        dim: isize,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("pad", x.dtype())?;
        let d = resolve_dim(dim, x.shape().len())?;
        let (outer, size, inner) = split(x.shape(), d);
        let (code, value) = match mode {
            PadMode::Constant(v) => (0, v),
            PadMode::Circular => (1, 0.0),
            PadMode::Replicate => (2, 0.0),
        };
        if code != 0 && size == 0 && before + after > 0 {
            return Err(Error::shape("pad", format!("{mode:?} padding of an empty dimension {d}")));
        }
        let mut shape = x.shape().to_vec();
        shape[d] = before + size + after;
        let out = self.empty(shape, dt)?;
        self.launch(
            KernelFile::Layout,
            "pad",
            Grid::linear(out.numel()),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::n(outer),
                Arg::n(size),
                Arg::n(inner),
                Arg::n(before),
                Arg::n(after),
                Arg::I32(code),
                Arg::F32(value),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_permute(&self, x: &Tensor<Cuda>, perm: &[usize]) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("permute", x.dtype())?;
        let rank = x.shape().len();
        let mut seen = vec![false; rank];
        let valid = perm.len() == rank
            && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(Error::shape("permute", format!("{perm:?} of a rank-{rank} tensor")));
        }
        if rank > 8 {
            return Err(Error::shape("permute", format!("rank {rank} exceeds 8")));
        }
        let mut in_strides = vec![1usize; rank];
        for i in (0..rank.saturating_sub(1)).rev() {
            in_strides[i] = in_strides[i + 1] * x.shape()[i + 1];
        }
        let dims: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
        let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
        let out = self.empty(dims.clone(), dt)?;
        let n = out.numel();
        if let Some((batch, rows, cols)) = batched_transpose(&dims, &strides)
            && rows.min(cols) >= MIN_TILED_SIDE
        {
            let tiles = |v: usize| v.div_ceil(32).clamp(1, 65_535) as u32;
            return self
                .launch(
                    KernelFile::Layout,
                    "transpose",
                    Grid {
                        grid: (tiles(cols), tiles(rows), batch.clamp(1, 65_535) as u32),
                        block: (32, 8, 1),
                        shared: 0,
                    },
                    &[
                        Arg::Ptr(x.buf().ptr().0),
                        Arg::Ptr(out.buf().ptr().0),
                        Arg::n(batch),
                        Arg::n(rows),
                        Arg::n(cols),
                        Arg::I32(dt.size() as i32),
                    ],
                )
                .map(|()| out);
        }
        self.launch(
            KernelFile::Layout,
            "permute",
            Grid::linear(n),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(n),
                Arg::I32(rank as i32),
                dims8(&dims),
                dims8(&strides),
                Arg::I32(dt.size() as i32),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_upsample_nearest2x(&self, x: &Tensor<Cuda>) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("upsample_nearest2x", x.dtype())?;
        let [b, c, h, w] = *x.shape() else {
            return Err(Error::shape(
                "upsample_nearest2x",
                format!("x {:?} is not [B, C, H, W]", x.shape()),
            ));
        };
        let out = self.empty(vec![b, c, 2 * h, 2 * w], dt)?;
        self.launch(
            KernelFile::Layout,
            "upsample2x",
            Grid::linear(out.numel()),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(b * c),
                Arg::n(h),
                Arg::n(w),
                Arg::I32(dt.size() as i32),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_patchify(&self, x: &Tensor<Cuda>, p: usize) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("patchify", x.dtype())?;
        let [b, c, h, w] = *x.shape() else {
            return Err(Error::shape("patchify", format!("x {:?} is not [B, C, H, W]", x.shape())));
        };
        if p == 0 || !h.is_multiple_of(p) || !w.is_multiple_of(p) {
            return Err(Error::shape("patchify", format!("x {:?} with patch {p}", x.shape())));
        }
        let out = self.empty(vec![b, (h / p) * (w / p), p * p * c], dt)?;
        self.patch_kernel("patchify", x, &out, [b, c, h, w], p)?;
        Ok(out)
    }

    pub(crate) fn op_unpatchify(
        &self,
        x: &Tensor<Cuda>,
        p: usize,
        channels: usize,
        h: usize,
        w: usize,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("unpatchify", x.dtype())?;
        let ok = p > 0 && h.is_multiple_of(p) && w.is_multiple_of(p);
        let [b, t, f] = *x.shape() else {
            return Err(Error::shape(
                "unpatchify",
                format!("x {:?} is not [B, tokens, features]", x.shape()),
            ));
        };
        if !ok || t != (h / p) * (w / p) || f != p * p * channels {
            return Err(Error::shape(
                "unpatchify",
                format!("x {:?} as {channels}×{h}×{w} in patches of {p}", x.shape()),
            ));
        }
        let out = self.empty(vec![b, channels, h, w], dt)?;
        self.patch_kernel("unpatchify", x, &out, [b, channels, h, w], p)?;
        Ok(out)
    }

    fn patch_kernel(
        &self,
        name: &'static str,
        x: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        [b, c, h, w]: [usize; 4],
        p: usize,
    ) -> Result<()> {
        self.launch(
            KernelFile::Layout,
            name,
            Grid::linear(out.numel()),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(b),
                Arg::n(c),
                Arg::n(h),
                Arg::n(w),
                Arg::n(p),
                Arg::I32(x.dtype().size() as i32),
            ],
        )
    }
}

/// The shorter side from which a batched transpose goes through the shared-memory tiles (32 × 32). With fewer
/// rows or columns (an image's 3 channels) most of a tile's threads would idle, and the generic kernel's reads
/// already fall in few segments a warp.
const MIN_TILED_SIDE: usize = 16;

/// A permutation that is a batched 2D transpose, as `(batch, rows, cols)`: the output (dims `dims`, read at input
/// strides `strides` per output dimension) is `[batch, cols, rows]` of a contiguous input `[batch, rows, cols]`,
/// once size-1 dimensions are dropped and dimensions contiguous in the input merged (the channel-last and
/// channel-first swaps of the VAEs' norms and attention). `None` for any other permutation, and for a transpose
/// of one row or column (a plain copy).
fn batched_transpose(dims: &[usize], strides: &[usize]) -> Option<(usize, usize, usize)> {
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (&d, &s) in dims.iter().zip(strides).filter(|(d, _)| **d != 1) {
        match merged.last_mut() {
            // The previous dimension steps over exactly this one: one dimension of their product.
            Some((ld, ls)) if *ls == s * d => {
                *ld *= d;
                *ls = s;
            }
            _ => merged.push((d, s)),
        }
    }
    let (batch, (cols, cs), (rows, rs)) = match *merged.as_slice() {
        [c, r] => (1, c, r),
        [(b, bs), c, r] if bs == c.0 * r.0 => (b, c, r),
        _ => return None,
    };
    (cs == 1 && rs == cols).then_some((batch, rows, cols))
}

#[cfg(test)]
mod tests {
    use super::batched_transpose;

    /// The output dims and input strides of permuting a contiguous `shape` by `perm`.
    fn permuted(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let mut strides = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        (perm.iter().map(|&p| shape[p]).collect(), perm.iter().map(|&p| strides[p]).collect())
    }

    #[test]
    fn channel_swaps_are_batched_transposes_and_head_swaps_are_not() {
        let t = |shape: &[usize], perm: &[usize]| {
            let (d, s) = permuted(shape, perm);
            batched_transpose(&d, &s)
        };
        // A VAE's channel RMS norm: [frames, C, H·W] ⇄ [frames, H·W, C].
        assert_eq!(t(&[4, 128, 900], &[0, 2, 1]), Some((4, 128, 900)));
        assert_eq!(t(&[4, 900, 128], &[0, 2, 1]), Some((4, 900, 128)));
        // [B, C, H, W] → [B, H, W, C]: H and W merge into one dimension of rows.
        assert_eq!(t(&[2, 3, 4, 6], &[0, 2, 3, 1]), Some((2, 3, 24)));
        assert_eq!(t(&[5, 7], &[1, 0]), Some((1, 5, 7)));
        // Size-1 dimensions are dropped: one batch, or a plain matrix.
        assert_eq!(t(&[1, 8, 1, 9], &[0, 3, 2, 1]), Some((1, 8, 9)));
        // A DiT's head swap keeps the head's features contiguous: the generic kernel.
        assert_eq!(t(&[2, 100, 24, 128], &[0, 2, 1, 3]), None);
        // Not a transpose of the last two dimensions with the rest in order.
        assert_eq!(t(&[2, 3, 4, 6], &[3, 1, 0, 2]), None);
        assert_eq!(t(&[2, 3, 4], &[1, 0, 2]), None);
        assert_eq!(t(&[2, 3, 4], &[1, 2, 0]), Some((1, 2, 12)));
        // The identity, and a "transpose" of a vector: no tiles needed.
        assert_eq!(t(&[2, 3, 4], &[0, 1, 2]), None);
        assert_eq!(t(&[1, 9], &[1, 0]), None);
    }
}
