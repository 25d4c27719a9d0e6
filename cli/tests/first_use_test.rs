//! First use on a fresh data root (no project made beforehand): commands that need a project
//! create it, `cairn project create|list` exist for explicit use, and errors speak CLI.
#![allow(clippy::unwrap_used)]

use assert_cmd::Command;
use predicates::prelude::*;

fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_PROJECT")
        .env("RUST_LOG", "error")
        .arg("--data-root")
        .arg(data);
    cmd
}

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
    for args in [
        vec!["-p", "nothere", "store", "ls"],
        vec!["-p", "nothere", "runs", "list"],
    ] {
        cairn(&data).args(&args).assert().failure().stderr(
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
