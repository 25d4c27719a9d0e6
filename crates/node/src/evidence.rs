//! The run's evidence index, `shared/evidence/index.json`: one entry for each thing a person or
//! an agent may point at when they justify a decision. Entries are derived from the run's
//! stored events, so the index says nothing its events.jsonl does not:
//!
//! - `file`: a file a node wrote (`artifact.written`) or ingest wrote from a code block
//!   (`ingest.block.written`); `sha256` is the file's content digest.
//! - `command`: a sandbox run (`sandbox_complete` / `sandbox_failed`); `sha256` is the digest of
//!   the stored event line that records it.
//! - `event_range`: a gate decision with everything the run recorded while the gate waited, from
//!   its `gate.blocked` to the `gate.approved` / `gate.rejected`; `sha256` is the digest of those
//!   stored lines joined by `\n`.
//!
//! An entry's id is `E<seq>`, the sequence number of the event it comes from. Stored sequence
//! numbers never change, so an id cited as `evidence:E42` in a gate note or a report keeps
//! naming the same thing for the life of the run.

use std::collections::HashMap;

use cairn_proto::v1::Event;
use serde_json::{Map, Value};

use crate::events as ev;
pub use cairn_evidence::{citations, cited, parse, render, EvidenceEntry, CITE_PREFIX};

/// The index as it grows: feed it the run's stored events in order.
#[derive(Debug, Default)]
pub struct Index {
    run: String,
    entries: Vec<EvidenceEntry>,
    /// Gates waiting for a decision: where their range starts and the digest so far.
    open: HashMap<String, (u64, cairn_sha256::Sha256)>,
    /// The last sequence number fed in (the next read starts after it).
    pub last_seq: u64,
}

impl Index {
    pub fn new(run: &str) -> Index {
        Index {
            run: run.to_owned(),
            ..Index::default()
        }
    }

    pub fn entries(&self) -> &[EvidenceEntry] {
        &self.entries
    }

    /// Takes one stored event. Events a writer may not emit (see `may_emit`) and events seen
    /// before are left out.
    pub fn observe(&mut self, e: &Event) {
        if e.seq <= self.last_seq {
            return;
        }
        self.last_seq = e.seq;
        let data: Map<String, Value> = serde_json::from_str(&e.data_json).unwrap_or_default();
        let identity = data.get("identity").and_then(Value::as_str);
        if !cairn_server::events::may_emit(identity, &e.r#type) {
            return;
        }
        let line = line_of(e);
        for (_, hash) in self.open.values_mut() {
            hash.update(b"\n");
            hash.update(line.as_bytes());
        }
        let text = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or_default();
        let mut detail = Map::new();
        let (kind, source, sha256) = match e.r#type.as_str() {
            ev::ARTIFACT_WRITTEN | "ingest.block.written" => {
                if text("path").is_empty() {
                    return;
                }
                if let Some(b) = data.get("bytes") {
                    detail.insert("bytes".into(), b.clone());
                }
                ("file", text("path").to_owned(), text("sha256").to_owned())
            }
            ev::SANDBOX_COMPLETE | ev::SANDBOX_FAILED => {
                for k in ["exit_code", "timed_out", "runner", "request_id"] {
                    if let Some(v) = data.get(k) {
                        detail.insert(k.into(), v.clone());
                    }
                }
                let source = match text("step_key") {
                    "" => format!("sandbox {}", text("request_id")),
                    key => format!("step {key}"),
                };
                ("command", source, cairn_sha256::sha256_hex(line.as_bytes()))
            }
            ev::GATE_BLOCKED => {
                let gate = gate_of(e, &data);
                let mut hash = cairn_sha256::Sha256::new();
                hash.update(line.as_bytes());
                self.open.insert(gate, (e.seq, hash));
                return;
            }
            ev::GATE_APPROVED | ev::GATE_REJECTED => {
                let gate = gate_of(e, &data);
                let Some((from, hash)) = self.open.remove(&gate) else {
                    return; // a decision without its wait (a log cut short): nothing to range over
                };
                let decision = if e.r#type == ev::GATE_APPROVED {
                    "approved"
                } else {
                    "rejected"
                };
                detail.insert("gate".into(), gate.into());
                detail.insert("decision".into(), decision.into());
                detail.insert("by".into(), text("by").into());
                detail.insert("from_seq".into(), from.into());
                detail.insert("to_seq".into(), e.seq.into());
                let source = format!("events.jsonl#{from}-{}", e.seq);
                ("event_range", source, hash.finish_hex())
            }
            _ => return,
        };
        self.entries.push(EvidenceEntry {
            id: format!("E{}", e.seq),
            kind: kind.to_owned(),
            source,
            sha256,
            run: self.run.clone(),
            node: e.node_id.clone(),
            event: e.r#type.clone(),
            ts: e.ts.clone(),
            detail,
        });
    }

    /// index.json: a JSON array, one entry per line.
    pub fn render(&self) -> String {
        render(&self.entries)
    }
}

fn gate_of(e: &Event, data: &Map<String, Value>) -> String {
    data.get("gate_id")
        .and_then(Value::as_str)
        .filter(|g| !g.is_empty())
        .unwrap_or(&e.node_id)
        .to_owned()
}

/// The stored line (a stream that left it out: the fields that make it up).
fn line_of(e: &Event) -> String {
    if !e.line_json.is_empty() {
        return e.line_json.clone();
    }
    serde_json::json!({"seq": e.seq, "ts": e.ts, "type": e.r#type, "node_id": e.node_id, "data": e.data_json})
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, kind: &str, node: &str, data: Value) -> Event {
        let data_json = data.to_string();
        Event {
            seq,
            ts: format!("2026-11-29T00:00:{seq:02}Z"),
            r#type: kind.into(),
            run_id: "r1".into(),
            node_id: node.into(),
            level: 0,
            line_json: format!(r#"{{"seq":{seq},"type":"{kind}","data":{data_json}}}"#),
            data_json,
        }
    }

    fn gated_run() -> Vec<Event> {
        vec![
            event(1, "task.created", "", serde_json::json!({})),
            event(
                2,
                "artifact.written",
                "draft",
                serde_json::json!({"path": "docs/a.md", "sha256": "aa", "bytes": 3, "identity": "orchestrator"}),
            ),
            event(
                3,
                "ingest.block.written",
                "draft",
                serde_json::json!({"path": "workspace/a.py", "sha256": "bb", "bytes": 9, "identity": "ingest"}),
            ),
            event(
                4,
                "sandbox_complete",
                "test",
                serde_json::json!({"step_key": "r1/test/1", "exit_code": 0, "runner": "r-a"}),
            ),
            event(
                5,
                "gate.blocked",
                "review",
                serde_json::json!({"gate_id": "review"}),
            ),
            event(
                6,
                "human.note",
                "",
                serde_json::json!({"text": "looks fine"}),
            ),
            event(
                7,
                "gate.approved",
                "review",
                serde_json::json!({"gate_id": "review", "by": "ann", "note": "ok per evidence:E4"}),
            ),
        ]
    }

    #[test]
    fn each_kind_comes_from_its_event_with_a_stable_id() {
        let mut index = Index::new("r1");
        for e in gated_run() {
            index.observe(&e);
        }
        let got: Vec<(&str, &str, &str)> = index
            .entries()
            .iter()
            .map(|e| (e.id.as_str(), e.kind.as_str(), e.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("E2", "file", "docs/a.md"),
                ("E3", "file", "workspace/a.py"),
                ("E4", "command", "step r1/test/1"),
                ("E7", "event_range", "events.jsonl#5-7"),
            ]
        );
        let e = index.entries();
        assert_eq!(e[0].sha256, "aa");
        assert_eq!(e[1].sha256, "bb");
        assert_eq!(
            e[2].sha256,
            cairn_sha256::sha256_hex(gated_run()[3].line_json.as_bytes())
        );
        let lines: Vec<String> = gated_run()[4..7]
            .iter()
            .map(|e| e.line_json.clone())
            .collect();
        assert_eq!(
            e[3].sha256,
            cairn_sha256::sha256_hex(lines.join("\n").as_bytes())
        );
        assert_eq!(e[3].detail["by"], "ann");
        assert_eq!(e[3].detail["decision"], "approved");
        assert_eq!(e[2].detail["exit_code"], 0);
        assert!(e.iter().all(|x| x.run == "r1"));
    }

    #[test]
    fn fed_in_two_halves_or_twice_it_is_the_same_index() {
        let all = gated_run();
        let mut whole = Index::new("r1");
        all.iter().for_each(|e| whole.observe(e));
        let mut halves = Index::new("r1");
        all[..5].iter().for_each(|e| halves.observe(e));
        all.iter().for_each(|e| halves.observe(e)); // a re-read from the start
        assert_eq!(whole.render(), halves.render());
        assert_eq!(halves.last_seq, 7);
    }

    #[test]
    fn a_forged_event_is_no_evidence() {
        let mut index = Index::new("r1");
        index.observe(&event(
            1,
            "artifact.written",
            "x",
            serde_json::json!({"path": "docs/fake.md", "sha256": "ff", "identity": "ingest"}),
        ));
        index.observe(&event(
            2,
            "gate.blocked",
            "g",
            serde_json::json!({"gate_id": "g"}),
        ));
        index.observe(&event(
            3,
            "gate.approved",
            "g",
            serde_json::json!({"gate_id": "g", "by": "mallory", "identity": "ingest"}),
        ));
        assert!(index.entries().is_empty(), "{:?}", index.entries());
    }

    #[test]
    fn it_renders_and_parses_back() {
        let mut index = Index::new("r1");
        assert_eq!(index.render(), "[]\n");
        gated_run().iter().for_each(|e| index.observe(e));
        let text = index.render();
        assert_eq!(text.lines().count(), 2 + 4);
        assert_eq!(parse(&text).unwrap(), index.entries());
        assert_eq!(parse("[]").unwrap(), vec![]);
        assert!(parse("{}").is_none());
    }

    #[test]
    fn citations_are_found_in_free_text() {
        assert_eq!(
            cited("see evidence:E4 and evidence:E12, again evidence:E4."),
            ["E4", "E12"]
        );
        assert!(cited("no evidence: here").is_empty());
        assert!(cited("").is_empty());
        let text = "(evidence:E4), evidence:E12.";
        let found: Vec<(&str, &str)> = citations(text)
            .into_iter()
            .map(|(r, id)| (&text[r], id))
            .collect();
        assert_eq!(found, [("evidence:E4", "E4"), ("evidence:E12", "E12")]);
    }
}
