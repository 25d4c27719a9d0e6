//! How a failed command ends, the same for every command: `error: <what happened>` and
//! `hint: <what to do>` on stderr (with --json, `{"error": {"reason", "message", "hint"}}` on
//! stdout), and an exit code of the one table below. Services' refusals are put into CLI
//! words here: no gRPC code names, RPC names or request fields reach the user.

use std::process::ExitCode;

use serde_json::json;
use tonic::Code;

/// The exit codes of every command (README.md, "Exit codes").
pub mod exit {
    /// The command ran but its work failed (a run failed, code exited non-zero, an error
    /// nothing more precise describes).
    pub const FAILED: u8 = 1;
    /// The command line or a request's content is wrong (flags, files, ids, paths).
    pub const USAGE: u8 = 2;
    /// What the command names does not exist (run, file, project, gate).
    pub const NOT_FOUND: u8 = 3;
    /// Part of the work was done, part refused (e.g. ingest with some blocks rejected).
    pub const PARTIAL: u8 = 4;
    /// Refused: no permission, already exists, wrong state, a policy says no.
    pub const REFUSED: u8 = 5;
    /// A service could not be reached or is shutting down.
    pub const UNAVAILABLE: u8 = 6;
}

/// A failure the CLI itself words: what happened, what to do, and its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub hint: Option<String>,
    pub exit: u8,
}

impl Failure {
    /// A wrong command line or input (exit 2).
    pub fn usage(
        reason: &'static str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Failure {
            reason,
            message: message.into(),
            hint: Some(hint.into()),
            exit: exit::USAGE,
        }
    }

    /// Something named does not exist (exit 3).
    pub fn not_found(
        reason: &'static str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Failure {
            reason,
            message: message.into(),
            hint: Some(hint.into()),
            exit: exit::NOT_FOUND,
        }
    }
}

/// What the report needs to know about the command line.
pub struct Context {
    pub json: bool,
    /// The address a remote command dialed (None: embedded services).
    pub remote: Option<String>,
    /// The command dials with TLS (--tls-dir / CAIRN_TLS_DIR).
    pub tls: bool,
}

impl Context {
    pub fn of(cli: &crate::cli::Cli) -> Context {
        let g = &cli.global;
        let remote = [&g.addr, &g.store_addr, &g.ingest_addr, &g.sandbox_addr]
            .into_iter()
            .flatten()
            .next()
            .cloned();
        let tls = g
            .tls
            .config()
            .load(crate::embedded::IDENTITY)
            .ok()
            .flatten()
            .is_some();
        Context {
            json: g.json,
            remote,
            tls,
        }
    }
}

/// One failure as the user reads it.
struct Report {
    reason: String,
    message: String,
    hint: Option<String>,
    exit: u8,
}

/// Prints `e` in the one error style and returns its exit code.
pub fn report(e: &anyhow::Error, cx: &Context) -> ExitCode {
    let r = describe(e, cx);
    print(&r, cx.json);
    ExitCode::from(r.exit)
}

/// Prints a failure the CLI words itself (e.g. an UNIMPLEMENTED answer explained).
pub fn report_failure(f: Failure, cx: &Context) -> ExitCode {
    let r = Report {
        reason: f.reason.to_owned(),
        message: f.message,
        hint: f.hint,
        exit: f.exit,
    };
    print(&r, cx.json);
    ExitCode::from(r.exit)
}

/// Ends the process on a command line clap refused, in the one error style (exit 2); help and
/// version requests print as clap has them.
pub fn usage_exit(e: clap::Error) -> ! {
    use clap::error::ErrorKind as K;
    if matches!(
        e.kind(),
        K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let json = std::env::args_os().any(|a| a == "--json");
    let r = usage_report(&e.render().to_string());
    print(&r, json);
    std::process::exit(i32::from(r.exit));
}

/// clap's rendered error as one `error:` line and a `hint:` with the usage line.
fn usage_report(rendered: &str) -> Report {
    let mut what = Vec::new();
    let mut usage = None;
    let mut tip = None;
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage:") {
            usage = Some(u.trim().to_owned());
        } else if line.starts_with("For more information") {
        } else if let Some(t) = line.strip_prefix("tip:") {
            tip = Some(t.trim().to_owned());
        } else if usage.is_none() {
            what.push(
                line.strip_prefix("error:")
                    .unwrap_or(line)
                    .trim()
                    .to_owned(),
            );
        }
    }
    let help = usage
        .as_deref()
        .map(|u| {
            let words: Vec<&str> = u
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            format!(
                "usage: {u}; `{} --help` explains each flag",
                words.join(" ")
            )
        })
        .unwrap_or_else(|| "`cairn --help` lists the commands".to_owned());
    let hint = match tip {
        Some(t) => format!("{t}; {help}"),
        None => help,
    };
    Report {
        reason: "usage".into(),
        message: what.join(" "),
        hint: Some(hint),
        exit: exit::USAGE,
    }
}

fn print(r: &Report, json: bool) {
    if json {
        let doc = json!({"error": {"reason": r.reason, "message": r.message, "hint": r.hint}});
        println!("{doc}");
        return;
    }
    eprintln!("error: {}", one_line(&r.message));
    if let Some(hint) = &r.hint {
        eprintln!("hint: {}", one_line(hint));
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn describe(e: &anyhow::Error, cx: &Context) -> Report {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return Report {
            reason: f.reason.to_owned(),
            message: f.message.clone(),
            hint: f.hint.clone(),
            exit: f.exit,
        };
    }
    if let Some(status) = e.chain().find_map(|c| c.downcast_ref::<tonic::Status>()) {
        return from_status(status, cx);
    }
    // Not a service's answer (whose cause may be a broken socket): a command streaming to a
    // closed stdout (`cairn store get F | head -c 10`).
    if let Some(io) = e.chain().find_map(|c| c.downcast_ref::<std::io::Error>()) {
        if io.kind() == std::io::ErrorKind::BrokenPipe {
            crate::output::stdout_failed(std::io::Error::from(io.kind()));
        }
    }
    if let Some(clap) = e.downcast_ref::<clap::Error>() {
        return Report {
            reason: "usage".into(),
            message: clap.to_string(),
            hint: Some("see `cairn --help` and `cairn <command> --help`".into()),
            exit: exit::USAGE,
        };
    }
    Report {
        reason: "failed".into(),
        message: format!("{e:#}"),
        hint: None,
        exit: exit::FAILED,
    }
}

/// The exit code of a gRPC code: the one mapping from the services' answers.
pub fn exit_of(code: Code) -> u8 {
    match code {
        Code::Ok => 0,
        Code::InvalidArgument | Code::OutOfRange => exit::USAGE,
        Code::NotFound => exit::NOT_FOUND,
        Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::ResourceExhausted => exit::REFUSED,
        Code::Unavailable | Code::DeadlineExceeded => exit::UNAVAILABLE,
        Code::Cancelled | Code::Unknown | Code::Internal | Code::Unimplemented | Code::DataLoss => {
            exit::FAILED
        }
    }
}

fn from_status(status: &tonic::Status, cx: &Context) -> Report {
    let reason = cairn_proto::reason::of(status)
        .unwrap_or_else(|| cairn_proto::reason::fallback(status.code()).to_owned());
    if let Some(r) = transport(status, cx) {
        return r;
    }
    // The services word a refusal as "<what happened>; <what to do>".
    let message = status.message();
    let (what, advice) = match advice_at(message) {
        Some(at) => (message[..at].to_owned(), Some(&message[at + 2..])),
        None => (message.to_owned(), None),
    };
    let hint = cli_hint(&reason, status)
        .or_else(|| advice.map(cli_words))
        .or_else(|| default_hint(status.code()));
    Report {
        reason,
        message: what,
        hint,
        exit: exit_of(status.code()),
    }
}

/// Where a service's advice starts: the first "; " outside brackets and quotes.
fn advice_at(message: &str) -> Option<usize> {
    let (mut depth, mut quoted) = (0i32, false);
    for (i, c) in message.char_indices() {
        match c {
            '"' | '`' => quoted = !quoted,
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            ';' if depth == 0 && !quoted && message[i..].starts_with("; ") => return Some(i),
            _ => {}
        }
    }
    None
}

/// Did the connection fail because the OS refused this user (EACCES), e.g. on a socket's mode?
fn permission_denied(status: &tonic::Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = cause {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        {
            return true;
        }
        cause = e.source();
    }
    status.message().contains("Permission denied")
}

/// A status that says the connection itself failed, worded for the user.
fn transport(status: &tonic::Status, cx: &Context) -> Option<Report> {
    let m = status.message();
    let broken = [
        "h2 protocol error",
        "transport error",
        "operation was canceled",
        "connection closed",
        "connection reset",
        "broken pipe",
        "tcp connect error",
        "error trying to connect",
    ]
    .iter()
    .any(|w| m.to_ascii_lowercase().contains(w));
    if !broken && status.code() != Code::Unavailable {
        return None;
    }
    let addr = cx.remote.as_deref().unwrap_or("the embedded services");
    let refused = m.contains("Connection refused") || m.contains("tcp connect error");
    let socket_denied = addr.starts_with(cairn_server::unix::SCHEME) && permission_denied(status);
    let (message, hint, exit) = if socket_denied {
        (
            format!("{addr} does not let this user in (permission denied)"),
            "the socket of `cairn up --socket` is mode 0600: only the user who started it (and root) may connect; run the command as that user".to_owned(),
            exit::UNAVAILABLE,
        )
    } else if refused || status.code() == Code::Unavailable && !broken {
        (
            format!("could not reach cairn at {addr}"),
            "start it with `cairn up` (or check --addr / CAIRN_ADDR); without --addr, commands start the services themselves over --data-root".to_owned(),
            exit::UNAVAILABLE,
        )
    } else if cx.remote.is_some() && !cx.tls {
        (
            format!("{addr} closed the connection: this service requires TLS"),
            "pass --tls-dir DIR (or set CAIRN_TLS_DIR) with the certificates of `cairn certs init`"
                .to_owned(),
            exit::UNAVAILABLE,
        )
    } else {
        (
            format!("the connection to {addr} broke"),
            "check that the service is running and that its TLS settings match --tls-dir, then try again".to_owned(),
            exit::UNAVAILABLE,
        )
    };
    Some(Report {
        reason: "unavailable".into(),
        message,
        hint: Some(hint),
        exit,
    })
}

/// What to do about a refusal, when the reason word says more than the service's advice.
fn cli_hint(reason: &str, status: &tonic::Status) -> Option<String> {
    let detail = |k: &str| cairn_proto::reason::detail(status, k);
    Some(match reason {
        "no_project" => "create it with `cairn project create <name>`, or write a file into it (`cairn store put`, `cairn run`); --project / CAIRN_PROJECT picks the project".into(),
        "llm_url_not_allowed" => "name a provider of the server's configuration with --llm NAME ([llm.providers.NAME] in the server's config file), or run without --addr so this process talks to the LLM itself".into(),
        "network_not_allowed" => "leave out --network, or allow it on the runner: network_allowed = true in [sandbox_runner] of the configuration of the services cairn starts itself (--config FILE), or of the sandbox-runner at --addr (its operator sets it)".into(),
        "image_not_allowed" => "name one of the allowed images with --image, or add it to allowed_images in [sandbox_runner] of the runner's configuration".into(),
        "unauthenticated" => "pass --token-file FILE (or set CAIRN_TOKEN) with a token from `cairn tokens add`".into(),
        "not_found" | "no_run" if detail("run_id").is_some() => {
            "list the runs with `cairn runs list`".into()
        }
        _ => return None,
    })
}

/// A service's advice in CLI words: flags instead of request fields, commands instead of RPCs.
pub fn cli_words(advice: &str) -> String {
    const WORDS: [(&str, &str); 10] = [
        ("set overwrite=true", "pass --overwrite"),
        ("overwrite=true", "--overwrite"),
        ("pass follow=true", "pass --follow"),
        ("follow=true", "--follow"),
        (
            "check the path with List",
            "see what is there with `cairn store ls -r`",
        ),
        ("with List", "with `cairn store ls`"),
        (
            "create it with CreateProject (or set create_project on the Put)",
            "create it with `cairn project create <name>`",
        ),
        ("CreateProject", "`cairn project create`"),
        ("(ClaimRun)", ""),
        ("use MERGE_POLICY_MAX", "try again"),
    ];
    let mut s = advice.to_owned();
    for (api, cli) in WORDS {
        s = s.replace(api, cli);
    }
    s
}

fn default_hint(code: Code) -> Option<String> {
    Some(
        match code {
            Code::PermissionDenied => {
                "ask an admin for a token with the role this needs (`cairn tokens add NAME --role ROLE`)"
            }
            Code::DeadlineExceeded => "the service took too long: try again, or check it with `cairn health`",
            Code::Internal | Code::Unknown => {
                "run the command again with -v to see the services' log lines"
            }
            _ => return None,
        }
        .to_owned(),
    )
}

/// The cairn services, as gRPC names them and as a user calls them.
const SERVICES: [(&str, &str, &str); 4] = [
    (
        "cairn.v1.ArtifactStore",
        "the artifact-store",
        "--store-addr",
    ),
    ("cairn.v1.Ingest", "the ingest service", "--ingest-addr"),
    (
        "cairn.v1.SandboxRunner",
        "a sandbox-runner",
        "--sandbox-addr",
    ),
    ("cairn.v1.Orchestrator", "the orchestrator", "--addr"),
];

/// What a command talks to, to explain an UNIMPLEMENTED answer: the address it used and the
/// service it expected there.
pub struct Expected {
    addr: String,
    service: &'static str,
    tls: Option<cairn_server::Tls>,
}

impl Expected {
    /// The service `command` calls and where (None for commands that embed their services).
    pub fn of(cli: &crate::cli::Cli) -> Option<Expected> {
        use crate::cli::Command;
        let g = &cli.global;
        let (own, service) = match &cli.command {
            Command::Store(_) | Command::Project(_) => (&g.store_addr, SERVICES[0].0),
            Command::Ingest(_) => (&g.ingest_addr, SERVICES[1].0),
            Command::Sandbox(_) => (&g.sandbox_addr, SERVICES[2].0),
            Command::Run(_) | Command::Runs(_) | Command::Gate(_) | Command::Notes(_) => {
                (&None, SERVICES[3].0)
            }
            _ => return None,
        };
        let addr = own.clone().or_else(|| g.addr.clone())?;
        let tls = g
            .tls
            .config()
            .load(crate::embedded::IDENTITY)
            .ok()
            .flatten();
        Some(Expected { addr, service, tls })
    }

    /// Which cairn services answer at the address (the health protocol names them), worded
    /// for the user; None when the probe learns nothing.
    pub async fn explain(&self) -> Option<Failure> {
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;
        let channel = cairn_server::connect_tls(&self.addr, self.tls.as_ref()).ok()?;
        let mut client = HealthClient::new(channel);
        let mut found = Vec::new();
        for (name, words, _) in SERVICES {
            let check = client.check(HealthCheckRequest {
                service: name.to_owned(),
            });
            if let Ok(Ok(_)) = tokio::time::timeout(std::time::Duration::from_secs(3), check).await
            {
                found.push(words);
            }
        }
        let (_, wanted, flag) = SERVICES.iter().find(|s| s.0 == self.service)?;
        let there = if found.is_empty() {
            "no cairn service (it does not answer the gRPC health protocol for any)".to_owned()
        } else {
            found.join(" and ")
        };
        Some(Failure {
            reason: "wrong_service",
            message: format!("{addr} serves {there}, not {wanted}", addr = self.addr),
            hint: Some(format!("point {flag} (or --addr / CAIRN_ADDR) at {wanted}")),
            exit: exit::USAGE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_words_become_cli_words() {
        assert_eq!(
            cli_words("set overwrite=true to replace them, or write to another path"),
            "pass --overwrite to replace them, or write to another path"
        );
        assert_eq!(
            cli_words("check the run id, or pass follow=true to wait for them"),
            "check the run id, or pass --follow to wait for them"
        );
        assert!(cli_words("check the path with List").contains("cairn store ls"));
    }

    #[test]
    fn advice_starts_after_the_first_top_level_semicolon() {
        let m = "needs a token (cairn --token; or CAIRN_TOKEN); use one";
        assert_eq!(&m[advice_at(m).unwrap() + 2..], "use one");
        assert_eq!(advice_at("no advice here"), None);
    }

    #[test]
    fn a_refused_command_line_is_one_error_and_one_hint() {
        let rendered = "error: the following required arguments were not provided:\n  <FILE>\n  <PATH>\n\nUsage: cairn store put <FILE> <PATH>\n\nFor more information, try '--help'.\n";
        let r = usage_report(rendered);
        assert_eq!(
            r.message,
            "the following required arguments were not provided: <FILE> <PATH>"
        );
        assert_eq!(
            r.hint.as_deref(),
            Some(
                "usage: cairn store put <FILE> <PATH>; `cairn store put --help` explains each flag"
            )
        );
        assert_eq!((r.reason.as_str(), r.exit), ("usage", exit::USAGE));
        let r = usage_report("error: unexpected argument '--nope' found\n\n  tip: to pass '--nope' as a value, use '-- --nope'\n\nUsage: cairn runs list [OPTIONS]\n");
        assert_eq!(r.message, "unexpected argument '--nope' found");
        assert_eq!(
            r.hint.as_deref(),
            Some("to pass '--nope' as a value, use '-- --nope'; usage: cairn runs list [OPTIONS]; `cairn runs list --help` explains each flag")
        );
    }

    #[test]
    fn every_code_has_one_exit_code() {
        assert_eq!(exit_of(Code::NotFound), exit::NOT_FOUND);
        assert_eq!(exit_of(Code::Unavailable), exit::UNAVAILABLE);
        assert_eq!(exit_of(Code::InvalidArgument), exit::USAGE);
        assert_eq!(exit_of(Code::PermissionDenied), exit::REFUSED);
        assert_eq!(exit_of(Code::Internal), exit::FAILED);
    }
}
