//! Sessions over gRPC on every backend: git source from a local bare repository,
//! exec, confined workspace tools, pack with excludes, close.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use cairn_proto as pb;
use common::*;
use sha2::Digest;

/// A bare repository with a `feature` branch whose tree holds the files below.
fn bare_repo(dir: &Path) -> (String, BTreeMap<String, Vec<u8>>) {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let git = |args: &[&str], cwd: &Path| {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    git(&["init", "-q"], &src);
    std::fs::write(src.join("README.md"), "main branch\n").unwrap();
    git(&["add", "-A"], &src);
    git(&["commit", "-qm", "one"], &src);
    git(&["checkout", "-qb", "feature"], &src);
    let files: BTreeMap<String, Vec<u8>> = [
        ("README.md", b"# Demo\nHello World\n".to_vec()),
        ("src/main.py", b"print('hello')\n# TODO: more\n".to_vec()),
        (
            "src/util.py",
            b"def helper():\n    return 42  # todo lower\n".to_vec(),
        ),
        ("data/blob.bin", (0..=255u8).collect()),
        (
            "node_modules/dep/index.js",
            b"module.exports = 1\n".to_vec(),
        ),
        (
            "src/__pycache__/main.cpython-311.pyc",
            b"\x00\x01pyc".to_vec(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (path, content) in &files {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    git(&["add", "-A", "-f"], &src);
    git(&["commit", "-qm", "two"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], dir);
    (dir.join("repo.git").to_string_lossy().into_owned(), files)
}

async fn exec(
    r: &TestRunner,
    sid: &str,
    command: &str,
    workdir: &str,
    timeout_ms: u64,
) -> pb::ExecResult {
    r.client
        .clone()
        .exec(pb::ExecRequest {
            session_id: sid.into(),
            command: command.into(),
            timeout_ms,
            workdir: workdir.into(),
            max_output_bytes: 0,
            detach: false,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn pack(
    r: &TestRunner,
    sid: &str,
    format: pb::ArchiveFormat,
    excludes: &[&str],
) -> (Vec<u8>, pb::PackSummary) {
    pack_at(r, sid, format, excludes, "").await.unwrap()
}

/// `pack` with every entry at `entry_mtime` (empty: the files' own times).
async fn pack_at(
    r: &TestRunner,
    sid: &str,
    format: pb::ArchiveFormat,
    excludes: &[&str],
    entry_mtime: &str,
) -> Result<(Vec<u8>, pb::PackSummary), tonic::Status> {
    let mut stream = r
        .client
        .clone()
        .pack(pb::PackRequest {
            session_id: sid.into(),
            format: format as i32,
            exclude_patterns: excludes.iter().map(|s| s.to_string()).collect(),
            archive_name: String::new(),
            max_archive_bytes: 0,
            entry_mtime: entry_mtime.into(),
        })
        .await?
        .into_inner();
    let mut bytes = Vec::new();
    let mut summary = None;
    while let Some(msg) = stream.message().await? {
        match msg.msg.unwrap() {
            pb::pack_response::Msg::Chunk(c) => bytes.extend_from_slice(&c),
            pb::pack_response::Msg::Summary(s) => summary = Some(s),
        }
    }
    Ok((bytes, summary.unwrap()))
}

fn unzip(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = BTreeMap::new();
    for i in 0..z.len() {
        let mut f = z.by_index(i).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        out.insert(f.name().unwrap().to_string(), v);
    }
    out
}

fn untar_gz(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut out = BTreeMap::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut v = Vec::new();
        e.read_to_end(&mut v).unwrap();
        out.insert(name, v);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_from_git_exec_tools_pack_close() {
    for backend in cold_backends("session").await {
        let repos = tempfile::tempdir().unwrap();
        let (url, files) = bare_repo(repos.path());
        let r = TestRunner::start(backend).await;
        let mut c = r.client.clone();
        let sid = format!("sess-{}", uuid::Uuid::new_v4().simple());
        let info = c
            .open_session(pb::OpenSessionRequest {
                session_id: sid.clone(),
                git: Some(pb::GitSource {
                    url: url.clone(),
                    r#ref: "feature".into(),
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.git_commit.len(), 40, "{info:?}");
        assert_eq!(info.container_name, format!("cairn_{sid}_runner"));
        let dup = c
            .open_session(pb::OpenSessionRequest {
                session_id: sid.clone(),
                ..Default::default()
            })
            .await;
        assert_eq!(dup.unwrap_err().code(), tonic::Code::AlreadyExists);

        // exec: bash -lc in /workspace, exit codes, workdir, timeout
        let out = exec(&r, &sid, "pwd; cat README.md; id -u; exit 4", "", 0).await;
        assert_eq!(
            text(&out.stdout),
            "/workspace\n# Demo\nHello World\n10001\n",
            "{backend:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(out.exit_code, 4);
        let out = exec(&r, &sid, "pwd && python3 main.py", "src", 0).await;
        assert_eq!(text(&out.stdout), "/workspace/src\nhello\n");
        let out = exec(&r, &sid, "echo started; sleep 60", "", 1000).await;
        assert!(out.timed_out && out.exit_code == -1, "{out:?}");
        assert_eq!(text(&out.stdout), "started\n");
        let out = exec(&r, &sid, "echo still here", "", 0).await;
        assert_eq!(
            text(&out.stdout),
            "still here\n",
            "session survives a timed-out command"
        );
        let err = c
            .exec(pb::ExecRequest {
                session_id: sid.clone(),
                command: "true".into(),
                workdir: "../..".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);

        // write / read (overwrite, append), and the code can change what we wrote
        let w = c
            .write_file(pb::WriteFileRequest {
                session_id: sid.clone(),
                path: "notes/a.txt".into(),
                content: b"one\n".to_vec().into(),
                mode: pb::WriteMode::Overwrite as i32,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((w.bytes_written, w.size_bytes), (4, 4));
        let w = c
            .write_file(pb::WriteFileRequest {
                session_id: sid.clone(),
                path: "notes/a.txt".into(),
                content: b"two\n".to_vec().into(),
                mode: pb::WriteMode::Append as i32,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(w.size_bytes, 8);
        let out = exec(
            &r,
            &sid,
            "echo three >> notes/a.txt && cat notes/a.txt",
            "",
            0,
        )
        .await;
        assert_eq!(
            text(&out.stdout),
            "one\ntwo\nthree\n",
            "{}",
            text(&out.stderr)
        );
        let rd = c
            .read_file(pb::ReadFileRequest {
                session_id: sid.clone(),
                path: "notes/a.txt".into(),
                max_bytes: 5,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (&rd.content[..], rd.truncated, rd.size_bytes),
            (&b"one\nt"[..], true, 14)
        );

        // symlinks planted by the code lead nowhere
        let out = exec(
            &r,
            &sid,
            "ln -s /etc/passwd leak && ln -s / rootlink && ln -s .. up",
            "",
            0,
        )
        .await;
        assert_eq!(out.exit_code, 0);
        for path in ["leak", "rootlink/etc/passwd", "up/x"] {
            let err = c
                .read_file(pb::ReadFileRequest {
                    session_id: sid.clone(),
                    path: path.into(),
                    max_bytes: 0,
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{path}: {err:?}");
            assert_eq!(
                cairn_proto::reason::of(&err).as_deref(),
                Some("symlink_in_path")
            );
        }
        for path in ["rootlink/tmp/evil", "leak"] {
            let err = c
                .write_file(pb::WriteFileRequest {
                    session_id: sid.clone(),
                    path: path.into(),
                    content: b"x".to_vec().into(),
                    mode: pb::WriteMode::Append as i32,
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{path}: {err:?}");
        }
        assert!(!std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("evil"));
        let err = c
            .read_file(pb::ReadFileRequest {
                session_id: sid.clone(),
                path: "../../etc/passwd".into(),
                max_bytes: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(cairn_proto::reason::of(&err).as_deref(), Some("traversal"));

        // glob
        let g = c
            .glob(pb::GlobRequest {
                session_id: sid.clone(),
                pattern: "**/*.py".into(),
                base_path: String::new(),
                max_results: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(g.paths, ["src/main.py", "src/util.py"]);
        let g = c
            .glob(pb::GlobRequest {
                session_id: sid.clone(),
                pattern: "*".into(),
                base_path: "src".into(),
                max_results: 1,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((g.paths.len(), g.truncated), (1, true));
        let err = c
            .glob(pb::GlobRequest {
                session_id: sid.clone(),
                pattern: "*".into(),
                base_path: "rootlink/etc".into(),
                max_results: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);

        // grep: literal, case, regex, cap; never through links
        let grep =
            |pattern: &str, is_regex: bool, case_sensitive: bool, max: u32| pb::GrepRequest {
                session_id: sid.clone(),
                pattern: pattern.into(),
                path: String::new(),
                is_regex,
                case_sensitive,
                max_matches: max,
            };
        let m = c
            .grep(grep("TODO", false, true, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            m.matches
                .iter()
                .map(|m| (m.path.as_str(), m.line))
                .collect::<Vec<_>>(),
            [("src/main.py", 2)]
        );
        let m = c
            .grep(grep("todo", false, false, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(m.matches.len(), 2);
        let m = c
            .grep(grep(r"return \d+", true, true, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(m.matches[0].text, "    return 42  # todo lower");
        let m = c
            .grep(grep("o", false, true, 2))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((m.matches.len(), m.truncated), (2, true));
        let m = c
            .grep(grep("root:", false, true, 0))
            .await
            .unwrap()
            .into_inner();
        assert!(
            m.matches.is_empty(),
            "grep read through a link: {:?}",
            m.matches
        );

        // pack: zip and tar.gz with the default excludes
        let excludes = [".git/**", "node_modules/**", "**/__pycache__/**"];
        let mut expected: BTreeMap<String, Vec<u8>> = files
            .iter()
            .filter(|(k, _)| !k.starts_with("node_modules/") && !k.contains("__pycache__"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        expected.insert("notes/a.txt".into(), b"one\ntwo\nthree\n".to_vec());
        for format in [pb::ArchiveFormat::Zip, pb::ArchiveFormat::TarGz] {
            let (bytes, summary) = pack(&r, &sid, format, &excludes).await;
            let got = if format == pb::ArchiveFormat::Zip {
                unzip(&bytes)
            } else {
                untar_gz(&bytes)
            };
            assert_eq!(got, expected, "{backend:?} {format:?}");
            let digest = summary.digest.clone().unwrap();
            assert_eq!(digest.sha256, hex::encode(sha2::Sha256::digest(&bytes)));
            assert_eq!(digest.size_bytes, bytes.len() as u64);
            assert_eq!(summary.entries as usize, expected.len());
            assert!(summary.excluded >= 2, "{summary:?}");
            let mut refused: Vec<_> = summary
                .refused
                .iter()
                .map(|r| (r.path.as_str(), r.reason.as_str()))
                .collect();
            refused.sort();
            assert_eq!(
                refused,
                [
                    ("leak", "symlink"),
                    ("rootlink", "symlink"),
                    ("up", "symlink")
                ]
            );
            assert!(summary.archive_name.starts_with(&format!("{sid}.")));
        }
        let too_small = c
            .pack(pb::PackRequest {
                session_id: sid.clone(),
                max_archive_bytes: 100,
                ..Default::default()
            })
            .await;
        let err = match too_small {
            Err(e) => e,
            Ok(s) => s.into_inner().message().await.unwrap_err(),
        };
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);

        // close removes everything
        let task_dir = r.work_root.path().join("tasks").join(&sid);
        assert!(task_dir.exists());
        let closed = c
            .close_session(pb::CloseSessionRequest {
                session_id: sid.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(closed.closed);
        assert!(!task_dir.exists(), "task dir left");
        if backend.docker() {
            assert!(
                containers_named(&format!("cairn_{sid}_runner"))
                    .await
                    .is_empty(),
                "container left"
            );
        }
        let again = c
            .close_session(pb::CloseSessionRequest {
                session_id: sid.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!again.closed);
        let err = c
            .exec(pb::ExecRequest {
                session_id: sid.clone(),
                command: "true".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        r.stop().await;
    }
}

/// The files of `same_files_pack_to_the_same_bytes`, written into session `sid` in `order`
/// (one directory listing order or another), `stamp` then set as every file's mtime.
async fn write_tree(r: &TestRunner, sid: &str, order: &[usize], stamp: &str) {
    const FILES: [(&str, &str); 4] = [
        ("README.md", "# Tool\n"),
        ("src/main.sh", "#!/bin/sh\necho hi\n"),
        ("src/a.txt", "a\n"),
        ("src.txt", "beside the directory\n"),
    ];
    for &i in order {
        let (path, content) = FILES[i];
        r.client
            .clone()
            .write_file(pb::WriteFileRequest {
                session_id: sid.into(),
                path: path.into(),
                content: content.as_bytes().to_vec().into(),
                mode: pb::WriteMode::Overwrite as i32,
            })
            .await
            .unwrap();
    }
    let out = exec(
        r,
        sid,
        &format!(
            "chmod +x src/main.sh && touch -d '{stamp}' README.md src/main.sh src/a.txt src.txt"
        ),
        "",
        0,
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", text(&out.stderr));
}

/// With one entry time, the same files pack to the same bytes in both formats, whatever their
/// own mtimes and the order they were written in; without it the tar entries keep the files'
/// mtimes, so the bytes differ. Entries are in byte order of their paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_files_pack_to_the_same_bytes() {
    const FIXED: &str = "1980-01-01T00:00:00Z";
    for backend in cold_backends("pack_reproducible").await {
        let r = TestRunner::start(backend).await;
        let mut c = r.client.clone();
        let mut packs = Vec::new();
        for (order, stamp) in [
            ([0, 1, 2, 3], "2001-02-03 04:05:06"),
            ([3, 2, 1, 0], "2019-08-07 06:05:04"),
        ] {
            let sid = c
                .open_session(pb::OpenSessionRequest::default())
                .await
                .unwrap()
                .into_inner()
                .session_id;
            write_tree(&r, &sid, &order, stamp).await;
            let mut one = Vec::new();
            for format in [pb::ArchiveFormat::Zip, pb::ArchiveFormat::TarGz] {
                let fixed = pack_at(&r, &sid, format, &[], FIXED).await.unwrap().0;
                let own = pack_at(&r, &sid, format, &[], "").await.unwrap().0;
                one.push((fixed, own));
            }
            let bad = pack_at(
                &r,
                &sid,
                pb::ArchiveFormat::Zip,
                &[],
                "1970-01-01T00:00:00Z",
            )
            .await
            .unwrap_err();
            assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(bad.message().contains("entry_mtime"), "{bad:?}");
            c.close_session(pb::CloseSessionRequest { session_id: sid })
                .await
                .unwrap();
            packs.push(one);
        }
        let [zip_fixed, tar_fixed] = [0, 1].map(|f| (&packs[0][f].0, &packs[1][f].0));
        assert!(zip_fixed.0 == zip_fixed.1, "{backend:?}: the zips differ");
        assert!(
            tar_fixed.0 == tar_fixed.1,
            "{backend:?}: the tar.gz archives differ"
        );
        assert!(
            packs[0][1].1 != packs[1][1].1,
            "{backend:?}: tar entries without entry_mtime keep the files' times"
        );

        // Byte order of paths (`src.txt` before `src/...`), the fixed time, the modes.
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip_fixed.0.clone())).unwrap();
        let mut names = Vec::new();
        for i in 0..z.len() {
            let f = z.by_index(i).unwrap();
            let t = f.last_modified().unwrap();
            assert_eq!(
                (
                    t.year(),
                    t.month(),
                    t.day(),
                    t.hour(),
                    t.minute(),
                    t.second()
                ),
                (1980, 1, 1, 0, 0, 0)
            );
            names.push((
                f.name().unwrap().to_string(),
                f.unix_mode().unwrap() & 0o777,
            ));
        }
        assert_eq!(
            names,
            [
                ("README.md".to_string(), 0o644),
                ("src.txt".into(), 0o644),
                ("src/a.txt".into(), 0o644),
                ("src/main.sh".into(), 0o755)
            ]
        );
        let gz = flate2::read::GzDecoder::new(&tar_fixed.0[..]);
        assert_eq!(gz.header().unwrap().mtime(), 0);
        let mut a = tar::Archive::new(gz);
        let mut entries = Vec::new();
        for e in a.entries().unwrap() {
            let e = e.unwrap();
            entries.push((
                e.path().unwrap().to_string_lossy().into_owned(),
                e.header().mtime().unwrap(),
            ));
        }
        assert_eq!(
            entries,
            [
                ("README.md".to_string(), 315_532_800),
                ("src.txt".into(), 315_532_800),
                ("src/a.txt".into(), 315_532_800),
                ("src/main.sh".into(), 315_532_800)
            ]
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn empty_session_and_shutdown_cleanup() {
    for backend in cold_backends("session_shutdown").await {
        let r = TestRunner::start(backend).await;
        let mut c = r.client.clone();
        let info = c
            .open_session(pb::OpenSessionRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(info.git_commit.is_empty());
        let out = exec(&r, &info.session_id, "ls -A | wc -l; touch made", "", 0).await;
        assert_eq!(text(&out.stdout), "0\n");
        let bad = c
            .open_session(pb::OpenSessionRequest {
                session_id: "bad-git".into(),
                git: Some(pb::GitSource {
                    url: "/nonexistent/repo.git".into(),
                    r#ref: String::new(),
                }),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(
            !r.work_root.path().join("tasks").join("bad-git").exists(),
            "failed open left its directory"
        );
        let info2 = c
            .get_runner_info(pb::GetRunnerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info2.open_sessions, 1);
        let tasks = r.work_root.path().join("tasks");
        let runner_id = r.handle.runner_id().to_string();
        r.handle.shutdown().await;
        assert_eq!(
            std::fs::read_dir(&tasks).unwrap().count(),
            0,
            "shutdown removes session directories"
        );
        if backend.docker() {
            assert!(
                containers_of(&runner_id).await.is_empty(),
                "shutdown removes containers"
            );
        }
        let err = c
            .exec(pb::ExecRequest {
                session_id: info.session_id.clone(),
                command: "true".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err.code(), tonic::Code::Unavailable | tonic::Code::NotFound),
            "{err:?}"
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_session_is_closed_and_frees_its_slot() {
    // A client that vanishes (an orchestrator killed mid-task) never closes its session:
    // the runner closes it once no call has used it for `idle_timeout_ms`, removing its
    // sandbox and directories and giving back its share of max_concurrent_runs.
    for backend in cold_backends("session_idle").await {
        let r = TestRunner::start_with(backend, |c| {
            c.session.idle_timeout_ms = 1500;
            c.max_concurrent_runs = 1;
            // No queue: a second session is refused at once.
            c.queue_depth = 0;
        })
        .await;
        let mut c = r.client.clone();
        let open = |id: &str| pb::OpenSessionRequest {
            session_id: id.into(),
            ..Default::default()
        };
        // Container names are the engine's, shared with any other test process.
        let (id_a, id_b) = (
            format!("idle-a-{}", std::process::id()),
            format!("idle-b-{}", std::process::id()),
        );
        let a = c.open_session(open(&id_a)).await.unwrap().into_inner();
        // The session holds the runner's only slot.
        let refused = c.open_session(open(&id_b)).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::ResourceExhausted,
            "{refused:?}"
        );
        // A call running longer than the timeout is not cut short, and calls keep it open.
        let slow = exec(&r, &a.session_id, "sleep 3; echo done", "", 10_000).await;
        assert_eq!((slow.exit_code, text(&slow.stdout)), (0, "done\n".into()));
        for _ in 0..5 {
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let out = exec(&r, &a.session_id, "true", "", 0).await;
            assert_eq!(
                out.exit_code,
                0,
                "{}: used every 400 ms, still open",
                backend.name()
            );
        }
        // Then nobody calls: it is closed, its sandbox and directories removed, within a few
        // timeouts.
        let last_call = std::time::Instant::now();
        let runner_id = r.handle.runner_id().to_string();
        let task_dir = r.work_root.path().join("tasks").join(&id_a);
        loop {
            let open_sessions = c
                .get_runner_info(pb::GetRunnerInfoRequest {})
                .await
                .unwrap()
                .into_inner()
                .open_sessions;
            let container_left = backend.docker() && !containers_of(&runner_id).await.is_empty();
            if open_sessions == 0 && !task_dir.exists() && !container_left {
                break;
            }
            assert!(
                last_call.elapsed() < std::time::Duration::from_secs(10),
                "{}: an idle session was not removed (open {open_sessions}, directory {}, container {container_left})",
                backend.name(),
                task_dir.exists()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert!(last_call.elapsed() >= std::time::Duration::from_millis(1400));
        let gone = c
            .exec(pb::ExecRequest {
                session_id: a.session_id.clone(),
                command: "true".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
        assert!(
            gone.message().contains("idle_timeout_ms"),
            "the message says why it is gone: {}",
            gone.message()
        );
        // Its slot is free again (given back as the teardown ends).
        let b = loop {
            match c.open_session(open(&id_b)).await {
                Ok(b) => break b.into_inner(),
                Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                    assert!(
                        last_call.elapsed() < std::time::Duration::from_secs(10),
                        "{}: the idle session's slot was never given back",
                        backend.name()
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        };
        assert!(
            c.close_session(pb::CloseSessionRequest {
                session_id: b.session_id,
            })
            .await
            .unwrap()
            .into_inner()
            .closed
        );
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_session_is_touched_until_its_holder_lets_go() {
    // The orchestrator's session client touches its session while it holds it, so a node
    // waiting minutes for a model keeps its workspace; once nothing touches it (here `keep`,
    // which stops the touching without closing, as a killed orchestrator would leave it) the
    // runner's idle timeout ends it.
    use cairn_runner_client::{session::RunnerSession, Balancing, Runners};
    for backend in cold_backends("session_touch").await {
        let r = TestRunner::start_with(backend, |c| c.session.idle_timeout_ms = 1500).await;
        let runners = Runners::start(std::slice::from_ref(&r.addr), Balancing::default())
            .await
            .unwrap();
        let id = format!("held-{}", std::process::id());
        let req = pb::OpenSessionRequest {
            session_id: id.clone(),
            ..Default::default()
        };
        let held = RunnerSession::open(runners.rotation(), req, "test")
            .await
            .unwrap();
        assert_eq!(held.info.idle_timeout_ms, 1500);
        // Quiet for more than three idle timeouts, yet open.
        tokio::time::sleep(std::time::Duration::from_millis(4000)).await;
        let out = held.exec("echo alive", 0, "").await.unwrap();
        assert_eq!(text(&out.stdout), "alive\n", "{}", backend.name());
        let mut c = r.client.clone();
        let touched = c
            .touch_session(pb::TouchSessionRequest {
                session_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(touched.idle_timeout_ms, 1500);
        // Let go without closing: nothing touches it any more and the runner closes it.
        let let_go = std::time::Instant::now();
        held.keep();
        let task_dir = r.work_root.path().join("tasks").join(&id);
        while task_dir.exists() {
            assert!(
                let_go.elapsed() < std::time::Duration::from_secs(10),
                "{}: a session nobody touches was not closed",
                backend.name()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // Its last touch came at most a third of the timeout before `keep`.
        assert!(let_go.elapsed() >= std::time::Duration::from_millis(900));
        let gone = c
            .touch_session(pb::TouchSessionRequest { session_id: id })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
        r.stop().await;
    }
}
