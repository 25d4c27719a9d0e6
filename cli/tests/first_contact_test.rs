//! What a new user meets: one error style (`error:` + `hint:` in CLI words, or a JSON error
//! object), one exit-code table, quiet SIGPIPE, logs kept out of the terminal, and the
//! first-use refusals each fixed or explained.
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn;
use predicates::prelude::*;

/// stderr of a failed command: exactly `error: ...` and `hint: ...`, in CLI words.
fn assert_error_style(stderr: &str) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "two lines: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[1].starts_with("hint: "), "{stderr}");
    for api in [
        "[AlreadyExists",
        "NotFound",
        "Unavailable",
        "reason:",
        "=true",
        "Status {",
        "with List",
    ] {
        assert!(!stderr.contains(api), "no API words ({api}): {stderr}");
    }
}

#[test]
fn refusals_are_one_error_line_and_one_hint_with_their_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::write(&a, "a").unwrap();
    std::fs::write(&b, "b").unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&a)
        .arg("docs/x")
        .assert()
        .success();
    let out = cairn(&data)
        .args(["store", "put"])
        .arg(&b)
        .arg("docs/x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_error_style(&stderr);
    assert!(stderr.contains("--overwrite"), "{stderr}");
    // --json: the same failure as an object on stdout, with the reason word.
    let out = cairn(&data)
        .args(["--json", "store", "put"])
        .arg(&b)
        .arg("docs/x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["reason"], "exists");
    assert!(doc["error"]["hint"]
        .as_str()
        .unwrap()
        .contains("--overwrite"));
    // Not found: exit 3, and the hint names the CLI command.
    let out = cairn(&data)
        .args(["store", "get", "docs/nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_error_style(&stderr);
    assert!(stderr.contains("cairn store ls"), "{stderr}");
    // Usage: a path outside the project, exit 2.
    let out = cairn(&data)
        .args(["store", "put"])
        .arg(&a)
        .arg("../x")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Unavailable: exit 6.
    let out = cairn(&data)
        .args(["--addr", "127.0.0.1:1", "store", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(6));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_error_style(&stderr);
    assert!(stderr.contains("cairn up"), "{stderr}");
}

/// A command line clap refuses (a missing argument, an unknown flag) reads like every other
/// error: one `error:` line, one `hint:` with the usage, exit 2; `--json` gets the object.
#[test]
fn a_wrong_command_line_is_one_error_line_and_one_hint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cairn(&data).args(["store", "put"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_error_style(&stderr);
    assert!(
        stderr.contains("<PATH>") && stderr.contains("cairn store put --help"),
        "{stderr}"
    );
    let out = cairn(&data)
        .args(["--json", "runs", "list", "--nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["reason"], "usage");
    assert!(
        doc["error"]["message"].as_str().unwrap().contains("--nope"),
        "{doc}"
    );
    assert!(doc["error"]["hint"]
        .as_str()
        .unwrap()
        .contains("cairn runs list --help"));
    // Help is still help.
    let out = cairn(&data).args(["store", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
}

#[test]
fn sandbox_run_on_a_fresh_data_root_creates_its_project_and_explains_missing_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A missing input: not found, and the hint says how to upload it.
    let out = cairn(&data)
        .args([
            "sandbox",
            "run",
            "--code",
            "print(1)",
            "--input",
            "docs/data.csv",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_error_style(&stderr);
    assert!(
        stderr.contains("cairn store put data.csv docs/data.csv"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("does not exist"),
        "the project was created: {stderr}"
    );
    // An output prefix that goes up: no advice that cannot help.
    let out = cairn(&data)
        .args([
            "sandbox",
            "run",
            "--code",
            "print(1)",
            "--output-prefix",
            "../x",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_error_style(&stderr);
    assert!(!stderr.contains("widen with --allowed-prefix"), "{stderr}");
    if !common::sandbox_available() {
        println!("SKIP: sandbox run itself (no Docker image cairn-sandbox:latest)");
        return;
    }
    let fresh = dir.path().join("fresh");
    cairn(&fresh)
        .args([
            "sandbox",
            "run",
            "--language",
            "python",
            "--code",
            "print(1)",
        ])
        .assert()
        .success();
    // An output that is refused (other bytes there) fails the command, in plain words.
    let code = "open('/output/o.txt','w').write(open('/dev/urandom','rb').read(8).hex())";
    let run = |d: &std::path::Path| {
        cairn(d)
            .args(["sandbox", "run", "--run", "s1", "--code", code])
            .output()
            .unwrap()
    };
    assert!(run(&fresh).status.success());
    let out = run(&fresh);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("Some entity") && !stdout.contains("Status {"),
        "{stdout}"
    );
    assert!(stderr.contains("--overwrite"), "{stderr}");
}

#[test]
fn ingest_exit_codes_say_partial_and_too_large_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = dir.path().join("doc.md");
    std::fs::write(
        &doc,
        "```python file=src/a.py\nx\n```\n```python file=../b.py\ny\n```\n",
    )
    .unwrap();
    let out = cairn(&data).arg("ingest").arg(&doc).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "partial");
    // A document over the service's limit: one error, one hint, exit 5.
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "[ingest]\nmax_document_bytes = 20\n").unwrap();
    let out = cairn(&data)
        .arg("--config")
        .arg(&file)
        .arg("ingest")
        .arg(&doc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert_error_style(&stderr);
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let big = dir.path().join("big");
    std::fs::write(&big, "line\n".repeat(100_000)).unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&big)
        .arg("docs/big")
        .assert()
        .success();
    for args in [
        &["store", "ls", "-r"][..],
        &["store", "get", "docs/big"],
        &["project", "list"],
    ] {
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
            .env_remove("CAIRN_ADDR")
            .arg("--data-root")
            .arg(&data)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader went away before anything was written
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?} exits quietly: {stderr}");
        assert_eq!(out.status.signal(), Some(13), "{args:?}: ended by SIGPIPE");
    }
}

#[test]
fn embedded_services_log_to_a_file_not_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "```python file=../b.py\ny\n```\n").unwrap();
    let out = cairn(&data)
        .env("RUST_LOG", "info")
        .arg("ingest")
        .arg(&doc)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for level in [" INFO ", " WARN ", " ERROR "] {
        assert!(!stderr.contains(level), "{stderr}");
    }
    let log = std::fs::read_to_string(data.join("logs/cairn.log")).unwrap();
    assert!(log.contains("INFO"), "{log}");
    // -v names the file and shows the lines.
    let out = cairn(&data)
        .env("RUST_LOG", "info")
        .args(["-v", "store", "ls"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("logs: {}", data.join("logs/cairn.log").display())),
        "{stderr}"
    );
    assert!(stderr.contains(" INFO "), "{stderr}");
}

/// The first line `cairn ARGS` prints on stderr (within 30 s; the process is killed after).
fn first_stderr_line(args: &[&std::ffi::OsStr]) -> String {
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .env_remove("CAIRN_ADDR")
        .env("RUST_LOG", "error")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _killed = common::Killed(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap()
}

#[test]
fn following_a_run_without_events_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let line = first_stderr_line(&[
        "--data-root".as_ref(),
        data.as_os_str(),
        "store".as_ref(),
        "events".as_ref(),
        "NOPE".as_ref(),
        "--follow".as_ref(),
    ]);
    assert!(
        line.contains("NOPE") && line.contains("no events yet"),
        "{line}"
    );
}

#[test]
fn config_show_names_sources_and_refuses_conflicts_and_moved_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cairn(&data).args(["config", "show"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("data_root")).unwrap();
    assert!(
        line.ends_with("# flag"),
        "given as a flag by the helper: {line}"
    );
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .env_remove("CAIRN_DATA_ROOT")
        .current_dir(dir.path())
        .args(["config", "show"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("data_root")).unwrap();
    assert!(line.ends_with("# default"), "no flag given: {line}");
    let file = dir.path().join("c.toml");
    for (text, needle) in [
        (
            "[llm]\nmodel = \"a\"\n[orchestrator.llm]\nmodel = \"b\"\n",
            "both set `model`",
        ),
        ("[orchestrator]\ndocker_image = \"x\"\n", "[sandbox_runner]"),
    ] {
        std::fs::write(&file, text).unwrap();
        cairn(&data)
            .arg("--config")
            .arg(&file)
            .args(["config", "show"])
            .assert()
            .failure()
            .stderr(predicate::str::contains(needle));
    }
}

#[test]
fn a_config_file_is_checked_and_not_silently_ignored_with_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_up, addr, _) = common::up(&data, &[]);
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[sandbox_runnr]\nnetwork_allowed = true\n").unwrap();
    let out = cairn(&data)
        .args(["--addr", &addr, "--config"])
        .arg(&file)
        .args(["store", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a typo is an error");
    std::fs::write(&file, "[sandbox_runner]\nnetwork_allowed = true\n").unwrap();
    let out = cairn(&data)
        .args(["--addr", &addr, "--config"])
        .arg(&file)
        .args(["project", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("use their own configuration"), "{stderr}");
}

#[test]
fn runs_show_json_names_the_replica() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    cairn(&data)
        .args([
            "run", "--mode", "single", "--prompt", "p", "--run-id", "w", "--llm",
        ])
        .arg(format!(
            "replay:{}",
            root.join("examples/modes/single.yaml").display()
        ))
        .assert()
        .success();
    let out = cairn(&data)
        .args(["--json", "runs", "show", "w"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc.get("replica").is_some(), "{doc}");
}

#[test]
fn plaintext_to_a_tls_service_says_to_pass_tls_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let pki = dir.path().join("pki");
    cairn(&data)
        .args(["certs", "init", "--out"])
        .arg(&pki)
        .assert()
        .success();
    let (_up, addr, _) = common::up(&data, &["--tls-dir".as_ref(), pki.as_os_str()]);
    let out = cairn(&data)
        .args(["--addr", &addr, "project", "list"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert_error_style(&stderr);
    assert!(stderr.contains("--tls-dir"), "{stderr}");
}

#[test]
fn operations_doc_names_no_issue_numbers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    assert!(
        !text.contains("issue 7"),
        "docs state the rule, not an issue number"
    );
}

#[test]
fn an_llm_url_refused_by_a_server_says_to_name_a_provider() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_up, addr, _) = common::up(&data, &[]);
    let out = cairn(&data)
        .args(["--addr", &addr, "run", "--mode", "single", "--prompt", "p"])
        .args(["--llm", "openai:http://127.0.0.1:9/v1#m"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a flag to change: {stderr}");
    assert_error_style(&stderr);
    assert!(stderr.contains("--llm NAME"), "{stderr}");
}

/// The findings above hold against a served stack too (`cairn up`, `--addr`), not only with
/// embedded services: the same exit codes, one error and one hint, a created project, the
/// upload hint, no advice that cannot help, SIGPIPE, a follow that says it waits, and the
/// replica in `runs show --json`.
#[test]
fn the_first_contact_findings_hold_against_cairn_up() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (_up, addr, _) = common::up(&data, &[]);
    let client = || {
        let mut c = cairn(&dir.path().join("unused"));
        c.args(["--addr", &addr]);
        c
    };
    // A missing input: exit 3, the upload hint, the project made (not "does not exist").
    let out = client()
        .args([
            "sandbox",
            "run",
            "--code",
            "print(1)",
            "--input",
            "docs/data.csv",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_error_style(&stderr);
    assert!(
        stderr.contains("cairn store put data.csv docs/data.csv"),
        "{stderr}"
    );
    assert!(!stderr.contains("does not exist"), "{stderr}");
    // An output prefix that goes up: usage, and no advice that cannot help.
    let out = client()
        .args([
            "sandbox",
            "run",
            "--code",
            "print(1)",
            "--output-prefix",
            "../x",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_error_style(&stderr);
    assert!(!stderr.contains("widen with --allowed-prefix"), "{stderr}");
    // A document with a rejected block: partial, exit 4.
    let doc = dir.path().join("doc.md");
    std::fs::write(
        &doc,
        "```python file=src/a.py\nx\n```\n```python file=../b.py\ny\n```\n",
    )
    .unwrap();
    let out = client().arg("ingest").arg(&doc).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A reader that went away: ended by SIGPIPE, nothing printed.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
        .env_remove("CAIRN_ADDR")
        .args(["--addr", &addr, "store", "ls", "-r"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE");
    // Following a run with no events says so at once.
    let line = first_stderr_line(&[
        "--addr".as_ref(),
        addr.as_ref(),
        "store".as_ref(),
        "events".as_ref(),
        "NOPE".as_ref(),
        "--follow".as_ref(),
    ]);
    assert!(
        line.contains("NOPE") && line.contains("no events yet"),
        "{line}"
    );
    // A run's JSON names its replica.
    let cassette = common::repo_root().join("examples/modes/single.yaml");
    client()
        .args(["run", "--mode", "single", "--prompt", "p", "--run-id", "w"])
        .arg("--llm")
        .arg(format!("replay:{}", cassette.display()))
        .assert()
        .success();
    let out = client()
        .args(["--json", "runs", "show", "w"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc.get("replica").is_some(), "{doc}");
}
