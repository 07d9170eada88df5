//! The three Z-Image-Turbo files' tensor lists (names, shapes, how each is initialised) at a configuration.
//!
//! Invariant: at `real()` each list is exactly the released file's keys and shapes (models.md §3.2, §4.1, §5.1)
//! — the model code detects every width from these shapes, so a synthetic file must be indistinguishable from a
//! released one but for its values.

use crate::error::{Error, Result};

/// Input features of the DiT's patch embedder and output features of its final layer: 2×2 patches of 16 latent
/// channels.
const PATCH_FEATURES: usize = 64;
/// Width of the timestep sinusoid the t-embedder reads.
const T_FREQUENCIES: usize = 256;

/// The NextDiT's widths (ComfyUI layout: fused `attention.qkv`, `x_embedder`, `final_layer`; no key prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZImageShape {
    /// Hidden width `D` (3840).
    pub dim: usize,
    /// Attention heads (30); head dim = `dim / heads`.
    pub heads: usize,
    /// Main blocks `layers.i` (30).
    pub layers: usize,
    /// Blocks in each refiner, `noise_refiner.i` (modulated) and `context_refiner.i` (not) (2).
    pub refiners: usize,
    /// SwiGLU hidden width of `feed_forward.w1/w3` (10240).
    pub ffn_hidden: usize,
    /// Caption feature width, the text encoder's hidden size (2560).
    pub cap_feat_dim: usize,
    /// Hidden width of the t-embedder MLP (1024).
    pub t_hidden: usize,
    /// Width of the adaLN input, the t-embedder's output (256).
    pub adaln: usize,
}

impl ZImageShape {
    /// Z-Image-Turbo as released (`z_image_turbo_bf16.safetensors`): 6 154 908 736 parameters.
    pub fn real() -> ZImageShape {
        ZImageShape {
            dim: 3840,
            heads: 30,
            layers: 30,
            refiners: 2,
            ffn_hidden: 10240,
            cap_feat_dim: 2560,
            t_hidden: 1024,
            adaln: 256,
        }
    }

    /// A tiny model with the full structure: head dim 32 (RoPE axes 8, 12, 12), 2 heads, 2 layers, 2 + 2
    /// refiners, captions from [`Qwen3Shape::tiny`]. The t-embedder follows diffusers' rule (hidden 1024, output
    /// min(dim, 256)); the FFN width ComfyUI's (256·⌈⌊8/3·dim⌋/256⌉).
    pub fn tiny() -> ZImageShape {
        ZImageShape {
            dim: 64,
            heads: 2,
            layers: 2,
            refiners: 2,
            ffn_hidden: 256,
            cap_feat_dim: Qwen3Shape::tiny().hidden,
            t_hidden: 1024,
            adaln: 64,
        }
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads.max(1)
    }

    fn validate(&self) -> Result<()> {
        let widths =
            [self.dim, self.heads, self.ffn_hidden, self.cap_feat_dim, self.t_hidden, self.adaln];
        if widths.contains(&0) || !self.dim.is_multiple_of(self.heads) {
            return Err(Error::Invalid(format!(
                "Z-Image shape {self:?}: every width must be positive and dim divisible by heads"
            )));
        }
        Ok(())
    }
}

/// The Qwen3 text encoder's widths (Hugging Face names, no `lm_head`, no biases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qwen3Shape {
    /// Vocabulary rows of `model.embed_tokens.weight` (151936).
    pub vocab: usize,
    /// Hidden width (2560).
    pub hidden: usize,
    /// Decoder layers (36).
    pub layers: usize,
    /// Query heads (32).
    pub heads: usize,
    /// Key/value heads (8).
    pub kv_heads: usize,
    /// Per-head width (128).
    pub head_dim: usize,
    /// SwiGLU hidden width (9728).
    pub intermediate: usize,
}

impl Qwen3Shape {
    /// Qwen3-4B as ComfyUI ships it (`qwen_3_4b.safetensors`): 4 022 468 096 parameters.
    pub fn real() -> Qwen3Shape {
        Qwen3Shape {
            vocab: 151936,
            hidden: 2560,
            layers: 36,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            intermediate: 9728,
        }
    }

    /// A tiny encoder with the full structure and the real vocabulary (so the real tokenizer's ids are valid):
    /// hidden 32, 4 query heads over 2 key/value heads of width 8, MLP 64, and 28 layers, so FLUX.2 Klein's
    /// encoder finds the hidden states it takes (after layers 9, 18 and 27) in the same file Z-Image reads.
    pub fn tiny() -> Qwen3Shape {
        Qwen3Shape {
            vocab: 151936,
            hidden: 32,
            layers: 28,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            intermediate: 64,
        }
    }

    fn validate(&self) -> Result<()> {
        let widths =
            [self.vocab, self.hidden, self.heads, self.kv_heads, self.head_dim, self.intermediate];
        if widths.contains(&0) || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::Invalid(format!(
                "Qwen3 shape {self:?}: every width must be positive and heads a multiple of kv_heads"
            )));
        }
        Ok(())
    }
}

/// The Flux VAE's widths (LDM names `encoder.*` / `decoder.*`, no quant convs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaeShape {
    /// Base width (128).
    pub ch: usize,
    /// Width multipliers per level ([1, 2, 4, 4]).
    pub ch_mult: Vec<usize>,
    /// Res blocks per encoder level (2; the decoder has one more).
    pub res_blocks: usize,
    /// Latent channels (16).
    pub z: usize,
}

impl VaeShape {
    /// The FLUX.1 VAE (`ae.safetensors`).
    pub fn real() -> VaeShape {
        VaeShape { ch: 128, ch_mult: vec![1, 2, 4, 4], res_blocks: 2, z: 16 }
    }

    /// A tiny VAE with the full structure: base width 32 (so GroupNorm's 32 groups divide every width).
    pub fn tiny() -> VaeShape {
        VaeShape { ch: 32, ch_mult: vec![1, 2, 4, 4], res_blocks: 2, z: 16 }
    }

    fn validate(&self) -> Result<()> {
        if self.ch == 0 || self.z == 0 || self.ch_mult.is_empty() || self.ch_mult.contains(&0) {
            return Err(Error::Invalid(format!(
                "VAE shape {self:?}: ch, z and every multiplier must be positive, with at least one level"
            )));
        }
        Ok(())
    }
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    /// All 1 (norm weights).
    Ones,
    /// All 0 (norm biases).
    Zeros,
    /// Uniform in ±bound.
    Uniform(f32),
    /// Every element this value (a quantized weight's scale).
    Fill(f32),
    /// These bytes, stored as U8 whatever the file's dtype (Mistral's `tekken_model` JSON).
    Bytes(&'static [u8]),
}

/// One tensor of a layout.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) init: Init,
}

/// Builds a layout's list, prefixing block names.
struct Layout {
    specs: Vec<Spec>,
}

impl Layout {
    fn new() -> Layout {
        Layout { specs: Vec::new() }
    }

    fn push(&mut self, name: String, shape: &[usize], init: Init) {
        self.specs.push(Spec { name, shape: shape.to_vec(), init });
    }

    /// A linear layer `[out, in]` (+ bias `[out]`), torch's default bounds ±1/√in.
    fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool) {
        let bound = uniform_bound(inp);
        self.push(format!("{name}.weight"), &[out, inp], Init::Uniform(bound));
        if bias {
            self.push(format!("{name}.bias"), &[out], Init::Uniform(bound));
        }
    }

    /// A 2-D convolution `[out, in, k, k]` + bias, torch's default bounds ±1/√(in·k²).
    fn conv(&mut self, name: &str, out: usize, inp: usize, k: usize) {
        let bound = uniform_bound(inp * k * k);
        self.push(format!("{name}.weight"), &[out, inp, k, k], Init::Uniform(bound));
        self.push(format!("{name}.bias"), &[out], Init::Uniform(bound));
    }

    /// A norm's weight (ones) and, with `bias`, its bias (zeros).
    fn norm(&mut self, name: &str, width: usize, bias: bool) {
        self.push(format!("{name}.weight"), &[width], Init::Ones);
        if bias {
            self.push(format!("{name}.bias"), &[width], Init::Zeros);
        }
    }
}

/// A LoRA's down and up matrices for the stem `name` (the key without `.lora_A.weight`) of a weight
/// `[out, inp]` at `rank`: A uniform in ±1/√inp, B small (±0.01) so the patch is a small change.
pub(crate) fn lora_pair(name: &str, out: usize, inp: usize, rank: usize) -> [Spec; 2] {
    [
        Spec {
            name: format!("{name}.lora_A.weight"),
            shape: vec![rank, inp],
            init: Init::Uniform(uniform_bound(inp)),
        },
        Spec {
            name: format!("{name}.lora_B.weight"),
            shape: vec![out, rank],
            init: Init::Uniform(0.01),
        },
    ]
}

pub(crate) fn uniform_bound(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}

/// The Z-Image DiT's tensors at `shape` with their initialisation.
pub(crate) fn zimage_specs(shape: &ZImageShape) -> Result<Vec<Spec>> {
    shape.validate()?;
    let ZImageShape { dim, layers, refiners, ffn_hidden, cap_feat_dim, t_hidden, adaln, .. } =
        *shape;
    let mut l = Layout::new();
    l.linear("x_embedder", dim, PATCH_FEATURES, true);
    l.push("x_pad_token".into(), &[1, dim], Init::Uniform(0.02));
    l.push("cap_pad_token".into(), &[1, dim], Init::Uniform(0.02));
    l.linear("t_embedder.mlp.0", t_hidden, T_FREQUENCIES, true);
    l.linear("t_embedder.mlp.2", adaln, t_hidden, true);
    l.norm("cap_embedder.0", cap_feat_dim, false);
    l.linear("cap_embedder.1", dim, cap_feat_dim, true);
    let block = |l: &mut Layout, name: String, modulated: bool| {
        l.linear(&format!("{name}.attention.qkv"), 3 * dim, dim, false);
        l.linear(&format!("{name}.attention.out"), dim, dim, false);
        l.norm(&format!("{name}.attention.q_norm"), shape.head_dim(), false);
        l.norm(&format!("{name}.attention.k_norm"), shape.head_dim(), false);
        for norm in ["attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"] {
            l.norm(&format!("{name}.{norm}"), dim, false);
        }
        l.linear(&format!("{name}.feed_forward.w1"), ffn_hidden, dim, false);
        l.linear(&format!("{name}.feed_forward.w2"), dim, ffn_hidden, false);
        l.linear(&format!("{name}.feed_forward.w3"), ffn_hidden, dim, false);
        if modulated {
            l.linear(&format!("{name}.adaLN_modulation.0"), 4 * dim, adaln, true);
        }
    };
    for i in 0..refiners {
        block(&mut l, format!("noise_refiner.{i}"), true);
    }
    for i in 0..refiners {
        block(&mut l, format!("context_refiner.{i}"), false);
    }
    for i in 0..layers {
        block(&mut l, format!("layers.{i}"), true);
    }
    l.linear("final_layer.linear", PATCH_FEATURES, dim, true);
    l.linear("final_layer.adaLN_modulation.1", dim, adaln, true);
    Ok(l.specs)
}

/// The rank of a synthetic Z-Image LoRA at `shape`: 4 for the tiny model, 30 at the released width.
fn zimage_lora_rank(shape: &ZImageShape) -> usize {
    (shape.dim / 128).clamp(4, 32)
}

/// A LoRA for the Z-Image DiT at `shape`, as trainers write them for Z-Image-Turbo: every block's attention
/// (`to_q`, `to_k`, `to_v`, `to_out.0`, diffusers' names over ComfyUI's fused `qkv`) and SwiGLU
/// (`feed_forward.w1/w2/w3`) adapted at rank [`zimage_lora_rank`], under `diffusion_model.` with `lora_A`
/// (down) and `lora_B` (up) and no alpha (scale 1). `lora_B` is small, so the adapted model stays near the base
/// one.
pub(crate) fn zimage_lora_specs(shape: &ZImageShape) -> Result<Vec<Spec>> {
    shape.validate()?;
    let ZImageShape { dim, layers, refiners, ffn_hidden, .. } = *shape;
    let rank = zimage_lora_rank(shape);
    let mut l = Layout::new();
    let adapt = |l: &mut Layout, name: String, out: usize, inp: usize| {
        l.specs.extend(lora_pair(&format!("diffusion_model.{name}"), out, inp, rank));
    };
    let blocks = (0..refiners)
        .map(|i| format!("noise_refiner.{i}"))
        .chain((0..refiners).map(|i| format!("context_refiner.{i}")))
        .chain((0..layers).map(|i| format!("layers.{i}")));
    for block in blocks {
        for part in ["to_q", "to_k", "to_v", "to_out.0"] {
            adapt(&mut l, format!("{block}.attention.{part}"), dim, dim);
        }
        adapt(&mut l, format!("{block}.feed_forward.w1"), ffn_hidden, dim);
        adapt(&mut l, format!("{block}.feed_forward.w2"), dim, ffn_hidden);
        adapt(&mut l, format!("{block}.feed_forward.w3"), ffn_hidden, dim);
    }
    Ok(l.specs)
}

/// The Qwen3 encoder's tensors at `shape` with their initialisation.
pub(crate) fn qwen3_specs(shape: &Qwen3Shape) -> Result<Vec<Spec>> {
    shape.validate()?;
    let Qwen3Shape { vocab, hidden, layers, heads, kv_heads, head_dim, intermediate } = *shape;
    let mut l = Layout::new();
    // torch's nn.Embedding draws N(0, 1); uniform ±1 keeps the same order of magnitude.
    l.push("model.embed_tokens.weight".into(), &[vocab, hidden], Init::Uniform(1.0));
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        l.linear(&format!("{p}.self_attn.q_proj"), heads * head_dim, hidden, false);
        l.linear(&format!("{p}.self_attn.k_proj"), kv_heads * head_dim, hidden, false);
        l.linear(&format!("{p}.self_attn.v_proj"), kv_heads * head_dim, hidden, false);
        l.linear(&format!("{p}.self_attn.o_proj"), hidden, heads * head_dim, false);
        l.norm(&format!("{p}.self_attn.q_norm"), head_dim, false);
        l.norm(&format!("{p}.self_attn.k_norm"), head_dim, false);
        l.linear(&format!("{p}.mlp.gate_proj"), intermediate, hidden, false);
        l.linear(&format!("{p}.mlp.up_proj"), intermediate, hidden, false);
        l.linear(&format!("{p}.mlp.down_proj"), hidden, intermediate, false);
        l.norm(&format!("{p}.input_layernorm"), hidden, false);
        l.norm(&format!("{p}.post_attention_layernorm"), hidden, false);
    }
    l.norm("model.norm", hidden, false);
    Ok(l.specs)
}

/// The Flux VAE's tensors at `shape` with their initialisation (LDM layout, as `ae.safetensors`).
pub(crate) fn vae_specs(shape: &VaeShape) -> Result<Vec<Spec>> {
    shape.validate()?;
    let VaeShape { ch, ref ch_mult, res_blocks, z } = *shape;
    let levels = ch_mult.len();
    let top = ch * ch_mult[levels - 1];
    let mut l = Layout::new();
    let resnet = |l: &mut Layout, name: String, cin: usize, cout: usize| {
        l.norm(&format!("{name}.norm1"), cin, true);
        l.conv(&format!("{name}.conv1"), cout, cin, 3);
        l.norm(&format!("{name}.norm2"), cout, true);
        l.conv(&format!("{name}.conv2"), cout, cout, 3);
        if cin != cout {
            l.conv(&format!("{name}.nin_shortcut"), cout, cin, 1);
        }
    };
    let mid = |l: &mut Layout, name: &str| {
        resnet(l, format!("{name}.mid.block_1"), top, top);
        l.norm(&format!("{name}.mid.attn_1.norm"), top, true);
        for conv in ["q", "k", "v", "proj_out"] {
            l.conv(&format!("{name}.mid.attn_1.{conv}"), top, top, 1);
        }
        resnet(l, format!("{name}.mid.block_2"), top, top);
    };

    l.conv("encoder.conv_in", ch, 3, 3);
    let mut width = ch;
    for (i, &mult) in ch_mult.iter().enumerate() {
        let out = ch * mult;
        for j in 0..res_blocks {
            resnet(&mut l, format!("encoder.down.{i}.block.{j}"), width, out);
            width = out;
        }
        if i + 1 < levels {
            l.conv(&format!("encoder.down.{i}.downsample.conv"), width, width, 3);
        }
    }
    mid(&mut l, "encoder");
    l.norm("encoder.norm_out", top, true);
    l.conv("encoder.conv_out", 2 * z, top, 3);

    l.conv("decoder.conv_in", top, z, 3);
    mid(&mut l, "decoder");
    let mut width = top;
    for (i, &mult) in ch_mult.iter().enumerate().rev() {
        let out = ch * mult;
        for j in 0..=res_blocks {
            resnet(&mut l, format!("decoder.up.{i}.block.{j}"), width, out);
            width = out;
        }
        if i > 0 {
            l.conv(&format!("decoder.up.{i}.upsample.conv"), width, width, 3);
        }
    }
    l.norm("decoder.norm_out", ch, true);
    l.conv("decoder.conv_out", 3, ch, 3);
    Ok(l.specs)
}

/// SD's KL autoencoder (`vae-ft-mse-840000-ema-pruned.safetensors`, LDM names) at `shape`'s widths and z:
/// [`vae_specs`] plus `quant_conv` (1×1, 2z → 2z) and `post_quant_conv` (1×1, z → z).
pub(crate) fn sd_vae_specs(shape: &VaeShape) -> Result<Vec<Spec>> {
    let z = shape.z;
    let mut l = Layout { specs: vae_specs(shape)? };
    l.conv("quant_conv", 2 * z, 2 * z, 1);
    l.conv("post_quant_conv", z, z, 1);
    Ok(l.specs)
}

/// Latent channels of the FLUX.2 VAE before its 2×2 patchify.
const FLUX2_Z: usize = 32;

/// The FLUX.2 VAE (`flux2-vae.safetensors`, BFL's names) at `shape`'s widths with z 32: [`vae_specs`] plus
/// `encoder.quant_conv` (1×1, 64 → 64), `decoder.post_quant_conv` (1×1, 32 → 32) and the latent BatchNorm's
/// running statistics `bn.running_mean` (0) and `bn.running_var` (1), 128 each.
pub(crate) fn flux2_vae_specs(shape: &VaeShape) -> Result<Vec<Spec>> {
    let z = FLUX2_Z;
    let mut l = Layout { specs: vae_specs(&VaeShape { z, ..shape.clone() })? };
    l.conv("encoder.quant_conv", 2 * z, 2 * z, 1);
    l.conv("decoder.post_quant_conv", z, z, 1);
    l.push("bn.running_mean".into(), &[4 * z], Init::Zeros);
    l.push("bn.running_var".into(), &[4 * z], Init::Ones);
    Ok(l.specs)
}
