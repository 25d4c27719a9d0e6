//! Manifest v1: exactly its documented fields, nothing more.
//! Also the overall severity of an ingest, computed from the blocks.

use serde::{Deserialize, Serialize};

use crate::block::{reason, Block, BlockStatus};

/// The only manifest version this service writes.
pub const VERSION: &str = "1";

/// Where the document came from (manifest `source`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    /// `graph_runtime` unless the caller says otherwise.
    pub kind: String,
    /// `single | self_critique | team | unknown`.
    pub mode: String,
    /// Project-relative path of the document.
    pub doc_path: String,
}

/// One block (manifest `artifacts[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub index: u32,
    pub lang: String,
    pub declared_file: String,
    pub workspace_path: String,
    pub bytes: u64,
    pub sha256: String,
    pub status: BlockStatus,
    pub reason: String,
}

/// Counts per status (manifest `summary`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub total_blocks: u32,
    pub written: u32,
    pub skipped: u32,
    pub rejected: u32,
}

/// Manifest v1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: String,
    pub run_id: String,
    pub node_id: String,
    pub source: Source,
    pub artifacts: Vec<Artifact>,
    pub summary: Summary,
    /// RFC 3339 UTC, millisecond precision.
    pub ts: String,
}

impl Manifest {
    /// The manifest of `blocks`, stamped now.
    pub fn new(run_id: &str, node_id: &str, source: Source, blocks: &[Block]) -> Manifest {
        let artifacts: Vec<Artifact> = blocks.iter().map(Artifact::from).collect();
        Manifest {
            version: VERSION.to_owned(),
            run_id: run_id.to_owned(),
            node_id: node_id.to_owned(),
            source,
            summary: Summary::of(&artifacts),
            artifacts,
            ts: now_rfc3339(),
        }
    }

    /// Pretty JSON (the stored form and the `manifest_json` of replies).
    pub fn to_json(&self) -> String {
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl From<&Block> for Artifact {
    fn from(b: &Block) -> Artifact {
        Artifact {
            index: b.index,
            lang: b.lang.clone(),
            declared_file: b.declared_file.clone(),
            workspace_path: b.workspace_path.clone(),
            bytes: b.bytes,
            sha256: b.sha256.clone(),
            status: b.status,
            reason: b.reason.clone(),
        }
    }
}

impl Summary {
    pub fn of(artifacts: &[Artifact]) -> Summary {
        let count = |s: BlockStatus| artifacts.iter().filter(|a| a.status == s).count() as u32;
        Summary {
            total_blocks: artifacts.len() as u32,
            written: count(BlockStatus::Written),
            skipped: count(BlockStatus::Skipped),
            rejected: count(BlockStatus::Rejected),
        }
    }
}

/// Severity of an ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Info,
    /// Format problems (malformed header, unterminated fence) or nothing to ingest.
    Warning,
    /// I/O failures, safety/validation refusals, limits, an unreachable store.
    Error,
}

impl Severity {
    /// The overall severity of these blocks: ERROR if any was rejected, else WARNING if any had
    /// a format problem or none was written, else INFO. Failures outside the blocks (store
    /// unreachable, manifest not stored) raise it to ERROR where they happen.
    pub fn of(blocks: &[Block]) -> Severity {
        if blocks.iter().any(|b| b.status == BlockStatus::Rejected) {
            Severity::Error
        } else if blocks.iter().all(|b| b.status != BlockStatus::Written)
            || blocks.iter().any(is_format_problem)
        {
            Severity::Warning
        } else {
            Severity::Info
        }
    }

    /// The severity of one block's event.
    pub fn of_block(block: &Block) -> Severity {
        match block.status {
            BlockStatus::Rejected => Severity::Error,
            BlockStatus::Skipped if is_format_problem(block) => Severity::Warning,
            _ => Severity::Info,
        }
    }

    #[cfg(feature = "service")]
    pub fn to_proto(self) -> cairn_proto::v1::Level {
        match self {
            Severity::Info => cairn_proto::v1::Level::Info,
            Severity::Warning => cairn_proto::v1::Level::Warning,
            Severity::Error => cairn_proto::v1::Level::Error,
        }
    }
}

fn is_format_problem(b: &Block) -> bool {
    b.status == BlockStatus::Skipped
        && (b.reason == reason::MALFORMED_HEADER || b.reason == reason::UNTERMINATED_FENCE)
}

/// Now as RFC 3339 UTC with milliseconds ("2026-01-01T00:00:00.000Z").
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(&fmt).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_exactly_the_seed_fields() {
        let m = Manifest::new(
            "r1",
            "n1",
            Source {
                kind: "graph_runtime".into(),
                mode: "single".into(),
                doc_path: "docs/a.md".into(),
            },
            &[],
        );
        let v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "artifacts",
                "node_id",
                "run_id",
                "source",
                "summary",
                "ts",
                "version"
            ]
        );
        assert_eq!(v["version"], "1");
        assert_eq!(v["summary"]["total_blocks"], 0);
        assert!(m.ts.ends_with('Z') && m.ts.len() == 24, "{}", m.ts);
    }
}
