//! The device nodes compute on and its memory manager: chosen once at startup (CUDA when built in, asked for
//! and present; otherwise the CPU, with one log line saying why) and shared by the worker and the server's
//! memory routes (`/system_stats`, `/free`).

use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::memory::pins::PinConfig;
use kiln_compute::memory::{DeviceMemory, ManagerConfig, MemoryManager};
use kiln_compute::select::{Device, Selection, select};

/// Simulated device memory of the CPU backend. On the CPU, "VRAM" residency buys no speed (the pinned pool is
/// already RAM), so it is kept small: enough for the memory manager's policies, little RAM counted twice.
const CPU_DEVICE_MEMORY: u64 = 2 << 30;

/// How to choose and budget the device (ComfyUI's `--cpu`, `--cuda-device`, `--reserve-vram`,
/// `--disable-pinned-memory`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeOptions {
    /// Use the CPU even when CUDA is available.
    pub force_cpu: bool,
    /// The CUDA device to use.
    pub cuda_device: usize,
    /// Device memory left free for others, in bytes; `None` keeps the memory manager's default headroom
    /// (ComfyUI's dynamic VRAM default, 256 MiB).
    pub reserve: Option<u64>,
    /// Keep weights in page-locked host memory. Ignored on the CPU, which never pins: there the pinned pool
    /// would be a second copy of every model in RAM, buying nothing (no DMA); weights stream from their files.
    pub pinned_memory: bool,
    /// The RAM-pressure cache's active threshold in bytes (0 in the other cache modes): pins leave half of it
    /// (at least 2 GiB) of RAM available.
    pub ram_cache_headroom: u64,
    /// Where compiled CUDA kernels are kept between runs (`None`: not kept); `KILN_CUDA_KERNEL_CACHE`, when set,
    /// overrides it (empty: not kept).
    pub kernel_cache: Option<std::path::PathBuf>,
}

impl Default for ComputeOptions {
    fn default() -> Self {
        ComputeOptions {
            force_cpu: false,
            cuda_device: 0,
            reserve: None,
            pinned_memory: true,
            ram_cache_headroom: 0,
            kernel_cache: None,
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
    /// Bytes the memory manager holds (weights, scratch, activations).
    pub held: u64,
}

/// The device memory of a device.
fn memory_of(device: &Device) -> Arc<dyn DeviceMemory> {
    match device {
        Device::Cpu(cpu) => cpu.memory().clone(),
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => cuda.memory().clone(),
    }
}

/// The selected device and its memory manager.
pub struct Compute {
    device: Device,
    manager: Arc<MemoryManager>,
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
        #[cfg(feature = "cuda")]
        if let Some(dir) = &options.kernel_cache {
            kiln_compute::backend::cuda::set_kernel_cache(Some(dir.clone()));
        }
        let (mut device, _reason) = select(&selection);
        let on_cpu = matches!(device, Device::Cpu(_));
        let mut config = ManagerConfig::for_this_machine(options.pinned_memory && !on_cpu);
        if let Some(reserve) = options.reserve {
            config.vram.headroom = reserve;
        }
        config.pins.ram_cache_headroom = options.ram_cache_headroom;
        let manager = match MemoryManager::new(memory_of(&device), config.clone()) {
            Ok(manager) => manager,
            Err(e) => {
                // A device that cannot host the manager (a driver without virtual memory management, say) is
                // not one to compute on.
                tracing::warn!(error = %e, "the memory manager cannot run on {}; computing on the CPU", device.kind());
                let cpu = kiln_compute::backend::cpu::Cpu::new(CPU_DEVICE_MEMORY);
                device = Device::Cpu(Arc::new(cpu));
                config.pins = PinConfig::disabled();
                MemoryManager::new(memory_of(&device), config).unwrap_or_else(|e| {
                    panic!("the CPU's simulated device refused the memory manager: {e}")
                })
            }
        };
        // Activations go through the arbiter too, so the budget sees them and an allocation evicts weights
        // rather than failing (memory-manager.md §2.3).
        match &device {
            Device::Cpu(cpu) => cpu.set_allocator(manager.arbiter().clone()),
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => cuda.set_allocator(manager.arbiter().clone()),
        }
        Compute { device, manager }
    }

    /// The memory manager every model loads through.
    pub fn manager(&self) -> &Arc<MemoryManager> {
        &self.manager
    }

    /// The device chosen.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Unloads every model: their weights leave device memory and their pinned host memory is released
    /// (`/free` with `unload_models`).
    pub fn unload_models(&self) {
        match self.manager.unload_all() {
            Ok(freed) => tracing::info!(freed, "unloaded every model"),
            Err(e) => tracing::warn!(error = %e, "unloading the models failed"),
        }
    }

    /// The device's name, memory and budget now.
    pub fn report(&self) -> DeviceReport {
        let (kind, index, name) = match &self.device {
            Device::Cpu(_) => ("cpu", None, "cpu".to_owned()),
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => {
                let info = cuda.info();
                ("cuda", Some(info.index), format!("cuda:{} {}", info.index, info.name))
            }
        };
        let info = self
            .manager
            .memory()
            .mem_info()
            .unwrap_or(kiln_compute::memory::MemInfo { free: 0, total: 0 });
        let stats = self.manager.stats();
        DeviceReport {
            kind,
            index,
            name,
            total: info.total,
            free: info.free,
            budget: stats.budget,
            held: stats.usage,
        }
    }
}
