//! `cairn certs init --split --owner`: the per-identity directories a deployment mounts.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;

use assert_cmd::Command;
use predicates::prelude::*;

fn cairn() -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env("RUST_LOG", "error");
    cmd
}

#[test]
fn certs_init_split_owner_writes_one_directory_per_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pki");
    let me = std::fs::metadata(tmp.path()).unwrap();
    // Root (compose's `certs` service) gives the files to the services' user; anyone else
    // can give them only to themselves.
    let owner = if me.uid() == 0 {
        (10002, 10002)
    } else {
        (me.uid(), me.gid())
    };
    cairn()
        .args([
            "certs", "init", "--split", "--name", "ingest", "--name", "cli",
        ])
        .arg("--owner")
        .arg(format!("{}:{}", owner.0, owner.1))
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("ingest/ingest.key"));
    for id in ["ingest", "cli"] {
        let dir = out.join(id);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["ca.pem", &format!("{id}.key"), &format!("{id}.pem")]
        );
        for path in [
            dir.clone(),
            dir.join(format!("{id}.key")),
            out.join(format!("{id}.pem")),
        ] {
            let m = std::fs::metadata(&path).unwrap();
            assert_eq!((m.uid(), m.gid()), owner, "{}", path.display());
        }
        // The directory is a working --tls-dir for its identity.
        cairn()
            .args(["certs", "show"])
            .arg(dir.join(format!("{id}.pem")))
            .assert()
            .success()
            .stdout(predicate::str::contains(format!("identity: {id}")));
    }
    assert!(out.join("ca.key").is_file());
    assert!(!out.join("ingest/ca.key").exists() && !out.join("cli/ca.key").exists());

    // Run again at the next start: nothing written, nothing replaced.
    let before = std::fs::read(out.join("cli/cli.key")).unwrap();
    let ca = std::fs::read(out.join("ca.pem")).unwrap();
    let again = |names: &[&str]| {
        let mut cmd = cairn();
        cmd.args(["certs", "init", "--split", "--if-missing", "--owner"])
            .arg(format!("{}:{}", owner.0, owner.1));
        for n in names {
            cmd.args(["--name", n]);
        }
        cmd.arg("--out").arg(&out).assert().success()
    };
    again(&["ingest", "cli"]).stdout(predicate::str::is_empty());
    assert_eq!(std::fs::read(out.join("cli/cli.key")).unwrap(), before);

    // A start that asks for every identity (an upgrade added some): the same CA issues only
    // the missing ones.
    let written = again(&[]).get_output().stdout.clone();
    let written = String::from_utf8(written).unwrap();
    assert!(written.contains("etcd/etcd.key"), "{written}");
    assert!(written.contains("orchestrator.pem"), "{written}");
    assert!(
        !written.contains("cli.key") && !written.contains("ingest.pem"),
        "{written}"
    );
    assert_eq!(std::fs::read(out.join("cli/cli.key")).unwrap(), before);
    assert_eq!(std::fs::read(out.join("ca.pem")).unwrap(), ca);
    assert_eq!(std::fs::read(out.join("etcd/ca.pem")).unwrap(), ca);
    again(&[]).stdout(predicate::str::is_empty());
}

#[test]
fn certs_init_refuses_an_owner_that_is_not_uid_gid() {
    let tmp = tempfile::tempdir().unwrap();
    cairn()
        .args(["certs", "init", "--owner", "cairn", "--out"])
        .arg(tmp.path().join("pki"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("UID:GID"));
    assert!(!tmp.path().join("pki").exists());
}

/// `cairn certs show --json` of a certificate.
fn show(path: &std::path::Path) -> serde_json::Value {
    let out = cairn()
        .args(["--json", "certs", "show"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn certs_renew_reissues_every_identity_from_the_same_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pki");
    cairn()
        .args(["certs", "init", "--days", "2", "--out"])
        .arg(&out)
        .assert()
        .success();
    let ca = std::fs::read(out.join("ca.pem")).unwrap();
    let ca_key = std::fs::read(out.join("ca.key")).unwrap();
    let before = show(&out.join("orchestrator.pem"));
    cairn()
        .args(["certs", "renew", "--days", "90", "--dir"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("orchestrator.pem"))
        .stdout(predicate::str::contains("cli.pem"));
    assert_eq!(std::fs::read(out.join("ca.pem")).unwrap(), ca);
    assert_eq!(std::fs::read(out.join("ca.key")).unwrap(), ca_key);
    let after = show(&out.join("orchestrator.pem"));
    assert_eq!(after["identity"], "orchestrator");
    assert_eq!(after["names"], before["names"]);
    assert_ne!(after["not_after"], before["not_after"]);
    // A directory without a CA is refused with the reason.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    cairn()
        .args(["certs", "renew", "--dir"])
        .arg(&empty)
        .assert()
        .failure()
        .stderr(predicate::str::contains("ca.key"));
}
