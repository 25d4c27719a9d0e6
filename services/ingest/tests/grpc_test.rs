//! Ingest over real gRPC: against a running artifact-store, a stopped one, one that never
//! answers (fail-open), the feature flag, doc_path reads and request checks.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use cairn_proto::v1::{BlockStatus, GetEnabledRequest, Level, OverwritePolicy, SetEnabledRequest};
use common::{request, sha256_hex, Ingest, Store};
use tonic::Code;

const DOC: &str = "# Answer\n\n```python file=src/app.py\nprint('hello from app')\n```\n\n```python path=src/bad.py\nx\n```\n\n```py file=../escape.py\nx\n```\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_writes_through_a_running_store_and_records_events() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;

    let reply = ingest
        .client
        .ingest(request("demo", "r1", DOC.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.enabled);
    assert_eq!(
        reply.level(),
        Level::Error,
        "a traversal is a safety refusal: ERROR"
    );
    let statuses: Vec<(BlockStatus, &str)> = reply
        .artifacts
        .iter()
        .map(|a| (a.status(), a.reason.as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            (BlockStatus::Written, ""),
            (BlockStatus::Skipped, "malformed_header"),
            (BlockStatus::Rejected, "traversal")
        ]
    );
    let summary = reply.summary.unwrap();
    assert_eq!(
        (
            summary.total_blocks,
            summary.written,
            summary.skipped,
            summary.rejected
        ),
        (3, 1, 1, 1)
    );
    assert!(
        reply.errors.iter().any(|e| e.contains("traversal")),
        "{:?}",
        reply.errors
    );

    let on_disk = std::fs::read(store.workspace("demo").join("src/app.py")).unwrap();
    assert_eq!(on_disk, b"print('hello from app')\n");
    assert_eq!(reply.artifacts[0].sha256, sha256_hex(&on_disk));
    assert!(
        !store.project("escape.py").exists()
            && !store.data_root.path().join("projects/escape.py").exists()
    );

    // The manifest: its fields, stored where the reply says.
    let manifest: serde_json::Value = serde_json::from_str(&reply.manifest_json).unwrap();
    assert_eq!(manifest["version"], "1");
    assert_eq!(manifest["run_id"], "r1");
    assert_eq!(manifest["node_id"], "n1");
    assert_eq!(
        manifest["source"],
        serde_json::json!({"kind": "graph_runtime", "mode": "single", "doc_path": "docs/answer.md"})
    );
    assert_eq!(reply.manifest_path, ".cairn/runs/r1/ingest/n1.json");
    let stored = std::fs::read_to_string(store.project("demo").join(&reply.manifest_path)).unwrap();
    assert_eq!(stored, reply.manifest_json);

    // Events: started, one per block (index, path, reason, bytes, sha256), completed.
    let events = store.events("demo", "r1");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ingest.started",
            "ingest.block.written",
            "ingest.block.skipped",
            "ingest.block.rejected",
            "ingest.completed"
        ]
    );
    let levels: Vec<&str> = events
        .iter()
        .map(|e| e["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["info", "info", "warning", "error", "error"]);
    let written = &events[1];
    assert_eq!(written["index"], 0);
    assert_eq!(written["path"], "workspace/src/app.py");
    assert_eq!(written["reason"], "");
    assert_eq!(written["bytes"], on_disk.len() as u64);
    assert_eq!(written["sha256"], sha256_hex(&on_disk));
    assert_eq!(written["outcome"], "created");
    assert_eq!(written["node_id"], "n1");
    assert_eq!(events[3]["reason"], "traversal");
    assert_eq!(events[4]["summary"]["written"], 1);
    assert_eq!(events[4]["manifest_path"], ".cairn/runs/r1/ingest/n1.json");
    let text = String::from_utf8(store.events_text("demo", "r1")).unwrap();
    assert!(
        !text.contains("hello from app"),
        "content leaked into events"
    );

    // Same document again: identical bytes are an idempotent success (unchanged).
    let again = ingest
        .client
        .ingest(request("demo", "r1", DOC.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.artifacts[0].status(), BlockStatus::Written);
    let events = store.events("demo", "r1");
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "ingest.block.written")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["created", "unchanged"]);

    // Different bytes under NEVER: exists, nothing changes.
    let changed = DOC.replace("hello from app", "changed");
    let mut never = request("demo", "r1", changed.as_bytes());
    never.overwrite_policy = OverwritePolicy::Never as i32;
    let refused = ingest.client.ingest(never).await.unwrap().into_inner();
    assert_eq!(
        (
            refused.artifacts[0].status(),
            refused.artifacts[0].reason.as_str()
        ),
        (BlockStatus::Rejected, "exists")
    );
    assert_eq!(
        std::fs::read(store.workspace("demo").join("src/app.py")).unwrap(),
        on_disk
    );
    // By default (INGESTED) a file an earlier ingest wrote is updated, in a later run too.
    let updated = ingest
        .client
        .ingest(request("demo", "r2", changed.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(updated.artifacts[0].status(), BlockStatus::Written);
    assert_eq!(
        std::fs::read(store.workspace("demo").join("src/app.py")).unwrap(),
        b"print('changed')\n"
    );
    // A person's edit is kept by default ...
    std::fs::write(
        store.workspace("demo").join("src/app.py"),
        b"print('mine')\n",
    )
    .unwrap();
    let kept = ingest
        .client
        .ingest(request("demo", "r3", DOC.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            kept.artifacts[0].status(),
            kept.artifacts[0].reason.as_str()
        ),
        (BlockStatus::Rejected, "kept")
    );
    assert!(
        kept.errors.iter().any(|e| e.contains("kept")),
        "{:?}",
        kept.errors
    );
    assert_eq!(
        std::fs::read(store.workspace("demo").join("src/app.py")).unwrap(),
        b"print('mine')\n"
    );
    // ... and replaced with overwrite (ALWAYS).
    let mut req = request("demo", "r3", changed.as_bytes());
    req.overwrite = true;
    let replaced = ingest.client.ingest(req).await.unwrap().into_inner();
    assert_eq!(replaced.artifacts[0].status(), BlockStatus::Written);
    assert_eq!(
        std::fs::read(store.workspace("demo").join("src/app.py")).unwrap(),
        b"print('changed')\n"
    );
    // An enum value the proto does not declare is refused, not read as the default.
    let mut bad = request("demo", "r4", DOC.as_bytes());
    bad.overwrite_policy = 9;
    let e = ingest.client.ingest(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(cairn_proto::reason::of(&e).as_deref(), Some("unknown_enum"));
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_stopped_gives_an_error_manifest_and_a_normal_reply() {
    let mut store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let ok = ingest
        .client
        .ingest(request("demo", "r1", DOC.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.summary.unwrap().written, 1);

    store.server.stop().await;
    let started = Instant::now();
    let reply = ingest
        .client
        .ingest(request("demo", "r2", b"```py file=b.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "a refused connection must not wait for the timeout"
    );
    assert_eq!(reply.level(), Level::Error);
    assert_eq!(reply.manifest_path, "", "the manifest could not be stored");
    assert_eq!(reply.artifacts.len(), 1);
    assert_eq!(
        (
            reply.artifacts[0].status(),
            reply.artifacts[0].reason.as_str()
        ),
        (BlockStatus::Rejected, "store_unavailable")
    );
    assert!(
        reply.errors.iter().any(|e| e.contains("unavailable")),
        "{:?}",
        reply.errors
    );
    let manifest: serde_json::Value = serde_json::from_str(&reply.manifest_json).unwrap();
    assert_eq!(manifest["summary"]["rejected"], 1);
    assert!(!store.workspace("demo").join("b.py").exists());

    // A dry run does not need the store at all.
    let dry = ingest
        .client
        .parse(request("demo", "r2", b"```py file=b.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dry.level(), Level::Info);
    assert_eq!(dry.artifacts[0].status(), BlockStatus::Written);
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_that_never_answers_times_out() {
    // Accepts TCP connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut config = common::config(&format!("http://{addr}"));
    config.store_timeout_ms = 300;
    let mut ingest = Ingest::start(config).await;
    let doc = "```py file=a.py\nx\n```\n```py file=b.py\ny\n```\n```py file=c.py\nz\n```\n";
    let started = Instant::now();
    let reply = ingest
        .client
        .ingest(request("demo", "r1", doc.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    // One timed-out call marks the store unavailable; later calls are not attempted.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(reply.level(), Level::Error);
    assert!(reply
        .artifacts
        .iter()
        .all(|a| a.status() == BlockStatus::Rejected && a.reason == "store_unavailable"));
    assert!(
        reply.errors.iter().any(|e| e.contains("store_timeout_ms")),
        "{:?}",
        reply.errors
    );
    assert_eq!(reply.manifest_path, "");
    holder.abort();
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_argument() {
    let mut ingest = Ingest::start(common::config("http://127.0.0.1:9")).await;
    for (project, run) in [
        ("", "r1"),
        ("p", ""),
        ("p/../x", "r1"),
        ("p", "r 1"),
        ("..", "r1"),
    ] {
        for dry in [false, true] {
            let req = request(project, run, b"```py file=a.py\nx\n```\n");
            let err = if dry {
                ingest.client.parse(req).await
            } else {
                ingest.client.ingest(req).await
            }
            .unwrap_err();
            assert_eq!(
                err.code(),
                Code::InvalidArgument,
                "{project:?} {run:?}: {err:?}"
            );
            assert!(
                err.message().contains("id") || err.message().contains("required"),
                "{}",
                err.message()
            );
        }
    }
    let mut req = request("p", "r1", b"");
    req.node_id = "a/b".into();
    assert_eq!(
        ingest.client.ingest(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    let err = ingest
        .client
        .get_enabled(GetEnabledRequest {
            project_id: String::new(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // The flag RPCs report a dead store honestly (they are queries, not ingest).
    let err = ingest
        .client
        .get_enabled(GetEnabledRequest {
            project_id: "p".into(),
            run_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feature_flag_per_project_and_per_run() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let get = |run: &str| GetEnabledRequest {
        project_id: "demo".into(),
        run_id: run.into(),
    };
    assert!(
        ingest
            .client
            .get_enabled(get(""))
            .await
            .unwrap()
            .into_inner()
            .enabled,
        "default on"
    );

    // Project off: ingest does nothing at all.
    let off = SetEnabledRequest {
        project_id: "demo".into(),
        run_id: String::new(),
        enabled: false,
    };
    assert!(
        !ingest
            .client
            .set_enabled(off)
            .await
            .unwrap()
            .into_inner()
            .enabled
    );
    assert!(
        !ingest
            .client
            .get_enabled(get("r1"))
            .await
            .unwrap()
            .into_inner()
            .enabled,
        "run inherits the project"
    );
    let reply = ingest
        .client
        .ingest(request("demo", "r1", b"```py file=a.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.enabled);
    assert_eq!(reply.manifest_json, "");
    assert!(reply.artifacts.is_empty());
    assert!(store.workspace_files("demo").is_empty());
    assert!(store.events("demo", "r1").is_empty());
    assert!(!store
        .project("demo")
        .join(".cairn/runs/r1/ingest/n1.json")
        .exists());

    // The run's setting overrides the project's.
    let on = SetEnabledRequest {
        project_id: "demo".into(),
        run_id: "r2".into(),
        enabled: true,
    };
    assert!(
        ingest
            .client
            .set_enabled(on)
            .await
            .unwrap()
            .into_inner()
            .enabled
    );
    assert!(
        ingest
            .client
            .get_enabled(get("r2"))
            .await
            .unwrap()
            .into_inner()
            .enabled
    );
    assert!(
        !ingest
            .client
            .get_enabled(get("r3"))
            .await
            .unwrap()
            .into_inner()
            .enabled
    );
    let reply = ingest
        .client
        .ingest(request("demo", "r2", b"```py file=a.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.enabled);
    assert_eq!(
        std::fs::read(store.workspace("demo").join("a.py")).unwrap(),
        b"x\n"
    );
    // Persisted as small JSON documents through the store.
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.project("demo").join(".cairn/ingest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["enabled"], false);
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(store.project("demo").join(".cairn/runs/r2/ingest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["enabled"], true);
    // A node may be called anything, "enabled" and "ingest" too: manifests never clobber flags.
    for node in ["enabled", "ingest"] {
        let mut req = request("demo", "r2", b"```py file=b.py\ny\n```\n");
        req.node_id = node.into();
        assert!(
            ingest
                .client
                .ingest(req)
                .await
                .unwrap()
                .into_inner()
                .enabled
        );
        assert!(
            ingest
                .client
                .get_enabled(get("r2"))
                .await
                .unwrap()
                .into_inner()
                .enabled
        );
    }
    ingest.server.stop().await;

    // A service whose default is off: nothing happens until a project or run enables it.
    let mut config = common::config(&store.addr());
    config.default_enabled = false;
    let mut ingest = Ingest::start(config).await;
    let reply = ingest
        .client
        .ingest(request("other", "r1", b"```py file=a.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.enabled);
    assert!(store.workspace_files("other").is_empty());
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_read_from_doc_path() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    common::put_file(
        &store.addr(),
        "demo",
        "docs/answer.md",
        b"```py file=from_doc.py\nfrom doc\n```\n",
    )
    .await;

    let mut req = request("demo", "r1", b"");
    req.doc_path = "docs/answer.md".into();
    let reply = ingest
        .client
        .ingest(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.level(), Level::Info, "{:?}", reply.errors);
    assert_eq!(
        std::fs::read(store.workspace("demo").join("from_doc.py")).unwrap(),
        b"from doc\n"
    );

    // A missing document: ERROR, ingest.failed, a normal reply.
    req.doc_path = "docs/missing.md".into();
    req.run_id = "r2".into();
    let reply = ingest.client.ingest(req).await.unwrap().into_inner();
    assert_eq!(reply.level(), Level::Error);
    assert!(reply.artifacts.is_empty());
    assert!(
        reply.errors.iter().any(|e| e.contains("docs/missing.md")),
        "{:?}",
        reply.errors
    );
    let events = store.events("demo", "r2");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "ingest.failed");
    assert_eq!(last["reason"], "io_error");
    ingest.server.stop().await;

    // A stored document over max_document_bytes: one too_large entry for it, nothing parsed.
    let mut config = common::config(&store.addr());
    config.max_document_bytes = 10;
    let mut small = Ingest::start(config).await;
    let mut req = request("demo", "r3", b"");
    req.doc_path = "docs/answer.md".into();
    let reply = small.client.ingest(req).await.unwrap().into_inner();
    let doc = std::fs::read(store.project("demo").join("docs/answer.md")).unwrap();
    assert_eq!(reply.artifacts.len(), 1);
    let a = &reply.artifacts[0];
    assert_eq!(
        (a.status(), a.reason.as_str(), a.bytes, a.sha256.as_str()),
        (
            BlockStatus::Rejected,
            "too_large",
            doc.len() as u64,
            sha256_hex(&doc).as_str()
        )
    );
    assert_eq!(reply.level(), Level::Error);
    let events = store.events("demo", "r3");
    assert_eq!(events.last().unwrap()["type"], "ingest.failed");
    assert_eq!(events.last().unwrap()["reason"], "too_large");
    small.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_prefix_policy_comes_back_as_prefix_not_allowed() {
    let store =
        Store::start_with(|c| c.allowed_prefixes = vec!["docs".into(), ".cairn".into()]).await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let reply = ingest
        .client
        .ingest(request("demo", "r1", b"```py file=a.py\nx\n```\n"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            reply.artifacts[0].status(),
            reply.artifacts[0].reason.as_str()
        ),
        (BlockStatus::Rejected, "prefix_not_allowed")
    );
    assert_eq!(reply.level(), Level::Error);
    assert!(store.workspace_files("demo").is_empty());
    assert_eq!(
        reply.manifest_path, ".cairn/runs/r1/ingest/n1.json",
        "the manifest lives under .cairn, still allowed"
    );
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_blocks_are_written_concurrently_in_manifest_order() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let mut doc = String::new();
    for i in 0..200 {
        doc.push_str(&format!(
            "```py file=pkg{}/m{i}.py\nVALUE = {i}\n```\n",
            i % 7
        ));
    }
    let reply = ingest
        .client
        .ingest(request("demo", "r1", doc.as_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.summary.unwrap().written, 200, "{:?}", reply.errors);
    for (i, a) in reply.artifacts.iter().enumerate() {
        assert_eq!(a.index as usize, i);
        let bytes = std::fs::read(
            store
                .workspace("demo")
                .join(format!("pkg{}/m{i}.py", i % 7)),
        )
        .unwrap();
        assert_eq!(bytes, format!("VALUE = {i}\n").as_bytes());
        assert_eq!(a.sha256, sha256_hex(&bytes));
    }
    let events = store.events("demo", "r1");
    let indexes: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "ingest.block.written")
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    assert_eq!(
        indexes,
        (0..200).collect::<Vec<u64>>(),
        "block events in document order"
    );
    ingest.server.stop().await;
}
