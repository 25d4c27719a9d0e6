//! First use on a fresh data root (no project made beforehand): commands that need a project
//! create it, `cairn project create|list` exist for explicit use, and errors speak CLI.
#![allow(clippy::unwrap_used)]

mod common;

use common::{cairn, free_port, Killed};

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

/// A command sent to the wrong service names the service it needs and the one it found.
#[test]
fn a_command_at_the_wrong_service_names_both() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    // An ingest service alone (its store need not exist for this).
    let ingest = Killed(
        std::process::Command::new(assert_cmd::cargo::cargo_bin("cairn"))
            .env_remove("CAIRN_ADDR")
            .env_remove("CAIRN_CONFIG")
            .env("RUST_LOG", "error")
            .args([
                "serve",
                "ingest",
                "--listen",
                &addr,
                "--store-addr",
                "http://127.0.0.1:9",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "cairn serve ingest never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = cairn(dir.path())
        .args(["--addr", &addr, "store", "ls"])
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    drop(ingest);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("serves the ingest service, not the artifact-store")
            && stderr.contains("--store-addr")
            && !stderr.contains("[Unimplemented]"),
        "{stderr}"
    );
}

/// `cairn run` of a completed run some of whose code blocks were not written exits 4 and says
/// why; the same run without such blocks exits 0.
#[test]
fn cairn_run_exits_4_when_blocks_were_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = dir.path().join("graph.yaml");
    std::fs::write(
        &graph,
        "nodes:\n  - id: doc\n    type: write_file\n    path: \"docs/{{run_id}}/doc.md\"\n    content: \"```python file=app.py\\nv = 1\\n```\\n\\n```python file=../escape.py\\nx\\n```\\n\"\n",
    )
    .unwrap();
    let out = cairn(&data)
        .args(["-p", "exits", "run"])
        .arg(&graph)
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[completed]"), "{stdout}");
    assert!(
        stdout.contains("1 code block(s) were not written"),
        "{stdout}"
    );
    let clean = dir.path().join("clean.yaml");
    std::fs::write(
        &clean,
        "nodes:\n  - id: doc\n    type: write_file\n    path: \"docs/{{run_id}}/doc.md\"\n    content: \"```python file=ok.py\\nv = 1\\n```\\n\"\n",
    )
    .unwrap();
    cairn(&data)
        .args(["-p", "exits", "run"])
        .arg(&clean)
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(0);
}

/// `cairn gate reject` against a served orchestrator prints the run after the decision (a
/// rejection that fails the run: failed), not the state before it.
#[test]
fn gate_reject_prints_the_run_after_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, addr, _) = common::up(&dir.path().join("data"), &[]);
    let graph = dir.path().join("gated.yaml");
    std::fs::write(
        &graph,
        "nodes:\n  - {id: draft, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: d}\n  - {id: review, type: gate, needs: [draft]}\n  - {id: after, type: write_file, path: \"docs/{{run_id}}/a.txt\", content: a, needs: [review]}\n",
    )
    .unwrap();
    let out = cairn(dir.path())
        .args(["--addr", &addr, "--json", "run", "--run-id", "gated1"])
        .arg(&graph)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let waiting: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "cairn run printed no run ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(waiting["state"], "input-required", "{waiting}");
    let out = cairn(dir.path())
        .args([
            "--addr", &addr, "--json", "gate", "reject", "gated1", "review",
        ])
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    let after: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(after["state"], "failed", "{after}");
    assert_eq!(after["gates"][0]["state"], "rejected", "{after}");
    assert_eq!(out.status.code(), Some(1));
}

/// task.yaml by hand: the editable fields are taken (and applied when the run moves on); any
/// other change is refused with the fields one may edit.
#[test]
fn task_yaml_edited_by_hand_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = dir.path().join("gated.yaml");
    std::fs::write(
        &graph,
        "title: Before\nnodes:\n  - {id: draft, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: d}\n  - {id: review, type: gate, needs: [draft]}\n",
    )
    .unwrap();
    cairn(&data)
        .args(["-p", "edits", "run", "--run-id", "e1"])
        .arg(&graph)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    let get = cairn(&data)
        .args(["-p", "edits", "store", "get", ".cairn/runs/e1/task.yaml"])
        .output()
        .unwrap();
    let yaml = String::from_utf8(get.stdout).unwrap();
    assert!(yaml.contains("title: Before"), "{yaml}");
    let edited = dir.path().join("task.yaml");
    let put = |text: &str| {
        std::fs::write(&edited, text).unwrap();
        cairn(&data)
            .args(["-p", "edits", "store", "put", "--overwrite"])
            .arg(&edited)
            .arg(".cairn/runs/e1/task.yaml")
            .output()
            .unwrap()
    };
    let refused = put(&yaml.replace("state: input-required", "state: completed"));
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("`state`")
            && stderr.contains("title, goal, milestones[].note and roster[].note"),
        "{stderr}"
    );
    let taken = put(&yaml.replace("title: Before", "title: After"));
    assert!(
        taken.status.success(),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );
    cairn(&data)
        .args(["-p", "edits", "gate", "approve", "e1", "review"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    let show = cairn(&data)
        .args(["-p", "edits", "--json", "runs", "show", "e1"])
        .output()
        .unwrap();
    let run: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(run["state"], "completed", "{run}");
    assert_eq!(run["title"], "After", "{run}");
}

/// `runs rerun` starts a new run from a run's records (variables replaced with --var), and
/// `runs list` finds runs by text and creation day.
#[test]
fn a_run_is_re_run_and_found_by_search() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph = dir.path().join("greet.yaml");
    std::fs::write(
        &graph,
        "title: Greeting\ngoal: Greet someone\nnodes:\n  - {id: a, type: write_file, path: \"docs/{{run_id}}.txt\", content: \"hi {{vars.who}}\"}\n",
    )
    .unwrap();
    let json = |args: &[&str]| {
        let out = cairn(&data)
            .args(["-p", "again", "--json"])
            .args(args)
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = json(&[
        "run",
        graph.to_str().unwrap(),
        "--run-id",
        "first",
        "--var",
        "who=ann",
    ]);
    assert_eq!(first["state"], "completed", "{first}");
    let second = json(&["runs", "rerun", "first", "--var", "who=bob"]);
    assert_eq!(second["state"], "completed", "{second}");
    assert_eq!(second["rerun_of"], "first");
    assert_eq!(second["title"], "Greeting");
    let id = second["run_id"].as_str().unwrap().to_owned();
    assert_ne!(id, "first");
    cairn(&data)
        .args(["-p", "again", "store", "get", &format!("docs/{id}.txt")])
        .assert()
        .success()
        .stdout("hi bob");

    let ids = |v: serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        ids(json(&["runs", "list", "--search", "GREET"])),
        vec![id.clone(), "first".to_owned()]
    );
    assert!(ids(json(&["runs", "list", "--search", "farewell"])).is_empty());
    assert!(ids(json(&["runs", "list", "--since", "2999-01-01"])).is_empty());
    assert_eq!(
        ids(json(&["runs", "list", "--until", "2999-01-01"])).len(),
        2
    );
    cairn(&data)
        .args(["-p", "again", "runs", "list", "--since", "last week"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("give a day (2026-11-25)"));
}

/// `cairn runs archive`: a run waiting at a gate is refused; a completed run is packed into one
/// file, and `cairn runs show` and `cairn store events` still read it; it takes no note until
/// `cairn runs unarchive` puts its files back, which reads the same and takes one.
#[test]
fn an_archived_run_is_still_shown_and_an_unfinished_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let done = dir.path().join("done.yaml");
    std::fs::write(
        &done,
        "nodes:\n  - {id: doc, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: d}\n",
    )
    .unwrap();
    let gated = dir.path().join("gated.yaml");
    std::fs::write(
        &gated,
        "nodes:\n  - {id: draft, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: d}\n  - {id: review, type: gate, needs: [draft]}\n",
    )
    .unwrap();
    for (run, graph) in [("a1", &done), ("g1", &gated)] {
        cairn(&data)
            .args(["-p", "arch", "run", "--run-id", run])
            .arg(graph)
            .timeout(std::time::Duration::from_secs(60))
            .assert()
            .success();
    }
    let refused = cairn(&data)
        .args(["-p", "arch", "runs", "archive", "g1"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.status.code() == Some(5) && stderr.contains("is input-required, not finished"),
        "{stderr}"
    );
    let before = cairn(&data)
        .args(["-p", "arch", "--json", "store", "events", "a1"])
        .output()
        .unwrap();
    cairn(&data)
        .args(["-p", "arch", "runs", "archive", "a1"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    let run_dir = data.join("projects/arch/.cairn/runs/a1");
    assert!(run_dir.join("run.tar.gz").exists() && !run_dir.join("events.jsonl").exists());
    let show = cairn(&data)
        .args(["-p", "arch", "--json", "runs", "show", "a1"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.status.success() && shown.contains("completed"),
        "{shown}\n{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let after = cairn(&data)
        .args(["-p", "arch", "--json", "store", "events", "a1"])
        .output()
        .unwrap();
    assert!(!before.stdout.is_empty());
    assert_eq!(after.stdout, before.stdout);
    // Archived, it takes no note; unarchived, its files are back and it takes one.
    let note = |text: &str| {
        cairn(&data)
            .args(["-p", "arch", "notes", "add", "a1", text])
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    };
    let refused = note("while archived");
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("cairn runs unarchive"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    cairn(&data)
        .args(["-p", "arch", "runs", "unarchive", "a1"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success()
        .stdout(predicate::str::contains("unarchived a1"));
    assert!(run_dir.join("events.jsonl").exists() && !run_dir.join("run.tar.gz").exists());
    let unpacked = cairn(&data)
        .args(["-p", "arch", "--json", "store", "events", "a1"])
        .output()
        .unwrap();
    assert_eq!(unpacked.stdout, before.stdout);
    let noted = note("after unarchiving");
    assert!(
        noted.status.success(),
        "{}",
        String::from_utf8_lossy(&noted.stderr)
    );
}

/// `cairn store backup` of a data root with a run waiting at a gate, restored into another
/// data root: the run is shown there as it was, and approving its gate drives it to the end.
#[test]
fn a_restored_run_is_shown_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (dir.path().join("a"), dir.path().join("b"));
    let gated = dir.path().join("gated.yaml");
    std::fs::write(
        &gated,
        "nodes:\n  - {id: draft, type: write_file, path: \"docs/{{run_id}}/d.txt\", content: d}\n  - {id: review, type: gate, needs: [draft]}\n  - {id: after, type: write_file, needs: [review], path: \"docs/{{run_id}}/e.txt\", content: e}\n",
    )
    .unwrap();
    cairn(&source)
        .args(["-p", "kept", "run", "--run-id", "g1"])
        .arg(&gated)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    let file = dir.path().join("backup.tar.gz");
    cairn(&source)
        .args(["store", "backup", "--out"])
        .arg(&file)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    cairn(&target)
        .args(["store", "restore"])
        .arg(&file)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success()
        .stdout(predicate::str::contains("restored kept"));
    let show = cairn(&target)
        .args(["-p", "kept", "--json", "runs", "show", "g1"])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(shown.contains("input-required"), "{shown}");
    cairn(&target)
        .args(["-p", "kept", "gate", "approve", "g1", "review"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success();
    cairn(&target)
        .args(["-p", "kept", "store", "get", "docs/g1/e.txt"])
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .success()
        .stdout("e");
    // A second restore into the now non-empty data root is refused, in CLI words.
    cairn(&target)
        .args(["store", "restore"])
        .arg(&file)
        .timeout(std::time::Duration::from_secs(60))
        .assert()
        .failure()
        .stderr(predicate::str::contains("--project"));
}
