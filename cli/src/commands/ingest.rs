//! `cairn ingest DOC`: code fences of a document into workspace files, printing the manifest.

use std::process::ExitCode;

use cairn_proto::v1::{
    BlockStatus, ClaimRunRequest, GrantIngestClaimRequest, IngestRequest, IngestResponse,
};

use crate::cli::{Global, IngestArgs};
use crate::embedded::{Needs, Services};
use crate::failure::{exit, Failure};

/// What one ingest request may carry besides the document (ids, paths, the fence).
const ENVELOPE_BYTES: u64 = 64 << 10;

pub async fn run(global: &Global, args: IngestArgs) -> anyhow::Result<ExitCode> {
    // Refused before anything is read into memory or sent, with the numbers and the setting.
    let size = tokio::fs::metadata(&args.document)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.document.display()))?
        .len();
    let most = cairn_ingest::MAX_MESSAGE_BYTES as u64 - ENVELOPE_BYTES;
    if size > most {
        return Err(too_large(&args.document.display().to_string(), size).into());
    }
    let content = tokio::fs::read(&args.document)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.document.display()))?;
    let services = Services::open(global, Needs::default()).await?;
    let run_id = args
        .run
        .clone()
        .unwrap_or_else(|| format!("manual-{}", uuid::Uuid::now_v7()));
    // Over mutual TLS ingest writes only under an ingest claim on the run: claim the run
    // (this fences any other writer of it, so give manual ingests runs of their own) and ask
    // the store for a claim to hand to ingest.
    let claim = if !args.dry_run && global.tls.config().is_set() && global.addr.is_some() {
        let mut store = services.store()?;
        let epoch = store
            .claim_run(ClaimRunRequest {
                project_id: global.project.clone(),
                run_id: run_id.clone(),
                holder: "cairn ingest".into(),
            })
            .await?
            .into_inner()
            .epoch;
        store
            .grant_ingest_claim(GrantIngestClaimRequest {
                project_id: global.project.clone(),
                run_id: run_id.clone(),
                epoch,
                ..Default::default()
            })
            .await?
            .into_inner()
            .claim
    } else {
        String::new()
    };
    let request = IngestRequest {
        project_id: global.project.clone(),
        run_id,
        node_id: args.node.clone(),
        mode: args.mode.clone(),
        doc_path: args
            .doc_path
            .clone()
            .unwrap_or_else(|| recorded_path(&args.document)),
        content: content.into(),
        overwrite: args.overwrite,
        // Unspecified: what ingest wrote is updated, unless --overwrite says anything.
        overwrite_policy: 0,
        source_kind: "cli".into(),
        claim,
    };
    let mut client = services.ingest()?;
    let response = if args.dry_run {
        client.parse(request).await
    } else {
        client.ingest(request).await
    };
    services.close().await?;
    let response = response?.into_inner();
    // A document over the service's limit was not parsed at all: one error, with the numbers.
    if let Some(whole) = response
        .artifacts
        .iter()
        .find(|a| a.reason == "too_large" && a.declared_file.is_empty())
    {
        return Err(too_large(&args.document.display().to_string(), whole.bytes).into());
    }
    if global.json {
        if response.manifest_json.trim().is_empty() {
            // Disabled: no manifest was made; say so in JSON rather than print an empty line.
            println!("{}", serde_json::json!({"enabled": response.enabled}));
        } else {
            println!("{}", response.manifest_json);
        }
    } else {
        print_table(&response, args.dry_run);
    }
    // Some blocks rejected: the others were written (or would be), a partial success.
    let rejected = response
        .artifacts
        .iter()
        .filter(|a| a.status() == BlockStatus::Rejected)
        .count();
    if rejected > 0 {
        eprintln!(
            "error: {rejected} of {} code blocks were rejected (see their reason{})",
            response.artifacts.len(),
            if global.json {
                " in the manifest"
            } else {
                " above"
            }
        );
        eprintln!("hint: fix those fences' file= paths in the document (project-relative, under the workspace), or pass --overwrite for blocks rejected `kept`; docs/ingest.md lists every reason");
        return Ok(ExitCode::from(exit::PARTIAL));
    }
    Ok(ExitCode::SUCCESS)
}

/// A document over what one ingest request carries or the service parses (exit 5).
fn too_large(document: &str, bytes: u64) -> Failure {
    Failure {
        reason: "too_large",
        message: format!("{document} is {bytes} bytes, over what the ingest service parses; nothing was parsed or written"),
        hint: Some("split the document, or raise `max_document_bytes` in the [ingest] section of the configuration (16 MiB by default; one request carries at most 32 MiB)".into()),
        exit: exit::REFUSED,
    }
}

fn print_table(r: &IngestResponse, dry_run: bool) {
    if !r.enabled {
        println!("ingest is disabled for this project/run: nothing was parsed or written");
        return;
    }
    println!(
        "{:>5}  {:<9} {:<20} {:>9}  {:<10} path",
        "index", "status", "reason", "bytes", "lang"
    );
    for a in &r.artifacts {
        let status = match a.status() {
            BlockStatus::Written if dry_run => "would-write",
            BlockStatus::Written => "written",
            BlockStatus::Skipped => "skipped",
            BlockStatus::Rejected => "rejected",
            BlockStatus::Unspecified => "?",
        };
        let path = if a.workspace_path.is_empty() {
            &a.declared_file
        } else {
            &a.workspace_path
        };
        println!(
            "{:>5}  {:<9} {:<20} {:>9}  {:<10} {}",
            a.index,
            status,
            a.reason,
            a.bytes,
            a.lang,
            path.escape_debug()
        );
    }
    if let Some(s) = &r.summary {
        println!(
            "{} blocks: {} written, {} skipped, {} rejected{}",
            s.total_blocks,
            s.written,
            s.skipped,
            s.rejected,
            if r.manifest_path.is_empty() {
                String::new()
            } else {
                format!("; manifest {}", r.manifest_path)
            }
        );
    }
    // The blocks not written, with why (the one error line follows).
    for e in &r.errors {
        eprintln!("  {e}");
    }
}

/// The source path recorded for DOCUMENT: as given when it is a plain relative path, else
/// its file name (ingest refuses absolute paths and `..`).
fn recorded_path(document: &std::path::Path) -> String {
    use std::path::Component;
    let plain = document
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    match document.file_name() {
        Some(name) if !plain => name.to_string_lossy().into_owned(),
        _ => document.display().to_string(),
    }
}
