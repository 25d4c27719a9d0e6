//! sandbox_run end to end over real gRPC: Docker under CAIRN_REQUIRE_DOCKER=1, the local
//! (bubblewrap) backend otherwise; a `SKIP:` line when neither can run here.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::v1::{NodeState, RunActionRequest, TaskState};
use common::*;
use serde_json::Value;

async fn stack(test: &str) -> Option<Stack> {
    match Stack::try_start(Options {
        sandbox: Sandbox::Required,
        ..Default::default()
    })
    .await
    {
        Ok(s) => {
            eprintln!(
                "{test}: sandbox backend {}",
                s.sandbox_backend.clone().unwrap_or_default()
            );
            Some(s)
        }
        Err(e) => {
            println!("SKIP: {test}: no sandbox backend can run here ({e})");
            None
        }
    }
}

const PROJECT_GRAPH: &str = r#"
nodes:
  - id: code
    type: write_file
    path: "workspace/{{run_id}}/calc.py"
    content: "def add(a, b):\n    return a + b\n"
  - id: tests
    type: write_file
    path: "workspace/{{run_id}}/test_calc.py"
    content: "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
  - id: run
    type: sandbox_run
    language: python
    needs: [code, tests]
    input_files: ["workspace/{{run_id}}/"]
    allowed_prefixes: ["workspace/", "docs/"]
    timeout_s: 60
    store_output: result
    code: |
      import subprocess, sys
      r = subprocess.run([sys.executable, "-m", "unittest", "discover", "-s", "/input/workspace/{{run_id}}", "-v"],
                         capture_output=True, text=True, cwd="/input/workspace/{{run_id}}")
      open("/output/report.txt", "w").write(r.stderr)
      print("tests exit", r.returncode)
      sys.exit(r.returncode)
  - id: summary
    type: write_file
    path: "docs/{{run_id}}/summary.txt"
    content: "exit={{vars.result.exit_code}} ok={{nodes.run.ok}} files={{nodes.run.written_files}}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_run_stages_inputs_and_stores_outputs() {
    let Some(s) = stack("sandbox_run_stages_inputs_and_stores_outputs").await else {
        return;
    };
    let run = s.submit(PROJECT_GRAPH, &[]).await.unwrap().run_id;
    let done = s.wait_final(&run, 120).await;
    assert_eq!(
        done.state,
        TaskState::Completed as i32,
        "{done:#?}\n{:#?}",
        s.event_types(&run).await
    );
    let report = s
        .read_text(&format!("docs/artifacts/{run}/report.txt"))
        .await;
    assert!(
        report.contains("test_add") && report.contains("OK"),
        "{report}"
    );
    let result: Value = serde_json::from_slice(
        &s.read(&format!(".cairn/runs/{run}/sandbox/run/result.json"))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(result["exit_code"], 0);
    assert_eq!(result["timed_out"], false);
    assert_eq!(
        result["written_files"][0]["path"],
        format!("docs/artifacts/{run}/report.txt")
    );
    assert!(
        result["stdout"].to_string().contains("tests exit 0"),
        "{result:#}"
    );
    assert_eq!(
        s.read_text(&format!("docs/{run}/summary.txt")).await,
        format!("exit=0 ok=true files=[\"docs/artifacts/{run}/report.txt\"]")
    );
    let events = s.events(&run).await;
    let start = events
        .iter()
        .position(|e| e.r#type == "sandbox_start")
        .expect("sandbox_start");
    let complete = events
        .iter()
        .position(|e| e.r#type == "sandbox_complete")
        .expect("sandbox_complete");
    assert!(start < complete);
    assert_eq!(data(&events[complete])["exit_code"], 0);
    assert_eq!(data(&events[start])["inputs"], 2);
    assert!(events.iter().any(|e| e.r#type == "artifact.written"
        && data(e)["path"] == format!("docs/artifacts/{run}/report.txt")));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_program_refused_input_and_timeout() {
    let Some(s) = stack("failing_program_refused_input_and_timeout").await else {
        return;
    };
    // Non-zero exit fails the node (allow_failure is off) and says where to look.
    let run = s
        .submit("nodes:\n  - {id: bad, type: sandbox_run, language: python, code: \"import sys; print('boom', file=sys.stderr); sys.exit(3)\"}\n", &[])
        .await
        .unwrap()
        .run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 60).await;
    assert!(
        failed.error.contains("exited with code 3") && failed.error.contains("boom"),
        "{}",
        failed.error
    );
    assert_eq!(
        failed.nodes[0].attempts, 1,
        "a failing program is not retried by default"
    );
    let events = s.events(&run).await;
    let c = events
        .iter()
        .find(|e| e.r#type == "sandbox_complete")
        .unwrap();
    assert_eq!(data(c)["exit_code"], 3);

    // ... unless allowed; then the outputs say how it ended.
    let run = s
        .submit("nodes:\n  - {id: bad, type: sandbox_run, language: sh, allow_failure: true, code: 'exit 4'}\n", &[])
        .await
        .unwrap()
        .run_id;
    let done = s.wait_state(&run, TaskState::Completed, 60).await;
    let out: Value = serde_json::from_str(&done.nodes[0].outputs_json).unwrap();
    assert_eq!(out["exit_code"], 4);
    assert_eq!(out["ok"], false);

    // An input outside allowed_prefixes is refused before anything runs.
    let run = s
        .submit("nodes:\n  - {id: w, type: write_file, path: workspace/in.txt, content: x}\n  - {id: r, type: sandbox_run, language: sh, code: 'cat /input/workspace/in.txt', input_files: ['{{nodes.w.path}}']}\n", &[])
        .await
        .unwrap()
        .run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 60).await;
    assert!(
        failed.error.contains("not under allowed_prefixes"),
        "{}",
        failed.error
    );
    assert!(s
        .events(&run)
        .await
        .iter()
        .all(|e| e.r#type != "sandbox_start"));

    // The program's timeout: killed by the runner, the node fails as a timeout.
    let t0 = Instant::now();
    let run = s
        .submit("nodes:\n  - {id: slow, type: sandbox_run, language: python, timeout_s: 2, retry: {max_attempts: 1}, code: 'import time; time.sleep(60)'}\n", &[])
        .await
        .unwrap()
        .run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 60).await;
    assert!(
        failed.error.contains("timed out after 2s"),
        "{}",
        failed.error
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
    s.stop().await;
}

fn processes_matching(marker: &str) -> usize {
    let out = std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_long_sandbox_run_stops_it() {
    let Some(s) = stack("cancel_during_a_long_sandbox_run_stops_it").await else {
        return;
    };
    // A unique sleep length marks the sandboxed process in the host's process list.
    let marker = format!("sleep 7{:06}", std::process::id() % 1_000_000);
    let graph = format!(
        "nodes:\n  - {{id: long, type: sandbox_run, language: python, timeout_s: 300, code: \"import subprocess; subprocess.run(['sleep', '{}'])\"}}\n  - {{id: after, type: write_file, path: docs/after.txt, content: x, needs: [long]}}\n",
        marker.trim_start_matches("sleep ")
    );
    let run = s.submit(&graph, &[]).await.unwrap().run_id;
    let deadline = Instant::now() + Duration::from_secs(60);
    while processes_matching(&marker) == 0 {
        assert!(
            Instant::now() < deadline,
            "the sandboxed program never started: {:?}",
            s.event_types(&run).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = Instant::now();
    let info = s
        .client
        .clone()
        .cancel_run(RunActionRequest {
            project_id: PROJECT.into(),
            run_id: run.clone(),
            by: "dave".into(),
            reason: "too slow".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state, TaskState::Canceled as i32);
    assert_eq!(info.nodes[0].state, NodeState::Canceled as i32);
    assert_eq!(info.nodes[1].state, NodeState::Pending as i32);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "cancel took {:?}",
        t0.elapsed()
    );
    // The runner stops the work: the process disappears.
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_matching(&marker) > 0 {
        assert!(
            Instant::now() < deadline,
            "sandbox work still running after cancel"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = s.events(&run).await;
    assert!(events
        .iter()
        .any(|e| e.r#type == "node.canceled" && e.node_id == "long"));
    assert!(events
        .iter()
        .any(|e| e.r#type == "task.canceled" && data(e)["by"] == "dave"));
    assert!(s.read("docs/after.txt").await.is_none());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_runner_is_skipped_for_the_next_one() {
    // The first runner address is dead: requests that land on it go to the live one.
    let s = match Stack::try_start(Options {
        sandbox: Sandbox::Required,
        tweak: |c| c.sandbox_addrs.insert(0, "127.0.0.1:1".into()),
        ..Default::default()
    })
    .await
    {
        Ok(s) => s,
        Err(e) => {
            println!(
                "SKIP: an_unavailable_runner_is_skipped_for_the_next_one: no sandbox backend ({e})"
            );
            return;
        }
    };
    let live = s.sandbox_addr.clone().unwrap();
    let graph = "nodes:\n  - {id: one, type: sandbox_run, language: sh, code: 'echo one'}\n  - {id: two, type: sandbox_run, language: sh, code: 'echo two', needs: [one]}\n  - {id: three, type: sandbox_run, language: sh, code: 'echo three', needs: [two]}\n";
    let run = s.submit(graph, &[]).await.unwrap().run_id;
    let done = s.wait_state(&run, TaskState::Completed, 60).await;
    assert!(
        done.nodes.iter().all(|n| n.attempts == 1),
        "no node needed a retry of its own"
    );
    let events = s.events(&run).await;
    let runners: Vec<Value> = events
        .iter()
        .filter(|e| e.r#type == "sandbox_complete")
        .map(|e| data(e)["runner"].clone())
        .collect();
    assert_eq!(runners, vec![Value::from(live.clone()); 3]);
    s.stop().await;
}

/// Outputs over the runner's file-count limit are withheld as a whole: the step fails, saying
/// so, and none of its files lands in the project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withheld_outputs_fail_the_step_and_nothing_lands() {
    let Some(s) = stack("withheld_outputs_fail_the_step_and_nothing_lands").await else {
        return;
    };
    let run = s
        .submit("nodes:\n  - {id: many, type: sandbox_run, language: python, code: \"for i in range(1005): open(f'/output/f{i}.txt', 'w').write('x')\"}\n", &[])
        .await
        .unwrap()
        .run_id;
    let failed = s.wait_state(&run, TaskState::Failed, 120).await;
    assert!(
        failed.error.contains("would not publish"),
        "{}",
        failed.error
    );
    assert!(s
        .events(&run)
        .await
        .iter()
        .all(|e| e.r#type != "artifact.written"));
    s.stop().await;
}

/// `image:` and `network:` reach the runner: the toolchain image runs where the runner allows it
/// (docker), and an image or network the runner does not allow fails the node, naming the
/// runner setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_and_network_of_a_node_go_to_the_runner() {
    let test = "image_and_network_of_a_node_go_to_the_runner";
    let Some(s) = stack(test).await else {
        return;
    };
    let node = |extra: &str| {
        format!("nodes:\n  - id: run\n    type: sandbox_run\n    language: bash\n    code: \"command -v gcc && command -v npm\"\n{extra}")
    };
    for (extra, setting) in [
        ("    network: true\n", "network_allowed"),
        ("    image: \"debian:bookworm\"\n", "allowed_images"),
    ] {
        let run = s.submit(&node(extra), &[]).await.unwrap().run_id;
        let done = s.wait_final(&run, 60).await;
        assert_eq!(done.state, TaskState::Failed as i32, "{extra}: {done:#?}");
        assert!(
            done.nodes[0].error.contains(setting),
            "{setting} not in {}",
            done.nodes[0].error
        );
    }
    let toolchain =
        std::env::var("CAIRN_TOOLCHAIN_IMAGE").unwrap_or_else(|_| "cairn-toolchain:latest".into());
    let run = s
        .submit(&node(&format!("    image: \"{toolchain}\"\n")), &[])
        .await
        .unwrap()
        .run_id;
    let done = s.wait_final(&run, 120).await;
    if s.sandbox_backend.as_deref() == Some("docker") {
        assert_eq!(done.state, TaskState::Completed as i32, "{done:#?}");
        let out: Value = serde_json::from_str(&done.nodes[0].outputs_json).unwrap();
        assert!(
            out["stdout"].as_str().unwrap().contains("/usr/bin/gcc"),
            "{out}"
        );
    } else {
        // The local backend has no images: refused, not run without the tools.
        assert_eq!(done.state, TaskState::Failed as i32, "{done:#?}");
        assert!(
            done.nodes[0].error.contains("image_needs_docker"),
            "{}",
            done.nodes[0].error
        );
    }
    s.stop().await;
}
