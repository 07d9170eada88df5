//! Mage-VAE (ComfyUI's `MageVAE`, `comfy/ldm/mage_flow/vae.py`; Microsoft's Mage): a one-step diffusion
//! codec between images and 128-channel latents at 16× down, anchored to the FLUX.2 VAE's latent space. Both
//! directions are one forward pass of a diffusion network at t = 0:
//!
//! - [`MageVae::encode`]: the `DConvEncoder` reads the image through a 16×16 patch embed and plain DiCo blocks,
//!   fuses it with the zero latent, runs modulated DiCo blocks and gives the posterior's mean (the first 128 of
//!   its channels; no sampling).
//! - [`MageVae::decode`]: the CoD decoder turns the latent into conditioning features (`cod.rs`); the
//!   `DConvDenoiser` fuses them with the zero noise's patches, runs modulated DiCo blocks, and its per-pixel
//!   head (`pixel.rs`) makes each patch's 16×16 pixels.
//!
//! Both work in VAE space: images in [−1, 1] (ComfyUI's `process_input`, kept by this VAE), decoded images not
//! clamped (ComfyUI maps and clamps them after, in `process_output`); the latent format (FLUX.2's, the identity)
//! belongs to the sampler. [`detect`] reads the released file's layout (`student.dconv_encoder.*`,
//! `pipeline.*`) and derives the [`Config`] from its shapes; [`load_plan`] names the weights as ComfyUI does
//! after its renames, and leaves out the anchor encoder the file also carries.
//!
//! Invariant: weights are read only through `Model::fetch`, one block (a DiCo block, a CoD block, a projection,
//! the pixel head) at a time, each `Layer` dropped before the next fetch; the pixel head, the one stage whose
//! activations grow with the pixels rather than the latent, runs [`PIXEL_CHUNK`] patches at a time.
//!
//! Numerics as ComfyUI's in the compute type, with three restatements that change only the order of sums: the
//! depthwise 3×3 convolutions are sums of nine shifted products (accumulated in f32), the channel attention's
//! average is a matmul with ones, and the pixel head's input Linear is split by its columns (see `pixel.rs`).
//! The zero noise's 16×16 `s_embedder.proj1` (no bias) is exactly zero and is not computed. The DCT position
//! table is computed in the compute type as ComfyUI computes it in the activations' dtype.

mod cod;
mod config;
mod dico;
pub mod family;
mod pixel;

pub(crate) use config::file_expected;
pub use config::{
    CodBlock, Config, DecoderConfig, EPS, EncoderConfig, GROUPS, LATENT_CHANNELS, MARKER, PATCH,
    WINDOW, detect, load_plan,
};

use kiln_compute::backend::Conv2dParams;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};
use dico::pointwise;

/// Latent positions (16×16 pixel patches) the decoder's per-pixel head runs at a time in [`MageVae::decode`]:
/// released, its largest activations are 1024 × 256 pixels × 32 features (32 MiB in f32) and a block's
/// modulation three times that.
pub const PIXEL_CHUNK: usize = 1024;

/// A loaded Mage-VAE: its shape and its weights (under ComfyUI's names, from [`load_plan`]).
pub struct MageVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl MageVae {
    /// The autoencoder of `config` with `weights` loaded from [`load_plan`].
    pub fn new(config: Config, weights: Model) -> MageVae {
        MageVae { config, weights }
    }

    /// Pixels per latent position along each side (16).
    pub fn downscale(&self) -> usize {
        self.config.downscale()
    }

    /// Encodes images x `[B, 3, H, W]` with values in [−1, 1] into the posterior's mean
    /// `[B, 128, H/16, W/16]`, f32, in VAE space.
    ///
    /// H and W that are not multiples of 16 are cropped to the largest multiples, centred (offset
    /// `(H mod 16) / 2`), as ComfyUI's `VAE.encode` does; an image smaller than 16×16 is an
    /// [`crate::Error::Invalid`].
    pub fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let (cfg, m) = (&self.config, &self.weights);
        let e = &cfg.encoder;
        let x = crate::vae_io::image_in(b, x, true, cfg.image_channels, PATCH)?;
        let &[n, _, hh, ww] = x.shape() else {
            return Err(Error::Invalid(format!("an image {:?} is not [B, C, H, W]", x.shape())));
        };
        let (h, w) = (hh / PATCH, ww / PATCH);
        let embed = Conv2dParams { stride: PATCH, padding: [0; 4] };
        let cond = crate::named::conv2d(b, m, "dconv_encoder.patch_cond_embed", &x, embed)?;
        drop(x);
        let mut cond = b.permute(&cond, &[0, 2, 3, 1])?;
        for i in 0..e.head_blocks {
            cond = dico::block(b, m, &format!("dconv_encoder.head_blocks.{i}"), &cond, None)?;
        }
        let cond = conv1x1(b, m, "dconv_encoder.proj_down", &cond)?;
        // The latent being denoised is zero at t = 0.
        let zero = b.full(&[n, h, w, LATENT_CHANNELS], 0.0, b.compute_dtype())?;
        let latent = conv1x1(b, m, "dconv_encoder.z_proj", &zero)?;
        let mut s = conv1x1(b, m, "dconv_encoder.fuse_proj", &b.concat(&[&cond, &latent], -1)?)?;
        drop((cond, latent));
        let t = dico::timestep(b, m, "dconv_encoder.t_embedder", n, e.frequencies)?;
        for i in 0..e.blocks {
            s = dico::block(b, m, &format!("dconv_encoder.blocks.{i}"), &s, Some(&t))?;
        }
        // norm_out, then the mean's rows of proj_out (its log-variance is never used).
        let mut names = wb("dconv_encoder.norm_out").to_vec();
        names.extend(wb("dconv_encoder.proj_out"));
        let layer = fetch(b, m, &names)?;
        let s = b.layer_norm(&s, Some(&layer.weight(0)), Some(&layer.weight(1)), EPS)?;
        let rows = layer.weight(2).rows(0, LATENT_CHANNELS)?;
        let mean = pointwise(b, &s, &rows, &layer.weight(3).rows(0, LATENT_CHANNELS)?)?;
        Ok(b.cast(&b.permute(&mean, &[0, 3, 1, 2])?, DType::F32)?)
    }

    /// Decodes latents z `[B, 128, h, w]` in VAE space into images `[B, 3, 16h, 16w]`, f32, about [−1, 1] but
    /// not clamped; the per-pixel head runs [`PIXEL_CHUNK`] patches at a time.
    pub fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        self.decode_with(b, z, PIXEL_CHUNK)
    }

    /// [`MageVae::decode`] with the per-pixel head run `patches` latent positions at a time (the batch's
    /// positions in order; the result does not depend on it, the memory does). 0 is an
    /// [`crate::Error::Invalid`].
    pub fn decode_with<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        patches: usize,
    ) -> Result<Tensor<B>> {
        if patches == 0 {
            return Err(Error::Invalid("a decode of 0 patches at a time".into()));
        }
        let (cfg, m) = (&self.config, &self.weights);
        let d = &cfg.decoder;
        let z = crate::vae_io::latent_in(b, z, true, LATENT_CHANNELS)?;
        let &[n, _, h, w] = z.shape() else {
            return Err(Error::Invalid(format!("a latent {:?} is not [B, C, h, w]", z.shape())));
        };
        let cond = cod::decode(b, m, "decoder_model.y_embedder.decoder", &d.cod, &z)?;
        drop(z);
        let cond = b.permute(&cond, &[0, 2, 3, 1])?;
        // s_embedder: proj2 of [proj1(noise), cond], proj1 of the zero noise being exactly zero.
        let zero = b.full(&[n, h, w, LATENT_CHANNELS], 0.0, b.compute_dtype())?;
        let fused = b.concat(&[&zero, &cond], -1)?;
        drop(zero);
        let mut s = conv1x1(b, m, "decoder_model.s_embedder.proj2", &fused)?;
        drop(fused);
        let t = dico::timestep(b, m, "decoder_model.t_embedder", n, d.frequencies)?;
        for i in 0..d.blocks {
            s = dico::block(b, m, &format!("decoder_model.blocks.{i}"), &s, Some(&t))?;
        }
        let tokens = n * h * w;
        let pixels = pixel::decode(
            b,
            m,
            d,
            cfg.image_channels,
            &s.reshape(&[tokens, d.hidden])?,
            &cond.reshape(&[tokens, d.hidden])?,
            patches,
        )?;
        drop((s, cond));
        let c = cfg.image_channels;
        let pixels = pixels.reshape(&[n, h * w, PATCH * PATCH * c])?;
        let image = b.unpatchify(&pixels, PATCH, c, h * PATCH, w * PATCH)?;
        Ok(b.cast(&image, DType::F32)?)
    }
}

/// The 1×1 convolution `name` (weight `[O, I, 1, 1]` and bias) on channels-last `x` `[.., I]`.
fn conv1x1<B: Backend>(b: &B, model: &Model, name: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &wb(name))?;
    pointwise(b, x, &layer.weight(0), &layer.weight(1))
}
