//! Loading model files as ComfyUI's loader nodes do: the file's header decides what it is (keys, shapes,
//! metadata; never its name), ComfyUI's prefix rules apply, a combined checkpoint is split by prefix, and a
//! file Kiln cannot run is refused with a message naming the file and what was found.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::DType;
use kiln_compute::memory::{LoadPlan, Model, SafetensorsFile};
use kiln_compute::quant::Quant;
use kiln_models::family::{
    ClipVisionDetected, ControlNetDetected, DiffusionDetected, DiffusionFamily, ModelPatchDetected,
    StyleModelDetected, TextEncoderDetected, TextEncoderFamily, TextEncoderNet, VaeDetected,
    VaeFamily,
};
use kiln_models::header::diffusion_prefix;
use kiln_models::quant::{LinearPath, Quantization};
use kiln_models::sampling::guidance::Guidance;
use kiln_models::{Error, Header};

use super::{
    AudioEncoder, AudioEncoderNet, ClipVision, ControlNet, DiffusionModel, ModelEnv, ModelPatch,
    StyleModel, TextEncoder, UpscaleModel, Vae,
};

/// Opens a model file's header, refusing what is not a safetensors file with a message that says what it is.
fn open(path: &Path) -> Result<SafetensorsFile, Error> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
    let unsupported =
        |msg: &str| Error::Unsupported { path: path.to_path_buf(), msg: msg.to_owned() };
    if name.ends_with(".gguf") {
        return Err(unsupported("GGUF files are not supported; use a .safetensors file"));
    }
    if [".ckpt", ".pt", ".pt2", ".pth", ".bin", ".pkl"].iter().any(|ext| name.ends_with(ext)) {
        return Err(unsupported(
            "pickled checkpoints are not loaded (they can run code); use a .safetensors file",
        ));
    }
    Ok(SafetensorsFile::open(path)?)
}

/// The quantization of `file`, after refusing what Kiln cannot run under the header's prefix: layers in a
/// quantization format it lacks (named with the format), then tensors of a dtype it does not compute with.
fn formats(file: &SafetensorsFile, header: &Header<'_>) -> Result<Quantization, Error> {
    let quant = Quantization::read(file)?;
    quant.refuse_unsupported(file, header.prefix())?;
    refuse_unsupported_dtypes(header)?;
    Ok(quant)
}

/// Refuses a header with tensors of a dtype Kiln does not compute with (packed 4-bit formats, integer
/// weights), naming a few; quantization markers are not weights.
fn refuse_unsupported_dtypes(header: &Header<'_>) -> Result<(), Error> {
    let found: Vec<(&str, &str)> = header
        .unsupported_dtypes()
        // BatchNorm's step counter (an int64 beside the FLUX.2 VAE's running statistics) is never read.
        .filter(|(name, _)| {
            !Quantization::is_bookkeeping(name) && !name.ends_with(".num_batches_tracked")
        })
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    let examples: Vec<String> =
        found.iter().take(3).map(|(name, dtype)| format!("`{name}` is {dtype}")).collect();
    Err(header.unsupported(format!(
        "{} tensors have a dtype Kiln cannot compute with ({}): use a bf16, f16, f32, fp8 (e4m3fn, e5m2) or \
         scaled fp8 file",
        found.len(),
        examples.join(", ")
    )))
}

/// What a header that is none of the expected families looks like, in words (for the refusal).
fn describe(header: &Header<'_>) -> String {
    let has_prefix = |p: &str| header.names().any(|n| n.starts_with(p));
    let family = if has_prefix("double_blocks.") {
        "a Flux-style diffusion model"
    } else if has_prefix("input_blocks.") || has_prefix("model.diffusion_model.input_blocks.") {
        "a Stable Diffusion UNet"
    } else if has_prefix("joint_blocks.") {
        "an SD3 MMDiT"
    } else if is_mistral_small(header) {
        "FLUX.2 dev's Mistral Small 3.x text encoder, incomplete"
    } else if has_prefix("model.layers.") {
        "a language-model text encoder"
    } else if has_prefix("text_model.") || has_prefix("encoder.block.") {
        // Before the autoencoder test: T5's `encoder.block.` keys also start with `encoder.`.
        "a CLIP or T5 text encoder"
    } else if has_prefix("decoder.") || has_prefix("encoder.") {
        "an autoencoder"
    } else {
        "an unknown model"
    };
    let count = header.names().count();
    format!("{family} ({count} tensors)")
}

/// Whether `header` is FLUX.2 dev's Mistral Small 3.x text encoder as ComfyUI recognises it (`sd.py`
/// `detect_te_model`): `model.layers.0.post_attention_layernorm.weight` 5120 wide and no q/k norms.
fn is_mistral_small(header: &Header<'_>) -> bool {
    header.shape("model.layers.0.post_attention_layernorm.weight") == Some(&[5120][..])
        && !header.has("model.layers.0.self_attn.q_norm.weight")
}

/// The families' names for a refusal: `Z-Image` or `Z-Image, Flux`.
fn names<F: Copy>(all: &[F], name: fn(F) -> &'static str) -> String {
    all.iter().map(|&f| name(f)).collect::<Vec<_>>().join(", ")
}

/// Loads the weights `plan` names through the device's memory manager.
fn load_weights(
    env: &ModelEnv,
    plan: &LoadPlan,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Model, Error> {
    Ok(env.compute.manager().load(plan, progress)?)
}

/// Loads the weights `plan` names with every tensor cast to `dtype` (UNETLoader's `weight_dtype`, as ComfyUI
/// builds the model in that dtype and copies the file's weights into it): read one weight at a time, widened
/// and rounded to nearest even in RAM, so the model is held in RAM at its new size rather than pinned from the
/// file.
fn load_weights_as(
    env: &ModelEnv,
    plan: &LoadPlan,
    dtype: DType,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Model, Error> {
    let files = plan.files.iter().map(SafetensorsFile::open).collect::<Result<Vec<_>, _>>()?;
    let total: u64 = files.iter().map(SafetensorsFile::data_len).sum();
    let mut done = 0;
    let mut tensors = Vec::with_capacity(plan.slots.len());
    for slot in &plan.slots {
        let mut values = Vec::new();
        let mut shape: Vec<usize> = Vec::new();
        for (index, name) in &slot.parts {
            let file = &files[*index];
            let info = file.tensor(name)?;
            let bytes = file.source().read_vec(info.offset, info.len)?;
            values.extend(kiln_compute::dtype::widen(info.dtype, &bytes));
            match shape.first_mut() {
                // Parts join along the first dimension (a diffusers file's to_q, to_k, to_v).
                Some(rows) => *rows += info.shape.first().copied().unwrap_or(1),
                None => shape.clone_from(&info.shape),
            }
            done += info.len;
            progress(done, total);
        }
        // A quantized weight is dequantized first (fp8 · scale), then cast; the formats with scale tables
        // were refused before.
        if let Quant::Tensor(scale) = slot.quant {
            values.iter_mut().for_each(|v| *v *= scale);
        }
        tensors.push((
            slot.name.clone(),
            dtype,
            shape,
            kiln_compute::dtype::narrow(dtype, &values),
        ));
    }
    Ok(env.compute.manager().load_tensors(tensors)?)
}

/// Loads a diffusion model under `prefix` of `file` (a standalone file: ComfyUI's prefix rule), its weights
/// cast to `weight_dtype` when one is given.
fn diffusion_model(
    env: &ModelEnv,
    file: &SafetensorsFile,
    prefix: &str,
    weight_dtype: Option<DType>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiffusionModel, Error> {
    let header = Header::new(file, prefix);
    let quant = formats(file, &header)?;
    let Some(found) = DiffusionDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a diffusion model Kiln can run ({}): found {}",
            names(&DiffusionFamily::ALL, DiffusionFamily::name),
            describe(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(file, &mut plan, LinearPath::Quantized)?;
    let weights = match weight_dtype {
        Some(dtype) if quant.has_tables() => {
            return Err(header.unsupported(format!(
                "weight_dtype {dtype} asks to cast an int8, MXFP8 or NVFP4 model, whose layers Kiln keeps in \
                 their own format: choose weight_dtype `default`"
            )));
        }
        Some(dtype) => load_weights_as(env, &plan, dtype, progress)?,
        None => load_weights(env, &plan, progress)?,
    };
    let (family, sampling) = (found.family(), found.sampling());
    let half = env.compute.device().computes_in_16_bits();
    let stored = weight_dtype.or(header.weight_dtype());
    let compute_dtype = found.compute_dtype(stored, half);
    // ComfyUI logs the same choice ("model weight dtype …, manual cast: …").
    tracing::info!(
        path = %file.path().display(),
        family = family.name(),
        weights = stored.map_or("none", DType::name),
        compute = compute_dtype.name(),
        "loaded a diffusion model"
    );
    Ok(DiffusionModel {
        net: Arc::new(found.build(weights)),
        sampling,
        compute_dtype,
        latent: family.latent(),
        path: file.path().to_path_buf(),
        patches: Arc::default(),
        guidance: Guidance::default(),
        differential_diffusion: None,
        model_patches: Vec::new(),
        reference_kv_cache: false,
        uso_styles: Vec::new(),
        rope: kiln_models::RopeOptions::default(),
        ar_start: None,
        infinite_talk: None,
        pose_cache: None,
        context_windows: None,
        step_cache: None,
        chroma_radiance: Vec::new(),
    })
}

/// `UNETLoader`: a standalone diffusion model file, its weights cast to `weight_dtype` when one is given
/// (`fp8_e4m3fn`, `fp8_e5m2`).
pub fn load_diffusion_model(
    env: &ModelEnv,
    path: &Path,
    weight_dtype: Option<DType>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<DiffusionModel, Error> {
    let file = open(path)?;
    let names: Vec<&str> = file.tensors().map(|(n, _)| n).collect();
    let prefix = diffusion_prefix(names.iter().copied());
    diffusion_model(env, &file, &prefix, weight_dtype, progress)
}

/// The text encoder under `prefix` of `file`, detected (as `CLIPLoader`'s `clip_type` makes it, when given),
/// and its weights loaded.
fn text_encoder_part(
    env: &ModelEnv,
    file: &SafetensorsFile,
    prefix: &str,
    clip_type: Option<&str>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(TextEncoderDetected, Model), Error> {
    let header = Header::new(file, prefix);
    let quant = formats(file, &header)?;
    let Some(found) = TextEncoderDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a text encoder Kiln can run ({}): found {}",
            names(&TextEncoderFamily::ALL, TextEncoderFamily::name),
            describe(&header)
        )));
    };
    let found = match clip_type {
        Some(kind) => found.for_clip_type(kind).map_err(|e| header.unsupported(e.to_string()))?,
        None => found,
    };
    let mut plan = found.load_plan(&header);
    quant.apply(file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok((found, weights))
}

/// Loads a text encoder under `prefix` of `file`, as `CLIPLoader`'s `clip_type` makes it when given.
fn text_encoder(
    env: &ModelEnv,
    file: &SafetensorsFile,
    prefix: &str,
    clip_type: Option<&str>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TextEncoder, Error> {
    let (found, weights) = text_encoder_part(env, file, prefix, clip_type, progress)?;
    let net = match clip_type {
        Some(kind) => found.build_for_clip_type(weights, kind)?,
        None => found.build(weights)?,
    };
    Ok(TextEncoder::new(net, file.path().to_path_buf()))
}

/// `CLIPLoader`: a standalone text encoder file. `kind` is the loader's `type`, which decides what a Qwen3 file
/// is (ComfyUI's rule, [`TextEncoderDetected::for_clip_type`]): FLUX.2 Klein's encoder with `flux2`/`flux` or at
/// Qwen3-8B's width, Z-Image's otherwise; a Mistral Small 3.x file is FLUX.2 dev's encoder whatever the type.
/// Type `flux2` with another file is refused naming it.
pub fn load_text_encoder(
    env: &ModelEnv,
    path: &Path,
    kind: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TextEncoder, Error> {
    let file = open(path)?;
    let (found, weights) = text_encoder_part(env, &file, "", Some(kind), progress)?;
    let net = found.build_for_clip_type(weights, kind)?;
    Ok(TextEncoder::new(net, file.path().to_path_buf()))
}

/// `DualCLIPLoader`, `TripleCLIPLoader` and `QuadrupleCLIPLoader`: one `CLIP` made of several encoder files,
/// which ComfyUI combines by `kind` (FLUX.1's CLIP-L + T5-XXL, HiDream's four, ...). Each file is detected and
/// loaded first, so a file of a family Kiln lacks is named as such; then the parts are combined
/// ([`TextEncoderNet::combine`]: `flux` is the combination Kiln has).
pub fn load_text_encoders(
    env: &ModelEnv,
    paths: &[PathBuf],
    kind: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TextEncoder, Error> {
    let first = paths.first().cloned().unwrap_or_default();
    let files = paths.iter().map(|p| open(p)).collect::<Result<Vec<_>, Error>>()?;
    // Every file detected and the combination checked before any weight is read.
    let mut detected = Vec::with_capacity(files.len());
    for file in &files {
        let header = Header::new(file, "");
        match TextEncoderDetected::detect(&header)? {
            Some(found) => detected.push(found),
            None => {
                return Err(header.unsupported(format!(
                    "not a text encoder Kiln can run ({}): found {}",
                    names(&TextEncoderFamily::ALL, TextEncoderFamily::name),
                    describe(&header)
                )));
            }
        }
    }
    TextEncoderNet::check_combination(&detected.iter().collect::<Vec<_>>(), kind)
        .map_err(|e| Error::Unsupported { path: first.clone(), msg: e.to_string() })?;
    let mut parts = Vec::with_capacity(files.len());
    for file in &files {
        parts.push(text_encoder_part(env, file, "", None, progress)?);
    }
    let net = TextEncoderNet::combine(parts, kind)
        .map_err(|e| Error::Unsupported { path: first.clone(), msg: e.to_string() })?;
    Ok(TextEncoder::new(net, first))
}

/// Loads a VAE under `prefix` of `file`.
fn vae(
    env: &ModelEnv,
    file: &SafetensorsFile,
    prefix: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vae, Error> {
    let header = Header::new(file, prefix);
    let quant = formats(file, &header)?;
    let Some(found) = VaeDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a VAE Kiln can run ({}): found {}",
            names(&VaeFamily::ALL, VaeFamily::name),
            describe(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok(Vae { net: Arc::new(found.build(weights)), path: file.path().to_path_buf() })
}

/// `VAELoader`: a standalone VAE file.
pub fn load_vae(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vae, Error> {
    let file = open(path)?;
    vae(env, &file, "", progress)
}

/// `VAELoader`'s `pixel_space`: the VAE whose latents are the pixels (ComfyUI's `PixelspaceConversionVAE`), for
/// the pixel-space models (Chroma Radiance); it has no file and no weights.
pub fn pixel_space_vae(env: &ModelEnv) -> Result<Vae, Error> {
    let none =
        load_weights(env, &LoadPlan { files: Vec::new(), slots: Vec::new() }, &mut |_, _| {})?;
    Ok(Vae {
        net: Arc::new(kiln_models::family::VaeNet::PixelSpace(none)),
        path: PathBuf::from(kiln_models::family::PIXEL_SPACE_NAME),
    })
}

/// `ControlNetLoader`: a ControlNet file of a family Kiln runs (Qwen-Image's InstantX and Fun ControlNets),
/// its weights read as ComfyUI's ControlNets compute (quantized ones dequantized).
pub fn load_controlnet(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ControlNet, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let quant = formats(&file, &header)?;
    let Some(found) = ControlNetDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a ControlNet Kiln can run (Qwen-Image's InstantX and Fun ControlNets): found {}",
            describe(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(&file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok(ControlNet { net: Arc::new(found.build(weights)), path: file.path().to_path_buf() })
}

/// `ModelPatchLoader`: a model patch file of a kind Kiln runs (DiffSynth's block-wise ControlNet for
/// Qwen-Image, the Z-Image Fun ControlNet); the other kinds ComfyUI loads are refused naming what they are.
pub fn load_model_patch(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ModelPatch, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let quant = formats(&file, &header)?;
    let Some(found) = ModelPatchDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a model patch Kiln can run (DiffSynth's Qwen-Image ControlNets, the Z-Image Fun ControlNet): \
             found {}",
            describe_patch(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(&file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok(ModelPatch { net: Arc::new(found.build(weights)), path: file.path().to_path_buf() })
}

/// `CLIPVisionLoader`: a vision tower in the Hugging Face `vision_model.*` layout (OpenCLIP ViT-H/14, SigLIP,
/// ViT-L, ViT-bigG), its weights read as ComfyUI's towers compute (quantized ones dequantized).
pub fn load_clip_vision(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ClipVision, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let quant = formats(&file, &header)?;
    let Some(found) = ClipVisionDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a CLIP vision model Kiln can run (CLIP and SigLIP towers in the `vision_model.*` layout): \
             found {}",
            describe(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(&file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok(ClipVision { net: Arc::new(found.build(weights)), path: file.path().to_path_buf() })
}

/// `UpscaleModelLoader`: an ESRGAN upscale model (ESRGAN, Real-ESRGAN ×4, BSRGAN in any of their key layouts);
/// other upscale models spandrel knows are refused naming what Kiln runs.
pub fn load_upscale_model(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<UpscaleModel, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let Some((config, layout)) = kiln_models::esrgan::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not an upscale model Kiln can run (ESRGAN, Real-ESRGAN and BSRGAN's RRDBNet): found {}",
            describe(&header)
        )));
    };
    let plan = kiln_models::esrgan::load_plan(&header, &config, layout);
    let weights = load_weights(env, &plan, progress)?;
    Ok(UpscaleModel {
        net: Arc::new(kiln_models::esrgan::Esrgan::new(config, weights)),
        path: file.path().to_path_buf(),
    })
}

/// `AudioEncoderLoader`: an audio encoder ComfyUI loads: Whisper large-v3 (`model.encoder.*`, or bare
/// `encoder.*`) or wav2vec2, large or base (with or without the `wav2vec2.` prefix).
pub fn load_audio_encoder(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<AudioEncoder, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let net = if let Some((config, layout)) = kiln_models::whisper::detect(&header)? {
        let plan = kiln_models::whisper::load_plan(&header, &config, layout);
        let weights = load_weights(env, &plan, progress)?;
        AudioEncoderNet::Whisper(kiln_models::whisper::Whisper::new(config, weights))
    } else if let Some((config, layout)) = kiln_models::wav2vec2::detect(&header)? {
        let plan = kiln_models::wav2vec2::load_plan(&header, &config, layout);
        let weights = load_weights(env, &plan, progress)?;
        AudioEncoderNet::Wav2Vec2(kiln_models::wav2vec2::Wav2Vec2::new(config, weights))
    } else {
        return Err(header.unsupported(format!(
            "not an audio encoder Kiln can run (Whisper large-v3, wav2vec2): found {}",
            describe(&header)
        )));
    };
    Ok(AudioEncoder { net: Arc::new(net), path: file.path().to_path_buf() })
}

/// `StyleModelLoader`: a style model Kiln runs (FLUX.1 Redux); the SD1.x T2I style adapter ComfyUI also
/// loads is refused naming it.
pub fn load_style_model(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<StyleModel, Error> {
    let file = open(path)?;
    let header = Header::new(&file, "");
    let quant = formats(&file, &header)?;
    let Some(found) = StyleModelDetected::detect(&header)? else {
        return Err(header.unsupported(format!(
            "not a style model Kiln can run (FLUX.1 Redux): found {}",
            describe(&header)
        )));
    };
    let mut plan = found.load_plan(&header);
    quant.apply(&file, &mut plan, LinearPath::Dequantized)?;
    let weights = load_weights(env, &plan, progress)?;
    Ok(StyleModel { net: Arc::new(found.build(weights)), path: file.path().to_path_buf() })
}

/// What a model patch Kiln does not run is, by the keys ComfyUI's `ModelPatchLoader` tells them apart by.
fn describe_patch(header: &Header<'_>) -> String {
    let has = |key: &str| header.names().any(|n| n == key || n.ends_with(key));
    let kind = if has("lllite_conditioning1.conv1.weight") {
        "an Anima LLLite patch"
    } else if has("controlnet_patch_embedding.weight") {
        "a Wan Uni3C ControlNet"
    } else if has("audio_proj.proj1.weight") {
        "a MultiTalk patch"
    } else if has("control_model.input_hint_block.0.weight") {
        "a SUPIR patch"
    } else if has("attention_pooler.query_tokens") {
        "an LTX duration head"
    } else {
        return describe(header);
    };
    format!("{kind} ({} tensors), which Kiln does not run yet", header.names().count())
}

/// `CheckpointLoaderSimple`: one file holding the diffusion model (under ComfyUI's prefix rule) and, under the
/// prefixes its family's description names, the text encoder and the VAE. A part the file lacks is `None`
/// (ComfyUI returns `None` on that output, and a node using it fails).
pub fn load_checkpoint(
    env: &ModelEnv,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(DiffusionModel, Option<TextEncoder>, Option<Vae>), Error> {
    let file = open(path)?;
    let names: Vec<&str> = file.tensors().map(|(n, _)| n).collect();
    let prefix = diffusion_prefix(names.iter().copied());
    let model = diffusion_model(env, &file, &prefix, None, progress)?;
    let family = model.net.family();
    let has = |p: &str| names.iter().any(|n| n.starts_with(p));
    // ComfyUI's SDXL config switches the model sampling on these keys (`supported_models.SDXL.model_type`);
    // Kiln samples SDXL as EPS only, so such a checkpoint is refused rather than run wrongly.
    let sdxl = matches!(family, DiffusionFamily::Sdxl | DiffusionFamily::SdxlRefiner);
    let other_sampling =
        ["v_pred", "edm_vpred.sigma_max", "edm_mean"].iter().find(|k| names.contains(k));
    if let (true, Some(key)) = (sdxl, other_sampling) {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            msg: format!(
                "an SDXL checkpoint marked `{key}` (v-prediction, EDM or Playground's sampling), which Kiln does \
                 not run yet; Kiln samples SDXL as ε-prediction"
            ),
        });
    }
    // The encoder's files, each under its prefix (FLUX.1's two); one the checkpoint lacks leaves the CLIP out.
    let prefixes = family.checkpoint_text_encoders();
    let clip = match prefixes {
        [prefix] if has(prefix) => {
            // The family's own encoder, as ComfyUI's `clip_target` makes it (LongCat-Image's Qwen2.5-VL, say).
            let kind = family.checkpoint_text_encoder_kind();
            let kind = (!kind.is_empty()).then_some(kind);
            Some(text_encoder(env, &file, prefix, kind, progress)?)
        }
        // SD3's checkpoints hold any of their three encoders (ComfyUI's `SD3.clip_target`); the others all.
        _ if prefixes.len() > 1
            && (prefixes.iter().all(|p| has(p))
                || (family == DiffusionFamily::Sd3 && prefixes.iter().any(|p| has(p)))) =>
        {
            let mut parts = Vec::with_capacity(prefixes.len());
            for prefix in prefixes.iter().filter(|p| has(p)) {
                parts.push(text_encoder_part(env, &file, prefix, None, progress)?);
            }
            let net = TextEncoderNet::combine(parts, family.checkpoint_text_encoder_kind())
                .map_err(|e| Error::Unsupported { path: path.to_path_buf(), msg: e.to_string() })?;
            Some(TextEncoder::new(net, path.to_path_buf()))
        }
        _ => None,
    };
    let (_, vae_prefix) = family.checkpoint_vae();
    let vae = if has(vae_prefix) { Some(vae(env, &file, vae_prefix, progress)?) } else { None };
    Ok((model, clip, vae))
}

/// `LoraLoader`: `model` and `clip` with the LoRA in `path` stacked on their patches, the model's adapters
/// at `strength_model`, the encoder's at `strength_clip` (one at 0 is left as it is). The file must adapt a
/// weight of one of them; keys that adapt neither are logged, as ComfyUI logs them.
pub fn load_lora_for_both(
    model: &DiffusionModel,
    clip: &TextEncoder,
    path: &Path,
    strength_model: f32,
    strength_clip: f32,
) -> Result<(DiffusionModel, TextEncoder), Error> {
    let file = open(path)?;
    let model_weights = model.net.weights();
    let model_slots: Vec<(&str, &[usize])> = model_weights
        .names()
        .filter_map(|n| model_weights.info(n).map(|(_, shape)| (n, shape)))
        .collect();
    let for_model = model.net.lora(&file, &model_slots, strength_model)?;
    let clip_weights = clip.net.weights();
    let clip_slots: Vec<(&str, &[usize])> = clip_weights
        .names()
        .filter_map(|n| clip_weights.info(n).map(|(_, shape)| (n, shape)))
        .collect();
    let for_clip = clip.net.family().lora(&file, &clip_slots, strength_clip)?;
    if for_model.patches.is_empty() && for_clip.patches.is_empty() {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            msg: format!(
                "no key adapts a weight of {} or of {}: a LoRA for another model?",
                model.path.display(),
                clip.path.display()
            ),
        });
    }
    let neither: Vec<&String> =
        for_model.unmatched.iter().filter(|k| for_clip.unmatched.contains(k)).collect();
    if let Some(first) = neither.first() {
        tracing::warn!(
            lora = %path.display(),
            unmatched = neither.len(),
            first = %first,
            "LoRA keys that adapt no weight were not loaded"
        );
    }
    let model =
        if strength_model == 0.0 { model.clone() } else { model.with_patches(for_model.patches) };
    let clip =
        if strength_clip == 0.0 { clip.clone() } else { clip.with_patches(for_clip.patches) };
    Ok((model, clip))
}

/// `LoraLoaderModelOnly`: `model` with the LoRA in `path` at `strength` stacked on its patches. Keys that adapt
/// no weight of the model are logged, as ComfyUI logs them.
pub fn load_lora(
    model: &DiffusionModel,
    path: &Path,
    strength: f32,
) -> Result<DiffusionModel, Error> {
    let file = open(path)?;
    let weights = model.net.weights();
    let slots: Vec<(&str, &[usize])> =
        weights.names().filter_map(|n| weights.info(n).map(|(_, shape)| (n, shape))).collect();
    let found = model.net.lora(&file, &slots, strength)?;
    if found.patches.is_empty() {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            msg: format!(
                "no key adapts a weight of {} ({} keys unmatched): a LoRA for another model?",
                model.path.display(),
                found.unmatched.len()
            ),
        });
    }
    if !found.unmatched.is_empty() {
        tracing::warn!(
            lora = %path.display(),
            unmatched = found.unmatched.len(),
            first = %found.unmatched[0],
            "LoRA keys that adapt no weight were not loaded"
        );
    }
    Ok(model.with_patches(found.patches))
}

#[cfg(test)]
mod tests {
    use kiln_compute::memory::SafetensorsFile;
    use kiln_models::Header;

    use super::describe;

    /// A safetensors file of zero-filled bf16 `tensors` (name, shape).
    fn write(path: &std::path::Path, tensors: &[(&str, Vec<usize>)]) {
        let zeros: Vec<Vec<u8>> =
            tensors.iter().map(|(_, s)| vec![0; s.iter().product::<usize>() * 2]).collect();
        let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .zip(&zeros)
            .map(|((name, shape), data)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::BF16,
                    shape.clone(),
                    data,
                )
                .expect("a view");
                (*name, view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).expect("a file");
    }

    #[test]
    fn flux2_devs_mistral_encoder_is_named() {
        let dir = std::env::temp_dir().join(format!("kiln-load-mistral-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mistral.safetensors");
        let norm = "model.layers.0.post_attention_layernorm.weight";
        write(&path, &[(norm, vec![5120]), ("model.embed_tokens.weight", vec![4, 5120])]);
        let file = SafetensorsFile::open(&path).unwrap();
        assert!(describe(&Header::new(&file, "")).contains("Mistral Small"));
        // Another width is some other language model.
        let path = dir.join("other.safetensors");
        write(&path, &[(norm, vec![3072]), ("model.embed_tokens.weight", vec![4, 3072])]);
        let file = SafetensorsFile::open(&path).unwrap();
        assert!(describe(&Header::new(&file, "")).starts_with("a language-model text encoder"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
