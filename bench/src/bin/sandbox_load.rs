//! Sandbox-runner benchmark (bench/sandbox.sh): python `print(1)` through running
//! cairn-sandbox-runner processes over gRPC (cold docker, warm pool, local backend cold and with
//! its pool of waiting sandboxes), side by side with raw `docker run --rm`, raw `docker exec`
//! into a running container and a bare `python3 -c`, plus 20/50 concurrent runs against 20
//! concurrent raw `docker run --rm`. Prints markdown.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cairn_proto::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::{GetRunnerInfoRequest, RunRequest};
use clap::Parser;
use tonic::transport::Channel;

const CODE: &str = "print(1)";

#[derive(Parser, Debug)]
struct Args {
    /// Runner with the docker backend and no pool.
    #[arg(long, default_value = "", required_unless_present = "gvisor")]
    cold: String,
    /// Runner with the docker backend and a warm pool.
    #[arg(long, default_value = "", required_unless_present = "gvisor")]
    warm: String,
    /// Pool size of the warm runner (each warm run waits until the pool is full again, so it
    /// measures a run on an idle pool, not the refill).
    #[arg(long, default_value_t = 4)]
    pool: u32,
    /// Runner with the local backend.
    #[arg(long)]
    local: Option<String>,
    /// Runner with the local backend and `--pool` waiting sandboxes.
    #[arg(long)]
    local_pool: Option<String>,
    #[arg(long, default_value = "cairn-sandbox:latest")]
    image: String,
    /// Only the gvisor rows: runner with the gvisor backend and no pool (the docker runners
    /// are then not needed).
    #[arg(long)]
    gvisor: Option<String>,
    /// Runner with the gvisor backend and a pool of `pool` waiting sandboxes.
    #[arg(long)]
    gvisor_pool: Option<String>,
    /// runsc platform of the `runsc do` baseline (gvisor rows).
    #[arg(long, default_value = "ptrace")]
    gvisor_platform: String,
    /// Interpreter for the bare baseline.
    #[arg(long, default_value = "/usr/bin/python3")]
    python: String,
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Only the concurrent-runs table (the docker runners; no latency rows).
    #[arg(long)]
    throughput_only: bool,
}

struct Stats {
    label: String,
    p50: f64,
    p95: f64,
    n: usize,
}

/// The latency table and the p50 ratios (`(label, row a, row b)`: a / b) as Markdown.
fn print_latencies(rows: &[Stats], ratios: &[(&str, usize, usize)]) {
    println!("| path | runs | p50 ms | p95 ms |");
    println!("|---|---:|---:|---:|");
    for r in rows {
        println!("| {} | {} | {:.1} | {:.1} |", r.label, r.n, r.p50, r.p95);
    }
    println!();
    for (label, a, b) in ratios {
        println!("- {label}: {:.2}x (p50)", rows[*a].p50 / rows[*b].p50);
    }
}

fn stats(label: &str, mut ms: Vec<f64>) -> Stats {
    ms.sort_by(|a, b| a.total_cmp(b));
    let n = ms.len();
    let at = |q: f64| ms[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Stats {
        label: label.to_owned(),
        p50: at(0.5),
        p95: at(0.95),
        n,
    }
}

async fn connect(addr: &str) -> Result<SandboxRunnerClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(SandboxRunnerClient::new(channel))
}

fn request() -> RunRequest {
    RunRequest {
        language: "python".into(),
        code: CODE.into(),
        ..Default::default()
    }
}

async fn one_run(
    client: &mut SandboxRunnerClient<Channel>,
    want_warm: Option<bool>,
) -> Result<f64> {
    Ok(one_run_inner(client, want_warm).await?.0)
}

/// Client-side latency and whether the run came from the pool.
async fn run_pool_or_not(client: &mut SandboxRunnerClient<Channel>) -> Result<(f64, bool)> {
    let t0 = Instant::now();
    let out = client.run(request()).await?.into_inner();
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    if out.exit_code != 0 || out.stdout.as_ref() != b"1\n" {
        bail!("run failed: exit {} stderr {:?}", out.exit_code, out.stderr);
    }
    let rj: serde_json::Value = serde_json::from_str(&out.result_json)?;
    Ok((ms, rj["warm"] == true))
}

/// Client-side latency and the runner's own `duration_ms` (program start to exit).
async fn one_run_inner(
    client: &mut SandboxRunnerClient<Channel>,
    want_warm: Option<bool>,
) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let out = client.run(request()).await?.into_inner();
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    if out.exit_code != 0 || out.stdout.as_ref() != b"1\n" {
        bail!(
            "run failed: exit {} stdout {:?} stderr {:?}",
            out.exit_code,
            out.stdout,
            out.stderr
        );
    }
    if let Some(w) = want_warm {
        let rj: serde_json::Value = serde_json::from_str(&out.result_json)?;
        if rj["warm"] != w {
            bail!("expected warm={w}, result.json says {}", rj["warm"]);
        }
    }
    Ok((ms, out.duration_ms as f64))
}

async fn wait_warm(client: &mut SandboxRunnerClient<Channel>, want: u32) -> Result<()> {
    let t0 = Instant::now();
    while client
        .get_runner_info(GetRunnerInfoRequest {})
        .await?
        .into_inner()
        .warm_containers
        < want
    {
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("no warm container after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

fn time_cmd(argv: &[&str]) -> Result<f64> {
    let t0 = Instant::now();
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() || out.stdout != b"1\n" {
        bail!(
            "{argv:?} failed: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(ms)
}

async fn concurrent_runs(addr: &str, n: usize) -> Result<(f64, usize)> {
    let client = connect(addr).await?;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { one_run(&mut c, None).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        if t.await?.is_ok() {
            ok += 1;
        }
    }
    Ok((t0.elapsed().as_secs_f64(), ok))
}

fn concurrent_docker(image: &str, n: usize) -> Result<(f64, usize)> {
    let t0 = Instant::now();
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new("docker")
                .args([
                    "run",
                    "--rm",
                    "--network",
                    "none",
                    image,
                    "python3",
                    "-c",
                    CODE,
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut ok = 0;
    for c in children {
        let out = c.wait_with_output()?;
        if out.status.success() && out.stdout == b"1\n" {
            ok += 1;
        }
    }
    Ok((t0.elapsed().as_secs_f64(), ok))
}

fn containers_of(runner_id: &str, kind: &str) -> Result<usize> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=cairn.runner_id={runner_id}"),
        ])
        .args(["--filter", &format!("label=cairn.kind={kind}")])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().count())
}

/// `docker run --rm --network none IMAGE python3 -c CODE`, timed.
fn raw_docker_run(image: &str) -> Result<f64> {
    time_cmd(&[
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        image,
        "python3",
        "-c",
        CODE,
    ])
}

/// `runsc --platform=P --network=none do /usr/bin/python3 -c CODE`, timed: gVisor's own
/// one-shot sandbox, no runner.
fn raw_runsc_do(platform: &str) -> Result<f64> {
    time_cmd(&[
        "runsc",
        &format!("--platform={platform}"),
        "--network=none",
        "do",
        "/usr/bin/python3",
        "-c",
        CODE,
    ])
}

/// The gvisor rows: cold and pooled runs, each interleaved with raw `docker run --rm` and raw
/// `runsc do`, and 20 concurrent runs against 20 concurrent `docker run --rm`.
async fn gvisor_rows(args: &Args, cold_addr: &str) -> Result<()> {
    let runs = args.runs;
    let mut cold = connect(cold_addr).await.context("gvisor runner")?;
    let platform = &args.gvisor_platform;
    one_run(&mut cold, Some(false)).await?;
    raw_docker_run(&args.image)?;
    raw_runsc_do(platform)?;
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let (mut ours, mut raw, mut inside, mut runsc) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (ms, sandbox_ms) = one_run_inner(&mut cold, Some(false)).await?;
        ours.push(ms);
        inside.push(sandbox_ms);
        raw.push(raw_docker_run(&args.image)?);
        runsc.push(raw_runsc_do(platform)?);
    }
    let runsc_label = format!("raw `runsc --platform={platform} --network=none do python3 -c`");
    rows.push(stats("cairn Run, gvisor cold (gRPC)", ours));
    rows.push(stats("raw `docker run --rm IMAGE python3 -c`", raw));
    rows.push(stats(&runsc_label, runsc));
    rows.push(stats(
        "(gvisor cold: runsc run + waiter + python, the runner's duration_ms)",
        inside,
    ));
    ratios.push(("gvisor cold / raw docker run", 0, 1));
    ratios.push(("gvisor cold / raw runsc do", 0, 2));
    if let Some(addr) = &args.gvisor_pool {
        let mut client = connect(addr).await?;
        wait_warm(&mut client, args.pool).await?;
        one_run(&mut client, Some(true)).await?;
        let (mut ours, mut raw, mut inside, mut runsc) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            wait_warm(&mut client, args.pool).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (ms, sandbox_ms) = one_run_inner(&mut client, Some(true)).await?;
            ours.push(ms);
            inside.push(sandbox_ms);
            raw.push(raw_docker_run(&args.image)?);
            runsc.push(raw_runsc_do(platform)?);
        }
        let at = rows.len();
        rows.push(stats("cairn Run, gvisor pooled (gRPC)", ours));
        rows.push(stats("raw `docker run --rm IMAGE python3 -c`", raw));
        rows.push(stats(&runsc_label, runsc));
        rows.push(stats(
            "(gvisor pooled: go line to exit status, the runner's duration_ms)",
            inside,
        ));
        ratios.push(("gvisor pooled / raw docker run", at, at + 1));
        ratios.push(("gvisor pooled / raw runsc do", at, at + 2));
    }
    print_latencies(&rows, &ratios);
    println!();
    println!("| concurrent | path | ok | seconds | runs/s |");
    println!("|---:|---|---:|---:|---:|");
    let (secs, ok) = concurrent_docker(&args.image, 20)?;
    let base = ok as f64 / secs;
    println!("| 20 | raw `docker run --rm` | {ok}/20 | {secs:.2} | {base:.1} |");
    let (secs, ok) = concurrent_runs(cold_addr, 20).await?;
    let rate = ok as f64 / secs;
    println!(
        "| 20 | cairn gvisor cold | {ok}/20 | {secs:.2} | {rate:.1} ({:.2}x) |",
        rate / base
    );
    Ok(())
}

/// 20 and 50 concurrent runs through the cold and the warm-pool docker runners (default
/// admission settings: calls above max_concurrent_runs queue), each beside 20 concurrent raw
/// `docker run --rm` measured just before it; every row says its ratio and target.
async fn throughput(args: &Args, warm: &mut SandboxRunnerClient<Channel>) -> Result<()> {
    println!();
    println!("| concurrent | path | ok | seconds | runs/s | raw `docker run --rm` x20 just before, runs/s | ratio | target |");
    println!("|---:|---|---:|---:|---:|---:|---:|---|");
    for (label, addr, target) in [
        ("cairn cold", &args.cold, 1.5),
        ("cairn warm pool", &args.warm, 2.5),
    ] {
        for n in [20usize, 50] {
            let (secs, ok) = concurrent_docker(&args.image, 20)?;
            let base = ok as f64 / secs;
            if label == "cairn warm pool" {
                wait_warm(warm, args.pool).await?;
            }
            let (secs, ok) = concurrent_runs(addr, n).await?;
            let rate = ok as f64 / secs;
            let ratio = rate / base;
            let verdict = if ok == n && ratio >= target {
                "met"
            } else {
                "**missed**"
            };
            println!(
                "| {n} | {label} (pool {}) | {ok}/{n} | {secs:.2} | {rate:.1} | {base:.1} | {ratio:.2}x | all succeed, >= {target}x: {verdict} |",
                if label == "cairn cold" { 0 } else { args.pool }
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(addr) = &args.gvisor {
        return gvisor_rows(&args, addr).await;
    }
    let runs = args.runs;
    let mut rows = Vec::new();

    // Warm up each path once (image cache, connections) before measuring.
    let mut cold = connect(&args.cold).await.context("cold runner")?;
    let mut warm = connect(&args.warm).await.context("warm runner")?;
    if args.throughput_only {
        one_run(&mut cold, Some(false)).await?;
        return throughput(&args, &mut warm).await;
    }
    one_run(&mut cold, Some(false)).await?;
    time_cmd(&[
        "docker",
        "run",
        "--rm",
        "--network",
        "none",
        &args.image,
        "python3",
        "-c",
        CODE,
    ])?;

    // Cold run over gRPC and raw docker run --rm, interleaved so both see the same load.
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        ours.push(one_run(&mut cold, Some(false)).await?);
        raw.push(time_cmd(&[
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            &args.image,
            "python3",
            "-c",
            CODE,
        ])?);
    }
    rows.push(stats("cairn Run, docker cold (gRPC)", ours));
    rows.push(stats("raw `docker run --rm IMAGE python3 -c`", raw));

    // Warm pool vs raw docker exec into a running container.
    let name = format!("cairn_bench_exec_{}", std::process::id());
    let started = Command::new("docker")
        .args([
            "run",
            "-d",
            "--rm",
            "--network",
            "none",
            "--name",
            &name,
            &args.image,
            "sleep",
            "infinity",
        ])
        .stdout(Stdio::null())
        .status()?;
    if !started.success() {
        bail!("could not start the docker exec baseline container");
    }
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    wait_warm(&mut warm, args.pool).await?;
    one_run(&mut warm, Some(true)).await?;
    for _ in 0..runs {
        wait_warm(&mut warm, args.pool).await?;
        // let the used container's background removal finish too
        tokio::time::sleep(Duration::from_millis(300)).await;
        ours.push(one_run(&mut warm, Some(true)).await?);
        raw.push(time_cmd(&["docker", "exec", &name, "python3", "-c", CODE])?);
    }
    let _ = Command::new("docker")
        .args(["rm", "-f", &name])
        .stdout(Stdio::null())
        .status();
    rows.push(stats("cairn Run, docker warm pool (gRPC)", ours));
    rows.push(stats("raw `docker exec CONTAINER python3 -c`", raw));

    // Local backend (cold, then pooled) vs bare python, each interleaved with its baseline.
    let mut ratios = vec![
        ("cold / raw docker run", 0, 1),
        ("warm / raw docker exec", 2, 3),
    ];
    if let Some(local) = &args.local {
        let mut client = connect(local).await?;
        one_run(&mut client, Some(false)).await?;
        let (mut ours, mut raw, mut inside) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let (ms, sandbox_ms) = one_run_inner(&mut client, Some(false)).await?;
            ours.push(ms);
            inside.push(sandbox_ms);
            raw.push(time_cmd(&[&args.python, "-c", CODE])?);
        }
        let at = rows.len();
        rows.push(stats("cairn Run, local backend cold (gRPC)", ours));
        rows.push(stats("bare `python3 -c`", raw));
        rows.push(stats(
            "(local cold: bwrap + prlimit + python alone, the runner's duration_ms)",
            inside,
        ));
        ratios.push(("local cold / bare python", at, at + 1));
        ratios.push((
            "local cold sandbox alone (bwrap + prlimit + python) / bare python",
            at + 2,
            at + 1,
        ));
    }
    if let Some(addr) = &args.local_pool {
        let mut client = connect(addr).await?;
        wait_warm(&mut client, args.pool).await?;
        one_run(&mut client, Some(true)).await?;
        // Idle pool: each run waits until the pool is full again (as the docker warm rows).
        let (mut ours, mut raw, mut inside) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            wait_warm(&mut client, args.pool).await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (ms, sandbox_ms) = one_run_inner(&mut client, Some(true)).await?;
            ours.push(ms);
            inside.push(sandbox_ms);
            raw.push(time_cmd(&[&args.python, "-c", CODE])?);
        }
        let at = rows.len();
        rows.push(stats("cairn Run, local backend pooled (gRPC)", ours));
        rows.push(stats("bare `python3 -c`", raw));
        rows.push(stats(
            "(local pooled: go line + python alone, the runner's duration_ms)",
            inside,
        ));
        ratios.push(("local pooled / bare python", at, at + 1));
        // Back to back: the refill of the previous run's sandbox shares the cores with this one.
        wait_warm(&mut client, args.pool).await?;
        let (mut ours, mut raw, mut warm) = (Vec::new(), Vec::new(), 0);
        for _ in 0..runs {
            let (ms, pooled) = run_pool_or_not(&mut client).await?;
            ours.push(ms);
            warm += usize::from(pooled);
            raw.push(time_cmd(&[&args.python, "-c", CODE])?);
        }
        let at = rows.len();
        rows.push(stats(
            &format!(
                "cairn Run, local pooled back to back, refill running; {warm}/{runs} from the pool (gRPC)"
            ),
            ours,
        ));
        rows.push(stats("bare `python3 -c`", raw));
        ratios.push(("local pooled back to back / bare python", at, at + 1));
    }

    print_latencies(&rows, &ratios);
    throughput(&args, &mut warm).await?;
    let cold_id = cold
        .get_runner_info(GetRunnerInfoRequest {})
        .await?
        .into_inner()
        .runner_id;
    let warm_info = warm
        .get_runner_info(GetRunnerInfoRequest {})
        .await?
        .into_inner();
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!();
    println!(
        "- containers left after the runs: cold runner {} run containers; warm runner {} run containers and {} pool containers (pool size kept ready)",
        containers_of(&cold_id, "run")?,
        containers_of(&warm_info.runner_id, "run")?,
        containers_of(&warm_info.runner_id, "pool")?,
    );
    Ok(())
}
