//! First use on a fresh data root (no project made beforehand): commands that need a project
//! create it, `cairn project create|list` exist for explicit use, and errors speak CLI.
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn;

use predicates::prelude::*;

#[test]
fn project_create_and_list_on_a_fresh_data_root() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    cairn(&data)
        .args(["project", "list"])
        .assert()
        .success()
        .stdout(predicate::str::contains("no projects yet"));
    cairn(&data)
        .args(["project", "create", "alpha"])
        .assert()
        .success()
        .stdout("created project alpha\n");
    // Again: left as it is, still a success (scripts may run it every time).
    cairn(&data)
        .args(["project", "create", "alpha"])
        .assert()
        .success()
        .stdout("project alpha already exists\n");
    let out = cairn(&data)
        .args(["--json", "project", "list"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["project_id"], "alpha");
    // A bad id is refused with what to fix.
    cairn(&data)
        .args(["project", "create", "a/b"])
        .assert()
        .failure();
}

#[test]
fn reading_a_project_that_does_not_exist_names_cli_commands() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // `runs list` of a project not made yet is an empty list (first use just works).
    cairn(&data)
        .args(["-p", "nothere", "--json", "runs", "list"])
        .assert()
        .success()
        .stdout("[]\n");
    {
        let args = ["-p", "nothere", "store", "ls"];
        cairn(&data).args(args).assert().failure().stderr(
            predicate::str::contains("cairn project create")
                .and(predicate::str::contains("nothere"))
                .and(predicate::str::contains("CreateProject").not())
                .and(predicate::str::contains("create_project").not()),
        );
    }
}

#[test]
fn writing_commands_create_their_project() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "```python file=hello.py\nprint(1)\n```\n").unwrap();
    // ingest on a fresh data root: its project is made on first use.
    cairn(&data)
        .args(["-p", "fresh", "ingest"])
        .arg(&doc)
        .assert()
        .success();
    cairn(&data)
        .args(["-p", "fresh", "store", "ls", "workspace"])
        .assert()
        .success()
        .stdout(predicate::str::contains("hello.py"));
}

/// Limits in words: a document over the ingest limits is refused with its size, the limit and
/// the setting, never a transport error.
#[test]
fn an_oversized_document_is_refused_with_the_limit_and_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Over what one request can carry: refused before sending.
    let huge = dir.path().join("huge.md");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(40 << 20).unwrap();
    cairn(&data)
        .arg("ingest")
        .arg(&huge)
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("41943040 bytes")
                .and(predicate::str::contains("max_document_bytes"))
                .and(predicate::str::contains("decoded message").not()),
        );
    // Over the service's document limit but sendable: the service refuses to parse it.
    let big = dir.path().join("big.md");
    std::fs::write(&big, vec![b'x'; (16 << 20) + 1]).unwrap();
    cairn(&data)
        .arg("ingest")
        .arg(&big)
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("16777217 bytes")
                .and(predicate::str::contains("max_document_bytes")),
        );
}

/// `--json` with ingest disabled prints JSON, not an empty line.
#[test]
fn ingest_json_is_json_even_when_nothing_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "no fences here\n").unwrap();
    let out = cairn(&data)
        .args(["--json", "ingest"])
        .arg(&doc)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v.is_object());
}
