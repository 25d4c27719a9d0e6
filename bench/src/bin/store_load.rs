//! Load generator for the artifact-store benchmark (bench/store.sh runs it against a release
//! `cairn-artifact-store` on loopback and prints the table recorded in bench/RESULTS.md).
//!
//! Each figure is measured next to its baseline in the same run, on the same bytes:
//! - streamed Put of a large file vs `dd bs=4M conv=fsync` and `openssl dgst -sha256` of it;
//! - durable 4 KiB writes per second vs a plain write+fsync+rename loop in one process;
//! - Stat latency (p50/p99) over loopback gRPC.

use std::fs::File;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, CreateProjectRequest, DeleteRequest, EventInput, PutHeader,
    PutRequest, StatRequest,
};
use clap::{Parser, Subcommand};
use tonic::transport::{Channel, Endpoint};

const PROJECT: &str = "bench";
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Parser)]
#[command(
    name = "store_load",
    about = "Artifact-store load generator and baselines"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Writes SIZE deterministic pseudo-random bytes to OUT (the benchmark's input file).
    Gen {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1 << 30)]
        size: u64,
    },
    /// One streamed Put of FILE (prints MiB/s).
    Put {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        file: PathBuf,
        #[arg(long, default_value_t = 1 << 20)]
        chunk: usize,
    },
    /// Durable 4 KiB Puts from CALLERS callers next to the plain write+fsync+rename loop (with
    /// and without the directory fsync), interleaved ROUNDS times: the one-caller figure alone,
    /// quick to repeat while profiling the store (`strace -c -f -p <store pid>` during it).
    Small {
        #[arg(long)]
        addr: String,
        /// Scratch directory for the loops (same filesystem as the store's data root).
        #[arg(long)]
        work: PathBuf,
        #[arg(long, default_value_t = 1000)]
        count: usize,
        #[arg(long, default_value_t = 1)]
        callers: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Runs every measurement with its baselines and prints a Markdown table.
    All {
        /// Store address (http://127.0.0.1:PORT).
        #[arg(long)]
        addr: String,
        /// A second store started with `direct_io = false`: its large Put is measured in the
        /// same repetitions (what O_DIRECT changes).
        #[arg(long)]
        page_cache_addr: Option<String>,
        /// Input file for the large-file comparison (see `gen`).
        #[arg(long)]
        file: PathBuf,
        /// Scratch directory for the baselines (same filesystem as the store's data root).
        #[arg(long)]
        work: PathBuf,
        /// Repetitions of the large-file measurements (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Number of 4 KiB files per small-file measurement.
        #[arg(long, default_value_t = 3000)]
        small_count: usize,
        /// Concurrency levels of the small-file Puts.
        #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
        concurrency: Vec<usize>,
        /// Number of Stat calls.
        #[arg(long, default_value_t = 20000)]
        stat_count: usize,
    },
    /// What mutual TLS costs: the same large Put and durable 4 KiB Puts against a plaintext
    /// store and a TLS store (same filesystem), interleaved, with the ratio.
    Tls {
        /// The plaintext store (http://127.0.0.1:PORT).
        #[arg(long)]
        plain_addr: String,
        /// The store serving mutual TLS (127.0.0.1:PORT).
        #[arg(long)]
        tls_addr: String,
        /// The PKI both sides use (`cairn certs init`); the client dials as `cli`.
        #[arg(long)]
        tls_dir: PathBuf,
        /// Input file for the large Put (see `gen`).
        #[arg(long)]
        file: PathBuf,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Number of 4 KiB files per small-file measurement.
        #[arg(long, default_value_t = 2000)]
        small_count: usize,
        /// Concurrency of the small-file Puts.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Pids of the plaintext and the TLS store: their CPU time per large Put is reported
        /// beside the client's (what each side pays, whatever else the machine runs).
        #[arg(long, num_args = 2, value_names = ["PLAIN", "TLS"])]
        pids: Vec<u32>,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Gen { out, size } => generate(&out, size),
        Cmd::Put { addr, file, chunk } => {
            let mut client = client(&addr, None).await?;
            client
                .create_project(CreateProjectRequest {
                    project_id: PROJECT.into(),
                })
                .await?;
            let size = std::fs::metadata(&file)?.len();
            let t = put_file(&mut client, &file, "workspace/put.bin", "", chunk).await?;
            println!("{:.0} MiB/s", size as f64 / MIB / t.as_secs_f64());
            client
                .delete(DeleteRequest {
                    project_id: PROJECT.into(),
                    path: "workspace/put.bin".into(),
                    run_id: String::new(),
                })
                .await?;
            Ok(())
        }
        Cmd::Tls {
            plain_addr,
            tls_addr,
            tls_dir,
            file,
            reps,
            small_count,
            concurrency,
            pids,
        } => {
            let tls = cairn_server::TlsConfig::dir(&tls_dir).load("cli")?;
            let mut plain = client(&plain_addr, None).await?;
            let mut secure = client(&tls_addr, tls.as_ref()).await?;
            run_tls(
                &mut plain,
                &mut secure,
                &file,
                reps,
                small_count,
                concurrency,
                &pids,
            )
            .await
        }
        Cmd::Small {
            addr,
            work,
            count,
            callers,
            rounds,
        } => {
            let client = client(&addr, None).await?;
            run_small(&client, &work, count, callers, rounds).await
        }
        Cmd::All {
            addr,
            page_cache_addr,
            file,
            work,
            reps,
            small_count,
            concurrency,
            stat_count,
        } => {
            run_all(
                &addr,
                page_cache_addr.as_deref(),
                &file,
                &work,
                reps,
                small_count,
                &concurrency,
                stat_count,
            )
            .await
        }
    }
}

fn generate(out: &Path, size: u64) -> Result<()> {
    let mut f = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for word in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

async fn client(
    addr: &str,
    tls: Option<&cairn_server::Tls>,
) -> Result<ArtifactStoreClient<Channel>> {
    // The same HTTP/2 windows as cairn's own clients (`cairn_server::connect`).
    let channel = match tls {
        None => {
            Endpoint::from_shared(addr.to_owned())?
                .tcp_nodelay(true)
                .initial_stream_window_size(cairn_server::STREAM_WINDOW)
                .initial_connection_window_size(cairn_server::CONNECTION_WINDOW)
                .connect()
                .await?
        }
        Some(tls) => {
            cairn_server::endpoint(addr, Some(tls), None)?
                .connect()
                .await?
        }
    };
    Ok(ArtifactStoreClient::new(channel).max_decoding_message_size(16 << 20))
}

fn timed(cmd: &mut Command) -> Result<(Duration, String)> {
    let started = Instant::now();
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let elapsed = started.elapsed();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((elapsed, String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Streams `file` as one Put (chunks read by a blocking thread, 8 queued).
async fn put_file(
    client: &mut ArtifactStoreClient<Channel>,
    file: &Path,
    path: &str,
    sha256: &str,
    chunk: usize,
) -> Result<Duration> {
    let (tx, rx) = tokio::sync::mpsc::channel::<PutRequest>(8);
    let header = PutHeader {
        project_id: PROJECT.into(),
        path: path.into(),
        expected_sha256: sha256.into(),
        create_project: true,
        ..Default::default()
    };
    let file = file.to_owned();
    let started = Instant::now();
    tx.send(PutRequest {
        msg: Some(put_request::Msg::Header(header)),
    })
    .await?;
    let reader = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut f = File::open(&file)?;
        loop {
            let mut buf = vec![0u8; chunk];
            let mut filled = 0;
            while filled < buf.len() {
                let n = f.read(&mut buf[filled..])?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                return Ok(());
            }
            buf.truncate(filled);
            if tx
                .blocking_send(PutRequest {
                    msg: Some(put_request::Msg::Chunk(Bytes::from(buf))),
                })
                .is_err()
            {
                return Ok(());
            }
        }
    });
    let response = client
        .put(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    reader.await??;
    let elapsed = started.elapsed();
    let digest = response.digest.context("no digest")?;
    if !sha256.is_empty() && digest.sha256 != sha256 {
        bail!(
            "store digest {} differs from openssl's {sha256}",
            digest.sha256
        );
    }
    Ok(elapsed)
}

/// One 4 KiB body, distinct per index.
fn small_body(i: usize) -> Bytes {
    let mut body = vec![b'.'; 4096];
    let stamp = format!("file {i}\n");
    body[..stamp.len()].copy_from_slice(stamp.as_bytes());
    Bytes::from(body)
}

/// The baseline: write a temp file, fsync it, rename it into place (optionally fsync the
/// directory too), one file after another in one process; files `range` of `dir`.
fn small_baseline(dir: &Path, range: Range<usize>, sync_dir: bool) -> Result<Duration> {
    std::fs::create_dir_all(dir)?;
    let dir_handle = File::open(dir)?;
    let started = Instant::now();
    for i in range {
        let tmp = dir.join(format!(".tmp-{i}"));
        let mut f = File::create(&tmp)?;
        f.write_all(&small_body(i))?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(format!("f-{i}")))?;
        if sync_dir {
            dir_handle.sync_all()?;
        }
    }
    Ok(started.elapsed())
}

/// Files per second.
fn rate(count: usize, took: Duration) -> f64 {
    count as f64 / took.as_secs_f64()
}

/// One caller's durable Puts and both plain loops, `count` files each, interleaved in blocks
/// of `block` files (loop, loop with the directory fsync, Puts, then the next block), so the
/// three see the same phases of a disk other programs share: (plain, dirsync, Puts) per second.
async fn small_interleaved(
    client: &ArtifactStoreClient<Channel>,
    work: &Path,
    prefix: &str,
    count: usize,
    block: usize,
) -> Result<(f64, f64, f64)> {
    let (plain_dir, dirsync_dir) = (work.join("plain"), work.join("plain-dirsync"));
    let mut took = [Duration::ZERO; 3];
    let mut start = 0;
    while start < count {
        let range = start..(start + block).min(count);
        took[0] += small_baseline(&plain_dir, range.clone(), false)?;
        took[1] += small_baseline(&dirsync_dir, range.clone(), true)?;
        took[2] += small_store(client, prefix, range.clone(), 1).await?;
        start = range.end;
    }
    std::fs::remove_dir_all(&plain_dir)?;
    std::fs::remove_dir_all(&dirsync_dir)?;
    Ok((
        rate(count, took[0]),
        rate(count, took[1]),
        rate(count, took[2]),
    ))
}

/// 4 KiB Puts of files `range` under `prefix` from `concurrency` tasks.
async fn small_store(
    client: &ArtifactStoreClient<Channel>,
    prefix: &str,
    range: Range<usize>,
    concurrency: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let mut client = client.clone();
        let prefix = prefix.to_owned();
        let end = range.end;
        let first = range.start + t;
        tasks.push(tokio::spawn(async move {
            let mut i = first;
            while i < end {
                let header = PutHeader {
                    project_id: PROJECT.into(),
                    path: format!("{prefix}/f-{i}"),
                    ..Default::default()
                };
                let msgs = vec![
                    PutRequest {
                        msg: Some(put_request::Msg::Header(header)),
                    },
                    PutRequest {
                        msg: Some(put_request::Msg::Chunk(small_body(i))),
                    },
                ];
                client.put(tokio_stream::iter(msgs)).await?;
                i += concurrency;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// The small-file comparison alone (one caller: interleaved in blocks of 100 files), medians
/// of `rounds` printed.
async fn run_small(
    client: &ArtifactStoreClient<Channel>,
    work: &Path,
    count: usize,
    callers: usize,
    rounds: usize,
) -> Result<()> {
    let mut c = client.clone();
    c.create_project(CreateProjectRequest {
        project_id: PROJECT.into(),
    })
    .await?;
    println!("machine: {}", machine());
    let (mut plain, mut dirsync, mut put) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let prefix = format!("small-{}/r{round}", std::process::id());
        let (p, d, s) = if callers == 1 {
            small_interleaved(client, work, &prefix, count, 100).await?
        } else {
            let dir = work.join("small-plain");
            let p = rate(count, small_baseline(&dir, 0..count, false)?);
            std::fs::remove_dir_all(&dir)?;
            let d = rate(count, small_baseline(&dir, 0..count, true)?);
            std::fs::remove_dir_all(&dir)?;
            let s = rate(
                count,
                small_store(client, &prefix, 0..count, callers).await?,
            );
            (p, d, s)
        };
        eprintln!(
            "round {round}: plain loop {p:.0}/s, loop with directory fsync {d:.0}/s, Puts ({callers} callers) {s:.0}/s"
        );
        plain.push(p);
        dirsync.push(d);
        put.push(s);
    }
    let (plain, dirsync, put) = (median(plain), median(dirsync), median(put));
    println!(
        "medians of {rounds}: plain loop {plain:.0} files/s, with directory fsync {dirsync:.0} files/s, \
         durable Puts ({callers} callers) {put:.0} files/s = {:.0}% of the plain loop, {:.0}% of the loop with the directory fsync",
        put / plain * 100.0,
        put / dirsync * 100.0
    );
    Ok(())
}

/// `callers` tasks each appending `each` single-event calls to one run; events per second.
async fn events_store(
    client: &ArtifactStoreClient<Channel>,
    run: &str,
    callers: usize,
    each: usize,
) -> Result<f64> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let mut client = client.clone();
        let run = run.to_owned();
        tasks.push(tokio::spawn(async move {
            for i in 0..each {
                let event = EventInput {
                    r#type: "bench.tick".into(),
                    data_json: format!("{{\"c\":{c},\"i\":{i}}}"),
                    ..Default::default()
                };
                client
                    .append_events(AppendEventsRequest {
                        project_id: PROJECT.into(),
                        run_id: run.clone(),
                        epoch: 0,
                        publication_tokens: Vec::new(),
                        events: vec![event],
                        claim: String::new(),
                    })
                    .await?;
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((callers * each) as f64 / started.elapsed().as_secs_f64())
}

/// The baseline: append one line and fdatasync, one event after another.
fn events_baseline(path: &Path, count: usize) -> Result<f64> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let started = Instant::now();
    for i in 0..count {
        writeln!(f, "{{\"seq\":{i},\"type\":\"bench.tick\"}}")?;
        f.sync_data()?;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{model}, {cores} cores, kernel {}, load average at start {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[allow(clippy::too_many_arguments)]
async fn run_all(
    addr: &str,
    page_cache_addr: Option<&str>,
    file: &Path,
    work: &Path,
    reps: usize,
    small_count: usize,
    concurrency: &[usize],
    stat_count: usize,
) -> Result<()> {
    let size = std::fs::metadata(file)?.len();
    let mut page_cache = match page_cache_addr {
        Some(addr) => {
            let mut c = client(addr, None).await?;
            c.create_project(CreateProjectRequest {
                project_id: PROJECT.into(),
            })
            .await?;
            Some(c)
        }
        None => None,
    };
    let mut client = client(addr, None).await?;
    client
        .create_project(CreateProjectRequest {
            project_id: PROJECT.into(),
        })
        .await?;
    println!("machine: {}", machine());
    println!("input: {} ({:.0} MiB)\n", file.display(), size as f64 / MIB);

    // Large file: dd, openssl and the store, interleaved per repetition.
    let (mut dd, mut ssl, mut put, mut put_pc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        let out = work.join("dd.out");
        let (t, _) = timed(
            Command::new("dd")
                .arg(format!("if={}", file.display()))
                .arg(format!("of={}", out.display()))
                .args(["bs=4M", "conv=fsync", "status=none"]),
        )?;
        dd.push(size as f64 / MIB / t.as_secs_f64());
        std::fs::remove_file(&out)?;
        let (t, stdout) = timed(Command::new("openssl").args(["dgst", "-sha256"]).arg(file))?;
        ssl.push(size as f64 / MIB / t.as_secs_f64());
        let sha256 = stdout
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        let path = format!("workspace/big-{rep}.bin");
        let t = put_file(&mut client, file, &path, &sha256, 1 << 20).await?;
        put.push(size as f64 / MIB / t.as_secs_f64());
        client
            .delete(DeleteRequest {
                project_id: PROJECT.into(),
                path: path.clone(),
                run_id: String::new(),
            })
            .await?;
        if let Some(c) = page_cache.as_mut() {
            let t = put_file(c, file, &path, &sha256, 1 << 20).await?;
            put_pc.push(size as f64 / MIB / t.as_secs_f64());
            c.delete(DeleteRequest {
                project_id: PROJECT.into(),
                path: path.clone(),
                run_id: String::new(),
            })
            .await?;
        }
        eprintln!(
            "rep {rep}: dd {:.0} MiB/s, openssl {:.0} MiB/s, put {:.0} MiB/s, page-cache put {}",
            dd[rep],
            ssl[rep],
            put[rep],
            put_pc
                .get(rep)
                .map_or("-".into(), |v| format!("{v:.0} MiB/s"))
        );
    }
    let put_pc = (!put_pc.is_empty()).then(|| median(put_pc));
    let (dd, ssl, put) = (median(dd), median(ssl), median(put));
    let slower = dd.min(ssl);

    // Small durable files: one caller interleaved with the loops, in blocks of 100 files.
    let (base, base_dirsync, one) =
        small_interleaved(&client, work, "small/c1", small_count, 100).await?;
    let mut small = Vec::new();
    for &c in concurrency {
        let rate = match c {
            1 => one,
            c => rate(
                small_count,
                small_store(&client, &format!("small/c{c}"), 0..small_count, c).await?,
            ),
        };
        eprintln!("small files, concurrency {c}: {rate:.0}/s");
        small.push((c, rate));
    }

    // Events: 32 callers x 500 single-event calls vs an append+fdatasync loop.
    let ev_base = events_baseline(&work.join("events.jsonl"), 2000)?;
    let ev = events_store(&client, "bench-events", 32, 500).await?;
    eprintln!("events: {ev:.0}/s (baseline {ev_base:.0}/s)");

    // Stat latency.
    let header = PutHeader {
        project_id: PROJECT.into(),
        path: "docs/stat-me.txt".into(),
        overwrite: true,
        ..Default::default()
    };
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header)),
        },
        PutRequest {
            msg: Some(put_request::Msg::Chunk(small_body(0))),
        },
    ];
    client.put(tokio_stream::iter(msgs)).await?;
    let mut lat = Vec::with_capacity(stat_count);
    for _ in 0..stat_count {
        let started = Instant::now();
        client
            .stat(StatRequest {
                project_id: PROJECT.into(),
                path: "docs/stat-me.txt".into(),
                include_sha256: false,
            })
            .await?;
        lat.push(started.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];

    println!("| measurement | figure | baseline (same run) | ratio | target |");
    println!("|---|---|---|---|---|");
    println!("| `dd bs=4M conv=fsync` of the input | {dd:.0} MiB/s | | | |");
    println!("| `openssl dgst -sha256` of the input | {ssl:.0} MiB/s | | | |");
    println!(
        "| streamed Put, 1 MiB chunks, loopback gRPC (median of {reps}) | {put:.0} MiB/s | {slower:.0} MiB/s (slower of dd/openssl) | {:.0}% | >= 95% {} |",
        put / slower * 100.0,
        if put / slower >= 0.95 { "met" } else { "**missed**" }
    );
    if let Some(pc) = put_pc {
        println!(
            "| the same Put through the page cache (`direct_io = false`, second store) | {pc:.0} MiB/s | {slower:.0} MiB/s | {:.0}% | |",
            pc / slower * 100.0
        );
    }
    println!("| plain write+fsync+rename loop, 4 KiB (blocks of 100 files alternating with the loop below and the one-caller Puts) | {base:.0} files/s | | | |");
    println!(
        "| plain write+fsync+rename+fsync(dir) loop, 4 KiB | {base_dirsync:.0} files/s | | | |"
    );
    for (c, rate) in &small {
        // One caller: >= 60% of the loop; with concurrency (group commit): >= 50%.
        let target = if *c == 1 { 0.6 } else { 0.5 };
        println!(
            "| durable 4 KiB Puts, concurrency {c} | {rate:.0} files/s | {base:.0} files/s (plain loop; with the directory fsync {base_dirsync:.0}) | {:.0}% ({:.0}% of the loop with the directory fsync) | >= {:.0}% {} |",
            rate / base * 100.0,
            rate / base_dirsync * 100.0,
            target * 100.0,
            if rate / base >= target { "met" } else { "**missed**" }
        );
    }
    println!("| plain append+fdatasync loop, one event per sync | {ev_base:.0} events/s | | | |");
    println!(
        "| AppendEvents, 32 callers x 500 single-event calls (group commit) | {ev:.0} events/s | {ev_base:.0} events/s | {:.0}% | |",
        ev / ev_base * 100.0
    );
    println!(
        "| Stat over loopback gRPC, sequential ({stat_count} calls) | p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs | | | |",
        pct(0.50),
        pct(0.99),
        lat[lat.len() - 1]
    );
    Ok(())
}

/// Plaintext and TLS stores side by side: per repetition the large Put and the small Puts on
/// each, the order alternating so neither always runs on a warmer machine.
async fn run_tls(
    plain: &mut ArtifactStoreClient<Channel>,
    secure: &mut ArtifactStoreClient<Channel>,
    file: &Path,
    reps: usize,
    small_count: usize,
    concurrency: usize,
    pids: &[u32],
) -> Result<()> {
    for c in [&mut *plain, &mut *secure] {
        c.create_project(CreateProjectRequest {
            project_id: PROJECT.into(),
        })
        .await?;
    }
    let size = std::fs::metadata(file)?.len();
    println!("machine: {}", machine());
    println!("input: {} ({:.0} MiB)\n", file.display(), size as f64 / MIB);
    let (mut big, mut small) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    // CPU seconds per GiB of the large Put: [side] of (server, client).
    let (mut server_cpu, mut client_cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let gib = size as f64 / (1u64 << 30) as f64;
    for rep in 0..reps {
        let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let c = if side == 0 { &mut *plain } else { &mut *secure };
            let path = format!("workspace/tls-big-{rep}.bin");
            let server = pids.get(side).copied();
            let (s0, c0) = (
                server.and_then(cpu_seconds),
                cpu_seconds(std::process::id()),
            );
            let t = put_file(c, file, &path, "", 1 << 20).await?;
            if let (Some(s0), Some(s1)) = (s0, server.and_then(cpu_seconds)) {
                server_cpu[side].push((s1 - s0) / gib);
            }
            if let (Some(c0), Some(c1)) = (c0, cpu_seconds(std::process::id())) {
                client_cpu[side].push((c1 - c0) / gib);
            }
            big[side].push(size as f64 / MIB / t.as_secs_f64());
            c.delete(DeleteRequest {
                project_id: PROJECT.into(),
                path,
                run_id: String::new(),
            })
            .await?;
            let took =
                small_store(c, &format!("tls-small/r{rep}"), 0..small_count, concurrency).await?;
            small[side].push(rate(small_count, took));
        }
        eprintln!(
            "rep {rep}: put plain {:.0} / tls {:.0} MiB/s; 4 KiB plain {:.0} / tls {:.0} files/s",
            big[0][rep], big[1][rep], small[0][rep], small[1][rep]
        );
    }
    let [bp, bt] = big.map(median);
    let [sp, st] = small.map(median);
    let row = |what: &str, unit: &str, p: f64, t: f64| {
        println!(
            "| {what} | {t:.0} {unit} | {p:.0} {unit} (plaintext) | {:.0}% | >= 90% {} |",
            t / p * 100.0,
            if t / p >= 0.9 { "met" } else { "**missed**" }
        );
    };
    println!("| measurement (median of {reps}) | mutual TLS | same run | ratio | target |");
    println!("|---|---|---|---|---|");
    row("streamed Put of the input, 1 MiB chunks", "MiB/s", bp, bt);
    row(
        &format!("durable 4 KiB Puts, concurrency {concurrency}"),
        "files/s",
        sp,
        st,
    );
    if !server_cpu[0].is_empty() {
        let [cp, ct] = client_cpu.map(median);
        let [sp, st] = server_cpu.map(median);
        println!(
            "\nCPU seconds per GiB of the large Put (median): store {sp:.2} plaintext / {st:.2} TLS \
             (the store serves {:.0}% of its plaintext bytes per CPU second over TLS); \
             client {cp:.2} / {ct:.2}",
            sp / st * 100.0
        );
    }
    Ok(())
}

/// User + system CPU seconds of process `pid` so far (from /proc; None if unreadable).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // /proc counts in USER_HZ, 100 on Linux's x86_64 and arm64 ABIs.
    Some(ticks / 100.0)
}
