//! The local backend's pool of waiting sandboxes: a sandbox is used once, the program gets
//! the same clean process as a cold run, a burst beyond the pool all succeeds and the pool
//! refills, and shutdown leaves no sandbox nor directory. (The behaviour tests of run_test.rs
//! run against the pooled local backend too.)
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cairn_sandbox_runner::BackendChoice;
use common::*;

fn local(pool: bool) -> Option<Case> {
    match bwrap_ready() {
        Ok(()) => Some(Case {
            backend: BackendChoice::Local,
            pool,
        }),
        Err(reason) => {
            println!("SKIP: local pool tests: {reason}");
            None
        }
    }
}

async fn ready_now(r: &TestRunner) -> u32 {
    r.info().await.warm_containers
}

async fn wait_ready(r: &TestRunner, n: u32) {
    let t0 = Instant::now();
    while ready_now(r).await < n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "pool never reached {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Names of the waiting sandboxes' task directories.
fn pool_dirs(r: &TestRunner) -> BTreeSet<String> {
    std::fs::read_dir(r.work_root.path().join("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pool-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_used_sandbox_is_never_reused() {
    let Some(case) = local(true) else { return };
    let r = TestRunner::start(case).await;
    let first = r
        .run(python(
            "import os, subprocess\n\
             open('/tmp/left-by-run-1', 'w').write('x')\n\
             open('/output/out-1', 'w').write('x')\n\
             print(os.getpid(), os.listdir('/tmp'), os.listdir('/output'))\n",
        ))
        .await;
    assert_eq!(first.exit_code, 0, "{}", text(&first.stderr));
    assert_eq!(first.output_files.len(), 1);
    let second = r
        .run(python(
            "import os\n\
             print(os.getpid(), os.listdir('/tmp'), os.listdir('/output'))\n",
        ))
        .await;
    assert_eq!(second.exit_code, 0, "{}", text(&second.stderr));
    // Run 1 saw its own file (and the program was pid 2 of a fresh namespace); run 2 sees an
    // empty /tmp and /output: a new sandbox, not the one run 1 dirtied.
    assert_eq!(text(&first.stdout), "2 ['left-by-run-1'] ['out-1']\n");
    assert_eq!(text(&second.stdout), "2 [] []\n");
    assert!(second.output_files.is_empty());
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_program_gets_the_same_clean_process_as_a_cold_run() {
    let (Some(cold), Some(pooled)) = (local(false), local(true)) else {
        return;
    };
    // What a process the program starts inherits: descriptors (ls's own: 0-2 and the one
    // it reads), signal dispositions and mask, limits; then cwd, environment, stdin.
    let mut req = bash(
        "echo cwd $(pwd); ls /proc/self/fd | tr '\\n' ' '; echo\n\
         grep -E '^Sig(Ign|Blk)' /proc/self/status\n\
         ulimit -a; ulimit -aH\n\
         env | grep -v '^_=' | sort\n\
         read -r line; echo read $?\n",
    );
    req.env = [("EXTRA".to_string(), "1".to_string())].into();
    // A descriptor the runner holds without close-on-exec: no sandbox may get it.
    let planted = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut seen = Vec::new();
    for case in [cold, pooled] {
        let r = TestRunner::start(case).await;
        let out = r.run(req.clone()).await;
        assert_eq!(out.exit_code, 0, "{case:?}: {}", text(&out.stderr));
        seen.push(text(&out.stdout));
        r.stop().await;
    }
    let pooled_out = &seen[1];
    assert!(pooled_out.starts_with("cwd /tmp\n0 1 2 3 \n"), "{seen:?}");
    assert!(
        pooled_out.contains("SigBlk:\t0000000000000000\n"),
        "{seen:?}"
    );
    assert!(
        pooled_out.contains("read 1\n"),
        "stdin is at EOF: {pooled_out}"
    );
    assert!(pooled_out.contains("EXTRA=1\n"));
    assert!(
        !pooled_out.contains("cairn"),
        "nothing of the waiter: {pooled_out}"
    );
    // Cold and pooled programs see the same process, descriptors included (neither passes
    // on the planted one).
    assert_eq!(seen[0], seen[1], "cold (left) and pooled (right) differ");
    drop(planted);
}

/// Six concurrent runs on a pool of two: all succeed, two warm; no refill starts while the
/// cold ones run; afterwards the pool is full again and only its two directories remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_beyond_the_pool_all_succeeds_and_the_pool_refills() {
    let Some(case) = local(true) else { return };
    let r = TestRunner::start_with(case, |c| c.pool_size = 2).await;
    wait_ready(&r, 2).await;
    let before = burst_of_six_on_a_pool_of_two(&r, || async { pool_dirs(&r) }).await;
    let t0 = Instant::now();
    loop {
        let ready = ready_now(&r).await;
        let dirs = std::fs::read_dir(r.work_root.path().join("tasks"))
            .unwrap()
            .count();
        let fresh = pool_dirs(&r).is_disjoint(&before);
        if ready == 2 && dirs == 2 && fresh {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after the burst: {ready} ready, {dirs} task dirs (want 2 new pool dirs only)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_removes_the_waiting_sandboxes_and_their_directories() {
    let Some(case) = local(true) else { return };
    let r = TestRunner::start_with(case, |c| c.pool_size = 2).await;
    wait_ready(&r, 2).await;
    let out = r.run(python("print('used')")).await;
    assert_eq!(text(&out.stdout), "used\n");
    let tasks = r.work_root.path().join("tasks");
    let t0 = Instant::now();
    while ready_now(&r).await < 2 || std::fs::read_dir(&tasks).unwrap().count() != 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the used sandbox was not removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let root = r.work_root.path().to_string_lossy().into_owned();
    assert!(
        processes_with(&root).len() >= 2,
        "the waiting sandboxes' bwrap processes should be visible"
    );
    r.handle.shutdown().await;
    let left: Vec<_> = std::fs::read_dir(&tasks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    // Shutdown returns only once bwrap and the namespace's pid 1 are gone.
    let procs = processes_with(&root);
    assert!(procs.is_empty(), "sandbox processes left: {procs:?}");
    assert!(left.is_empty(), "task directories left: {left:?}");
    r.stop().await;
}

/// A waiting sandbox that died before its job came (here: killed from outside) is not used:
/// the job runs cold and succeeds, and the dead sandbox's directory goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_waiting_sandbox_is_passed_over_for_a_cold_run() {
    let Some(case) = local(true) else { return };
    let r = TestRunner::start(case).await;
    wait_ready(&r, 1).await;
    let dead = pool_dirs(&r);
    let root = r.work_root.path().to_string_lossy().into_owned();
    let t0 = Instant::now();
    loop {
        let procs = processes_with(&root);
        if procs.is_empty() {
            break;
        }
        for pid in procs {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "could not kill the sandbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = r
        .client
        .clone()
        .run(python("print('ran')"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(text(&out.stdout), "ran\n", "{}", text(&out.stderr));
    let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
    assert_eq!(rj["warm"], false, "the dead sandbox cannot have served it");
    let t0 = Instant::now();
    while !pool_dirs(&r).is_disjoint(&dead) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the dead sandbox's directory stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The pool refills and serves the next run.
    let out = r.run(python("print('warm again')")).await;
    assert_eq!(text(&out.stdout), "warm again\n");
    r.stop().await;
}
