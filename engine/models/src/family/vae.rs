//! [`VaeFamily`]: the autoencoders (`VAE`) Kiln runs, and [`VaeNet`], one loaded.

use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, Tensor};

use crate::error::Result;
use crate::flux_vae::{self, FluxVae};
use crate::header::Header;
use crate::hunyuan_vae::{self, HunyuanVae};
use crate::kl_video_vae::{self, KlVideoVae};
use crate::latent::LatentFormat;
use crate::mage_vae::{self, MageVae};
use crate::wan_vae::{self, ClipVae, Wan22Vae, WanVae};

/// A family of autoencoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VaeFamily {
    /// The KL autoencoder of Flux.1 and Z-Image (16 channels, 8× down), and its SD-era relatives.
    Flux,
    /// The FLUX.2 VAE: the same network with z 32 and quant convs, its latent 2×2-patchified to 128 channels
    /// (16× down) and normalised by the BatchNorm statistics in the file, inside the VAE.
    Flux2,
    /// The causal 3-D autoencoder of Wan 2.1 and Qwen-Image (16 channels, 8× down in space, 4× in time).
    Wan21,
    /// The Wan 2.2 VAE of Wan 2.2 TI2V 5B (48 channels, 16× down in space through a 2×2 patchify, 4× in time).
    Wan22,
    /// The HunyuanVideo 1.5 VAE (32 channels, 16× down in space, 4× in time).
    HunyuanVideo15,
    /// The HunyuanVideo 1.0 VAE, also Kandinsky 5's video models' (the KL autoencoder with 3-D convolutions: 16
    /// channels, 8× down in space, 4× in time).
    HunyuanVideo,
    /// Mage-Flow's one-step diffusion codec (128 channels, 16× down, in FLUX.2's latent space).
    MageFlow,
    /// `VAELoader`'s `pixel_space`: no network, the pixels are the latent (Chroma Radiance's). Never detected in
    /// a file.
    PixelSpace,
}

impl VaeFamily {
    /// Every family, in the order detection tries them (the Wan VAEs first: the Flux VAE's detection refuses
    /// every file with 3-D convolutions). The two Wan VAEs each claim only their own files (the 2.2 VAE's
    /// residual blocks), as do the Flux VAE and the FLUX.2 VAE, which share one detection (`bn.running_mean`
    /// present: FLUX.2), so the order within each pair does not matter. The HunyuanVideo 1.5 VAE (32 latent
    /// channels into `decoder.conv_in.conv`) and the 1.0 one (16, and `post_quant_conv`) come before the Flux VAE
    /// too.
    pub const ALL: [VaeFamily; 7] = [
        VaeFamily::Wan21,
        VaeFamily::Wan22,
        VaeFamily::HunyuanVideo15,
        VaeFamily::HunyuanVideo,
        VaeFamily::Flux,
        VaeFamily::Flux2,
        VaeFamily::MageFlow,
    ];

    /// The family's name in messages (`the Flux VAE`).
    pub fn name(self) -> &'static str {
        match self {
            VaeFamily::Flux => flux_vae::family::NAME,
            VaeFamily::Flux2 => flux_vae::family::FLUX2_NAME,
            VaeFamily::Wan21 => wan_vae::family::NAME,
            VaeFamily::Wan22 => wan_vae::family::WAN22_NAME,
            VaeFamily::HunyuanVideo15 => hunyuan_vae::family::NAME,
            VaeFamily::HunyuanVideo => kl_video_vae::family::NAME,
            VaeFamily::MageFlow => mage_vae::family::NAME,
            VaeFamily::PixelSpace => PIXEL_SPACE_NAME,
        }
    }

    /// The name `kiln model synth --family` writes the autoencoder under (`flux-vae`).
    pub fn synth_name(self) -> &'static str {
        match self {
            VaeFamily::Flux => flux_vae::family::SYNTH_NAME,
            VaeFamily::Flux2 => flux_vae::family::FLUX2_SYNTH_NAME,
            VaeFamily::Wan21 => wan_vae::family::SYNTH_NAME,
            VaeFamily::Wan22 => wan_vae::family::WAN22_SYNTH_NAME,
            VaeFamily::HunyuanVideo15 => hunyuan_vae::family::SYNTH_NAME,
            VaeFamily::HunyuanVideo => kl_video_vae::family::SYNTH_NAME,
            VaeFamily::MageFlow => mage_vae::family::SYNTH_NAME,
            // Nothing to write: `VAELoader` lists it beside the files.
            VaeFamily::PixelSpace => PIXEL_SPACE_NAME,
        }
    }

    /// The latent space it encodes to (what a VAE-space latent is, before a diffusion family's scale and
    /// shift).
    pub fn latent(self) -> LatentFormat {
        match self {
            VaeFamily::Flux => LatentFormat::FLUX,
            VaeFamily::Flux2 => LatentFormat::FLUX2,
            VaeFamily::Wan21 => LatentFormat::WAN21,
            VaeFamily::Wan22 => LatentFormat::WAN22,
            VaeFamily::HunyuanVideo15 => LatentFormat::HUNYUAN_VIDEO15,
            VaeFamily::HunyuanVideo => LatentFormat::HUNYUAN_VIDEO,
            VaeFamily::MageFlow => mage_vae::family::LATENT,
            VaeFamily::PixelSpace => LatentFormat::PIXELS,
        }
    }

    /// This family's detection of `h`.
    fn detect(self, h: &Header) -> Result<Option<VaeDetected>> {
        Ok(match self {
            VaeFamily::Flux | VaeFamily::Flux2 => flux_vae::detect(h)?
                .filter(|(config, _)| flux_family(config) == self)
                .map(|(config, layout)| VaeDetected::Flux(config, layout)),
            VaeFamily::Wan21 => {
                wan_vae::detect(h)?.map(|(config, layout)| VaeDetected::Wan21(config, layout))
            }
            VaeFamily::Wan22 => wan_vae::wan22::detect(h)?
                .map(|(config, layout)| VaeDetected::Wan22(config, layout)),
            VaeFamily::HunyuanVideo15 => hunyuan_vae::detect(h)?.map(VaeDetected::HunyuanVideo15),
            VaeFamily::HunyuanVideo => kl_video_vae::detect(h)?.map(VaeDetected::HunyuanVideo),
            VaeFamily::MageFlow => mage_vae::detect(h)?.map(VaeDetected::MageFlow),
            VaeFamily::PixelSpace => None,
        })
    }
}

/// `VAELoader`'s name for the pixel-space VAE (listed after the `vae` folder's files, as ComfyUI lists it).
pub const PIXEL_SPACE_NAME: &str = "pixel_space";

/// The family of a KL autoencoder of `config`: FLUX.2's when its latent is BatchNorm-normalised.
fn flux_family(config: &flux_vae::Config) -> VaeFamily {
    if config.latent_bn { VaeFamily::Flux2 } else { VaeFamily::Flux }
}

/// An autoencoder found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum VaeDetected {
    /// The Flux VAE or the FLUX.2 VAE (one network; [`flux_vae::Config::latent_bn`] tells them apart).
    Flux(flux_vae::Config, flux_vae::Layout),
    /// The Wan 2.1 VAE.
    Wan21(wan_vae::Config, wan_vae::Layout),
    /// The Wan 2.2 VAE.
    Wan22(wan_vae::wan22::Config, wan_vae::Layout),
    /// The HunyuanVideo 1.5 VAE.
    HunyuanVideo15(hunyuan_vae::Config),
    /// The HunyuanVideo 1.0 VAE.
    HunyuanVideo(kl_video_vae::Config),
    /// The Mage-Flow VAE.
    MageFlow(mage_vae::Config),
}

impl VaeDetected {
    /// The autoencoder in `h`: `Ok(None)` when no family claims it; [`crate::Error::Unsupported`] for a file a
    /// family recognises but cannot run.
    pub fn detect(h: &Header) -> Result<Option<VaeDetected>> {
        super::first_detected(&VaeFamily::ALL, h, VaeFamily::detect)
    }

    /// The family.
    pub fn family(&self) -> VaeFamily {
        match self {
            VaeDetected::Flux(config, _) => flux_family(config),
            VaeDetected::Wan21(..) => VaeFamily::Wan21,
            VaeDetected::Wan22(..) => VaeFamily::Wan22,
            VaeDetected::HunyuanVideo15(_) => VaeFamily::HunyuanVideo15,
            VaeDetected::HunyuanVideo(_) => VaeFamily::HunyuanVideo,
            VaeDetected::MageFlow(_) => VaeFamily::MageFlow,
        }
    }

    /// The weights to load, named in the family's layout whatever the file's.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            VaeDetected::Flux(config, layout) => flux_vae::load_plan(h, config, *layout),
            VaeDetected::Wan21(config, layout) => wan_vae::load_plan(h, config, *layout),
            VaeDetected::Wan22(config, layout) => wan_vae::wan22::load_plan(h, config, *layout),
            VaeDetected::HunyuanVideo15(config) => hunyuan_vae::load_plan(h, config),
            VaeDetected::HunyuanVideo(config) => kl_video_vae::load_plan(h, config),
            VaeDetected::MageFlow(config) => mage_vae::load_plan(h, config),
        }
    }

    /// The autoencoder with `weights` loaded from [`VaeDetected::load_plan`].
    pub fn build(self, weights: Model) -> VaeNet {
        match self {
            VaeDetected::Flux(config, _) => VaeNet::Flux(FluxVae::new(config, weights)),
            VaeDetected::Wan21(config, _) => VaeNet::Wan21(WanVae::new(config, weights)),
            VaeDetected::Wan22(config, _) => VaeNet::Wan22(Wan22Vae::new(config, weights)),
            VaeDetected::HunyuanVideo15(config) => {
                VaeNet::HunyuanVideo15(HunyuanVae::new(config, weights))
            }
            VaeDetected::HunyuanVideo(config) => {
                VaeNet::HunyuanVideo(KlVideoVae::new(config, weights))
            }
            VaeDetected::MageFlow(config) => VaeNet::MageFlow(MageVae::new(config, weights)),
        }
    }
}

/// A loaded autoencoder.
pub enum VaeNet {
    /// The Flux VAE or the FLUX.2 VAE.
    Flux(FluxVae),
    /// The Wan 2.1 VAE.
    Wan21(WanVae),
    /// The Wan 2.2 VAE.
    Wan22(Wan22Vae),
    /// The HunyuanVideo 1.5 VAE.
    HunyuanVideo15(HunyuanVae),
    /// The HunyuanVideo 1.0 VAE.
    HunyuanVideo(KlVideoVae),
    /// The Mage-Flow VAE.
    MageFlow(MageVae),
    /// The pixel-space VAE (the identity); its model holds no weights.
    PixelSpace(Model),
}

impl VaeNet {
    /// The family.
    pub fn family(&self) -> VaeFamily {
        match self {
            VaeNet::Flux(net) => flux_family(&net.config),
            VaeNet::Wan21(_) => VaeFamily::Wan21,
            VaeNet::Wan22(_) => VaeFamily::Wan22,
            VaeNet::HunyuanVideo15(_) => VaeFamily::HunyuanVideo15,
            VaeNet::HunyuanVideo(_) => VaeFamily::HunyuanVideo,
            VaeNet::MageFlow(_) => VaeFamily::MageFlow,
            VaeNet::PixelSpace(_) => VaeFamily::PixelSpace,
        }
    }

    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            VaeNet::Flux(net) => &net.weights,
            VaeNet::Wan21(net) => &net.weights,
            VaeNet::Wan22(net) => &net.weights,
            VaeNet::HunyuanVideo15(net) => &net.weights,
            VaeNet::HunyuanVideo(net) => &net.weights,
            VaeNet::MageFlow(net) => &net.weights,
            VaeNet::PixelSpace(none) => none,
        }
    }

    /// The channels of the images the encoder reads (3; 4, RGBA, for Qwen-Image-Layered's VAE), and what an
    /// image with fewer is padded with (ComfyUI's `pad_channel_value`: 1, an opaque alpha, for the Wan VAE;
    /// none for Flux's or the Wan 2.2 VAE's).
    pub fn image_channels(&self) -> (usize, Option<f32>) {
        match self {
            VaeNet::Flux(net) => (net.config.in_channels, None),
            VaeNet::Wan21(net) => (net.config.in_channels, Some(1.0)),
            VaeNet::Wan22(_) => (wan_vae::wan22::IMAGE_CHANNELS, None),
            VaeNet::HunyuanVideo15(_) => (hunyuan_vae::IMAGE_CHANNELS, None),
            VaeNet::HunyuanVideo(_) => (kl_video_vae::IMAGE_CHANNELS, None),
            VaeNet::MageFlow(net) => (net.config.image_channels, None),
            VaeNet::PixelSpace(_) => (LatentFormat::PIXELS.channels, None),
        }
    }

    /// Latents `[B, C, h, w]` in VAE space → images `[B, 3, H, W]` in about [−1, 1] (4 channels from an RGBA
    /// VAE), H and W the latent's times [`VaeNet::downscale`].
    pub fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            VaeNet::Flux(net) => net.decode(b, z),
            VaeNet::Wan21(net) => net.decode(b, z),
            VaeNet::Wan22(net) => net.decode(b, z),
            VaeNet::HunyuanVideo15(net) => net.decode(b, z),
            VaeNet::HunyuanVideo(net) => net.decode(b, z),
            VaeNet::MageFlow(net) => net.decode(b, z),
            VaeNet::PixelSpace(_) => Ok(z.clone()),
        }
    }

    /// Pixels per latent position along each side of an image (8; 16 for the FLUX.2 VAE and the Wan 2.2 VAE):
    /// what sizes are cropped to before encoding, and what a tiled pass scales tiles by.
    pub fn downscale(&self) -> usize {
        match self {
            VaeNet::Flux(net) => net.config.downscale(),
            VaeNet::Wan21(net) => net.config.downscale(),
            VaeNet::Wan22(net) => net.config.downscale(),
            VaeNet::HunyuanVideo15(net) => net.config.downscale(),
            VaeNet::HunyuanVideo(net) => net.config.downscale(),
            VaeNet::MageFlow(net) => net.downscale(),
            VaeNet::PixelSpace(_) => 1,
        }
    }

    /// Clip frames per latent frame of a video autoencoder (4 for the Wan VAEs), or `None` for an image one.
    /// A video autoencoder encodes a batch of images as one clip (ComfyUI's batch-as-time), L frames to
    /// ⌊(L − 1)/4⌋ + 1 latent frames, and decodes T latent frames to 4T − 3.
    pub fn temporal_downscale(&self) -> Option<usize> {
        match self {
            VaeNet::Flux(_) | VaeNet::MageFlow(_) | VaeNet::PixelSpace(_) => None,
            VaeNet::Wan21(_)
            | VaeNet::Wan22(_)
            | VaeNet::HunyuanVideo15(_)
            | VaeNet::HunyuanVideo(_) => Some(wan_vae::TEMPORAL_DOWNSCALE),
        }
    }

    /// Decodes one clip z `[1, C, T, h, w]` in VAE space, `per_chunk` latent frames at a time after the first,
    /// handing `out` each chunk's frames `[n, 3, H, W]` (f32, about [−1, 1]; 4T − 3 in all) as they are
    /// finished; an error from `out` stops it. An image autoencoder refuses.
    pub fn decode_video<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        match self {
            VaeNet::Flux(_) | VaeNet::MageFlow(_) | VaeNet::PixelSpace(_) => Err(self.not_video()),
            VaeNet::Wan21(net) => net.decode_video_with(b, z, per_chunk, out),
            VaeNet::Wan22(net) => net.decode_video_with(b, z, per_chunk, out),
            VaeNet::HunyuanVideo15(net) => net.decode_video_with(b, z, per_chunk, out),
            VaeNet::HunyuanVideo(net) => net.decode_video_with(b, z, per_chunk, out),
        }
    }

    /// Encodes one clip x `[1, 3, L, H, W]` in [−1, 1], `per_chunk` frames (a multiple of 4) at a time after the
    /// first, handing `out` each chunk's latent frames `[n, C, h, w]` (f32, VAE space; ⌊(L − 1)/4⌋ + 1 in all;
    /// later frames dropped, sizes centre-cropped to [`VaeNet::downscale`]); an error from `out` stops it. An
    /// image autoencoder refuses.
    pub fn encode_video<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        match self {
            VaeNet::Flux(_) | VaeNet::MageFlow(_) | VaeNet::PixelSpace(_) => Err(self.not_video()),
            VaeNet::Wan21(net) => net.encode_video_with(b, x, per_chunk, out),
            VaeNet::Wan22(net) => net.encode_video_with(b, x, per_chunk, out),
            VaeNet::HunyuanVideo15(net) => net.encode_video_with(b, x, per_chunk, out),
            VaeNet::HunyuanVideo(net) => net.encode_video_with(b, x, per_chunk, out),
        }
    }

    /// The refusal of a clip by an image autoencoder.
    fn not_video(&self) -> crate::Error {
        crate::Error::Invalid(format!(
            "{} encodes and decodes images, not videos (a Wan or HunyuanVideo VAE does video)",
            self.family().name()
        ))
    }

    /// Images `[B, 3, H, W]` in [−1, 1] → latents in VAE space.
    pub fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            VaeNet::Flux(net) => net.encode(b, x),
            VaeNet::Wan21(net) => net.encode(b, x),
            VaeNet::Wan22(net) => net.encode(b, x),
            VaeNet::HunyuanVideo15(net) => net.encode(b, x),
            VaeNet::HunyuanVideo(net) => net.encode(b, x),
            VaeNet::MageFlow(net) => net.encode(b, x),
            VaeNet::PixelSpace(_) => Ok(x.clone()),
        }
    }
}
