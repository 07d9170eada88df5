//! Running model code on the device the process chose: model code is generic over the backend, the device
//! is picked at run time, and [`on_device`] joins the two; [`to_host`] brings a result back.

use kiln_compute::select::Device;
use kiln_compute::{Backend, DType};

use crate::tensor::Tensor;

/// Work to run on whichever backend the device is.
pub(crate) trait OnDevice {
    /// What the work returns.
    type Output;
    /// Runs on backend `b`.
    fn run<B: Backend>(self, b: &B) -> Self::Output;
}

/// Runs `work` on `device`'s backend.
pub(crate) fn on_device<W: OnDevice>(device: &Device, work: W) -> W::Output {
    match device {
        Device::Cpu(cpu) => work.run(&**cpu),
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => work.run(&**cuda),
    }
}

/// A device tensor on the host, f32.
pub(crate) fn to_host<B: Backend>(
    b: &B,
    t: &kiln_compute::Tensor<B>,
) -> Result<Tensor, kiln_models::Error> {
    let t = b.cast(t, DType::F32)?;
    Tensor::new(t.shape().to_vec(), b.to_f32(&t)?)
        .map_err(|e| kiln_models::Error::Invalid(e.to_string()))
}
