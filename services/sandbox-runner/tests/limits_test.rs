//! Limits over whole sandboxes: on the local backend a program that forks, or fills its /tmp,
//! is held to its memory limit (or the runner refuses to run it), and its cgroup is gone after
//! the run; on both backends runs and sessions beyond max_concurrent_runs are refused when
//! the runner has no queue (queue_depth = 0; the queue has tests of its own).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::{Limits, OpenSessionRequest};
use cairn_sandbox_runner::BackendChoice;
use common::*;
use tonic::Code;

const MIB: u64 = 1024 * 1024;

/// MemAvailable of the host, in bytes.
fn mem_available() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// A local runner that must enforce its limits (require_limits); None (with a line saying
/// why) when bubblewrap is missing. A host where the runner cannot make cgroups refuses to
/// start it, which is the refusal these tests accept in place of the kill.
async fn enforcing_local_runner(test: &str, pool: bool) -> Option<TestRunner> {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: {test} [local]: {reason}");
        return None;
    }
    let case = Case {
        backend: BackendChoice::Local,
        pool,
    };
    let work_root = tempfile::tempdir().unwrap();
    let mut config = config(BackendChoice::Local, work_root.path());
    config.require_limits = true;
    match cairn_sandbox_runner::sandbox_service(config).await {
        Ok((_, handle)) => handle.shutdown().await,
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("cannot enforce memory, pids and cpu limits")
                    && message.contains("require_limits"),
                "{message}"
            );
            println!("{test}: refused (no cgroups for the runner here): {message}");
            return None;
        }
    }
    Some(TestRunner::start_with(case, |c| c.require_limits = true).await)
}

/// Eight children of 400 MiB each (pages written) under a 512 MiB limit: killed by the
/// memory limit, and the host never loses the 3.2 GiB the children ask for in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forking_program_is_held_to_its_memory_limit() {
    for pool in [false, true] {
        let Some(r) = enforcing_local_runner("fork_memory", pool).await else {
            return;
        };
        let code = "\
import os, sys, time
kids = []
for i in range(8):
    pid = os.fork()
    if pid == 0:
        b = b'x' * (400 << 20)
        print('held', i, flush=True)
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
killed = sum(1 for k in kids if os.waitpid(k, 0)[1] != 0)
print('killed', killed, flush=True)
";
        let req = with_limits(
            python(code),
            Limits {
                memory_bytes: 512 * MIB,
                timeout_ms: 120_000,
                ..Default::default()
            },
        );
        let baseline = mem_available();
        let lowest = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
        let sampling = {
            let lowest = lowest.clone();
            tokio::spawn(async move {
                loop {
                    lowest.fetch_min(mem_available(), std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        let out = r.run(req).await;
        sampling.abort();
        let used = baseline.saturating_sub(lowest.load(std::sync::atomic::Ordering::SeqCst));
        let stdout = text(&out.stdout);
        println!(
            "pool {pool}: host memory used at most {} MiB; {stdout:?}",
            used / MIB
        );
        assert!(out.limits_enforced, "{out:?}");
        assert!(out.oom_killed, "pool {pool}: not OOM-killed: {stdout:?}");
        assert!(
            stdout.matches("held").count() < 8,
            "every child held its 400 MiB: {stdout:?}"
        );
        // 3.2 GiB when unbounded; the margin is for other work on the host.
        assert!(
            used < 2048 * MIB,
            "host memory dropped by {} MiB",
            used / MIB
        );
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["limits_enforced"], true);
        assert_eq!(rj["oom_killed"], true);
        let rid = r.handle.runner_id().to_owned();
        r.stop().await;
        assert!(
            sandbox_cgroups(&rid).is_empty() && runner_cgroups(&rid).is_empty(),
            "cgroups left: {:?}",
            runner_cgroups(&rid)
        );
    }
}

/// Bytes written to the private /tmp (a tmpfs) count toward the memory limit: 210 MiB there
/// (files of 15 MiB, below the file size rlimit) plus 150 MiB in the program exceed 256 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tmpfs_writes_count_toward_memory() {
    let Some(r) = enforcing_local_runner("tmpfs_memory", false).await else {
        return;
    };
    let req = with_limits(
        bash(
            "for i in $(seq 14); do head -c 15M /dev/zero > /tmp/fill$i || exit 3; done; \
             python3 -c \"b = b'x' * (150 << 20); print('both fit')\"",
        ),
        Limits {
            memory_bytes: 256 * MIB,
            timeout_ms: 60_000,
            ..Default::default()
        },
    );
    let out = r.run(req).await;
    assert!(out.limits_enforced);
    assert!(
        out.oom_killed,
        "not OOM-killed: {:?} {:?}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!text(&out.stdout).contains("both fit"));
    // The runner's sandbox cgroups are removed after each run.
    let rid = r.handle.runner_id().to_owned();
    let ok = r.run(bash("echo fine")).await;
    assert_eq!(text(&ok.stdout), "fine\n");
    assert!(!ok.oom_killed);
    assert_eq!(sandbox_cgroups(&rid), Vec::<std::path::PathBuf>::new());
    r.stop().await;
}

/// Where the runner cannot make cgroups, a local run says its limits were per process only,
/// and with require_limits the runner refuses to start, naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_cgroups_limits_are_reported_unenforced_or_refused() {
    if let Err(reason) = bwrap_ready() {
        println!("SKIP: no_cgroups [local]: {reason}");
        return;
    }
    let no_cgroups = tempfile::tempdir().unwrap();
    let case = Case {
        backend: BackendChoice::Local,
        pool: false,
    };
    let root = no_cgroups.path().to_path_buf();
    let r = TestRunner::start_with(case, |c| c.cgroup_root = root).await;
    let out = r.run(bash("echo ran")).await;
    assert_eq!(text(&out.stdout), "ran\n");
    assert!(!out.limits_enforced);
    let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
    assert_eq!(rj["limits_enforced"], false);
    r.stop().await;

    let work_root = tempfile::tempdir().unwrap();
    let mut config = config(BackendChoice::Local, work_root.path());
    config.cgroup_root = no_cgroups.path().to_path_buf();
    config.require_limits = true;
    let Err(e) = cairn_sandbox_runner::sandbox_service(config).await else {
        panic!("a runner that cannot enforce limits started with require_limits");
    };
    let message = e.to_string();
    assert!(
        message.contains("cannot enforce memory, pids and cpu limits")
            && message.contains("require_limits = false"),
        "{message}"
    );
}

fn refused_as_busy(status: &tonic::Status) -> bool {
    status.code() == Code::ResourceExhausted
        && status.message().contains("max_concurrent_runs")
        // A client may retry the refusal: it says when.
        && cairn_proto::reason::retry_delay(status).is_some()
}

/// Waits until a run is admitted again (the slot of a dropped call is freed when its
/// sandbox is gone).
async fn until_admitted(r: &TestRunner) {
    let t0 = Instant::now();
    loop {
        match r.client.clone().run(bash("echo again")).await {
            Ok(out) => {
                assert_eq!(text(&out.into_inner().stdout), "again\n");
                return;
            }
            Err(s) if refused_as_busy(&s) => {
                assert!(t0.elapsed() < Duration::from_secs(60), "slot never freed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
    }
}

/// With max_concurrent_runs = 1 and no queue: while one run goes, another run and a session
/// are refused RESOURCE_EXHAUSTED naming the setting; an open session holds the slot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_beyond_max_concurrent_runs_are_refused() {
    for case in cold_backends("max_concurrent_runs").await {
        println!("max_concurrent_runs: {case:?}");
        let r = TestRunner::start_with(case, |c| {
            c.max_concurrent_runs = 1;
            c.queue_depth = 0;
        })
        .await;
        let long = with_timeout(
            python("import time\nprint('started', flush=True)\ntime.sleep(120)"),
            300_000,
        );
        let mut stream = r
            .client
            .clone()
            .run_stream(long)
            .await
            .unwrap()
            .into_inner();
        // The first output says the program runs (heartbeats come before it).
        let first = loop {
            let m = stream.message().await.unwrap().unwrap();
            if !matches!(
                m.msg,
                Some(cairn_proto::run_stream_response::Msg::Heartbeat(_))
            ) {
                break m;
            }
        };
        assert!(
            matches!(
                first.msg,
                Some(cairn_proto::run_stream_response::Msg::Output(_))
            ),
            "{first:?}"
        );
        let refused = r.client.clone().run(bash("echo no")).await.unwrap_err();
        assert!(refused_as_busy(&refused), "{case:?}: {refused:?}");
        let refused = r
            .client
            .clone()
            .open_session(OpenSessionRequest::default())
            .await
            .unwrap_err();
        assert!(refused_as_busy(&refused), "{case:?}: {refused:?}");
        drop(stream);
        until_admitted(&r).await;
        // Docker's engine always enforces the limits; the local backend where it made cgroups;
        // gvisor where runsc could put its sandboxes in cgroups (as root on this host).
        let out = r
            .client
            .clone()
            .run(bash("true"))
            .await
            .unwrap()
            .into_inner();
        let cgroups = if case.gvisor() {
            std::path::Path::new("/sys/fs/cgroup/memory").is_dir()
                || std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").is_file()
        } else {
            !runner_cgroups(r.handle.runner_id()).is_empty()
        };
        assert_eq!(out.limits_enforced, case.docker() || cgroups, "{case:?}");

        let session = r
            .client
            .clone()
            .open_session(OpenSessionRequest::default())
            .await
            .unwrap()
            .into_inner();
        let refused = r.client.clone().run(bash("echo no")).await.unwrap_err();
        assert!(refused_as_busy(&refused), "{case:?}: {refused:?}");
        r.client
            .clone()
            .close_session(cairn_proto::CloseSessionRequest {
                session_id: session.session_id,
            })
            .await
            .unwrap();
        until_admitted(&r).await;
        r.stop().await;
    }
}
