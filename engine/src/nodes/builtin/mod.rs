//! The built-in node classes (no models): images, latents, primitives, previews (files and websocket frames)
//! and the lazy switch.

mod files;
mod image;
mod latent;
mod logic;
// The lead's node implementations of #11 call these; until then only the tests do.
#[cfg_attr(not(test), expect(dead_code, reason = "registered with the model nodes of #11"))]
mod model_specs;
mod primitives;
mod resize;
mod websocket;

use std::path::PathBuf;

use super::Registry;

/// A registry with every built-in node; `LoadImage` lists and reads `input_dir`.
pub fn builtin_registry(input_dir: PathBuf) -> Registry {
    // ComfyUI's order: its core `nodes.py` classes as `NODE_CLASS_MAPPINGS` declares them, then the
    // `comfy_extras` modules, then custom nodes (`SaveImageWebsocket` ships as one). `/object_info` lists them so.
    let mut registry = Registry::new();
    registry.register(latent::EmptyLatentImage::new());
    registry.register(latent::LatentUpscale::new());
    registry.register(files::SaveImage::new());
    registry.register(files::PreviewImage::new());
    registry.register(files::LoadImage::new(input_dir));
    registry.register(image::ImageScale::new());
    registry.register(image::ImageScaleBy::new());
    registry.register(image::ImageInvert::new());
    registry.register(image::ImageBatch::new());
    registry.register(image::EmptyImage::new());
    registry.register(image::ImageBlend::new());
    registry.register(image::GetImageSize::new());
    for node in primitives::primitives() {
        registry.register(node);
    }
    registry.register(primitives::PreviewAny::new());
    registry.register(logic::ComfySwitchNode::new());
    registry.register(websocket::SaveImageWebsocket::new());
    registry
}
