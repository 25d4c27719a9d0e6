//! One module per command group; `dispatch` routes a parsed command line to it.

mod certs;
mod config;
mod health;
mod ingest;
mod project;
mod replay;
mod run;
mod sandbox;
mod sandbox_session;
mod serve;
mod store;
mod tokens;
mod up;

use std::process::ExitCode;

use crate::cli::{Cli, Command, RunsCommand};

pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Up(args) => up::run(&cli.global, args).await,
        Command::Serve(args) => serve::run(&cli.global, args).await,
        Command::Health(args) => health::run(&cli.global, args).await,
        Command::Store(cmd) => store::run(&cli.global, cmd).await,
        Command::Project(cmd) => project::run(&cli.global, cmd).await,
        Command::Config(cmd) => config::run(&cli.global, cmd),
        Command::Ingest(args) => ingest::run(&cli.global, args).await,
        Command::Sandbox(cmd) => sandbox::run(&cli.global, cmd).await,
        Command::Run(args) => run::run(&cli.global, args).await,
        Command::Runs(RunsCommand::Replay(args)) => replay::command(&cli.global, args).await,
        Command::Runs(RunsCommand::Diff { a, b }) => replay::diff(&cli.global, &a, &b).await,
        Command::Runs(cmd) => run::runs(&cli.global, cmd).await,
        Command::Gate(cmd) => run::gate(&cli.global, cmd).await,
        Command::Notes(cmd) => run::notes(&cli.global, cmd).await,
        Command::Certs(cmd) => certs::run(&cli.global, cmd).await,
        Command::Tokens(cmd) => tokens::run(&cli.global, cmd),
    }
}
