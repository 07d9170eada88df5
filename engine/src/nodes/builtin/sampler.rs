//! Sampling nodes: `EmptySD3LatentImage`, `ModelSamplingAuraFlow`, `KSampler` and `KSamplerAdvanced`.
//!
//! The sampler's arithmetic runs on the host in f32 (a latent is small); each model call uploads the latent,
//! runs the diffusion model on the device and reads its prediction back. Noise comes from torch's CPU
//! generator, bit for bit, so a seed gives ComfyUI's image.

use std::any::Any;
use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kiln_compute::{Backend, DType};
use kiln_models::family::{
    ControlInput, DiffusionFamily, DiffusionInput, DistilledGuidance, ModelPatchNet, PatchInput,
    SkippedBlocks,
};
use kiln_models::latent::LatentFormat;
use kiln_models::noise::initial_noise;
use kiln_models::sampling::guidance::{Predictions, UncondSkip};
use kiln_models::sampling::{
    self, BlockDenoiser, Denoiser, FlowSampling, ModelSampling, Sampler, SamplerChoice, Scheduler,
    Step,
};
use kiln_models::{flux, wan};

use super::latent::{empty_latent, repeat_to_batch};
use super::model_specs;
use super::step_cache::StepCacheRun;
use super::wan::{overwrite_leading_frames, with_leading_frames};
use super::windowed::{Fusion, WindowRun, gather_frames, without_anchor};
use crate::compute::Compute;
use crate::models::context_windows::Window;
use crate::models::device::{OnDevice, on_device};
use crate::models::{
    CondExtras, Conditioning, DiffusionModel, DualCfg, ModelPatchApplication, Noise, PerpNeg,
    RadianceWindow,
};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, Inputs, Node, NodeError, NodeResult, NodeSpec, PreviewMethod,
};
use crate::preview::latent_preview;
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// `EmptySD3LatentImage`: zeros in a 16-channel latent space (SD3, Flux, Z-Image).
pub(super) struct EmptySd3LatentImage(Arc<NodeSpec>);

impl EmptySd3LatentImage {
    pub(super) fn new() -> EmptySd3LatentImage {
        EmptySd3LatentImage(Arc::new(model_specs::empty_sd3_latent_image()))
    }
}

impl Node for EmptySd3LatentImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        empty_latent(inputs, 16)
    }
}

/// `ModelSamplingAuraFlow`: the model with another flow shift.
pub(super) struct ModelSamplingAuraFlow(Arc<NodeSpec>);

impl ModelSamplingAuraFlow {
    pub(super) fn new() -> ModelSamplingAuraFlow {
        ModelSamplingAuraFlow(Arc::new(model_specs::model_sampling_aura_flow()))
    }
}

impl Node for ModelSamplingAuraFlow {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let patched = model.with_sampling(FlowSampling::new(inputs.float("shift")?, 1.0));
        Ok(NodeResult::values([Value::Model(Arc::new(patched))]))
    }
}

/// One diffusion model call: ComfyUI's model output for latent `x` at `sigma` with `contexts`.
#[derive(Clone, Copy)]
struct Forward<'a> {
    model: &'a DiffusionModel,
    shape: &'a [usize],
    x: &'a [f32],
    sigma: f32,
    /// `[1, N, D]` each, of equal shapes: the batch is split evenly between them, in order, each part's
    /// samples with their context (several when positive and negative run as one batch). Of different lengths
    /// N only for a model that [`takes_ragged_text`](kiln_models::family::DiffusionNet::takes_ragged_text).
    contexts: &'a [&'a Tensor],
    /// Each context's pooled vector `[1, D]` (FLUX.1's CLIP-L one), in the same order; all present or none.
    pooled: &'a [Option<&'a Tensor>],
    /// What rides along with the contexts (equal for every part of a batch): the reference latents.
    extras: &'a CondExtras,
    /// The latent's noise mask at one part's latent shape, for a model that reads an inpainting mask.
    denoise_mask: Option<&'a [f32]>,
    /// The sampling run's `FluxKVCache` store, when the model has the patch.
    kv_cache: Option<&'a KvSlot>,
    /// Blocks the call leaves out (`SkipLayerGuidanceDiT`'s pass).
    skipped: SkippedBlocks,
    /// A causal Wan model's block of frames in an `ar_video` run.
    causal: Option<CausalCall<'a>>,
    /// The context window this call reads of the whole latent `x` (`ContextWindowsManual`): the call cuts the
    /// latent and what rides with it to the window's frames and returns the window's output.
    window: Option<&'a Window>,
    /// The run's Wan Animate 2 pose-branch cache (a `wan::PoseCache<B>` made on the first call), when the model
    /// has `WanAnimate2Cache`.
    pose_cache: Option<&'a KvSlot>,
    /// Whether Wan Animate 2's pose branch runs.
    pose: PoseMode,
    /// For a prompt restricted to an area, the block of the whole latent the call reads (`shape` and `x` are
    /// the block's): what rides with the latent is made at the whole's shape and cut to the block, as ComfyUI
    /// cuts its `CONDNoiseShape` conditioning.
    block: Option<Block<'a>>,
}

/// The block of the whole latent (of `whole` shape) a call reads: per dimension after the batch and channels,
/// where it starts and its length.
#[derive(Clone, Copy)]
struct Block<'a> {
    whole: &'a [usize],
    cells: &'a [(usize, usize)],
}

/// Each context's rows when every context is `[1, N, D]` of one width D, the shape of the contexts a model
/// that takes ragged text joins into one call whatever their lengths N; `None` otherwise.
fn joinable_rows(contexts: &[&Tensor]) -> Option<Vec<usize>> {
    let width = contexts.first()?.shape().get(2).copied();
    contexts
        .iter()
        .map(|c| match c.shape() {
            &[1, n, d] if Some(d) == width => Some(n),
            _ => None,
        })
        .collect()
}

/// Each sample's text rows when the contexts of a call differ in length (as [`Guided::pair`] makes them for a
/// model that takes ragged text; see [`joinable_rows`]): the batch splits evenly between the contexts, in order,
/// so each context's length is repeated for each of its samples. `None` when the contexts are of one shape.
fn ragged_lens(contexts: &[&Tensor], batch: usize) -> kiln_models::Result<Option<Vec<usize>>> {
    let Some(first) = contexts.first() else { return Ok(None) };
    if contexts.iter().all(|c| c.shape() == first.shape()) {
        return Ok(None);
    }
    match joinable_rows(contexts) {
        Some(lens) if batch.is_multiple_of(lens.len()) => {
            let per_context = batch / lens.len();
            Ok(Some(lens.iter().flat_map(|&n| std::iter::repeat_n(n, per_context)).collect()))
        }
        _ => Err(kiln_models::Error::Invalid(format!(
            "a call of {batch} samples with prompts of shapes {:?}: prompts of different lengths must each be \
             [1, N, D] of one width D and split the batch evenly",
            contexts.iter().map(|c| c.shape().to_vec()).collect::<Vec<_>>()
        ))),
    }
}

/// Whether a call runs Wan Animate 2's pose branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoseMode {
    /// Within the pose's part of sampling (`pose_start_percent`, `pose_end_percent`).
    ByRange,
    /// Always (the pose's conditioning at a boundary of its part).
    On,
    /// Never (its complement's at that boundary).
    Off,
}

/// One call of a causal Wan model in an `ar_video` run: the run's cache (a `wan::CausalCache<B>` made on the
/// first call, for the backend `B` the calls run on) and where the call's frames start.
#[derive(Clone, Copy)]
struct CausalCall<'a> {
    slot: &'a KvSlot,
    start_frame: usize,
}

/// A sampling run's `FluxKVCache` store: made on the first model call, on the device's backend (a
/// `flux::KvCache<B>` for the backend `B` the calls run on).
type KvSlot = OnceLock<Box<dyn Any + Send + Sync>>;

/// The method `FluxKVCache` makes the default (ComfyUI patches `default_ref_method`).
const KV_CACHE_REFERENCE_METHOD: &str = "index_timestep_zero";

impl OnDevice for Forward<'_> {
    type Output = kiln_models::Result<Vec<f32>>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        let b = &b.with_compute_dtype(self.model.compute_dtype)?;
        let batch = self.shape[0];
        let view = self.window_view()?;
        let (x_shape, x_values) = self.model_input()?;
        let x = b.from_f32(&x_shape, &x_values, b.compute_dtype())?;
        let first = self.contexts.first().ok_or_else(|| {
            kiln_models::Error::Invalid("a model call with no conditioning".to_owned())
        })?;
        let mut context_shape = first.shape().to_vec();
        let per_context = batch / self.contexts.len().max(1);
        let mut context = Vec::with_capacity(first.data().len() * batch);
        for part in self.contexts {
            for _ in 0..per_context {
                context.extend_from_slice(part.data());
            }
        }
        let text_lens = ragged_lens(self.contexts, batch)?;
        match &text_lens {
            Some(lens) => (context_shape[0], context_shape[1]) = (1, lens.iter().sum()),
            None => context_shape[0] = batch,
        }
        let context = b.from_f32(&context_shape, &context, b.compute_dtype())?;
        let pooled = match self.pooled {
            [Some(first), ..] if self.pooled.iter().all(Option::is_some) => {
                let mut values = Vec::with_capacity(first.data().len() * batch);
                for part in self.pooled.iter().flatten() {
                    for _ in 0..per_context {
                        values.extend_from_slice(part.data());
                    }
                }
                let width = first.data().len();
                Some(b.from_f32(&[batch, width], &values, b.compute_dtype())?)
            }
            _ => None,
        };
        let values = self.extras.guidance.flatten().map(|g| vec![g as f32; batch]);
        let guidance = match (self.extras.guidance, &values) {
            (None, _) => DistilledGuidance::Unset,
            (Some(_), Some(values)) => DistilledGuidance::Set(values),
            (Some(_), None) => DistilledGuidance::Disabled,
        };
        let timesteps = vec![self.model.sampling.timestep(self.sigma); batch];
        let references = self.in_model_space(b, &self.extras.reference_latents)?;
        // The ControlNets whose range this sigma is in (ComfyUI's `timestep_range`, compared in f32), each
        // with its hint broadcast to the batch.
        let mut hints = Vec::with_capacity(self.extras.controls.len());
        for control in &self.extras.controls {
            if !self.model.sampling.in_percent_range(control.percent, self.sigma) {
                continue;
            }
            // Only a ControlNet without a VAE is left unprepared.
            let hint = control.hint.as_ref().ok_or_else(|| {
                kiln_models::Error::Invalid(super::controlnet::NEEDS_VAE.to_owned())
            })?;
            let hint = super::hints::broadcast_hint(hint, batch, self.contexts.len())
                .map_err(|e| kiln_models::Error::Invalid(e.to_string()))?;
            hints.push((control, upload(b, &hint)?));
        }
        // The patches whose sigma range this step is in (an LLLite's `sigma_end <= sigma <= sigma_start`).
        let in_range = |p: &&ModelPatchApplication| {
            p.sigma_range.is_none_or(|(start, end)| (end..=start).contains(&f64::from(self.sigma)))
        };
        let patch_hints = self
            .model
            .model_patches
            .iter()
            .filter(in_range)
            .map(|p| {
                let hint = p.hint.as_ref().ok_or_else(|| {
                    kiln_models::Error::Invalid("a model patch's image was not prepared".to_owned())
                })?;
                Ok((p, upload(b, hint)?))
            })
            .collect::<kiln_models::Result<Vec<_>>>()?;
        let patches: Vec<PatchInput<'_, B>> = patch_hints
            .iter()
            .map(|(p, hint)| PatchInput { net: &p.patch.net, hint, strength: p.strength as f32 })
            .collect();
        let controls: Vec<ControlInput<'_, B>> = hints
            .iter()
            .map(|(control, hint)| ControlInput {
                net: &control.control_net.net,
                hint,
                strength: control.strength as f32,
            })
            .collect();
        let kv_cache = self
            .kv_cache
            .map(|slot| stored::<flux::KvCache<B>>(slot, "a FLUX KV cache"))
            .transpose()?;
        let causal = match self.causal {
            Some(call) => Some(wan::CausalStep {
                start_frame: call.start_frame,
                cache: stored::<wan::CausalCache<B>>(call.slot, "a causal Wan cache")?,
            }),
            None => None,
        };
        let text_prefix = uso_tokens(b, &self.model.uso_styles)?;
        // CLIP vision states (Wan's image-to-video), and Wan 2.2's per-frame timesteps under a noise mask.
        // Each prompt's states fitted to its samples (ComfyUI's `repeat_to_batch_size`: the first rows of a longer
        // batch, repeats of a shorter one), the prompts' joined.
        let clip_vision = match &self.extras.clip_vision {
            Some(states) => {
                let fitted = repeat_to_batch(states, per_context)
                    .and_then(|one| repeat_to_batch(&one, per_context * self.contexts.len().max(1)))
                    .map_err(|e| kiln_models::Error::Invalid(e.to_string()))?;
                Some(upload(b, &fitted)?)
            }
            None => None,
        };
        let frame_timesteps = match (self.model.net.family(), view.mask.as_deref()) {
            (DiffusionFamily::Wan22, Some(mask)) => {
                // Over the whole latent's mask, then the block's frames. (ComfyUI does not cut its mask to an
                // area: under an area that cuts frames its model stretches the whole video's timesteps over the
                // block's tokens; Kiln gives each frame its own.)
                let mut part_shape = self.block.map_or(view.shape.as_slice(), |b| b.whole).to_vec();
                part_shape[0] /= self.contexts.len().max(1);
                let all = frame_timesteps(&part_shape, mask, batch, timesteps[0]);
                match (all, self.block) {
                    (Some(all), Some(block)) => {
                        let (start, len) = block.cells[0];
                        let total = part_shape[2];
                        Some(
                            all.chunks(total)
                                .flat_map(|f| f[start..start + len].to_vec())
                                .collect(),
                        )
                    }
                    (all, _) => all,
                }
            }
            _ => None,
        };
        let vace = match self.model.net.vace_channels() {
            Some(_) => {
                let controls = self.windowed_vace()?;
                let mut part_shape = view.shape.clone();
                part_shape[0] /= self.contexts.len().max(1);
                vace_contexts(b, &self.model.latent, &controls, &part_shape)?
            }
            None => Vec::new(),
        };
        // Cut to the call's window as ComfyUI's generic branch of `get_resized_cond` cuts `camera_conditions`.
        let camera = match &self.extras.camera {
            Some(t) => Some(upload(b, self.window_cut(t)?.as_ref())?),
            None => None,
        };
        let context_latents = self.in_model_space(b, &self.windowed_context_latents()?)?;
        let audio = match &self.extras.audio_embed {
            Some(t) => Some(upload(b, self.window_audio(t)?.as_ref())?),
            None => None,
        };
        let talk_audio = match &self.model.infinite_talk {
            Some(talk) => {
                let audio = upload(b, &talk.audio)?;
                let shape = audio.shape()[1..].to_vec();
                Some(audio.reshape(&shape)?)
            }
            None => None,
        };
        let talk = match (&self.model.infinite_talk, &talk_audio) {
            (Some(talk), Some(audio)) => {
                let ModelPatchNet::InfiniteTalk(patch) = talk.patch.net.as_ref() else {
                    return Err(kiln_models::Error::Invalid(format!(
                        "{} is not an InfiniteTalk patch",
                        talk.patch.path.display()
                    )));
                };
                let masks = talk.masks.as_ref().map(|m| m.data());
                Some(wan::infinite_talk::TalkInput { patch, audio, scale: talk.scale, masks })
            }
            _ => None,
        };
        // S2V's motion and control latents in the model's space, cut to the call's window where their frames are
        // the latent's, as ComfyUI's generic branch of `get_resized_cond` cuts them (the control video; the motion
        // latent only when it happens to be as long).
        let windowed_latent =
            |t: &Option<Tensor>| -> kiln_models::Result<Option<kiln_compute::Tensor<B>>> {
                match t {
                    Some(t) => {
                        Ok(self.in_model_space(b, &[self.window_cut(t)?.into_owned()])?.pop())
                    }
                    None => Ok(None),
                }
            };
        let motion = windowed_latent(&self.extras.reference_motion)?;
        let control = windowed_latent(&self.extras.control_video)?;
        let animate = self.animate_input(b)?;
        let music = self.extras.dancer_music.as_ref();
        let music_features = match music {
            Some(m) => Some(upload(b, self.window_audio(&m.features)?.as_ref())?),
            None => None,
        };
        let clip_reference =
            self.extras.clip_vision_reference.as_ref().map(|t| upload(b, t)).transpose()?;
        let dancer = (music.is_some() || clip_reference.is_some()).then(|| {
            let plain = wan::dancer::DancerInput::<B>::default();
            wan::dancer::DancerInput {
                music: music_features.as_ref(),
                fps: music.map_or(plain.fps, |m| m.fps),
                scale: music.map_or(plain.scale, |m| m.scale as f32),
                clip_reference: clip_reference.as_ref(),
            }
        });
        let time_concat = match &self.extras.time_dim_concat {
            Some(frames) => self.in_model_space(b, std::slice::from_ref(frames))?.pop(),
            None => None,
        };
        let llama = self.extras.llama.as_ref().map(|t| upload(b, t)).transpose()?;
        let byt5 = self.extras.byt5.as_ref().map(|t| upload(b, t)).transpose()?;
        let time_dim_replace = match &self.extras.time_dim_replace {
            Some(frames) => self.in_model_space(b, std::slice::from_ref(frames))?.pop(),
            None => None,
        };
        // HiDream E1 reads its image latent joined along the width (ComfyUI's `image_cond`), not as channels: each
        // prompt's repeated to that prompt's samples (`CONDNoiseShape`), the prompts' joined.
        let width_concat = match (&self.extras.concat_latent_image, self.model.net.family()) {
            (Some(image), DiffusionFamily::HiDream) => {
                // Fitted to one prompt's samples, then cycled over the prompts.
                let fitted = repeat_to_batch(image, per_context)
                    .and_then(|one| repeat_to_batch(&one, per_context * self.contexts.len()))
                    .map_err(|e| kiln_models::Error::Invalid(e.to_string()))?;
                self.in_model_space(b, &[fitted])?.pop()
            }
            _ => None,
        };
        let default_method = self.model.reference_kv_cache.then_some(KV_CACHE_REFERENCE_METHOD);
        let input = DiffusionInput {
            x: &x,
            timesteps: &timesteps,
            context: &context,
            text_lens: text_lens.as_deref(),
            pooled: pooled.as_ref(),
            guidance,
            references: &references,
            reference_method: self.extras.reference_latents_method.as_deref().or(default_method),
            kv_cache,
            text_prefix: text_prefix.as_ref(),
            controls: &controls,
            patches: &patches,
            clip_vision: clip_vision.as_ref(),
            frame_timesteps: frame_timesteps.as_deref(),
            skipped_blocks: self.skipped,
            vace: &vace,
            camera: camera.as_ref(),
            rope: self.model.rope,
            context_latents: &context_latents,
            causal,
            audio: audio.as_ref(),
            talk,
            motion: motion.as_ref(),
            control: control.as_ref(),
            animate: animate.as_ref().map(AnimateCall::input),
            dancer,
            time_concat: time_concat.as_ref(),
            llama: llama.as_ref(),
            width_concat: width_concat.as_ref(),
            byt5: byt5.as_ref(),
            time_dim_replace: time_dim_replace.as_ref(),
            radiance: RadianceWindow::options_at(&self.model.chroma_radiance, self.sigma),
        };
        let out = self.model.net.forward(b, input)?;
        let out = b.cast(&out, DType::F32)?;
        Ok(b.to_f32(&out)?)
    }
}

/// The store a run keeps in `slot` (`what` in messages): made on the first call, on the backend the calls run on.
fn stored<'s, T: Default + Send + Sync + 'static>(
    slot: &'s KvSlot,
    what: &str,
) -> kiln_models::Result<&'s T> {
    slot.get_or_init(|| Box::new(T::default()))
        .downcast_ref::<T>()
        .ok_or_else(|| kiln_models::Error::Invalid(format!("{what} made on another device")))
}

/// What EasyCache and LazyCache cannot run with yet: ar_video's causal blocks, and EasyCache's per-call state
/// under context windows (each window's call would read another window's cached difference).
fn refuse_step_cache(model: &DiffusionModel, sampler: Sampler) -> Result<(), NodeError> {
    let Some(cache) = model.step_cache else { return Ok(()) };
    let name = if cache.lazy { "LazyCache" } else { "EasyCache" };
    let clash = if sampler == Sampler::ArVideo {
        Some("the ar_video sampler")
    } else if model.context_windows.is_some() && !cache.lazy {
        Some("context windows (ContextWindowsManual); LazyCache runs with them")
    } else {
        None
    };
    match clash {
        Some(what) => Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("{name} cannot run with {what} yet: sample without {name}"),
        )),
        None => Ok(()),
    }
}

/// Python's `math.isclose(a, b)` with its defaults (relative tolerance 1e-9, no absolute one: only 0 is close to
/// 0).
fn isclose(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// ComfyUI's `perp_neg` on x̂₀ predictions: `pos = positive − empty`, `neg = negative − empty`, `perp = neg −
/// (Σ neg·pos / ‖pos‖²)·pos` (sums over the whole batch, in f64, then f32 as torch's scalars), and
/// `empty + cfg·(pos − perp·neg_scale)`.
fn perp_neg_combine(
    positive: &[f32],
    negative: &[f32],
    empty: &[f32],
    neg_scale: f32,
    cfg: f32,
) -> Vec<f32> {
    let pos: Vec<f32> = positive.iter().zip(empty).map(|(p, e)| p - e).collect();
    let neg: Vec<f32> = negative.iter().zip(empty).map(|(n, e)| n - e).collect();
    let dot = pos.iter().zip(&neg).map(|(p, n)| f64::from(p * n)).sum::<f64>() as f32;
    let norm = pos.iter().map(|&p| f64::from(p) * f64::from(p)).sum::<f64>().sqrt() as f32;
    let along = dot / (norm * norm);
    pos.iter()
        .zip(&neg)
        .zip(empty)
        .map(|((p, n), e)| {
            let perp = n - along * p;
            e + cfg * (p - perp * neg_scale)
        })
        .collect()
}

/// The run's step-cache state (a poisoned lock is a panic elsewhere in the run, reported as an error here).
fn lock(
    cache: &Mutex<StepCacheRun>,
) -> kiln_models::Result<std::sync::MutexGuard<'_, StepCacheRun>> {
    cache
        .lock()
        .map_err(|_| kiln_models::Error::Invalid("the step cache's state was lost".to_owned()))
}

/// A host tensor on `b` in its compute type (what a model call reads beside the latent).
fn upload<B: Backend>(b: &B, t: &Tensor) -> kiln_compute::Result<kiln_compute::Tensor<B>> {
    b.from_f32(t.shape(), t.data(), b.compute_dtype())
}

/// A Wan VACE model's control contexts `[1, 96, T, h, w]` with their strengths, as ComfyUI's `WAN21_Vace`
/// builds them: each control's two latents moved into the model's space 16 channels at a time, its mask after
/// them; without any control, zero latents (in VAE space, so not zero after) and a mask of ones, strength 1.
fn vace_contexts<B: Backend>(
    b: &B,
    latent: &LatentFormat,
    controls: &[crate::models::VaceControl],
    shape: &[usize],
) -> kiln_models::Result<Vec<(kiln_compute::Tensor<B>, f32)>> {
    let &[_, _, frames, h, w] = shape else {
        return Err(kiln_models::Error::Invalid(format!(
            "a Wan VACE model takes video latents [B, C, T, h, w], not {shape:?}"
        )));
    };
    let plane = frames * h * w;
    let group = latent.channels;
    let default = [crate::models::VaceControl {
        frames: Tensor::full(vec![1, 2 * group, frames, h, w], 0.0),
        mask: Tensor::full(vec![1, 64, frames, h, w], 1.0),
        strength: 1.0,
    }];
    let controls = if controls.is_empty() { &default[..] } else { controls };
    let mut out = Vec::with_capacity(controls.len());
    for control in controls {
        let (fs, ms) = (control.frames.shape(), control.mask.shape());
        if fs.len() != 5 || ms.len() != 5 || fs[2..] != [frames, h, w] || ms[2..] != [frames, h, w]
        {
            return Err(kiln_models::Error::Invalid(format!(
                "a VACE control of {fs:?} with a mask of {ms:?} for latents of {frames} frames at {h}×{w}: \
                 make the latent with the same WanVaceToVideo (and trim it after sampling)"
            )));
        }
        let mut values = Vec::with_capacity((fs[1] + ms[1]) * plane);
        for chunk in control.frames.data()[..fs[1] * plane].chunks(group * plane) {
            values.extend(latent.process_in(chunk, &[1, chunk.len() / plane, frames, h, w]));
        }
        values.extend_from_slice(&control.mask.data()[..ms[1] * plane]);
        let context = b.from_f32(&[1, fs[1] + ms[1], frames, h, w], &values, b.compute_dtype())?;
        out.push((context, control.strength as f32));
    }
    Ok(out)
}

/// The style tokens of `styles` (`USOStyleReference`s, in the order applied) as the DiT takes them before the
/// text: each projector run on its SigLIP states, the last applied first (each patch puts its tokens before
/// what is there), `None` without any.
fn uso_tokens<B: Backend>(
    b: &B,
    styles: &[crate::models::UsoStyle],
) -> kiln_models::Result<Option<kiln_compute::Tensor<B>>> {
    let mut tokens = Vec::with_capacity(styles.len());
    for style in styles.iter().rev() {
        let ModelPatchNet::Uso(projector) = style.projector.net.as_ref() else {
            return Err(kiln_models::Error::Invalid(format!(
                "{} is not USO's style projector",
                style.projector.path.display()
            )));
        };
        let states = style.states.iter().map(|s| upload(b, s)).collect::<Result<Vec<_>, _>>()?;
        tokens.push(projector.forward(b, [&states[0], &states[1], &states[2]])?);
    }
    match tokens.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => Ok(Some(b.concat(&many.iter().collect::<Vec<_>>(), 1)?)),
    }
}

impl Forward<'_> {
    /// Latents riding with the conditioning (`ReferenceLatent`'s, `BerniniConditioning`'s) on `b` in the
    /// model's latent space, as ComfyUI's `process_latent_in` puts them.
    fn in_model_space<B: Backend>(
        &self,
        b: &B,
        latents: &[Tensor],
    ) -> kiln_compute::Result<Vec<kiln_compute::Tensor<B>>> {
        latents
            .iter()
            .map(|r| {
                let values = self.model.latent.process_in(r.data(), r.shape());
                b.from_f32(r.shape(), &values, b.compute_dtype())
            })
            .collect()
    }

    /// The latent the call reads and what rides with it frame by frame: the whole's, or a context window's.
    fn window_view(&self) -> kiln_models::Result<WindowView<'_>> {
        let mask = self.denoise_mask.map(Cow::Borrowed);
        let Some(window) = self.window else {
            return Ok(WindowView { shape: self.shape.to_vec(), mask });
        };
        let windows = self.model.context_windows.as_deref().ok_or_else(|| {
            kiln_models::Error::Invalid(
                "a windowed call of a model without context windows".to_owned(),
            )
        })?;
        self.refuse_unwindowed()?;
        let (dim, read) = (windows.dim, window.read());
        let mut shape = self.shape.to_vec();
        shape[dim] = read.len();
        let mask = self.denoise_mask.map(|mask| {
            let mut part_shape = self.shape.to_vec();
            part_shape[0] /= self.contexts.len().max(1);
            Cow::Owned(gather_frames(mask, &part_shape, dim, &read, &windows.cond_retain).1)
        });
        Ok(WindowView { shape, mask })
    }

    /// `t` cut to the call's context window along `axis` (keeping the conditioning frames `retain` lists) when
    /// that axis is as long as the latent's frames (`window.get_tensor(.., dim=axis, retain_index_list)`); `t`
    /// itself without a window or for a tensor of another length, which ComfyUI leaves whole.
    fn cut_to_window<'t>(
        &self,
        t: &'t Tensor,
        axis: usize,
        retain: &[usize],
    ) -> kiln_models::Result<Cow<'t, Tensor>> {
        let (Some(window), Some(windows)) = (self.window, self.model.context_windows.as_deref())
        else {
            return Ok(Cow::Borrowed(t));
        };
        if t.shape().get(axis) != Some(&self.shape[windows.dim]) {
            return Ok(Cow::Borrowed(t));
        }
        let (shape, values) = gather_frames(t.data(), t.shape(), axis, &window.read(), retain);
        let cut =
            Tensor::new(shape, values).map_err(|e| kiln_models::Error::Invalid(e.to_string()))?;
        Ok(Cow::Owned(cut))
    }

    /// A conditioning tensor laid out as the latent (`[B, C, T, h, w]`) cut to the call's context window along the
    /// windows' time axis with the retained conditioning frames ([`Forward::cut_to_window`]): what
    /// `slice_cond` and the generic branch of `get_resized_cond` do (VACE's controls, Bernini's latents, the
    /// camera embedding, S2V's motion and control latents).
    fn window_cut<'t>(&self, t: &'t Tensor) -> kiln_models::Result<Cow<'t, Tensor>> {
        match self.model.context_windows.as_deref() {
            Some(windows) => self.cut_to_window(t, windows.dim, &windows.cond_retain),
            None => Ok(Cow::Borrowed(t)),
        }
    }

    /// An audio embedding for the call (HuMo's `[B, frames, 8, 5, C]`, S2V's `[B, layers, C, frames]`,
    /// WanDancer's music `[1, frames, 35]`) cut along axis 1, without retained frames, only when that axis is as
    /// long as the latent's frames ([`Forward::cut_to_window`]), as `slice_cond(.., temporal_dim=1)` and
    /// `get_resized_cond`'s `audio_embed` branch do; otherwise every window gets it whole (WanDancer stretches
    /// its song over the window's frames).
    fn window_audio<'t>(&self, audio: &'t Tensor) -> kiln_models::Result<Cow<'t, Tensor>> {
        self.cut_to_window(audio, 1, &[])
    }

    /// The VACE controls the call reads: each cut to the call's context window as
    /// `WAN21_Vace.resize_cond_for_context_window` cuts its `vace_context` ([`Forward::window_cut`]).
    fn windowed_vace(&self) -> kiln_models::Result<Cow<'_, [crate::models::VaceControl]>> {
        if self.window.is_none() {
            return Ok(Cow::Borrowed(&self.extras.vace));
        }
        let controls = self
            .extras
            .vace
            .iter()
            .map(|c| {
                Ok(crate::models::VaceControl {
                    frames: self.window_cut(&c.frames)?.into_owned(),
                    mask: self.window_cut(&c.mask)?.into_owned(),
                    strength: c.strength,
                })
            })
            .collect::<kiln_models::Result<Vec<_>>>()?;
        Ok(Cow::Owned(controls))
    }

    /// `BerniniConditioning`'s in-context latents the call reads: each longer than one frame cut to the call's
    /// context window ([`Forward::window_cut`]), as `WAN21.resize_cond_for_context_window` cuts them; a
    /// single-frame one (an image) whole.
    fn windowed_context_latents(&self) -> kiln_models::Result<Cow<'_, [Tensor]>> {
        if self.window.is_none() {
            return Ok(Cow::Borrowed(&self.extras.context_latents));
        }
        let dim = self.model.context_windows.as_deref().map_or(2, |w| w.dim);
        let latents = self
            .extras
            .context_latents
            .iter()
            .map(|t| {
                let long = t.shape().get(dim).is_some_and(|&frames| frames > 1);
                Ok(if long { self.window_cut(t)?.into_owned() } else { t.clone() })
            })
            .collect::<kiln_models::Result<Vec<_>>>()?;
        Ok(Cow::Owned(latents))
    }

    /// What a windowed call cannot cut to its frames (ComfyUI slices these by their own time axes; Kiln
    /// does not yet).
    fn refuse_unwindowed(&self) -> kiln_models::Result<()> {
        let what = [
            (self.model.infinite_talk.is_some(), "InfiniteTalk's audio"),
            (self.causal.is_some(), "an ar_video run"),
        ];
        match what.iter().find(|(present, _)| *present) {
            Some((_, name)) => Err(kiln_models::Error::Invalid(format!(
                "ContextWindowsManual cannot cut {name} to its windows yet: sample without context windows"
            ))),
            None => Ok(()),
        }
    }

    /// The latents the model reads: with the channels a channel-concat model reads beside them (one part's,
    /// repeated to each part of the batch), cut to the call's window when it has one (the latent with
    /// `latent_retain`, the concatenated channels with `cond_retain`).
    fn model_input(&self) -> kiln_models::Result<(Vec<usize>, Cow<'_, [f32]>)> {
        let parts = self.contexts.len().max(1);
        let mut part_shape = self.block.map_or(self.shape, |b| b.whole).to_vec();
        part_shape[0] /= parts;
        let concat =
            super::concat::concat_channels(self.model, self.extras, &part_shape, self.denoise_mask)
                .map_err(|e| kiln_models::Error::Invalid(e.message))?;
        let concat = match (concat, self.block) {
            (Some(c), Some(block)) => {
                let values = super::prompt_regions::crop(c.data(), c.shape(), block.cells);
                let mut shape = c.shape()[..2].to_vec();
                shape.extend(block.cells.iter().map(|b| b.1));
                Some(
                    Tensor::new(shape, values)
                        .map_err(|e| kiln_models::Error::Invalid(e.to_string()))?,
                )
            }
            (concat, _) => concat,
        };
        let windows = self.model.context_windows.as_deref();
        let (x_shape, x) = match (self.window, windows) {
            (Some(window), Some(w)) => {
                let (shape, x) =
                    gather_frames(self.x, self.shape, w.dim, &window.read(), &w.latent_retain);
                (shape, Cow::Owned(x))
            }
            _ => (self.shape.to_vec(), Cow::Borrowed(self.x)),
        };
        // `calculate_input` (an EPS model reads x / √(σ² + 1)); the joined channels are not scaled.
        let scaled = match self.model.sampling.calculate_input(self.sigma, &x) {
            Cow::Owned(scaled) => Some(scaled),
            Cow::Borrowed(_) => None,
        };
        let x = scaled.map_or(x, Cow::Owned);
        let Some(concat) = concat else {
            return Ok((x_shape, x));
        };
        let (concat_shape, concat) = match (self.window, windows) {
            (Some(window), Some(w)) => {
                let read = window.read();
                let (shape, values) =
                    gather_frames(concat.data(), concat.shape(), w.dim, &read, &w.cond_retain);
                (shape, Cow::Owned(values))
            }
            _ => (concat.shape().to_vec(), Cow::Borrowed(concat.data())),
        };
        let batch = x_shape[0];
        let (sample, extra) = (x.len() / batch, concat.len() / concat_shape[0]);
        let mut values = Vec::with_capacity(batch * (sample + extra));
        for i in 0..batch {
            values.extend_from_slice(&x[i * sample..][..sample]);
            values.extend_from_slice(&concat[(i % concat_shape[0]) * extra..][..extra]);
        }
        let mut shape = x_shape;
        shape[1] += concat_shape[1];
        Ok((shape, Cow::Owned(values)))
    }

    /// Wan Animate 2's pose branch and strengths for this call (`None` when the conditioning sets neither): the
    /// pose latents in model space, cut to the window (their frames start one after the latent's), and only
    /// within the pose's part of sampling.
    fn animate_input<B: Backend>(&self, b: &B) -> kiln_models::Result<Option<AnimateCall<'_, B>>> {
        let pose = self.extras.animate_pose.as_ref();
        let reference_strength = self.extras.reference_strength.unwrap_or(1.0) as f32;
        if pose.is_none() && self.extras.reference_strength.is_none() {
            return Ok(None);
        }
        let active = pose.filter(|p| match self.pose {
            PoseMode::On => true,
            PoseMode::Off => false,
            PoseMode::ByRange => self.model.sampling.in_percent_range(p.percent, self.sigma),
        });
        let upload = |t: &Option<Tensor>| t.as_ref().map(|t| upload(b, t)).transpose();
        let mut call = AnimateCall {
            pose: None,
            key: None,
            context: None,
            clip: None,
            pose_strength: 1.0,
            reference_strength,
            cache: None,
            windowed: self.window.is_some(),
        };
        let Some(active) = active else { return Ok(Some(call)) };
        let Some(latent) = &active.latent else { return Ok(Some(call)) };
        let values = self.model.latent.process_in(latent.data(), latent.shape());
        // The pose latents' frames are their dimension 2, one fewer than the latent's along the windows'.
        let frames = latent.shape().get(2).copied();
        let (shape, values) = match (self.window, self.model.context_windows.as_deref()) {
            (Some(window), Some(w)) if frames.is_some_and(|f| f + 1 == self.shape[w.dim]) => {
                let frames = pose_frames(window, frames.unwrap_or(0));
                gather_frames(&values, latent.shape(), 2, &frames, &[])
            }
            _ => (latent.shape().to_vec(), values),
        };
        call.key = Some(wan::pose_key(&shape, &values));
        call.pose = Some(b.from_f32(&shape, &values, b.compute_dtype())?);
        call.context = upload(&active.context)?;
        call.clip = upload(&active.clip_vision)?;
        call.pose_strength = active.strength as f32;
        call.cache = match (self.pose_cache, self.model.pose_cache) {
            (Some(slot), Some(settings)) => Some(
                slot.get_or_init(|| Box::new(wan::PoseCache::<B>::new(settings)))
                    .downcast_ref::<wan::PoseCache<B>>()
                    .ok_or_else(|| {
                        kiln_models::Error::Invalid(
                            "a Wan Animate 2 cache made on another device".to_owned(),
                        )
                    })?,
            ),
            _ => None,
        };
        Ok(Some(call))
    }
}

/// The frames a windowed call's pose latents give (ComfyUI's `slice_cond` with a temporal offset of 1): the
/// pose frame before each of the window's frames, past the reference slot (the anchor's, or the window's first
/// frame without one), those inside the `frames` the pose latents have.
fn pose_frames(window: &Window, frames: usize) -> Vec<usize> {
    let skip = usize::from(window.anchor.is_none());
    window
        .frames
        .iter()
        .skip(skip)
        .filter_map(|&i| i.checked_sub(1))
        .filter(|&i| i < frames)
        .collect()
}

/// What a call reads of the latent: its shape (the window's) and the noise mask at one part's shape cut the same.
struct WindowView<'a> {
    shape: Vec<usize>,
    mask: Option<Cow<'a, [f32]>>,
}

/// A call's Wan Animate 2 inputs on the device.
struct AnimateCall<'c, B: Backend> {
    pose: Option<kiln_compute::Tensor<B>>,
    key: Option<(Vec<usize>, Vec<f32>)>,
    context: Option<kiln_compute::Tensor<B>>,
    clip: Option<kiln_compute::Tensor<B>>,
    pose_strength: f32,
    reference_strength: f32,
    cache: Option<&'c wan::PoseCache<B>>,
    windowed: bool,
}

impl<'c, B: Backend> AnimateCall<'c, B> {
    /// The model's view of these inputs.
    fn input<'s>(&'s self) -> wan::animate2::Animate2Input<'s, B>
    where
        'c: 's,
    {
        let cache = match (self.cache, &self.key) {
            (Some(cache), Some(key)) => {
                Some(wan::animate2::CacheCall { cache, key, windowed: self.windowed })
            }
            _ => None,
        };
        wan::animate2::Animate2Input {
            pose: self.pose.as_ref(),
            context: self.context.as_ref(),
            clip: self.clip.as_ref(),
            pose_strength: self.pose_strength,
            reference_strength: self.reference_strength,
            cache,
        }
    }
}

/// The denoiser the samplers call: ComfyUI's CFG over the diffusion model's x̂₀ predictions, several
/// conditionings of one side averaged.
struct Guided<'a> {
    compute: &'a Compute,
    model: &'a DiffusionModel,
    shape: Vec<usize>,
    positive: &'a Conditioning,
    negative: Option<&'a Conditioning>,
    /// The guider's CFG scale.
    cfg: f64,
    dual: Option<&'a DualCfg>,
    perp_neg: Option<&'a PerpNeg>,
    /// The latent's noise mask, when it has one.
    inpaint: Option<Inpaint>,
    /// The run's `FluxKVCache` store, when the model has the patch.
    kv_cache: Option<KvSlot>,
    /// The call's block of frames, in an `ar_video` run.
    causal: Option<CausalCall<'a>>,
    /// InfiniteTalk's motion latent in model space and its frames, put over the first frames of every model
    /// call's latent.
    motion: Option<(Vec<f32>, usize)>,
    /// The run's context windows, when the model has `ContextWindowsManual`.
    windows: Option<WindowRun>,
    /// The run's Wan Animate 2 pose-branch cache, when the model has `WanAnimate2Cache`.
    pose_cache: Option<KvSlot>,
    /// `EasyCache`'s state for the run, consulted at each network call.
    easy_cache: Option<Mutex<StepCacheRun>>,
    /// `LazyCache`'s state for the run, consulted at each guided step.
    lazy_cache: Option<Mutex<StepCacheRun>>,
}

/// What a masked latent's sampling keeps (ComfyUI's `KSamplerX0Inpaint`): where the mask is 0, the model
/// sees the input latent noised to the current sigma and its prediction is the input latent.
struct Inpaint {
    /// The mask at the latent's shape, `[B, C, h, w]`.
    mask: Vec<f32>,
    /// The input latent in model space (zeros for an empty one).
    latent: Vec<f32>,
    /// The starting noise (unscaled).
    noise: Vec<f32>,
    /// `DifferentialDiffusion`, when the model has it.
    differential: Option<Differential>,
    /// Where the mask is 0 the model sees the input latent itself, not noised to σ (the `scale_latent_inpaint` of
    /// Wan 2.2, whose given frames also get timestep 0, and of HunyuanVideo).
    clean: bool,
}

/// `DifferentialDiffusion`'s mask function: at each step the mask becomes 1 where it reaches how far sampling
/// still has to go (in timesteps, from the first sigma's to the last's or the model's smallest), 0 elsewhere,
/// blended with the mask itself when `strength` < 1.
struct Differential {
    strength: f32,
    /// The timesteps of the first sigma and of the end.
    ts_from: f32,
    ts_to: f32,
    /// σ → timestep.
    sampling: ModelSampling,
}

impl Differential {
    fn new(sampling: &ModelSampling, sigmas: &[f32], strength: f32) -> Differential {
        let last = sigmas[sigmas.len() - 1];
        let sigma_to = if last > sampling.sigma_min() { last } else { sampling.sigma_min() };
        Differential {
            strength,
            ts_from: sampling.timestep(sigmas[0]),
            ts_to: sampling.timestep(sigma_to),
            sampling: sampling.clone(),
        }
    }

    /// The mask for the step at `sigma`, as the f32 tensor ops compute it.
    fn mask(&self, mask: &[f32], sigma: f32) -> Vec<f32> {
        let current = self.sampling.timestep(sigma);
        let threshold = (current - self.ts_to) / (self.ts_from - self.ts_to);
        let binary = mask.iter().map(|&m| if m >= threshold { 1.0f32 } else { 0.0 });
        if self.strength > 0.0 && self.strength < 1.0 {
            let rest = (1.0 - f64::from(self.strength)) as f32;
            binary.zip(mask).map(|(b, m)| self.strength * b + rest * m).collect()
        } else {
            binary.collect()
        }
    }
}

impl Inpaint {
    /// The mask at `sigma`: the noise mask, or what `DifferentialDiffusion` makes of it.
    fn mask_at(&self, sigma: f32) -> Cow<'_, [f32]> {
        match &self.differential {
            Some(d) => d.mask(&self.mask, sigma).into(),
            None => self.mask.as_slice().into(),
        }
    }

    /// x where the mask is 1, the input noised to `sigma` where it is 0: `x·m + noise_scaling(σ)·(1 − m)`.
    fn input(&self, sampling: &ModelSampling, x: &[f32], sigma: f32, mask: &[f32]) -> Vec<f32> {
        if self.clean {
            return blend(x, &self.latent, mask);
        }
        let kept = sampling.noise_at(sigma, &self.noise, &self.latent);
        blend(x, &kept, mask)
    }

    /// The prediction where the mask is 1, the input latent where it is 0.
    fn output(&self, out: &[f32], mask: &[f32]) -> Vec<f32> {
        blend(out, &self.latent, mask)
    }
}

/// `a·m + b·(1 − m)`, as torch computes `a * mask + b * (1. - mask)`.
fn blend(a: &[f32], b: &[f32], mask: &[f32]) -> Vec<f32> {
    a.iter().zip(b).zip(mask).map(|((a, b), m)| a * m + b * (1.0 - m)).collect()
}

/// ComfyUI's `reshape_mask`: a noise mask (`[B, 1, H, W]`, `[B, H, W]` or `[H, W]`) resized bilinearly to the
/// latent's `h × w`, repeated over its channels and to its batch.
fn denoise_mask(mask: &Tensor, shape: &[usize]) -> Result<Vec<f32>, NodeError> {
    if shape.len() == 5 {
        return denoise_mask_video(mask, shape);
    }
    let &[batch, channels, h, w] = shape else {
        return Err(NodeError::new(format!("a noise mask for a latent of shape {shape:?}")));
    };
    let dims = mask.shape();
    let (mh, mw) = match dims {
        [.., mh, mw] if dims.len() >= 2 => (*mh, *mw),
        _ => return Err(NodeError::new(format!("a noise mask of shape {dims:?}"))),
    };
    let masks = mask.data().len() / (mh * mw).max(1);
    let as_image = Tensor::new(vec![masks, mh, mw, 1], mask.data().to_vec())
        .map_err(|e| NodeError::new(e.to_string()))?;
    let resized = super::resize::resize(&as_image, w, h, "bilinear", false)?;
    let plane = h * w;
    let mut out = Vec::with_capacity(batch * channels * plane);
    for b in 0..batch {
        // repeat_to_batch_size: the masks repeated (or cut) to the batch.
        let m = &resized.data()[(b % masks) * plane..][..plane];
        for _ in 0..channels {
            out.extend_from_slice(m);
        }
    }
    Ok(out)
}

/// Wan 2.2's per-frame timesteps (ComfyUI's `WAN22.process_timestep`): each sample's `timestep` times the
/// mean of its noise mask over each latent frame's channels and pixels, so a given (kept) frame is at t = 0.
/// `mask` is at one part's latent shape `[B', C, T, h, w]`; the batch of `batch` samples cycles through its
/// parts. `None` for a latent that is not a video.
fn frame_timesteps(
    part_shape: &[usize],
    mask: &[f32],
    batch: usize,
    timestep: f32,
) -> Option<Vec<f32>> {
    let &[part_batch, channels, frames, h, w] = part_shape else {
        return None;
    };
    let plane = h * w;
    let per_frame = (channels * plane) as f32;
    let mut out = Vec::with_capacity(batch * frames);
    for i in 0..batch {
        let sample = &mask[(i % part_batch.max(1)) * channels * frames * plane..]
            [..channels * frames * plane];
        for f in 0..frames {
            let sum: f32 = (0..channels)
                .map(|c| sample[(c * frames + f) * plane..][..plane].iter().sum::<f32>())
                .sum();
            out.push(sum / per_frame * timestep);
        }
    }
    Some(out)
}

/// [`denoise_mask`] for a video latent `[B, C, T, h, w]`: a mask `[B, C', T', H, W]` (or one of fewer
/// dimensions, whose leading entries become the frames of one sample) resized trilinearly to `T × h × w`,
/// then repeated over the channels (cut to C) and to the batch, as ComfyUI's `reshape_mask`.
fn denoise_mask_video(mask: &Tensor, shape: &[usize]) -> Result<Vec<f32>, NodeError> {
    let &[batch, channels, frames, h, w] = shape else {
        return Err(NodeError::new(format!("a noise mask for a latent of shape {shape:?}")));
    };
    let dims = mask.shape();
    let (mb, mc, mt, mh, mw) = match *dims {
        [b, c, t, mh, mw] => (b, c, t, mh, mw),
        [.., mh, mw] if dims.len() >= 2 => (1, 1, mask.data().len() / (mh * mw).max(1), mh, mw),
        _ => return Err(NodeError::new(format!("a noise mask of shape {dims:?}"))),
    };
    if mb * mc * mt == 0 || frames == 0 {
        return Err(NodeError::new(format!("an empty noise mask {dims:?} for a latent {shape:?}")));
    }
    // Space: each frame bilinearly, as the image path.
    let as_image = Tensor::new(vec![mb * mc * mt, mh, mw, 1], mask.data().to_vec())
        .map_err(|e| NodeError::new(e.to_string()))?;
    let spatial = super::resize::resize(&as_image, w, h, "bilinear", false)?;
    let plane = h * w;
    // Time: linear with half-pixel centres (align_corners=False), as torch's trilinear.
    let scale = mt as f64 / frames as f64;
    let mut resized = Vec::with_capacity(mb * mc * frames * plane);
    for series in spatial.data().chunks_exact(mt * plane) {
        for t in 0..frames {
            let src = ((t as f64 + 0.5) * scale - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(mt - 1);
            let i1 = (i0 + 1).min(mt - 1);
            let lambda = (src - i0 as f64) as f32;
            let (a, b) = (&series[i0 * plane..][..plane], &series[i1 * plane..][..plane]);
            resized.extend(a.iter().zip(b).map(|(a, b)| a * (1.0 - lambda) + b * lambda));
        }
    }
    let per_channel = frames * plane;
    let mut out = Vec::with_capacity(batch * channels * per_channel);
    for b in 0..batch {
        let sample = &resized[(b % mb) * mc * per_channel..][..mc * per_channel];
        for c in 0..channels {
            out.extend_from_slice(&sample[(c % mc) * per_channel..][..per_channel]);
        }
    }
    Ok(out)
}

impl Guided<'_> {
    /// The mean x̂₀ over the entries of one side.
    fn predict(&self, side: &Conditioning, x: &[f32], sigma: f32) -> kiln_models::Result<Vec<f32>> {
        self.predict_skipping(side, x, sigma, SkippedBlocks::default())
    }

    /// [`Guided::predict`] with `skipped` blocks left out of the model.
    fn predict_skipping(
        &self,
        side: &Conditioning,
        x: &[f32],
        sigma: f32,
        skipped: SkippedBlocks,
    ) -> kiln_models::Result<Vec<f32>> {
        let x = &self.with_motion(x)?;
        // `split_conds_to_windows`: each window reads the prompt of its region alone.
        if let (true, [first, _, ..]) = (self.splits_prompts(), side.entries.as_slice()) {
            if side.entries.iter().any(|e| !e.extras.region.is_whole()) {
                return Err(kiln_models::Error::Invalid(
                    "context windows that split a side's prompts among them (split_conds_to_windows) cannot weigh \
                     prompts by area, mask or strength yet"
                        .to_owned(),
                ));
            }
            let (contexts, pooled) = ([&first.cond], [first.pooled.as_ref()]);
            let whole =
                self.forward(&self.shape, x, sigma, (&contexts, &pooled, &first.extras), skipped);
            return self.windowed(whole, Some(&side.entries));
        }
        // ComfyUI's weighted mean: each prompt's x̂₀ times its weights over its block, over the weights' sum
        // (from 1e-37). Prompts outside their part of sampling sit this step out; with none left, the side
        // predicts zeros.
        let mut sum = vec![0f32; x.len()];
        let mut counts = vec![1e-37f32; x.len()];
        for entry in side.entries.iter().filter(|e| self.in_range(&e.extras, sigma)) {
            if self.causal.is_some() && !entry.extras.region.is_whole() {
                // Regions are resolved for the whole video; an ar_video call sees one block of its frames.
                return Err(kiln_models::Error::Invalid(
                    "the ar_video sampler cannot weigh prompts by area, mask or strength yet"
                        .to_owned(),
                ));
            }
            let placement = super::prompt_regions::placement(&entry.extras.region, &self.shape)
                .map_err(|e| kiln_models::Error::Invalid(e.message))?;
            let (contexts, pooled) = ([&entry.cond], [entry.pooled.as_ref()]);
            let prompt = (&contexts[..], &pooled[..], &entry.extras);
            // A prompt restricted to an area runs on its block of the latent alone.
            let (block_shape, block_x);
            let whole = match placement.as_ref().filter(|p| p.cropped) {
                Some(p) => {
                    self.refuse_cropped(&entry.extras)?;
                    block_shape = p.shape(&self.shape);
                    block_x = super::prompt_regions::crop(x, &self.shape, &p.block);
                    let block = Block { whole: &self.shape, cells: &p.block };
                    let call = self.forward(&block_shape, &block_x, sigma, prompt, skipped);
                    Forward { block: Some(block), ..call }
                }
                None => self.forward(&self.shape, x, sigma, prompt, skipped),
            };
            // At a boundary of the pose's part of sampling, ComfyUI's conditioning with the pose and its
            // complement without are both in range: both count.
            let modes: &[PoseMode] = if self.pose_at_boundary(&entry.extras, sigma) {
                &[PoseMode::On, PoseMode::Off]
            } else {
                &[PoseMode::ByRange]
            };
            for &pose in modes {
                let denoised = self.windowed(Forward { pose, ..whole }, None)?;
                match &placement {
                    Some(p) => super::prompt_regions::add_weighted(
                        (&mut sum, &mut counts),
                        &self.shape,
                        &p.block,
                        &denoised,
                        &p.weights,
                    ),
                    None => {
                        sum.iter_mut().zip(denoised).for_each(|(s, d)| *s += d);
                        counts.iter_mut().for_each(|c| *c += 1.0);
                    }
                }
            }
        }
        sum.iter_mut().zip(&counts).for_each(|(s, c)| *s /= c);
        Ok(sum)
    }

    /// The network's output for `call`, through EasyCache when the model has it (each of the call's prompts
    /// known by its embedding's address; ComfyUI's batch holds prompts of one shape in reverse, and runs prompts of
    /// other shapes apart, in order); with the input x̂₀ is to be taken against when it is not the call's.
    ///
    /// ComfyUI's EasyCache adds the cached difference to the network's input tensor in place; for a model that
    /// reads no channels beside the latent that tensor is the one x̂₀ is then computed against, so a skipped call's
    /// x̂₀ is taken against its own output. Kiln does the same, to give ComfyUI's images.
    fn network(&self, call: Forward<'_>) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        let device = self.compute.device();
        let Some(cache) = &self.easy_cache else { return Ok((on_device(device, call)?, None)) };
        let keys: Vec<usize> =
            call.contexts.iter().map(|t| std::ptr::from_ref(*t) as usize).collect();
        let one_shape = call.contexts.iter().all(|t| t.shape() == call.contexts[0].shape());
        let first = if one_shape { keys.last() } else { keys.first() };
        let Some(&first) = first else { return Ok((on_device(device, call)?, None)) };
        let mut cache = lock(cache)?;
        // The cache sees what the network reads (`calculate_input`: an EPS model's x / √(σ² + 1)).
        let read = self.model.sampling.calculate_input(call.sigma, call.x);
        let (out, skipped) =
            cache.network_call((call.sigma, call.shape, &read), (&keys, first), || {
                on_device(device, call)
            })?;
        // Only an f32 run hands the network the tensor itself (`xc.to(dtype)` copies to another type), and only
        // a model that reads x unscaled (an EPS model's `xc` is a new tensor).
        let aliased = skipped
            && matches!(read, Cow::Borrowed(_))
            && self.model.net.concat_channels() == 0
            && self.model.compute_dtype == DType::F32;
        let input = aliased.then(|| out.clone());
        Ok((out, input))
    }

    /// What a prompt restricted to an area cannot be sampled with yet: the model runs on the prompt's block of
    /// the latent alone, and these are laid out over the whole latent or kept across calls.
    fn refuse_cropped(&self, extras: &CondExtras) -> kiln_models::Result<()> {
        let what = [
            (self.easy_cache.is_some(), "EasyCache"),
            (self.windows.is_some(), "context windows (ContextWindowsManual)"),
            (self.causal.is_some(), "an ar_video run"),
            (self.motion.is_some(), "InfiniteTalk's motion latent"),
            (self.kv_cache.is_some(), "FluxKVCache"),
            (self.pose_cache.is_some(), "WanAnimate2Cache"),
            (!self.model.model_patches.is_empty(), "a model patch's control image"),
            (!extras.controls.is_empty(), "a ControlNet"),
            (!extras.vace.is_empty(), "VACE controls"),
            (extras.camera.is_some(), "a camera embedding"),
            (!extras.context_latents.is_empty(), "in-context latents (BerniniConditioning)"),
            (extras.reference_motion.is_some() || extras.control_video.is_some(), "S2V's latents"),
            (extras.animate_pose.is_some(), "Wan Animate 2's pose"),
            (extras.time_dim_concat.is_some(), "Phantom's subject frames"),
            (
                extras.concat_latent_image.is_some()
                    && self.model.net.family() == DiffusionFamily::HiDream,
                "HiDream E1's image latent",
            ),
            (extras.audio_embed.is_some() || extras.dancer_music.is_some(), "audio"),
        ];
        match what.iter().find(|(present, _)| *present) {
            Some((_, name)) => Err(kiln_models::Error::Invalid(format!(
                "a prompt restricted to an area (ConditioningSetArea, ConditioningSetMask's mask bounds) cannot \
                 be sampled with {name} yet: give the prompt the whole latent, or weigh it with a mask alone"
            ))),
            None => Ok(()),
        }
    }

    /// Whether a prompt takes part at `sigma` (`ConditioningSetTimestepRange`): ComfyUI leaves it out above its
    /// start's sigma and below its end's, compared in f32.
    fn in_range(&self, extras: &CondExtras, sigma: f32) -> bool {
        extras.timestep_range.is_none_or(|range| self.model.sampling.in_percent_range(range, sigma))
    }

    /// Whether the run's context windows split a side's prompts among the windows (`split_conds_to_windows`,
    /// with a latent longer than a window).
    fn splits_prompts(&self) -> bool {
        self.windows.as_ref().is_some_and(|run| {
            let w = &run.windows;
            w.split_conds && self.shape.get(w.dim).is_some_and(|&frames| w.applies(frames))
        })
    }

    /// Whether `sigma` is where Wan Animate 2's pose starts or stops (`pose_start_percent` above 0,
    /// `pose_end_percent` below 1).
    fn pose_at_boundary(&self, extras: &CondExtras, sigma: f32) -> bool {
        let Some(pose) = extras.animate_pose.as_ref().filter(|p| p.latent.is_some()) else {
            return false;
        };
        let sampling = &self.model.sampling;
        let (start, end) = pose.percent;
        (start > 0.0 && sigma == sampling.percent_to_sigma(start) as f32)
            || (end < 1.0 && sigma == sampling.percent_to_sigma(end) as f32)
    }

    /// A call of the model on `x` (of `shape`) at `sigma` with a prompt's contexts, pooled vectors and extras,
    /// `skipped` blocks left out, with the run's noise mask, caches and block of frames.
    fn forward<'f>(
        &'f self,
        shape: &'f [usize],
        x: &'f [f32],
        sigma: f32,
        (contexts, pooled, extras): (&'f [&'f Tensor], &'f [Option<&'f Tensor>], &'f CondExtras),
        skipped: SkippedBlocks,
    ) -> Forward<'f> {
        Forward {
            model: self.model,
            shape,
            x,
            sigma,
            contexts,
            pooled,
            extras,
            denoise_mask: self.inpaint.as_ref().map(|i| i.mask.as_slice()),
            kv_cache: self.kv_cache.as_ref(),
            skipped,
            causal: self.causal,
            window: None,
            pose_cache: self.pose_cache.as_ref(),
            pose: PoseMode::ByRange,
            block: None,
        }
    }

    /// The x̂₀ of the call `whole`: that call's, or, when the model has context windows and the latent is longer
    /// than one, the x̂₀ of the calls on this step's windows (each from its own window of the latent), fused; with
    /// `split`, each window's call reads the prompt of `split` its place picks (`split_conds_to_windows`).
    fn windowed(
        &self,
        whole: Forward<'_>,
        split: Option<&[crate::models::Cond]>,
    ) -> kiln_models::Result<Vec<f32>> {
        let device = self.compute.device();
        let sampling = &self.model.sampling;
        let plain = |call: Forward<'_>| -> kiln_models::Result<Vec<f32>> {
            let (out, input) = self.network(call)?;
            Ok(sampling.calculate_denoised(call.sigma, input.as_deref().unwrap_or(call.x), &out))
        };
        let Some(run) = &self.windows else { return plain(whole) };
        let windows =
            run.windows_of(whole.shape, whole.sigma).map_err(kiln_models::Error::Invalid)?;
        let Some(windows) = windows else { return plain(whole) };
        let settings = &run.windows;
        let total = whole.shape[settings.dim];
        let mut fusion = Fusion::new(whole.shape, settings);
        for window in &windows {
            let entry = split.map(|entries| &entries[window.region(entries.len(), total)]);
            let contexts = entry.map(|e| [&e.cond]);
            let pooled = entry.map(|e| [e.pooled.as_ref()]);
            let mut call = Forward { window: Some(window), ..whole };
            if let (Some(entry), Some(contexts), Some(pooled)) = (entry, &contexts, &pooled) {
                call.contexts = contexts;
                call.pooled = pooled;
                call.extras = &entry.extras;
            }
            let (read_shape, read) = gather_frames(
                whole.x,
                whole.shape,
                settings.dim,
                &window.read(),
                &settings.latent_retain,
            );
            // A window whose prompt sits this step out (ConditioningSetTimestepRange) predicts zeros, as
            // ComfyUI's sum over no prompts does.
            let denoised = if entry.is_some_and(|e| !self.in_range(&e.extras, whole.sigma)) {
                vec![0.0; read.len()]
            } else {
                let out = on_device(device, call)?;
                sampling.calculate_denoised(whole.sigma, &read, &out)
            };
            fusion.add(
                settings,
                window,
                &without_anchor(denoised, &read_shape, settings.dim, window),
            );
        }
        Ok(fusion.finish())
    }
}

impl Guided<'_> {
    /// The positive's and the negative's x̂₀ from one model call with both in the batch, as ComfyUI's
    /// `calc_cond_batch` runs them, when they can share it: one prompt each, with contexts of one shape
    /// (ComfyUI's `can_concat`), or of different lengths for a model that takes ragged text and runs no
    /// context windows (where ComfyUI makes two calls, one call reads each weight once). `None` when they
    /// cannot (several prompts on a side, different lengths elsewhere, a pose boundary, context windows across
    /// the batch). Each sample of a batch is computed on its own, so the predictions are those of two calls up to
    /// the GEMM kernels' rounding (a batch's rows may take another kernel than one sample's).
    fn pair(
        &self,
        negative: &Conditioning,
        x: &[f32],
        sigma: f32,
    ) -> kiln_models::Result<Option<(Vec<f32>, Vec<f32>)>> {
        let ([pos], [neg]) = (&self.positive.entries[..], &negative.entries[..]) else {
            return Ok(None);
        };
        let pooled_shape = |c: &crate::models::Cond| c.pooled.as_ref().map(|p| p.shape().to_vec());
        let windows_cut_batch = self.windows.as_ref().is_some_and(|w| w.windows.dim == 0);
        let ragged = self.model.net.takes_ragged_text() && self.windows.is_none();
        let joinable = pos.cond.shape() == neg.cond.shape()
            || (ragged && joinable_rows(&[&pos.cond, &neg.cond]).is_some());
        if !joinable
            || pos.extras != neg.extras
            || !self.in_range(&pos.extras, sigma)
            || !pos.extras.region.is_whole()
            || pooled_shape(pos) != pooled_shape(neg)
            || self.pose_at_boundary(&pos.extras, sigma)
            || windows_cut_batch
        {
            return Ok(None);
        }
        let x = &self.with_motion(x)?;
        let mut shape = self.shape.clone();
        shape[0] *= 2;
        let doubled: Vec<f32> = x.iter().chain(x.iter()).copied().collect();
        let contexts = [&pos.cond, &neg.cond];
        let pooled = [pos.pooled.as_ref(), neg.pooled.as_ref()];
        let prompts = (&contexts[..], &pooled[..], &pos.extras);
        let forward = self.forward(&shape, &doubled, sigma, prompts, SkippedBlocks::default());
        let denoised = self.windowed(forward, None)?;
        let (cond, uncond) = denoised.split_at(x.len());
        Ok(Some((cond.to_vec(), uncond.to_vec())))
    }
}

impl Guided<'_> {
    /// What the model is shown of `x`: with InfiniteTalk, its first frames replaced by the motion latent in every
    /// sample (ComfyUI's `MultiTalkApplyModelWrapper`: the prediction of x̂₀ reads the replaced latent too).
    fn with_motion<'x>(&self, x: &'x [f32]) -> kiln_models::Result<Cow<'x, [f32]>> {
        let Some((motion, frames)) = &self.motion else { return Ok(Cow::Borrowed(x)) };
        let &[batch, channels, total, h, w] = self.shape.as_slice() else {
            return Err(kiln_models::Error::Invalid(format!(
                "InfiniteTalk samples a video latent [B, C, T, H, W], got {:?}",
                self.shape
            )));
        };
        let plane = h * w;
        if *frames > total
            || motion.len() != channels * frames * plane
            || x.len() != batch * channels * total * plane
        {
            return Err(kiln_models::Error::Invalid(format!(
                "InfiniteTalk's motion latent of {frames} frames does not fit a latent of {:?}: make the latent \
                 with the same WanInfiniteTalkToVideo",
                self.shape
            )));
        }
        let mut out = x.to_vec();
        overwrite_leading_frames(&mut out, channels, total * plane, motion, frames * plane);
        Ok(Cow::Owned(out))
    }
}

impl Denoiser for Guided<'_> {
    fn denoise(&mut self, x: &[f32], sigma: f32) -> kiln_models::Result<Vec<f32>> {
        Ok(self.masked(x, sigma, false)?.0)
    }

    fn denoise_cfg_pp(
        &mut self,
        x: &[f32],
        sigma: f32,
    ) -> kiln_models::Result<(Vec<f32>, Vec<f32>)> {
        match self.masked(x, sigma, true)? {
            (denoised, Some(uncond)) => Ok((denoised, uncond)),
            (_, None) => Err(kiln_models::Error::Invalid(
                "the CFG++ samplers read the unconditional prediction, which BasicGuider does not make \
                 (it runs the positive alone): use CFGGuider"
                    .to_owned(),
            )),
        }
    }
}

impl Guided<'_> {
    /// Whether CFG evaluates the negative: ComfyUI's cfg1 optimisation skips it at cfg 1, and an empty one is
    /// not evaluated either.
    fn cfg_reads_negative(&self) -> bool {
        let overrides = &self.model.guidance.cfg_overrides;
        self.negative.is_some_and(|n| !n.entries.is_empty())
            && ((self.cfg - 1.0).abs() > 1e-9 || overrides.iter().any(|o| !isclose(o.cfg, 1.0)))
    }

    /// The CFG scale of a model call at `sigma`: the guider's, or a `CFGOverride`'s, as ComfyUI's
    /// `predict_noise` wrapper sets it (DualCFGGuider reads its own two scales, which the wrapper leaves alone).
    fn scale(&self, sigma: f32) -> f64 {
        match self.dual {
            Some(_) => self.cfg,
            None => self.model.guidance.cfg_at(self.cfg, sigma),
        }
    }

    /// The guided x̂₀ with the latent's noise mask applied around the model (ComfyUI's `KSamplerX0Inpaint`),
    /// and the unconditional prediction as a post-CFG hook sees it (unmasked).
    fn masked(
        &self,
        x: &[f32],
        sigma: f32,
        cfg_pp: bool,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        let Some(inpaint) = &self.inpaint else {
            return self.guide(x, sigma, cfg_pp);
        };
        let mask = inpaint.mask_at(sigma);
        let x = inpaint.input(&self.model.sampling, x, sigma, &mask);
        let (out, uncond) = self.guide(&x, sigma, cfg_pp)?;
        Ok((inpaint.output(&out, &mask), uncond))
    }

    /// The guided x̂₀: the conditional prediction and, unless skipped, the unconditional one, combined; and
    /// the unconditional prediction CFG combined with (`None` when it was skipped: `BasicGuider` has none, and
    /// ComfyUI skips it at CFG 1; the hooks still run, seeing zeros). `cfg_pp` turns ComfyUI's CFG-1 shortcut
    /// off, as the CFG++ samplers' hook does.
    fn guide(
        &self,
        x: &[f32],
        sigma: f32,
        cfg_pp: bool,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        if let Some(cache) = &self.lazy_cache {
            let mut cache = lock(cache)?;
            return cache
                .guided_step((sigma, &self.shape, x), || self.guide_uncached(x, sigma, cfg_pp));
        }
        if let Some(cache) = &self.easy_cache {
            lock(cache)?.begin_evaluation();
        }
        self.guide_uncached(x, sigma, cfg_pp)
    }

    /// [`Guided::guide`] without LazyCache.
    fn guide_uncached(
        &self,
        x: &[f32],
        sigma: f32,
        cfg_pp: bool,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        if let Some(dual) = self.dual {
            return self.guide_dual(dual, x, sigma, cfg_pp);
        }
        if let Some(perp_neg) = self.perp_neg {
            return self.guide_perp_neg(perp_neg, x, sigma, cfg_pp);
        }
        let cond = || self.predict(self.positive, x, sigma);
        // ComfyUI skips the negative at CFG 1 (BasicGuider's always) unless a CFG++ sampler reads it; an empty one
        // is evaluated as zeros, without a model call.
        let evaluate = cfg_pp || !isclose(self.scale(sigma), 1.0);
        let skip = self.model.guidance.uncond_skip.filter(|s| s.active(sigma));
        let (cond, uncond) = match self.negative {
            Some(negative) if evaluate => self.both_sides(negative, skip, x, sigma)?,
            _ => (cond()?, None),
        };
        let guidance = &self.model.guidance;
        if uncond.is_none() && guidance.is_plain() && isclose(self.scale(sigma), 1.0) {
            // CFG 1 with the skipped negative as zeros gives the conditional prediction itself (BasicGuider's
            // under a `CFGOverride` of another scale is that scale times it).
            return Ok((cond, None));
        }
        self.combined(x, sigma, cond, uncond)
    }

    /// The positive's and the negative's x̂₀: in one call when they can share it; the negative from a pass
    /// without `skip`'s blocks (`SkipLayerGuidanceDiTSimple`), which ComfyUI's hook makes as another evaluation.
    fn both_sides(
        &self,
        negative: &Conditioning,
        skip: Option<UncondSkip>,
        x: &[f32],
        sigma: f32,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        let cond = || self.predict(self.positive, x, sigma);
        Ok(if let Some(skip) = skip {
            let cond = cond()?;
            if let Some(cache) = &self.easy_cache {
                lock(cache)?.begin_evaluation();
            }
            let skipped = SkippedBlocks { double: skip.double, single: skip.single };
            (cond, Some(self.predict_skipping(negative, x, sigma, skipped)?))
        } else if let Some((cond, uncond)) = self.pair(negative, x, sigma)? {
            // One model call for both sides, as ComfyUI batches them.
            (cond, Some(uncond))
        } else {
            (cond()?, Some(self.predict(negative, x, sigma)?))
        })
    }

    /// CFG of `cond` over `uncond` (`None`: skipped, zeros) with the model's hooks around it: those before CFG,
    /// the replacing one, those after. Returns it with the unconditional prediction the hooks left.
    fn combined(
        &self,
        x: &[f32],
        sigma: f32,
        cond: Vec<f32>,
        uncond: Option<Vec<f32>>,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        let guidance = &self.model.guidance;
        let (cfg, shape) = (self.scale(sigma) as f32, self.shape.as_slice());
        // The hooks before CFG (`TCFG`, `APG`) hand CFG, the post-CFG hooks and a CFG++ sampler their
        // predictions.
        let before = Predictions { x, cond: &cond, uncond: uncond.as_deref(), cfg, sigma, shape };
        let modified = guidance.before_cfg(&before, 2)?;
        let (cond, uncond) = modified.unwrap_or((cond, uncond));
        let predictions =
            Predictions { x, cond: &cond, uncond: uncond.as_deref(), cfg, sigma, shape };
        // `SkipLayerGuidanceDiT`'s hook runs the positive once more without its blocks.
        let combined = guidance.combine_with(predictions, &mut |layers| {
            let skipped = SkippedBlocks { double: layers.double, single: layers.single };
            // Another evaluation of the model, as ComfyUI's hook makes it.
            if let Some(cache) = &self.easy_cache {
                lock(cache)?.begin_evaluation();
            }
            self.predict_skipping(self.positive, x, sigma, skipped)
        })?;
        Ok((combined, uncond))
    }

    /// `PerpNegGuider`'s x̂₀ (its `predict_noise`): the positive's, the negative's and the empty prompt's
    /// predictions (the negative skipped at `neg_scale` 0, the empty prompt too when cfg is also 1: zeros), the
    /// pre-CFG hooks on the first two, then `empty + cfg·(pos − neg_scale·perp)` with `pos` and `neg` taken from
    /// the empty prompt's and `perp` the negative's part perpendicular to the positive over the whole batch,
    /// then the post-CFG hooks. The empty prompt runs first: ComfyUI's one batch of all three holds it first.
    fn guide_perp_neg(
        &self,
        perp_neg: &PerpNeg,
        x: &[f32],
        sigma: f32,
        cfg_pp: bool,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        // A CFG++ sampler turns the skipping off (`disable_cfg1_optimization`).
        let skip_negative = !cfg_pp && isclose(perp_neg.neg_scale, 0.0);
        let skip_empty = skip_negative && isclose(self.scale(sigma), 1.0);
        let zeros = || vec![0.0f32; x.len()];
        let empty = if skip_empty { zeros() } else { self.predict(&perp_neg.empty, x, sigma)? };
        let negative = match self.negative {
            Some(negative) if !skip_negative => Some(self.predict(negative, x, sigma)?),
            _ => None,
        };
        let positive = self.predict(self.positive, x, sigma)?;
        let guidance = &self.model.guidance;
        let (cfg, shape) = (self.scale(sigma) as f32, self.shape.as_slice());
        let before =
            Predictions { x, cond: &positive, uncond: negative.as_deref(), cfg, sigma, shape };
        // ComfyUI hands PerpNeg's hooks three predictions: the positive, the negative and the empty prompt's.
        let (positive, negative) = guidance.before_cfg(&before, 3)?.unwrap_or((positive, negative));
        let negative = negative.unwrap_or_else(zeros);
        let out = perp_neg_combine(&positive, &negative, &empty, perp_neg.neg_scale as f32, cfg);
        let predictions =
            Predictions { x, cond: &positive, uncond: Some(&negative), cfg, sigma, shape };
        let out = guidance.after_cfg_with(predictions, out, &mut |layers| {
            let skipped = SkippedBlocks { double: layers.double, single: layers.single };
            if let Some(cache) = &self.easy_cache {
                lock(cache)?.begin_evaluation();
            }
            self.predict_skipping(self.positive, x, sigma, skipped)
        })?;
        Ok((out, Some(negative)))
    }

    /// `DualCFGGuider`'s x̂₀ (its `predict_noise`). Regular: CFG from the negative to `cond2` at `cfg_middle`,
    /// plus (`cond1` − `cond2`)·cfg, the negative skipped at `cfg_middle` 1 and `cond2` too when both are 1
    /// (unless `cfg_pp`). Nested: CFG from `cond2` to `cond1` at cfg, then from the negative to that at
    /// `cfg_middle`. The unconditional side its CFG function sees: the negative (regular) or `cond2` (nested).
    fn guide_dual(
        &self,
        dual: &DualCfg,
        x: &[f32],
        sigma: f32,
        cfg_pp: bool,
    ) -> kiln_models::Result<(Vec<f32>, Option<Vec<f32>>)> {
        let shape = &self.shape;
        let predictions =
            |cond, uncond, cfg: f64| Predictions { x, cond, uncond, cfg: cfg as f32, sigma, shape };
        let guidance = &self.model.guidance;
        let skip_negative = !cfg_pp && !dual.nested && isclose(dual.cfg_middle, 1.0);
        // The positive first: ComfyUI's one batch of all three holds it first (what EasyCache decides by).
        let positive = self.predict(self.positive, x, sigma)?;
        let middle = if skip_negative && isclose(self.scale(sigma), 1.0) {
            vec![0.0; x.len()]
        } else {
            self.predict(&dual.middle, x, sigma)?
        };
        let negative = match self.negative {
            Some(negative) if !skip_negative => Some(self.predict(negative, x, sigma)?),
            _ => None,
        };
        if dual.nested {
            let text = guidance.combine(predictions(
                &positive,
                Some(middle.as_slice()),
                self.scale(sigma),
            ));
            let negative = negative.unwrap_or_else(|| vec![0.0; x.len()]);
            let scale = dual.cfg_middle as f32;
            let out = negative.iter().zip(text).map(|(n, t)| n + scale * (t - n)).collect();
            return Ok((out, Some(middle)));
        }
        let base = guidance.combine(predictions(&middle, negative.as_deref(), dual.cfg_middle));
        let scale = self.scale(sigma) as f32;
        let out = base
            .iter()
            .zip(positive.iter().zip(&middle))
            .map(|(b, (p, m))| b + (p - m) * scale)
            .collect();
        Ok((out, Some(negative.unwrap_or_else(|| vec![0.0; x.len()]))))
    }
}

/// One sampling run, as ComfyUI's `CFGGuider.sample` does it: what every sampler node comes down to.
pub(super) struct Sampling<'a> {
    /// The model.
    pub(super) model: &'a DiffusionModel,
    /// The conditioning followed.
    pub(super) positive: &'a Conditioning,
    /// The conditioning pushed away from (`None`: the positive alone).
    pub(super) negative: Option<&'a Conditioning>,
    /// The CFG scale.
    pub(super) cfg: f64,
    /// `DualCFGGuider`'s middle conditioning, when the guider is one.
    pub(super) dual: Option<&'a DualCfg>,
    /// `PerpNegGuider`'s empty prompt and scale, when the guider is one.
    pub(super) perp_neg: Option<&'a PerpNeg>,
    /// The method.
    pub(super) sampler: SamplerChoice,
    /// The noise levels, descending.
    pub(super) sigmas: &'a [f32],
    /// The starting noise.
    pub(super) noise: Noise,
    /// The latent (VAE space, with its noise mask and batch indices), as the LATENT link carries it.
    pub(super) latent: &'a Latent,
}

/// A sampler's output LATENT: `input`'s noise mask and batch indices with `samples`, without the empty
/// latent's `downscale_ratio_spacial` (ComfyUI's samplers pop it).
pub(super) fn sampled_latent(input: &Latent, samples: Tensor) -> Latent {
    Latent { downscale_ratio_spacial: None, ..input.with_samples(samples) }
}

/// What a run gives back, in VAE space: the final latent, and the model's last x̂₀ (`None` when no step ran).
pub(super) struct Sampled {
    /// The sampler's result.
    pub(super) samples: Tensor,
    /// The last step's denoised estimate (`SamplerCustom`'s `denoised_output`).
    pub(super) denoised: Option<Tensor>,
}

/// The latent as the model expects it, as ComfyUI's `fix_empty_latent_channels` makes it: an all-zero latent of
/// another channel count (an `EmptyLatentImage`) becomes zeros of the model's channels, and one whose maker
/// assumed another pixel ratio (`downscale_ratio_spacial` 8 given to FLUX.2's 16) is resized to the model's, so
/// the image keeps the size asked for.
fn fit_channels(latent: &Latent, format: &LatentFormat) -> Result<Tensor, NodeError> {
    let samples = &latent.samples;
    let shape = samples.shape();
    if !(4..=5).contains(&shape.len()) {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("expected a LATENT [B, C, H, W] or [B, C, T, H, W], got {shape:?}"),
        ));
    }
    let empty = samples.data().iter().all(|&v| v == 0.0);
    let ratio = latent.downscale_ratio_spacial.filter(|&r| empty && r != format.spatial_downscale);
    if shape[1] == format.channels && ratio.is_none() {
        return Ok(samples.clone());
    }
    if empty {
        let mut fitted = shape.to_vec();
        fitted[1] = format.channels;
        if let Some(ratio) = ratio {
            // `common_upscale` to round(side · ratio), Python's round (half to even); zeros stay zeros.
            let scale = ratio as f64 / format.spatial_downscale as f64;
            let n = fitted.len();
            for side in &mut fitted[n - 2..] {
                *side = (*side as f64 * scale).round_ties_even() as usize;
            }
        }
        return Ok(Tensor::full(fitted, 0.0));
    }
    Err(NodeError::of_kind(
        ErrorKind::InvalidValue,
        format!(
            "the latent has {} channels but the model works in {}: encode the image with this model's VAE",
            shape[1], format.channels
        ),
    ))
}

/// Runs `job`: the latent shifted into model space (unless all zero), noise-scaled at the first sigma, stepped
/// through the sigmas by the sampler with the guided denoiser, and brought back (inverse noise scaling at the
/// last sigma, then VAE space). No sigmas: the latent comes back as it went in.
/// The noise a run starts from (`NOISE`): the seed's draw for a latent of `shape`, each sample's by its index in
/// `batch_index` where the latent has one, or zeros.
pub(super) fn starting_noise(
    noise: Noise,
    shape: &[usize],
    batch_index: Option<&[i64]>,
) -> Result<Vec<f32>, NodeError> {
    match noise {
        Noise::Random(seed) => initial_noise(seed, shape, batch_index).map_err(node_error),
        Noise::Disabled(_) => Ok(vec![0.0; shape.iter().product()]),
    }
}

/// `latent` (VAE space) in the model's space, as a run starts from it: an all-zero latent (an empty one) stays
/// zero, as ComfyUI shifts only a latent with content.
pub(super) fn latent_in_model_space(format: &LatentFormat, latent: &Tensor) -> Vec<f32> {
    if latent.data().iter().any(|&v| v != 0.0) {
        format.process_in(latent.data(), latent.shape())
    } else {
        latent.data().to_vec()
    }
}

pub(super) fn sample(
    compute: &Compute,
    job: Sampling<'_>,
    ctx: &Context,
) -> Result<Sampled, NodeError> {
    let model = job.model;
    let latent = fit_channels(job.latent, &model.latent)?;
    // The sampler may change the last sigma, as ComfyUI's do (UniPC); the inverse noise scaling reads it after.
    let mut sigmas = job.sigmas.to_vec();
    if sigmas.is_empty() {
        return Ok(Sampled { samples: latent, denoised: None });
    }
    model.activate().map_err(node_error)?;
    let shape = latent.shape().to_vec();
    let mut noise = starting_noise(job.noise, &shape, job.latent.batch_index.as_deref())?;
    // FreeNoise: the context windows' later frames start from shuffled copies of earlier frames' noise.
    if let Some(windows) = model.context_windows.as_ref().filter(|w| w.freenoise) {
        windows.freenoise(&mut noise, &shape, job.noise.seed());
    }
    let format = model.latent;
    let start = latent_in_model_space(&format, &latent);
    let x = model.sampling.noise_scaling(&sigmas, &noise, &start);
    let inpaint = match &job.latent.noise_mask {
        Some(mask) => {
            // ddim re-noises the kept area with its own noise (ComfyUI's `inpaint_options["random"]`).
            let noise = match job.sampler.sampler {
                Sampler::Ddim => initial_noise(job.noise.seed().wrapping_add(1), &shape, None)
                    .map_err(node_error)?,
                _ => noise.clone(),
            };
            let differential = model
                .differential_diffusion
                .map(|strength| Differential::new(&model.sampling, &sigmas, strength));
            Some(Inpaint {
                mask: denoise_mask(mask, &shape)?,
                latent: start.clone(),
                noise,
                differential,
                // ComfyUI's `scale_latent_inpaint` of Wan 2.2 and HunyuanVideo (1.0 and 1.5): the clean latent.
                clean: matches!(
                    model.net.family(),
                    DiffusionFamily::Wan22
                        | DiffusionFamily::HunyuanVideo
                        | DiffusionFamily::HunyuanVideo15
                ),
            })
        }
        None => None,
    };
    // Model patches' and ControlNets' images, encoded once for the run; their weights readied beside the
    // model's.
    let mut patched = super::model_patch::with_hints(compute, model, &shape, ctx)?;
    // Hooks that read the model's sampling read it as the run starts, as ComfyUI's do.
    patched.guidance.sampling_is_flow(patched.sampling.flow().is_some());
    let model = &patched;
    for application in &model.model_patches {
        application.patch.net.weights().activate().map_err(|e| node_error(e.into()))?;
    }
    if let Some(talk) = &model.infinite_talk {
        if job.sampler.sampler == Sampler::ArVideo {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                "InfiniteTalk's model (WanInfiniteTalkToVideo) is not a causal one: choose another sampler than \
                 ar_video",
            ));
        }
        talk.patch.net.weights().activate().map_err(|e| node_error(e.into()))?;
    }
    let mut prepared = Vec::new();
    let mut with_hints = |c: &Conditioning| {
        super::controlnet::with_hints(compute, model, c, &shape, &mut prepared, ctx)
    };
    let mut positive = with_hints(job.positive)?;
    let mut negative = job.negative.map(&mut with_hints).transpose()?;
    let mut middle = job.dual.map(|d| with_hints(&d.middle)).transpose()?;
    let mut empty = job.perp_neg.map(|p| with_hints(&p.empty)).transpose()?;
    // Regional prompts resolved for this latent, and each area given to the other sides (ComfyUI's order).
    let mut sides: Vec<&mut Conditioning> =
        [Some(&mut positive), middle.as_mut(), empty.as_mut(), negative.as_mut()]
            .into_iter()
            .flatten()
            .collect();
    super::prompt_regions::prepare(&mut sides, &shape)?;
    // SDXL's class vectors, by each side's prompt type (ComfyUI's `encode_model_conds`).
    let mut typed: Vec<(&mut Conditioning, bool)> = [
        (Some(&mut positive), false),
        (middle.as_mut(), false),
        (empty.as_mut(), false),
        (negative.as_mut(), true),
    ]
    .into_iter()
    .filter_map(|(side, negative)| side.map(|side| (side, negative)))
    .collect();
    super::sdxl_adm::prepare(model, &mut typed, &shape, job.noise.seed())?;
    // Anima's prompts through its LLM adapter (ComfyUI's `extra_conds`).
    super::anima_text::prepare(compute, model, &mut typed)?;
    let dual =
        job.dual.zip(middle).map(|(d, middle)| DualCfg { middle: Arc::new(middle), ..d.clone() });
    let perp_neg =
        job.perp_neg.zip(empty).map(|(p, empty)| PerpNeg { empty: Arc::new(empty), ..p.clone() });
    for control in &prepared {
        control.control_net.net.weights().activate().map_err(|e| node_error(e.into()))?;
    }
    let mut denoiser = Guided {
        compute,
        model,
        shape: shape.clone(),
        positive: &positive,
        negative: negative.as_ref(),
        cfg: job.cfg,
        dual: dual.as_ref(),
        perp_neg: perp_neg.as_ref(),
        inpaint,
        kv_cache: model.reference_kv_cache.then(OnceLock::new),
        causal: None,
        motion: model.infinite_talk.as_ref().map(|talk| {
            let shape = talk.motion.shape();
            (format.process_in(talk.motion.data(), shape), shape.get(2).copied().unwrap_or(0))
        }),
        windows: model.context_windows.as_ref().map(|w| WindowRun::new(w.clone(), &sigmas)),
        pose_cache: model.pose_cache.map(|_| OnceLock::new()),
        easy_cache: None,
        lazy_cache: None,
    };
    if let Some(settings) = model.step_cache {
        refuse_step_cache(model, job.sampler.sampler)?;
        let run = Mutex::new(StepCacheRun::new(settings, &model.sampling));
        match settings.lazy {
            true => denoiser.lazy_cache = Some(run),
            false => denoiser.easy_cache = Some(run),
        }
    }
    let interrupted = AtomicBool::new(false);
    let mut last_denoised: Option<(Vec<f32>, Vec<usize>)> = None;
    let mut on_step = |step: Step<'_>| -> kiln_models::Result<()> {
        // An `ar_video` step sees one block of the video's frames.
        let mut step_shape = shape.clone();
        if let [b, c, _, h, w] = step_shape[..] {
            step_shape[2] = step.denoised.len() / (b * c * h * w).max(1);
        }
        // As ComfyUI's callback: keep this step's x̂₀ (a block's, for `ar_video`), preview it, then report
        // progress.
        last_denoised = Some((step.denoised.to_vec(), step_shape.clone()));
        if ctx.preview_method == PreviewMethod::Latent2Rgb
            && let Some(preview) = latent_preview(&format, step.denoised, &step_shape)
        {
            ctx.preview(preview);
        }
        ctx.progress((step.index + 1) as f64, step.total as f64);
        if ctx.check_interrupt().is_err() {
            interrupted.store(true, Ordering::Relaxed);
            return Err(kiln_models::Error::Invalid("interrupted".to_owned()));
        }
        Ok(())
    };
    let result = if job.sampler.sampler == Sampler::ArVideo {
        let slot = KvSlot::new();
        let run = ArVideoRun { job: &job, model, shape: &shape };
        run.sample(ArBlocks { guided: denoiser, slot: &slot }, &x, &sigmas, &mut on_step)
    } else {
        let result = sampling::sample_with(
            job.sampler,
            &model.sampling,
            &mut denoiser,
            x,
            &mut sigmas,
            job.noise.seed(),
            &mut on_step,
        );
        for cache in [&denoiser.easy_cache, &denoiser.lazy_cache].into_iter().flatten() {
            lock(cache).map_err(node_error)?.report(job.sigmas.len() - 1);
        }
        result
    };
    let x = match result {
        Ok(x) => x,
        Err(_) if interrupted.load(Ordering::Relaxed) => {
            return Err(crate::nodes::Interrupted.into());
        }
        Err(e) => return Err(node_error(e)),
    };
    let last = sigmas[sigmas.len() - 1];
    let to_vae = |(values, shape): (Vec<f32>, Vec<usize>)| -> Result<Tensor, NodeError> {
        let out = format.process_out(&values, &shape);
        Tensor::new(shape, out).map_err(|e| NodeError::new(e.to_string()))
    };
    let mut samples = to_vae((model.sampling.inverse_noise_scaling(last, &x), shape.clone()))?;
    if let Some(talk) = model.infinite_talk.as_ref().filter(|t| t.extend) {
        samples = with_leading_frames(&samples, &talk.motion, "InfiniteTalk's motion latent")?;
    }
    Ok(Sampled { samples, denoised: last_denoised.map(to_vae).transpose()? })
}

/// An `ar_video` run (`SamplerARVideo`): what [`sampling::sample_ar_video`] takes beside the model.
struct ArVideoRun<'a> {
    job: &'a Sampling<'a>,
    /// The model with its hints prepared.
    model: &'a DiffusionModel,
    /// The latent's shape.
    shape: &'a [usize],
}

impl ArVideoRun<'_> {
    /// Runs the sampler from `x` (noise-scaled) with `blocks`, after checking what it cannot take: a latent that
    /// is not a video, a noise mask, CFG other than 1 (ComfyUI's cache holds one batch, so its run fails on
    /// the batched negative).
    fn sample(
        &self,
        mut blocks: ArBlocks<'_>,
        x: &[f32],
        sigmas: &[f32],
        on_step: &mut dyn FnMut(Step<'_>) -> kiln_models::Result<()>,
    ) -> kiln_models::Result<Vec<f32>> {
        let invalid = |msg: String| Err(kiln_models::Error::Invalid(msg));
        let &[batch, channels, frames, h, w] = self.shape else {
            return invalid(format!(
                "the ar_video sampler takes a video latent [B, C, T, H, W] (EmptyARVideoLatent's, \
                 ARVideoI2V's), got {:?}",
                self.shape
            ));
        };
        if self.job.latent.noise_mask.is_some() {
            return invalid(
                "the ar_video sampler takes no noise mask: remove SetLatentNoiseMask".to_owned(),
            );
        }
        let guided = &blocks.guided;
        if guided.dual.is_some() || guided.perp_neg.is_some() || guided.cfg_reads_negative() {
            return invalid(format!(
                "the ar_video sampler runs a causal model at CFG 1 (its cache holds one prompt's keys and \
                 values), got cfg {} (or a CFGOverride to another scale): set the guider's cfg to 1",
                guided.cfg
            ));
        }
        let initial = match &self.model.ar_start {
            Some(start) => {
                let s = start.shape();
                if s.len() != 5
                    || s[0] != 1
                    || s[1] != channels
                    || s[3..] != [h, w]
                    || s[2] > frames
                {
                    return invalid(format!(
                        "ARVideoI2V's start latent is {s:?}, the latent [{batch}, {channels}, {frames}, {h}, \
                         {w}]: make the latent with the same ARVideoI2V"
                    ));
                }
                let one = self.model.latent.process_in(start.data(), s);
                Some(one.repeat(batch))
            }
            None => None,
        };
        let run = sampling::ArVideo {
            shape: [batch, channels, frames, h, w],
            frames_per_block: self.job.sampler.settings.frames_per_block,
            seed: self.job.noise.seed(),
            initial: initial.as_deref(),
        };
        sampling::sample_ar_video(&mut blocks, run, x, sigmas, on_step)
    }
}

/// The guided model as the `ar_video` sampler calls it: one block of frames at a time, the causal model reading
/// the run's cache.
struct ArBlocks<'a> {
    guided: Guided<'a>,
    slot: &'a KvSlot,
}

impl BlockDenoiser for ArBlocks<'_> {
    fn denoise_block(
        &mut self,
        x: &[f32],
        frames: usize,
        start_frame: usize,
        sigma: f32,
    ) -> kiln_models::Result<Vec<f32>> {
        self.guided.shape[2] = frames;
        self.guided.causal = Some(CausalCall { slot: self.slot, start_frame });
        self.guided.denoise(x, sigma)
    }
}

/// What a sampler node asks for.
struct SampleRequest<'a> {
    model: &'a DiffusionModel,
    positive: &'a Conditioning,
    negative: &'a Conditioning,
    latent: &'a Latent,
    seed: u64,
    steps: usize,
    cfg: f64,
    sampler: Sampler,
    scheduler: Scheduler,
    denoise: f64,
    /// `KSamplerAdvanced`: add noise (otherwise the latent is taken as already noisy).
    add_noise: bool,
    /// `KSamplerAdvanced`: the first and last step of the schedule to run.
    start_step: Option<usize>,
    last_step: Option<usize>,
    /// Ends at σ = 0 even when stopping early (`return_with_leftover_noise` off).
    force_full_denoise: bool,
}

impl<'a> SampleRequest<'a> {
    /// The inputs both samplers share, `seed` naming the seed input; the whole schedule, noise added, ending at
    /// σ = 0 (KSampler's settings, which KSamplerAdvanced's inputs change).
    fn from_inputs(inputs: &'a Inputs, seed: &str) -> Result<SampleRequest<'a>, NodeError> {
        Ok(SampleRequest {
            model: inputs.model("model")?,
            positive: inputs.conditioning("positive")?,
            negative: inputs.conditioning("negative")?,
            latent: inputs.latent("latent_image")?,
            // The seed widget spans 0..2^64 (carried as its bits); torch takes its low 32 bits anyway.
            seed: inputs.int(seed)? as u64,
            steps: count(inputs, "steps")?,
            cfg: inputs.float("cfg")?,
            sampler: sampler(inputs)?,
            scheduler: scheduler(inputs)?,
            denoise: 1.0,
            add_noise: true,
            start_step: None,
            last_step: None,
            force_full_denoise: true,
        })
    }
}

/// KSampler's run (ComfyUI's `common_ksampler`): the scheduler's sigmas for `denoise`, cut to
/// `start_step..=last_step`, noise from the seed unless disabled.
fn ksample(
    compute: &Compute,
    request: SampleRequest<'_>,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    let model = request.model;
    let mut sigmas = sampling::ksampler_sigmas(
        request.scheduler,
        request.sampler,
        &model.sampling,
        request.steps,
        request.denoise,
    );
    if let Some(last) = request.last_step
        && last + 1 < sigmas.len()
    {
        sigmas.truncate(last + 1);
        if request.force_full_denoise
            && let Some(end) = sigmas.last_mut()
        {
            *end = 0.0;
        }
    }
    if let Some(start) = request.start_step {
        if start + 1 < sigmas.len() {
            sigmas.drain(..start);
        } else {
            return fit_channels(request.latent, &model.latent);
        }
    }
    let job = Sampling {
        model,
        positive: request.positive,
        negative: Some(request.negative),
        cfg: request.cfg,
        dual: None,
        perp_neg: None,
        sampler: request.sampler.into(),
        sigmas: &sigmas,
        noise: if request.add_noise {
            Noise::Random(request.seed)
        } else {
            Noise::Disabled(request.seed)
        },
        latent: request.latent,
    };
    Ok(sample(compute, job, ctx)?.samples)
}

/// A combo input naming a sampler.
pub(super) fn sampler(inputs: &Inputs) -> Result<Sampler, NodeError> {
    let name = inputs.string("sampler_name")?;
    Sampler::from_name(name).ok_or_else(|| {
        NodeError::of_kind(ErrorKind::InvalidValue, format!("sampler `{name}` is not implemented"))
    })
}

/// A combo input naming a scheduler.
pub(super) fn scheduler(inputs: &Inputs) -> Result<Scheduler, NodeError> {
    let name = inputs.string("scheduler")?;
    Scheduler::from_name(name).ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("scheduler `{name}` is not implemented"),
        )
    })
}

/// A non-negative `INT` input as a count.
pub(super) fn count(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v).map_err(|_| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("`{name}` must not be negative, got {v}"),
        )
    })
}

/// The names of the samplers Kiln implements, in ComfyUI's order.
pub(super) fn sampler_names() -> Vec<&'static str> {
    Sampler::ALL.iter().map(|s| s.name()).collect()
}

/// The names of the schedulers Kiln implements, in ComfyUI's order.
pub(super) fn scheduler_names() -> Vec<&'static str> {
    Scheduler::ALL.iter().map(|s| s.name()).collect()
}

/// `KSampler`: denoises a latent with a model and conditioning.
pub(super) struct KSampler {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl KSampler {
    pub(super) fn new(compute: Arc<Compute>) -> KSampler {
        let spec = model_specs::ksampler(&sampler_names(), &scheduler_names());
        KSampler { spec: Arc::new(spec), compute }
    }
}

impl Node for KSampler {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let request = SampleRequest {
            denoise: inputs.float("denoise")?,
            ..SampleRequest::from_inputs(inputs, "seed")?
        };
        let input = request.latent;
        let latent = ksample(&self.compute, request, ctx)?;
        Ok(NodeResult::values([Value::Latent(sampled_latent(input, latent))]))
    }
}

/// `KSamplerAdvanced`: `KSampler` with control over noise and the steps run.
pub(super) struct KSamplerAdvanced {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl KSamplerAdvanced {
    pub(super) fn new(compute: Arc<Compute>) -> KSamplerAdvanced {
        let spec = model_specs::ksampler_advanced(&sampler_names(), &scheduler_names());
        KSamplerAdvanced { spec: Arc::new(spec), compute }
    }
}

impl Node for KSamplerAdvanced {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let request = SampleRequest {
            add_noise: inputs.string("add_noise")? != "disable",
            start_step: Some(count(inputs, "start_at_step")?),
            last_step: Some(count(inputs, "end_at_step")?),
            force_full_denoise: inputs.string("return_with_leftover_noise")? != "enable",
            ..SampleRequest::from_inputs(inputs, "noise_seed")?
        };
        let input = request.latent;
        let latent = ksample(&self.compute, request, ctx)?;
        Ok(NodeResult::values([Value::Latent(sampled_latent(input, latent))]))
    }
}
