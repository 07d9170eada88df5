//! The frontend's default Z-Image-Turbo workflow (issue #11), Qwen-Image's text-to-image template
//! (`--workflow qwen-image`, or at CFG 1 as the Lightning templates sample: `qwen-image-lightning`; issue #23), or
//! FLUX.1 dev's (`--workflow flux-dev`) or FLUX.2 Klein 4B's (`--workflow flux2-klein`; issue #22), or Wan 2.2
//! TI2V 5B's text-to-video template on a 5-frame clip (`--workflow wan22-5b`; issue #24), or Wan 2.2 A14B's
//! (`video_wan2_2_14B_t2v`: the high-noise and the low-noise expert, each a KSamplerAdvanced over half the steps,
//! `--workflow wan22-a14b`), or HuMo 17B's
//! (`video_humo`: a reference image and a second of audio through Whisper large-v3, `--workflow humo`), or Wan
//! 2.2 S2V 14B's (`video_wan2_2_14B_s2v`: a reference image and a second of audio through wav2vec2 large,
//! `--workflow s2v`), or Wan Animate 2's (`video_wan_animate2_distilled`: a reference image and a pose video, in
//! context windows with the int8 pose-branch cache, `--workflow animate2`), or Lotus depth's
//! (`image_lotus_depth_v1_1` on a flat grey picture, `--workflow lotus`), or that
//! audio encode alone (`--workflow whisper`: LoadAudio, AudioEncoderLoader, AudioEncoderEncode), or the Wan 2.2 VAE's
//! decode alone (`--workflow wan22-vae`: the 5B's empty latent through VAEDecode), run in-process through
//! the engine's [`Executor`]:
//! seconds per sampler step, seconds end to end (cold: the first prompt, loading included; warm: a second
//! prompt with another seed, the loaders and text encodes cached), per-node times, peak host RSS (per node and
//! for the process), the memory manager's device usage, and the VRAM budget it ran under. Prints JSON.
//!
//! Usage (`harness = false`; build with `cargo bench -p kiln-engine --bench zimage --no-run`):
//!
//! ```text
//! zimage --models DIR [--workflow zimage|qwen-image|qwen-image-lightning|flux-dev|flux2-klein|wan22-5b|wan22-a14b|humo|s2v|animate2|whisper|wan22-vae|lotus]
//!        [--size 1024] [--height H] [--frames N] [--steps 8]
//!        [--cpu] [--no-pinned]
//!        [--vram-fraction F] [--vram-of dit|all] [--vram-extra-gib G] [--cold] [--no-warm] [--seed S]
//!        [--out FILE] [--label TEXT] [--print-graph]
//! ```
//!
//! `DIR` is a models folder with the workflow's files (`kiln model synth` writes them; FLUX.1 has four).
//! `--size` is the width (and the height unless `--height` is given); `--frames` the length of a video
//! workflow's clip (default 5). `--print-graph` prints the first prompt's API-format graph and exits (`--models`
//! is then not needed): the graph `bench/cpu/side_by_side.py` queues to Kiln's and ComfyUI's servers alike.
//!
//! **The VRAM cap.** `--vram-fraction F` sets the memory manager's budget to `F × weights + extra`, where
//! `weights` is the tensor bytes of the DiT files (`--vram-of dit`, the default: the models the sampler steps
//! stream; both experts of Wan 2.2 A14B) or of all three files (`--vram-of all`), and `extra`
//! (`--vram-extra-gib`, default 1 GiB) is room for activations and the offload lanes' scratch. It is applied as ComfyUI's `--reserve-vram` is: the
//! arbiter's headroom becomes `capacity − budget` ([`Arbiter::set_headroom`], what `ComputeOptions.reserve`
//! sets at start), so weights that do not fit are evicted and streamed from the pinned host pool per step.
//! The budget is capped by the device's capacity (on the CPU: the simulated 2 GiB device).
//!
//! **The op profile.** With `KILN_CUDA_PROFILE=1` (a `cuda` build on a GPU), each run's report has a
//! `cuda_profile`: every kernel's and GEMM's calls, seconds and (where known) TFLOP/s, the most time first. The
//! backend then waits for each op, so the step times of such a run are not the plain ones.
//!
//! [`Executor`]: kiln_engine::exec::Executor
//! [`Arbiter::set_headroom`]: kiln_engine::kiln_compute::memory::Arbiter::set_headroom

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_engine::cache::{Cache, CachePolicy};
use kiln_engine::compute::{Compute, ComputeOptions};
use kiln_engine::exec::{Event, EventSink, Executor, Outcome, Run};
use kiln_engine::graph::{Prompt, validate};
use kiln_engine::kiln_compute::backend::cpu::work::{self, Work};
use kiln_engine::kiln_compute::memory::{FileSource, SafetensorsFile, drop_page_cache};
use kiln_engine::models::{FolderTree, ModelEnv};
use kiln_engine::nodes::builtin_registry;
use kiln_engine::roots::Roots;
use serde_json::{Value, json};

const GIB: f64 = (1u64 << 30) as f64;

/// The KSampler's node id in every graph; the second sampler of a two-expert graph (Wan 2.2 A14B).
const SAMPLERS: [&str; 2] = ["70", "78"];

/// Whether node `id` is one of the graph's samplers ([`SAMPLERS`]).
fn is_sampler(id: &str) -> bool {
    SAMPLERS.contains(&id)
}

/// The workflow measured (`--workflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workflow {
    /// The frontend's default Z-Image-Turbo graph (models.md §1.1): res_multistep, CFG 1, one DiT call a step.
    ZImage,
    /// The Qwen-Image text-to-image template (`image_qwen_image`): euler, CFG 2.5 with a negative prompt, so
    /// two DiT calls a step (batched as one when the prompts' lengths agree, else two).
    QwenImage,
    /// The same graph as the Lightning templates sample it: CFG 1, so one DiT call a step (the negative is
    /// skipped). The Lightning LoRA itself is left out: merged into the weights once before sampling, it
    /// changes no step's cost.
    QwenImageLightning,
    /// FLUX.1 dev's text-to-image template (`flux_dev_full_text_to_image`): euler, CFG 1 (the zeroed negative
    /// is skipped), guidance 3.5, one DiT call a step; CLIP-L and T5-XXL through DualCLIPLoader.
    FluxDev,
    /// FLUX.2 Klein 4B's text-to-image template (`image_flux2_klein_text_to_image`, the distilled model): euler
    /// through SamplerCustomAdvanced, CFGGuider 1 (one DiT call a step), Flux2Scheduler; Qwen3-4B through
    /// CLIPLoader type `flux2`; the FLUX.2 VAE.
    Flux2Klein,
    /// Wan 2.2 TI2V 5B's text-to-video template (`video_wan2_2_5B_ti2v`, its start image bypassed) on a
    /// `size`² clip of 5 frames (2 latent frames): uni_pc, simple, CFG 5 with the stock negative (two DiT calls
    /// a step, batched), ModelSamplingSD3 8; umT5-XXL through CLIPLoader type `wan`; the Wan 2.2 VAE.
    Wan22Ti2v,
    /// Wan 2.2 A14B's text-to-video template (`video_wan2_2_14B_t2v`, without its optional 4-step LoRAs): the
    /// high-noise expert's KSamplerAdvanced over the first half of the steps (returning the leftover noise),
    /// the low-noise expert's over the rest, euler, simple, CFG 3.5 with the stock negative (two DiT calls a
    /// step, batched), ModelSamplingSD3 8 on each; umT5-XXL; the Wan 2.1 VAE.
    Wan22A14b,
    /// HuMo 17B's template (`video_humo`, its lightx2v LoRA left out: merged once, it changes no step's cost) on
    /// a `size`² clip of 5 frames: a reference image, one second of a 440 Hz tone at 24 kHz through Whisper
    /// large-v3 (`AudioEncoderEncode` on the DiT's device), uni_pc, simple, CFG 1 (one DiT call a step, as the
    /// template samples with its step-distillation LoRA), ModelSamplingSD3 8; umT5-XXL; the Wan 2.1 VAE.
    Humo,
    /// Wan 2.2 S2V 14B's template (`video_wan2_2_14B_s2v`, its first clip) on a `size`² clip of 5 frames: a
    /// reference image, one second of the tone through wav2vec2 large, uni_pc, simple, CFG 6 (two DiT calls a
    /// step: the negative's audio is zeros, so the prompts do not batch), ModelSamplingSD3 8; umT5-XXL; the Wan
    /// 2.1 VAE.
    S2v,
    /// Wan Animate 2's distilled template (`video_wan_animate2_distilled`) on a `size`² clip of 5 frames: a
    /// reference image and a pose video of 5 frames seen by CLIP vision H, the model in the template's context
    /// windows (21 latent frames, so one window at this length) with the int8 pose-branch cache, lcm, simple,
    /// CFG 1 (one DiT call a step, the pose branch run on the first and read from the cache after),
    /// ModelSamplingSD3 5; umT5-XXL; the Wan 2.1 VAE.
    Animate2,
    /// The HuMo template's audio encode alone: a second of the tone through Whisper large-v3 (which encodes a
    /// 30-s window whatever the clip), previewed as text. No sampler: its time is `AudioEncoderEncode`'s node.
    Whisper,
    /// The Wan 2.2 TI2V template's decode alone: Wan22ImageToVideoLatent's empty latent for a `size`² clip of
    /// `--frames` frames through VAEDecode with the Wan 2.2 VAE, saved as images. No sampler: its time is
    /// `VAEDecode`'s node (the latent's values do not change the work).
    Wan22Vae,
    /// Lotus depth's template (`image_lotus_depth_v1_1`, a flat grey picture in place of its input): VAEEncode
    /// with SD's KL autoencoder, LotusConditioning, BasicGuider, the `normal` schedule with its first σ set to 999,
    /// euler without noise through SamplerCustomAdvanced (one UNet call a step), VAEDecode, ImageInvert.
    Lotus,
}

impl Workflow {
    /// The DiT, the text encoder files and the VAE under the models folder (the names `kiln model synth`
    /// writes), the DiT first, the VAE last.
    fn files(self) -> &'static [&'static str] {
        match self {
            Workflow::ZImage => &[
                "diffusion_models/z_image_turbo_bf16.safetensors",
                "text_encoders/qwen_3_4b.safetensors",
                "vae/ae.safetensors",
            ],
            Workflow::QwenImage | Workflow::QwenImageLightning => &[
                "diffusion_models/qwen_image_fp8_e4m3fn.safetensors",
                "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
                "vae/qwen_image_vae.safetensors",
            ],
            Workflow::FluxDev => &[
                "diffusion_models/flux1-dev-kontext_fp8_scaled.safetensors",
                "text_encoders/clip_l.safetensors",
                "text_encoders/t5xxl_fp8_e4m3fn_scaled.safetensors",
                "vae/ae.safetensors",
            ],
            Workflow::Flux2Klein => &[
                "diffusion_models/flux-2-klein-4b.safetensors",
                "text_encoders/qwen_3_4b.safetensors",
                "vae/flux2-vae.safetensors",
            ],
            Workflow::Wan22Ti2v => &[
                "diffusion_models/wan2.2_ti2v_5B_fp16.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                "vae/wan2.2_vae.safetensors",
            ],
            Workflow::Wan22A14b => &[
                "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                "vae/wan_2.1_vae.safetensors",
            ],
            Workflow::Humo => &[
                "diffusion_models/humo_17B_fp8_e4m3fn.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                "audio_encoders/whisper_large_v3_fp16.safetensors",
                "vae/wan_2.1_vae.safetensors",
            ],
            Workflow::S2v => &[
                "diffusion_models/wan2.2_s2v_14B_fp8_scaled.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                "audio_encoders/wav2vec2_large_english_fp16.safetensors",
                "vae/wan_2.1_vae.safetensors",
            ],
            Workflow::Animate2 => &[
                "diffusion_models/wan_animate_2_distill_int8_convrot.safetensors",
                "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
                "clip_vision/clip_vision_h.safetensors",
                "vae/wan_2.1_vae.safetensors",
            ],
            Workflow::Whisper => &["audio_encoders/whisper_large_v3_fp16.safetensors"],
            Workflow::Wan22Vae => &["vae/wan2.2_vae.safetensors"],
            Workflow::Lotus => &[
                "diffusion_models/lotus-depth-d-v1-1.safetensors",
                "vae/vae-ft-mse-840000-ema-pruned.safetensors",
            ],
        }
    }

    /// The DiT files (the diffusion models the sampler steps run; two for Wan 2.2 A14B).
    fn dits(self) -> impl Iterator<Item = &'static str> {
        self.files().iter().copied().filter(|f| f.starts_with("diffusion_models/"))
    }

    /// The graph's prompt at `size`² and `steps` steps, as the frontend sends it, its latent (node 68)
    /// `height` high and a video's `frames` long where given.
    fn prompt(
        self,
        seed: u64,
        size: u32,
        steps: u32,
        height: Option<u32>,
        frames: Option<u32>,
    ) -> Value {
        let mut graph = self.graph(seed, size, steps);
        let latent = &mut graph["68"]["inputs"];
        if let Some(height) = height {
            latent["height"] = json!(height);
        }
        if let Some(frames) = frames {
            latent["length"] = json!(frames);
        }
        graph
    }

    /// The graph at `size`² and `steps` steps.
    fn graph(self, seed: u64, size: u32, steps: u32) -> Value {
        match self {
            Workflow::ZImage => default_workflow(seed, size, steps),
            Workflow::QwenImage => qwen_image_workflow(seed, size, steps, 2.5),
            Workflow::QwenImageLightning => qwen_image_workflow(seed, size, steps, 1.0),
            Workflow::FluxDev => flux_dev_workflow(seed, size, steps),
            Workflow::Flux2Klein => flux2_klein_workflow(seed, size, steps),
            Workflow::Wan22Ti2v => wan22_ti2v_workflow(seed, size, steps),
            Workflow::Wan22A14b => wan22_a14b_workflow(seed, size, steps),
            Workflow::Humo => humo_workflow(seed, size, steps),
            Workflow::S2v => s2v_workflow(seed, size, steps),
            Workflow::Animate2 => animate2_workflow(seed, size, steps),
            Workflow::Lotus => lotus_workflow(seed, size, steps),
            Workflow::Wan22Vae => json!({
                "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
                "63": {"class_type": "VAELoader", "inputs": {"vae_name": "wan2.2_vae.safetensors"}},
                "65": {"class_type": "VAEDecode", "inputs": {"samples": ["68", 0], "vae": ["63", 0]}},
                "68": {"class_type": "Wan22ImageToVideoLatent", "inputs": {"width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1, "vae": ["63", 0]}},
            }),
            Workflow::Whisper => json!({
                "9": {"class_type": "PreviewAny", "inputs": {"source": ["74", 0]}},
                "72": {"class_type": "LoadAudio", "inputs": {"audio": HUMO_AUDIO}},
                "73": {"class_type": "AudioEncoderLoader", "inputs": {"audio_encoder_name": "whisper_large_v3_fp16.safetensors"}},
                "74": {"class_type": "AudioEncoderEncode", "inputs": {"audio_encoder": ["73", 0], "audio": ["72", 0]}},
            }),
        }
    }

    /// The sampling settings, for the report (`frames`: the clip's length of a video workflow).
    fn sampling(self, frames: u32) -> Value {
        match self {
            Workflow::ZImage => json!({
                "sampler": "res_multistep", "scheduler": "simple", "cfg": 1, "dit_calls_per_step": 1,
            }),
            Workflow::QwenImage => json!({
                "sampler": "euler", "scheduler": "simple", "cfg": 2.5, "dit_calls_per_step": 2,
            }),
            Workflow::QwenImageLightning | Workflow::FluxDev => json!({
                "sampler": "euler", "scheduler": "simple", "cfg": 1, "dit_calls_per_step": 1,
            }),
            Workflow::Flux2Klein => json!({
                "sampler": "euler", "scheduler": "Flux2Scheduler", "cfg": 1, "dit_calls_per_step": 1,
            }),
            Workflow::Wan22Ti2v => json!({
                "sampler": "uni_pc", "scheduler": "simple", "cfg": 5, "dit_calls_per_step": 2,
                "frames": frames,
            }),
            Workflow::Wan22A14b => json!({
                "sampler": "euler", "scheduler": "simple", "cfg": 3.5, "dit_calls_per_step": 2,
                "frames": frames, "experts": "high noise for the first half of the steps, low noise after",
            }),
            Workflow::Humo => json!({
                "sampler": "uni_pc", "scheduler": "simple", "cfg": 1, "dit_calls_per_step": 1,
                "frames": frames, "audio_seconds": 1,
            }),
            Workflow::S2v => json!({
                "sampler": "uni_pc", "scheduler": "simple", "cfg": 6, "dit_calls_per_step": 2,
                "frames": frames, "audio_seconds": 1,
            }),
            Workflow::Animate2 => json!({
                "sampler": "lcm", "scheduler": "simple", "cfg": 1, "dit_calls_per_step": 1,
                "frames": frames, "pose_cache": "int8", "context_windows": "21/8 static",
            }),
            Workflow::Whisper => json!({"audio_seconds": 1}),
            Workflow::Wan22Vae => json!({"frames": frames}),
            Workflow::Lotus => json!({
                "sampler": "euler", "scheduler": "normal, first sigma 999", "cfg": 1, "dit_calls_per_step": 1,
            }),
        }
    }
}

/// The command line.
struct Args {
    workflow: Workflow,
    models: PathBuf,
    size: u32,
    height: Option<u32>,
    frames: Option<u32>,
    steps: u32,
    cpu: bool,
    pinned: bool,
    vram_fraction: Option<f64>,
    vram_of_all: bool,
    vram_extra: u64,
    cold: bool,
    warm: bool,
    seed: u64,
    out: Option<PathBuf>,
    label: String,
    /// `--print-graph`: print the API-format graph the run would queue first, and nothing else.
    print_graph: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        workflow: Workflow::ZImage,
        models: PathBuf::new(),
        size: 1024,
        height: None,
        frames: None,
        steps: 8,
        cpu: false,
        pinned: true,
        vram_fraction: None,
        vram_of_all: false,
        vram_extra: 1 << 30,
        cold: false,
        warm: true,
        seed: 42,
        out: None,
        label: String::new(),
        print_graph: false,
    };
    let mut it = std::env::args().skip(1);
    let mut models = None;
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number =
            |name: &str, v: String| v.parse::<f64>().map_err(|e| format!("{name} {v}: {e}"));
        match arg.as_str() {
            "--models" => models = Some(PathBuf::from(value("--models")?)),
            "--workflow" => match value("--workflow")?.as_str() {
                "zimage" => args.workflow = Workflow::ZImage,
                "qwen-image" => args.workflow = Workflow::QwenImage,
                "qwen-image-lightning" => args.workflow = Workflow::QwenImageLightning,
                "flux-dev" => args.workflow = Workflow::FluxDev,
                "flux2-klein" => args.workflow = Workflow::Flux2Klein,
                "wan22-5b" => args.workflow = Workflow::Wan22Ti2v,
                "wan22-a14b" => args.workflow = Workflow::Wan22A14b,
                "humo" => args.workflow = Workflow::Humo,
                "s2v" => args.workflow = Workflow::S2v,
                "animate2" => args.workflow = Workflow::Animate2,
                "whisper" => args.workflow = Workflow::Whisper,
                "wan22-vae" => args.workflow = Workflow::Wan22Vae,
                "lotus" => args.workflow = Workflow::Lotus,
                other => {
                    return Err(format!(
                        "--workflow {other}: expected zimage, qwen-image, qwen-image-lightning, flux-dev, \
                         flux2-klein, wan22-5b, wan22-a14b, humo, s2v, animate2, whisper or lotus"
                    ));
                }
            },
            "--size" => args.size = number("--size", value("--size")?)? as u32,
            "--height" => args.height = Some(number("--height", value("--height")?)? as u32),
            "--frames" => args.frames = Some(number("--frames", value("--frames")?)? as u32),
            "--steps" => args.steps = number("--steps", value("--steps")?)? as u32,
            "--cpu" => args.cpu = true,
            "--no-pinned" => args.pinned = false,
            "--vram-fraction" => {
                args.vram_fraction = Some(number("--vram-fraction", value("--vram-fraction")?)?)
            }
            "--vram-of" => match value("--vram-of")?.as_str() {
                "dit" => args.vram_of_all = false,
                "all" => args.vram_of_all = true,
                other => return Err(format!("--vram-of {other}: expected dit or all")),
            },
            "--vram-extra-gib" => {
                args.vram_extra =
                    (number("--vram-extra-gib", value("--vram-extra-gib")?)? * GIB) as u64
            }
            "--cold" => args.cold = true,
            "--no-warm" => args.warm = false,
            "--seed" => args.seed = number("--seed", value("--seed")?)? as u64,
            "--out" => args.out = Some(PathBuf::from(value("--out")?)),
            "--label" => args.label = value("--label")?,
            "--print-graph" => args.print_graph = true,
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !args.print_graph {
        args.models = models.ok_or("--models DIR is required")?;
    }
    if args.frames.is_some() && args.workflow.sampling(WAN_FRAMES).get("frames").is_none() {
        return Err("--frames is for the video workflows".into());
    }
    Ok(args)
}

/// The default graph's prompt as the frontend sends it (models.md §1.1), at `size`² and `steps` steps.
fn default_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "lumina2", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "z_image_turbo_bf16.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "anime RPG game style, cute anime girl", "clip": ["62", 0]}},
        "68": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "69": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3, "model": ["66", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": "res_multistep", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": "low quality, bad anatomy", "clip": ["62", 0]}},
    })
}

/// Qwen-Image's text-to-image template (`image_qwen_image`) at `size`², `steps` steps and `cfg`, its nodes
/// under the default graph's ids (loaders 66, 62, 63; the sampler 70).
fn qwen_image_workflow(seed: u64, size: u32, steps: u32, cfg: f64) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "type": "qwen_image", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "qwen_image_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk, oil painting", "clip": ["62", 0]}},
        "68": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "69": {"class_type": "ModelSamplingAuraFlow", "inputs": {"shift": 3.1, "model": ["66", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": cfg, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["62", 0]}},
    })
}

/// FLUX.1 dev's text-to-image template at `size`² and `steps` steps (the same node ids as the other graphs
/// for the loaders and the sampler), on the fp8 scaled files the Kontext template names.
fn flux_dev_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "DualCLIPLoader", "inputs": {"clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp8_e4m3fn_scaled.safetensors", "type": "flux", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "ae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux1-dev-kontext_fp8_scaled.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk, oil painting", "clip": ["62", 0]}},
        "68": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": "euler", "scheduler": "simple", "denoise": 1, "model": ["66", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["67", 0]}},
    })
}

/// FLUX.2 Klein 4B's text-to-image template at `size`² and `steps` steps (the loaders' and the sampler's node ids
/// as in the other graphs), on the distilled model: CFGGuider 1 with the zeroed negative.
fn flux2_klein_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "qwen_3_4b.safetensors", "type": "flux2", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "flux2-vae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "flux-2-klein-4b.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk, oil painting", "clip": ["62", 0]}},
        "68": {"class_type": "EmptyFlux2LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "69": {"class_type": "Flux2Scheduler", "inputs": {"steps": steps, "width": size, "height": size}},
        "71": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["67", 0]}},
        "72": {"class_type": "CFGGuider", "inputs": {"model": ["66", 0], "positive": ["67", 0], "negative": ["71", 0], "cfg": 1}},
        "73": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "74": {"class_type": "RandomNoise", "inputs": {"noise_seed": seed}},
        "70": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["74", 0], "guider": ["72", 0], "sampler": ["73", 0], "sigmas": ["69", 0], "latent_image": ["68", 0]}},
    })
}

/// Lotus depth's template graph on a `size`² flat grey picture (node 68, so `--height` reaches it) at `steps`
/// steps; the sampler is node 70 as in the other graphs. The graph has no seed: the grey's shade follows `seed`,
/// so a second prompt with another seed runs again instead of coming from the cache.
fn lotus_workflow(seed: u64, size: u32, steps: u32) -> Value {
    let color = 0x80_8080 + seed % 16;
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["22", 0]}},
        "10": {"class_type": "UNETLoader", "inputs": {"unet_name": "lotus-depth-d-v1-1.safetensors", "weight_dtype": "default"}},
        "14": {"class_type": "VAELoader", "inputs": {"vae_name": "vae-ft-mse-840000-ema-pruned.safetensors"}},
        "68": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": 1, "color": color}},
        "23": {"class_type": "VAEEncode", "inputs": {"pixels": ["68", 0], "vae": ["14", 0]}},
        "69": {"class_type": "LotusConditioning", "inputs": {}},
        "19": {"class_type": "BasicGuider", "inputs": {"model": ["10", 0], "conditioning": ["69", 0]}},
        "20": {"class_type": "BasicScheduler", "inputs": {"model": ["10", 0], "scheduler": "normal", "steps": steps, "denoise": 1}},
        "28": {"class_type": "SetFirstSigma", "inputs": {"sigmas": ["20", 0], "sigma": 999.000_000_000_000_2}},
        "21": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "18": {"class_type": "DisableNoise", "inputs": {}},
        "70": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["18", 0], "guider": ["19", 0], "sampler": ["21", 0], "sigmas": ["28", 0], "latent_image": ["23", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["14", 0]}},
        "22": {"class_type": "ImageInvert", "inputs": {"image": ["8", 0]}},
    })
}

/// Frames of a video workflow's clip unless `--frames` says otherwise: 5, two latent frames.
const WAN_FRAMES: u32 = 5;

/// Wan's stock negative prompt, as the templates carry it.
const WAN_NEGATIVE: &str = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走";

/// Wan 2.2 TI2V 5B's text-to-video template (its start image bypassed) on a `size`² clip of [`WAN_FRAMES`]
/// frames at `steps` steps, the loaders' and the sampler's node ids as in the other graphs; the frames are saved
/// as images.
fn wan22_ti2v_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "wan2.2_vae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_ti2v_5B_fp16.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox running through fresh snow, tracking shot", "clip": ["62", 0]}},
        "68": {"class_type": "Wan22ImageToVideoLatent", "inputs": {"width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1, "vae": ["63", 0]}},
        "69": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8, "model": ["66", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 5, "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": WAN_NEGATIVE, "clip": ["62", 0]}},
    })
}

/// Wan 2.2 A14B's text-to-video template (see [`Workflow::Wan22A14b`]) on a `size`² clip of [`WAN_FRAMES`]
/// frames at `steps` steps: the high-noise expert's sampler is node 70, the low-noise one's 78.
fn wan22_a14b_workflow(seed: u64, size: u32, steps: u32) -> Value {
    let split = steps / 2;
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["78", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a fox running through fresh snow, tracking shot", "clip": ["62", 0]}},
        "68": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1}},
        "69": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8, "model": ["66", 0]}},
        "70": {"class_type": "KSamplerAdvanced", "inputs": {"add_noise": "enable", "noise_seed": seed, "steps": steps, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple", "start_at_step": 0, "end_at_step": split, "return_with_leftover_noise": "enable", "model": ["69", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["68", 0]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": WAN_NEGATIVE, "clip": ["62", 0]}},
        "76": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}},
        "77": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8, "model": ["76", 0]}},
        "78": {"class_type": "KSamplerAdvanced", "inputs": {"add_noise": "disable", "noise_seed": 0, "steps": steps, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple", "start_at_step": split, "end_at_step": 10000, "return_with_leftover_noise": "disable", "model": ["77", 0], "positive": ["67", 0], "negative": ["71", 0], "latent_image": ["70", 0]}},
    })
}

/// The input audio of the HuMo graph (written into the input folder before the runs).
const HUMO_AUDIO: &str = "humo_tone.wav";

/// `video_humo`'s graph (see [`Workflow::Humo`]).
fn humo_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["70", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "humo_17B_fp8_e4m3fn.safetensors", "weight_dtype": "default"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "a young boy talking to the camera in an alien desert", "clip": ["62", 0]}},
        "68": {"class_type": "WanHuMoImageToVideo", "inputs": {"positive": ["67", 0], "negative": ["71", 0], "vae": ["63", 0], "width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1, "audio_encoder_output": ["74", 0], "ref_image": ["75", 0]}},
        "69": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 8, "model": ["66", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["68", 0], "negative": ["68", 1], "latent_image": ["68", 2]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": WAN_NEGATIVE, "clip": ["62", 0]}},
        "72": {"class_type": "LoadAudio", "inputs": {"audio": HUMO_AUDIO}},
        "73": {"class_type": "AudioEncoderLoader", "inputs": {"audio_encoder_name": "whisper_large_v3_fp16.safetensors"}},
        "74": {"class_type": "AudioEncoderEncode", "inputs": {"audio_encoder": ["73", 0], "audio": ["72", 0]}},
        "75": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": 1, "color": 0x8040c0}},
    })
}

/// `video_wan2_2_14B_s2v`'s first clip (see [`Workflow::S2v`]).
fn s2v_workflow(seed: u64, size: u32, steps: u32) -> Value {
    let mut graph = humo_workflow(seed, size, steps);
    graph["66"]["inputs"]["unet_name"] = json!("wan2.2_s2v_14B_fp8_scaled.safetensors");
    graph["73"]["inputs"]["audio_encoder_name"] = json!("wav2vec2_large_english_fp16.safetensors");
    graph["68"] = json!({"class_type": "WanSoundImageToVideo", "inputs": {"positive": ["67", 0], "negative": ["71", 0], "vae": ["63", 0], "width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1, "audio_encoder_output": ["74", 0], "ref_image": ["75", 0]}});
    graph["70"]["inputs"]["cfg"] = json!(6);
    graph
}

/// `video_wan_animate2_distilled`'s motion transfer (see [`Workflow::Animate2`]).
fn animate2_workflow(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["65", 0]}},
        "62": {"class_type": "CLIPLoader", "inputs": {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}},
        "63": {"class_type": "VAELoader", "inputs": {"vae_name": "wan_2.1_vae.safetensors"}},
        "64": {"class_type": "TrimVideoLatent", "inputs": {"samples": ["70", 0], "trim_amount": ["68", 3]}},
        "65": {"class_type": "VAEDecode", "inputs": {"samples": ["64", 0], "vae": ["63", 0]}},
        "66": {"class_type": "UNETLoader", "inputs": {"unet_name": "wan_animate_2_distill_int8_convrot.safetensors", "weight_dtype": "default"}},
        "76": {"class_type": "ContextWindowsManual", "inputs": {"model": ["66", 0], "context_length": 21, "context_overlap": 8, "context_schedule": "standard_static", "context_stride": 1, "closed_loop": false, "fuse_method": "pyramid", "dim": 2, "freenoise": true, "cond_retain_index_list": "0", "split_conds_to_windows": false, "latent_retain_index_list": "", "causal_window_fix": true}},
        "77": {"class_type": "WanAnimate2Cache", "inputs": {"model": ["76", 0], "device": "gpu", "dtype": "int8"}},
        "67": {"class_type": "CLIPTextEncode", "inputs": {"text": "Character appearance description: a designer toy figure of a street dancer. Background description: a rainy neon-lit street at night.", "clip": ["62", 0]}},
        "78": {"class_type": "CLIPTextEncode", "inputs": {"text": "a person doing energetic street dance", "clip": ["62", 0]}},
        "68": {"class_type": "WanAnimate2ToVideo", "inputs": {"positive": ["67", 0], "negative": ["71", 0], "vae": ["63", 0], "width": size, "height": size, "length": WAN_FRAMES, "batch_size": 1, "reference_image": ["75", 0], "pose_video": ["79", 0], "clip_vision_output": ["81", 0], "positive_pose": ["78", 0], "clip_vision_output_pose": ["82", 0], "video_frame_offset": 0, "pose_strength": 1, "pose_start_percent": 0, "pose_end_percent": 1, "reference_image_strength": 1}},
        "69": {"class_type": "ModelSamplingSD3", "inputs": {"shift": 5, "model": ["77", 0]}},
        "70": {"class_type": "KSampler", "inputs": {"seed": seed, "steps": steps, "cfg": 1, "sampler_name": "lcm", "scheduler": "simple", "denoise": 1, "model": ["69", 0], "positive": ["68", 0], "negative": ["68", 1], "latent_image": ["68", 2]}},
        "71": {"class_type": "CLIPTextEncode", "inputs": {"text": WAN_NEGATIVE, "clip": ["62", 0]}},
        "75": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": 1, "color": 0x8040c0}},
        "79": {"class_type": "EmptyImage", "inputs": {"width": size, "height": size, "batch_size": WAN_FRAMES, "color": 0x40c080}},
        "80": {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": "clip_vision_h.safetensors"}},
        "81": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["80", 0], "image": ["75", 0], "crop": "none"}},
        "82": {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["80", 0], "image": ["83", 0], "crop": "none"}},
        "83": {"class_type": "ImageFromBatch", "inputs": {"image": ["79", 0], "batch_index": 0, "length": 1}},
    })
}

/// A mono 16-bit PCM WAV of one second of a 440 Hz tone at 24 kHz.
fn tone_wav() -> Vec<u8> {
    let rate = 24_000u32;
    let data: Vec<u8> = (0..rate)
        .flat_map(|i| {
            let v = (8000.0
                * (2.0 * std::f64::consts::PI * 440.0 * f64::from(i) / f64::from(rate)).sin())
                as i16;
            v.to_le_bytes()
        })
        .collect();
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    for field in
        [16u32.to_le_bytes().to_vec(), 1u16.to_le_bytes().to_vec(), 1u16.to_le_bytes().to_vec()]
    {
        out.extend_from_slice(&field);
    }
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// The file a loader node loads, for the "RSS while loading" check (the same ids in every graph; FLUX.1's
/// DualCLIPLoader loads two files, the first named).
fn loader_file(workflow: Workflow, node: &str) -> Option<&'static str> {
    let files = workflow.files();
    let first = |prefix: &str| files.iter().copied().find(|f| f.starts_with(prefix));
    match node {
        "66" => workflow.dits().next(),
        "76" => workflow.dits().nth(1),
        "62" => first("text_encoders/"),
        "63" => files.last().copied(),
        "73" => files.iter().copied().find(|f| f.starts_with("audio_encoders/")),
        _ => None,
    }
}

/// A `/proc/self/status` field in bytes (`VmRSS`, `VmHWM`), 0 where there is none (not Linux).
fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resets the kernel's peak-RSS mark (`VmHWM`) to the current RSS; `false` where the kernel refuses.
fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// RSS less the pages of mapped files (`RssAnon` + `RssShmem`): what the process holds of its own. The CPU
/// backend reads weights through memory maps of their files, whose pages count in RSS while mapped. They stay
/// the page cache's clean pages, which the kernel can drop under pressure (unmapping them first).
fn anon_rss_bytes() -> u64 {
    proc_status_bytes("RssAnon") + proc_status_bytes("RssShmem")
}

/// Samples RSS every 5 ms on a thread, keeping the peak since the last [`RssProbe::take`], with and without
/// the pages of mapped files.
struct RssProbe {
    peak: Arc<AtomicU64>,
    anon_peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssProbe {
    fn start() -> RssProbe {
        let peak = Arc::new(AtomicU64::new(0));
        let anon_peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, a, s) = (peak.clone(), anon_peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(proc_status_bytes("VmRSS"), Ordering::Relaxed);
                a.fetch_max(anon_rss_bytes(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        RssProbe { peak, anon_peak, stop, thread: Some(thread) }
    }

    /// The peaks since the last call, with and without mapped files' pages (the first also the kernel's mark,
    /// reset each time where it can be), and restarts.
    fn take(&self) -> (u64, u64) {
        let sampled = self.peak.swap(proc_status_bytes("VmRSS"), Ordering::Relaxed);
        let anon = self.anon_peak.swap(anon_rss_bytes(), Ordering::Relaxed).max(anon_rss_bytes());
        let hwm = proc_status_bytes("VmHWM");
        reset_hwm();
        (sampled.max(hwm), anon)
    }
}

impl Drop for RssProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One node's run.
struct NodeRun {
    id: String,
    start_s: f64,
    seconds: f64,
    rss_before: u64,
    peak_rss: u64,
    /// The peak of RSS less mapped files' pages ([`anon_rss_bytes`]).
    peak_anon_rss: u64,
    usage_after: u64,
}

/// What a sink saw during one prompt.
#[derive(Default)]
struct Seen {
    current: Option<(String, Instant, f64, u64)>,
    nodes: Vec<NodeRun>,
    /// Seconds of each sampler step: the first from the node's start, then between `progress` events.
    steps: Vec<f64>,
    last_step: Option<Instant>,
    /// The CPU backend's work in each sampler step (one DiT call each), and its count at the last step.
    step_work: Vec<Work>,
    last_work: Work,
    peak_usage: u64,
    peak_driver_used: u64,
    /// The manager's resident weight bytes at each sampler step.
    resident_at_steps: Vec<u64>,
    error: Option<String>,
}

/// Times nodes and steps and polls the memory manager (on the executor's thread, so the device's context is
/// current for the driver's free-memory query).
struct Probe {
    t0: Instant,
    compute: Arc<Compute>,
    rss: RssProbe,
    seen: Mutex<Seen>,
}

impl Probe {
    fn poll_device(&self, seen: &mut Seen) {
        let stats = self.compute.manager().stats();
        seen.peak_usage = seen.peak_usage.max(stats.usage);
        let report = self.compute.report();
        if report.kind != "cpu" {
            seen.peak_driver_used = seen.peak_driver_used.max(report.total - report.free);
        }
    }

    fn finish_node(&self, seen: &mut Seen) {
        if let Some((id, start, start_s, rss_before)) = seen.current.take() {
            let usage_after = self.compute.manager().stats().usage;
            let (peak_rss, peak_anon_rss) = self.rss.take();
            seen.nodes.push(NodeRun {
                id,
                start_s,
                seconds: start.elapsed().as_secs_f64(),
                rss_before,
                peak_rss,
                peak_anon_rss,
                usage_after,
            });
        }
    }
}

impl EventSink for Probe {
    fn emit(&self, _: &str, event: Event) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Executing { node } => {
                self.finish_node(&mut seen);
                let rss_before = proc_status_bytes("VmRSS");
                self.rss.take();
                let now = Instant::now();
                if is_sampler(&node.0) {
                    seen.last_step = Some(now);
                    seen.last_work = work::work();
                }
                seen.current =
                    Some((node.0.clone(), now, (now - self.t0).as_secs_f64(), rss_before));
                self.poll_device(&mut seen);
            }
            Event::Progress { node, .. } => {
                if is_sampler(&node.0)
                    && let Some(last) = seen.last_step
                {
                    let now = Instant::now();
                    seen.steps.push((now - last).as_secs_f64());
                    // On stderr as it happens, so a run cut short by a timeout still tells its steps.
                    eprintln!(
                        "step {} of node {}: {:.3} s",
                        seen.steps.len(),
                        node.0,
                        (now - last).as_secs_f64()
                    );
                    seen.last_step = Some(now);
                    let done = work::work();
                    let step = done - seen.last_work;
                    seen.step_work.push(step);
                    seen.last_work = done;
                    let resident = self.compute.manager().stats().resident_weights;
                    seen.resident_at_steps.push(resident);
                }
                self.poll_device(&mut seen);
            }
            Event::NodeFinished { .. } => {
                self.poll_device(&mut seen);
                self.finish_node(&mut seen);
            }
            Event::ExecutionError(failure) => {
                seen.error = Some(format!("node {}: {}", failure.node.0, failure.message));
            }
            _ => {}
        }
    }
}

/// Tensor bytes of a safetensors file (0 when it cannot be read).
fn tensor_bytes(path: &Path) -> u64 {
    SafetensorsFile::open(path).map(|f| f.tensors().map(|(_, t)| t.len).sum()).unwrap_or(0)
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// The prompt of `seed` run once: the JSON entry of the run.
fn run_prompt(
    executor: &mut Executor,
    registry: &kiln_engine::nodes::Registry,
    compute: &Arc<Compute>,
    args: &Args,
    seed: u64,
    label: &str,
    file_bytes: &BTreeMap<&str, u64>,
) -> Result<Value, String> {
    let json = args.workflow.prompt(seed, args.size, args.steps, args.height, args.frames);
    let prompt = Prompt::from_json(&json).map_err(|e| format!("{e:?}"))?;
    let validated =
        validate(&prompt, registry, None).map_err(|e| format!("the prompt is refused: {e:?}"))?;
    let probe = Arc::new(Probe {
        t0: Instant::now(),
        compute: compute.clone(),
        rss: RssProbe::start(),
        seen: Mutex::new(Seen::default()),
    });
    let rss_at_start = proc_status_bytes("VmRSS");
    let run = Run {
        prompt_id: label,
        prompt: &validated,
        prompt_json: Arc::new(json.clone()),
        extra_pnginfo: Arc::new(Value::Null),
        preview_method: kiln_engine::nodes::PreviewMethod::None,
        scope: None,
    };
    let t = Instant::now();
    let summary = executor.run(&run, probe.clone());
    let total_s = t.elapsed().as_secs_f64();
    let mut seen = probe.seen.lock().unwrap_or_else(|p| p.into_inner());
    probe.finish_node(&mut seen);
    // A failed run still reports what it measured (the steps before a failing decode, say).
    let error = match &summary.outcome {
        Outcome::Failed(failure) => {
            Some(format!("node {} failed: {}", failure.node.0, failure.message))
        }
        _ => seen.error.clone(),
    };
    let class = |id: &str| json[id]["class_type"].as_str().unwrap_or("?").to_owned();
    let nodes: Vec<Value> = seen
        .nodes
        .iter()
        .map(|n| {
            json!({
                "id": n.id, "class": class(&n.id), "start_s": n.start_s, "seconds": n.seconds,
                "rss_before_bytes": n.rss_before, "peak_rss_bytes": n.peak_rss,
                "peak_anon_rss_bytes": n.peak_anon_rss, "manager_usage_after_bytes": n.usage_after,
            })
        })
        .collect();
    // Loading: each loader's peak RSS against its file (the goal: under the file's size + 10 %).
    let loads: Vec<Value> = seen
        .nodes
        .iter()
        .filter_map(|n| {
            let file = loader_file(args.workflow, &n.id)?;
            let bytes = *file_bytes.get(file)?;
            let growth = n.peak_rss.saturating_sub(n.rss_before);
            Some(json!({
                "node": n.id, "file": file, "file_bytes": bytes, "rss_before_bytes": n.rss_before,
                "peak_rss_bytes": n.peak_rss, "growth_bytes": growth,
                "growth_over_file": growth as f64 / bytes.max(1) as f64,
                "peak_over_file": n.peak_rss as f64 / bytes.max(1) as f64,
            }))
        })
        .collect();
    let loading_peak = seen
        .nodes
        .iter()
        .filter(|n| loader_file(args.workflow, &n.id).is_some())
        .map(|n| n.peak_rss)
        .max();
    let samplers: Vec<&NodeRun> = seen.nodes.iter().filter(|n| is_sampler(&n.id)).collect();
    let peak_rss = seen.nodes.iter().map(|n| n.peak_rss).max().unwrap_or(0);
    let peak_anon_rss = seen.nodes.iter().map(|n| n.peak_anon_rss).max().unwrap_or(0);
    let resident_min = seen.resident_at_steps.iter().min().copied();
    Ok(json!({
        "label": label,
        "seed": seed,
        "error": error,
        "seconds": total_s,
        "executed": summary.executed.iter().map(|n| n.0.clone()).collect::<Vec<_>>(),
        "cached": summary.cached.iter().map(|n| n.0.clone()).collect::<Vec<_>>(),
        "step_seconds": seen.steps,
        "step_seconds_median": median(&seen.steps),
        // The first step includes the sampler's setup (patches, noise) and, when weights are not resident
        // yet, their first copy; the steady state is the median of the rest.
        "step_seconds_median_after_first": median(seen.steps.get(1..).unwrap_or(&[])),
        // The CPU backend's products in each step (zero on a GPU).
        "step_flops": seen.step_work.iter().map(|w| w.flops).collect::<Vec<_>>(),
        "step_weight_bytes": seen.step_work.iter().map(|w| w.weight_bytes).collect::<Vec<_>>(),
        "sampler_seconds": (!samplers.is_empty()).then(|| samplers.iter().map(|n| n.seconds).sum::<f64>()),
        "nodes": nodes,
        "loads": loads,
        "loading_peak_rss_bytes": loading_peak,
        "rss_at_start_bytes": rss_at_start,
        "peak_rss_bytes": peak_rss,
        // The same without the pages of mapped weight files (the CPU reads weights through memory maps).
        "peak_anon_rss_bytes": peak_anon_rss,
        "manager_peak_usage_bytes": seen.peak_usage,
        "driver_peak_used_bytes": (seen.peak_driver_used > 0).then_some(seen.peak_driver_used),
        "resident_weights_at_steps_bytes": seen.resident_at_steps,
        "resident_weights_min_bytes": resident_min,
    }))
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let ram = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024);
    json!({
        "cpu": cpu,
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "ram_bytes": ram,
        "kernel_peak_rss_reset": reset_hwm(),
    })
}

fn bench(args: &Args) -> Result<Value, String> {
    let file_bytes: BTreeMap<&str, u64> =
        args.workflow.files().iter().map(|&f| (f, tensor_bytes(&args.models.join(f)))).collect();
    if let Some((missing, _)) = file_bytes.iter().find(|(_, b)| **b == 0) {
        return Err(format!("{} is missing or unreadable", args.models.join(missing).display()));
    }
    let all_bytes: u64 = file_bytes.values().sum();
    let dit_bytes: u64 = args.workflow.dits().map(|f| file_bytes[f]).sum();
    let first_dit = args.workflow.dits().next().unwrap_or_default();
    let dtype = SafetensorsFile::open(args.models.join(first_dit))
        .ok()
        .and_then(|f| f.tensors().map(|(_, t)| t.dtype.to_string()).max_by_key(|d| d.clone()));

    let compute = Arc::new(Compute::start(ComputeOptions {
        force_cpu: args.cpu,
        pinned_memory: args.pinned,
        ..Default::default()
    }));
    let arbiter = compute.manager().arbiter().clone();
    let capacity = arbiter.capacity();
    let weights = if args.vram_of_all { all_bytes } else { dit_bytes };
    if let Some(fraction) = args.vram_fraction {
        let budget = ((fraction * weights as f64) as u64 + args.vram_extra).min(capacity);
        arbiter.set_headroom(capacity - budget);
    }
    let stats = compute.manager().stats();
    let report = compute.report();
    let scratch = std::env::temp_dir().join(format!("kiln-bench-zimage-{}", std::process::id()));
    let roots = Roots {
        input: scratch.join("input"),
        output: scratch.join("output"),
        temp: scratch.join("temp"),
    };
    for dir in [&roots.input, &roots.output, &roots.temp] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    if matches!(args.workflow, Workflow::Humo | Workflow::S2v | Workflow::Whisper) {
        let wav = roots.input.join(HUMO_AUDIO);
        std::fs::write(&wav, tone_wav()).map_err(|e| format!("{}: {e}", wav.display()))?;
    }
    let env = ModelEnv { files: Arc::new(FolderTree::new(&args.models)), compute: compute.clone() };
    let registry = Arc::new(builtin_registry(&roots, env));
    let mut executor = Executor::new(registry.clone(), Cache::new(CachePolicy::Classic), roots);

    if args.cold {
        for file in file_bytes.keys() {
            drop_page_cache(args.models.join(file)).map_err(|e| e.to_string())?;
        }
    }
    let mut runs = Vec::new();
    let cold_label = if args.cold { "cold" } else { "first" };
    runs.push(run_prompt(
        &mut executor,
        &registry,
        &compute,
        args,
        args.seed,
        cold_label,
        &file_bytes,
    )?);
    runs[0]["cuda_profile"] = cuda_profile();
    eprintln!("{}", json!({"run": runs[0]}));
    let failed = runs[0]["error"].as_str().map(str::to_owned);
    if args.warm && failed.is_none() {
        runs.push(run_prompt(
            &mut executor,
            &registry,
            &compute,
            args,
            args.seed + 1,
            "warm",
            &file_bytes,
        )?);
        runs[1]["cuda_profile"] = cuda_profile();
    }
    let end = compute.manager().stats();
    let _ = std::fs::remove_dir_all(&scratch);
    let roofline = if report.kind == "cpu" {
        roofline(&runs, &args.models.join(args.workflow.dits().next().unwrap_or_default()))?
    } else {
        Value::Null
    };
    // The kernel's mark is reset per node, so the process's peak is the largest node peak.
    let process_peak = runs
        .iter()
        .filter_map(|r| r["peak_rss_bytes"].as_u64())
        .chain([proc_status_bytes("VmHWM")])
        .max();
    let process_peak_anon = runs.iter().filter_map(|r| r["peak_anon_rss_bytes"].as_u64()).max();
    Ok(json!({
        "error": failed,
        "bench": match args.workflow {
            Workflow::ZImage => "zimage-default-workflow",
            Workflow::QwenImage => "qwen-image-text-to-image",
            Workflow::QwenImageLightning => "qwen-image-lightning",
            Workflow::FluxDev => "flux-dev-text-to-image",
            Workflow::Flux2Klein => "flux2-klein-text-to-image",
            Workflow::Wan22Ti2v => "wan22-ti2v-5b-text-to-video",
            Workflow::Wan22A14b => "wan22-a14b-text-to-video",
            Workflow::Humo => "humo-17b-audio-to-video",
            Workflow::S2v => "wan22-s2v-14b-audio-to-video",
            Workflow::Animate2 => "wan-animate2-motion-transfer",
            Workflow::Whisper => "whisper-large-v3-audio-encode",
            Workflow::Wan22Vae => "wan22-vae-decode",
            Workflow::Lotus => "lotus-depth-image-to-depth",
        },
        "label": args.label,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        "machine": machine(),
        "device": {"kind": report.kind, "name": report.name, "total_bytes": report.total},
        "workflow": {
            "size": args.size,
            "height": args.height.unwrap_or(args.size),
            "steps": args.steps,
            "sampling": args.workflow.sampling(args.frames.unwrap_or(WAN_FRAMES)),
        },
        "files": {
            "models_dir": args.models.display().to_string(),
            "dit_dtype": dtype,
            "tensor_bytes": file_bytes,
            "all_bytes": all_bytes,
        },
        "vram": {
            "fraction": args.vram_fraction,
            "of": if args.vram_of_all { "all" } else { "dit" },
            "weights_bytes": weights,
            "extra_bytes": args.vram_fraction.map(|_| args.vram_extra),
            "capacity_bytes": capacity,
            "headroom_bytes": arbiter.headroom(),
            "budget_bytes": stats.budget,
            "pinned_memory": args.pinned,
        },
        "runs": runs,
        "roofline": roofline,
        "process_peak_rss_bytes": process_peak,
        "process_peak_anon_rss_bytes": process_peak_anon,
        "manager_at_end": {
            "usage_bytes": end.usage, "resident_weights_bytes": end.resident_weights,
            "host_bytes": end.host_bytes, "registered_bytes": end.registered_bytes,
            "pageable_copies": end.pageable_copies, "models": end.models,
        },
    }))
}

/// The CUDA ops' times since the last call, the most time first (`KILN_CUDA_PROFILE=1`; null when off).
fn cuda_profile() -> Value {
    #[cfg(feature = "cuda")]
    {
        use kiln_engine::kiln_compute::backend::cuda::profile;
        if profile::enabled() {
            let ops: Vec<Value> = profile::take()
                .into_iter()
                .map(|op| {
                    let tflops = (op.flops > 0.0).then(|| op.flops / op.seconds / 1e12);
                    json!({"name": op.name, "calls": op.calls, "seconds": op.seconds, "tflops": tflops})
                })
                .collect();
            return Value::Array(ops);
        }
    }
    Value::Null
}

/// The CPU's bound for a DiT call, measured now: its f32 FMA peak on every thread and the rate at which the
/// threads read the DiT file from the page cache (what reading weights in place costs). A step's bound is
/// the larger of its products' operations over the peak and its weight bytes over the read rate; the ratio
/// is the median step's seconds over it (the goal is at most 2).
fn roofline(runs: &[Value], dit: &Path) -> Result<Value, String> {
    let peak = work::peak_f32_flops(std::time::Duration::from_secs(1))
        .ok_or("the roofline needs AVX-512 to measure the FMA peak")?;
    let read_rate = page_cache_read_rate(dit)?;
    let last = runs.last().ok_or("no run")?;
    let median_of = |key: &str| -> Option<f64> {
        let v: Vec<f64> = last[key].as_array()?.iter().filter_map(Value::as_f64).collect();
        median(&v)
    };
    let flops = median_of("step_flops").unwrap_or(0.0);
    let bytes = median_of("step_weight_bytes").unwrap_or(0.0);
    let step_s = last["step_seconds_median"].as_f64().unwrap_or(f64::NAN);
    let (compute_s, read_s) = (flops / peak, bytes / read_rate);
    let bound_s = compute_s.max(read_s);
    eprintln!(
        "zimage: {} sampler step {step_s:.2} s; bound {bound_s:.2} s ({:.2} TFLOP at {:.0} GFLOP/s f32 = {compute_s:.2} s, \
         {:.2} GB at {:.1} GB/s = {read_s:.2} s): {:.2}x the bound",
        last["label"].as_str().unwrap_or("?"),
        flops / 1e12,
        peak / 1e9,
        bytes / 1e9,
        read_rate / 1e9,
        step_s / bound_s,
    );
    Ok(json!({
        "run": last["label"],
        "peak_f32_flops_per_s": peak,
        "page_cache_read_bytes_per_s": read_rate,
        "step_flops": flops,
        "step_weight_bytes": bytes,
        "compute_bound_s": compute_s,
        "read_bound_s": read_s,
        "bound_s": bound_s,
        "step_s": step_s,
        "step_over_bound": step_s / bound_s,
    }))
}

/// Bytes per second at which one thread per core reads `path` (already in the page cache after the runs)
/// with positioned reads of 1 MiB, each into its own buffer. The CPU's products read weights through a
/// memory map of the file instead, which skips this copy, so the bound this rate gives is a generous one.
fn page_cache_read_rate(path: &Path) -> Result<f64, String> {
    const CHUNK: u64 = 1 << 20;
    let file = FileSource::open(path).map_err(|e| e.to_string())?;
    let size = file.size().map_err(|e| e.to_string())?;
    let t = Instant::now();
    let chunks: Vec<u64> = (0..size / CHUNK).collect();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (file, chunks) = (&file, &chunks);
                scope.spawn(move || {
                    let mut buf = vec![0u8; CHUNK as usize];
                    for c in chunks.iter().skip(i).step_by(threads) {
                        file.read_at(c * CHUNK, &mut buf).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(Err("a reader panicked".into()))).collect()
    });
    results.into_iter().collect::<Result<(), String>>()?;
    Ok((size / CHUNK * CHUNK) as f64 / t.elapsed().as_secs_f64())
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("zimage: {e}");
            std::process::exit(2);
        }
    };
    if args.print_graph {
        let graph =
            args.workflow.prompt(args.seed, args.size, args.steps, args.height, args.frames);
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), "{graph:#}");
        return;
    }
    let report = match bench(&args) {
        Ok(report) => report,
        Err(e) => json!({"error": e, "label": args.label}),
    };
    let text =
        serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\": {e:?}}}"));
    if let Some(out) = &args.out
        && let Err(e) = std::fs::write(out, &text)
    {
        eprintln!("zimage: cannot write {}: {e}", out.display());
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{text}");
    if !report["error"].is_null() {
        std::process::exit(1);
    }
}
