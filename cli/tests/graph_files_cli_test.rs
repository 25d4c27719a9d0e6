//! `cairn run GRAPH.yaml` sends the files the graph names (schemas, limits, prompts) from the
//! graph file's directory, never one that a symlink leads out of it; the run records them
//! under `.cairn/runs/<run>/inputs/`.
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn;

/// Docker or bubblewrap must be there for a graph run; CI (CAIRN_REQUIRE_DOCKER=1) insists.
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

#[test]
fn the_phases_example_runs_with_its_files_sent() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graph =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/team-phases/graph.yaml");
    let out = cairn(&data)
        .args(["-p", "phases", "run"])
        .arg(&graph)
        .args(["--run-id", "r1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = cairn(&data)
        .args([
            "-p",
            "phases",
            "store",
            "get",
            ".cairn/runs/r1/inputs/contracts/plan.schema.json",
        ])
        .output()
        .unwrap();
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    let sent = std::fs::read(graph.parent().unwrap().join("contracts/plan.schema.json")).unwrap();
    assert_eq!(got.stdout, sent);
}

#[test]
fn a_file_a_symlink_leads_out_of_the_graphs_directory_is_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let graphs = dir.path().join("graphs");
    std::fs::create_dir_all(&graphs).unwrap();
    std::fs::write(
        dir.path().join("secret.json"),
        "{\"description\": \"SECRET-9b2\"}",
    )
    .unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.json"), graphs.join("s.json")).unwrap();
    std::fs::write(
        graphs.join("graph.yaml"),
        "contracts:\n  - {files: [\"*.json\"], schema_file: s.json}\nnodes:\n  - {id: w, type: write_file, path: docs/a.txt, content: a}\n",
    )
    .unwrap();
    let out = cairn(&data)
        .args(["-p", "p", "run"])
        .arg(graphs.join("graph.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("leads out of the graph's directory") && stderr.contains("s.json"),
        "{stderr}"
    );
    assert!(!stderr.contains("SECRET-9b2"), "{stderr}");
}
