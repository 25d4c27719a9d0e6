//! Projects, Put/Get/Stat/List/Delete over real gRPC.
#![allow(clippy::unwrap_used)]

mod common;

use cairn_proto::v1::{
    put_request, AppendEventsRequest, CreateProjectRequest, DeleteRequest, EntryKind, EventInput,
    ListProjectsRequest, ListRequest, PageRequest, PutDurability, PutEnd, PutHeader, PutRequest,
    PutResponse, ReadEventsRequest, StatRequest, WriteOutcome,
};
use common::*;
use futures::StreamExt;
use tonic::Code;

#[tokio::test]
async fn create_project_lays_out_the_directories_and_is_idempotent() {
    let mut s = serve().await;
    let first = s
        .client
        .create_project(CreateProjectRequest {
            project_id: "p1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let again = s
        .client
        .create_project(CreateProjectRequest {
            project_id: "p1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        first, again,
        "creating an existing project returns it unchanged"
    );
    assert!(
        first.created_at.ends_with('Z') && first.created_at.len() == 24,
        "{}",
        first.created_at
    );
    for dir in ["docs", "workspace", ".cairn/runs"] {
        assert!(s.project_dir("p1").join(dir).is_dir(), "{dir} missing");
    }
    s.client
        .create_project(CreateProjectRequest {
            project_id: "a-0".into(),
        })
        .await
        .unwrap();
    let listed = s
        .client
        .list_projects(ListProjectsRequest { page: None })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = listed
        .projects
        .iter()
        .map(|p| p.project_id.as_str())
        .collect();
    assert_eq!(ids, ["a-0", "p1"]);

    for bad in ["", ".", "..", "a/b", "sp ace", &"x".repeat(129)] {
        let err = s
            .client
            .create_project(CreateProjectRequest {
                project_id: bad.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err:?}");
    }
}

#[tokio::test]
async fn put_then_get_returns_the_bytes_and_digest() {
    let mut s = serve().await;
    let body = b"hello, cairn\n".repeat(1000);
    let r = put(&mut s.client, "p", "workspace/src/main.rs", &body)
        .await
        .unwrap();
    assert_eq!(outcome(&r), WriteOutcome::Created);
    assert_eq!(r.path, "workspace/src/main.rs");
    let digest = r.digest.unwrap();
    assert_eq!(digest.sha256, sha256_hex(&body));
    assert_eq!(digest.size_bytes, body.len() as u64);
    let (sha, size, bytes) = get_range(&mut s.client, "p", "workspace/src/main.rs", 0, 0)
        .await
        .unwrap();
    assert_eq!(
        (sha.as_str(), size),
        (sha256_hex(&body).as_str(), body.len() as u64)
    );
    assert_eq!(bytes, body);
    assert_eq!(
        std::fs::read(s.project_dir("p").join("workspace/src/main.rs")).unwrap(),
        body
    );
    // An empty file is a file.
    let r = put(&mut s.client, "p", "docs/empty.md", b"").await.unwrap();
    assert_eq!(r.digest.unwrap().size_bytes, 0);
    assert_eq!(get(&mut s.client, "p", "docs/empty.md").await.unwrap(), b"");
}

#[tokio::test]
async fn puts_whose_directory_syncs_with_the_runs_events() {
    let mut s = serve().await;
    let deferred = |path: &str, run: &str| PutHeader {
        run_id: run.into(),
        durability: PutDurability::WithRunEvents as i32,
        ..header("p", path)
    };
    // Published and readable at once, with the same outcomes as a synced Put.
    let r = put_with(&mut s.client, deferred("docs/a.md", "r1"), b"one")
        .await
        .unwrap();
    assert_eq!(outcome(&r), WriteOutcome::Created);
    assert_eq!(get(&mut s.client, "p", "docs/a.md").await.unwrap(), b"one");
    let again = put_with(&mut s.client, deferred("docs/a.md", "r1"), b"one")
        .await
        .unwrap();
    assert_eq!(outcome(&again), WriteOutcome::Unchanged);
    let clash = put_with(&mut s.client, deferred("docs/a.md", "r1"), b"two")
        .await
        .unwrap_err();
    assert_eq!(clash.code(), Code::AlreadyExists);
    // The run's next events are appended as usual.
    let appended = s
        .client
        .append_events(AppendEventsRequest {
            project_id: "p".into(),
            run_id: "r1".into(),
            epoch: 0,
            publication_tokens: Vec::new(),
            events: vec![EventInput {
                r#type: "artifact.written".into(),
                data_json: r#"{"path":"docs/a.md"}"#.into(),
                ..Default::default()
            }],
            claim: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((appended.first_seq, appended.last_seq), (1, 1));
    // Without a run there are no events to sync with: refused, nothing written.
    let no_run = put_with(&mut s.client, deferred("docs/b.md", ""), b"x")
        .await
        .unwrap_err();
    assert_eq!(no_run.code(), Code::InvalidArgument);
    assert!(no_run.message().contains("run_id"), "{}", no_run.message());
    assert!(!s.project_dir("p").join("docs/b.md").exists());
}

#[tokio::test]
async fn get_honours_offset_and_length() {
    let mut s = serve().await;
    let mut body = vec![0u8; 3 << 20];
    Bytegen::new(7).fill(&mut body);
    put(&mut s.client, "p", "docs/big.bin", &body)
        .await
        .unwrap();
    let cases = [
        (0, 10),
        (5, 0),
        ((1 << 20) - 3, 10),
        (3 << 20, 0),
        ((3 << 20) - 1, 100),
        (100, (2 << 20) + 17),
    ];
    for (offset, length) in cases {
        let (sha, size, got) = get_range(&mut s.client, "p", "docs/big.bin", offset, length)
            .await
            .unwrap();
        let end = if length == 0 {
            body.len()
        } else {
            (offset + length).min(body.len() as u64) as usize
        };
        assert_eq!(
            got,
            &body[offset as usize..end],
            "offset {offset} length {length}"
        );
        assert_eq!(sha, sha256_hex(&body), "FileInfo describes the whole file");
        assert_eq!(size, body.len() as u64);
    }
    let err = get_range(&mut s.client, "p", "docs/big.bin", (3 << 20) + 1, 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("past the end"), "{err:?}");
}

#[tokio::test]
async fn not_found_messages_say_what_is_missing() {
    let mut s = serve().await;
    let err = get(&mut s.client, "nope", "docs/a").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(
        err.message().contains("project \"nope\" does not exist"),
        "{err:?}"
    );
    put(&mut s.client, "p", "docs/a", b"x").await.unwrap();
    let err = get(&mut s.client, "p", "docs/b").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("\"docs/b\""), "{err:?}");
    let err = get(&mut s.client, "p", "nodir/b").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // Put without create_project into a missing project.
    let err = put_with(
        &mut s.client,
        PutHeader {
            create_project: false,
            ..header("other", "docs/a")
        },
        b"x",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("CreateProject"), "{err:?}");
}

#[tokio::test]
async fn stat_describes_files_directories_and_missing_paths() {
    let mut s = serve().await;
    put(&mut s.client, "p", "docs/a.txt", b"abc").await.unwrap();
    let stat = |path: &str, sha: bool| StatRequest {
        project_id: "p".into(),
        path: path.into(),
        include_sha256: sha,
    };
    let file = s
        .client
        .stat(stat("docs/a.txt", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(file.kind, EntryKind::File as i32);
    assert_eq!(
        (file.size_bytes, file.sha256.as_str()),
        (3, sha256_hex(b"abc").as_str())
    );
    assert!(file.modified_at.ends_with('Z'));
    let file = s
        .client
        .stat(stat("docs/a.txt", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(file.sha256, "", "sha256 only when asked");
    let dir = s
        .client
        .stat(stat("docs", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (dir.kind, dir.size_bytes, dir.sha256.as_str()),
        (EntryKind::Directory as i32, 0, "")
    );
    let root = s.client.stat(stat("", false)).await.unwrap().into_inner();
    assert_eq!(root.kind, EntryKind::Directory as i32);
    let err = s
        .client
        .stat(stat("docs/missing", false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    std::os::unix::fs::symlink("/etc/passwd", s.project_dir("p").join("docs/link")).unwrap();
    let link = s
        .client
        .stat(stat("docs/link", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (link.kind, link.sha256.as_str()),
        (EntryKind::Other as i32, ""),
        "symlinks are described, never followed"
    );
}

#[tokio::test]
async fn list_pages_through_entries_in_byte_order() {
    let mut s = serve().await;
    let mut names: Vec<String> = (0..25).map(|i| format!("docs/f{i:02}")).collect();
    names.push("docs/sub/deep.txt".into());
    names.push("docs/a.b".into());
    for name in &names {
        put(&mut s.client, "p", name, name.as_bytes())
            .await
            .unwrap();
    }
    // A temp file of an in-flight write and a denylisted entry are not listed.
    std::fs::write(s.project_dir("p").join("docs/.cairn-tmp-x"), b"t").unwrap();
    std::fs::create_dir(s.project_dir("p").join("docs/.git")).unwrap();
    std::fs::write(s.project_dir("p").join("docs/.git/config"), b"t").unwrap();

    let mut token = String::new();
    let mut pages = Vec::new();
    loop {
        let r = s
            .client
            .list(ListRequest {
                project_id: "p".into(),
                prefix: "docs".into(),
                recursive: true,
                page: Some(PageRequest {
                    page_size: 10,
                    page_token: token.clone(),
                }),
            })
            .await
            .unwrap()
            .into_inner();
        pages.push(r.entries.iter().map(|e| e.path.clone()).collect::<Vec<_>>());
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(pages.len(), 3, "27 entries in pages of 10");
    let listed: Vec<String> = pages.concat();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected);

    // Non-recursive: direct children, directories included.
    let r = s
        .client
        .list(ListRequest {
            project_id: "p".into(),
            prefix: "docs/".into(),
            recursive: false,
            page: None,
        })
        .await
        .unwrap()
        .into_inner();
    let sub = r
        .entries
        .iter()
        .find(|e| e.path == "docs/sub")
        .expect("docs/sub listed");
    assert_eq!(sub.kind, EntryKind::Directory as i32);
    assert_eq!(r.entries.len(), 27);
    assert!(r.next_page_token.is_empty());

    let err = s
        .client
        .list(ListRequest {
            project_id: "p".into(),
            prefix: "docs".into(),
            recursive: false,
            page: Some(PageRequest {
                page_size: 1,
                page_token: "forged".into(),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = s
        .client
        .list(ListRequest {
            project_id: "p".into(),
            prefix: "docs/f00".into(),
            recursive: false,
            page: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}

/// Every page of a List, concatenated.
async fn list_all(s: &mut Served, prefix: &str, recursive: bool, size: u32) -> Vec<String> {
    let mut token = String::new();
    let mut out = Vec::new();
    loop {
        let r = s
            .client
            .list(ListRequest {
                project_id: "p".into(),
                prefix: prefix.into(),
                recursive,
                page: Some(PageRequest {
                    page_size: size,
                    page_token: token.clone(),
                }),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.entries.len() <= size as usize);
        out.extend(r.entries.into_iter().map(|e| e.path));
        if r.next_page_token.is_empty() {
            return out;
        }
        token = r.next_page_token;
    }
}

/// Pages resume after the last path sent, in byte order of whole paths, where a directory's
/// files sort after a sibling named like it with a `.` or `-` (`x.txt` < `x/a` < `x0`).
#[tokio::test]
async fn list_pages_resume_in_byte_order_of_whole_paths() {
    let mut s = serve().await;
    let mut names: Vec<String> = [
        "d/x/a",
        "d/x/b/c",
        "d/x/b/d",
        "d/x.txt",
        "d/x-y/z",
        "d/x0",
        "d/w",
        "d/y/q/r/s",
    ]
    .iter()
    .map(|n| (*n).to_owned())
    .collect();
    for name in &names {
        put(&mut s.client, "p", name, b"x").await.unwrap();
    }
    names.sort();
    for size in [1, 2, 3, 100] {
        assert_eq!(
            list_all(&mut s, "d", true, size).await,
            names,
            "pages of {size}"
        );
    }
    let children = ["d/w", "d/x", "d/x-y", "d/x.txt", "d/x0", "d/y"];
    for size in [1, 4] {
        assert_eq!(
            list_all(&mut s, "d", false, size).await,
            children,
            "pages of {size}"
        );
    }
}

#[tokio::test]
async fn overwrite_policy_and_idempotent_rewrites() {
    let mut s = serve().await;
    assert_eq!(
        outcome(&put(&mut s.client, "p", "docs/a", b"one").await.unwrap()),
        WriteOutcome::Created
    );
    assert_eq!(
        outcome(&put(&mut s.client, "p", "docs/a", b"one").await.unwrap()),
        WriteOutcome::Unchanged
    );
    let st = assert_refused(
        put(&mut s.client, "p", "docs/a", b"two").await,
        Code::AlreadyExists,
        "exists",
    );
    assert!(st.message().contains("overwrite=true"), "{st:?}");
    assert_eq!(get(&mut s.client, "p", "docs/a").await.unwrap(), b"one");
    assert_eq!(
        outcome(
            &put_overwrite(&mut s.client, "p", "docs/a", b"one")
                .await
                .unwrap()
        ),
        WriteOutcome::Unchanged
    );
    let h = PutHeader {
        overwrite: true,
        run_id: "run-1".into(),
        ..header("p", "docs/a")
    };
    assert_eq!(
        outcome(&put_with(&mut s.client, h, b"two").await.unwrap()),
        WriteOutcome::Overwritten
    );
    assert_eq!(get(&mut s.client, "p", "docs/a").await.unwrap(), b"two");

    // The overwrite left a store.overwritten event in the run.
    let events = run_events(&mut s.client, "p", "run-1").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].r#type, "store.overwritten");
    let data: serde_json::Value = serde_json::from_str(&events[0].data_json).unwrap();
    assert_eq!(data["path"], "docs/a");
    assert_eq!(data["sha256"], sha256_hex(b"two"));
}

#[tokio::test]
async fn expected_digest_and_size_are_verified_before_publishing() {
    let mut s = serve().await;
    let body = vec![9u8; (3 << 20) + 5];
    let wrong = PutHeader {
        expected_sha256: sha256_hex(b"other"),
        ..header("p", "docs/x")
    };
    assert_refused(
        put_with(&mut s.client, wrong, &body).await,
        Code::InvalidArgument,
        "digest_mismatch",
    );
    let wrong = PutHeader {
        expected_size: Some(3),
        ..header("p", "docs/small")
    };
    assert_refused(
        put_with(&mut s.client, wrong, b"abcd").await,
        Code::InvalidArgument,
        "digest_mismatch",
    );
    assert!(
        !s.project_dir("p").join("docs/x").exists(),
        "nothing published on mismatch"
    );
    assert!(!s.project_dir("p").join("docs/small").exists());
    assert!(
        temp_files(&s.data_root).is_empty(),
        "temp files removed: {:?}",
        temp_files(&s.data_root)
    );
    let right = PutHeader {
        expected_sha256: sha256_hex(&body).to_uppercase(),
        expected_size: Some(body.len() as u64),
        ..header("p", "docs/x")
    };
    assert_eq!(
        outcome(&put_with(&mut s.client, right, &body).await.unwrap()),
        WriteOutcome::Created
    );
    let bad = PutHeader {
        expected_sha256: "xyz".into(),
        ..header("p", "docs/y")
    };
    assert_eq!(
        put_with(&mut s.client, bad, b"a").await.unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// A Put whose digest comes after its bytes (`digest_at_end`, then a PutEnd), small and
/// streamed: `end` None sends no PutEnd; `extra` sends one more message after it.
async fn put_ending(
    client: &mut Client,
    path: &str,
    body: &[u8],
    end: Option<(String, u64)>,
    extra: Option<put_request::Msg>,
) -> Result<PutResponse, tonic::Status> {
    let mut msgs = vec![PutRequest {
        msg: Some(put_request::Msg::Header(PutHeader {
            digest_at_end: true,
            ..header("p", path)
        })),
    }];
    for c in body.chunks(1 << 20) {
        msgs.push(PutRequest {
            msg: Some(put_request::Msg::Chunk(bytes::Bytes::copy_from_slice(c))),
        });
    }
    if let Some((sha256, size_bytes)) = end {
        msgs.push(PutRequest {
            msg: Some(put_request::Msg::End(PutEnd { sha256, size_bytes })),
        });
    }
    msgs.extend(extra.map(|m| PutRequest { msg: Some(m) }));
    client
        .put(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test]
async fn a_digest_sent_after_the_bytes_is_checked_before_publishing() {
    let mut s = serve().await;
    for (name, body) in [
        ("small", vec![3u8; 1000]),
        ("large", vec![4u8; (3 << 20) + 7]),
    ] {
        let (sha, n) = (sha256_hex(&body), body.len() as u64);
        let path = |what: &str| format!("snaps/{name}-{what}");
        // No PutEnd: a stream cut short, nothing published.
        assert_refused(
            put_ending(&mut s.client, &path("none"), &body, None, None).await,
            Code::InvalidArgument,
            "invalid_argument",
        );
        // A PutEnd that says other bytes, or another size.
        assert_refused(
            put_ending(
                &mut s.client,
                &path("sha"),
                &body,
                Some((sha256_hex(b"x"), n)),
                None,
            )
            .await,
            Code::InvalidArgument,
            "digest_mismatch",
        );
        assert_refused(
            put_ending(
                &mut s.client,
                &path("size"),
                &body,
                Some((String::new(), n + 1)),
                None,
            )
            .await,
            Code::InvalidArgument,
            "digest_mismatch",
        );
        // Anything after the PutEnd.
        let more = put_request::Msg::Chunk(bytes::Bytes::from_static(b"more"));
        assert!(put_ending(
            &mut s.client,
            &path("after"),
            &body,
            Some((sha.clone(), n)),
            Some(more)
        )
        .await
        .is_err());
        for what in ["none", "sha", "size", "after"] {
            assert!(
                !s.project_dir("p").join(path(what)).exists(),
                "{name}: published without a matching PutEnd ({what})"
            );
        }
        // Matching: published, with the size alone or with the sha256 too.
        let put = put_ending(
            &mut s.client,
            &path("ok"),
            &body,
            Some((sha.clone(), n)),
            None,
        )
        .await
        .unwrap();
        assert_eq!(put.digest.unwrap().sha256, sha);
        assert_eq!(get(&mut s.client, "p", &path("ok")).await.unwrap(), body);
        put_ending(
            &mut s.client,
            &path("size-only"),
            &body,
            Some((String::new(), n)),
            None,
        )
        .await
        .unwrap();
    }
    assert!(
        temp_files(&s.data_root).is_empty(),
        "temp files removed: {:?}",
        temp_files(&s.data_root)
    );
    // A PutEnd in a Put that did not announce one.
    let msgs = vec![
        PutRequest {
            msg: Some(put_request::Msg::Header(header("p", "snaps/unannounced"))),
        },
        PutRequest {
            msg: Some(put_request::Msg::End(PutEnd::default())),
        },
    ];
    assert!(s.client.put(tokio_stream::iter(msgs)).await.is_err());
    assert!(!s.project_dir("p").join("snaps/unannounced").exists());
}

#[tokio::test]
async fn size_limit_refuses_large_bodies_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let config = cairn_artifact_store::Config {
        max_file_bytes: 2 << 20,
        ..cairn_artifact_store::Config::new(tmp.path())
    };
    let mut s = serve_with(config).await;
    let body = vec![1u8; (2 << 20) + 1];
    assert_refused(
        put(&mut s.client, "p", "docs/big", &body).await,
        Code::ResourceExhausted,
        "too_large",
    );
    let announced = PutHeader {
        expected_size: Some(3 << 20),
        ..header("p", "docs/big")
    };
    assert_refused(
        put_with(&mut s.client, announced, b"x").await,
        Code::ResourceExhausted,
        "too_large",
    );
    assert!(!s.project_dir("p").join("docs/big").exists());
    assert!(temp_files(tmp.path()).is_empty());
    assert_eq!(
        outcome(
            &put(&mut s.client, "p", "docs/ok", &body[..2 << 20])
                .await
                .unwrap()
        ),
        WriteOutcome::Created
    );
}

#[tokio::test]
async fn delete_removes_files_only_and_records_the_run() {
    let mut s = serve().await;
    put(&mut s.client, "p", "docs/a", b"x").await.unwrap();
    let del = |path: &str| DeleteRequest {
        project_id: "p".into(),
        path: path.into(),
        run_id: "r".into(),
    };
    assert!(
        s.client
            .delete(del("docs/a"))
            .await
            .unwrap()
            .into_inner()
            .deleted
    );
    assert!(
        !s.client
            .delete(del("docs/a"))
            .await
            .unwrap()
            .into_inner()
            .deleted
    );
    assert!(
        !s.client
            .delete(del("nodir/a"))
            .await
            .unwrap()
            .into_inner()
            .deleted
    );
    assert_refused(
        s.client.delete(del("docs")).await,
        Code::FailedPrecondition,
        "not_a_file",
    );
    assert!(s.project_dir("p").join("docs").is_dir());
    let mut events = s
        .client
        .read_events(ReadEventsRequest {
            project_id: "p".into(),
            run_id: "r".into(),
            from_seq: 0,
            follow: false,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let e = events.next().await.unwrap().unwrap();
    assert_eq!((e.seq, e.r#type.as_str()), (1, "store.deleted"));
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn sixty_four_concurrent_writers_to_one_path() {
    let s = serve().await;
    // Over 1 MiB, so the bodies take the streaming path.
    let a = vec![b'a'; (1 << 20) + 4096];
    let b = vec![b'b'; (1 << 20) + 4096];
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut client = s.client.clone();
        let body = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            (body[0], put(&mut client, "p", "docs/race", &body).await)
        }));
    }
    let mut created = Vec::new();
    let mut results = Vec::new();
    for t in tasks {
        let (byte, r) = t.await.unwrap();
        if let Ok(resp) = &r {
            if outcome(resp) == WriteOutcome::Created {
                created.push(byte);
            }
        }
        results.push((byte, r));
    }
    assert_eq!(created.len(), 1, "exactly one writer publishes");
    let winner = created[0];
    for (byte, r) in results {
        match r {
            Ok(resp) => {
                assert_eq!(byte, winner, "only the winner's bytes succeed");
                assert!(matches!(
                    outcome(&resp),
                    WriteOutcome::Created | WriteOutcome::Unchanged
                ));
            }
            Err(status) => {
                assert_ne!(byte, winner);
                assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
                assert_eq!(cairn_proto::reason::of(&status).as_deref(), Some("exists"));
            }
        }
    }
    let stored = std::fs::read(s.project_dir("p").join("docs/race")).unwrap();
    assert_eq!(stored, if winner == b'a' { a } else { b }, "never torn");
    assert!(temp_files(&s.data_root).is_empty());
}

#[tokio::test]
async fn health_reports_the_store_serving() {
    let s = serve().await;
    let channel = tonic::transport::Endpoint::from_shared(s.addr.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "cairn.v1.ArtifactStore".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reply.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn large_bodies_land_byte_exact_with_and_without_direct_io() {
    // Over 1 MiB a body streams through the writer: O_DIRECT from aligned buffers by default,
    // the page cache with direct_io = false. Sizes straddle the 4 MiB buffers and 4 KiB blocks.
    for direct_io in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = serve_with(cairn_artifact_store::Config {
            direct_io,
            ..cairn_artifact_store::Config::new(tmp.path())
        })
        .await;
        create_project(&mut s.client, "p").await;
        for (i, size) in [(1 << 20) + 1, 4 << 20, (9 << 20) + 4095]
            .into_iter()
            .enumerate()
        {
            let mut body = vec![0u8; size];
            Bytegen::new(size as u64).fill(&mut body);
            let path = format!("workspace/big-{i}.bin");
            let r = put(&mut s.client, "p", &path, &body).await.unwrap();
            assert_eq!(outcome(&r), WriteOutcome::Created, "direct_io {direct_io}");
            let digest = r.digest.clone().unwrap();
            assert_eq!(digest.sha256, sha256_hex(&body));
            assert_eq!(digest.size_bytes, size as u64);
            assert!(get(&mut s.client, "p", &path).await.unwrap() == body);
            let on_disk = std::fs::read(s.project_dir("p").join(&path)).unwrap();
            assert!(on_disk == body, "direct_io {direct_io}, size {size}");
            // The same bytes again are UNCHANGED, as for any Put.
            let again = put(&mut s.client, "p", &path, &body).await.unwrap();
            assert_eq!(outcome(&again), WriteOutcome::Unchanged);
        }
        assert!(temp_files(tmp.path()).is_empty());
    }
}

/// Durable before named: a deferred Put's reply carries a publication token of this boot of
/// the store and of its run; AppendEvents refuses (`publication_unproven`, nothing appended)
/// a token of an earlier boot, of another run, or not of this store. Written again, the file
/// gets a new token that is accepted.
#[tokio::test]
async fn events_are_refused_for_publications_the_store_cannot_prove_durable() {
    let tmp = tempfile::tempdir().unwrap();
    let config = || cairn_artifact_store::Config::new(tmp.path().join("data"));
    let mut s = serve_with(config()).await;
    let deferred = |path: &str| PutHeader {
        run_id: "r1".into(),
        durability: PutDurability::WithRunEvents as i32,
        ..header("p", path)
    };
    let append = |run: &str, tokens: Vec<String>| AppendEventsRequest {
        project_id: "p".into(),
        run_id: run.into(),
        epoch: 0,
        publication_tokens: tokens,
        events: vec![EventInput {
            r#type: "artifact.written".into(),
            data_json: r#"{"path":"docs/a.md"}"#.into(),
            ..Default::default()
        }],
        claim: String::new(),
    };
    let a = put_with(&mut s.client, deferred("docs/a.md"), b"a")
        .await
        .unwrap();
    assert!(!a.publication_token.is_empty());
    // A synced Put is durable at its reply: nothing to present.
    let synced = put(&mut s.client, "p", "docs/s.md", b"s").await.unwrap();
    assert!(synced.publication_token.is_empty());
    let ok = s
        .client
        .append_events(append("r1", vec![a.publication_token.clone()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.first_seq, 1);

    let b = put_with(&mut s.client, deferred("docs/b.md"), b"b")
        .await
        .unwrap();
    // Another run's events do not wait for this publication: its token proves nothing there.
    let other_run = s
        .client
        .append_events(append("r2", vec![b.publication_token.clone()]))
        .await;
    assert_refused(other_run, Code::FailedPrecondition, "publication_unproven");
    let forged = s
        .client
        .append_events(append("r1", vec!["p1.0.0.0".into()]))
        .await;
    assert_refused(forged, Code::FailedPrecondition, "publication_unproven");

    // The store restarts before the events naming b.md come: their token is of the old boot.
    // (A read waits for the publication, so the bytes have landed before the stop.)
    assert_eq!(get(&mut s.client, "p", "docs/b.md").await.unwrap(), b"b");
    s.stop().await;
    let mut s = serve_with(config()).await;
    let stale = s
        .client
        .append_events(append("r1", vec![b.publication_token.clone()]))
        .await;
    let status = assert_refused(stale, Code::FailedPrecondition, "publication_unproven");
    assert!(
        status.message().contains("restarted") && status.message().contains("again"),
        "{status:?}"
    );
    assert_eq!(run_events(&mut s.client, "p", "r1").await.len(), 1);
    let r2 = s
        .client
        .read_events(ReadEventsRequest {
            project_id: "p".into(),
            run_id: "r2".into(),
            from_seq: 1,
            ..Default::default()
        })
        .await;
    assert_eq!(r2.unwrap_err().code(), Code::NotFound, "nothing reached r2");
    // Written again (the bytes had landed: unchanged), with a token this boot accepts.
    let again = put_with(&mut s.client, deferred("docs/b.md"), b"b")
        .await
        .unwrap();
    assert_eq!(outcome(&again), WriteOutcome::Unchanged);
    assert!(!again.publication_token.is_empty());
    assert_ne!(again.publication_token, b.publication_token);
    let ok = s
        .client
        .append_events(append("r1", vec![again.publication_token]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.first_seq, 2);
}
