//! `cairn runs watch` follows a run past its end: against `cairn up`, one watch prints a run's
//! failure, then (after `cairn runs resume`) its completion, and keeps running afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{free_port, Killed};

/// `cairn` against `addr` (a served instance), with none of the caller's cairn environment.
fn client(addr: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for k in [
        "CAIRN_ADDR",
        "CAIRN_PROJECT",
        "CAIRN_CONFIG",
        "CAIRN_DATA_ROOT",
    ] {
        c.env_remove(k);
    }
    c.env("RUST_LOG", "error").args(["--addr", addr]);
    c
}

/// Lines of `rx` until one contains `needle` (30 s at most); all lines read are kept in `seen`.
fn wait_line(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let hit = line.contains(needle);
                seen.push(line);
                if hit {
                    return;
                }
            }
            Err(e) => panic!(
                "no line with `{needle}` ({e}); watch printed:\n{}",
                seen.join("\n")
            ),
        }
    }
}

#[test]
fn runs_watch_follows_a_run_through_its_failure_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let _up = Killed(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .env_remove("CAIRN_ADDR")
            .env_remove("CAIRN_CONFIG")
            .env("RUST_LOG", "error")
            .arg("--data-root")
            .arg(dir.path().join("data"))
            .args(["up", "--no-console", "--listen", &addr])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client(&addr)
        .args(["runs", "list"])
        .output()
        .unwrap()
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "cairn up does not answer on {addr}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Fails until docs/later.txt exists; a resume then retries the failed node.
    let graph = dir.path().join("graph.yaml");
    std::fs::write(
        &graph,
        "nodes:\n  - {id: r, type: tool_call, tool: read_file, args: {path: docs/later.txt}}\n",
    )
    .unwrap();
    let out = client(&addr)
        .args(["--json", "run", "--detach"])
        .arg(&graph)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();

    let mut watch = Killed(
        client(&addr)
            .args(["runs", "watch", &run])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel();
    let stdout = watch.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    wait_line(&rx, &mut seen, "task.failed");

    let later = dir.path().join("later.txt");
    std::fs::write(&later, "now here").unwrap();
    let put = client(&addr)
        .args(["store", "put"])
        .arg(&later)
        .arg("docs/later.txt")
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let resumed = client(&addr)
        .args(["runs", "resume", &run])
        .output()
        .unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );

    wait_line(&rx, &mut seen, "task.resumed");
    wait_line(&rx, &mut seen, "task.completed");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        watch.0.try_wait().unwrap().is_none(),
        "the watch goes on after the run completed:\n{}",
        seen.join("\n")
    );
    // One line per event, first to last, none twice.
    let seqs: Vec<u64> = seen
        .iter()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "{}", seen.join("\n"));
    drop(watch);

    // Restarted from a later event (--from), it prints only what came from there, as JSON.
    let last = *seqs.last().unwrap();
    let mut tail = Killed(
        client(&addr)
            .args(["--json", "runs", "watch", &run, "--from", &last.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    BufReader::new(tail.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let e: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(
        (e["seq"].as_u64(), e["type"].as_str()),
        (Some(last), Some("task.completed"))
    );
}
