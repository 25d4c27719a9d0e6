//! Session snapshot benchmark (bench/snapshot.sh): two running cairn-sandbox-runner processes
//! (A and B, the same backend and image) over gRPC. Each round opens a session on A (a cold
//! open, the baseline), starts a detached Python process holding `--mib` MiB, pauses the
//! session into a snapshot (in memory here), resumes it on B and checks the process is still
//! there; then resumes the last snapshot `--forks` times at once on B. Prints markdown.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cairn_proto::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::{CloseSessionRequest, ExecRequest, OpenSessionRequest, PauseSessionRequest};
use cairn_runner_client::snapshot;
use clap::Parser;
use tonic::transport::Channel;

#[derive(Parser, Debug)]
struct Args {
    /// Runner A (sessions are opened and paused here).
    #[arg(long)]
    a: String,
    /// Runner B (snapshots are resumed here).
    #[arg(long)]
    b: String,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long, default_value_t = 10)]
    forks: usize,
    /// MiB the Python process holds (touched, so resident).
    #[arg(long, default_value_t = 100)]
    mib: u64,
}

type Client = SandboxRunnerClient<Channel>;

fn client(addr: &str) -> Result<Client> {
    Ok(SandboxRunnerClient::new(cairn_server::connect(addr)?)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20))
}

async fn exec(c: &mut Client, id: &str, command: &str, detach: bool) -> Result<String> {
    let r = c
        .exec(ExecRequest {
            session_id: id.into(),
            command: command.into(),
            detach,
            ..Default::default()
        })
        .await?
        .into_inner();
    if r.exit_code != 0 {
        bail!(
            "{command}: exit {}: {}",
            r.exit_code,
            String::from_utf8_lossy(&r.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&r.stdout).trim().to_owned())
}

async fn close(c: &mut Client, id: String) -> Result<()> {
    c.close_session(CloseSessionRequest { session_id: id })
        .await?;
    Ok(())
}

async fn resume(mut c: Client, file: &[u8]) -> Result<String> {
    let mut reader = std::io::Cursor::new(file.to_vec());
    let header = snapshot::read_header(&mut reader).await?;
    let info = c
        .resume_session(snapshot::parts(header, reader, String::new()))
        .await?
        .into_inner();
    Ok(info.session_id)
}

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let (mut a, mut b) = (client(&args.a)?, client(&args.b)?);
    let holder = format!(
        "python3 -c 'b = bytearray({} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nopen(\"/tmpfs/ready\", \"w\").write(\"1\")\nimport time\nwhile True: time.sleep(1)'",
        args.mib
    );
    let (mut open_ms, mut pause_ms, mut resume_ms, mut sizes) = (vec![], vec![], vec![], vec![]);
    let mut memory = false;
    let mut last = Vec::new();
    for _ in 0..args.runs {
        let t = Instant::now();
        let id = a
            .open_session(OpenSessionRequest::default())
            .await?
            .into_inner()
            .session_id;
        open_ms.push(ms(t));
        let pid = exec(&mut a, &id, &holder, true).await?;
        let t0 = Instant::now();
        while exec(&mut a, &id, "cat /tmpfs/ready 2>/dev/null || true", false).await? != "1" {
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("the holder did not fill its memory in 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let t = Instant::now();
        let stream = a
            .pause_session(PauseSessionRequest {
                session_id: id,
                files_only: false,
            })
            .await?
            .into_inner();
        let mut file = Vec::new();
        let saved = snapshot::save(stream, &mut file).await?;
        pause_ms.push(ms(t));
        memory = saved.header.memory;
        sizes.push(saved.file_bytes as f64);
        let t = Instant::now();
        let resumed = resume(b.clone(), &file).await?;
        resume_ms.push(ms(t));
        if memory {
            exec(&mut b, &resumed, &format!("kill -0 {pid}"), false)
                .await
                .context("the holder is not running after the resume")?;
        }
        close(&mut b, resumed).await?;
        last = file;
    }
    let t = Instant::now();
    let forks =
        futures::future::try_join_all((0..args.forks).map(|_| resume(b.clone(), &last))).await?;
    let fork_ms = ms(t);
    for id in forks {
        close(&mut b, id).await?;
    }
    let p_open = p50(&mut open_ms);
    let p_pause = p50(&mut pause_ms);
    let p_resume = p50(&mut resume_ms);
    let size = p50(&mut sizes);
    println!("| step | runs | p50 ms | vs cold open |");
    println!("|---|---:|---:|---:|");
    println!(
        "| cold OpenSession on A (baseline) | {} | {p_open:.0} | 1.00x |",
        args.runs
    );
    println!(
        "| PauseSession on A ({} MiB process, memory: {memory}) | {} | {p_pause:.0} | {:.2}x |",
        args.mib,
        args.runs,
        p_pause / p_open
    );
    println!(
        "| ResumeSession on B | {} | {p_resume:.0} | {:.2}x |",
        args.runs,
        p_resume / p_open
    );
    println!(
        "| fork x{} on B (all at once, total) | 1 | {fork_ms:.0} | {:.2}x |",
        args.forks,
        fork_ms / p_open
    );
    println!();
    println!(
        "snapshot size p50: {:.1} MiB; pause stream {:.0} MiB/s",
        size / 1048576.0,
        size / 1048576.0 / (p_pause / 1000.0)
    );
    Ok(())
}
