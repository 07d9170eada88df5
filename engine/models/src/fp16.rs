//! ComfyUI's guard on f16 activations (`torch.nan_to_num` in FLUX's blocks, `clamp_fp16` in Lumina 2's):
//! a network computing in f16 keeps its streams finite where ComfyUI's does.

use kiln_compute::backend::UnaryOp;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::Result;

/// `x` with NaN as 0 and ±∞ as ±65504 when it is f16 (`nan_to_num`); activations of other types pass as they
/// are.
pub(crate) fn finite_in_f16<B: Backend>(b: &B, x: Tensor<B>) -> Result<Tensor<B>> {
    if x.dtype() == DType::F16 { Ok(b.unary(&x, UnaryOp::NanToNum)?) } else { Ok(x) }
}
