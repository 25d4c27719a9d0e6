//! `cairn sandbox session ...` against the runner and store of `cairn up`: open, exec, pause
//! into the store under .cairn/snapshots/, resume and fork from there, close; the --json
//! shapes the help promises. Docker when the engine and image are there, else the local backend
//! `cairn up` picks; files-only snapshots either way.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;

/// The command's exit code and --json output.
fn run(data: &std::path::Path, addr: &str, args: &[&str]) -> (i32, serde_json::Value) {
    let out = cairn(data)
        .args(["--addr", addr, "--json", "sandbox", "session"])
        .args(args)
        .output()
        .unwrap();
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{args:?}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap(), value)
}

fn json(data: &std::path::Path, addr: &str, args: &[&str]) -> serde_json::Value {
    let (code, value) = run(data, addr, args);
    assert_eq!(code, 0, "{args:?}: {value}");
    value
}

#[test]
fn a_session_paused_into_the_store_resumes_and_forks_with_its_files() {
    if !sessions_here() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (_up, addr, _) = up(data.path(), &[]);
    let addr = addr.as_str();

    let opened = json(data.path(), addr, &["open"]);
    let id = opened["session_id"].as_str().unwrap().to_owned();
    assert!(opened["ms"].as_u64().is_some());
    let (code, exec) = run(
        data.path(),
        addr,
        &[
            "exec",
            &id,
            "--",
            "echo kept > /workspace/a.txt; echo out; echo err >&2; exit 3",
        ],
    );
    // The command's exit code is the CLI's.
    assert_eq!(code, 3);
    assert_eq!(exec["exit_code"], 3);
    assert_eq!(exec["stdout"], "out\n");
    assert_eq!(exec["stderr"], "err\n");

    let paused = json(data.path(), addr, &["pause", &id]);
    let snap = paused["snapshot"].as_str().unwrap().to_owned();
    assert_eq!(snap, format!(".cairn/snapshots/{id}/1.snap"));
    assert!(paused["bytes"].as_u64().unwrap() > 0);
    assert_eq!(paused["memory"], false);
    assert!(paused["ms"].as_u64().is_some());
    // Paused: the session is closed on its runner.
    let closed = json(data.path(), addr, &["close", &id]);
    assert_eq!(closed["closed"], false);

    let resumed = json(data.path(), addr, &["resume", &snap]);
    let new_id = resumed["session_id"].as_str().unwrap().to_owned();
    assert_ne!(new_id, id);
    let cat = json(
        data.path(),
        addr,
        &["exec", &new_id, "--", "cat /workspace/a.txt"],
    );
    assert_eq!(cat["stdout"], "kept\n");

    let forked = json(data.path(), addr, &["fork", &snap, "--count", "2"]);
    let forks = forked["sessions"].as_array().unwrap();
    assert_eq!(forks.len(), 2);
    for f in forks {
        let f = f.as_str().unwrap();
        let cat = json(
            data.path(),
            addr,
            &["exec", f, "--", "cat /workspace/a.txt"],
        );
        assert_eq!(cat["stdout"], "kept\n");
        assert_eq!(json(data.path(), addr, &["close", f])["closed"], true);
    }
    // The resumed session pauses under its own id.
    let again = json(data.path(), addr, &["pause", &new_id]);
    assert_eq!(
        again["snapshot"],
        format!(".cairn/snapshots/{new_id}/1.snap")
    );

    // Without a served runner the commands say what to give.
    let out = cairn(data.path())
        .args(["sandbox", "session", "open"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sandbox-addr"));
}

#[test]
fn a_pause_the_store_refuses_loses_neither_the_session_nor_its_snapshot() {
    if !sessions_here() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (_up, addr, _) = up_env(
        data.path(),
        &[("CAIRN_ARTIFACT_STORE_SNAPSHOTS_MAX_PROJECT_BYTES", "65536")],
    );
    let addr = addr.as_str();
    let id = open_and_run(
        data.path(),
        addr,
        "head -c 200000 /dev/urandom > /workspace/big.bin; echo kept > /workspace/a.txt",
    );
    let pause = |args: &[&str]| {
        let out = cairn(data.path())
            .args(["--addr", addr, "sandbox", "session", "pause"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "a snapshot past the quota is refused"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // Files only: the session is kept open until the store has the snapshot.
    let said = pause(&[&id, "--files-only"]);
    assert!(
        said.contains("snapshot_quota") || said.contains("quota"),
        "{said}"
    );
    assert!(said.contains("stays open"), "{said}");
    let cat = json(
        data.path(),
        addr,
        &["exec", &id, "--", "cat /workspace/a.txt"],
    );
    assert_eq!(
        cat["stdout"], "kept\n",
        "the refused pause left the session working"
    );

    // A pause that ends the session keeps the refused snapshot on this machine.
    let said = pause(&[&id]);
    let kept = said
        .split("kept at ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("the refusal names where the snapshot is kept: {said}"));
    let bytes = std::fs::read(kept).unwrap();
    assert!(bytes.len() > 200_000, "the whole snapshot is kept");
    assert!(
        bytes.starts_with(b"cairn-snapshot"),
        "it is a snapshot file"
    );
    std::fs::remove_file(kept).unwrap();
    assert!(
        walk_files(data.path())
            .iter()
            .all(|p| !p.to_string_lossy().contains(".cairn/snapshots/")),
        "nothing of either snapshot is in the store"
    );
}

#[test]
fn a_stored_snapshot_damaged_in_the_store_is_neither_resumed_nor_forked() {
    if !sessions_here() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (_up, addr, _) = up(data.path(), &[]);
    let addr = addr.as_str();
    let id = open_and_run(
        data.path(),
        addr,
        "head -c 300000 /dev/urandom > /workspace/blob",
    );
    let snap = json(data.path(), addr, &["pause", &id])["snapshot"]
        .as_str()
        .unwrap()
        .to_owned();
    let stored = walk_files(data.path())
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with(&snap))
        .expect("the snapshot is a file in the store's data root");
    // One byte of the payload flipped behind the store's back.
    let mut bytes = std::fs::read(&stored).unwrap();
    let at = bytes.len() - 2000;
    bytes[at] ^= 0x20;
    std::fs::write(&stored, &bytes).unwrap();
    for args in [vec!["resume", &snap], vec!["fork", &snap, "--count", "2"]] {
        let out = cairn(data.path())
            .args(["--addr", addr, "sandbox", "session"])
            .args(&args)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} of a damaged snapshot");
        assert!(said.contains("sha256"), "{args:?}: {said}");
        // Nothing half-resumed: the runner holds no session directory.
        let tasks = data.path().join("sandbox/tasks");
        let left: Vec<_> = std::fs::read_dir(&tasks)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

/// Whether sessions can run here (Docker with the image, or bubblewrap); says SKIP when not.
fn sessions_here() -> bool {
    let here = sandbox_available() || which_bwrap().is_some();
    if !here {
        println!("SKIP: session_cli: neither Docker with cairn-sandbox:latest nor bubblewrap");
    }
    here
}

/// Opens a session and runs `command` in it; returns the session's id.
fn open_and_run(data: &std::path::Path, addr: &str, command: &str) -> String {
    let id = json(data, addr, &["open"])["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    json(data, addr, &["exec", &id, "--", command]);
    id
}

fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn which_bwrap() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}
