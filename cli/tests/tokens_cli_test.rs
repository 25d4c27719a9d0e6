//! `cairn tokens add|list|remove` (the tokens file: hashes only, the token printed once) and
//! `--token` / `CAIRN_TOKEN` sent as bearer to an orchestrator that has a tokens file, both
//! embedded and through `cairn up --tokens-file`.
#![allow(clippy::unwrap_used)]

mod common;

use assert_cmd::Command;
use predicates::prelude::*;
use sha2::Digest;

fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_PROJECT")
        .env_remove("CAIRN_TOKEN")
        .env_remove("CAIRN_TOKENS_FILE")
        .env_remove("CAIRN_ORCHESTRATOR_AUTH_TOKENS_FILE")
        .env("RUST_LOG", "error")
        .arg("--data-root")
        .arg(data);
    cmd
}

/// `cairn tokens add NAME --role ROLE [--projects P]...`: the printed token.
fn add(
    data: &std::path::Path,
    file: &std::path::Path,
    name: &str,
    role: &str,
    projects: &[&str],
) -> String {
    let mut cmd = cairn(data);
    cmd.args(["tokens", "add", name, "--role", role, "--file"])
        .arg(file);
    for p in projects {
        cmd.args(["--projects", p]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token = stdout.trim().to_owned();
    assert_eq!(
        stdout.lines().count(),
        1,
        "only the token on stdout: {stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("once"),
        "says it is shown once"
    );
    token
}

#[test]
fn tokens_add_list_remove() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("tokens.toml");
    let token = add(&data, &file, "ann", "approver", &["web,api"]);
    assert!(
        token.starts_with("cairn_") && token.len() >= 6 + 32,
        "{token}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&token), "the token is not stored: {text}");
    assert!(
        text.contains(&hex::encode(sha2::Sha256::digest(token.as_bytes()))),
        "{text}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let second = add(&data, &file, "vic", "viewer", &[]);
    assert_ne!(token, second);

    cairn(&data)
        .args(["tokens", "add", "ann", "--role", "viewer", "--file"])
        .arg(&file)
        .assert()
        .failure()
        .stderr(predicate::str::contains("exists"));
    cairn(&data)
        .args(["tokens", "add", "root", "--role", "root", "--file"])
        .arg(&file)
        .assert()
        .failure()
        .stderr(predicate::str::contains("viewer"));

    // The file from the environment, JSON listing: names, roles, projects; no hashes.
    let out = cairn(&data)
        .env("CAIRN_TOKENS_FILE", &file)
        .args(["--json", "tokens", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["name"], "ann");
    assert_eq!(list[0]["role"], "approver");
    assert_eq!(list[0]["projects"], serde_json::json!(["api", "web"]));
    assert_eq!(list[1]["name"], "vic");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("sha256"));
    cairn(&data)
        .args(["tokens", "list", "--file"])
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("ann").and(predicate::str::contains("approver")));

    cairn(&data)
        .args(["tokens", "remove", "ann", "--file"])
        .arg(&file)
        .assert()
        .success();
    cairn(&data)
        .args(["tokens", "remove", "ann", "--file"])
        .arg(&file)
        .assert()
        .failure()
        .stderr(predicate::str::contains("no token named"));
    cairn(&data)
        .args(["tokens", "list", "--file"])
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::contains("ann").not());
}

#[test]
fn the_token_goes_to_the_embedded_orchestrator_as_bearer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("tokens.toml");
    let op = add(&data, &file, "ozzy", "operator", &[]);
    let viewer = add(&data, &file, "vic", "viewer", &[]);
    let with_file = || {
        let mut c = cairn(&data);
        c.env("CAIRN_ORCHESTRATOR_AUTH_TOKENS_FILE", &file);
        c
    };
    with_file()
        .args(["runs", "list"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("needs a token"));
    with_file()
        .args(["--token", "cairn_wrong", "runs", "list"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("the token is not known"));
    with_file()
        .args(["--token", &viewer, "runs", "list"])
        .assert()
        .success();
    with_file()
        .env("CAIRN_TOKEN", &viewer)
        .args(["runs", "list"])
        .assert()
        .success();
    let graph = dir.path().join("g.yaml");
    std::fs::write(
        &graph,
        "nodes:\n  - {id: a, type: write_file, path: 'docs/{{run_id}}/a.txt', content: a}\n",
    )
    .unwrap();
    with_file()
        .env("CAIRN_TOKEN", &viewer)
        .arg("run")
        .arg(&graph)
        .assert()
        .code(5)
        .stderr(predicate::str::contains("role"));
    with_file()
        .env("USER", "mallory")
        .args(["--token", &op, "run"])
        .arg(&graph)
        .args(["--run-id", "r1"])
        .assert()
        .success();
    let out = cairn(&data)
        .args(["--json", "store", "events", "r1"])
        .output()
        .unwrap();
    let created: serde_json::Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["type"] == "task.created")
        .unwrap();
    assert_eq!(created["by"], "ozzy", "{created}");
}

#[test]
fn cairn_up_takes_a_tokens_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("tokens.toml");
    let viewer = add(&data, &file, "vic", "viewer", &[]);
    let (up, addr, _) = common::up(&data, &["--tokens-file".as_ref(), file.as_os_str()]);
    cairn(&data)
        .args(["--addr", &addr, "runs", "list"])
        .assert()
        .code(5)
        .stderr(predicate::str::contains("needs a token"));
    cairn(&data)
        .args(["--addr", &addr, "--token", &viewer, "runs", "list"])
        .assert()
        .success();
    drop(up);
}
