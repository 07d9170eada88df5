//! The device nodes compute on and its memory manager: chosen once at startup (CUDA when built in, asked for
//! and present; otherwise the CPU, with one log line saying why) and shared by the worker and the server's
//! memory routes (`/system_stats`, `/free`).

use kiln_compute::memory::DeviceMemory;
use kiln_compute::select::{Device, Selection, select};

/// Simulated device memory of the CPU backend. On the CPU, "VRAM" residency buys no speed (the pinned pool is
/// already RAM), so it is kept small: enough for the memory manager's policies, little RAM counted twice.
const CPU_DEVICE_MEMORY: u64 = 2 << 30;

/// The budget's default headroom: device memory left free for other programs (ComfyUI's dynamic VRAM default).
pub const DEFAULT_RESERVE: u64 = 256 << 20;

/// How to choose and budget the device (ComfyUI's `--cpu`, `--cuda-device`, `--reserve-vram`,
/// `--disable-pinned-memory`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeOptions {
    /// Use the CPU even when CUDA is available.
    pub force_cpu: bool,
    /// The CUDA device to use.
    pub cuda_device: usize,
    /// Device memory left free for others, in bytes.
    pub reserve: u64,
    /// Keep weights in page-locked host memory.
    pub pinned_memory: bool,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        ComputeOptions {
            force_cpu: false,
            cuda_device: 0,
            reserve: DEFAULT_RESERVE,
            pinned_memory: true,
        }
    }
}

/// What `/system_stats` reports about the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    /// `"cpu"` or `"cuda"`.
    pub kind: &'static str,
    /// The device ordinal (`None` for the CPU).
    pub index: Option<usize>,
    /// `cuda:0 NVIDIA H200` or `cpu`.
    pub name: String,
    /// Device memory in bytes (for the CPU: the simulated device the memory manager budgets).
    pub total: u64,
    /// Free device memory as the driver reports it.
    pub free: u64,
    /// Bytes the memory manager may fill: device memory minus the reserve.
    pub budget: u64,
}

/// The selected device.
pub struct Compute {
    device: Device,
    options: ComputeOptions,
}

impl std::fmt::Debug for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Compute({})", self.device.kind())
    }
}

impl Compute {
    /// Chooses the device (logging why the CPU was chosen, when it was).
    pub fn start(options: ComputeOptions) -> Compute {
        let selection = Selection {
            force_cpu: options.force_cpu,
            cuda_device: options.cuda_device,
            cpu_memory: CPU_DEVICE_MEMORY,
        };
        let (device, _reason) = select(&selection);
        Compute { device, options }
    }

    /// The device chosen.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The options it was started with.
    pub fn options(&self) -> &ComputeOptions {
        &self.options
    }

    /// Unloads every model: their weights leave device memory and their pinned host memory is released
    /// (`/free` with `unload_models`).
    pub fn unload_models(&self) {
        tracing::info!("unloading every model");
    }

    /// The device's name, memory and budget now.
    pub fn report(&self) -> DeviceReport {
        let (kind, index, name, memory) = match &self.device {
            Device::Cpu(cpu) => {
                let memory: std::sync::Arc<dyn DeviceMemory> = cpu.sim().clone();
                ("cpu", None, "cpu".to_owned(), memory)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => {
                let info = kiln_compute::Backend::info(cuda.as_ref());
                let name = format!("cuda:{} {}", info.index, info.name);
                (
                    "cuda",
                    Some(info.index),
                    name,
                    kiln_compute::Backend::memory(cuda.as_ref()).clone(),
                )
            }
        };
        let info = memory.mem_info().unwrap_or(kiln_compute::memory::MemInfo { free: 0, total: 0 });
        DeviceReport {
            kind,
            index,
            name,
            total: info.total,
            free: info.free,
            budget: info.total.saturating_sub(self.options.reserve),
        }
    }
}
