//! `cairn`: the command line of cairn. Every command that talks to services uses `--addr` /
//! `CAIRN_ADDR` when given and otherwise starts the services it needs in this process (over
//! `--data-root`), then talks to them over gRPC on loopback like any other client.

/// `println!` for this crate: a closed stdout (`cairn runs show RUN | head -2`) ends the
/// command quietly, as SIGPIPE ends any Unix tool, instead of panicking.
macro_rules! println {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, $($arg)*) {
            $crate::output::stdout_failed(e);
        }
    }};
}

/// `print!` for this crate (see `println!`).
macro_rules! print {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        if let Err(e) = write!(out, $($arg)*).and_then(|()| out.flush()) {
            $crate::output::stdout_failed(e);
        }
    }};
}

mod cli;
mod commands;
mod embedded;
mod failure;
mod logs;
mod output;
mod settings;
mod transfer;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_args();
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
        let (level, service) = match &cli.command {
            cli::Command::Serve(s) => ("info", serve_name(&s.service)),
            cli::Command::Up(_) => ("info", "cairn"),
            _ => ("warn", "cairn"),
        };
        let _telemetry = match logs::file_of(&cli) {
            // Client commands: the logs of the services they embed go to a file, not the
            // terminal (-v: to the terminal too, and its path is printed).
            Some(path) => {
                if cli.global.verbose {
                    eprintln!("logs: {}", path.display());
                }
                cairn_telemetry::init_with_writer(
                    service,
                    if cli.global.verbose { "info" } else { level },
                    logs::LogFile::new(path, cli.global.verbose),
                )
            }
            None => cairn_telemetry::init_with_level(service, level),
        };
        // A client command is one trace: its calls carry this span's context to the services
        // (servers make a span per call instead). `cairn health` is a probe run every few
        // seconds by Docker and Kubernetes: no trace.
        let span = match &cli.command {
            cli::Command::Serve(_) | cli::Command::Up(_) | cli::Command::Health(_) => {
                tracing::Span::none()
            }
            c => tracing::info_span!("cairn", otel.name = %command_name(c), otel.kind = "client"),
        };
        let expected = failure::Expected::of(&cli);
        let context = failure::Context::of(&cli);
        let result = tracing::Instrument::instrument(commands::dispatch(cli), span).await;
        match result {
            Ok(code) => code,
            Err(e) => {
                // UNIMPLEMENTED: the address serves another service than the command needs.
                let unimplemented = e
                    .downcast_ref::<tonic::Status>()
                    .is_some_and(|s| s.code() == tonic::Code::Unimplemented);
                if let (true, Some(expected)) = (unimplemented, expected) {
                    if let Some(why) = expected.explain().await {
                        return failure::report_failure(why, &context);
                    }
                }
                failure::report(&e, &context)
            }
        }
    })
}

/// `service.name` of `cairn serve <service>` (OTEL_SERVICE_NAME overrides it).
fn serve_name(s: &cli::ServeService) -> &'static str {
    match s {
        cli::ServeService::ArtifactStore(_) => "cairn-artifact-store",
        cli::ServeService::Ingest(_) => "cairn-ingest",
        cli::ServeService::SandboxRunner(_) => "cairn-sandbox-runner",
        cli::ServeService::Orchestrator(_) => "cairn-orchestrator",
        cli::ServeService::Console(_) => "cairn-console",
    }
}

/// The span name of a client command: `cairn` and its subcommand words, from the parsed
/// command (`cairn run`, `cairn store put`); never arguments, which may hold paths or ids.
fn command_name(c: &cli::Command) -> String {
    let debug = format!("{c:?}");
    let mut name = String::from("cairn");
    for part in debug.split('(').take(2) {
        let word: String = part
            .chars()
            .take_while(char::is_ascii_alphanumeric)
            .collect();
        if !word.starts_with(|ch: char| ch.is_ascii_uppercase()) || word.ends_with("Args") {
            break;
        }
        name.push(' ');
        for (i, ch) in word.chars().enumerate() {
            if ch.is_ascii_uppercase() {
                if i > 0 {
                    name.push('-');
                }
                name.push(ch.to_ascii_lowercase());
            } else {
                name.push(ch);
            }
        }
    }
    name
}
