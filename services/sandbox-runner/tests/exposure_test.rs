//! What a sandbox sees of the host and how much it may write, on every backend over gRPC:
//! another project's data (under a data root in /var, /srv or /opt) and those directories
//! themselves stay out of sight; a run or a session that writes past `max_total_output_bytes`
//! gets ENOSPC, the result says so, the runner's disk holds at most the cap, and the next run
//! works.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;

use cairn_proto as pb;
use common::*;

/// Directories this test made on the host; removed when dropped.
struct HostMarkers {
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl HostMarkers {
    /// A marker file in another project's data under data roots in /var, /srv and /opt, and
    /// one directly in each of /var, /srv and /opt.
    fn place() -> HostMarkers {
        let tag = format!("cairn-exposure-{}", uuid_like());
        let mut dirs = Vec::new();
        let mut files = Vec::new();
        for (top, root) in [
            ("/var", "lib/cairn"),
            ("/srv", ".cairn-data"),
            ("/opt", ".cairn-data"),
        ] {
            let dir = PathBuf::from(top).join(&tag);
            let project = dir.join(root).join("projects/other-project/workspace");
            std::fs::create_dir_all(&project).unwrap();
            let marker = project.join("secret.txt");
            std::fs::write(&marker, "other project's data").unwrap();
            let loose = dir.join("marker.txt");
            std::fs::write(&loose, "host data").unwrap();
            files.extend([marker, loose]);
            dirs.push(dir);
        }
        HostMarkers { dirs, files }
    }

    /// Python that prints `SEEN <path>` for each marker (or its directory) it can reach.
    fn probe(&self) -> String {
        let mut code = String::from("import os\n");
        for f in &self.files {
            code.push_str(&format!(
                "p = {f:?}\n\
                 try:\n\
                 \x20   open(p).read(); print('SEEN', p)\n\
                 except OSError:\n\
                 \x20   pass\n",
                f = f.display().to_string()
            ));
        }
        for d in &self.dirs {
            let (top, name) = (d.parent().unwrap(), d.file_name().unwrap());
            code.push_str(&format!(
                "try:\n\
                 \x20   if {name:?} in os.listdir({top:?}): print('SEEN', {d:?})\n\
                 except OSError:\n\
                 \x20   pass\n",
                name = name.to_string_lossy(),
                top = top.display().to_string(),
                d = d.display().to_string(),
            ));
        }
        code.push_str("print('done')\n");
        code
    }
}

impl Drop for HostMarkers {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}-{t}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_sees_no_other_projects_data_nor_var_srv_opt() {
    if !rustix::process::geteuid().is_root() {
        println!("SKIP: exposure_markers: placing markers in /var, /srv and /opt needs root");
        return;
    }
    let markers = HostMarkers::place();
    let probe = markers.probe();
    for case in backends("exposure_markers").await {
        let r = TestRunner::start(case).await;
        let out = r.run(python(&probe)).await;
        assert_eq!(
            text(&out.stdout),
            "done\n",
            "{case:?}: the sandbox reached host data: {}",
            text(&out.stderr)
        );
        assert_eq!(out.exit_code, 0, "{case:?}: {}", text(&out.stderr));
        // A session's commands see no more than a run.
        if !case.pool {
            let s = open_session(&r).await;
            let e = exec(&r, &s, &format!("python3 - <<'EOF'\n{probe}EOF\n")).await;
            assert_eq!(
                text(&e.stdout),
                "done\n",
                "{case:?} session: {}",
                text(&e.stderr)
            );
            close_session(&r, &s).await;
        }
        r.stop().await;
    }
}

/// The cap the quota tests configure (small, so it is hit fast on every backend).
const CAP: u64 = 8 << 20;

/// Writes `count` files of `size` bytes under `dir` until a write fails; prints the bytes
/// written and the error's name.
fn writer(dir: &str, count: u32, size: u64) -> String {
    format!(
        "import errno, os\n\
         written, err = 0, 'none'\n\
         chunk = b'x' * (1 << 20)\n\
         try:\n\
         \x20   for i in range({count}):\n\
         \x20       with open('{dir}/f%03d' % i, 'wb') as f:\n\
         \x20           left = {size}\n\
         \x20           while left > 0:\n\
         \x20               n = f.write(chunk[:min(left, len(chunk))])\n\
         \x20               f.flush(); os.fsync(f.fileno())\n\
         \x20               written += n; left -= n\n\
         except OSError as e:\n\
         \x20   err = errno.errorcode.get(e.errno, str(e.errno))\n\
         print('written', written, err)\n"
    )
}

/// (bytes written, error name) from `writer`'s line.
fn written(stdout: &str) -> (u64, String) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("written "))
        .unwrap_or_else(|| panic!("no written line in {stdout:?}"));
    let mut parts = line.split_whitespace().skip(1);
    (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outputs_past_the_total_cap_get_enospc_and_the_next_run_works() {
    for case in backends("exposure_output_quota").await {
        let r = TestRunner::start_with(case, |c| {
            c.max_total_output_bytes = CAP;
            // One file may be as large as the whole area: only the total stops it.
            c.defaults.max_output_bytes = Some(32 << 20);
        })
        .await;
        // 100 files of 1 MiB (the attack's 100 × 15 MB, scaled to the cap), then one huge file.
        // The third also passes its own byte limit (2 MiB) before the area fills: the full
        // area is still the reason given for each output.
        let past_limit = with_limits(
            python(&writer("/output", 100, 1 << 20)),
            pb::Limits {
                max_output_bytes: 2 << 20,
                ..Default::default()
            },
        );
        for (what, req) in [
            ("many files", python(&writer("/output", 100, 1 << 20))),
            ("one huge file", python(&writer("/output", 1, 30 << 20))),
            ("many files past the byte limit", past_limit),
        ] {
            let t0 = std::time::Instant::now();
            let out = r.run(req).await;
            let stdout = text(&out.stdout);
            let (bytes, err) = written(&stdout);
            assert_eq!(
                err,
                "ENOSPC",
                "{case:?} {what}: {stdout} {}",
                text(&out.stderr)
            );
            assert!(
                bytes <= CAP,
                "{case:?} {what}: {bytes} bytes written past the cap"
            );
            assert!(
                out.writable_area_full,
                "{case:?} {what}: the result says so"
            );
            let rj: serde_json::Value = serde_json::from_str(&out.result_json).unwrap();
            assert_eq!(rj["writable_area_full"], true, "{case:?} {what}");
            assert!(
                out.output_files.is_empty(),
                "{case:?} {what}: nothing is published"
            );
            assert!(out.outputs_truncated, "{case:?} {what}");
            // The full area is the reason given for every output.
            assert!(
                !out.rejected_outputs.is_empty()
                    && out.rejected_outputs.iter().all(|o| o.reason == "no_space"),
                "{case:?} {what}: {:?}",
                out.rejected_outputs
            );
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "{case:?} {what}: took {:?}",
                t0.elapsed()
            );
        }
        let out = r
            .run(python("open('/output/ok.txt', 'w').write('fine')"))
            .await;
        assert_eq!(out.exit_code, 0, "{case:?}: {}", text(&out.stderr));
        assert!(!out.writable_area_full);
        assert_eq!(
            out.output_files.len(),
            1,
            "{case:?}: {:?}",
            out.rejected_outputs
        );
        assert_eq!(&out.output_files[0].content[..], b"fine");
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_past_its_total_cap_gets_enospc_and_works_on() {
    for case in cold_backends("exposure_session_quota").await {
        let r = TestRunner::start_with(case, |c| c.max_total_output_bytes = CAP).await;
        let s = open_session(&r).await;
        let code = writer("/workspace", 100, 1 << 20);
        let e = exec(&r, &s, &format!("python3 - <<'EOF'\n{code}EOF\n")).await;
        let stdout = text(&e.stdout);
        let (bytes, err) = written(&stdout);
        assert_eq!(err, "ENOSPC", "{case:?}: {stdout} {}", text(&e.stderr));
        assert!(bytes <= CAP, "{case:?}: {bytes} bytes written past the cap");
        assert!(e.writable_area_full, "{case:?}: the result says so");
        // The runner's own writes into the full workspace are refused with the reason.
        let refused = write_file(&r, &s, "more.bin", vec![0u8; 2 << 20])
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{case:?}");
        assert!(
            refused.message().contains("max_total_output_bytes"),
            "{case:?}: {}",
            refused.message()
        );
        // Freed space is usable again within the same session.
        let e = exec(
            &r,
            &s,
            "rm -f /workspace/f* && echo ok > /workspace/ok && cat /workspace/ok",
        )
        .await;
        assert_eq!(text(&e.stdout), "ok\n", "{case:?}: {}", text(&e.stderr));
        assert!(!e.writable_area_full, "{case:?}");
        close_session(&r, &s).await;
        r.stop().await;
    }
}

/// A docker runner that may not mount (in a container without CAP_SYS_ADMIN) gets each
/// session's /workspace and /tmpfs from the engine: a tmpfs of the cap each, reached by the
/// runner's tools through the container, with none of the session's bytes on its own disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_docker_session_on_engine_areas_is_capped_and_leaves_the_runners_disk_alone() {
    if !docker_only("exposure_engine_areas").await {
        return;
    }
    let case = Case {
        backend: cairn_sandbox_runner::BackendChoice::Docker,
        pool: false,
    };
    let r = TestRunner::start_with(case, |c| {
        c.max_total_output_bytes = CAP;
        c.session.areas = cairn_sandbox_runner::config::AreasChoice::Engine;
    })
    .await;
    // A clone lands in the engine's /workspace, given to the sandbox user.
    let repo = tempfile::tempdir().unwrap();
    let url = one_file_repo(repo.path());
    let mut c = r.client.clone();
    let cloned = c
        .open_session(pb::OpenSessionRequest {
            image: image(),
            git: Some(pb::GitSource {
                url,
                r#ref: String::new(),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cloned.git_commit.len(), 40, "{cloned:?}");
    let e = exec(
        &r,
        &cloned.session_id,
        "cat README.md && stat -c %U README.md .git && test -f .git/HEAD && echo git",
    )
    .await;
    assert_eq!(
        text(&e.stdout),
        "cloned\nsandbox\nsandbox\ngit\n",
        "{}",
        text(&e.stderr)
    );
    close_session(&r, &cloned.session_id).await;
    let s = open_session(&r).await;
    // The runner's tools and the session's code see the same files.
    write_file(&r, &s, "in/a.txt", b"from the runner\n".to_vec())
        .await
        .unwrap();
    let e = exec(
        &r,
        &s,
        "cat in/a.txt && echo 'from the code' > out.txt && stat -c %U in/a.txt && stat -f -c %T /workspace /tmpfs",
    )
    .await;
    assert_eq!(
        text(&e.stdout),
        "from the runner\nsandbox\ntmpfs\ntmpfs\n",
        "{}",
        text(&e.stderr)
    );
    let read = c
        .read_file(pb::ReadFileRequest {
            session_id: s.clone(),
            path: "out.txt".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&read.content[..], b"from the code\n");
    // Past the cap: ENOSPC for the code, the result says so, the runner refuses its writes.
    let code = writer("/workspace", 100, 1 << 20);
    let e = exec(&r, &s, &format!("python3 - <<'EOF'\n{code}EOF\n")).await;
    let (bytes, err) = written(&text(&e.stdout));
    assert_eq!(err, "ENOSPC", "{}", text(&e.stderr));
    assert!(bytes <= CAP, "{bytes} bytes written past the cap");
    assert!(e.writable_area_full, "the result says so");
    let refused = write_file(&r, &s, "more.bin", vec![0u8; 2 << 20])
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("/tmpfs each"),
        "{}",
        refused.message()
    );
    // /tmpfs (HOME) is bounded too.
    let code = writer("/tmpfs", 100, 1 << 20);
    let e = exec(&r, &s, &format!("python3 - <<'EOF'\n{code}EOF\n")).await;
    assert_eq!(written(&text(&e.stdout)).1, "ENOSPC", "{}", text(&e.stderr));
    // None of it is on the runner's disk.
    let on_disk = disk_bytes(r.work_root.path());
    assert!(
        on_disk < 1 << 20,
        "{on_disk} bytes of the session under the runner's work_root"
    );
    // A files-only snapshot carries the areas into a new session.
    let e = exec(
        &r,
        &s,
        "rm -f /workspace/f* /tmpfs/f* && echo kept > /tmpfs/home.txt",
    )
    .await;
    assert_eq!(e.exit_code, 0, "{}", text(&e.stderr));
    let stream = c
        .pause_session(pb::PauseSessionRequest {
            session_id: s.clone(),
            files_only: true,
            keep_open: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut file = Vec::new();
    let saved = cairn_runner_client::snapshot::save(stream, &mut file)
        .await
        .unwrap();
    assert!(!saved.header.memory);
    close_session(&r, &s).await;
    let mut reader = std::io::Cursor::new(file);
    let header = cairn_runner_client::snapshot::read_header(&mut reader)
        .await
        .unwrap();
    let resumed = c
        .resume_session(cairn_runner_client::snapshot::parts(
            header,
            reader,
            String::new(),
            1,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let e = exec(
        &r,
        &resumed,
        "cat in/a.txt out.txt /tmpfs/home.txt; stat -c %U out.txt",
    )
    .await;
    assert_eq!(
        text(&e.stdout),
        "from the runner\nfrom the code\nkept\nsandbox\n",
        "{}",
        text(&e.stderr)
    );
    close_session(&r, &resumed).await;
    r.stop().await;
}

/// A bare repository with one commit of README.md ("cloned"); its URL.
fn one_file_repo(dir: &std::path::Path) -> String {
    let git = |args: &[&str], cwd: &std::path::Path| {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    let src = dir.join("src");
    std::fs::create_dir(&src).unwrap();
    git(&["init", "-q"], &src);
    std::fs::write(src.join("README.md"), "cloned\n").unwrap();
    git(&["add", "-A"], &src);
    git(&["commit", "-qm", "one"], &src);
    git(&["clone", "-q", "--bare", "src", "repo.git"], dir);
    dir.join("repo.git").to_string_lossy().into_owned()
}

/// Bytes of regular files below `dir`.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

async fn open_session(r: &TestRunner) -> String {
    r.client
        .clone()
        .open_session(pb::OpenSessionRequest {
            image: image(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

async fn exec(r: &TestRunner, sid: &str, command: &str) -> pb::ExecResult {
    r.client
        .clone()
        .exec(pb::ExecRequest {
            session_id: sid.into(),
            command: command.into(),
            timeout_ms: 60_000,
            workdir: String::new(),
            max_output_bytes: 0,
            detach: false,
        })
        .await
        .unwrap()
        .into_inner()
}

/// WriteFile (overwrite) of `content` at `path` in session `sid`.
async fn write_file(
    r: &TestRunner,
    sid: &str,
    path: &str,
    content: Vec<u8>,
) -> Result<pb::WriteFileResponse, tonic::Status> {
    r.client
        .clone()
        .write_file(pb::WriteFileRequest {
            session_id: sid.into(),
            path: path.into(),
            content: content.into(),
            mode: 0,
        })
        .await
        .map(|r| r.into_inner())
}

async fn close_session(r: &TestRunner, sid: &str) {
    r.client
        .clone()
        .close_session(pb::CloseSessionRequest {
            session_id: sid.into(),
        })
        .await
        .unwrap();
}
