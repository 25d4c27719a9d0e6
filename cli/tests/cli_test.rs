//! The `cairn` binary end to end, with embedded services over a temporary data root.
#![allow(clippy::unwrap_used)]

mod common;

use common::{cairn, events, repo_root};
use predicates::prelude::*;

fn event_types(data: &std::path::Path, project: &str, run: &str) -> Vec<String> {
    events(data, project, run)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn store_put_get_ls_stat_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let local = dir.path().join("notes.md");
    std::fs::write(&local, b"# notes\n\xff binary too\n").unwrap();

    cairn(&data)
        .args(["store", "put"])
        .arg(&local)
        .arg("docs/notes.md")
        .assert()
        .success()
        .stdout(predicate::str::starts_with("created docs/notes.md"));
    // Identical bytes again: idempotent.
    cairn(&data)
        .args(["store", "put"])
        .arg(&local)
        .arg("docs/notes.md")
        .assert()
        .success()
        .stdout(predicate::str::starts_with("unchanged"));

    let out = cairn(&data)
        .args(["store", "get", "docs/notes.md"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, std::fs::read(&local).unwrap());

    let back = dir.path().join("back.md");
    cairn(&data)
        .args(["store", "get", "docs/notes.md"])
        .arg(&back)
        .assert()
        .success();
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&local).unwrap()
    );

    let out = cairn(&data)
        .args(["--json", "store", "ls", "-r", "docs"])
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing[0]["path"], "docs/notes.md");
    assert_eq!(listing[0]["size_bytes"], 21);

    let out = cairn(&data)
        .args(["--json", "store", "stat", "docs/notes.md"])
        .output()
        .unwrap();
    let stat: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stat["kind"], "file");
    assert_eq!(stat["sha256"].as_str().unwrap().len(), 64);
}

#[test]
fn refusals_exit_nonzero_with_the_reason_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    std::fs::write(&a, b"a").unwrap();
    std::fs::write(&b, b"b").unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&a)
        .arg("docs/x")
        .assert()
        .success();
    cairn(&data)
        .args(["store", "put"])
        .arg(&b)
        .arg("docs/x")
        .assert()
        .code(5)
        .stderr(
            predicate::str::contains("already holds different bytes")
                .and(predicate::str::contains("hint: pass --overwrite")),
        );
    cairn(&data)
        .args(["store", "put"])
        .arg(&a)
        .arg("../escape")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("`..` components are not allowed"));
    cairn(&data)
        .args(["store", "put"])
        .arg(&a)
        .arg("workspace/.SSH/id_rsa")
        .assert()
        .code(5)
        .stderr(predicate::str::contains("denylist"));
    assert!(!dir.path().join("escape").exists());
    // The refused overwrite left the first bytes in place.
    let out = cairn(&data)
        .args(["store", "get", "docs/x"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"a");
    cairn(&data)
        .args(["store", "get", "docs/missing"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("nothing at \"docs/missing\""));
}

#[test]
fn unreachable_addr_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    cairn(dir.path())
        .args(["--addr", "127.0.0.1:1", "store", "ls"])
        .assert()
        .code(6)
        .stderr(predicate::str::contains(
            "could not reach cairn at 127.0.0.1:1",
        ));
}

#[test]
fn ingest_writes_blocks_and_prints_manifest_v1_json() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let doc = dir.path().join("doc.md");
    std::fs::write(
        &doc,
        "intro\n```python file=src/app.py\nprint('hi')\n```\n```bash file=../evil.sh\nrm -rf /\n```\n",
    )
    .unwrap();
    let out = cairn(&data)
        .args(["--json", "ingest"])
        .arg(&doc)
        .args(["--run", "r1", "--node", "n1"])
        .output()
        .unwrap();
    // One block rejected: a partial success.
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(manifest["version"], "1");
    assert_eq!(manifest["summary"]["written"], 1);
    assert_eq!(manifest["summary"]["rejected"], 1);
    assert_eq!(manifest["artifacts"][1]["reason"], "traversal");
    let out = cairn(&data)
        .args(["store", "get", "workspace/src/app.py"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"print('hi')\n");
    let out = cairn(&data)
        .args(["store", "get", ".cairn/runs/r1/ingest/n1.json"])
        .output()
        .unwrap();
    let stored: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stored, manifest, "the stored manifest is the printed one");
    // The run's events were appended and can be read back.
    let types = event_types(&data, "default", "r1");
    assert_eq!(types.first().map(String::as_str), Some("ingest.started"));
    assert_eq!(types.last().map(String::as_str), Some("ingest.completed"));
    // Dry run writes nothing.
    std::fs::write(&doc, "```python file=src/other.py\nx\n```\n").unwrap();
    cairn(&data)
        .args(["ingest", "--dry-run"])
        .arg(&doc)
        .assert()
        .success();
    cairn(&data)
        .args(["store", "stat", "workspace/src/other.py"])
        .assert()
        .code(3);
}

/// Docker or bubblewrap must be there for sandbox commands; CI (CAIRN_REQUIRE_DOCKER=1) insists.
fn sandbox_available() -> bool {
    let docker = std::process::Command::new("docker")
        .args(["image", "inspect", "cairn-sandbox:latest"])
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var("CAIRN_REQUIRE_DOCKER").as_deref() == Ok("1") {
        assert!(docker, "CAIRN_REQUIRE_DOCKER=1 but Docker or the cairn-sandbox:latest image is missing (run scripts/setup.sh)");
        return true;
    }
    let bwrap = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !docker && !bwrap {
        println!("SKIP: neither Docker with cairn-sandbox:latest nor bubblewrap is available");
    }
    docker || bwrap
}

/// The runner's policy reaches the embedded runner from the file and from the environment:
/// network and images it does not allow are refused, naming the setting.
#[test]
fn sandbox_run_network_and_image_follow_the_runner_policy() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    cairn(&data)
        .args(["project", "create", "default"])
        .assert()
        .success();
    let run = |config: Option<&std::path::Path>, env: &[(&str, &str)], extra: &[&str]| {
        let mut cmd = cairn(&data);
        if let Some(file) = config {
            cmd.arg("--config").arg(file);
        }
        cmd.envs(env.iter().copied())
            .args(["sandbox", "run", "--language", "sh", "--code", "echo ran"])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = run(None, &[], &["--network"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("network access is not allowed")
            && stderr.contains("hint: leave out --network")
            && stderr.contains("network_allowed = true"),
        "{stderr}"
    );
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "[sandbox_runner]\nnetwork_allowed = true\n").unwrap();
    let allowed = run(Some(&file), &[], &["--network"]);
    assert!(
        allowed.status.success() && String::from_utf8_lossy(&allowed.stdout).contains("ran"),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    let only_sandbox = [(
        "CAIRN_SANDBOX_RUNNER_ALLOWED_IMAGES",
        "cairn-sandbox:latest",
    )];
    let refused = run(None, &only_sandbox, &["--image", "cairn-toolchain:latest"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.status.code() == Some(2) && stderr.contains("is not allowed on this runner"),
        "{stderr}"
    );
    assert!(stderr.contains("allowed_images"), "{stderr}");
}

#[test]
fn sandbox_run_stages_inputs_and_stores_outputs_and_result() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let csv = dir.path().join("data.csv");
    std::fs::write(&csv, "a,b\n1,2\n").unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&csv)
        .arg("docs/input/data.csv")
        .assert()
        .success();
    let code = "d = open('/input/docs/input/data.csv').read()\nopen('/output/upper.txt', 'w').write(d.upper())\nprint('rows', d.count(chr(10)))";
    let out = cairn(&data)
        .args([
            "--json",
            "sandbox",
            "run",
            "--language",
            "python",
            "--input",
            "docs/input/data.csv",
            "--run",
            "sb1",
            "--code",
            code,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["run_id"], "sb1");
    assert_eq!(summary["exit_code"], 0);
    assert_eq!(summary["stdout"], "rows 2\n");
    assert_eq!(
        summary["written_files"][0]["path"],
        "docs/artifacts/sb1/upper.txt"
    );
    let out = cairn(&data)
        .args(["store", "get", "docs/artifacts/sb1/upper.txt"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"A,B\n1,2\n");
    let out = cairn(&data)
        .args(["store", "get", ".cairn/runs/sb1/sandbox/result.json"])
        .output()
        .unwrap();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["exit_code"], 0);
    let types = event_types(&data, "default", "sb1");
    assert_eq!(types, ["sandbox_start", "sandbox_complete"]);

    // Failing code: exit 1, sandbox_failed recorded.
    cairn(&data)
        .args([
            "sandbox",
            "run",
            "--language",
            "bash",
            "--run",
            "sb2",
            "--code",
            "echo oops >&2; exit 7",
        ])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("exit_code: 7"));
    assert_eq!(
        event_types(&data, "default", "sb2"),
        ["sandbox_start", "sandbox_failed"]
    );
}

#[test]
fn the_example_runs_to_completion_through_a_gate() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = repo_root().join("examples/hello/graph.yaml");
    // Without --approve-gates the run stops at the gate and says how to go on.
    let out = cairn(&data)
        .args(["-p", "hello", "run"])
        .arg(&graph)
        .args(["--run-id", "r1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("[input-required]"), "{stdout}");
    assert!(stdout.contains("cairn gate approve r1 approve"), "{stdout}");
    // The report is not there before the approval.
    cairn(&data)
        .args(["-p", "hello", "store", "stat", "docs/hello/r1/report.md"])
        .assert()
        .code(3);

    let out = cairn(&data)
        .args([
            "-p",
            "hello",
            "--json",
            "gate",
            "approve",
            "r1",
            "approve",
            "--note",
            "tests look fine",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["state"], "completed", "{info}");
    assert_eq!(info["gates"][0]["state"], "approved");

    let report = cairn(&data)
        .args(["-p", "hello", "store", "get", "docs/hello/r1/report.md"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&report.stdout);
    assert!(report.contains("tests look fine"), "{report}");
    assert!(report.contains("exit code 0"), "{report}");
    // Ingest turned the agent's fences into the workspace project the sandbox tested.
    let greeter = cairn(&data)
        .args(["-p", "hello", "store", "get", "workspace/hello/greeter.py"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&greeter.stdout).contains("def greet"));
    // The approval is an event with who and the note.
    let approved = events(&data, "hello", "r1")
        .into_iter()
        .find(|e| e["type"] == "gate.approved")
        .expect("gate.approved event");
    assert!(
        approved["by"].as_str().is_some_and(|b| !b.is_empty()),
        "{approved}"
    );

    // --approve-gates runs straight through.
    let out = cairn(&data)
        .args(["-p", "hello", "--json", "run"])
        .arg(&graph)
        .args(["--run-id", "r2", "--approve-gates"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["state"], "completed");
    let out = cairn(&data)
        .args([
            "-p",
            "hello",
            "--json",
            "runs",
            "list",
            "--state",
            "completed",
        ])
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 2);
    // No run stalled: --stalled lists none of them.
    let out = cairn(&data)
        .args(["-p", "hello", "--json", "runs", "list", "--stalled"])
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs, serde_json::json!([]), "{runs}");
}

#[test]
fn every_subcommand_has_working_help() {
    // clap checks argument conflicts (e.g. a global flag shadowing a service flag) only when a
    // command is built: ask each one for its help.
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--help"][..],
        &["up", "--help"],
        &["serve", "artifact-store", "--help"],
        &["serve", "ingest", "--help"],
        &["serve", "sandbox-runner", "--help"],
        &["serve", "orchestrator", "--help"],
        &["health", "--help"],
        &["store", "put", "--help"],
        &["store", "events", "--help"],
        &["ingest", "--help"],
        &["sandbox", "run", "--help"],
        &["run", "--help"],
        &["runs", "list", "--help"],
        &["gate", "approve", "--help"],
        &["notes", "add", "--help"],
        &["tokens", "add", "--help"],
        &["tokens", "list", "--help"],
        &["tokens", "remove", "--help"],
    ] {
        cairn(dir.path())
            .args(args)
            .assert()
            .success()
            .stdout(predicate::str::contains("Usage:"));
    }
}

/// Outputs may not land in the run records (.cairn/) nor in another run's artifacts: the
/// command refuses with the reason before anything runs or is recorded.
#[test]
fn sandbox_run_refuses_output_prefixes_outside_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let note = dir.path().join("note.md");
    std::fs::write(&note, "n\n").unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&note)
        .arg("docs/note.md")
        .assert()
        .success();
    let refused = [
        (
            vec!["--output-prefix", ".cairn/runs/x"],
            ".cairn/ holds the run records",
        ),
        (
            vec!["--output-prefix", ".cairn/runs/x/shared/"],
            ".cairn/ holds the run records",
        ),
        (
            vec!["--output-prefix", "docs/artifacts/other-run"],
            "another run's directory",
        ),
        (
            vec![
                "--allowed-prefix",
                ".cairn/",
                "--output-prefix",
                ".cairn/runs/sbx",
            ],
            ".cairn/ holds the run records",
        ),
        (
            vec!["--output-prefix", "docs/reports"],
            "is not under allowed_prefixes",
        ),
        (vec!["--output-prefix", "docs/../.cairn"], "output_prefix"),
    ];
    for (flags, reason) in refused {
        cairn(&data)
            .args(["sandbox", "run", "--run", "sbx", "--code", "print(1)"])
            .args(&flags)
            .assert()
            .failure()
            .stderr(predicate::str::contains(reason));
    }
    // Nothing ran: the run has no events.
    let out = cairn(&data)
        .args(["--json", "store", "events", "sbx"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"]["reason"], "not_found", "{doc}");
}

/// An explicit --allowed-prefix widens where outputs may land.
#[test]
fn sandbox_run_writes_under_an_allowed_prefix() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let note = dir.path().join("note.md");
    std::fs::write(&note, "n\n").unwrap();
    cairn(&data)
        .args(["store", "put"])
        .arg(&note)
        .arg("docs/note.md")
        .assert()
        .success();
    let out = cairn(&data)
        .args([
            "--json",
            "sandbox",
            "run",
            "--run",
            "sbw",
            "--allowed-prefix",
            "docs/reports/",
            "--output-prefix",
            "docs/reports/weekly",
            "--code",
            "open('/output/r.txt', 'w').write('ok')",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        summary["written_files"][0]["path"],
        "docs/reports/weekly/r.txt"
    );
}

/// `cairn runs logs` prints what a sandbox node printed, read back from the run directory by a
/// later command: stdout to stdout, stderr to stderr, and how the attempt ended.
#[test]
fn runs_logs_prints_a_nodes_output_and_how_it_ended() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = dir.path().join("graph.yaml");
    std::fs::write(
        &graph,
        "nodes:\n  - id: job\n    type: sandbox_run\n    language: python\n    allowed_prefixes: [\"docs/\"]\n    code: |\n      import sys\n      print('to stdout', flush=True)\n      print('to stderr', file=sys.stderr, flush=True)\n      sys.exit(3)\n",
    )
    .unwrap();
    cairn(&data)
        .arg("run")
        .arg(&graph)
        .args(["--run-id", "logs1"])
        .assert()
        .failure();
    let out = cairn(&data)
        .args(["runs", "logs", "logs1", "--node", "job"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.starts_with("==> node job attempt 1 <==\n"),
        "{stdout}"
    );
    assert!(stdout.contains("to stdout\n"), "{stdout}");
    // (The node's error at the end quotes its stderr tail; the output before it has none.)
    let before_end = stdout.split("[attempt 1 ended").next().unwrap_or_default();
    assert!(!before_end.contains("to stderr"), "{stdout}");
    assert!(stderr.contains("to stderr\n"), "{stderr}");
    assert!(
        stdout.contains("[attempt 1 ended: failed: the sandbox program exited with code 3"),
        "{stdout}"
    );
    let out = cairn(&data)
        .args(["--json", "runs", "logs", "logs1"])
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // (A program's write may arrive in more than one chunk.)
    let stderr_text: String = lines
        .iter()
        .filter(|l| l["stream"] == "stderr")
        .filter_map(|l| l["text"].as_str())
        .collect();
    assert_eq!(stderr_text, "to stderr\n", "{lines:?}");
    assert_eq!(lines.last().unwrap()["end"], true);
}
