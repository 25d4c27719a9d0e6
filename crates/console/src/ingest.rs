//! The ingest manifests of a run (`.cairn/runs/<run>/ingest/<node>.json`, manifest v1) with
//! the status of every block: which were written, skipped or rejected, and why.

use maud::{html, Markup};
use serde::Deserialize;

use super::files;
use super::page;
use super::{Console, ConsoleError};

/// Most manifests shown on a run page.
const MAX_MANIFESTS: u32 = 50;
/// Largest manifest read (limits a document's blocks well below this).
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Source {
    kind: String,
    mode: String,
    doc_path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Block {
    index: u32,
    lang: String,
    declared_file: String,
    workspace_path: String,
    bytes: u64,
    status: String,
    reason: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Summary {
    total_blocks: u32,
    written: u32,
    skipped: u32,
    rejected: u32,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    version: String,
    #[serde(default)]
    node_id: String,
    #[serde(default)]
    source: Source,
    artifacts: Vec<Block>,
    #[serde(default)]
    summary: Summary,
    #[serde(default)]
    ts: String,
}

/// One file of the ingest directory: its manifest, or why it could not be shown.
pub(super) struct Entry {
    path: String,
    manifest: Result<Manifest, String>,
}

/// Reads the run's manifests (other JSON files there, like `enabled.json`, are left out).
pub(super) async fn load(
    console: &Console,
    project: &str,
    run_dir: &str,
) -> Result<Vec<Entry>, ConsoleError> {
    let prefix = format!("{run_dir}/ingest");
    let (entries, _) = files::list(console, project, &prefix, false, MAX_MANIFESTS + 1, "").await?;
    let reads = entries
        .into_iter()
        .filter(|e| e.path.ends_with(".json") && !e.path.ends_with("/enabled.json"))
        .take(MAX_MANIFESTS as usize)
        .map(|e| async move {
            let manifest = match files::read(console, project, &e.path, MAX_MANIFEST_BYTES).await {
                Ok(Some(r)) if !r.truncated => serde_json::from_slice::<Manifest>(&r.bytes)
                    .map_err(|err| format!("not an ingest manifest: {err}")),
                Ok(Some(_)) => Err(format!("larger than {}", page::size(MAX_MANIFEST_BYTES))),
                Ok(None) => Err("removed while reading".to_owned()),
                Err(err) => Err(err.to_string()),
            };
            Entry {
                path: e.path,
                manifest,
            }
        });
    Ok(futures::future::join_all(reads).await)
}

pub(super) fn render(project: &str, entries: &[Entry]) -> Markup {
    html! {
        @if entries.is_empty() {
            p.hint { "No document of this run was ingested yet." }
        }
        @for e in entries {
            div.manifest {
                @match &e.manifest {
                    Err(why) => {
                        p { a href=(page::file_url(project, &e.path)) { (e.path) } ": " span.error { (why) } }
                    }
                    Ok(m) => {
                        h3 {
                            "Node " code { (m.node_id) } " · "
                            a href=(page::file_url(project, &m.source.doc_path)) { (m.source.doc_path) }
                        }
                        p.meta {
                            "manifest " (m.version) " · " (m.source.kind) " " (m.source.mode) " · " (page::when(&m.ts)) " · "
                            (m.summary.total_blocks) " blocks: "
                            span.badge.ok { (m.summary.written) " written" } " "
                            span.badge.wait { (m.summary.skipped) " skipped" } " "
                            span.badge.bad { (m.summary.rejected) " rejected" }
                            " · " a href=(page::file_url(project, &e.path)) { "manifest" }
                        }
                        @if !m.artifacts.is_empty() {
                            table.blocks {
                                thead { tr { th.num { "#" } th { "lang" } th { "declared file" } th { "workspace path" } th.num { "bytes" } th { "status" } th { "reason" } } }
                                tbody {
                                    @for b in &m.artifacts {
                                        tr {
                                            td.num data-label="#" { (b.index) }
                                            td data-label="lang" { (b.lang) }
                                            td data-label="declared file" { code { (b.declared_file) } }
                                            td data-label="workspace path" {
                                                @if b.status == "written" && !b.workspace_path.is_empty() {
                                                    a href=(page::file_url(project, &b.workspace_path)) { (b.workspace_path) }
                                                } @else {
                                                    (b.workspace_path)
                                                }
                                            }
                                            td.num data-label="bytes" { (b.bytes) }
                                            td data-label="status" { (page::badge(&b.status)) }
                                            td data-label="reason" { (b.reason) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
