//! `kiln model …`: model-file tools run from the command line instead of the server.
//!
//! `kiln model synth` writes random-weight Z-Image-Turbo files with the released keys, shapes and dtypes (or
//! a tiny configuration of the same structure) under their real names, for benchmarks and tests without the
//! real weights; with `--family` and `--name`, one file of that family under any name (the template suite
//! writes each file a template names this way).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use kiln_models::synth::{self, SynthDtype, SynthFamily, ZImageTurboSet};

/// The `model` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ModelCommand {
    /// Writes random-weight Z-Image-Turbo files (not a trained model) into a models folder.
    Synth(SynthArgs),
}

/// Which configuration to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Size {
    /// The released configuration (DiT 11.5 GiB in bf16, Qwen3-4B 7.5 GiB, VAE 335 MB).
    Real,
    /// A few megabytes with the same structure (tests).
    Tiny,
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Files {
    /// The three files of the default workflow, under their real names.
    Separate,
    /// One checkpoint with all three (for CheckpointLoaderSimple), `checkpoints/z_image_turbo_synth.safetensors`.
    Checkpoint,
}

/// `kiln model synth`.
#[derive(Debug, Args)]
pub(crate) struct SynthArgs {
    /// The models folder to write into (its `diffusion_models/`, `text_encoders/`, `vae/` or `checkpoints/`).
    #[arg(long, default_value = "kiln-data/models")]
    models_dir: PathBuf,
    /// The configuration.
    #[arg(long, value_enum, default_value_t = Size::Real)]
    size: Size,
    /// The weights' dtype (bf16, f16, f32, fp8_e4m3fn, fp8_e5m2; fp8_scaled and fp8_mixed: the Linear weights
    /// e4m3fn with a per-tensor scale each, in ComfyUI's legacy or mixed-precision encoding; the VAE is never fp8).
    #[arg(long, default_value = "bf16")]
    dtype: SynthDtype,
    /// The seed of the random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Separate files or one checkpoint.
    #[arg(long, value_enum, default_value_t = Files::Separate, conflicts_with = "family")]
    files: Files,
    /// Write one file of this family instead, under `--name`: z-image, flux1 (and its variants flux1-schnell,
    /// flux1-fill, flux1-canny), flux2 (FLUX.2 Klein 4B), qwen-image, the Wan DiTs (wan21-t2v-1.3b,
    /// wan21-i2v-14b, wan21-flf2v-14b, wan22-ti2v-5b, wan22-t2v-a14b, wan22-i2v-a14b), qwen3, qwen25vl, clip-l,
    /// t5xxl, umt5-xxl, the VAEs (wan21-vae, wan22-vae, flux-vae, flux2-vae), the LoRAs (z-image-lora,
    /// flux1-lora, flux2-lora, qwen-image-lora, wan21-lora, wan22-lora) and the other files of those families;
    /// an unknown name lists them all.
    #[arg(long, requires = "name")]
    family: Option<SynthFamily>,
    /// The file's path inside the models folder, e.g. `loras/pixel_art_style_z_image_turbo.safetensors`.
    #[arg(long, requires = "family")]
    name: Option<PathBuf>,
}

/// Runs a `model` subcommand.
pub(crate) fn run(command: ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Synth(args) => synth_files(&args),
    }
}

fn synth_files(args: &SynthArgs) -> anyhow::Result<()> {
    let set = match args.size {
        Size::Real => ZImageTurboSet::real(),
        Size::Tiny => ZImageTurboSet::tiny(),
    };
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_finish(ProgressFinish::AndLeave);
    if let Ok(style) =
        ProgressStyle::with_template("synth {bar:40} {bytes}/{total_bytes} {bytes_per_sec} {eta}")
    {
        bar.set_style(style);
    }
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    if let (Some(family), Some(name)) = (args.family, &args.name) {
        let inside = name.components().all(|c| matches!(c, std::path::Component::Normal(_)));
        if !inside {
            anyhow::bail!(
                "--name {}: a path inside the models folder, without `..`",
                name.display()
            );
        }
        let path = args.models_dir.join(name);
        synth::write_family(&path, family, &set, args.dtype, args.seed, &mut progress)
            .with_context(|| format!("writing {}", path.display()))?;
        bar.finish();
        tracing::info!("wrote {} ({family})", path.display());
        return Ok(());
    }
    match args.files {
        Files::Separate => {
            synth::write_models_dir(&args.models_dir, &set, args.dtype, args.seed, &mut progress)
                .with_context(|| format!("writing into {}", args.models_dir.display()))?;
            bar.finish();
            for file in [synth::DIFFUSION_MODEL_FILE, synth::TEXT_ENCODER_FILE, synth::VAE_FILE] {
                tracing::info!("wrote {}", args.models_dir.join(file).display());
            }
        }
        Files::Checkpoint => {
            let path = args.models_dir.join("checkpoints/z_image_turbo_synth.safetensors");
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            synth::write_checkpoint(&path, &set, args.dtype, args.seed, &mut progress)
                .with_context(|| format!("writing {}", path.display()))?;
            bar.finish();
            tracing::info!("wrote {}", path.display());
        }
    }
    Ok(())
}
