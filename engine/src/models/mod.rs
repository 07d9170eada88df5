//! The model values that flow on links (`MODEL`, `CLIP`, `VAE`, `CONDITIONING`, `CLIP_VISION`, `STYLE_MODEL`), how the loader nodes find and
//! load model files ([`ModelFiles`], [`load`]), and running model code on the device the process chose
//! (`device`).
//!
//! The networks themselves live in `kiln_models`; this module adds what the engine needs around them:
//! ComfyUI's model folders, its prefix and detection rules, and the sampling settings and patches a `MODEL`
//! carries. The values dispatch on `kiln_models::family`'s enums, so they hold a network of any family.

pub mod context_windows;
pub(crate) mod device;
mod guidance;
pub mod load;
mod region;

pub use guidance::{DualCfg, Guider, Noise, PerpNeg};
pub use region::{Area, PromptRegion};

use std::path::PathBuf;
use std::sync::Arc;

use kiln_compute::DType;
use kiln_compute::memory::lora::PatchSet;
use kiln_models::family::{
    ClipVisionNet, ControlNetNet, DiffusionNet, ModelPatchNet, StyleModelNet, TextEncoderNet,
    VaeNet,
};
pub use kiln_models::latent::LatentFormat;
use kiln_models::sampling::ModelSampling;
use kiln_models::sampling::guidance::Guidance;

use crate::compute::Compute;
use crate::tensor::Tensor;

/// The model folders the loader nodes list and read (ComfyUI's `folder_paths`): implemented by the server
/// over its configured folders (`--extra-model-paths-config` included).
pub trait ModelFiles: Send + Sync {
    /// The files of a folder (`diffusion_models`, `text_encoders`, `vae`, `checkpoints`, `loras`), as the
    /// combos list them: relative names, sorted.
    fn list(&self, folder: &str) -> Vec<String>;
    /// The path of a listed file, or `None` when there is no such file.
    fn find(&self, folder: &str, name: &str) -> Option<PathBuf>;
}

/// Model folders as plain directories, `<root>/<folder>/` (ComfyUI's layout under `models/`), for
/// embedding the engine and for tests; the server uses its configured folders instead.
#[derive(Debug, Clone)]
pub struct FolderTree {
    root: PathBuf,
}

impl FolderTree {
    /// The folders under `root`.
    pub fn new(root: impl Into<PathBuf>) -> FolderTree {
        FolderTree { root: root.into() }
    }
}

impl ModelFiles for FolderTree {
    fn list(&self, folder: &str) -> Vec<String> {
        let base = self.root.join(folder);
        let mut names = Vec::new();
        let mut stack = vec![base.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(relative) = path.strip_prefix(&base) {
                    names.push(relative.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        names.sort();
        names
    }

    fn find(&self, folder: &str, name: &str) -> Option<PathBuf> {
        crate::roots::within(&self.root.join(folder), name).filter(|p| p.is_file())
    }
}

/// What the model nodes need: the model folders and the device with its memory manager.
#[derive(Clone)]
pub struct ModelEnv {
    /// Where model files are.
    pub files: Arc<dyn ModelFiles>,
    /// The device models run on and the memory manager their weights live in.
    pub compute: Arc<Compute>,
}

impl ModelEnv {
    /// Model folders under `root` ([`FolderTree`]) and the CPU (tests, benchmarks, embedding without a GPU).
    pub fn cpu(root: impl Into<PathBuf>) -> ModelEnv {
        let options = crate::compute::ComputeOptions {
            force_cpu: true,
            pinned_memory: false,
            ..Default::default()
        };
        ModelEnv {
            files: Arc::new(FolderTree::new(root)),
            compute: Arc::new(Compute::start(options)),
        }
    }
}

impl std::fmt::Debug for ModelEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelEnv({:?})", self.compute)
    }
}

/// `MODEL`: a diffusion network of any family with the sampling settings nodes like `ModelSamplingAuraFlow`
/// change (a changed copy shares the network).
#[derive(Clone)]
pub struct DiffusionModel {
    /// The network (weights under the memory manager).
    pub net: Arc<DiffusionNet>,
    /// The sigma schedule's model side (flow shift and multiplier, or the discrete table).
    pub sampling: ModelSampling,
    /// The type its activations are computed in on this device, as ComfyUI picks it
    /// ([`kiln_models::family::DiffusionDetected::compute_dtype`]: f16 for Wan on CUDA, f32 on the CPU).
    pub compute_dtype: DType,
    /// The latent space it denoises in.
    pub latent: LatentFormat,
    /// The file it came from (for messages).
    pub path: PathBuf,
    /// Weight patches (LoRA) applied in place while this model samples, by weight name, in order.
    pub patches: Arc<Vec<(String, PatchSet)>>,
    /// How its predictions combine (the CFG hooks of `CFGNorm`, `RescaleCFG`, `CFGZeroStar`).
    pub guidance: Guidance,
    /// `DifferentialDiffusion`'s strength, when set: an inpainting mask is thresholded at each step by how far
    /// sampling has come (its `denoise_mask_function`).
    pub differential_diffusion: Option<f32>,
    /// Model patches run after every block (`QwenImageDiffsynthControlnet`), in the order they were applied.
    pub model_patches: Vec<ModelPatchApplication>,
    /// `FluxKVCache`: each sampling run stores the reference latents' keys and values on its first model call
    /// and leaves their tokens out of the later ones; the reference method defaults to `index_timestep_zero`.
    pub reference_kv_cache: bool,
    /// `USOStyleReference`s in the order they were applied; each puts its style tokens before the text (so the
    /// last applied comes first).
    pub uso_styles: Vec<UsoStyle>,
    /// `ScaleROPE`'s scales and shifts of the token positions (the identity unless it was applied).
    pub rope: kiln_models::RopeOptions,
    /// `ARVideoI2V`'s start image latent `[1, C, n, h, w]` (VAE space): the `ar_video` sampler shows it to a
    /// causal model first and keeps it as the video's first frames.
    pub ar_start: Option<Arc<Tensor>>,
    /// `WanInfiniteTalkToVideo`'s InfiniteTalk patch with the audio it projected (the negative reads it too).
    pub infinite_talk: Option<Arc<TalkApplication>>,
    /// Wan Animate 2's pose-branch cache (`WanAnimate2Cache`): where and how a sampling run keeps the branch's
    /// block inputs.
    pub pose_cache: Option<kiln_models::wan::CacheSettings>,
    /// `ContextWindowsManual`'s windows: the sampler calls the model on windows of the latent's frames.
    pub context_windows: Option<Arc<context_windows::ContextWindows>>,
    /// `EasyCache` or `LazyCache`: sampling reuses the last output's change where the change so far predicts
    /// little.
    pub step_cache: Option<StepCache>,
    /// `ChromaRadianceOptions` applied to it, in order (each ComfyUI's model function wrapper).
    pub chroma_radiance: Vec<RadianceWindow>,
}

/// One `ChromaRadianceOptions`: the options a Chroma Radiance call takes while σ is within `[end, start]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RadianceWindow {
    /// The options set (at least one).
    pub options: kiln_models::chroma_radiance::RadianceOptions,
    /// The first σ they apply at.
    pub start: f64,
    /// The last σ they apply at.
    pub end: f64,
    /// Whether the options applied before this node's still run after it (ComfyUI's `preserve_wrapper`: the
    /// earlier wrapper is called with what this one set, and sets its own where its window holds σ).
    pub preserve: bool,
}

impl RadianceWindow {
    /// The options a call at `sigma` takes from `windows` (in the order applied), as ComfyUI's chain of
    /// wrappers leaves them: the last applied sets its options where its window holds σ, then hands on to the
    /// one before when it preserves it, whose options replace them where its own window holds σ.
    pub fn options_at(
        windows: &[RadianceWindow],
        sigma: f32,
    ) -> Option<kiln_models::chroma_radiance::RadianceOptions> {
        let sigma = f64::from(sigma);
        let mut found = None;
        for window in windows.iter().rev() {
            if window.end <= sigma && sigma <= window.start {
                found = Some(window.options);
            }
            if !window.preserve {
                break;
            }
        }
        found
    }
}

/// `EasyCache` (`lazy` false: per network call, per prompt) or `LazyCache` (per guided step) on a model: within
/// its part of sampling, a call whose output's relative change, predicted from its input's change, adds up to
/// less than `reuse_threshold` is skipped, its output the input plus the last output's difference from its input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCache {
    /// LazyCache rather than EasyCache.
    pub lazy: bool,
    /// How much predicted relative change may add up before the network runs again.
    pub reuse_threshold: f64,
    /// Where in sampling skipping may start.
    pub start_percent: f64,
    /// Where the cache stops: from there on the network always runs.
    pub end_percent: f64,
    /// Whether each decision is logged.
    pub verbose: bool,
}

/// InfiniteTalk on a model (`WanInfiniteTalkToVideo`): its patch and projected audio, which every block attends
/// to, and the motion latent every model call sees as the video's first frames.
pub struct TalkApplication {
    /// The patch (`MODEL_PATCH`).
    pub patch: Arc<ModelPatch>,
    /// The projected audio `[1, latent frames, speakers · tokens, width]`.
    pub audio: Tensor,
    /// How much of the audio attention is added.
    pub scale: f32,
    /// Two speakers' token masks `[2, rows · cols]` (1 where a token of the first frame is the speaker's).
    pub masks: Option<Tensor>,
    /// The latent `[1, C, m, h, w]` (VAE space) put over the first m frames of what the model sees at every call
    /// (ComfyUI's `MultiTalkApplyModelWrapper`): the start image's, or the previous clip's last frames'.
    pub motion: Tensor,
    /// Whether this continues a previous clip: the sampled latent's first m frames are then the motion latent
    /// itself (ComfyUI's `InfiniteTalkOuterSampleWrapper` with `is_extend`).
    pub extend: bool,
}

impl DiffusionModel {
    /// A copy with other sampling settings (the network and the patches are shared).
    pub fn with_sampling(&self, sampling: impl Into<ModelSampling>) -> DiffusionModel {
        let sampling = sampling.into();
        DiffusionModel { sampling, ..self.clone() }
    }

    /// A copy whose predictions combine by `guidance` (the network and the patches are shared).
    pub fn with_guidance(&self, guidance: Guidance) -> DiffusionModel {
        DiffusionModel { guidance, ..self.clone() }
    }

    /// A copy with `more` patches applied after the ones it has (stacked LoRA loaders).
    pub fn with_patches(&self, more: Vec<(String, PatchSet)>) -> DiffusionModel {
        DiffusionModel { patches: Arc::new(stack_patches(&self.patches, more)), ..self.clone() }
    }

    /// Readies the network for sampling, as ComfyUI loads a model before it samples: its weights get the top
    /// residency priority (after `/free` unloaded them, they are faulted back in), and this model's patches are
    /// put on them (a no-op for weights whose patches are already these; copies of one network may carry
    /// different patches).
    pub fn activate(&self) -> Result<(), kiln_models::Error> {
        self.net.weights().activate()?;
        Ok(self.net.weights().set_patches(self.patches.as_ref().clone())?)
    }
}

/// `CLIP`: a text encoder of any family with its tokenizer (and the LoRA patches `LoraLoader` gave it).
#[derive(Clone)]
pub struct TextEncoder {
    /// The network and its tokenizer.
    pub net: Arc<TextEncoderNet>,
    /// The file it came from.
    pub path: PathBuf,
    /// Weight patches (LoRA) applied in place while this encoder runs, by weight name, in order.
    pub patches: Arc<Vec<(String, PatchSet)>>,
    /// `T5TokenizerOptions`' settings for its T5-XXL tokens.
    pub t5_options: kiln_models::family::T5Options,
}

impl TextEncoder {
    /// An encoder without patches.
    pub fn new(net: TextEncoderNet, path: PathBuf) -> TextEncoder {
        TextEncoder {
            net: Arc::new(net),
            path,
            patches: Arc::default(),
            t5_options: Default::default(),
        }
    }

    /// A copy with `more` patches applied after the ones it has (stacked LoRA loaders).
    pub fn with_patches(&self, more: Vec<(String, PatchSet)>) -> TextEncoder {
        TextEncoder { patches: Arc::new(stack_patches(&self.patches, more)), ..self.clone() }
    }

    /// Readies the encoder to run, as ComfyUI loads a CLIP before it encodes: top residency priority for its
    /// weights, and this encoder's patches on them.
    pub fn activate(&self) -> Result<(), kiln_models::Error> {
        for weights in self.net.models() {
            weights.activate()?;
        }
        Ok(self.net.weights().set_patches(self.patches.as_ref().clone())?)
    }
}

/// `existing` with `more` after them: a weight's patch sets extended, new weights appended.
fn stack_patches(
    existing: &[(String, PatchSet)],
    more: Vec<(String, PatchSet)>,
) -> Vec<(String, PatchSet)> {
    let mut patches = existing.to_vec();
    for (name, set) in more {
        match patches.iter_mut().find(|(n, _)| *n == name) {
            Some((_, existing)) => existing.patches.extend(set.patches),
            None => patches.push((name, set)),
        }
    }
    patches
}

/// `CONTROL_NET`: a ControlNet of any family.
pub struct ControlNet {
    /// The network.
    pub net: Arc<ControlNetNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// A ControlNet applied to a prompt (`ControlNetApplyAdvanced`, `ControlNetInpaintingAliMamaApply`): the
/// `control` of ComfyUI's conditioning dict with its `set_cond_hint` arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlApplication {
    /// The network.
    pub control_net: Arc<ControlNet>,
    /// The control image `[B, H, W, C]` in 0..=1.
    pub image: Tensor,
    /// How much of its outputs the model adds.
    pub strength: f64,
    /// The part of sampling it acts in, as fractions of the schedule (`start_percent`, `end_percent`).
    pub percent: (f64, f64),
    /// The VAE that encodes the image into the model's latent space.
    pub vae: Option<Arc<Vae>>,
    /// The mask a ControlNet with a mask channel takes (`[B, 1, H, W]`, 1 where the image is kept); without
    /// one, that channel is all ones.
    pub mask: Option<Tensor>,
    /// The image prepared for the model (encoded, at the latents' size, with the mask channel): set by the
    /// sampler before its first step, once per run (ComfyUI's `cond_hint`).
    pub hint: Option<Tensor>,
}

impl ControlApplication {
    /// Bytes held by the tensors.
    fn byte_size(&self) -> usize {
        self.image.byte_size()
            + self.mask.as_ref().map_or(0, Tensor::byte_size)
            + self.hint.as_ref().map_or(0, Tensor::byte_size)
    }
}

/// `MODEL_PATCH`: a model patch of any family (`ModelPatchLoader`).
pub struct ModelPatch {
    /// The network.
    pub net: Arc<ModelPatchNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// A model patch applied to a model with its control image (`QwenImageDiffsynthControlnet`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPatchApplication {
    /// The patch.
    pub patch: Arc<ModelPatch>,
    /// The control image `[B, H, W, C]` in 0..=1.
    pub image: Tensor,
    /// The VAE that encodes it into the model's latent space (`None` for a patch that reads pixels: Anima's
    /// ControlNet-LLLite).
    pub vae: Option<Arc<Vae>>,
    /// The sigmas, start then end, between which the patch runs (`AnimaLLLiteApply`'s percents, as the model's
    /// sampling made them when the node ran); `None`: every step.
    pub sigma_range: Option<(f64, f64)>,
    /// How much of the patch's outputs the model adds.
    pub strength: f64,
    /// The mask a patch with mask channels takes (`[B, H, W]`, 1 where the image is kept); without one, those
    /// channels are all ones.
    pub mask: Option<Tensor>,
    /// The image prepared for the model (encoded at the latents' size, in the model's latent space, with the
    /// mask channels; an LLLite's: the pixels at 8× the latents' size in [-1, 1], with its mask as ±1): set by the
    /// sampler before its first step, once per run.
    pub hint: Option<Tensor>,
}

/// `CLIP_VISION`: a vision tower (`CLIPVisionLoader`).
pub struct ClipVision {
    /// The network.
    pub net: Arc<ClipVisionNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// `CLIP_VISION_OUTPUT`: what `CLIPVisionEncode` gives (ComfyUI's `Output` object), f32 on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipVisionOutput {
    /// `last_hidden_state` `[B, tokens, hidden]`.
    pub last_hidden_state: Tensor,
    /// `penultimate_hidden_states` `[B, tokens, hidden]` (`None` for a one-layer tower).
    pub penultimate_hidden_states: Option<Tensor>,
    /// `image_embeds`: `[B, projection]` for CLIP, `[B, tokens, hidden]` for SigLIP.
    pub image_embeds: Tensor,
    /// `all_hidden_states`: every layer's output `[B, tokens, hidden]` in order, for SigLIP (empty for CLIP, as
    /// ComfyUI keeps them for SigLIP alone).
    pub all_hidden_states: Vec<Tensor>,
}

impl ClipVisionOutput {
    /// Bytes held by the tensors.
    pub fn byte_size(&self) -> usize {
        self.last_hidden_state.byte_size()
            + self.penultimate_hidden_states.as_ref().map_or(0, Tensor::byte_size)
            + self.image_embeds.byte_size()
            + self.all_hidden_states.iter().map(Tensor::byte_size).sum::<usize>()
    }
}

/// `USOStyleReference`: USO's projector and the SigLIP states of a style image (layers −20, −11 and the
/// penultimate one, `[B, tokens, hidden]` each), whose style tokens go before the prompt's in every model call.
#[derive(Debug, Clone, PartialEq)]
pub struct UsoStyle {
    /// The projector (`MODEL_PATCH`).
    pub projector: Arc<ModelPatch>,
    /// The three states: low (−20), mid (−11), high (penultimate).
    pub states: [Tensor; 3],
}

/// `STYLE_MODEL`: a style model (`StyleModelLoader`: FLUX.1 Redux).
pub struct StyleModel {
    /// The network.
    pub net: Arc<StyleModelNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// `UPSCALE_MODEL`: an image upscale model (`UpscaleModelLoader`: ESRGAN's RRDBNet).
pub struct UpscaleModel {
    /// The network.
    pub net: Arc<kiln_models::esrgan::Esrgan>,
    /// The file it came from.
    pub path: PathBuf,
}

/// `AUDIO_ENCODER`: an audio encoder (`AudioEncoderLoader`).
pub struct AudioEncoder {
    /// The network.
    pub net: Arc<AudioEncoderNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// The audio encoders ComfyUI loads: Whisper large-v3 (whose states HuMo reads) and wav2vec2, large (Wan 2.2
/// S2V's) and base (InfiniteTalk's).
pub enum AudioEncoderNet {
    /// Whisper large-v3's encoder.
    Whisper(kiln_models::whisper::Whisper),
    /// A wav2vec2 encoder.
    Wav2Vec2(kiln_models::wav2vec2::Wav2Vec2),
}

impl PartialEq for AudioEncoder {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for AudioEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AudioEncoder({})", self.path.display())
    }
}

/// `AUDIO_ENCODER_OUTPUT`: a clip through an audio encoder (`AudioEncoderEncode`), on the host: ComfyUI's
/// `encoded_audio`, `encoded_audio_all_layers` and `audio_samples`.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioEncoderOutput {
    /// Every layer's state, as ComfyUI's tuple (`encoded_audio_all_layers`), each `[B, tokens, width]`; the
    /// last is the encoder's output (`encoded_audio`).
    pub layers: Vec<Tensor>,
    /// Samples of the clip after resampling to the encoder's rate (16 kHz).
    pub samples: usize,
}

impl AudioEncoderOutput {
    /// Bytes held by the tensors.
    pub fn byte_size(&self) -> usize {
        self.layers.iter().map(Tensor::byte_size).sum::<usize>()
    }
}

/// `VAE`: an autoencoder of any family.
pub struct Vae {
    /// The network.
    pub net: Arc<VaeNet>,
    /// The file it came from.
    pub path: PathBuf,
}

/// One encoded prompt: `cond` `[1, N, D]` (f32, host) and the pooled output some families have.
#[derive(Debug, Clone, PartialEq)]
pub struct Cond {
    /// The token embeddings.
    pub cond: Tensor,
    /// The pooled embedding, where the family has one (Z-Image's has none).
    pub pooled: Option<Tensor>,
    /// What else rides along (the rest of ComfyUI's conditioning dict).
    pub extras: CondExtras,
}

impl Cond {
    /// A prompt's embeddings with nothing riding along.
    pub fn new(cond: Tensor, pooled: Option<Tensor>) -> Cond {
        Cond { cond, pooled, extras: CondExtras::default() }
    }
}

/// One `unCLIPConditioning`: a CLIP vision output's image embeddings with their strength and noise augmentation.
#[derive(Debug, Clone, PartialEq)]
pub struct Unclip {
    /// `image_embeds` `[B, projection]` (one row per image).
    pub image_embeds: Tensor,
    /// How strongly they count.
    pub strength: f64,
    /// How far they are noised (0 to 1).
    pub noise_augmentation: f64,
}

/// The keys of ComfyUI's conditioning dict that nodes set beside the embeddings. A family's model reads
/// those it has inputs for and ignores the others, as ComfyUI's `extra_conds` does (Z-Image reads none).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CondExtras {
    /// The distilled-guidance strength (`FluxGuidance`, `CLIPTextEncodeFlux`): `None` unset (the model's
    /// default), `Some(None)` disabled (`FluxDisableGuidance`).
    pub guidance: Option<Option<f64>>,
    /// Latents an edit model attends to (`ReferenceLatent`, appended in order), VAE space.
    pub reference_latents: Vec<Tensor>,
    /// How reference latents are positioned (`FluxKontextMultiReferenceLatentMethod`).
    pub reference_latents_method: Option<String>,
    /// The image latent an inpaint or instruct model is conditioned on (`InpaintModelConditioning`,
    /// `InstructPixToPixConditioning`), VAE space.
    pub concat_latent_image: Option<Tensor>,
    /// The inpainting mask beside it, `[B, 1, H, W]` at the image's size (Wan's: `[1, 1 or 4, T, h, w]`, 0
    /// where a frame is given).
    pub concat_mask: Option<Tensor>,
    /// Where the mask goes among the image latent's channels (`Wan22FunControlToVideo`: after the control
    /// latent's); `None` before them all.
    pub concat_mask_index: Option<usize>,
    /// The CLIP vision states an image-to-video model attends to (`WanImageToVideo`'s `clip_vision_output`:
    /// its `penultimate_hidden_states`, `[B, tokens, hidden]`; first and last frame's joined on tokens).
    pub clip_vision: Option<Tensor>,
    /// ControlNets applied to this prompt, in the order they were applied (ComfyUI's `control` chain, whose
    /// outputs are summed).
    pub controls: Vec<ControlApplication>,
    /// The control contexts a Wan VACE model reads (`WanVaceToVideo`, appended in order).
    pub vace: Vec<VaceControl>,
    /// The camera embedding a Wan Fun Camera model reads (`WanCameraImageToVideo`'s `camera_conditions`).
    pub camera: Option<Tensor>,
    /// The in-context latents a Wan model attends to (`BerniniConditioning`'s `context_latents`: the source
    /// video, then the reference video, then each reference image), VAE space, each `[1, C, T, h, w]`.
    pub context_latents: Vec<Tensor>,
    /// HuMo's audio embedding (`WanHuMoImageToVideo`'s `audio_embed`: a window of Whisper features per latent
    /// frame, `[B, F, 8, 5, C]`; zeros on the negative prompt), or Wan 2.2 S2V's (`WanSoundImageToVideo`'s:
    /// wav2vec2's states per video frame at 16 a second, `[1, layers, width, frames]`).
    pub audio_embed: Option<Tensor>,
    /// Wan 2.2 S2V's motion latent (`WanSoundImageToVideo`'s `reference_motion`: the last 19 latent frames of
    /// the video before), VAE space.
    pub reference_motion: Option<Tensor>,
    /// Wan 2.2 S2V's control video latent (`WanSoundImageToVideo`'s `control_video`), VAE space.
    pub control_video: Option<Tensor>,
    /// Wan Animate 2's pose branch (`WanAnimate2ToVideo`'s pose values).
    pub animate_pose: Option<AnimatePose>,
    /// Wan Animate 2's scale of the reference frame's values (`reference_image_strength`); `None` is 1.
    pub reference_strength: Option<f64>,
    /// WanDancer's reference image's CLIP vision states (`WanDancerVideo`'s `clip_vision_output_ref`: its
    /// `penultimate_hidden_states`).
    pub clip_vision_reference: Option<Tensor>,
    /// WanDancer's music (`WanDancerVideo`'s `audio_embed`, `fps` and `audio_inject_scale`).
    pub dancer_music: Option<DancerMusic>,
    /// The part of sampling the prompt takes part in, as percents (`ConditioningSetTimestepRange`'s
    /// `start_percent`, `end_percent`); `None`: all of it.
    pub timestep_range: Option<(f64, f64)>,
    /// Phantom's subject frames (`WanPhantomSubjectToVideo`'s `time_dim_concat`: each image's latent, one frame
    /// each, `[1, 16, K, h, w]`), VAE space, which a Wan model runs after the video's frames.
    pub time_dim_concat: Option<Tensor>,
    /// HiDream's Llama states (`conditioning_llama3`: each decoder layer's output, `[1, L, N, D]`), which its
    /// text encoder sets beside T5-XXL's states.
    pub llama: Option<Tensor>,
    /// Anima's T5 tokens with their weights (`t5xxl_ids`, `t5xxl_weights`), which its text encoder sets beside
    /// Qwen3's states for the model's LLM adapter.
    pub t5_tokens: Option<Vec<(u32, f32)>>,
    /// Kandinsky 5's encoded start frames (`Kandinsky5ImageToVideo`'s `time_dim_replace`), VAE space, `[1, 16, F, h,
    /// w]`: they replace the first frames of the video model's input.
    pub time_dim_replace: Option<Tensor>,
    /// `unCLIPConditioning`'s images, appended in order (ComfyUI's `unclip_conditioning`): SDXL's pooled vector is
    /// made from them.
    pub unclip: Vec<Unclip>,
    /// HunyuanVideo 1.5's ByT5 states of the prompt's quoted passages (`conditioning_byt5small`, `[1, M, D]`),
    /// which its text encoder sets beside Qwen2.5-VL's states.
    pub byt5: Option<Tensor>,
    /// Where in the latent the prompt applies and how much it weighs there (the area and mask nodes).
    pub region: PromptRegion,
}

/// What `WanDancerEncodeAudio` makes of a song (its `AUDIO_ENCODER_OUTPUT`), which `WanDancerVideo` hands a
/// WanDancer model.
#[derive(Debug, Clone, PartialEq)]
pub struct DancerMusic {
    /// The music features `[1, frames, 35]` at 30 frames a second of the song.
    pub features: Tensor,
    /// The frame rate the song plays the clip at: 30 / round(feature frames / video frames).
    pub fps: f64,
    /// Scales the music where the model injects it (`audio_inject_scale`).
    pub scale: f64,
}

/// What `WanAnimate2ToVideo` hands a Wan Animate 2 model's pose branch.
#[derive(Debug, Clone, PartialEq)]
pub struct AnimatePose {
    /// The driving video's latents `[1, 16, T − 1, h, w]` (one frame fewer than the latent), VAE space; `None`
    /// without a pose video (the branch does not run).
    pub latent: Option<Tensor>,
    /// The CLIP vision states the branch attends to (`clip_vision_output_pose`, else the reference's).
    pub clip_vision: Option<Tensor>,
    /// The text the branch attends to (`positive_pose`'s first prompt, else the positive's).
    pub context: Option<Tensor>,
    /// Scales the branch's values (`pose_strength`).
    pub strength: f64,
    /// The part of sampling the branch runs in, as percents (`pose_start_percent`, `pose_end_percent`).
    pub percent: (f64, f64),
}

/// One `WanVaceToVideo` control for a Wan VACE model.
#[derive(Debug, Clone, PartialEq)]
pub struct VaceControl {
    /// The inactive and reactive latents `[1, 32, T, h, w]`, VAE space (the reference image's first, when
    /// given).
    pub frames: Tensor,
    /// The mask `[1, 64, T, h, w]`: each latent position's 8×8 pixels, 1 where the model makes the video.
    pub mask: Tensor,
    /// How strongly its VACE blocks' outputs are added.
    pub strength: f64,
}

impl CondExtras {
    /// Bytes held by the tensors.
    fn byte_size(&self) -> usize {
        self.reference_latents.iter().map(Tensor::byte_size).sum::<usize>()
            + self.concat_latent_image.as_ref().map_or(0, Tensor::byte_size)
            + self.concat_mask.as_ref().map_or(0, Tensor::byte_size)
            + self.clip_vision.as_ref().map_or(0, Tensor::byte_size)
            + self.controls.iter().map(ControlApplication::byte_size).sum::<usize>()
            + self.vace.iter().map(|v| v.frames.byte_size() + v.mask.byte_size()).sum::<usize>()
            + self.camera.as_ref().map_or(0, Tensor::byte_size)
            + self.context_latents.iter().map(Tensor::byte_size).sum::<usize>()
            + self.audio_embed.as_ref().map_or(0, Tensor::byte_size)
            + self.reference_motion.as_ref().map_or(0, Tensor::byte_size)
            + self.control_video.as_ref().map_or(0, Tensor::byte_size)
            + self.clip_vision_reference.as_ref().map_or(0, Tensor::byte_size)
            + self.dancer_music.as_ref().map_or(0, |m| m.features.byte_size())
            + self.time_dim_concat.as_ref().map_or(0, Tensor::byte_size)
            + self.llama.as_ref().map_or(0, Tensor::byte_size)
            + self.byt5.as_ref().map_or(0, Tensor::byte_size)
            + self.time_dim_replace.as_ref().map_or(0, Tensor::byte_size)
            + self.unclip.iter().map(|u| u.image_embeds.byte_size()).sum::<usize>()
            + self.t5_tokens.as_ref().map_or(0, |t| std::mem::size_of_val(t.as_slice()))
            + self.region.byte_size()
            + self.animate_pose.as_ref().map_or(0, |p| {
                [&p.latent, &p.clip_vision, &p.context]
                    .into_iter()
                    .flatten()
                    .map(Tensor::byte_size)
                    .sum()
            })
    }
}

/// `CONDITIONING`: a list of encoded prompts (several are averaged by the sampler, as ComfyUI's
/// `ConditioningCombine` makes them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Conditioning {
    /// The prompts.
    pub entries: Vec<Cond>,
}

impl Conditioning {
    /// Bytes held by the tensors.
    pub fn byte_size(&self) -> usize {
        self.entries
            .iter()
            .map(|c| {
                c.cond.byte_size()
                    + c.pooled.as_ref().map_or(0, Tensor::byte_size)
                    + c.extras.byte_size()
            })
            .sum()
    }

    /// A copy with `set` applied to every entry's extras (ComfyUI's `conditioning_set_values`).
    pub fn with_extras(&self, set: impl Fn(&mut CondExtras)) -> Conditioning {
        let mut entries = self.entries.clone();
        entries.iter_mut().for_each(|c| set(&mut c.extras));
        Conditioning { entries }
    }
}

// Model values compare by identity: two links carry the same model only if they carry the same load.
impl PartialEq for DiffusionModel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for DiffusionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiffusionModel({})", self.path.display())
    }
}

impl PartialEq for TextEncoder {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextEncoder({})", self.path.display())
    }
}

impl PartialEq for ControlNet {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for ControlNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ControlNet({})", self.path.display())
    }
}

impl PartialEq for ModelPatch {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for ModelPatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelPatch({})", self.path.display())
    }
}

impl PartialEq for ClipVision {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for ClipVision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClipVision({})", self.path.display())
    }
}

impl PartialEq for StyleModel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for StyleModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StyleModel({})", self.path.display())
    }
}

impl PartialEq for UpscaleModel {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for UpscaleModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpscaleModel({})", self.path.display())
    }
}

impl PartialEq for Vae {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl std::fmt::Debug for Vae {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vae({})", self.path.display())
    }
}
