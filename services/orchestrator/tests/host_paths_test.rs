//! No request reaches a file of the orchestrator's host, over real gRPC on loopback: a client
//! that still sends the removed `base_dir` (field 10) is ignored, and every field of a graph
//! that names a file (a plan task's `prompt_file`, `limits_file`, a contract's `schema_file`,
//! a `replay:` cassette) is read only from what the request sent or from the run's project
//! through the store, which follows no symlink. Absolute paths, `..` and `/etc/passwd` are
//! refused with a message naming the field; the secret appears nowhere (error, records,
//! GetRun, WatchRun).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use cairn_proto::v1::{GetRunRequest, RunInfo, WatchRunRequest};
use common::*;
use tonic::Code;

const MARKER: &str = "HOST-SECRET-5d1e";

/// SubmitRunRequest as clients sent it while it had `base_dir` (field 10).
#[derive(Clone, PartialEq, prost::Message)]
struct LegacySubmit {
    #[prost(string, tag = "1")]
    project_id: String,
    #[prost(string, tag = "2")]
    graph_yaml: String,
    #[prost(string, tag = "4")]
    run_id: String,
    #[prost(string, tag = "8")]
    by: String,
    #[prost(string, tag = "9")]
    llm: String,
    #[prost(string, tag = "10")]
    base_dir: String,
}

async fn submit_legacy(
    s: &Stack,
    run_id: &str,
    graph: &str,
    llm: &str,
    base_dir: &Path,
) -> Result<RunInfo, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel(&s.orch_addr).await);
    grpc.ready().await.unwrap();
    let req = LegacySubmit {
        project_id: PROJECT.into(),
        graph_yaml: graph.into(),
        run_id: run_id.into(),
        by: "attacker".into(),
        llm: llm.into(),
        base_dir: base_dir.display().to_string(),
    };
    grpc.unary(
        tonic::Request::new(req),
        "/cairn.v1.Orchestrator/SubmitRun".parse().unwrap(),
        tonic_prost::ProstCodec::<LegacySubmit, RunInfo>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A host directory `host/` with secrets a graph could name: plain text, a limits file and a
/// JSON Schema, each carrying MARKER and each valid for its field, so that a read would go
/// through to graph.resolved.json.
fn host_secrets(s: &Stack) -> PathBuf {
    let host = s.dir.path().join("host");
    std::fs::create_dir_all(host.join("graphs")).unwrap();
    std::fs::write(
        host.join("shadow"),
        format!("root:{MARKER}:19000:0:99999:7:::\n"),
    )
    .unwrap();
    std::fs::write(
        host.join("shadow.yaml"),
        format!("tasks:\n  t: {{daily_limit: 1, prompt: \"{MARKER}\"}}\n"),
    )
    .unwrap();
    std::fs::write(
        host.join("shadow.json"),
        format!("{{\"description\": \"{MARKER}\", \"type\": \"object\"}}"),
    )
    .unwrap();
    host
}

/// A graph naming `file` through `field`.
fn graph(field: &str, file: &str) -> String {
    match field {
        "prompt_file" => format!(
            "nodes:\n  - {{id: p, type: plan, limits: {{tasks: {{t: {{daily_limit: 1, prompt_file: \"{file}\"}}}}}}}}\n"
        ),
        "limits_file" => format!("nodes:\n  - {{id: p, type: plan, limits_file: \"{file}\"}}\n"),
        "schema_file" => format!(
            "contracts:\n  - {{files: [\"*.json\"], schema_file: \"{file}\"}}\nnodes:\n  - {{id: w, type: write_file, path: 'docs/{{{{run_id}}}}/a.txt', content: a}}\n"
        ),
        _ => unreachable!(),
    }
}

/// The secret file each field is pointed at.
fn secret_for(field: &str) -> &'static str {
    match field {
        "prompt_file" => "shadow",
        "limits_file" => "shadow.yaml",
        _ => "shadow.json",
    }
}

/// The project's records and documents, as text.
async fn everything(s: &Stack) -> String {
    let mut all = String::new();
    let mut paths = s.list(".cairn").await;
    paths.extend(s.list("docs").await);
    for path in paths {
        if let Some(bytes) = s.read(&path).await {
            all.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    all
}

/// The submit was refused naming `field`, and run `run` does not exist.
async fn assert_refused(
    s: &Stack,
    run: &str,
    what: &str,
    field: &str,
    r: Result<RunInfo, tonic::Status>,
) {
    let e = match r {
        Ok(info) => panic!(
            "{what}: accepted; graph.resolved.json: {}",
            s.read_text(&format!(".cairn/runs/{}/graph.resolved.json", info.run_id))
                .await
        ),
        Err(e) => e,
    };
    assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
    let m = e.message();
    assert!(m.contains(field), "{what}: the field is not named: {m}");
    assert!(
        !m.contains(MARKER) && !m.contains("root:x:"),
        "{what}: the message quotes the file: {m}"
    );
    let mut c = s.client.clone();
    let get = c
        .get_run(GetRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(get.code(), Code::NotFound, "{what}: {get:?}");
    let watch = c
        .watch_run(WatchRunRequest {
            project_id: PROJECT.into(),
            run_id: run.into(),
            from_seq: 1,
            follow_after_end: false,
        })
        .await;
    if let Ok(stream) = watch {
        let mut stream = stream.into_inner();
        if let Ok(Some(ev)) = stream.message().await {
            panic!("{what}: WatchRun streams an event of a refused run: {ev:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_base_dir_reads_no_host_file_through_any_field() {
    let s = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    let host = host_secrets(&s);
    let graphs = host.join("graphs");
    // The project's own directory on the store's disk, with links that lead out of it.
    let project_root = s.dir.path().join("data/projects").join(PROJECT);
    put_file(&s.store, "docs/keep.txt", b"x").await;
    for name in ["shadow", "shadow.yaml", "shadow.json"] {
        std::os::unix::fs::symlink(host.join(name), project_root.join(format!("link-{name}")))
            .unwrap();
    }
    let mut n = 0;
    for field in ["prompt_file", "limits_file", "schema_file"] {
        let secret = secret_for(field);
        let abs = host.join(secret).display().to_string();
        let up = format!("../{secret}");
        let deep = format!("graphs/../../host/{secret}");
        let link = format!("link-{secret}");
        let cases: [(&str, &Path); 6] = [
            // Relative to a host directory the request names: the field is ignored.
            (secret, &host),
            (&abs, &host),
            ("/etc/passwd", &host),
            (&up, &graphs),
            (&deep, &graphs),
            // A symlink inside the project pointing out of it.
            (&link, &project_root),
        ];
        for (file, base) in cases {
            n += 1;
            let run = format!("attack-{n}");
            let what = format!("{field}: {file} (base_dir {})", base.display());
            let r = submit_legacy(&s, &run, &graph(field, file), "", base).await;
            let shown = if field == "prompt_file" {
                "limits"
            } else {
                field
            };
            assert_refused(&s, &run, &what, shown, r).await;
        }
    }
    let all = everything(&s).await;
    assert!(!all.contains(MARKER), "a secret reached the project");
    assert!(s.list(".cairn/runs").await.is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_base_dir_is_ignored_and_the_project_file_is_read() {
    let s = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    let host = host_secrets(&s);
    put_file(&s.store, "shadow", b"the project's own prompt").await;
    let info = submit_legacy(&s, "legit", &graph("prompt_file", "shadow"), "", &host)
        .await
        .unwrap();
    let resolved = s
        .read_text(&format!(".cairn/runs/{}/graph.resolved.json", info.run_id))
        .await;
    assert!(resolved.contains("the project's own prompt"), "{resolved}");
    assert!(!resolved.contains(MARKER), "{resolved}");
    s.wait_final(&info.run_id, 60).await;
    assert!(!everything(&s).await.contains(MARKER));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cassette_is_never_read_from_the_host_nor_through_a_project_symlink() {
    let s = Stack::start(Options {
        ingest: false,
        ..Default::default()
    })
    .await;
    let host = s.dir.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let cassette = format!("answers:\n  - {{node: writer, content: {MARKER}}}\n");
    std::fs::write(host.join("cassette.yaml"), &cassette).unwrap();
    let project_root = s.dir.path().join("data/projects").join(PROJECT);
    put_file(&s.store, "docs/keep.txt", b"x").await;
    std::fs::create_dir_all(project_root.join("cassettes")).unwrap();
    std::os::unix::fs::symlink(
        host.join("cassette.yaml"),
        project_root.join("cassettes/link.yaml"),
    )
    .unwrap();
    let graph = "nodes:\n  - {id: writer, type: agent_task, prompt: hi, path: \"docs/{{run_id}}/out.md\"}\n";
    let abs = format!("replay:{}", host.join("cassette.yaml").display());
    for (n, llm) in [
        "replay:cassette.yaml",
        abs.as_str(),
        "replay:../host/cassette.yaml",
        "replay:/etc/passwd",
        "replay:cassettes/link.yaml",
    ]
    .into_iter()
    .enumerate()
    {
        let run = format!("cassette-{n}");
        let r = submit_legacy(&s, &run, graph, llm, &host).await;
        assert_refused(&s, &run, llm, "cassette", r).await;
    }
    assert!(!everything(&s).await.contains(MARKER));
    s.stop().await;
}
