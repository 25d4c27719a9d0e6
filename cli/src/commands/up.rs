//! `cairn up`: every service in one process on one address.

use std::process::ExitCode;

use crate::cli::{Global, UpArgs};
use crate::embedded;

pub async fn run(global: &Global, args: UpArgs) -> anyhow::Result<ExitCode> {
    let listener = cairn_server::bind(&args.listen).await?;
    let addr = listener.local_addr()?.to_string();
    let hosted = embedded::host_all(&global.data_root, &addr, embedded::Needs { sandbox: true, orchestrator: true }).await?;
    eprintln!(
        "cairn is up on {addr} (data root {}); use CAIRN_ADDR={addr} with other cairn commands. Ctrl-C stops.",
        global.data_root.display()
    );
    hosted.serve(listener, cairn_server::shutdown_signal()).await?;
    eprintln!("cairn stopped");
    Ok(ExitCode::SUCCESS)
}
