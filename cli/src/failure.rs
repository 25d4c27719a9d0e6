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
