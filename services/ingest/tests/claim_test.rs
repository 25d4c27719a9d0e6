//! Ingest under a caller's ingest claim on the run (IngestRequest.claim, artifact-store
//! ClaimRun and GrantIngestClaim): once a newer claim holds the run, nothing of the older
//! caller's ingest lands.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::artifact_store_client::ArtifactStoreClient;
use cairn_proto::v1::{
    ClaimRunRequest, CreateProjectRequest, GrantIngestClaimRequest, IngestRequest,
};
use common::{request, Ingest, Store};
use tonic::Code;

async fn store_client(store: &Store) -> ArtifactStoreClient<tonic::transport::Channel> {
    let mut client = ArtifactStoreClient::connect(store.addr()).await.unwrap();
    client
        .create_project(CreateProjectRequest {
            project_id: "demo".into(),
        })
        .await
        .unwrap();
    client
}

/// Claims the run and returns an ingest claim for that epoch.
async fn claim(client: &mut ArtifactStoreClient<tonic::transport::Channel>, run: &str) -> String {
    let epoch = client
        .claim_run(ClaimRunRequest {
            project_id: "demo".into(),
            run_id: run.into(),
            holder: "test".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .epoch;
    client
        .grant_ingest_claim(GrantIngestClaimRequest {
            project_id: "demo".into(),
            run_id: run.into(),
            epoch,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .claim
}

fn fenced(run: &str, doc: &str, claim: &str) -> IngestRequest {
    IngestRequest {
        claim: claim.into(),
        overwrite: true,
        ..request("demo", run, doc.as_bytes())
    }
}

fn assert_fenced(status: &tonic::Status) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        cairn_proto::reason::of(status).as_deref(),
        Some("fenced"),
        "{status:?}"
    );
    assert!(
        status.message().contains("claimed this run"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_fenced_off_by_a_newer_claim_lands_nothing() {
    let store = Store::start().await;
    let mut ingest = Ingest::start(common::config(&store.addr())).await;
    let mut client = store_client(&store).await;
    let first = claim(&mut client, "r1").await;

    // Under its claim the caller ingests as usual.
    let doc = "```python file=src/app.py\nprint('v1')\n```\n";
    let reply = ingest
        .client
        .ingest(fenced("r1", doc, &first))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.summary.unwrap().written, 1);
    let manifest = store.project("demo").join(".cairn/runs/r1/ingest/n1.json");
    let (files, events, manifest_bytes) = (
        store.workspace_files("demo"),
        store.events("demo", "r1"),
        std::fs::read(&manifest).unwrap(),
    );
    assert_eq!(files["src/app.py"], b"print('v1')\n");
    assert!(events.iter().any(|e| e["type"] == "ingest.completed"));

    // A successor claims the run: the first caller's next ingest is refused and changes
    // nothing (no file, manifest or event).
    let second = claim(&mut client, "r1").await;
    assert_ne!(second, first);
    let doc2 =
        "```python file=src/app.py\nprint('v2')\n```\n```python file=src/new.py\nx = 1\n```\n";
    let status = ingest
        .client
        .ingest(fenced("r1", doc2, &first))
        .await
        .unwrap_err();
    assert_fenced(&status);
    assert_eq!(store.workspace_files("demo"), files);
    assert_eq!(store.events("demo", "r1"), events);
    assert_eq!(std::fs::read(&manifest).unwrap(), manifest_bytes);

    // The successor ingests under its own claim.
    let reply = ingest
        .client
        .ingest(fenced("r1", doc2, &second))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.summary.unwrap().written, 2);
    assert_eq!(
        store.workspace_files("demo")["src/app.py"],
        b"print('v2')\n"
    );

    // A claim must be for the request's run: another run's claim lands nothing here.
    let r2 = claim(&mut client, "r2").await;
    let before = (store.workspace_files("demo"), store.events("demo", "r1"));
    let status = ingest
        .client
        .ingest(fenced("r1", "```python file=src/x.py\nx\n```\n", &r2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(
        cairn_proto::reason::of(&status).as_deref(),
        Some("claim_other_run")
    );
    assert_eq!(
        (store.workspace_files("demo"), store.events("demo", "r1")),
        before
    );
    // A plaintext (single-user) deployment needs no claim.
    assert!(ingest.client.ingest(fenced("r1", doc, "")).await.is_ok());
    ingest.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_the_middle_of_an_ingest_stops_its_writes() {
    // A document of many blocks written one at a time; a successor claims the run once the
    // first files are there. Every file that lands after the claim returned would be a write
    // of a fenced-off caller: there must be none, and no manifest or completion event.
    let store = Store::start().await;
    let mut config = common::config(&store.addr());
    config.write_concurrency = 1;
    config.max_blocks = 5_000;
    let mut ingest = Ingest::start(config).await;
    let mut client = store_client(&store).await;
    let first = claim(&mut client, "r1").await;
    let doc: String = (0..2_000)
        .map(|i| format!("```text file=many/f{i}.txt\n{i}\n```\n"))
        .collect();
    let mut c = ingest.client.clone();
    let call = tokio::spawn(async move { c.ingest(fenced("r1", &doc, &first)).await });

    let dir = store.workspace("demo").join("many");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_dir(&dir).map_or(0, |d| d.count()) == 0 {
        assert!(std::time::Instant::now() < deadline, "no block was written");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    claim(&mut client, "r1").await;
    let at_claim = store.workspace_files("demo");
    let status = call.await.unwrap().expect_err(
        "2,000 blocks one at a time cannot all be written before the claim (or the fence was ignored)",
    );
    assert_fenced(&status);
    assert_eq!(
        store.workspace_files("demo"),
        at_claim,
        "files landed after the claim"
    );
    assert!(at_claim.len() < 2_000, "{} files", at_claim.len());
    assert!(!store
        .project("demo")
        .join(".cairn/runs/r1/ingest/n1.json")
        .exists());
    let types: Vec<_> = store
        .events("demo", "r1")
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(types, ["ingest.started"], "only the start was recorded");
    ingest.server.stop().await;
}
