//! Run history benchmark (bench/runs.sh): ListRuns and ListRunSummaries first pages against
//! the walk ListRuns used to do (List of .cairn/runs + Get of every state.json), and ReadEvents
//! of a log's tail with and without the seek index.
//!
//! `gen-runs` and `gen-events` write run directories straight into a data root (before the
//! store starts, which then builds its indexes from them): generating 100,000 runs through
//! gRPC would take longer than the measurement.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::orchestrator_client::OrchestratorClient;
use cairn_proto::v1::{
    EntryKind, GetRequest, ListRequest, ListRunSummariesRequest, ListRunsRequest, PageRequest,
    ReadEventsRequest,
};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Writes N finished runs (state.json, README.md) under <data-root>/projects/<project>.
    GenRuns {
        #[arg(long)]
        data_root: PathBuf,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long)]
        runs: u64,
    },
    /// Writes a run whose events.jsonl holds N events, as the store writes them.
    GenEvents {
        #[arg(long)]
        data_root: PathBuf,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long)]
        run: String,
        #[arg(long)]
        events: u64,
    },
    /// ListRuns / ListRunSummaries first pages, and the walk, side by side.
    List {
        #[arg(long)]
        store: String,
        #[arg(long)]
        orch: String,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long, default_value_t = 100)]
        page_size: u32,
        #[arg(long, default_value_t = 200)]
        iters: usize,
        /// Walks to time (0 = none).
        #[arg(long, default_value_t = 5)]
        walks: usize,
    },
    /// Times finding the runs to resume at start-up: every page of ListRunSummaries
    /// `unfinished` (what the orchestrator asks), with the walk it replaced (List of the run
    /// directories and a Get of every state.json) beside it.
    Unfinished {
        #[arg(long)]
        store: String,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Walks to time (0 = none).
        #[arg(long, default_value_t = 3)]
        walks: usize,
    },
    /// Times the first ListRunSummaries after a store start (it waits for the index load).
    FirstQuery {
        #[arg(long)]
        store: String,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long)]
        label: String,
    },
    /// ReadEvents of the last `tail` events of `run`, with `scan_run` (same log, no usable
    /// seek index) beside it.
    Tail {
        #[arg(long)]
        store: String,
        #[arg(long, default_value = "bench")]
        project: String,
        #[arg(long)]
        run: String,
        #[arg(long)]
        scan_run: String,
        #[arg(long)]
        events: u64,
        #[arg(long, default_value_t = 100)]
        tail: u64,
        #[arg(long, default_value_t = 50)]
        iters: usize,
        #[arg(long, default_value_t = 5)]
        scans: usize,
    },
}

const STATES: [&str; 3] = ["completed", "failed", "canceled"];

fn stamp(i: u64) -> String {
    // One run a minute from 2026-01-01, so every created_at differs.
    let (day, rest) = (i / 1440, i % 1440);
    let (month, day) = (1 + (day / 28) % 12, 1 + day % 28);
    let year = 2026 + day / (28 * 12);
    format!(
        "{year}-{month:02}-{day:02}T{:02}:{:02}:00.000Z",
        rest / 60,
        rest % 60
    )
}

fn gen_runs(root: PathBuf, project: &str, runs: u64) -> Result<()> {
    let dir = root.join("projects").join(project).join(".cairn/runs");
    std::fs::create_dir_all(&dir)?;
    for i in 0..runs {
        let run = format!("run-{i:07}");
        let created = stamp(i);
        let state = serde_json::json!({
            "run_id": run, "project": project, "title": format!("benchmark run {i}"),
            "goal": format!("goal {} of the benchmark", i % 97), "topology": "dag", "llm": "",
            "state": if i % 100 == 0 { "working" } else { STATES[(i % 3) as usize] },
            "created_at": created, "updated_at": created,
            "created_by": "bench", "notes": 0, "last_seq": 12, "events_seq": 12,
            "nodes": (0..3).map(|n| serde_json::json!({
                "id": format!("n{n}"), "type": "write_file", "title": format!("step {n}"),
                "state": "succeeded", "attempts": 1, "turn": 1, "resets": 0,
                "started_at": created, "finished_at": created, "outputs": {"path": format!("docs/{run}-{n}.md")},
            })).collect::<Vec<_>>(),
            "roster": [],
        });
        let run_dir = dir.join(&run);
        std::fs::create_dir_all(&run_dir)?;
        std::fs::write(run_dir.join("state.json"), serde_json::to_vec(&state)?)?;
        std::fs::write(run_dir.join("README.md"), format!("# benchmark run {i}\n"))?;
        // The 12 events the snapshot folded in (what start-up checks a final run against).
        let events: String = (1..=12)
            .map(|seq| {
                format!("{{\"seq\":{seq},\"ts\":\"{created}\",\"type\":\"node.completed\",\"run_id\":\"{run}\",\"level\":\"info\"}}\n")
            })
            .collect();
        std::fs::write(run_dir.join("events.jsonl"), events)?;
    }
    Ok(())
}

fn gen_events(root: PathBuf, project: &str, run: &str, events: u64) -> Result<()> {
    let dir = root
        .join("projects")
        .join(project)
        .join(".cairn/runs")
        .join(run);
    std::fs::create_dir_all(&dir)?;
    let mut out = std::io::BufWriter::with_capacity(
        4 << 20,
        std::fs::File::create(dir.join("events.jsonl"))?,
    );
    for seq in 1..=events {
        writeln!(
            out,
            "{{\"ts\":\"2026-01-01T00:00:00.000Z\",\"seq\":{seq},\"type\":\"node.progress\",\"run_id\":\"{run}\",\"node_id\":\"n{}\",\"level\":\"info\",\"message\":\"step {seq} of the benchmark log\"}}",
            seq % 50
        )?;
    }
    out.flush()?;
    Ok(())
}

async fn channel(addr: &str) -> Result<Channel> {
    Channel::from_shared(addr.to_owned())?
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

fn pct(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1000.0
}

fn report(what: &str, n: u64, samples: &mut [Duration]) {
    println!(
        "{{\"bench\":\"{what}\",\"runs_or_events\":{n},\"samples\":{},\"p50_ms\":{:.2},\"p99_ms\":{:.2},\"max_ms\":{:.2}}}",
        samples.len(),
        pct(samples, 0.5),
        pct(samples, 0.99),
        pct(samples, 1.0)
    );
}

/// What ListRuns did before the index: list the run directories (pages of 10,000), Get every
/// state.json, parse, sort newest first, cut the first page.
/// Runs of every page of ListRunSummaries (only `unfinished` ones if asked).
async fn count_runs(
    store: &mut ArtifactStoreClient<Channel>,
    project: &str,
    unfinished: bool,
) -> Result<u64> {
    let mut n = 0;
    let mut token = String::new();
    loop {
        let p = store
            .list_run_summaries(ListRunSummariesRequest {
                project_id: project.to_owned(),
                page: Some(PageRequest {
                    page_size: 10_000,
                    page_token: token,
                }),
                unfinished,
                ..Default::default()
            })
            .await?
            .into_inner();
        n += p.runs.len() as u64;
        token = p.next_page_token;
        if token.is_empty() {
            return Ok(n);
        }
    }
}

async fn walk(
    store: &mut ArtifactStoreClient<Channel>,
    project: &str,
    page: usize,
) -> Result<usize> {
    let mut dirs = Vec::new();
    let mut token = String::new();
    loop {
        let r = store
            .list(ListRequest {
                project_id: project.into(),
                prefix: ".cairn/runs".into(),
                recursive: false,
                page: Some(PageRequest {
                    page_size: 10_000,
                    page_token: token.clone(),
                }),
            })
            .await?
            .into_inner();
        dirs.extend(
            r.entries
                .into_iter()
                .filter(|e| e.kind == EntryKind::Directory as i32)
                .map(|e| e.path),
        );
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    let mut runs = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let mut stream = store
            .get(GetRequest {
                project_id: project.into(),
                path: format!("{dir}/state.json"),
                offset: 0,
                length: 0,
            })
            .await?
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(msg) = stream.next().await {
            if let Some(cairn_proto::v1::get_response::Msg::Chunk(c)) = msg?.msg {
                bytes.extend_from_slice(&c);
            }
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        let created = v["created_at"].as_str().unwrap_or("").to_owned();
        runs.push((created, dir, v));
    }
    runs.sort_by(|a, b| (&b.0, &b.1).cmp(&(&a.0, &a.1)));
    runs.truncate(page);
    Ok(runs.len())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::GenRuns {
            data_root,
            project,
            runs,
        } => gen_runs(data_root, &project, runs),
        Cmd::GenEvents {
            data_root,
            project,
            run,
            events,
        } => gen_events(data_root, &project, &run, events),
        Cmd::Unfinished {
            store,
            project,
            iters,
            walks,
        } => {
            let mut store = ArtifactStoreClient::new(channel(&store).await?)
                .max_decoding_message_size(64 << 20);
            let total = count_runs(&mut store, &project, false).await?;
            let mut found = 0;
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                found = count_runs(&mut store, &project, true).await?;
                samples.push(t.elapsed());
            }
            anyhow::ensure!(found > 0, "no unfinished run found");
            println!(
                "{{\"bench\":\"unfinished_runs_found\",\"runs\":{total},\"unfinished\":{found}}}"
            );
            report("find_unfinished_index", total, &mut samples);
            if walks > 0 {
                let mut samples = Vec::with_capacity(walks);
                for _ in 0..walks {
                    let t = Instant::now();
                    walk(&mut store, &project, usize::MAX).await?;
                    samples.push(t.elapsed());
                }
                report("find_unfinished_walk_baseline", total, &mut samples);
            }
            Ok(())
        }
        Cmd::FirstQuery {
            store,
            project,
            label,
        } => {
            let mut store = ArtifactStoreClient::new(channel(&store).await?);
            let t = Instant::now();
            store
                .list_run_summaries(ListRunSummariesRequest {
                    project_id: project,
                    ..Default::default()
                })
                .await?;
            println!(
                "{{\"bench\":\"first_query_after_start_ms\",\"index\":\"{label}\",\"ms\":{:.1}}}",
                t.elapsed().as_secs_f64() * 1000.0
            );
            Ok(())
        }
        Cmd::List {
            store,
            orch,
            project,
            page_size,
            iters,
            walks,
        } => {
            let mut store = ArtifactStoreClient::new(channel(&store).await?)
                .max_decoding_message_size(64 << 20);
            let mut orch =
                OrchestratorClient::new(channel(&orch).await?).max_decoding_message_size(64 << 20);
            let first = store
                .list_run_summaries(ListRunSummariesRequest {
                    project_id: project.clone(),
                    page: Some(PageRequest {
                        page_size,
                        page_token: String::new(),
                    }),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let total = {
                let mut n = first.runs.len() as u64;
                let mut token = first.next_page_token;
                while !token.is_empty() {
                    let p = store
                        .list_run_summaries(ListRunSummariesRequest {
                            project_id: project.clone(),
                            page: Some(PageRequest {
                                page_size: 10_000,
                                page_token: token,
                            }),
                            ..Default::default()
                        })
                        .await?
                        .into_inner();
                    n += p.runs.len() as u64;
                    token = p.next_page_token;
                }
                n
            };
            let list_runs = |token: String, text: &str| ListRunsRequest {
                project_id: project.clone(),
                page: Some(PageRequest {
                    page_size,
                    page_token: token,
                }),
                text: text.into(),
                ..Default::default()
            };
            for (name, text) in [
                ("list_runs_first_page", ""),
                ("list_runs_first_page_text_filter", "run 1"),
            ] {
                let mut samples = Vec::with_capacity(iters);
                for _ in 0..iters {
                    let t = Instant::now();
                    let r = orch
                        .list_runs(list_runs(String::new(), text))
                        .await?
                        .into_inner();
                    samples.push(t.elapsed());
                    anyhow::ensure!(!r.runs.is_empty(), "ListRuns returned no runs");
                }
                report(name, total, &mut samples);
            }
            // A page deep in the history costs what the first does.
            let mut token = String::new();
            for _ in 0..(total / u64::from(page_size) / 2) {
                token = orch
                    .list_runs(list_runs(token, ""))
                    .await?
                    .into_inner()
                    .next_page_token;
            }
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                orch.list_runs(list_runs(token.clone(), "")).await?;
                samples.push(t.elapsed());
            }
            report("list_runs_middle_page", total, &mut samples);
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                store
                    .list_run_summaries(ListRunSummariesRequest {
                        project_id: project.clone(),
                        page: Some(PageRequest {
                            page_size,
                            page_token: String::new(),
                        }),
                        ..Default::default()
                    })
                    .await?;
                samples.push(t.elapsed());
            }
            report("list_run_summaries_first_page", total, &mut samples);
            if walks > 0 {
                let mut samples = Vec::with_capacity(walks);
                for _ in 0..walks {
                    let t = Instant::now();
                    walk(&mut store, &project, page_size as usize).await?;
                    samples.push(t.elapsed());
                }
                report("walk_first_page_baseline", total, &mut samples);
            }
            Ok(())
        }
        Cmd::Tail {
            store,
            project,
            run,
            scan_run,
            events,
            tail,
            iters,
            scans,
        } => {
            let store = ArtifactStoreClient::new(channel(&store).await?)
                .max_decoding_message_size(64 << 20);
            let from = events - tail + 1;
            let read = |run: String| {
                let mut store = store.clone();
                let project = project.clone();
                async move {
                    let t = Instant::now();
                    let mut s = store
                        .read_events(ReadEventsRequest {
                            project_id: project,
                            run_id: run,
                            from_seq: from,
                            follow: false,
                            limit: 0,
                        })
                        .await?
                        .into_inner();
                    let mut seqs = Vec::new();
                    while let Some(e) = s.next().await {
                        seqs.push(e?.seq);
                    }
                    let took = t.elapsed();
                    anyhow::ensure!(
                        seqs == (from..=events).collect::<Vec<_>>(),
                        "ReadEvents returned {} events, not {from}..={events}",
                        seqs.len()
                    );
                    anyhow::Ok(took)
                }
            };
            // First touch opens the log (and brings its seek index in line).
            let first = read(run.clone()).await?;
            println!(
                "{{\"bench\":\"read_events_first_touch_ms\",\"ms\":{:.1}}}",
                first.as_secs_f64() * 1000.0
            );
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                samples.push(read(run.clone()).await?);
            }
            report("read_events_last_100_seek", events, &mut samples);
            let mut samples = Vec::with_capacity(scans);
            for _ in 0..scans {
                samples.push(read(scan_run.clone()).await?);
            }
            report("read_events_last_100_scan_baseline", events, &mut samples);
            Ok(())
        }
    }
}
