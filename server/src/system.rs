//! The server's facts: `GET /api/system_stats` (the host's memory, the build's versions, the compute devices)
//! and `GET /api/features` (the feature flags, also the websocket `feature_flags` reply).
//!
//! Both carry every field ComfyUI sends, with values that are true for Kiln (see the spec's `SystemInfo` and
//! `FeatureFlags`). RAM figures come from `/proc/meminfo` where it exists (`MemTotal`, `MemAvailable`);
//! elsewhere they are 0, which ComfyUI's frontend shows as unknown rather than failing.

use crate::frontend_package::FRONTEND_VERSION;
use crate::templates::TEMPLATES_VERSION;
use kiln_engine::compute::DeviceReport;
use kiln_engine::kiln_compute::memory::pressure::parse_meminfo;
use kiln_spec::types::{
    DeviceInfo, ExtensionFlags, FeatureFlags, ManagerFlags, PackageVersion, SystemInfo, SystemStats,
};

/// The server's version, reported as `comfyui_version`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Rust version Kiln is built for (the workspace's `rust-version`), reported as `python_version`.
const RUST_VERSION: &str = env!("CARGO_PKG_RUST_VERSION");

/// The ComfyUI frontend package Kiln serves by default and is tested with (version: [`FRONTEND_VERSION`]).
const FRONTEND_PACKAGE: &str = "comfyui-frontend-package";

/// The workflow templates package Kiln serves (version: [`TEMPLATES_VERSION`]).
const TEMPLATES_PACKAGE: &str = "comfyui-workflow-templates";

/// The feature flags: what Kiln supports, under ComfyUI's names.
pub(crate) fn features(max_upload_size: i64) -> FeatureFlags {
    FeatureFlags {
        supports_preview_metadata: true,
        // The flag is about tagging uploads to the asset service, which Kiln does not have.
        supports_model_type_tags: false,
        max_upload_size,
        extension: ExtensionFlags {
            manager: ManagerFlags { supports_v4: false, extra: Default::default() },
            extra: Default::default(),
        },
        // `/api/node_replacements` is served (Kiln registers no replacements).
        node_replacements: true,
        assets: false,
        extra: Default::default(),
    }
}

/// Total and available RAM in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    pub(crate) total: i64,
    pub(crate) available: i64,
}

impl Memory {
    /// Reads the host's memory, or zeros where it cannot be read.
    pub(crate) fn read() -> Memory {
        std::fs::read_to_string("/proc/meminfo")
            .map(|text| Memory::parse(&text))
            .unwrap_or_default()
    }

    /// Parses the `MemTotal` and `MemAvailable` lines of `/proc/meminfo` (values in KiB), with the compute
    /// layer's parser; zeros when either is missing.
    fn parse(meminfo: &str) -> Memory {
        let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        parse_meminfo(meminfo)
            .map(|m| Memory { total: bytes(m.total), available: bytes(m.available) })
            .unwrap_or_default()
    }
}

/// Builds the `/api/system_stats` answer. `frontend_version` is the version of the frontend being served, when
/// it is known (the pinned package; not a `--front-end-root` of unknown origin); `templates_version` the
/// workflow templates' once they are installed.
pub(crate) fn system_stats(
    argv: &[String],
    device: &DeviceReport,
    memory: Memory,
    frontend_version: Option<&str>,
    templates_version: Option<&str>,
) -> SystemStats {
    let bytes = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
    let device = match device.kind {
        // As ComfyUI on the CPU: the device's memory is the host's RAM.
        "cpu" => DeviceInfo {
            index: None,
            name: "cpu".to_owned(),
            type_: "cpu".to_owned(),
            vram_total: memory.total,
            vram_free: memory.available,
            torch_vram_total: memory.total,
            torch_vram_free: memory.available,
            vram_budget: Some(bytes(device.budget)),
        },
        kind => DeviceInfo {
            index: device.index.map(|i| i as i64),
            name: device.name.clone(),
            type_: kind.to_owned(),
            vram_total: bytes(device.total),
            vram_free: bytes(device.free),
            // ComfyUI reports torch's allocator here: what it holds and how much of that is unused. Kiln's
            // memory manager holds what it uses.
            torch_vram_total: bytes(device.held),
            torch_vram_free: 0,
            vram_budget: Some(bytes(device.budget)),
        },
    };
    let pytorch_version = format!("kiln {VERSION} ({} backend)", device.type_);
    SystemStats {
        devices: vec![device],
        system: SystemInfo {
            argv: argv.to_vec(),
            comfy_package_versions: vec![
                PackageVersion {
                    name: FRONTEND_PACKAGE.to_owned(),
                    installed: frontend_version.map(str::to_owned),
                    required: FRONTEND_VERSION.to_owned(),
                },
                PackageVersion {
                    name: TEMPLATES_PACKAGE.to_owned(),
                    installed: templates_version.map(str::to_owned),
                    required: TEMPLATES_VERSION.to_owned(),
                },
            ],
            comfyui_version: VERSION.to_owned(),
            deploy_environment: "kiln".to_owned(),
            embedded_python: false,
            // As ComfyUI: null until the templates are installed (every package of them, on Kiln).
            installed_templates_version: templates_version.map(str::to_owned),
            os: std::env::consts::OS.to_owned(),
            python_version: format!("rust {RUST_VERSION} (kiln {VERSION})"),
            pytorch_version,
            ram_free: memory.available,
            ram_total: memory.total,
            required_frontend_version: FRONTEND_VERSION.to_owned(),
            required_templates_version: Some(TEMPLATES_VERSION.to_owned()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::Memory;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       16384 kB\nMemFree:          100 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(Memory::parse(text), Memory { total: 16384 * 1024, available: 8192 * 1024 });
    }

    #[test]
    fn unreadable_meminfo_gives_zeros() {
        assert_eq!(Memory::parse("garbage"), Memory::default());
        assert_eq!(Memory::parse("MemTotal: lots kB"), Memory::default());
    }
}
