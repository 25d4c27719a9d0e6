//! People change a run's human-editable records (task.yaml's title, goal and notes,
//! shared/human-notes.md, shared/context-manifest.yaml) and every change is applied and recorded,
//! or refused with the command that does it: on a finished run too.
#![allow(clippy::unwrap_used)]

mod common;

use common::{cairn, events};
use sha2::{Digest, Sha256};

const GRAPH: &str = "version: 1\ntitle: Old title\ngoal: the first goal\nnodes:\n  - id: note\n    type: write_file\n    path: docs/edits/x.md\n    ingest: false\n    content: \"x\\n\"\n";

/// A data root with run r1 of GRAPH completed in project p.
fn finished_run() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = dir.path().join("graph.yaml");
    std::fs::write(&graph, GRAPH).unwrap();
    let out = cairn(&data)
        .args(["-p", "p", "--json", "run"])
        .arg(&graph)
        .args(["--run-id", "r1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["state"], "completed", "{info}");
    (dir, data)
}

fn get(data: &std::path::Path, path: &str) -> String {
    let out = cairn(data)
        .args(["-p", "p", "store", "get", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `cairn store put --overwrite` of `text` at `path`: the output.
fn put(
    dir: &std::path::Path,
    data: &std::path::Path,
    path: &str,
    text: &str,
) -> std::process::Output {
    let file = dir.join("edit.tmp");
    std::fs::write(&file, text).unwrap();
    cairn(data)
        .args(["-p", "p", "store", "put", "--overwrite"])
        .arg(&file)
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn a_finished_runs_title_changes_through_runs_edit_and_a_hand_edit_says_how() {
    let (dir, data) = finished_run();
    let task = get(&data, ".cairn/runs/r1/task.yaml");
    assert!(task.contains("title: Old title"), "{task}");

    // A hand edit of a finished run's task.yaml would never be applied: refused, naming the
    // command that does it, and nothing written.
    let out = put(
        dir.path(),
        &data,
        ".cairn/runs/r1/task.yaml",
        &task.replace("Old title", "Hand title"),
    );
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cairn runs edit"), "{stderr}");
    assert_eq!(
        get(&data, ".cairn/runs/r1/task.yaml"),
        task,
        "nothing written"
    );

    // cairn runs edit: recorded with who, and shown everywhere.
    let out = cairn(&data)
        .args([
            "-p",
            "p",
            "--json",
            "runs",
            "edit",
            "r1",
            "--title",
            "New title",
        ])
        .args(["--goal", "a better goal", "--note", "note=looked at it"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["title"], "New title", "{info}");
    assert_eq!(
        info["state"], "completed",
        "an edit does not move the run: {info}"
    );
    let task = get(&data, ".cairn/runs/r1/task.yaml");
    assert!(
        task.contains("title: New title") && task.contains("goal: a better goal"),
        "{task}"
    );
    assert!(task.contains("note: looked at it"), "{task}");
    let state: serde_json::Value =
        serde_json::from_str(&get(&data, ".cairn/runs/r1/state.json")).unwrap();
    assert_eq!(state["title"], "New title", "{state}");
    assert!(get(&data, ".cairn/runs/r1/README.md").contains("New title"));
    let out = cairn(&data)
        .args(["-p", "p", "--json", "runs", "list"])
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["title"], "New title", "the run list: {list}");
    let edited: Vec<_> = events(&data, "p", "r1")
        .into_iter()
        .filter(|e| e["type"] == "task.edited")
        .collect();
    assert_eq!(edited.len(), 1, "{edited:?}");
    assert!(
        edited[0]["by"].as_str().is_some_and(|b| !b.is_empty()),
        "{edited:?}"
    );
    let fields: Vec<&str> = edited[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["title", "goal", "milestone_note"]);

    // The same edit again changes nothing and records nothing.
    cairn(&data)
        .args(["-p", "p", "runs", "edit", "r1", "--title", "New title"])
        .assert()
        .success();
    assert_eq!(
        events(&data, "p", "r1")
            .iter()
            .filter(|e| e["type"] == "task.edited")
            .count(),
        1
    );

    // Wrong input: exit 2 with a hint, nothing recorded.
    for args in [
        vec!["runs", "edit", "r1"],
        vec!["runs", "edit", "r1", "--note", "nope=x"],
        vec!["runs", "edit", "r1", "--note", "no equals sign"],
        vec!["runs", "edit", "r1", "--title", " "],
    ] {
        let out = cairn(&data).args(["-p", "p"]).args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("hint: "),
            "{args:?}"
        );
    }
    let out = cairn(&data)
        .args(["-p", "p", "runs", "edit", "r1", "--note", "nope=x"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("note"),
        "names the milestones"
    );
    assert_eq!(
        events(&data, "p", "r1")
            .iter()
            .filter(|e| e["type"] == "task.edited")
            .count(),
        1
    );
}

#[test]
fn the_context_manifest_changes_only_checked_and_recorded() {
    let (dir, data) = finished_run();
    let path = ".cairn/runs/r1/shared/context-manifest.yaml";
    let before = get(&data, path);
    let bad = "attachments:\n  - {id: a, kind: blob, path: docs/edits/x.md, reason: r}\n";
    // Straight through the store: refused, naming the command.
    let out = put(dir.path(), &data, path, bad);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cairn runs context"));
    assert_eq!(get(&data, path), before, "nothing written");

    // Through cairn runs context: checked (a bad kind is named), then recorded.
    let file = dir.path().join("manifest.yaml");
    std::fs::write(&file, bad).unwrap();
    let out = cairn(&data)
        .args(["-p", "p", "runs", "context", "r1"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("kind"));
    assert_eq!(get(&data, path), before, "nothing written");

    let good = "attachments:\n  - {id: a, kind: file, path: docs/edits/x.md, reason: the output}\n";
    std::fs::write(&file, good).unwrap();
    cairn(&data)
        .args(["-p", "p", "runs", "context", "r1"])
        .arg(&file)
        .assert()
        .success();
    assert_eq!(get(&data, path), good);
    let out = cairn(&data)
        .args(["-p", "p", "runs", "context", "r1"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        good,
        "prints the manifest"
    );
    assert!(events(&data, "p", "r1")
        .iter()
        .any(|e| e["type"] == "context.edited"));
}

#[test]
fn a_hand_edit_of_the_human_notes_is_an_event_with_its_digest() {
    let (dir, data) = finished_run();
    let path = ".cairn/runs/r1/shared/human-notes.md";
    let text = format!("{}\nDo not touch the public API.\n", get(&data, path));
    let out = put(dir.path(), &data, path, &text);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let edited: Vec<_> = events(&data, "p", "r1")
        .into_iter()
        .filter(|e| e["type"] == "notes.edited")
        .collect();
    assert_eq!(edited.len(), 1, "{edited:?}");
    assert_eq!(
        edited[0]["sha256"],
        hex::encode(Sha256::digest(text.as_bytes()))
    );
    assert_eq!(edited[0]["bytes"], text.len());
    assert_eq!(edited[0]["path"], "shared/human-notes.md");
    assert!(edited[0]["by"].as_str().is_some_and(|b| !b.is_empty()));
    // The same bytes again are no edit.
    put(dir.path(), &data, path, &text);
    assert_eq!(
        events(&data, "p", "r1")
            .iter()
            .filter(|e| e["type"] == "notes.edited")
            .count(),
        1
    );
}
