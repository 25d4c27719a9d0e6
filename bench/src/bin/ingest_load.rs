//! Ingest benchmark (bench/ingest.sh runs it and prints the table recorded in bench/RESULTS.md).
//!
//! Each figure is measured next to its baseline in the same run, on the same bytes:
//! - `parse`: ingest's parser (fence scan + header matcher + path rules + sha256 of every block)
//!   over a generated document vs `openssl dgst -sha256` and an in-process sha256 of the same
//!   bytes (the parser must not be the bottleneck: parse+hash >= 50% of hashing alone);
//! - `e2e`: Ingest of a document with many small blocks into a running store (blocks/s) vs the
//!   same writes and events sent straight to the store (the store's share of the time) and the
//!   dry run (Parse);
//! - `gen` writes the corpus (each block also preceded by its file name on its own line, the
//!   convention aider's whole-file parser reads, so both parsers can run on the same bytes).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::ingest_client::IngestClient;
use cairn_proto::v1::{
    put_request, AppendEventsRequest, CreateProjectRequest, EventInput, IngestRequest, PutHeader,
    PutRequest,
};
use clap::{Parser, Subcommand};
use futures::StreamExt;
use tonic::transport::{Channel, Endpoint};

const MB: f64 = 1_000_000.0;

#[derive(Debug, Parser)]
#[command(
    name = "ingest_load",
    about = "Ingest benchmark: corpus generator, parser throughput, end-to-end ingest"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Writes a deterministic Markdown document of about BYTES bytes with BLOCKS blocks.
    Gen {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 100_000_000)]
        bytes: usize,
        #[arg(long, default_value_t = 10_000)]
        blocks: usize,
    },
    /// Parser throughput on FILE next to openssl dgst -sha256 and in-process sha256.
    Parse {
        #[arg(long)]
        file: PathBuf,
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Also write the written blocks (path, bytes, sha256) and the parse time as JSON here.
        #[arg(long)]
        dump: Option<PathBuf>,
    },
    /// End-to-end Ingest of BLOCKS small blocks against running ingest and store services.
    E2e {
        #[arg(long)]
        ingest_addr: String,
        #[arg(long)]
        store_addr: String,
        #[arg(long, default_value_t = 2000)]
        blocks: usize,
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// The ingest service's write_concurrency (the direct replay uses the same).
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Gen { out, bytes, blocks } => {
            let doc = corpus(bytes, blocks);
            std::fs::write(&out, &doc).with_context(|| format!("writing {}", out.display()))?;
            println!(
                "wrote {} ({} bytes, {blocks} blocks)",
                out.display(),
                doc.len()
            );
            Ok(())
        }
        Cmd::Parse { file, reps, dump } => parse(file, reps, dump),
        Cmd::E2e {
            ingest_addr,
            store_addr,
            blocks,
            reps,
            concurrency,
        } => e2e(&ingest_addr, &store_addr, blocks, reps, concurrency).await,
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const WORDS: &[&str] = &[
    "value", "result", "config", "items", "index", "buffer", "client", "request", "total",
    "offset", "parse", "render", "store", "limit", "window", "token", "header", "payload",
    "cursor", "record",
];

/// One line of Python-looking code.
fn code_line(rng: &mut Rng, out: &mut String) {
    let indent = ["", "    ", "        "][rng.below(3) as usize];
    let a = WORDS[rng.below(WORDS.len() as u64) as usize];
    let b = WORDS[rng.below(WORDS.len() as u64) as usize];
    let n = rng.below(100_000);
    match rng.below(6) {
        0 => out.push_str(&format!("{indent}def {a}_{n}({b}, {a}=None):\n")),
        1 => out.push_str(&format!(
            "{indent}{a}_{n} = {b}.get(\"{a}\", {n})  # keep {b} in sync\n"
        )),
        2 => out.push_str(&format!("{indent}for {a} in range({n}):\n")),
        3 => out.push_str(&format!("{indent}return {a}_{n} + {b}_{n} * {n}\n")),
        4 => out.push('\n'),
        _ => out.push_str(&format!("{indent}if {a} is not None and {b} > {n}:\n")),
    }
}

/// The corpus: prose, then blocks of about `bytes / blocks` bytes each. Planted for the peer
/// comparison: every 97th block is a README whose content has its own ``` fences (a 4-backtick
/// block), every 499th repeats an earlier path (last wins here), every 1009th has a malformed
/// header (`path=`), and block 5003 (if any) declares a traversal path.
fn corpus(bytes: usize, blocks: usize) -> Vec<u8> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let per_block = bytes / blocks.max(1);
    let mut doc = String::with_capacity(bytes + bytes / 10);
    doc.push_str("# Implementation\n\nThe project is split into the modules below.\n\n");
    for i in 0..blocks {
        let path = if i % 499 == 498 {
            format!("src/pkg_{}/mod_{}.py", (i - 400) % 50, i - 400)
        } else if i == 5003 {
            "../outside.py".to_owned()
        } else if i % 97 == 96 {
            format!("docs/readme_{i}.md")
        } else {
            format!("src/pkg_{}/mod_{i}.py", i % 50)
        };
        doc.push_str(&format!("Module {i} follows.\n\n{path}\n"));
        let mut body = String::with_capacity(per_block + 100);
        if i % 97 == 96 {
            doc.push_str(&format!("````markdown file={path}\n"));
            body.push_str("# Usage\n\n```sh\npip install demo\npython -m demo\n```\n\n");
            while body.len() < per_block {
                body.push_str("Some words about the module and how to use it.\n");
            }
            doc.push_str(&body);
            doc.push_str("````\n\n");
            continue;
        }
        if i % 1009 == 1008 {
            doc.push_str(&format!("```python path={path}\n"));
        } else {
            doc.push_str(&format!("```python file={path}\n"));
        }
        while body.len() < per_block {
            code_line(&mut rng, &mut body);
        }
        doc.push_str(&body);
        doc.push_str("```\n\n");
    }
    doc.into_bytes()
}

/// Runs a command, returns its wall time and stdout.
fn timed(cmd: &mut Command) -> Result<(Duration, String)> {
    let start = Instant::now();
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((elapsed, String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn parse(file: PathBuf, reps: usize, dump: Option<PathBuf>) -> Result<()> {
    let doc = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let mb = doc.len() as f64 / MB;
    let limits = cairn_ingest::Limits {
        max_document_bytes: u64::MAX,
        max_blocks: u32::MAX,
        ..Default::default()
    };
    let policy = pathguard::Policy::default();
    let no_denylist = pathguard::Policy::new(Vec::new(), Vec::new());
    let (mut ours, mut ssl, mut sha, mut bare) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut blocks = Vec::new();
    for _ in 0..reps.max(1) {
        let (t, _) = timed(Command::new("openssl").args(["dgst", "-sha256"]).arg(&file))?;
        ssl.push(mb / t.as_secs_f64());
        let start = Instant::now();
        let digest = cairn_sha256::sha256(&doc);
        std::hint::black_box(digest);
        sha.push(mb / start.elapsed().as_secs_f64());
        let start = Instant::now();
        blocks = cairn_ingest::parse(std::hint::black_box(&doc), &limits, &policy);
        ours.push(mb / start.elapsed().as_secs_f64());
        let start = Instant::now();
        std::hint::black_box(cairn_ingest::parse(
            std::hint::black_box(&doc),
            &limits,
            &no_denylist,
        ));
        bare.push(mb / start.elapsed().as_secs_f64());
    }
    let (ours, ssl, sha, bare) = (median(ours), median(ssl), median(sha), median(bare));
    let written = blocks
        .iter()
        .filter(|b| b.status == cairn_ingest::BlockStatus::Written)
        .count();
    println!("| parse + sha256 of every block (cairn-ingest) | {ours:.0} MB/s | {} recorded, {written} written |", blocks.len());
    let ratio = ours / ssl;
    let verdict = if ratio >= 0.85 { "met" } else { "**missed**" };
    println!(
        "| `openssl dgst -sha256` of the same file | {ssl:.0} MB/s | ratio parse/openssl = {ratio:.2}; target >= 0.85: {verdict} |"
    );
    println!(
        "| in-process sha256 (cairn-sha256, aws-lc) of the same bytes | {sha:.0} MB/s | ratio parse/in-process sha256 = {:.2} |",
        ours / sha
    );
    println!(
        "| the same parse with an empty denylist (pathguard's denylist check left out) | {bare:.0} MB/s | ratio to openssl = {:.2} |",
        bare / ssl
    );
    if let Some(dump) = dump {
        let entries: Vec<serde_json::Value> = blocks
            .iter()
            .map(|b| {
                serde_json::json!({
                    "index": b.index, "declared_file": b.declared_file, "status": b.status.as_str(),
                    "reason": b.reason, "bytes": b.bytes, "sha256": b.sha256,
                })
            })
            .collect();
        let out =
            serde_json::json!({ "seconds": mb / ours, "bytes": doc.len(), "blocks": entries });
        std::fs::write(&dump, out.to_string())
            .with_context(|| format!("writing {}", dump.display()))?;
    }
    Ok(())
}

async fn channel(addr: &str) -> Result<Channel> {
    Endpoint::from_shared(addr.to_owned())?
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// A document of `blocks` small Python files (about 300 bytes each).
fn small_blocks_doc(blocks: usize) -> Vec<u8> {
    let mut rng = Rng(42);
    let mut doc = String::new();
    for i in 0..blocks {
        let mut body = String::new();
        while body.len() < 300 {
            code_line(&mut rng, &mut body);
        }
        doc.push_str(&format!(
            "File {i}:\n\n```python file=src/pkg_{}/mod_{i}.py\n{body}```\n\n",
            i % 20
        ));
    }
    doc.into_bytes()
}

async fn e2e(
    ingest_addr: &str,
    store_addr: &str,
    blocks: usize,
    reps: usize,
    concurrency: usize,
) -> Result<()> {
    let mut ingest =
        IngestClient::new(channel(ingest_addr).await?).max_decoding_message_size(64 << 20);
    let store = ArtifactStoreClient::new(channel(store_addr).await?);
    let doc = Bytes::from(small_blocks_doc(blocks));
    let policy = pathguard::Policy::default();
    let parsed = cairn_ingest::parse(
        &doc,
        &cairn_ingest::Limits {
            max_blocks: u32::MAX,
            ..Default::default()
        },
        &policy,
    );

    let (mut full, mut dry, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps.max(1) {
        let request = |project: String| IngestRequest {
            project_id: project,
            run_id: "bench".into(),
            node_id: "n1".into(),
            mode: "single".into(),
            doc_path: "docs/bench.md".into(),
            content: doc.clone(),
            ..Default::default()
        };
        let start = Instant::now();
        let reply = ingest
            .ingest(request(format!("e2e-{rep}")))
            .await?
            .into_inner();
        full.push(start.elapsed().as_secs_f64());
        let written = reply.summary.map(|s| s.written).unwrap_or(0) as usize;
        if written != blocks {
            bail!(
                "ingest wrote {written} of {blocks} blocks: {:?}",
                reply.errors.first()
            );
        }

        let start = Instant::now();
        ingest.parse(request(format!("e2e-{rep}"))).await?;
        dry.push(start.elapsed().as_secs_f64());

        // The store's part alone: the same project creation, Puts (same concurrency), event
        // appends and manifest write, straight from this client.
        let project = format!("direct-{rep}");
        let start = Instant::now();
        let mut client = store.clone();
        client
            .create_project(CreateProjectRequest {
                project_id: project.clone(),
            })
            .await?;
        let events = |n: usize| -> Vec<EventInput> {
            (0..n)
                .map(|i| EventInput {
                    r#type: "ingest.block.written".into(),
                    node_id: "n1".into(),
                    level: 2,
                    data_json: format!("{{\"index\":{i},\"path\":\"workspace/x\",\"reason\":\"\",\"bytes\":300,\"sha256\":\"{}\"}}", "0".repeat(64)),
                })
                .collect()
        };
        client
            .append_events(AppendEventsRequest {
                project_id: project.clone(),
                run_id: "bench".into(),
                epoch: 0,
                publication_tokens: Vec::new(),
                events: events(1),
                claim: String::new(),
            })
            .await?;
        let puts = parsed.iter().map(|b| {
            let mut client = store.clone();
            let header = PutHeader {
                project_id: project.clone(),
                path: b.workspace_path.clone(),
                expected_sha256: b.sha256.clone(),
                expected_size: Some(b.bytes),
                allowed_prefixes: vec!["workspace".into()],
                run_id: "bench".into(),
                create_project: true,
                ..Default::default()
            };
            let content = doc.slice(b.content.clone());
            async move {
                let messages = vec![
                    PutRequest {
                        msg: Some(put_request::Msg::Header(header)),
                    },
                    PutRequest {
                        msg: Some(put_request::Msg::Chunk(content)),
                    },
                ];
                client
                    .put(futures::stream::iter(messages))
                    .await
                    .map(|_| ())
            }
        });
        let results: Vec<_> = futures::stream::iter(puts)
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        for r in results {
            r?;
        }
        let manifest = Bytes::from(vec![b' '; 300 * blocks]);
        let header = PutHeader {
            project_id: project.clone(),
            path: ".cairn/runs/bench/ingest/n1.json".into(),
            overwrite: true,
            create_project: true,
            ..Default::default()
        };
        let messages = vec![
            PutRequest {
                msg: Some(put_request::Msg::Header(header)),
            },
            PutRequest {
                msg: Some(put_request::Msg::Chunk(manifest)),
            },
        ];
        client.put(futures::stream::iter(messages)).await?;
        for chunk in events(blocks + 1).chunks(500) {
            client
                .append_events(AppendEventsRequest {
                    project_id: project.clone(),
                    run_id: "bench".into(),
                    epoch: 0,
                    publication_tokens: Vec::new(),
                    events: chunk.to_vec(),
                    claim: String::new(),
                })
                .await?;
        }
        direct.push(start.elapsed().as_secs_f64());
    }
    let (full, dry, direct) = (median(full), median(dry), median(direct));
    println!(
        "| Ingest of {blocks} blocks ({} KB document), write_concurrency {concurrency} | {full:.2} s | {:.0} blocks/s |",
        doc.len() / 1000,
        blocks as f64 / full
    );
    println!(
        "| Parse (dry run) of the same document over gRPC: ingest's own work | {dry:.3} s | {:.1}% of Ingest, so the store's share is {:.0}% |",
        100.0 * dry / full,
        100.0 * (full - dry) / full
    );
    println!(
        "| the same writes + events sent straight to the store (baseline) | {direct:.2} s | Ingest / baseline = {:.2} |",
        full / direct
    );
    Ok(())
}
