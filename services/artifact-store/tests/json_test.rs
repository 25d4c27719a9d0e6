//! UpdateJson: write_version optimistic lock, Aborted without merge, max-merge on conflict
//!, RFC 7386 merge patches.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{MergePolicy, UpdateJsonRequest, UpdateJsonResponse};
use common::*;
use serde_json::{json, Value};
use tonic::{Code, Status};

async fn update(
    client: &mut Client,
    expected: u64,
    patch: Value,
    merge: MergePolicy,
) -> Result<UpdateJsonResponse, Status> {
    let request = UpdateJsonRequest {
        project_id: "p".into(),
        path: "context/auto-tasks-today.json".into(),
        expected_version: expected,
        patch_json: patch.to_string(),
        merge: merge as i32,
        run_id: "run-1".into(),
    };
    client.update_json(request).await.map(|r| r.into_inner())
}

fn doc(r: &UpdateJsonResponse) -> Value {
    serde_json::from_str(&r.document_json).unwrap()
}

#[tokio::test]
async fn conflicts_abort_without_merge_and_max_merge_with_it() {
    let mut s = serve().await;
    create_project(&mut s.client, "p").await;
    let r = update(
        &mut s.client,
        0,
        json!({"done": 3, "failed": 1, "by": {"a": 2}, "note": "x"}),
        MergePolicy::None,
    )
    .await
    .unwrap();
    assert_eq!((r.version, r.merged_conflict), (1, false));
    assert_eq!(
        doc(&r),
        json!({"done": 3, "failed": 1, "by": {"a": 2}, "note": "x", "write_version": 1})
    );
    let r = update(
        &mut s.client,
        1,
        json!({"done": 4, "note": null}),
        MergePolicy::None,
    )
    .await
    .unwrap();
    assert_eq!(r.version, 2);
    assert_eq!(
        doc(&r),
        json!({"done": 4, "failed": 1, "by": {"a": 2}, "write_version": 2}),
        "RFC 7386: null removes"
    );

    let file = s.project_dir("p").join("context/auto-tasks-today.json");
    let before = std::fs::read(&file).unwrap();
    // A writer that read version 1 is now stale.
    let err = update(&mut s.client, 1, json!({"done": 1}), MergePolicy::None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert!(
        err.message().contains("version 2") && err.message().contains("expected 1"),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "an aborted update changes nothing"
    );

    // With max-merge the counters keep the larger value and the version bumps.
    let r = update(
        &mut s.client,
        1,
        json!({"done": 2, "failed": 7, "by": {"a": 1, "b": 5}, "note": "y"}),
        MergePolicy::Max,
    )
    .await
    .unwrap();
    assert!(r.merged_conflict);
    assert_eq!(r.version, 3);
    assert_eq!(
        doc(&r),
        json!({"done": 4, "failed": 7, "by": {"a": 2, "b": 5}, "note": "y", "write_version": 3})
    );
    let on_disk: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(on_disk, doc(&r));

    // The merged conflict is recorded in the run.
    let events = run_events(&mut s.client, "p", "run-1").await;
    assert_eq!(
        events.iter().map(|e| e.r#type.as_str()).collect::<Vec<_>>(),
        ["store.json_merged"]
    );
    let data: Value = serde_json::from_str(&events[0].data_json).unwrap();
    assert_eq!(
        (data["stored_version"].as_u64(), data["version"].as_u64()),
        (Some(2), Some(3))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_max_merges_serialise_and_keep_the_maximum() {
    let mut s = serve().await;
    create_project(&mut s.client, "p").await;
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let mut client = s.client.clone();
        tasks.push(tokio::spawn(async move {
            update(
                &mut client,
                0,
                json!({"count": i, "seen": {format!("w{i}"): 1}}),
                MergePolicy::Max,
            )
            .await
            .unwrap()
        }));
    }
    let mut versions = Vec::new();
    for t in tasks {
        versions.push(t.await.unwrap().version);
    }
    versions.sort();
    assert_eq!(
        versions,
        (1..=16).collect::<Vec<_>>(),
        "every update got its own version"
    );
    let r = update(&mut s.client, 16, json!({}), MergePolicy::None)
        .await
        .unwrap();
    let d = doc(&r);
    assert_eq!(d["count"], 15);
    assert_eq!(d["seen"].as_object().unwrap().len(), 16);
    assert_eq!(r.version, 17);
}

#[tokio::test]
async fn bad_patches_and_documents_are_refused() {
    let mut s = serve().await;
    create_project(&mut s.client, "p").await;
    for patch in [json!([1]), json!({"write_version": 9}), json!("x")] {
        let err = update(&mut s.client, 0, patch, MergePolicy::None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    let mut request = UpdateJsonRequest {
        project_id: "p".into(),
        path: "docs/x.json".into(),
        patch_json: "{not json".into(),
        ..Default::default()
    };
    assert_eq!(
        s.client
            .update_json(request.clone())
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    put(&mut s.client, "p", "docs/x.json", b"[1,2]")
        .await
        .unwrap();
    request.patch_json = "{}".into();
    let err = s.client.update_json(request.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("JSON object"), "{err:?}");
    assert_eq!(
        std::fs::read(s.project_dir("p").join("docs/x.json")).unwrap(),
        b"[1,2]"
    );
    request.merge = 7;
    assert_eq!(
        s.client.update_json(request).await.unwrap_err().code(),
        Code::InvalidArgument
    );
}
