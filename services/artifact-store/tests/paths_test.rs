//! Path safety through the gRPC API: every pathguard reason, symlinks planted or swapped in
//! while writes run, hard links at the target, denylisted names in any case, reserved files.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_artifact_store::Config;
use cairn_proto::v1::{DeleteRequest, PutHeader, StatRequest, UpdateJsonRequest, WriteOutcome};
use common::*;
use tonic::Code;

const INVALID: Code = Code::InvalidArgument;
const DENIED: Code = Code::PermissionDenied;

#[tokio::test]
async fn every_syntax_reason_is_refused_with_its_word() {
    let mut s = serve().await;
    create_project(&mut s.client, "p").await;
    let long_component = format!("docs/{}", "a".repeat(256));
    let long_path = format!("docs/{}x", "abcdefgh/".repeat(120));
    let cases: &[(&str, &str)] = &[
        ("docs/a\u{0}b", "invalid_char"),
        ("docs/a\u{7}b", "invalid_char"),
        ("docs/a<b", "invalid_char"),
        ("docs/a?b", "invalid_char"),
        ("docs/a\u{200b}b", "invalid_char"),
        ("/etc/passwd", "absolute_path"),
        ("C:/x", "drive_letter"),
        ("docs\\a", "backslash"),
        ("docs/../../x", "traversal"),
        ("..", "traversal"),
        ("docs/", "directory_path"),
        ("docs//a", "empty_component"),
        ("", "empty_component"),
        ("docs/./a", "dot_component"),
        (&long_component, "path_too_long"),
        (&long_path, "path_too_long"),
        ("docs/e\u{301}", "not_normalized"),
        ("docs/CON.txt", "reserved_name"),
        ("docs/lpt1", "reserved_name"),
        ("docs/a.", "reserved_name"),
        ("docs/a ", "reserved_name"),
    ];
    for (path, reason) in cases {
        let status = assert_refused(put(&mut s.client, "p", path, b"x").await, INVALID, reason);
        assert!(!status.message().is_empty());
        // Reads refuse the same paths the same way.
        assert_refused(get(&mut s.client, "p", path).await, INVALID, reason);
    }
    // Nothing at all was written into the project besides its layout.
    let files: Vec<_> = walkdir::WalkDir::new(s.project_dir("p"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.path().to_path_buf())
        .collect();
    assert_eq!(files.len(), 1, "only .cairn/project.json: {files:?}");
    // `%2e%2e` is a literal name, not a traversal.
    assert_eq!(
        outcome(&put(&mut s.client, "p", "docs/%2e%2e", b"x").await.unwrap()),
        WriteOutcome::Created
    );
}

#[tokio::test]
async fn denylisted_names_are_refused_in_any_case_and_8_3_form() {
    let tmp = tempfile::tempdir().unwrap();
    let config = Config {
        denylist: vec!["secrets".into()],
        ..Config::new(tmp.path())
    };
    let mut s = serve_with(config).await;
    for path in [
        ".git/config",
        ".GIT/HEAD",
        "docs/.Ssh/id_rsa",
        "workspace/.ENV",
        "a/.DoCkEr/config.json",
        "SSH~1/x",
        "docs/.aws",
        "docs/SECRETS/a",
        "workspace/Secrets",
    ] {
        let status = assert_refused(put(&mut s.client, "p", path, b"x").await, DENIED, "denied");
        assert!(
            status.message().contains("denylist") || status.message().contains("8.3"),
            "{status:?}"
        );
        assert_refused(get(&mut s.client, "p", path).await, DENIED, "denied");
        let stat = StatRequest {
            project_id: "p".into(),
            path: path.into(),
            include_sha256: false,
        };
        assert_refused(s.client.stat(stat).await, DENIED, "denied");
        let del = DeleteRequest {
            project_id: "p".into(),
            path: path.into(),
            run_id: String::new(),
        };
        assert_refused(s.client.delete(del).await, DENIED, "denied");
    }
    assert!(!s.project_dir("p").join(".git").exists());
    // `.cairn` is not denylisted: run records are ordinary writes ...
    assert!(put(
        &mut s.client,
        "p",
        ".cairn/runs/r1/sandbox/result.json",
        b"{}"
    )
    .await
    .is_ok());
    // ... but the store's own files are reserved.
    for path in [
        ".cairn/runs/r1/events.jsonl",
        ".cairn/project.json",
        "docs/.cairn-tmp-123",
        ".cairn/runs/r1/EVENTS.JSONL",
    ] {
        assert_refused(put(&mut s.client, "p", path, b"x").await, DENIED, "denied");
    }
    let update = UpdateJsonRequest {
        project_id: "p".into(),
        path: ".git/state.json".into(),
        patch_json: "{}".into(),
        ..Default::default()
    };
    assert_refused(s.client.update_json(update).await, DENIED, "denied");
}

#[tokio::test]
async fn allowed_prefixes_confine_writes_and_requests_only_narrow() {
    let tmp = tempfile::tempdir().unwrap();
    let config = Config {
        allowed_prefixes: vec!["docs/".into(), ".cairn/runs".into()],
        ..Config::new(tmp.path())
    };
    let mut s = serve_with(config).await;
    assert!(put(&mut s.client, "p", "docs/a.md", b"x").await.is_ok());
    assert!(put(&mut s.client, "p", ".cairn/runs/r/x.json", b"x")
        .await
        .is_ok());
    let status = assert_refused(
        put(&mut s.client, "p", "workspace/a.py", b"x").await,
        DENIED,
        "prefix_not_allowed",
    );
    assert!(
        status.message().contains("docs"),
        "names the allowed prefixes: {status:?}"
    );
    assert_refused(
        put(&mut s.client, "p", "docsx/a", b"x").await,
        DENIED,
        "prefix_not_allowed",
    );
    // A request narrows ...
    let narrowed = PutHeader {
        allowed_prefixes: vec!["docs/artifacts/r1/".into()],
        ..header("p", "docs/artifacts/r1/out.csv")
    };
    assert!(put_with(&mut s.client, narrowed.clone(), b"x")
        .await
        .is_ok());
    let outside = PutHeader {
        path: "docs/other.md".into(),
        ..narrowed
    };
    assert_refused(
        put_with(&mut s.client, outside, b"x").await,
        DENIED,
        "prefix_not_allowed",
    );
    // ... and can never widen.
    let widen = PutHeader {
        allowed_prefixes: vec!["workspace".into()],
        ..header("p", "workspace/a")
    };
    assert_refused(
        put_with(&mut s.client, widen, b"x").await,
        DENIED,
        "prefix_not_allowed",
    );
    let bad_prefix = PutHeader {
        allowed_prefixes: vec!["../x".into()],
        ..header("p", "docs/a2")
    };
    assert_refused(
        put_with(&mut s.client, bad_prefix, b"x").await,
        INVALID,
        "traversal",
    );
    assert!(!s.project_dir("p").join("workspace/a.py").exists());
    // Reads are not confined to the write prefixes.
    std::fs::write(s.project_dir("p").join("workspace/seed.txt"), b"seed").unwrap();
    assert_eq!(
        get(&mut s.client, "p", "workspace/seed.txt").await.unwrap(),
        b"seed"
    );
}

#[tokio::test]
async fn a_planted_symlink_is_never_written_through() {
    let mut s = serve().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), b"original").unwrap();
    put(&mut s.client, "p", "workspace/keep", b"x")
        .await
        .unwrap();
    let ws = s.project_dir("p").join("workspace");
    symlink(outside.path(), ws.join("out")).unwrap();
    symlink(outside.path().join("victim"), ws.join("victim")).unwrap();

    // Through a symlinked directory (new file and existing file, both overwrite modes).
    for overwrite in [false, true] {
        for path in [
            "workspace/out/new",
            "workspace/out/victim",
            "workspace/out/sub/deeper",
        ] {
            let h = PutHeader {
                overwrite,
                ..header("p", path)
            };
            assert_refused(
                put_with(&mut s.client, h, b"evil").await,
                DENIED,
                "symlink_in_path",
            );
        }
        // A symlink at the target itself.
        let h = PutHeader {
            overwrite,
            ..header("p", "workspace/victim")
        };
        assert_refused(
            put_with(&mut s.client, h, b"evil").await,
            DENIED,
            "symlink_in_path",
        );
    }
    // Large bodies take the streaming path; same refusal.
    let big = vec![0u8; 3 << 20];
    assert_refused(
        put(&mut s.client, "p", "workspace/out/big", &big).await,
        DENIED,
        "symlink_in_path",
    );
    // Reads and deletes do not follow it either.
    assert_refused(
        get(&mut s.client, "p", "workspace/out/victim").await,
        DENIED,
        "symlink_in_path",
    );
    assert_refused(
        get(&mut s.client, "p", "workspace/victim").await,
        DENIED,
        "symlink_in_path",
    );
    let del = DeleteRequest {
        project_id: "p".into(),
        path: "workspace/out/victim".into(),
        run_id: String::new(),
    };
    assert_refused(s.client.delete(del).await, DENIED, "symlink_in_path");
    let update = UpdateJsonRequest {
        project_id: "p".into(),
        path: "workspace/out/s.json".into(),
        patch_json: "{}".into(),
        ..Default::default()
    };
    assert_refused(
        s.client.update_json(update).await,
        DENIED,
        "symlink_in_path",
    );

    assert_eq!(
        std::fs::read(outside.path().join("victim")).unwrap(),
        b"original"
    );
    let names: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("victim")],
        "nothing new outside"
    );
    assert!(temp_files(&s.data_root).is_empty());
    assert!(temp_files(outside.path()).is_empty());

    // A symlinked project directory is refused as well.
    symlink(outside.path(), s.data_root.join("projects/linked")).unwrap();
    assert_refused(
        put_with(
            &mut s.client,
            PutHeader {
                create_project: false,
                ..header("linked", "x")
            },
            b"x",
        )
        .await,
        DENIED,
        "symlink_in_path",
    );
}

#[tokio::test]
async fn not_a_file_when_a_directory_or_file_is_in_the_way() {
    let mut s = serve().await;
    put(&mut s.client, "p", "workspace/file", b"x")
        .await
        .unwrap();
    put(&mut s.client, "p", "workspace/dir/a", b"x")
        .await
        .unwrap();
    let st = assert_refused(
        put(&mut s.client, "p", "workspace/dir", b"x").await,
        Code::FailedPrecondition,
        "not_a_file",
    );
    assert!(st.message().contains("directory"), "{st:?}");
    assert_refused(
        put_overwrite(&mut s.client, "p", "workspace/dir", b"x").await,
        Code::FailedPrecondition,
        "not_a_file",
    );
    assert_refused(
        put(&mut s.client, "p", "workspace/file/sub", b"x").await,
        Code::FailedPrecondition,
        "not_a_file",
    );
    assert_refused(
        get(&mut s.client, "p", "workspace/dir").await,
        Code::FailedPrecondition,
        "not_a_file",
    );
    assert!(s.project_dir("p").join("workspace/dir/a").is_file());
}

#[tokio::test]
async fn a_hard_link_at_the_target_is_replaced_not_written_into() {
    let mut s = serve().await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, b"SECRET").unwrap();
    put(&mut s.client, "p", "workspace/keep", b"x")
        .await
        .unwrap();
    let target = s.project_dir("p").join("workspace/h");
    std::fs::hard_link(&secret, &target).unwrap();

    assert_refused(
        put(&mut s.client, "p", "workspace/h", b"new").await,
        Code::AlreadyExists,
        "exists",
    );
    assert_eq!(
        outcome(
            &put(&mut s.client, "p", "workspace/h", b"SECRET")
                .await
                .unwrap()
        ),
        WriteOutcome::Unchanged
    );
    let r = put_overwrite(&mut s.client, "p", "workspace/h", b"new bytes")
        .await
        .unwrap();
    assert_eq!(outcome(&r), WriteOutcome::Overwritten);
    assert_eq!(
        std::fs::read(&secret).unwrap(),
        b"SECRET",
        "the outside file is untouched"
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"new bytes");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&secret).unwrap().nlink(),
        1,
        "the link was replaced, not written through"
    );
    // Streaming path too.
    std::fs::remove_file(&target).unwrap();
    std::fs::hard_link(&secret, &target).unwrap();
    let big = vec![7u8; 3 << 20];
    assert_eq!(
        outcome(
            &put_overwrite(&mut s.client, "p", "workspace/h", &big)
                .await
                .unwrap()
        ),
        WriteOutcome::Overwritten
    );
    assert_eq!(std::fs::read(&secret).unwrap(), b"SECRET");
}

/// Flips `workspace/d` between the real directory and a symlink to an outside directory
/// (atomically, with RENAME_EXCHANGE) while Puts to `workspace/d/f<i>` run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_symlink_mid_write_never_leaks_outside() {
    let s = serve().await;
    let mut client = s.client.clone();
    let outside = tempfile::tempdir().unwrap();
    put(&mut client, "p", "workspace/d/seed", b"x")
        .await
        .unwrap();
    let ws = s.project_dir("p").join("workspace");
    symlink(outside.path(), ws.join("spare")).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flips = {
        let (stop, ws) = (stop.clone(), ws.clone());
        std::thread::spawn(move || {
            let mut flips = 0u64;
            while !stop.load(Ordering::Relaxed) {
                exchange(&ws, "d", "spare");
                flips += 1;
                std::thread::yield_now();
            }
            flips
        })
    };
    let (mut ok, mut refused) = (Vec::new(), 0);
    for i in 0..200 {
        // Alternate small (one-step) and streamed bodies.
        let body = if i % 4 == 3 {
            vec![b'z'; (1 << 20) + 10]
        } else {
            format!("file {i}").into_bytes()
        };
        match put_overwrite(&mut client, "p", &format!("workspace/d/f{i}"), &body).await {
            Ok(_) => ok.push(i),
            Err(status) => {
                let reason = cairn_proto::reason::of(&status);
                assert!(
                    matches!(reason.as_deref(), Some("symlink_in_path"))
                        || status.code() == Code::NotFound,
                    "unexpected refusal {status:?}"
                );
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flips.join().unwrap();
    // Put things back where they were, whichever way the last flip left them.
    if std::fs::symlink_metadata(ws.join("d"))
        .unwrap()
        .file_type()
        .is_symlink()
    {
        exchange(&ws, "d", "spare");
    }
    let leaked: Vec<_> = std::fs::read_dir(outside.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        leaked.is_empty(),
        "files landed outside the project: {leaked:?}"
    );
    for i in &ok {
        assert!(
            ws.join("d").join(format!("f{i}")).is_file(),
            "f{i} was acknowledged but is missing"
        );
    }
    assert!(temp_files(&s.data_root).is_empty());
    assert!(flips > 10, "the flipper ran ({flips} flips)");
    eprintln!(
        "race: {} writes published, {refused} refused, {flips} flips",
        ok.len()
    );
}

fn exchange(dir: &Path, a: &str, b: &str) {
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        dir.join(a),
        rustix::fs::CWD,
        dir.join(b),
        rustix::fs::RenameFlags::EXCHANGE,
    )
    .unwrap();
}
