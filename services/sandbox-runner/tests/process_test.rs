//! The runner as its own process (the `cairn-sandbox-runner` binary): killed with -9 in the
//! middle of a run and restarted, it removes its leftovers; and its memory stays flat while a
//! program floods stdout or /output.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cairn_proto::sandbox_runner_client::SandboxRunnerClient;
use cairn_proto::{GetRunnerInfoRequest, Limits};
use cairn_sandbox_runner::BackendChoice;
use common::*;

struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn spawn_runner(
    backend: BackendChoice,
    work_root: &std::path::Path,
    runner_id: &str,
) -> (Proc, SandboxRunnerClient<tonic::transport::Channel>) {
    spawn_runner_with(backend, work_root, runner_id, &[]).await
}

async fn spawn_runner_with(
    backend: BackendChoice,
    work_root: &std::path::Path,
    runner_id: &str,
    extra: &[&str],
) -> (Proc, SandboxRunnerClient<tonic::transport::Channel>) {
    spawn_runner_env(backend, work_root, runner_id, extra, &[]).await
}

/// The runner process with `env` added to its environment.
async fn spawn_runner_env(
    backend: BackendChoice,
    work_root: &std::path::Path,
    runner_id: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Proc, SandboxRunnerClient<tonic::transport::Channel>) {
    let (proc, client, _) = spawn_runner_at(backend, work_root, runner_id, extra, env).await;
    (proc, client)
}

/// The runner process and a client of it, and its address.
async fn spawn_runner_at(
    backend: BackendChoice,
    work_root: &std::path::Path,
    runner_id: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Proc, SandboxRunnerClient<tonic::transport::Channel>, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_cairn-sandbox-runner"))
        .args([
            "--listen",
            &addr,
            "--runner-id",
            runner_id,
            "--image",
            &image(),
        ])
        .args(["--backend", backend_name(backend)])
        .arg("--work-root")
        .arg(work_root)
        .args(["--set", "kill_grace_ms=200"])
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc { child };
    let client = SandboxRunnerClient::new(cairn_server::connect(&addr).unwrap())
        .max_decoding_message_size(64 * 1024 * 1024);
    let t0 = Instant::now();
    loop {
        if client
            .clone()
            .get_runner_info(GetRunnerInfoRequest {})
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "runner did not come up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (proc, client, addr)
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_runner_removes_its_leftovers_on_restart() {
    for backend in cold_backends("restart_sweep").await {
        let work_root = tempfile::Builder::new()
            .prefix("cairn-sbx-restart")
            .tempdir()
            .unwrap();
        let (mut proc, client) =
            spawn_runner(backend.backend, work_root.path(), "restart-test-runner").await;
        let marker = format!("{}", 5000 + std::process::id() % 1000);
        let mut c = client.clone();
        let req = with_timeout(
            python(&format!(
                "import time\nprint('x', flush=True)\ntime.sleep({marker})\n"
            )),
            600_000,
        );
        let running = tokio::spawn(async move { c.run(req).await });
        // Wait until the run's sandbox exists, then kill the runner hard.
        let tasks = work_root.path().join("tasks");
        let t0 = Instant::now();
        loop {
            let exists = match backend.backend {
                BackendChoice::Docker => !containers_of("restart-test-runner").await.is_empty(),
                // The program runs inside gVisor's kernel, out of the host's process list.
                BackendChoice::Gvisor => gvisor_started(work_root.path()).await,
                _ => {
                    std::fs::read_dir(&tasks)
                        .map(|d| d.count() > 0)
                        .unwrap_or(false)
                        && !processes_with(&format!("time.sleep({marker})")).is_empty()
                }
            };
            if exists {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{backend:?}: the run never started"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        proc.child.kill().unwrap();
        proc.child.wait().unwrap();
        assert!(
            running.await.unwrap().is_err(),
            "the call fails with its runner"
        );
        match backend.backend {
            BackendChoice::Docker => assert!(
                !containers_of("restart-test-runner").await.is_empty(),
                "leftover expected"
            ),
            _ => {
                assert!(
                    std::fs::read_dir(&tasks).unwrap().count() > 0,
                    "leftover task dir expected"
                );
                if backend.gvisor() {
                    let state = work_root.path().join("gvisor/state");
                    assert!(
                        std::fs::read_dir(&state).unwrap().count() > 0,
                        "leftover runsc state expected"
                    );
                }
                // Where the runner can make cgroups, the run's is left too.
                assert_eq!(
                    runner_cgroups("restart-test-runner").is_empty(),
                    sandbox_cgroups("restart-test-runner").is_empty(),
                    "leftover sandbox cgroup expected"
                );
            }
        }
        let (proc2, client2) =
            spawn_runner(backend.backend, work_root.path(), "restart-test-runner").await;
        let info = client2
            .clone()
            .get_runner_info(GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.runner_id, "restart-test-runner");
        if backend.docker() {
            assert!(
                containers_of("restart-test-runner").await.is_empty(),
                "containers swept"
            );
        }
        assert_eq!(
            std::fs::read_dir(&tasks).unwrap().count(),
            0,
            "{backend:?}: task dirs swept"
        );
        assert_eq!(
            sandbox_cgroups("restart-test-runner"),
            Vec::<std::path::PathBuf>::new(),
            "{backend:?}: sandbox cgroups swept"
        );
        if backend.gvisor() {
            let gv = work_root.path().join("gvisor");
            assert_eq!(
                std::fs::read_dir(gv.join("bundles")).unwrap().count(),
                0,
                "bundles swept"
            );
            let list = std::process::Command::new("runsc")
                .arg(format!("--root={}", gv.join("state").display()))
                .args(["list", "--quiet"])
                .output()
                .unwrap();
            assert_eq!(text(&list.stdout).trim(), "", "runsc state swept");
            assert!(
                gvisor_cgroups("restart-test-runner").is_empty(),
                "gvisor sandbox cgroups swept"
            );
            let left = gvisor_processes(work_root.path());
            assert_eq!(left.len(), 0, "only the new runner's: {left:?}");
        }
        // local: the sandbox died with its runner (--die-with-parent)
        let mut left = processes_with(&format!("time.sleep({marker})"));
        for _ in 0..20 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            left = processes_with(&format!("time.sleep({marker})"));
        }
        assert!(
            left.is_empty(),
            "{backend:?}: sandboxed process survived: {left:?}"
        );
        drop(proc2);
        remove_runner_cgroups("restart-test-runner").await;
    }
}

/// The local pool's waiting sandboxes and a pooled run, after kill -9: the sandboxes die with
/// the runner (--die-with-parent) and the restarted runner removes their directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_runner_with_a_local_pool_leaves_nothing_after_restart() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: restart_sweep_local_pool: {reason}");
        return;
    }
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-restart-pool")
        .tempdir()
        .unwrap();
    let root = work_root.path().to_string_lossy().into_owned();
    let (mut proc, client) = spawn_runner_with(
        BackendChoice::Local,
        work_root.path(),
        "restart-pool-runner",
        &["--pool-size", "2"],
    )
    .await;
    let ready = |mut c: SandboxRunnerClient<tonic::transport::Channel>| async move {
        c.get_runner_info(GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .warm_containers
    };
    let t0 = Instant::now();
    while ready(client.clone()).await < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let marker = format!("time.sleep({})", 6000 + std::process::id() % 1000);
    let mut c = client.clone();
    let req = with_timeout(python(&format!("import time\n{marker}\n")), 600_000);
    let running = tokio::spawn(async move { c.run(req).await });
    let t0 = Instant::now();
    while processes_with(&marker).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the run never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proc.child.kill().unwrap();
    proc.child.wait().unwrap();
    assert!(running.await.unwrap().is_err());
    let tasks = work_root.path().join("tasks");
    let left = std::fs::read_dir(&tasks).unwrap().count();
    assert!(
        left >= 2,
        "the pool's directories are left by kill -9 ({left})"
    );
    let t0 = Instant::now();
    let mut procs = processes_with(&root);
    while !(procs.is_empty() && processes_with(&marker).is_empty()) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "sandboxes outlived their runner: {procs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        procs = processes_with(&root);
    }
    let (proc2, _client2) = spawn_runner(
        BackendChoice::Local,
        work_root.path(),
        "restart-pool-runner",
    )
    .await;
    assert_eq!(
        std::fs::read_dir(&tasks).unwrap().count(),
        0,
        "task directories swept at start-up"
    );
    assert!(
        sandbox_cgroups("restart-pool-runner").is_empty(),
        "sandbox cgroups swept at start-up"
    );
    drop(proc2);
    remove_runner_cgroups("restart-pool-runner").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn floods_are_capped_and_runner_memory_stays_flat() {
    // Cold and pooled runs on each backend: the stdout cap and fsize set through the local
    // waiter or the docker agent, which forwards the first cap bytes and counts the rest.
    for backend in backends("memory_flat").await {
        let work_root = tempfile::Builder::new()
            .prefix("cairn-sbx-flood")
            .tempdir()
            .unwrap();
        let pool: &[&str] = if backend.pool {
            &["--pool-size", "1"]
        } else {
            &[]
        };
        let (proc, client) =
            spawn_runner_with(backend.backend, work_root.path(), "flood-test-runner", pool).await;
        let pid = proc.child.id();
        let run = |req: cairn_proto::RunRequest| {
            let mut c = client.clone();
            async move {
                let t0 = Instant::now();
                while backend.pool
                    && c.get_runner_info(GetRunnerInfoRequest {})
                        .await
                        .unwrap()
                        .into_inner()
                        .warm_containers
                        == 0
                {
                    assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let out = c.run(req).await.unwrap().into_inner();
                let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
                assert_eq!(rj["warm"], backend.pool, "{backend:?}");
                out
            }
        };
        let before = peak_rss_kib(pid);
        // 50 MB on stdout in one line.
        let req = with_limits(
            python("import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(50):\n    sys.stdout.buffer.write(chunk)\nsys.stdout.flush()\nprint('end', file=sys.stderr)\n"),
            Limits { timeout_ms: 120_000, max_stdout_bytes: 1 << 20, ..Default::default() },
        );
        let out = run(req).await;
        assert_eq!(out.exit_code, 0, "{backend:?}: {}", text(&out.stderr));
        assert_eq!(out.stdout.len(), 1 << 20);
        assert!(out.stdout_truncated && !out.stderr_truncated);
        assert_eq!(text(&out.stderr), "end\n");
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["stdout"]["bytes"], 50u64 << 20);
        // 10 GB attempted to /output: stopped at the output byte limit.
        let req = with_limits(
            python(
                "chunk = b'y' * (1 << 20)\n\
                 written = 0\n\
                 try:\n\
                 \x20   with open('/output/big.bin', 'wb') as f:\n\
                 \x20       for _ in range(10 * 1024):\n\
                 \x20           f.write(chunk); written += len(chunk)\n\
                 except OSError as e:\n\
                 \x20   print('stopped', e.errno, flush=True)\n\
                 print('written', written)\n",
            ),
            Limits {
                timeout_ms: 120_000,
                max_output_bytes: 8 << 20,
                ..Default::default()
            },
        );
        let out = run(req).await;
        let stdout = text(&out.stdout);
        assert!(
            stdout.starts_with("stopped 27"),
            "{backend:?}: EFBIG expected: {stdout} {}",
            text(&out.stderr)
        );
        let total: u64 = out.output_files.iter().map(|f| f.size_bytes).sum();
        assert!(total <= 8 << 20, "collected {total}");
        let after = peak_rss_kib(pid);
        assert!(
            after < before + 120 * 1024,
            "{backend:?}: runner peak RSS grew from {before} KiB to {after} KiB"
        );
        drop(proc);
        remove_runner_cgroups("flood-test-runner").await;
    }
}

/// The runner killed with -9 in the middle of a step: its sandboxes stop within 10 s on their
/// own (no restart, no sweep), so a retry elsewhere never runs alongside them. Cold and warm
/// runs and a session's Exec, on each backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sandboxes_of_a_killed_runner_stop_within_10_s() {
    for backend in backends("runner_death").await {
        let work_root = tempfile::Builder::new()
            .prefix("cairn-sbx-death")
            .tempdir()
            .unwrap();
        let runner_id = format!("death-{}", uuid::Uuid::new_v4().simple());
        let pool: &[&str] = if backend.pool {
            &["--pool-size", "1"]
        } else {
            &[]
        };
        let (mut proc, client) =
            spawn_runner_with(backend.backend, work_root.path(), &runner_id, pool).await;
        let t0 = Instant::now();
        while backend.pool
            && client
                .clone()
                .get_runner_info(GetRunnerInfoRequest {})
                .await
                .unwrap()
                .into_inner()
                .warm_containers
                == 0
        {
            assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let n = 4000 + uuid::Uuid::new_v4().as_u128() % 1000;
        let run_marker = format!("time.sleep({n})");
        let exec_marker = format!("sleep {}", n + 1000);
        let mut c = client.clone();
        let req = with_timeout(python(&format!("import time\n{run_marker}\n")), 600_000);
        let _run = tokio::spawn(async move { c.run(req).await });
        let mut markers = vec![run_marker.clone()];
        if !backend.pool {
            let mut c = client.clone();
            let sid = c
                .open_session(cairn_proto::OpenSessionRequest::default())
                .await
                .unwrap()
                .into_inner()
                .session_id;
            let exec = cairn_proto::ExecRequest {
                session_id: sid,
                command: format!("{exec_marker}; echo done"),
                timeout_ms: 600_000,
                ..Default::default()
            };
            tokio::spawn(async move { c.exec(exec).await });
            markers.push(exec_marker.clone());
        }
        // Mid-step: the programs themselves run (not just bwrap or the engine setting up).
        let t0 = Instant::now();
        while if backend.gvisor() {
            gvisor_running(work_root.path()).await < markers.len()
        } else {
            markers.iter().any(|m| programs_with(m).is_empty())
        } {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{backend:?}: the step never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        proc.child.kill().unwrap();
        proc.child.wait().unwrap();
        let killed = Instant::now();
        loop {
            let mut procs: Vec<i32> = markers.iter().flat_map(|m| processes_with(m)).collect();
            if backend.gvisor() {
                procs.extend(gvisor_processes(work_root.path()));
            }
            let running = if backend.docker() {
                running_containers_of(&runner_id).await
            } else {
                Vec::new()
            };
            if procs.is_empty() && running.is_empty() {
                println!(
                    "{backend:?}: stopped {:?} after the runner died",
                    killed.elapsed()
                );
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(10),
                "{backend:?}: 10 s after the runner died, still running: processes {procs:?}, containers {running:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if backend.docker() || backend.gvisor() {
            // Stopped ones are removed by the next start-up sweep.
            let (proc2, _c2) = spawn_runner(backend.backend, work_root.path(), &runner_id).await;
            assert!(containers_of(&runner_id).await.is_empty());
            assert_eq!(gvisor_running(work_root.path()).await, 0);
            drop(proc2);
        }
    }
}

/// Sandboxes in the runsc state of the runner with `work_root` whose status is running.
async fn gvisor_running(work_root: &std::path::Path) -> usize {
    let out = tokio::process::Command::new("runsc")
        .arg(format!(
            "--root={}",
            work_root.join("gvisor/state").display()
        ))
        .arg("list")
        .output()
        .await
        .unwrap();
    text(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("running"))
        .count()
}

/// Has a sandbox of the gvisor runner with `work_root` been running for a second (its
/// program under way)?
async fn gvisor_started(work_root: &std::path::Path) -> bool {
    if gvisor_running(work_root).await == 0 {
        return false;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    true
}

/// Host processes running `needle`'s program: its command line contains `needle` and is not
/// that of bubblewrap, prlimit or the run's watchdog (which name the program too).
fn programs_with(needle: &str) -> Vec<i32> {
    processes_with(needle)
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let first = cmd.split(|b| *b == 0).next().unwrap_or_default().to_vec();
            let first = String::from_utf8_lossy(&first).into_owned();
            let wrapper = ["bwrap", "prlimit"].iter().any(|w| first.ends_with(w))
                || String::from_utf8_lossy(&cmd).contains("\0-I\0-S\0-c\0");
            !wrapper
        })
        .collect()
}

/// A local runner (with `extra` arguments) over `work_root`, running a python
/// `time.sleep(<random number from base>)`; returns it and that marker.
async fn local_runner_with_a_sleeping_run(
    work_root: &std::path::Path,
    runner_id: &str,
    extra: &[&str],
    base: u128,
) -> (Proc, String) {
    let (proc, client) = spawn_runner_with(BackendChoice::Local, work_root, runner_id, extra).await;
    let marker = format!(
        "time.sleep({})",
        base + uuid::Uuid::new_v4().as_u128() % 1000
    );
    let mut c = client.clone();
    let req = with_timeout(python(&format!("import time\n{marker}\n")), 600_000);
    tokio::spawn(async move { c.run(req).await });
    (proc, marker)
}

/// Kills the runner, then asserts that no process names `marker` 10 s later.
async fn kill_and_expect_gone(mut proc: Proc, marker: &str, what: &str) {
    proc.child.kill().unwrap();
    proc.child.wait().unwrap();
    let killed = Instant::now();
    while !processes_with(marker).is_empty() {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "{what} runs on 10 s after its runner died: {:?}",
            processes_with(marker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The local backend's runner killed while bubblewrap is still building the sandbox (as soon
/// as a bwrap process names the program): the program never runs on without it. Five tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_killed_while_bwrap_sets_up_leaves_nothing_running() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: killed_during_setup [local]: {reason}");
        return;
    }
    for _ in 0..5 {
        let work_root = tempfile::Builder::new()
            .prefix("cairn-sbx-setup")
            .tempdir()
            .unwrap();
        let (proc, marker) =
            local_runner_with_a_sleeping_run(work_root.path(), "setup-death", &[], 7000).await;
        let t0 = Instant::now();
        while processes_with(&marker).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(30), "never started");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        kill_and_expect_gone(proc, &marker, "a sandbox set up while its runner died").await;
    }
}

/// Kills what it names on drop (a failed assertion leaves nothing running).
struct KillOnDrop(String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in processes_with(&self.0) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// The real bwrap on PATH.
fn real_bwrap() -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
        .unwrap()
}

/// bubblewrap arms its own parent-death signal only after it has cloned the sandbox's pid 1,
/// which may already run the program by then; a runner killed in between left bwrap, and the
/// sandbox, running. Here a wrapper stands in for that window, made as wide as the program's
/// life: the runner's child is a shell that never binds itself to the runner, and bwrap (with
/// --die-with-parent) runs under it. The sandbox must still die with the runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bwrap_that_binds_itself_late_to_its_runner_still_dies_with_it() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: late_death_signal [local]: {reason}");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let bin = tempfile::Builder::new()
        .prefix("cairn-late-bwrap")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let wrapper = bin.path().join("bwrap");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec 3<&0\n{} \"$@\" 0<&3 3<&- &\nwait \"$!\"\n",
            real_bwrap().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-late")
        .tempdir()
        .unwrap();
    let set = format!("bwrap={}", wrapper.display());
    let (proc, marker) =
        local_runner_with_a_sleeping_run(work_root.path(), "late-death", &["--set", &set], 8000)
            .await;
    let _cleanup = KillOnDrop(marker.clone());
    // The program itself runs (python3, past bwrap's set-up and the gate).
    let python_runs = || {
        programs_with(&marker).into_iter().any(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmd.split(|b| *b == 0)
                .next()
                .is_some_and(|first| first.ends_with(b"python3"))
        })
    };
    let t0 = Instant::now();
    while !python_runs() {
        assert!(t0.elapsed() < Duration::from_secs(30), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_and_expect_gone(proc, &marker, "the sandbox").await;
}

/// A sandbox that outlived its runner (bwrap running a program over one of its task
/// directories, its parent gone) is killed by the restarted runner's start-up sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_runner_kills_a_local_sandbox_its_earlier_life_left() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: restart_kills_leftover [local]: {reason}");
        return;
    }
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-left")
        .tempdir()
        .unwrap();
    let output = work_root.path().join("tasks/left-1/output");
    std::fs::create_dir_all(&output).unwrap();
    let marker = format!("{}", 9000 + uuid::Uuid::new_v4().as_u128() % 1000);
    let _cleanup = KillOnDrop(format!("sleep {marker}"));
    // Orphaned at once (its shell exits), as after its runner's death.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} --unshare-pid --ro-bind / / --dev /dev --proc /proc --bind {} /mnt -- sleep {marker} </dev/null >/dev/null 2>&1 &",
            real_bwrap().display(),
            output.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    while processes_with(&format!("sleep {marker}")).len() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "leftover never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_proc, _client) = spawn_runner(BackendChoice::Local, work_root.path(), "left").await;
    let left = processes_with(&format!("sleep {marker}"));
    assert!(left.is_empty(), "the leftover sandbox runs on: {left:?}");
    assert!(
        !work_root.path().join("tasks/left-1").exists(),
        "its task directory is swept"
    );
}

/// The runner's environment (API keys, console token) never reaches a local sandbox: not in
/// the program's `env`, not in the environ of any process it can see (bwrap's pid-1 init
/// included), neither for cold runs, nor pooled ones, nor session commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runner_secrets_stay_out_of_local_sandboxes() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: runner_secrets [local]: {reason}");
        return;
    }
    let secret = format!("sk-cairn-fake-{}", std::process::id());
    let token = format!("console-token-fake-{}", std::process::id());
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-secrets")
        .tempdir()
        .unwrap();
    let (proc, client) = spawn_runner_env(
        BackendChoice::Local,
        work_root.path(),
        "secrets-runner",
        &["--pool-size", "1"],
        &[
            ("OPENAI_API_KEY", secret.as_str()),
            ("CAIRN_CONSOLE_TOKEN", token.as_str()),
        ],
    )
    .await;
    let show = "for f in /proc/[0-9]*/environ; do echo \"== $f\"; tr '\\0' '\\n' < $f; done; echo '== env'; env";
    let check = |what: &str, stdout: &[u8]| {
        let out = text(stdout);
        assert!(out.contains("== /proc/1/environ"), "{what}: {out}");
        assert!(
            out.contains("== env\n") && out.contains("PATH="),
            "{what}: {out}"
        );
        assert!(
            !out.contains(&secret) && !out.contains(&token),
            "{what}: a runner secret reached the sandbox:\n{out}"
        );
    };
    // The first run takes the waiting sandbox once it is ready, the second runs cold
    // (network off, a memory other than the pool's).
    let t0 = Instant::now();
    while client
        .clone()
        .get_runner_info(GetRunnerInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .warm_containers
        == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pooled = client.clone().run(bash(show)).await.unwrap().into_inner();
    let rj: serde_json::Value = serde_json::from_str(&pooled.result_json).unwrap();
    assert_eq!(rj["warm"], true);
    check("pooled run", &pooled.stdout);
    let cold = with_limits(
        bash(show),
        Limits {
            memory_bytes: 300 * 1024 * 1024,
            ..Default::default()
        },
    );
    let cold = client.clone().run(cold).await.unwrap().into_inner();
    let rj: serde_json::Value = serde_json::from_str(&cold.result_json).unwrap();
    assert_eq!(rj["warm"], false);
    check("cold run", &cold.stdout);
    let mut c = client.clone();
    let session = c
        .open_session(cairn_proto::OpenSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let exec = c
        .exec(cairn_proto::ExecRequest {
            session_id: session.session_id,
            command: show.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    check("session command", &exec.stdout);
    drop(proc);
    remove_runner_cgroups("secrets-runner").await;
}

/// Checked a second way: what a local sandbox reads of every environment it can see holds
/// none of the runner's secret values, and the reading itself is proven to work (each environ
/// read succeeds, pid 1's included, and a variable the job sets is seen through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_sandbox_reads_every_environ_it_sees_and_finds_no_runner_secret() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: environ_reads [local]: {reason}");
        return;
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let secrets = [
        ("OPENAI_API_KEY", format!("sk-openai-{id}")),
        ("ANTHROPIC_API_KEY", format!("sk-ant-{id}")),
        ("CAIRN_CONSOLE_TOKEN", format!("console-{id}")),
        ("CAIRN_ENV_PROBE_SECRET", format!("probe-{id}")),
    ];
    let env: Vec<(&str, &str)> = secrets.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-environ")
        .tempdir()
        .unwrap();
    let runner_id = format!("environ-{}", &id[..8]);
    let (proc, client) = spawn_runner_env(
        BackendChoice::Local,
        work_root.path(),
        &runner_id,
        &[],
        &env,
    )
    .await;
    let read = r#"n=0
for f in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$f" > /tmp/environ 2>/dev/null; then
    n=$((n+1)); echo "READ $f"; cat /tmp/environ
  else
    echo "UNREADABLE $f"
  fi
done
echo "READ-COUNT $n""#;
    let mut req = bash(read);
    let visible = format!("visible-{id}");
    req.env.insert("CAIRN_JOB_VISIBLE".into(), visible.clone());
    let r = client.clone().run(req).await.unwrap().into_inner();
    let out = text(&r.stdout);
    assert_eq!(r.exit_code, 0, "{out}{}", text(&r.stderr));
    assert!(
        out.contains("READ /proc/1/environ\n"),
        "pid 1's environ unread:\n{out}"
    );
    assert!(
        !out.contains("UNREADABLE"),
        "an environ could not be read:\n{out}"
    );
    let count: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("READ-COUNT "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(count >= 2, "{out}");
    // The reads see environments: the job's own variable is there.
    assert!(
        out.contains(&format!("CAIRN_JOB_VISIBLE={visible}")),
        "the reads saw no environment at all:\n{out}"
    );
    for (name, value) in &secrets {
        assert!(
            !out.contains(value.as_str()),
            "{name} reached the sandbox:\n{out}"
        );
    }
    drop(proc);
    remove_runner_cgroups(&runner_id).await;
}

/// A gvisor session (its sandbox, a command still running and one left in the background)
/// whose runner is killed with -9: its processes are gone within 10 s, and the restarted
/// runner leaves no sandbox in runsc's state, no bundle and no task directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_runner_leaves_nothing_of_a_gvisor_session() {
    if !gvisor_usable("killed_runner_gvisor_session") {
        return;
    }
    let work_root = tempfile::Builder::new()
        .prefix("cairn-sbx-gvsess")
        .tempdir()
        .unwrap();
    let runner_id = format!("gvsess-{}", uuid::Uuid::new_v4().simple());
    let (mut proc, client) =
        spawn_runner(BackendChoice::Gvisor, work_root.path(), &runner_id).await;
    let mut c = client.clone();
    let sid = c
        .open_session(cairn_proto::OpenSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let exec = move |command: &str| cairn_proto::ExecRequest {
        session_id: sid.clone(),
        command: command.into(),
        timeout_ms: 600_000,
        ..Default::default()
    };
    let out = c
        .exec(exec("sleep 300 > /dev/null 2>&1 & echo bg"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(text(&out.stdout), "bg\n", "{}", text(&out.stderr));
    let mut c2 = client.clone();
    let running = tokio::spawn(async move { c2.exec(exec("sleep 400")).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!gvisor_processes(work_root.path()).is_empty());
    proc.child.kill().unwrap();
    proc.child.wait().unwrap();
    let killed = Instant::now();
    loop {
        let left = gvisor_processes(work_root.path());
        if left.is_empty() {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "10 s after the runner died, still running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        running.await.unwrap().is_err(),
        "the Exec fails with its runner"
    );
    let (proc2, _c2) = spawn_runner(BackendChoice::Gvisor, work_root.path(), &runner_id).await;
    assert_eq!(
        gvisor_sandboxes(work_root.path()).await,
        Vec::<String>::new()
    );
    let gv = work_root.path().join("gvisor");
    assert_eq!(std::fs::read_dir(gv.join("bundles")).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_dir(work_root.path().join("tasks"))
            .unwrap()
            .count(),
        0
    );
    drop(proc2);
}

/// The processes `pid` started.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// A runner stopped mid-step (SIGSTOP: its connection stays open and nothing answers) stops
/// heartbeating; the client delivers the step to the next runner within a few intervals, with
/// the same step key and one more redelivery, long before the step's own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_that_stops_heartbeating_loses_its_step_to_the_next_runner() {
    // The local backend: its programs are the runner's children, so the one running it shows.
    if let Err(reason) = bwrap_ready() {
        if docker_required() {
            panic!("CAIRN_REQUIRE_DOCKER=1 but the local backend is not usable: {reason}");
        }
        println!(
            "SKIP: a_runner_that_stops_heartbeating_loses_its_step_to_the_next_runner: {reason}"
        );
        return;
    }
    let roots = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let beat = ["--set", "heartbeat_interval_ms=200"];
    let (mut a, _, a_addr) =
        spawn_runner_at(BackendChoice::Local, roots[0].path(), "beat-a", &beat, &[]).await;
    let (mut b, _, b_addr) =
        spawn_runner_at(BackendChoice::Local, roots[1].path(), "beat-b", &beat, &[]).await;
    let runners = cairn_runner_client::Runners::start(
        &[a_addr.clone(), b_addr.clone()],
        cairn_runner_client::Balancing::default(),
    )
    .await
    .unwrap();
    let mut req = with_timeout(
        python(
            "import os, time\nprint(os.environ['CAIRN_STEP_KEY'], os.environ['CAIRN_STEP_REDELIVERY'], flush=True)\ntime.sleep(3)\n",
        ),
        120_000,
    );
    req.step_key = "run-9/build/1".into();
    let first = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let seen = first.clone();
    let redelivered = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Instant)>::new()));
    let noted = redelivered.clone();
    let call = tokio::spawn(async move {
        runners
            .run_streaming(
                req,
                move |_| {
                    seen.lock().unwrap().get_or_insert_with(Instant::now);
                },
                move |addr: &str, _: &tonic::Status| {
                    noted
                        .lock()
                        .unwrap()
                        .push((addr.to_owned(), Instant::now()))
                },
            )
            .await
    });
    // The first output: the step runs; stop the runner whose child runs it.
    let t0 = Instant::now();
    while first.lock().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the step never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (stopped, stopped_addr) = if !children(a.child.id()).is_empty() {
        (&mut a, a_addr.clone())
    } else {
        assert!(
            !children(b.child.id()).is_empty(),
            "neither runner runs the step"
        );
        (&mut b, b_addr.clone())
    };
    let pid = stopped.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let stopped_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(30), call).await;
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    let (result, ran_on) = outcome
        .expect("the step waited on the stopped runner instead of going elsewhere")
        .unwrap()
        .unwrap();
    assert_ne!(
        ran_on, stopped_addr,
        "the stopped runner cannot have finished it"
    );
    assert_eq!(
        result.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&result.stdout).trim(),
        "run-9/build/1 1",
        "the same step key, one redelivery"
    );
    let redelivered = redelivered.lock().unwrap().clone();
    assert_eq!(redelivered.len(), 1, "{redelivered:?}");
    assert_eq!(redelivered[0].0, stopped_addr);
    // Three 200 ms intervals, at least a second: far sooner than the step's 120 s timeout.
    let noticed = redelivered[0].1 - stopped_at;
    assert!(
        noticed >= Duration::from_millis(900) && noticed < Duration::from_secs(5),
        "noticed after {noticed:?}"
    );
}
