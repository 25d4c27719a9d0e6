//! The verdict on runs of a code delivery node: what one life draws afresh (run id, session
//! id, container name, times) is left out; what the node did (tool results, archive bytes) is
//! compared.
#![allow(clippy::unwrap_used)]

use super::*;

/// What one run of the node did.
struct Life<'a> {
    run: &'a str,
    session: &'a str,
    duration_ms: u64,
    stdout: &'a str,
    archive: &'a [u8],
}

fn event(n: u64, run: &str, ty: &str, data: Value) -> pb::Event {
    pb::Event {
        seq: n,
        ts: format!("2026-11-29T14:00:{:02}.{:03}Z", n, n * 7),
        r#type: ty.into(),
        run_id: run.into(),
        node_id: if ty.starts_with("task.") || ty.starts_with("run.") {
            String::new()
        } else {
            "deliver".into()
        },
        data_json: data.to_string(),
        ..Default::default()
    }
}

fn side(l: &Life<'_>) -> Side {
    let run = l.run;
    let archive = format!("docs/artifacts/{run}/wordcount.zip");
    let sha = sha256_hex(l.archive);
    let outputs = json!({
        "archive_path": archive, "sha256": sha, "size_bytes": l.archive.len(),
        "location": format!("delivered/{run}/wordcount.zip"), "session_id": l.session,
        "iterations": 2, "tool_calls": 2,
    });
    let events = [
        ("task.created", json!({"by": "tester"})),
        ("node.started", json!({"attempt": 1})),
        (
            "code_delivery.session_opened",
            json!({"session_id": l.session, "container_name": format!("cairn_{}_runner", l.session),
                   "backend": "local", "runner": format!("runner-{}", l.session)}),
        ),
        (
            "code_delivery.tool_call",
            json!({"step": 1, "call_id": "call_1", "tool": "run_bash_command",
                   "result": json!({"exit_code": 0, "stdout": l.stdout}).to_string(),
                   "ok": true, "duration_ms": l.duration_ms}),
        ),
        (
            "code_delivery.delivered",
            json!({"archive": archive, "sha256": sha, "size_bytes": l.archive.len()}),
        ),
        (
            "code_delivery.session_closed",
            json!({"session_id": l.session, "closed": true}),
        ),
        ("artifact.written", json!({"path": archive, "sha256": sha})),
        ("node.completed", json!({"attempt": 1, "outputs": outputs})),
        ("run.completed", json!({})),
    ];
    Side {
        run_id: run.into(),
        state: "completed".into(),
        error: String::new(),
        graph: json!({"nodes": [{"id": "deliver", "type": "code_delivery"}]}),
        vars: BTreeMap::new(),
        events: events
            .into_iter()
            .enumerate()
            .map(|(i, (t, d))| event(i as u64 + 1, run, t, d))
            .collect(),
        files: [(
            archive,
            FileSeen {
                sha256: sha,
                bytes: Some(l.archive.to_vec()),
            },
        )]
        .into(),
    }
}

/// A zip's first bytes: not UTF-8 text, so compared by hash alone.
const ZIP: &[u8] = b"PK\x03\x04\x14\x00\x08\x08\xff\xfe archive";

fn recorded() -> Life<'static> {
    Life {
        run: "01RECORDEDRUN",
        session: "cd-0a1b",
        duration_ms: 41,
        stdout: "all tests passed\n",
        archive: ZIP,
    }
}

fn verdict_of(a: &Life<'_>, b: &Life<'_>) -> Value {
    let (a, b) = (side(a), side(b));
    verdict(&a, &b, &diff(&a, &b))
}

#[test]
fn session_ids_container_names_and_durations_of_another_life_are_identical() {
    let replay = Life {
        run: "01REPLAYRUN",
        session: "cd-9f8e7d",
        duration_ms: 1730,
        ..recorded()
    };
    let v = verdict_of(&recorded(), &replay);
    assert_eq!(v["verdict"], "identical", "{v:#}");
}

#[test]
fn a_different_tool_result_diverges_at_the_node_events() {
    let replay = Life {
        run: "01REPLAYRUN",
        stdout: "expected 3 words, got 4\n",
        ..recorded()
    };
    let v = verdict_of(&recorded(), &replay);
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "deliver");
    assert_eq!(v["divergence"]["what"], "events");
    let diff = v["divergence"]["diff"].as_str().unwrap();
    assert!(diff.contains("got 4"), "{diff}");
}

#[test]
fn archive_bytes_that_differ_diverge_even_when_only_a_time_changed() {
    // The same entries with another entry time: other bytes, another hash.
    let mut other = ZIP.to_vec();
    other[10] = 0x21;
    let replay = Life {
        run: "01REPLAYRUN",
        archive: &other,
        ..recorded()
    };
    let v = verdict_of(&recorded(), &replay);
    assert_eq!(v["verdict"], "diverged", "{v:#}");
    assert_eq!(v["divergence"]["node"], "deliver");
    assert_eq!(v["divergence"]["what"], "outputs");
    // The report names the file as differing too.
    let (a, b) = (side(&recorded()), side(&replay));
    let report = diff(&a, &b);
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{report:#}");
    assert_eq!(files[0]["path"], "docs/artifacts/⟨run_id⟩/wordcount.zip");
    assert_eq!(files[0]["same"], false);
}
