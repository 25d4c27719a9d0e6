//! `cairn run --mode M --prompt P --llm replay:examples/modes/M.yaml` end to end with embedded
//! services: no graph file, no network, no sandbox needed; a relative cassette path is
//! relative to where the user stands.
#![allow(clippy::unwrap_used)]

use assert_cmd::Command;

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cairn(data: &std::path::Path) -> Command {
    let mut cmd = Command::cargo_bin("cairn").unwrap();
    cmd.env_remove("CAIRN_ADDR")
        .env_remove("CAIRN_PROJECT")
        .env("RUST_LOG", "error")
        .current_dir(repo_root())
        .arg("--data-root")
        .arg(data);
    cmd
}

fn get(data: &std::path::Path, path: &str) -> String {
    let out = cairn(data)
        .args(["-p", "modes", "store", "get", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn self_critique_runs_from_the_example_cassette() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cairn(&data)
        .args([
            "-p",
            "modes",
            "--json",
            "run",
            "--mode",
            "self_critique",
            "--prompt",
            "Write a word-count tool",
            "--llm",
            "replay:examples/modes/self_critique.yaml",
            "--run-id",
            "sc1",
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
    assert_eq!(info["title"], "self_critique: Write a word-count tool");
    assert!(get(&data, "docs/draft_sc1.md").contains("(draft)"));
    assert!(get(&data, "docs/reviews/sc1/review_2.md").contains("# Review 2"));
    assert!(get(&data, "docs/final_sc1.md").contains("Points not taken"));
    assert!(get(&data, "workspace/wordcount/wc.py").contains("def main"));
}

#[test]
fn a_mode_and_a_graph_file_together_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = cairn(&dir.path().join("data"))
        .args([
            "run",
            "examples/hello/graph.yaml",
            "--mode",
            "single",
            "--prompt",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not both"), "{err}");

    let out = cairn(&dir.path().join("data"))
        .args([
            "run",
            "--mode",
            "pair",
            "--prompt",
            "x",
            "--llm",
            "replay:examples/modes/single.yaml",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown mode `pair`") && err.contains("self_critique"),
        "{err}"
    );
}
