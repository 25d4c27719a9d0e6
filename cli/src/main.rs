//! `cairn`: the command line of cairn. Every command that talks to services uses `--addr` /
//! `CAIRN_ADDR` when given and otherwise starts the services it needs in this process (over
//! `--data-root`), then talks to them over gRPC on loopback like any other client.

mod cli;
mod commands;
mod embedded;
mod failure;
mod output;
mod transfer;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let level = match cli.command {
            cli::Command::Up(_) | cli::Command::Serve(_) => "info",
            _ => "warn",
        };
        let _telemetry = cairn_telemetry::init_with_level("cairn", level);
        match commands::dispatch(cli).await {
            Ok(code) => code,
            Err(e) => failure::report(&e),
        }
    })
}
