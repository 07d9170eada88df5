//! The `kiln` binary: parses the command line, sets up logging and serves until Ctrl-C.

use std::io::IsTerminal as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use kiln_server::{Config, Runtime};
use tracing::info;

/// A ComfyUI-compatible workflow server.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
struct Args {
    /// Addresses to listen on, comma-separated. Without a value: 0.0.0.0 (all IPv4 interfaces).
    #[arg(long, num_args = 0..=1, default_value = "127.0.0.1", default_missing_value = "0.0.0.0")]
    listen: String,
    /// The port to listen on (0 picks a free one; the log says which).
    #[arg(long, default_value_t = 8188)]
    port: u16,
    /// Where Kiln keeps its state (created if missing).
    #[arg(long, default_value = "kiln-data")]
    data_dir: PathBuf,
    /// Which API surface to serve.
    #[arg(long, value_enum, default_value_t = RuntimeArg::Local)]
    runtime: RuntimeArg,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RuntimeArg {
    /// The single-user local server (ComfyUI's API).
    Local,
    /// The multi-user cloud server.
    Cloud,
}

impl Args {
    fn into_config(self) -> anyhow::Result<Config> {
        let mut listen = Vec::new();
        for part in self.listen.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ip: IpAddr =
                part.parse().with_context(|| format!("--listen: `{part}` is not an IP address"))?;
            listen.push(SocketAddr::new(ip, self.port));
        }
        if listen.is_empty() {
            bail!("--listen: no address given");
        }
        let runtime = match self.runtime {
            RuntimeArg::Local => Runtime::Local,
            RuntimeArg::Cloud => Runtime::Cloud,
        };
        Ok(Config { listen, data_dir: self.data_dir, runtime, argv: std::env::args().collect() })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let config = Args::parse().into_config()?;
    if config.runtime == Runtime::Cloud {
        bail!(
            "--runtime cloud is not available in this build yet; start kiln without it for the local runtime"
        );
    }
    std::fs::create_dir_all(&config.data_dir).with_context(|| {
        format!("cannot create the data directory {}", config.data_dir.display())
    })?;

    let app = kiln_server::app(&config);
    let mut servers = tokio::task::JoinSet::new();
    for addr in &config.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        info!("listening on http://{}", listener.local_addr()?);
        let app = app.clone();
        servers.spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await
        });
    }
    while let Some(result) = servers.join_next().await {
        result.context("a listener task panicked")?.context("serving failed")?;
    }
    info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    // If the handler cannot be installed, serve until killed.
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
