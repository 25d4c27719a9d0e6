//! `cairn run --mode M --prompt P --llm replay:examples/modes/M.yaml` end to end with embedded
//! services: no graph file, no network, no sandbox needed; a relative cassette path is
//! relative to where the user stands.
#![allow(clippy::unwrap_used)]

mod common;

use common::cairn_in_repo as cairn;

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

/// One chat completion served on 127.0.0.1 by a plain TcpListener; returns the base URL and
/// the request head it received (to see which Authorization header was sent).
fn one_completion_server(content: &str) -> (String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let body = serde_json::json!({
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}
    })
    .to_string();
    let served = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let mut request_body = vec![0; length];
        reader.read_exact(&mut request_body).unwrap();
        let mut stream = reader.into_inner();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        head
    });
    (base_url, served)
}

#[test]
fn an_embedded_run_takes_the_users_llm_url_with_the_users_key() {
    // Without --addr this process is the operator: the URL becomes its provider and gets the
    // key of llm.api_key_env.
    let (base_url, served) = one_completion_server("# Answer\n\nfrom the local server\n");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = cairn(&data)
        .env(
            "CAIRN_ORCHESTRATOR_LLM_API_KEY_ENV",
            "CAIRN_CLI_TEST_LLM_KEY",
        )
        .env("CAIRN_CLI_TEST_LLM_KEY", "sk-cli-user")
        .args(["-p", "modes", "--json", "run", "--mode", "single"])
        .args(["--prompt", "Write a word-count tool", "--run-id", "u1"])
        .args(["--llm", &format!("openai:{base_url}#m")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = served.join().unwrap().to_ascii_lowercase();
    assert!(head.contains("authorization: bearer sk-cli-user"), "{head}");
    assert!(get(&data, "docs/single_u1.md").contains("from the local server"));
}
