//! [`LatentFormat`]: a family's latent space (ComfyUI's `latent_formats`): how many channels, how far the VAE
//! downscales, the scale and shift between the VAE's space (what LATENT links carry) and the diffusion
//! model's, and the linear map to RGB that latent previews use.

/// A family's latent space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentFormat {
    /// Latent channels.
    pub channels: usize,
    /// Pixels per latent along each image axis (8 for the Flux VAE).
    pub spatial_downscale: usize,
    /// Frames per latent frame along time (1 for image families).
    pub temporal_downscale: usize,
    /// Multiplies after the shift going into the model.
    pub scale: f32,
    /// Subtracted going into the model.
    pub shift: f32,
    /// The linear map of a (model-space) latent to RGB in [-1, 1] for previews: per-channel rows and a bias.
    pub rgb: Option<(&'static [[f32; 3]], [f32; 3])>,
}

impl LatentFormat {
    /// The Flux VAE's latent space (Flux.1's and Z-Image's): 16 channels, 8× down, scale 0.3611, shift 0.1159.
    pub const FLUX: LatentFormat = LatentFormat {
        channels: 16,
        spatial_downscale: 8,
        temporal_downscale: 1,
        scale: 0.3611,
        shift: 0.1159,
        rgb: Some((&FLUX_RGB.0, FLUX_RGB.1)),
    };

    /// VAE space → model space: `(z − shift)·scale`.
    pub fn process_in(&self, z: f32) -> f32 {
        (z - self.shift) * self.scale
    }

    /// Model space → VAE space: `x/scale + shift`.
    pub fn process_out(&self, x: f32) -> f32 {
        x / self.scale + self.shift
    }
}

/// The Flux VAE latent space's linear map to RGB in [-1, 1]: one row per channel, then the bias. These are
/// measured constants of that latent space (the least-squares fit of decoded colours on latents that ComfyUI
/// and InvokeAI publish alike), not code.
const FLUX_RGB: ([[f32; 3]; 16], [f32; 3]) = (
    [
        [-0.0346, 0.0244, 0.0681],
        [0.0034, 0.0210, 0.0687],
        [0.0275, -0.0668, -0.0433],
        [-0.0174, 0.0160, 0.0617],
        [0.0859, 0.0721, 0.0329],
        [0.0004, 0.0383, 0.0115],
        [0.0405, 0.0861, 0.0915],
        [-0.0236, -0.0185, -0.0259],
        [-0.0245, 0.0250, 0.1180],
        [0.1008, 0.0755, -0.0421],
        [-0.0515, 0.0201, 0.0011],
        [0.0428, -0.0012, -0.0036],
        [0.0817, 0.0765, 0.0749],
        [-0.1264, -0.0522, -0.1103],
        [-0.0280, -0.0881, -0.0499],
        [-0.1262, -0.0982, -0.0778],
    ],
    [-0.0329, -0.0718, -0.0851],
);
