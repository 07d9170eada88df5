//! Running model code on the device the process chose: model code is generic over the backend, the device
//! is picked at run time, and [`on_device`] joins the two.

use kiln_compute::Backend;
use kiln_compute::select::Device;

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
