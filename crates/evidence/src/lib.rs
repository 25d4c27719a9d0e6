//! The run's evidence index, `shared/evidence/index.json`, as a format: its entries (`file`,
//! `command`, `event_range`, each with an id `E<seq>` that never moves) and the
//! `evidence:<id>` citations notes and reports make of them. The orchestrator derives the
//! index from a run's events (cairn-node's `evidence`); readers such as the console parse it
//! and link citations with what is here.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The prefix that cites an entry in free text: `evidence:E42`.
pub const CITE_PREFIX: &str = "evidence:";

/// One entry of `shared/evidence/index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceEntry {
    /// `E<seq>`: the sequence number of the event it comes from.
    pub id: String,
    /// `file` | `command` | `event_range`.
    pub kind: String,
    /// What it names: the project path of a file; `step <step_key>` of a command;
    /// `events.jsonl#<from>-<to>` of an event range.
    pub source: String,
    /// Lower-case hex SHA-256: of a file's content; of the stored event line recording a
    /// command; of an event range's stored lines joined by `\n`.
    pub sha256: String,
    pub run: String,
    /// The node it belongs to ("" for none).
    pub node: String,
    /// The event that recorded it, and when.
    pub event: String,
    pub ts: String,
    /// What else identifies it: a file's `bytes`; a command's `exit_code`, `timed_out`,
    /// `runner`; an event range's `gate`, `decision`, `by`, `from_seq`, `to_seq`.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub detail: Map<String, Value>,
}

/// A JSON array of `entries`, one per line (`[]` when empty).
pub fn render(entries: &[EvidenceEntry]) -> String {
    if entries.is_empty() {
        return "[]\n".into();
    }
    let lines: Vec<String> = entries
        .iter()
        .map(|e| serde_json::to_string(e).unwrap_or_default())
        .collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

/// Reads index.json (`None` when it is not a list of entries).
pub fn parse(text: &str) -> Option<Vec<EvidenceEntry>> {
    serde_json::from_str(text).ok()
}

/// Where `text` cites entries: the byte range of each `evidence:<id>` and its id, in order
/// (an id is ASCII letters, digits, `-` and `_`).
pub fn citations(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    text.match_indices(CITE_PREFIX)
        .filter_map(|(i, _)| {
            let start = i + CITE_PREFIX.len();
            let rest = &text[start..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
                .unwrap_or(rest.len());
            (len > 0).then(|| (i..start + len, &rest[..len]))
        })
        .collect()
}

/// The ids `text` cites as `evidence:<id>`, in order, without repeats.
pub fn cited(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (_, id) in citations(text) {
        if !out.iter().any(|o| o == id) {
            out.push(id.to_owned());
        }
    }
    out
}
