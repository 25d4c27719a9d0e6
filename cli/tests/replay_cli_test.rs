//! `cairn runs replay` and `cairn runs diff` with embedded services: a recorded run replays
//! to `identical` (exit 0; `--json` is the verdict object), a changed variable diverges at the
//! first node whose request changed (exit 4, with the request diff), and `runs diff` reports
//! the two runs' files.
#![allow(clippy::unwrap_used)]

mod common;

use assert_cmd::Command;
use serde_json::Value;

fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = common::cairn_in_repo(data);
    cmd.args(["-p", "replay"]);
    cmd
}

fn record(data: &std::path::Path) {
    let out = cairn(data)
        .args([
            "--json",
            "run",
            "--mode",
            "self_critique",
            "--prompt",
            "Write a word-count tool",
            "--llm",
            "replay:examples/modes/self_critique.yaml",
            "--run-id",
            "sc1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_recorded_run_replays_identically_and_a_changed_prompt_diverges() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    record(&data);

    let out = cairn(&data)
        .args(["--json", "runs", "replay", "sc1"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["divergence", "replay_of", "run_id", "verdict"],
        "{v}"
    );
    assert_eq!(v["verdict"], "identical", "{v}");
    assert_eq!(v["replay_of"], "sc1");
    assert!(v["divergence"].is_null());
    let replayed = v["run_id"].as_str().unwrap().to_owned();

    let out = cairn(&data)
        .args(["runs", "replay", "sc1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == "identical"));

    let out = cairn(&data)
        .args([
            "runs",
            "replay",
            "sc1",
            "--var",
            "prompt=Write a line-count tool",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    assert!(
        stdout.contains("diverged at node `draft` attempt 1: request"),
        "{stdout}"
    );
    assert!(
        stdout.contains("-") && stdout.contains("+") && stdout.contains("line-count"),
        "{stdout}"
    );

    let out = cairn(&data)
        .args(["--json", "runs", "diff", "sc1", &replayed])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = report["files"].as_array().unwrap();
    assert!(!files.is_empty(), "{report}");
    assert!(files.iter().all(|f| f["same"] == true), "{report}");
    assert_eq!(report["graph"]["same"], true);
}

/// `runs replay --select` replays every run the filter names (never a replay), writes the
/// report as JSON and Markdown, and exits 0 when all are identical; a filter it cannot read
/// is a usage error.
#[test]
fn a_selection_of_runs_replays_into_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    record(&data);
    let out = cairn(&data)
        .args(["--json", "runs", "show", "sc1"])
        .output()
        .unwrap();
    let title = serde_json::from_slice::<Value>(&out.stdout).unwrap()["title"]
        .as_str()
        .unwrap()
        .to_owned();
    let report = dir.path().join("rep");
    let select = format!("graph='{title}' since=2000-01-01 state=completed limit=10");
    for round in 0..2 {
        let out = cairn(&data)
            .args(["--json", "runs", "replay", "--select", &select, "--report"])
            .arg(&report)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        // The first round's replay is not selected by the second.
        assert_eq!(v["totals"]["runs"], 1, "round {round}: {v:#}");
        assert_eq!(v["totals"]["identical"], 1, "{v:#}");
        assert_eq!(v["runs"][0]["run_id"], "sc1", "{v:#}");
        let file: Value =
            serde_json::from_slice(&std::fs::read(report.with_extension("json")).unwrap()).unwrap();
        assert_eq!(file, v);
        let md = std::fs::read_to_string(report.with_extension("md")).unwrap();
        assert!(md.contains("| sc1 |") && md.contains("identical"), "{md}");
    }
    let out = cairn(&data)
        .args(["runs", "replay", "--select", "colour=red"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key `colour`"), "{err}");
}
