//! A small command-line client for Kiln or ComfyUI, showing the SDK.
//!
//! ```sh
//! cargo run -p kiln-client --example kiln_client -- http://127.0.0.1:8188 stats
//! cargo run -p kiln-client --example kiln_client -- http://127.0.0.1:8188 run workflow_api.json
//! ```
//!
//! `stats` prints the server's devices; `run` submits an API-format workflow (as saved by ComfyUI's "Export
//! (API)"), waits for it to finish and prints where its images are.
//!
//! Against Kiln's cloud runtime (or a local one started with `--api-key-file`), put an API key in
//! `KILN_API_KEY` (`kiln key add USER --workspace W --name sdk` prints one):
//!
//! ```sh
//! KILN_API_KEY=comfyui-... cargo run -p kiln-client --example kiln_client -- http://kiln.internal:8188 run workflow_api.json
//! ```

use std::process::ExitCode;
use std::time::Duration;

use kiln_client::{Client, Credentials, types};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [base, command] if command == "stats" => stats(base).await,
        [base, command, workflow] if command == "run" => run(base, workflow).await,
        _ => Err(
            "usage: kiln_client <base-url> stats | kiln_client <base-url> run <workflow_api.json>"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A client for `base`, with the API key in `KILN_API_KEY` if there is one.
fn client(base: &str, timeout: Duration) -> Result<Client> {
    let credentials = match std::env::var("KILN_API_KEY") {
        Ok(key) if !key.is_empty() => Credentials::ApiKey(key),
        _ => Credentials::None,
    };
    Ok(Client::with_credentials(base, credentials, timeout)?)
}

async fn stats(base: &str) -> Result<()> {
    let client = client(base, Duration::from_secs(30))?;
    let stats = client.get_system_stats().await?.into_inner();
    eprintln!("{} on {}", stats.system.comfyui_version, stats.system.os);
    for device in &stats.devices {
        eprintln!(
            "  {} ({}): {} of {} bytes free",
            device.name, device.type_, device.vram_free, device.vram_total
        );
    }
    Ok(())
}

async fn run(base: &str, workflow: &str) -> Result<()> {
    let client = client(base, kiln_client::DEFAULT_TIMEOUT)?;
    let prompt: types::Prompt = serde_json::from_str(&std::fs::read_to_string(workflow)?)?;
    let request = types::PromptRequest { prompt: Some(prompt), ..Default::default() };
    let run = client.run_prompt(request).await?;
    eprintln!("prompt {} finished: {:?}", run.prompt_id, run.history.status.status_str);
    for (node, output) in &run.history.outputs {
        for image in &output.images {
            eprintln!(
                "  node {node}: {base}/api/view?filename={}&subfolder={}&type={}",
                image.filename, image.subfolder, image.type_
            );
        }
    }
    Ok(())
}
