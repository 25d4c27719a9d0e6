//! `cairn certs` and mutual TLS from the command line: a PKI made by `cairn certs init`, `cairn
//! up --tls-dir` serving it, CLI commands reaching it only with the `cli` certificate, the
//! store recording who appended each event, and plaintext refused beyond loopback.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use predicates::prelude::*;

mod common;

use common::{free_port, Killed};

fn cairn() -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_TLS_DIR")
        .env_remove("CAIRN_PROJECT")
        .env("RUST_LOG", "error");
    cmd
}

#[test]
fn certs_init_show_and_if_missing() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    cairn()
        .args(["certs", "init", "--out"])
        .arg(&pki)
        .args(["--dns", "cairn.internal"])
        .assert()
        .success()
        .stdout(predicate::str::contains("orchestrator.key"));
    cairn()
        .args(["--json", "certs", "show"])
        .arg(pki.join("ingest.pem"))
        .assert()
        .success()
        .stdout(predicate::str::is_match(r#""identity":\s*"ingest""#).unwrap())
        .stdout(predicate::str::contains("cairn.internal"));
    // Never replaced silently; --if-missing makes a re-run at every start harmless.
    cairn()
        .args(["certs", "init", "--out"])
        .arg(&pki)
        .assert()
        .failure()
        .stderr(predicate::str::contains("already exists"));
    let before = std::fs::read(pki.join("ca.pem")).unwrap();
    cairn()
        .args(["certs", "init", "--if-missing", "--out"])
        .arg(&pki)
        .assert()
        .success();
    assert_eq!(std::fs::read(pki.join("ca.pem")).unwrap(), before);
    // A new identity from the same CA.
    cairn()
        .args(["certs", "init", "--name", "reporter", "--out"])
        .arg(&pki)
        .assert()
        .success();
    assert_eq!(std::fs::read(pki.join("ca.pem")).unwrap(), before);
    assert!(pki.join("reporter.key").exists());
}

#[test]
fn plaintext_beyond_loopback_refuses_to_start() {
    for args in [
        vec!["serve", "artifact-store", "--listen", "10.20.30.40:7070"],
        vec!["up", "--listen", "0.0.0.0:7070", "--no-console"],
    ] {
        cairn()
            .args(&args)
            .arg("--data-root")
            .arg(tempfile::tempdir().unwrap().path())
            .timeout(Duration::from_secs(60))
            .assert()
            .failure()
            .stderr(predicate::str::contains("--tls-dir"))
            .stderr(predicate::str::contains("--insecure-listen"));
    }
}

#[test]
fn cairn_up_over_mutual_tls_serves_only_certificate_holders() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    cairn()
        .args(["certs", "init", "--out"])
        .arg(&pki)
        .assert()
        .success();
    let addr = format!("127.0.0.1:{}", free_port());
    let up = Killed(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
            .env_remove("CAIRN_ADDR")
            .env("RUST_LOG", "warn")
            .args(["up", "--no-console", "--listen", &addr, "--tls-dir"])
            .arg(&pki)
            .arg("--data-root")
            .arg(dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = cairn()
            .args(["health", "--addr", &addr, "--tls-dir"])
            .arg(&pki)
            .timeout(Duration::from_secs(20))
            .output()
            .unwrap()
            .status
            .success();
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "cairn up never became healthy");
        std::thread::sleep(Duration::from_millis(300));
    }
    let local = dir.path().join("a.md");
    std::fs::write(&local, "hello\n").unwrap();
    cairn()
        .args(["--addr", &addr, "store", "put"])
        .arg(&local)
        .args(["docs/a.md", "--tls-dir"])
        .arg(&pki)
        .assert()
        .success();
    // Without the certificate: no connection, nothing written.
    cairn()
        .args(["--addr", &addr, "store", "put"])
        .arg(&local)
        .arg("docs/b.md")
        .timeout(Duration::from_secs(30))
        .assert()
        .failure();
    cairn()
        .args(["--addr", &addr, "store", "ls", "docs", "--tls-dir"])
        .arg(&pki)
        .assert()
        .success()
        .stdout(predicate::str::contains("a.md"))
        .stdout(predicate::str::contains("b.md").not());
    // An ingest through the embedded services over mTLS: ingest writes under the claim the CLI
    // took, and every event it appended names it.
    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "```python file=hello.py\nprint(1)\n```\n").unwrap();
    cairn()
        .args(["--addr", &addr, "ingest", "--run", "manual-1", "--tls-dir"])
        .arg(&pki)
        .arg(&doc)
        .assert()
        .success()
        .stdout(predicate::str::contains("written"));
    let out = cairn()
        .args([
            "--addr",
            &addr,
            "--json",
            "store",
            "events",
            "manual-1",
            "--tls-dir",
        ])
        .arg(&pki)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!events.is_empty());
    for e in &events {
        assert_eq!(e["identity"], "ingest", "{e}");
    }
    drop(up);
}
