//! `kiln-codegen`: writes the code generated from `spec/openapi.yaml`, or with `--check` fails when the
//! committed files differ from what the spec generates.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

/// Generate Kiln's Rust code from spec/openapi.yaml.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Regenerate in memory and exit non-zero if a committed file differs (for CI).
    #[arg(long)]
    check: bool,
    /// The repository root (the directory holding spec/openapi.yaml).
    #[arg(long, default_value_os_t = default_root())]
    root: PathBuf,
}

fn default_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("kiln-codegen: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Returns whether everything is up to date (always true when writing).
fn run(args: &Args) -> anyhow::Result<bool> {
    let spec_path = args.root.join("spec/openapi.yaml");
    let spec = std::fs::read_to_string(&spec_path)
        .with_context(|| format!("cannot read {}", spec_path.display()))?;
    let files = kiln_codegen::generate_all(&spec, &args.root)?;
    let mut current = true;
    for file in files {
        let path = args.root.join(&file.path);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == file.contents {
            continue;
        }
        if args.check {
            eprintln!(
                "kiln-codegen: {} is out of date; run `cargo run -p kiln-codegen` and commit it",
                file.path.display()
            );
            current = false;
        } else {
            std::fs::write(&path, &file.contents)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("kiln-codegen: wrote {}", file.path.display());
        }
    }
    Ok(current)
}
