//! WatchLogs over real gRPC (store, sandbox runner, orchestrator on loopback): a sandbox
//! program's output arrives while the node still runs, a failed node's output ends with its
//! error, ended attempts are replayed from the run directory (also by another orchestrator
//! over the same store, i.e. after a restart), and an attempt keeps only its last bytes,
//! saying how many were dropped. Docker under CAIRN_REQUIRE_DOCKER=1, the local backend
//! otherwise; a `SKIP:` line when neither can run here.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{LogChunk, LogStream, NodeState, TaskState, WatchLogsRequest};
use common::*;

async fn stack(test: &str, tweak: fn(&mut cairn_orchestrator::Config)) -> Option<Stack> {
    match Stack::try_start(Options {
        sandbox: Sandbox::Required,
        tweak,
        ..Default::default()
    })
    .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            println!("SKIP: {test}: no sandbox backend can run here ({e})");
            None
        }
    }
}

fn sandbox_graph(code: &str) -> String {
    let code: String = code.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "nodes:\n  - id: job\n    type: sandbox_run\n    language: python\n    allowed_prefixes: [\"docs/\"]\n    timeout_s: 60\n    code: |\n{code}"
    )
}

fn req(run: &str, node: &str, follow: bool) -> WatchLogsRequest {
    WatchLogsRequest {
        project_id: PROJECT.into(),
        run_id: run.into(),
        node_id: node.into(),
        follow,
        ..Default::default()
    }
}

/// Every chunk of a stream that ends by itself.
async fn all(
    client: &mut OrchestratorClient<tonic::transport::Channel>,
    r: WatchLogsRequest,
) -> Vec<LogChunk> {
    let mut s = client.watch_logs(r).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(c) = tokio::time::timeout(Duration::from_secs(30), s.message())
        .await
        .expect("the stream ends by itself")
        .unwrap()
    {
        out.push(c);
    }
    out
}

fn text(chunks: &[LogChunk], stream: LogStream) -> String {
    chunks
        .iter()
        .filter(|c| c.stream == stream as i32)
        .map(|c| String::from_utf8_lossy(&c.data).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_output_arrives_while_the_node_runs_and_is_replayed_after() {
    let Some(s) = stack(
        "live_output_arrives_while_the_node_runs_and_is_replayed_after",
        |_| {},
    )
    .await
    else {
        return;
    };
    let graph = sandbox_graph(
        "import sys, time\nprint('marker-early', flush=True)\ntime.sleep(4)\nprint('marker-late', flush=True)\n",
    );
    let run = s.submit(&graph, &[]).await.unwrap().run_id;
    let mut client = s.client.clone();
    let mut stream = client
        .watch_logs(req(&run, "job", true))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    loop {
        let c = tokio::time::timeout(Duration::from_secs(60), stream.message())
            .await
            .expect("output within a minute")
            .unwrap()
            .expect("the stream goes on until the node ends");
        seen.push(c);
        if text(&seen, LogStream::Stdout).contains("marker-early") {
            break;
        }
    }
    // The node has not ended: the output came live.
    let info = s.get(&run).await;
    let job = info.nodes.iter().find(|n| n.id == "job").unwrap();
    assert_eq!(job.state, NodeState::Running as i32, "{info:#?}");
    assert!(!text(&seen, LogStream::Stdout).contains("marker-late"));
    assert!(seen
        .iter()
        .all(|c| !c.end && c.node_id == "job" && c.attempt == 1));
    // Then the rest, the end, and the stream closes with the run.
    while let Some(c) = tokio::time::timeout(Duration::from_secs(60), stream.message())
        .await
        .expect("the stream ends with the run")
        .unwrap()
    {
        seen.push(c);
    }
    assert!(text(&seen, LogStream::Stdout).contains("marker-late"));
    let last = seen.last().unwrap();
    assert!(last.end && last.outcome == "succeeded", "{last:?}");
    let seqs: Vec<u64> = seen.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        s.wait_final(&run, 60).await.state,
        TaskState::Completed as i32
    );

    // Stored with the run: read back without following, and resumed after a position.
    let stored = s
        .read_text(&format!(".cairn/runs/{run}/logs/job/1.jsonl"))
        .await;
    assert!(stored.contains("marker-late"), "{stored}");
    let replay = all(&mut client, req(&run, "", false)).await;
    assert_eq!(replay, seen);
    let mut after = req(&run, "job", false);
    after.after_attempt = 1;
    after.after_seq = seen.len() as u64 - 1;
    assert_eq!(all(&mut client, after).await, vec![last.clone()]);

    // Another orchestrator over the same store (a restarted one) has nothing in memory.
    let config = cairn_orchestrator::Config {
        store_addr: s.store_addr.clone(),
        resume_on_start: false,
        ..Default::default()
    };
    let (server, _handle) = cairn_orchestrator::orchestrator_service(config)
        .await
        .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut host = cairn_server::Host::new();
        host.add(server);
        let _ = host.serve(l, std::future::pending()).await;
    });
    let mut second = OrchestratorClient::new(channel(&addr).await);
    assert_eq!(all(&mut second, req(&run, "job", true)).await, seen);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_nodes_output_ends_with_its_error() {
    let Some(s) = stack("a_failed_nodes_output_ends_with_its_error", |_| {}).await else {
        return;
    };
    let graph = sandbox_graph(
        "import sys\nprint('<script>alert(1)</script> starting')\nprint('boom: bad input', file=sys.stderr)\nsys.exit(3)\n",
    );
    let run = s.submit(&graph, &[]).await.unwrap().run_id;
    assert_eq!(s.wait_final(&run, 60).await.state, TaskState::Failed as i32);
    let mut client = s.client.clone();
    let chunks = all(&mut client, req(&run, "job", true)).await;
    assert!(text(&chunks, LogStream::Stdout).contains("<script>alert(1)</script> starting"));
    assert!(text(&chunks, LogStream::Stderr).contains("boom: bad input"));
    let last = chunks.last().unwrap();
    assert!(last.end, "{chunks:?}");
    assert_eq!(last.outcome, "failed");
    assert!(last.error.contains("exited with code 3"), "{last:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_keeps_only_its_last_bytes_and_says_what_was_dropped() {
    let Some(s) = stack(
        "an_attempt_keeps_only_its_last_bytes_and_says_what_was_dropped",
        |c| c.log_retain_bytes = 1000,
    )
    .await
    else {
        return;
    };
    // 200 lines of 50 bytes, flushed one by one.
    let graph =
        sandbox_graph("for i in range(200):\n    print(f'line {i:04d} ' + 'x' * 39, flush=True)\n");
    let run = s.submit(&graph, &[]).await.unwrap().run_id;
    assert_eq!(
        s.wait_final(&run, 60).await.state,
        TaskState::Completed as i32
    );
    let mut client = s.client.clone();
    let chunks = all(&mut client, req(&run, "job", false)).await;
    let kept: usize = chunks.iter().map(|c| c.data.len()).sum();
    let dropped: u64 = chunks.iter().map(|c| c.dropped_bytes).sum();
    assert!(kept <= 1000, "{kept} bytes kept");
    assert!(chunks[0].dropped_bytes > 0, "{:?}", chunks[0]);
    assert_eq!(kept as u64 + dropped, 200 * 50);
    let out = text(&chunks, LogStream::Stdout);
    assert!(
        out.ends_with(&format!("line 0199 {}\n", "x".repeat(39))),
        "{out}"
    );
    assert!(!out.contains("line 0000"));
    assert!(chunks.last().unwrap().end);
    s.stop().await;
}
