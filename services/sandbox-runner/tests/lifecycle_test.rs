//! Nothing outlives its call, and outputs are all or nothing, over gRPC on every backend: a
//! session Exec cut by its client's deadline (or dropped) kills what it started; a Run cancelled
//! while its container is being created leaves no container; a run in flight at shutdown ends
//! Unavailable; deep, over-limit and cut-short /output trees are published whole or not at all,
//! and the result lists every output that was not published.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto as pb;
use cairn_proto::Limits;
use common::*;

async fn open(r: &TestRunner) -> String {
    r.client
        .clone()
        .open_session(pb::OpenSessionRequest::default())
        .await
        .unwrap()
        .into_inner()
        .session_id
}

fn exec_req(sid: &str, command: &str) -> pb::ExecRequest {
    pb::ExecRequest {
        session_id: sid.into(),
        command: command.into(),
        timeout_ms: 60_000,
        ..Default::default()
    }
}

/// Does `path` exist in the session's workspace (asked through ReadFile)?
async fn exists(r: &TestRunner, sid: &str, path: &str) -> bool {
    let got = r
        .client
        .clone()
        .read_file(pb::ReadFileRequest {
            session_id: sid.into(),
            path: path.into(),
            max_bytes: 0,
        })
        .await;
    match got {
        Ok(_) => true,
        Err(s) if s.code() == tonic::Code::NotFound => false,
        Err(s) => panic!("read_file {path}: {s:?}"),
    }
}

/// `sleep 3; echo > done.txt` (and a background child doing the same) under a 1 s client
/// deadline, and again as a call the client drops after 1 s: nothing is written afterwards,
/// and the session still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exec_dies_with_its_deadline_or_its_dropped_call() {
    for backend in cold_backends("exec_deadline").await {
        let r = TestRunner::start(backend).await;
        let sid = open(&r).await;
        let cmd = |tag: &str| {
            format!("(sleep 3; echo x > {tag}-bg.txt) & sleep 3; echo x > {tag}-done.txt; wait")
        };
        // The client's deadline (grpc-timeout).
        let mut req = tonic::Request::new(exec_req(&sid, &cmd("deadline")));
        req.set_timeout(Duration::from_secs(1));
        let t0 = Instant::now();
        let err = r.client.clone().exec(req).await.unwrap_err();
        assert!(
            matches!(
                err.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{backend:?}: {err:?}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "{backend:?}: the call outlived its deadline"
        );
        // The call dropped by its client.
        let mut c = r.client.clone();
        let dropped = tokio::time::timeout(
            Duration::from_secs(1),
            c.exec(exec_req(&sid, &cmd("dropped"))),
        )
        .await;
        assert!(
            dropped.is_err(),
            "{backend:?}: the exec should still be running"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        for f in [
            "deadline-done.txt",
            "deadline-bg.txt",
            "dropped-done.txt",
            "dropped-bg.txt",
        ] {
            assert!(
                !exists(&r, &sid, f).await,
                "{backend:?}: {f} was written after its exec was cancelled"
            );
        }
        let out = r
            .client
            .clone()
            .exec(exec_req(&sid, "echo alive"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(text(&out.stdout), "alive\n", "{backend:?}");
        r.stop().await;
    }
}

/// 20 Runs cancelled 0-300 ms in (client deadlines and dropped calls): once the cancellations
/// have settled, no container of the runner is left, in any state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_cancelled_during_create_leave_no_container() {
    if !docker_only("cancel_during_create").await {
        return;
    }
    let r = TestRunner::start(Case {
        backend: cairn_sandbox_runner::BackendChoice::Docker,
        pool: false,
    })
    .await;
    let runner_id = r.handle.runner_id().to_string();
    for i in 0..20u64 {
        let after = Duration::from_millis(i * 15);
        let req = python("import time; time.sleep(30)");
        if i % 2 == 0 {
            let mut req = tonic::Request::new(req);
            req.set_timeout(after);
            let _ = r.client.clone().run(req).await;
        } else {
            let mut c = r.client.clone();
            let _ = tokio::time::timeout(after, c.run(req)).await;
        }
    }
    let t0 = Instant::now();
    loop {
        let left = containers_of(&runner_id).await;
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "cancelled runs left containers: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    r.stop().await;
}

/// A run in flight when the runner shuts down ends Unavailable (retry elsewhere), not with an
/// internal error or an exit code of its killed program.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_in_flight_at_shutdown_is_unavailable() {
    for backend in cold_backends("shutdown_in_flight").await {
        let r = TestRunner::start(backend).await;
        let marker = format!("time.sleep({})", 3000 + rand_u16() % 1000);
        let mut c = r.client.clone();
        let req = python(&format!("import time\n{marker}\n"));
        let call = tokio::spawn(async move { c.run(req).await });
        let t0 = Instant::now();
        while !program_started(&r, &marker).await {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{backend:?}: never started"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        r.handle.shutdown().await;
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{backend:?}: {err:?}");
        r.stop().await;
    }
}

fn rand_u16() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 60000) as u16
}

/// 70 levels of directories with a file at the bottom, files before and after it in name
/// order: every file is published, nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deep_output_trees_lose_nothing() {
    for backend in backends("deep_outputs").await {
        let r = TestRunner::start(backend).await;
        let code = "import os\n\
                    deep = '/output/m/' + '/'.join(['d'] * 70)\n\
                    os.makedirs(deep)\n\
                    open(deep + '/bottom.txt', 'w').write('bottom')\n\
                    open('/output/a.txt', 'w').write('a')\n\
                    open('/output/z.txt', 'w').write('z')\n";
        let out = r.run(python(code)).await;
        assert_eq!(out.exit_code, 0, "{backend:?}: {}", text(&out.stderr));
        let mut names: Vec<_> = out.output_files.iter().map(|f| f.path.clone()).collect();
        names.sort();
        let bottom = format!("m/{}/bottom.txt", vec!["d"; 70].join("/"));
        assert_eq!(
            names,
            ["a.txt".to_string(), bottom, "z.txt".into()],
            "{backend:?}"
        );
        assert!(
            out.rejected_outputs.is_empty(),
            "{backend:?}: {:?}",
            out.rejected_outputs
        );
        assert!(!out.outputs_truncated, "{backend:?}");
        r.stop().await;
    }
}

/// 1,005 files where 1,000 may be published: none is, the result says so, and every one of
/// them is listed (1,000 unpublished, 5 over the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_limit_outputs_publish_nothing_and_list_everything() {
    for backend in backends("over_limit_outputs").await {
        let r = TestRunner::start(backend).await;
        let code = "for i in range(1005):\n    open(f'/output/f{i:04}', 'w').write('x')\n";
        let out = r.run(python(code)).await;
        assert_eq!(out.exit_code, 0, "{backend:?}: {}", text(&out.stderr));
        assert!(
            out.output_files.is_empty(),
            "{backend:?}: {} published",
            out.output_files.len()
        );
        assert!(out.outputs_truncated, "{backend:?}");
        let mut listed: Vec<_> = out
            .rejected_outputs
            .iter()
            .map(|x| x.path.clone())
            .collect();
        listed.sort();
        let all: Vec<_> = (0..1005).map(|i| format!("f{i:04}")).collect();
        assert_eq!(listed, all, "{backend:?}: every output is listed once");
        let count = |reason: &str| {
            out.rejected_outputs
                .iter()
                .filter(|x| x.reason == reason)
                .count()
        };
        assert_eq!(count("unpublished"), 1000, "{backend:?}");
        assert_eq!(count("too_many_files"), 5, "{backend:?}");
        let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
        assert_eq!(rj["outputs_truncated"], true);
        assert_eq!(rj["output_files"].as_array().unwrap().len(), 0);
        assert_eq!(rj["rejected_outputs"].as_array().unwrap().len(), 1005);
        r.stop().await;
    }
}

/// A program killed while writing a file at the size limit (SIGXFSZ): the file is reported
/// `truncated` and nothing is published as if it were whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_cut_at_the_byte_limit_is_reported_truncated() {
    for backend in backends("cut_at_limit").await {
        let r = TestRunner::start(backend).await;
        let req = with_limits(
            bash("echo small > /output/small.txt; head -c 100000 /dev/zero > /output/big.bin"),
            Limits {
                max_output_bytes: 4096,
                ..Default::default()
            },
        );
        let out = r.run(req).await;
        assert_ne!(
            out.exit_code, 0,
            "{backend:?}: head must be stopped at the limit"
        );
        assert!(
            out.output_files.is_empty(),
            "{backend:?}: {:?}",
            out.output_files
                .iter()
                .map(|f| (&f.path, f.size_bytes))
                .collect::<Vec<_>>()
        );
        assert!(out.outputs_truncated, "{backend:?}");
        let mut listed: Vec<_> = out
            .rejected_outputs
            .iter()
            .map(|x| (x.path.as_str(), x.reason.as_str()))
            .collect();
        listed.sort();
        assert_eq!(
            listed,
            [("big.bin", "truncated"), ("small.txt", "unpublished")],
            "{backend:?}"
        );
        r.stop().await;
    }
}
