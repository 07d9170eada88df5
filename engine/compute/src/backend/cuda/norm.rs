//! Normalisations and softmax on CUDA (`norm.cu`): statistics in f32; a warp per row for RMS and layer norms of rows
//! up to [`WARP_ROW_MAX`] values, else one block per row or group.

use super::Cuda;
use super::elementwise::unary_code;
use super::kernels::{Arg, Grid, KernelFile, dtype_code};
use crate::backend::UnaryOp;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, Weight};

/// Threads per row block (or per block of eight one-warp rows).
const THREADS: u32 = 256;
/// The longest row a warp normalises alone (`rms_norm_rows`, `layer_norm_rows`): 128 values a lane.
const WARP_ROW_MAX: usize = 4096;
/// Threads a position in `channel_rms_norm`, each summing every `CHANNEL_LANES`-th channel (`CN_LANES` in
/// norm.cu).
pub(super) const CHANNEL_LANES: u32 = 8;

/// A weight's address and type code, or a null pointer.
fn opt(w: Option<&Weight<'_>>) -> (Arg, Arg) {
    match w {
        Some(w) => (Arg::Ptr(w.ptr().0), Arg::I32(dtype_code(w.dtype()))),
        None => (Arg::Ptr(0), Arg::I32(0)),
    }
}

fn check_len(op: &'static str, w: Option<&Weight<'_>>, len: usize) -> Result<()> {
    if let Some(w) = w {
        w.require_unscaled(op)?;
    }
    match w {
        Some(w) if w.numel() != len => {
            Err(Error::shape(op, format!("weight {:?} for {len} features", w.shape())))
        }
        _ => Ok(()),
    }
}

impl Cuda {
    /// Rows and row length of `x` (last dimension).
    fn rows(op: &'static str, x: &Tensor<Cuda>) -> Result<(usize, usize)> {
        let d = *x.shape().last().ok_or_else(|| Error::shape(op, "x has rank 0"))?;
        Ok((x.numel().checked_div(d).unwrap_or(0), d))
    }

    pub(crate) fn op_rms_norm(
        &self,
        x: &Tensor<Cuda>,
        w: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Cuda>> {
        self.row_norm(["rms_norm", "rms_norm_rows"], x, &[w], eps)
    }

    pub(crate) fn op_layer_norm(
        &self,
        x: &Tensor<Cuda>,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Cuda>> {
        self.row_norm(["layer_norm", "layer_norm_rows"], x, &[w, b], eps)
    }

    /// A normalisation of each row (last dimension) of `x` by kernel `op` (a block per row) or, for rows of at
    /// most [`WARP_ROW_MAX`] values, `warp_op` (a warp per row); their parameters are x, its type code, a pointer
    /// and type code per `affine` tensor (each `[d]` or absent), out, rows, d and eps.
    fn row_norm(
        &self,
        [op, warp_op]: [&'static str; 2],
        x: &Tensor<Cuda>,
        affine: &[Option<&Weight<'_>>],
        eps: f32,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type(op, x.dtype())?;
        let (rows, d) = Self::rows(op, x)?;
        for &w in affine {
            check_len(op, w, d)?;
        }
        let out = self.empty(x.shape().to_vec(), dt)?;
        let mut args = vec![Arg::Ptr(x.buf().ptr().0), Arg::I32(dtype_code(dt))];
        for &w in affine {
            let (p, t) = opt(w);
            args.extend([p, t]);
        }
        args.extend([Arg::Ptr(out.buf().ptr().0), Arg::n(rows), Arg::n(d), Arg::F32(eps)]);
        if d <= WARP_ROW_MAX {
            let grid = Grid::rows(rows.div_ceil((THREADS / 32) as usize), THREADS);
            self.launch(KernelFile::Norm, warp_op, grid, &args)?;
        } else {
            self.launch(KernelFile::Norm, op, Grid::rows(rows, THREADS), &args)?;
        }
        Ok(out)
    }

    /// RMSNorm over the channels of `x` `[B, C, spatial..]`, then `act` (see
    /// [`crate::Backend::channel_rms_norm`]): a block per tile of 32 positions, [`CHANNEL_LANES`] threads a
    /// position each summing a share of its channels, read at the spatial stride (neighbouring threads,
    /// neighbouring positions: every load is coalesced).
    pub(crate) fn op_channel_rms_norm(
        &self,
        x: &Tensor<Cuda>,
        w: Option<&Weight<'_>>,
        eps: f32,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<Cuda>> {
        const OP: &str = "channel_rms_norm";
        let dt = Self::compute_type(OP, x.dtype())?;
        let s = x.shape();
        if s.len() < 2 {
            return Err(Error::shape(OP, format!("x must be [B, C, ..], got {s:?}")));
        }
        let (batch, c) = (s[0], s[1]);
        let spatial: usize = s[2..].iter().product();
        check_len(OP, w, c)?;
        let out = self.empty(s.to_vec(), dt)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let (wp, wdt) = opt(w);
        self.launch(
            KernelFile::Norm,
            OP,
            Grid {
                grid: ((batch * spatial.div_ceil(32)).clamp(1, 65_535) as u32, 1, 1),
                block: (32, CHANNEL_LANES, 1),
                shared: 0,
            },
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                wp,
                wdt,
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(batch),
                Arg::n(c),
                Arg::n(spatial),
                Arg::F32(eps),
                Arg::I32(act.map_or(-1, unary_code)),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_group_norm(
        &self,
        x: &Tensor<Cuda>,
        groups: usize,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("group_norm", x.dtype())?;
        let s = x.shape();
        if s.len() < 2 || groups == 0 || !s[1].is_multiple_of(groups) {
            return Err(Error::shape("group_norm", format!("x {s:?} in {groups} groups")));
        }
        let (batch, c) = (s[0], s[1]);
        let spatial: usize = s[2..].iter().product();
        check_len("group_norm", w, c)?;
        check_len("group_norm", b, c)?;
        let out = self.empty(s.to_vec(), dt)?;
        let (wp, wdt) = opt(w);
        let (bp, bdt) = opt(b);
        self.launch(
            KernelFile::Norm,
            "group_norm",
            Grid::rows(batch * groups, 512),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                wp,
                wdt,
                bp,
                bdt,
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(batch),
                Arg::n(c),
                Arg::n(spatial),
                Arg::n(groups),
                Arg::F32(eps),
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn op_softmax(&self, x: &Tensor<Cuda>) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("softmax", x.dtype())?;
        let (rows, d) = Self::rows("softmax", x)?;
        let out = self.empty(x.shape().to_vec(), dt)?;
        self.launch(
            KernelFile::Norm,
            "softmax",
            Grid::rows(rows, THREADS),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(rows),
                Arg::n(d),
            ],
        )?;
        Ok(out)
    }
}
