//! `kiln-contract-proxy HOST:PORT [local|cloud]`: the response contract in front of a running `kiln` of that
//! runtime (local by default), for the black-box tests written in other languages (the Python clients, the
//! browser tests).
//!
//! It logs `listening on http://ADDR` like kiln, forwards every request to HOST:PORT unchanged and checks every
//! answer and websocket frame against `spec/openapi.yaml`. On SIGTERM or SIGINT it stops, prints how many
//! answers it checked and every violation, and exits with 1 if there was one.

use std::process::ExitCode;
use std::sync::Arc;

use kiln_tests::contract::Contract;
use kiln_tests::proxy;
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let Some(backend) = std::env::args().nth(1) else {
        eprintln!("usage: kiln-contract-proxy HOST:PORT (the address kiln logged)");
        return ExitCode::from(2);
    };
    let runtime = std::env::args().nth(2).unwrap_or_else(|| "local".to_owned());
    if !matches!(runtime.as_str(), "local" | "cloud") {
        eprintln!("kiln-contract-proxy: the runtime is local or cloud, not {runtime}");
        return ExitCode::from(2);
    }
    let contract = Arc::new(Contract::for_runtime(&runtime));
    let proxy = proxy::start(&backend, contract.clone());
    eprintln!("listening on http://{}", proxy.addr);
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM can be watched");
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
    drop(proxy);
    let violations = contract.violations();
    eprintln!(
        "contract: {} answers and frames checked, {} violation(s)",
        contract.checked(),
        violations.len()
    );
    for violation in &violations {
        eprintln!("{violation}");
    }
    if violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
