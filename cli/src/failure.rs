//! How a failed command ends: the reason on stderr, a non-zero exit code.

use std::process::ExitCode;

/// Prints `e` (with the gRPC code and `cairn-reason` when it came from a service) and returns
/// exit code 1 (3 when a service could not be reached).
pub fn report(e: &anyhow::Error) -> ExitCode {
    if let Some(status) = e.downcast_ref::<tonic::Status>() {
        let reason = cairn_proto::reason::of(status);
        if let Some(hint) = reason.as_deref().and_then(cli_wording) {
            // The service's own words up to its gRPC advice, then the CLI's.
            let what = status.message().split(';').next().unwrap_or_default();
            eprintln!("error: {what}: {hint}");
            return ExitCode::FAILURE;
        }
        match reason {
            Some(r) => eprintln!(
                "error: {} [{:?}, reason: {r}]",
                status.message(),
                status.code()
            ),
            None => eprintln!("error: {} [{:?}]", status.message(), status.code()),
        }
        if status.code() == tonic::Code::Unavailable {
            eprintln!("hint: is the service at --addr / CAIRN_ADDR running? Without --addr, cairn starts the services itself.");
            return ExitCode::from(3);
        }
        return ExitCode::FAILURE;
    }
    eprintln!("error: {e:#}");
    ExitCode::FAILURE
}

/// What to tell a CLI user for a refusal whose gRPC wording names RPCs and fields.
fn cli_wording(reason: &str) -> Option<String> {
    match reason {
        "no_project" => Some(
            "create it with `cairn project create <name>`, or write a file into it (`cairn store put`, `cairn run`); --project / CAIRN_PROJECT picks the project".into(),
        ),
        _ => None,
    }
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
    pub async fn explain(&self) -> Option<String> {
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
        Some(format!(
            "{addr} serves {there}, not {wanted}: point {flag} (or --addr / CAIRN_ADDR) at {wanted}",
            addr = self.addr
        ))
    }
}
