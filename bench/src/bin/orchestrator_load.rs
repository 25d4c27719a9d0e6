//! Load generator for the orchestrator benchmark (bench/orchestrator.sh runs it against release
//! `cairn-artifact-store` and `cairn-orchestrator` processes on loopback, next to the LangGraph
//! peer in bench/python/langgraph_peer.py, and prints the rows recorded in bench/RESULTS.md).
//!
//! Scenarios (N nodes each, durable records):
//! - `chain`: N `condition` nodes, each reading its predecessor's output (no I/O);
//! - `write`: N `write_file` nodes in a chain, 4 KiB each;
//! - `fanout`: one `map` over N items whose body is a 4 KiB `write_file`.
//!
//! Time: from SubmitRun until WatchRun delivers `task.completed` (validation, run directory
//! creation and the final snapshot included). Size: every file under `.cairn/runs/<run_id>/`.
//!
//! `--concurrent R,...`: R runs of one 10-node graph (5 `write_file`, 5 `condition`,
//! alternating in a chain) submitted at once and watched to their end, for each R given; then
//! the same runs one after another as the baseline. Reports the time until the last run ends,
//! per-run latency p50/p99 and the orchestrator's resident memory (`--orch-pid`) before, at
//! its peak and after.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, EventInput, ListRequest, PageRequest, PutDurability,
    PutHeader, PutRequest, SubmitRunRequest, WatchRunRequest,
};
use clap::Parser;
use tonic::transport::{Channel, Endpoint};

const PROJECT: &str = "bench";

#[derive(Debug, Parser)]
#[command(
    name = "orchestrator_load",
    about = "Orchestrator benchmark: 1,000-node graphs, durable"
)]
struct Cli {
    /// Orchestrator address (http://127.0.0.1:PORT).
    #[arg(long)]
    orch: String,
    /// Artifact-store address (to measure the run records).
    #[arg(long)]
    store: String,
    /// Nodes per graph.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Runs per scenario (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Map parallelism of the fan-out.
    #[arg(long, default_value_t = 32)]
    parallelism: usize,
    /// Scenarios to run (chain, write, fanout).
    #[arg(long, value_delimiter = ',', default_value = "chain,write,fanout")]
    only: Vec<String>,
    /// Directory on the store's filesystem for the in-process fsync'd-write baseline
    /// (measured before each run; none = not measured).
    #[arg(long)]
    scratch: Option<std::path::PathBuf>,
    /// Dial over mutual TLS with the `cli` certificate of this PKI (`cairn certs init`).
    #[arg(long)]
    tls_dir: Option<std::path::PathBuf>,
    /// Concurrent-runs scenario: these numbers of 10-node runs at once (e.g. 100,1000); the
    /// other scenarios are skipped.
    #[arg(long, value_delimiter = ',')]
    concurrent: Vec<usize>,
    /// The orchestrator's pid, to sample its resident memory.
    #[arg(long)]
    orch_pid: Option<u32>,
}

/// The 10-node graph of the concurrent scenario.
fn mixed_graph() -> String {
    let mut g = String::from("title: bench concurrent\nnodes:\n");
    for i in 0..5 {
        let needs = if i == 0 {
            String::new()
        } else {
            format!(", needs: [c{}]", i - 1)
        };
        g.push_str(&format!(
            "  - {{id: w{i}, type: write_file, path: \"docs/{{{{run_id}}}}/w{i}.txt\", content: \"node {i} of {{{{run_id}}}}\"{needs}}}\n"
        ));
        g.push_str(&format!(
            "  - {{id: c{i}, type: condition, if: \"true\", needs: [w{i}]}}\n"
        ));
    }
    g
}

/// Resident memory of `pid` in KiB (VmRSS).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Submits one run and follows it to its end; returns its id and seconds.
async fn submit_and_follow(
    mut orch: OrchestratorClient<Channel>,
    yaml: String,
) -> Result<(String, f64)> {
    let t0 = Instant::now();
    let info = orch
        .submit_run(SubmitRunRequest {
            project_id: PROJECT.into(),
            graph_yaml: yaml,
            by: "bench".into(),
            ..Default::default()
        })
        .await
        .context("SubmitRun")?
        .into_inner();
    let mut events = orch
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: info.run_id.clone(),
            from_seq: 1,
            follow_after_end: false,
        })
        .await?
        .into_inner();
    loop {
        match events.message().await? {
            Some(e) if e.r#type == "task.completed" => {
                return Ok((info.run_id, t0.elapsed().as_secs_f64()))
            }
            Some(e) if e.r#type == "task.failed" || e.r#type == "task.canceled" => {
                bail!("run {}: {}", e.r#type, e.data_json)
            }
            Some(_) => {}
            None => bail!("event stream ended before the run completed"),
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// `runs` runs at once, then (baseline) one after another; one JSON line each.
async fn concurrent(
    orch: &OrchestratorClient<Channel>,
    runs: usize,
    pid: Option<u32>,
) -> Result<()> {
    let yaml = mixed_graph();
    let before = pid.and_then(rss_kib);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before.unwrap_or(0)));
    let sampler = pid.map(|pid| {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Some(r) = rss_kib(pid) {
                    peak.fetch_max(r, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
    });
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..runs)
        .map(|_| tokio::spawn(submit_and_follow(orch.clone(), yaml.clone())))
        .collect();
    let mut lat = Vec::with_capacity(runs);
    for t in tasks {
        lat.push(t.await??.1);
    }
    let wall = t0.elapsed().as_secs_f64();
    if let Some(s) = sampler {
        s.abort();
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let after = pid.and_then(rss_kib);
    lat.sort_by(f64::total_cmp);
    let mib = |k: Option<u64>| k.map_or("null".into(), |k| format!("{:.1}", k as f64 / 1024.0));
    println!(
        "{{\"system\": \"cairn\", \"scenario\": \"concurrent\", \"runs\": {runs}, \"nodes_per_run\": 10, \"seconds\": {wall:.3}, \"runs_per_s\": {:.1}, \"run_p50_s\": {:.3}, \"run_p99_s\": {:.3}, \"rss_before_mib\": {}, \"rss_peak_mib\": {}, \"rss_after_mib\": {}}}",
        runs as f64 / wall,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        mib(before),
        mib(pid.map(|_| peak.load(std::sync::atomic::Ordering::Relaxed))),
        mib(after),
    );
    let t0 = Instant::now();
    for _ in 0..runs {
        submit_and_follow(orch.clone(), yaml.clone()).await?;
    }
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{{\"system\": \"cairn\", \"scenario\": \"sequential (baseline)\", \"runs\": {runs}, \"nodes_per_run\": 10, \"seconds\": {wall:.3}, \"runs_per_s\": {:.1}}}",
        runs as f64 / wall
    );
    Ok(())
}

/// The plain cost of one durable 4 KiB file in this process: write a temp file, fsync it,
/// rename it into place (no directory fsync), in ms per file (median of its own three thirds).
fn fsync_write_ms(dir: &std::path::Path, n: usize) -> Result<f64> {
    use std::io::Write;
    let dir = dir.join(format!("fsync-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let block = vec![b'x'; 4096];
    let mut thirds = Vec::new();
    for t in 0..3 {
        let t0 = Instant::now();
        for i in 0..n / 3 {
            let tmp = dir.join(format!(".tmp{t}-{i}"));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&block)?;
            f.sync_all()?;
            std::fs::rename(&tmp, dir.join(format!("f{t}-{i}")))?;
        }
        thirds.push(t0.elapsed().as_secs_f64() * 1000.0 / (n / 3) as f64);
    }
    std::fs::remove_dir_all(&dir)?;
    thirds.sort_by(f64::total_cmp);
    Ok(thirds[1])
}

fn graph(kind: &str, n: usize, parallelism: usize) -> Result<String> {
    let mut g = format!(
        "title: bench {kind} {n}\nvars:\n  block: \"{}\"\nnodes:\n",
        "x".repeat(4096)
    );
    match kind {
        "chain" => {
            for i in 0..n {
                let cond = if i == 0 {
                    "true".to_owned()
                } else {
                    format!("nodes.c{}.value", i - 1)
                };
                g.push_str(&format!(
                    "  - {{id: c{i}, type: condition, if: \"{cond}\"}}\n"
                ));
            }
        }
        "write" => {
            for i in 0..n {
                let needs = if i == 0 {
                    String::new()
                } else {
                    format!(", needs: [w{}]", i - 1)
                };
                g.push_str(&format!(
                    "  - {{id: w{i}, type: write_file, path: \"docs/{{{{run_id}}}}/w{i}.txt\", content: \"{{{{vars.block}}}}\"{needs}}}\n"
                ));
            }
        }
        "fanout" => {
            let items: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            g.push_str(&format!(
                "  - id: fan\n    type: map\n    parallelism: {parallelism}\n    over: [{}]\n    node: {{type: write_file, path: \"docs/{{{{run_id}}}}/f{{{{item}}}}.txt\", content: \"{{{{vars.block}}}}\"}}\n",
                items.join(", ")
            ));
        }
        other => bail!("unknown scenario {other}"),
    }
    Ok(g)
}

async fn channel(addr: &str, tls_dir: Option<&std::path::Path>) -> Result<Channel> {
    let Some(dir) = tls_dir else {
        return Ok(Endpoint::from_shared(addr.to_owned())?
            .tcp_nodelay(true)
            .connect()
            .await?);
    };
    let tls = cairn_server::TlsConfig::dir(dir).load("cli")?;
    Ok(cairn_server::endpoint(addr, tls.as_ref(), None)?
        .connect()
        .await?)
}

/// Runs one graph; returns (seconds, record bytes, record files).
async fn run_once(
    orch: &OrchestratorClient<Channel>,
    store: &mut ArtifactStoreClient<Channel>,
    yaml: &str,
) -> Result<(f64, u64, usize)> {
    let (run_id, secs) = submit_and_follow(orch.clone(), yaml.to_owned()).await?;
    // The final snapshot is written right after task.completed; wait for it before measuring.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut bytes = 0;
    let mut files = 0;
    let mut token = String::new();
    loop {
        let page = store
            .list(ListRequest {
                project_id: PROJECT.into(),
                prefix: format!(".cairn/runs/{run_id}"),
                recursive: true,
                page: Some(PageRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                }),
            })
            .await?
            .into_inner();
        for e in &page.entries {
            bytes += e.size_bytes;
            files += 1;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    Ok((secs, bytes, files))
}

/// The store's own costs, measured in the same session: a sequential 4 KiB Put (fsync'd file
/// and directory) and a sequential one-event AppendEvents (fsync'd), in ms each.
async fn baseline(store: &mut ArtifactStoreClient<Channel>, n: usize) -> Result<(f64, f64, f64)> {
    let put = put_loop(store, n, PutDurability::Sync).await?;
    let deferred = put_loop(store, n, PutDurability::WithRunEvents).await?;
    let t0 = Instant::now();
    for _ in 0..n {
        store
            .append_events(AppendEventsRequest {
                project_id: PROJECT.into(),
                run_id: format!("baseline-{}", std::process::id()),
                epoch: 0,
                publication_tokens: Vec::new(),
                events: vec![EventInput {
                    r#type: "bench.tick".into(),
                    data_json: "{}".into(),
                    ..Default::default()
                }],
                claim: String::new(),
            })
            .await?;
    }
    let append = t0.elapsed().as_secs_f64() * 1000.0 / n as f64;
    Ok((put, deferred, append))
}

/// Sequential 4 KiB Puts with `durability`, in ms each.
async fn put_loop(
    store: &mut ArtifactStoreClient<Channel>,
    n: usize,
    durability: PutDurability,
) -> Result<f64> {
    let t0 = Instant::now();
    for i in 0..n {
        let msgs = vec![
            PutRequest {
                msg: Some(put_request::Msg::Header(PutHeader {
                    project_id: PROJECT.into(),
                    path: format!(
                        "docs/baseline/{}/{}/p{i}.txt",
                        std::process::id(),
                        durability.as_str_name()
                    ),
                    create_project: true,
                    run_id: format!("baseline-{}", std::process::id()),
                    durability: durability as i32,
                    ..Default::default()
                })),
            },
            PutRequest {
                msg: Some(put_request::Msg::Chunk(bytes::Bytes::from(vec![
                    b'x';
                    4096
                ]))),
            },
        ];
        store.put(tokio_stream::iter(msgs)).await?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1000.0 / n as f64)
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let orch = OrchestratorClient::new(channel(&cli.orch, cli.tls_dir.as_deref()).await?)
        .max_encoding_message_size(64 << 20);
    let mut store = ArtifactStoreClient::new(channel(&cli.store, cli.tls_dir.as_deref()).await?);
    let (put, deferred, append) = baseline(&mut store, 300).await?;
    println!("{{\"system\": \"artifact-store alone\", \"put_4k_ms\": {put:.4}, \"put_4k_with_run_events_ms\": {deferred:.4}, \"append_event_ms\": {append:.4}}}");
    // Warm-up (connections, first project creation).
    run_once(&orch, &mut store, &graph("chain", 10, 1)?).await?;
    if !cli.concurrent.is_empty() {
        for &runs in &cli.concurrent {
            concurrent(&orch, runs, cli.orch_pid).await?;
        }
        return Ok(());
    }
    for kind in &cli.only {
        let yaml = graph(kind, cli.nodes, cli.parallelism)?;
        let mut runs = Vec::new();
        let mut plain = Vec::new();
        for _ in 0..cli.repeat {
            if let Some(dir) = &cli.scratch {
                plain.push(fsync_write_ms(dir, 150)?);
            }
            runs.push(run_once(&orch, &mut store, &yaml).await?);
        }
        plain.sort_by(f64::total_cmp);
        let plain_ms = plain.get(plain.len() / 2).copied().unwrap_or(f64::NAN);
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (secs, bytes, files) = runs[runs.len() / 2];
        let all: Vec<String> = runs.iter().map(|r| format!("{:.3}", r.0)).collect();
        // One JSON line per scenario; bench/orchestrator.sh makes the table.
        println!(
            "{{\"system\": \"cairn\", \"scenario\": \"{kind}\", \"nodes\": {}, \"seconds\": {secs:.4}, \"ms_per_node\": {:.4}, \"record_bytes\": {bytes}, \"record_files\": {files}, \"runs\": [{}], \"fsync_write_ms\": {plain_ms:.4}}}",
            cli.nodes,
            secs * 1000.0 / cli.nodes as f64,
            all.join(", ")
        );
    }
    Ok(())
}
