//! Session snapshots over gRPC between two runners on loopback: a gvisor session paused on
//! runner A goes on, memory and processes included, on runner B; a gvisor checkpoint with
//! memory keeps the session going on A (and a failed restore closes it cleanly); forks
//! from one sending of the bytes diverge, and open all their copies or none; docker and local keep files only; a snapshot is refused by a runner of another backend
//! (and a resume passes over such runners to one that takes it, reading the snapshot again
//! for each), and when its bytes were altered or cut short, or its reader failed, with
//! nothing left half-resumed.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use cairn_proto::{CloseSessionRequest, ExecRequest, PauseSessionRequest, ReadFileRequest};
use cairn_runner_client::snapshot;
use cairn_sandbox_runner::BackendChoice;
use common::snapshots::*;
use common::*;

const GVISOR: Case = Case {
    backend: BackendChoice::Gvisor,
    pool: false,
};
const LOCAL: Case = Case {
    backend: BackendChoice::Local,
    pool: false,
};
const DOCKER: Case = Case {
    backend: BackendChoice::Docker,
    pool: false,
};

/// A counter that keeps its value in memory only and writes it to /tmpfs/count every 20 ms.
const COUNTER: &str = "python3 -c 'import time\ni = 0\nwhile True:\n    i += 1\n    open(\"/tmpfs/count.tmp\", \"w\").write(str(i))\n    __import__(\"os\").replace(\"/tmpfs/count.tmp\", \"/tmpfs/count\")\n    time.sleep(0.02)'";

async fn runner(case: Case) -> TestRunner {
    TestRunner::start_with(case, |c| {
        c.max_concurrent_runs = 8;
        c.max_sessions = 8;
    })
    .await
}

async fn read(r: &TestRunner, id: &str, path: &str) -> Result<String, tonic::Status> {
    let out = r
        .client
        .clone()
        .read_file(ReadFileRequest {
            session_id: id.into(),
            path: path.into(),
            max_bytes: 0,
        })
        .await?;
    Ok(text(&out.into_inner().content))
}

/// The counter's value, read through the workspace's sibling /tmpfs (via Exec).
async fn count(r: &TestRunner, id: &str) -> u64 {
    let out = exec(r, id, "cat /tmpfs/count", false).await;
    text(&out.stdout).trim().parse().unwrap()
}

async fn wait_count(r: &TestRunner, id: &str, at_least: u64) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        let out = r
            .client
            .clone()
            .exec(ExecRequest {
                session_id: id.into(),
                command: "cat /tmpfs/count 2>/dev/null || echo 0".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let n: u64 = text(&out.stdout).trim().parse().unwrap_or(0);
        if n >= at_least {
            return n;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "counter stuck at {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gvisor_session_paused_on_a_goes_on_on_b_with_its_processes_and_files() {
    if !gvisor_usable("gvisor_pause_resume") {
        return;
    }
    pause_on_a_resume_on_b(None).await;
}

/// Debian 13's runsc (where scripts/setup.sh puts it), which ends at a restore every process
/// started through `runsc exec`; None (a SKIP line) when it is missing, a panic when it is
/// missing under CAIRN_REQUIRE_DOCKER=1.
fn newer_runsc(test: &str) -> Option<String> {
    let runsc = std::env::var("CAIRN_NEWER_RUNSC")
        .unwrap_or_else(|_| "/opt/cairn-runsc/trixie/runsc".into());
    if std::path::Path::new(&runsc).is_file() {
        return Some(runsc);
    }
    assert!(
        !docker_required(),
        "CAIRN_REQUIRE_DOCKER=1 but {runsc} is missing: run scripts/setup.sh (it fetches Debian 13's runsc)"
    );
    println!("SKIP {test}: {runsc} is missing (scripts/setup.sh fetches it)");
    None
}

/// Two gvisor runners on `runsc` (PATH's when None).
async fn gvisor_pair(runsc: Option<String>) -> (TestRunner, TestRunner) {
    let start = || {
        let runsc = runsc.clone();
        TestRunner::start_with(GVISOR, move |c| {
            c.max_concurrent_runs = 8;
            c.max_sessions = 8;
            if let Some(runsc) = runsc {
                c.runsc = runsc;
            }
        })
    };
    tokio::join!(start(), start())
}

/// The same on Debian 13's runsc: the session's commands must not be ended by the restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_newer_runsc_a_paused_session_goes_on_with_its_processes() {
    if !gvisor_usable("gvisor_pause_resume_newer_runsc") {
        return;
    }
    if let Some(runsc) = newer_runsc("on_a_newer_runsc_a_paused_session_goes_on_with_its_processes")
    {
        pause_on_a_resume_on_b(Some(runsc)).await;
    }
}

/// A detached counter in a session on runner A, paused; resumed on runner B, it counts on
/// from its value, beside a file written before. `runsc`: both runners' runsc (else PATH's).
async fn pause_on_a_resume_on_b(runsc: Option<String>) {
    let (a, b) = gvisor_pair(runsc).await;
    let id = open(&a).await;
    // The session's first process starts its commands (not a `runsc exec`).
    let parent = exec(&a, &id, "grep '^PPid:' /proc/$$/status", false).await;
    assert_eq!(
        text(&parent.stdout).split_whitespace().collect::<Vec<_>>(),
        ["PPid:", "1"]
    );
    exec(&a, &id, "echo before > /workspace/before.txt", false).await;
    let pid = exec(&a, &id, COUNTER, true).await;
    assert!(
        text(&pid.stdout).trim().parse::<u32>().is_ok(),
        "detach prints a pid"
    );
    let before = wait_count(&a, &id, 25).await;

    let (file, header) = pause(&a, &id, false).await;
    assert!(header.memory, "gvisor keeps memory");
    assert_eq!(header.backend, "gvisor");
    assert_eq!(header.session_id, id);
    // Paused: the session is gone from A, and so is its sandbox.
    let gone = a
        .client
        .clone()
        .exec(ExecRequest {
            session_id: id.clone(),
            command: "true".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert_eq!(open_sessions(&a).await, 0);
    assert!(gvisor_sandboxes(a.work_root.path()).await.is_empty());

    let info = resume(&b, &file).await.unwrap();
    assert_eq!(info.snapshot_of, id);
    assert!(info.memory_restored);
    let resumed = info.session_id;
    assert_ne!(resumed, id);
    assert_eq!(read(&b, &resumed, "before.txt").await.unwrap(), "before\n");
    // The counter goes on from its value: a restarted one would be back near 1.
    let first = count(&b, &resumed).await;
    assert!(first >= before, "counter {first} < {before} at the pause");
    let later = wait_count(&b, &resumed, first + 10).await;
    assert!(later > first);
    let ps = exec(&b, &resumed, "ps -eo args 2>/dev/null || ls /proc", false).await;
    assert!(!text(&ps.stdout).is_empty());
    b.client
        .clone()
        .close_session(CloseSessionRequest {
            session_id: resumed,
        })
        .await
        .unwrap();
    a.stop().await;
    b.stop().await;
}

/// The runner sees a restore through the container's state file under runsc's `--root`; a
/// runsc that keeps its state elsewhere is asked with `runsc state`, and the resume works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resume_works_when_runsc_keeps_its_state_elsewhere() {
    if !gvisor_usable("gvisor_state_elsewhere") {
        return;
    }
    let bin = tempfile::tempdir().unwrap();
    let real = system_runsc();
    let wrapper = bin.path().join("runsc");
    let script = format!(
        "#!/bin/bash\nargs=()\nfor a in \"$@\"; do\n  case \"$a\" in\n    --root=*) mkdir -p \"${{a#--root=}}/elsewhere\"; args+=(\"$a/elsewhere\") ;;\n    *) args+=(\"$a\") ;;\n  esac\ndone\nexec {} \"${{args[@]}}\"\n",
        real.display()
    );
    std::fs::write(&wrapper, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (a, b) = tokio::join!(
        runner(GVISOR),
        TestRunner::start_with(GVISOR, |c| {
            c.runsc = wrapper.to_string_lossy().into_owned();
        })
    );
    let id = open(&a).await;
    exec(&a, &id, COUNTER, true).await;
    let before = wait_count(&a, &id, 10).await;
    let (file, _) = pause(&a, &id, false).await;
    let info = resume(&b, &file).await.unwrap();
    assert!(info.memory_restored);
    let first = count(&b, &info.session_id).await;
    assert!(first >= before, "counter {first} < {before} at the pause");
    wait_count(&b, &info.session_id, first + 5).await;
    let state = b.work_root.path().join("gvisor/state");
    let kept: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        kept,
        vec![std::ffi::OsString::from("elsewhere")],
        "{kept:?}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_forks_start_with_the_same_memory_and_files_and_diverge() {
    if !gvisor_usable("gvisor_fork") {
        return;
    }
    let (a, b) = tokio::join!(runner(GVISOR), runner(GVISOR));
    let id = open(&a).await;
    exec(&a, &id, "echo shared > /workspace/shared.txt", false).await;
    exec(&a, &id, COUNTER, true).await;
    let before = wait_count(&a, &id, 10).await;
    let (file, _) = pause(&a, &id, false).await;
    // One sending of the bytes, five sessions restored from one unpacked checkpoint.
    let first = resume_copies(&b, &file, 5).await.unwrap();
    let mut forks = vec![first.session_id.clone()];
    for copy in &first.copies {
        assert!(copy.memory_restored && copy.snapshot_of == id, "{copy:?}");
        forks.push(copy.session_id.clone());
    }
    assert!(first.memory_restored);
    assert_eq!(forks.len(), 5);
    assert_eq!(
        forks.iter().collect::<std::collections::HashSet<_>>().len(),
        5
    );
    assert_eq!(open_sessions(&b).await, 5);
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(read(&b, f, "shared.txt").await.unwrap(), "shared\n");
        assert!(
            count(&b, f).await >= before,
            "fork {i} restarted its counter"
        );
        exec(&b, f, &format!("echo {i} > /workspace/mine.txt"), false).await;
    }
    for (i, f) in forks.iter().enumerate() {
        assert_eq!(read(&b, f, "mine.txt").await.unwrap(), format!("{i}\n"));
    }
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_and_local_keep_files_only_and_close_the_session_once_delivered() {
    let mut cases = Vec::new();
    match bwrap_ready() {
        Ok(()) => cases.push(LOCAL),
        Err(why) => println!("SKIP: files_only_snapshot [local]: {why}"),
    }
    if docker_only("files_only_snapshot").await {
        cases.push(DOCKER);
    }
    for case in cases {
        let (a, b) = tokio::join!(runner(case), runner(case));
        let id = open(&a).await;
        exec(&a, &id, "mkdir -p /workspace/d && echo kept > /workspace/d/f.txt && echo t > /tmpfs/t.txt && ln -s d/f.txt /workspace/link", false).await;
        let (file, header) = pause(&a, &id, false).await;
        assert!(!header.memory, "{case:?}: files only");
        assert_eq!(header.backend, case.name());
        // The stream ended: the session is closed on A.
        let t0 = std::time::Instant::now();
        while open_sessions(&a).await > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{case:?}: still open"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let info = resume(&b, &file).await.unwrap();
        assert!(!info.memory_restored);
        assert_eq!(info.snapshot_of, id);
        let s = info.session_id;
        assert_eq!(read(&b, &s, "d/f.txt").await.unwrap(), "kept\n", "{case:?}");
        let out = exec(&b, &s, "cat /tmpfs/t.txt; readlink /workspace/link; stat -c %U /workspace/d/f.txt 2>/dev/null || true", false).await;
        let out = text(&out.stdout);
        assert!(out.starts_with("t\nd/f.txt\n"), "{case:?}: {out}");
        // Writable by the session's user.
        exec(&b, &s, "echo more >> /workspace/d/f.txt", false).await;
        a.stop().await;
        b.stop().await;
    }
}

/// `keep_open`: a checkpoint of a session that goes on (files only); the snapshot holds the
/// files as they were then. Without files_only it holds files only too, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_keeps_the_session_open() {
    let mut cases = Vec::new();
    match bwrap_ready() {
        Ok(()) => cases.push(LOCAL),
        Err(why) => println!("SKIP: a_checkpoint_keeps_the_session_open [local]: {why}"),
    }
    if docker_only("a_checkpoint_keeps_the_session_open").await {
        cases.push(DOCKER);
    }
    for case in cases {
        let (a, b) = tokio::join!(runner(case), runner(case));
        let id = open(&a).await;
        exec(&a, &id, "echo one > /workspace/n.txt", false).await;
        let (_, asked_memory) = pause_with(&a, &id, false, true).await.unwrap();
        assert!(!asked_memory.memory, "{case:?}: no memory on this backend");
        let (file, header) = pause_with(&a, &id, true, true).await.unwrap();
        assert!(!header.memory);
        assert_eq!(header.session_id, id);
        // The stream has ended and the session goes on.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(open_sessions(&a).await, 1, "{case:?}");
        exec(&a, &id, "echo two >> /workspace/n.txt", false).await;
        assert_eq!(read(&a, &id, "n.txt").await.unwrap(), "one\ntwo\n");
        // The checkpoint holds the files as they were when it was taken.
        let s = resume(&b, &file).await.unwrap().session_id;
        assert_eq!(read(&b, &s, "n.txt").await.unwrap(), "one\n", "{case:?}");
        a.stop().await;
        b.stop().await;
    }
}

/// What is in `r`'s tasks directory (session directories, payloads, scratch directories).
fn task_entries(r: &TestRunner) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(r.work_root.path().join("tasks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A memory checkpoint of a session that goes on: the sandbox is checkpointed and restored in
/// place, so the same session's counter goes on from where it was and Exec works; nothing of
/// the checkpoint is left on the runner; the snapshot, resumed on B, goes on from the value
/// it held, over the files as they were then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gvisor_memory_checkpoint_keeps_the_session_and_its_processes_going() {
    if !gvisor_usable("gvisor_memory_checkpoint") {
        return;
    }
    memory_checkpoint_goes_on(None).await;
}

/// The same on Debian 13's runsc, whose restore in place would end a `runsc exec`'s processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_newer_runsc_a_memory_checkpoint_keeps_the_processes_going() {
    if !gvisor_usable("gvisor_memory_checkpoint_newer_runsc") {
        return;
    }
    if let Some(runsc) =
        newer_runsc("on_a_newer_runsc_a_memory_checkpoint_keeps_the_processes_going")
    {
        memory_checkpoint_goes_on(Some(runsc)).await;
    }
}

async fn memory_checkpoint_goes_on(runsc: Option<String>) {
    let (a, b) = gvisor_pair(runsc).await;
    let id = open(&a).await;
    exec(&a, &id, "echo one > /workspace/n.txt", false).await;
    exec(&a, &id, COUNTER, true).await;
    let before = wait_count(&a, &id, 25).await;

    let t0 = std::time::Instant::now();
    let (file, header) = pause_with(&a, &id, false, true).await.unwrap();
    let took = t0.elapsed();
    assert!(header.memory, "a gvisor checkpoint keeps memory");
    assert_eq!(header.backend, "gvisor");
    assert_eq!(header.session_id, id);
    println!(
        "memory checkpoint of a session that goes on: {} ms, {} bytes",
        took.as_millis(),
        header.size_bytes
    );

    // The same session goes on: its counter from where it was (a restarted one would be
    // back near 1), and Exec works.
    assert_eq!(open_sessions(&a).await, 1);
    let first = count(&a, &id).await;
    assert!(
        first >= before,
        "counter {first} < {before} before the checkpoint"
    );
    let later = wait_count(&a, &id, first + 10).await;
    assert!(later > first);
    exec(&a, &id, "echo two >> /workspace/n.txt", false).await;
    assert_eq!(read(&a, &id, "n.txt").await.unwrap(), "one\ntwo\n");
    // One sandbox (the restored one), and no payload or checkpoint directory left.
    assert_eq!(gvisor_sandboxes(a.work_root.path()).await.len(), 1);
    assert_eq!(task_entries(&a), vec![id.clone()]);

    // A second checkpoint of the restored session works as the first.
    let (_, again) = pause_with(&a, &id, false, true).await.unwrap();
    assert!(again.memory);
    assert!(count(&a, &id).await >= later);

    // On B the snapshot goes on from its counter, over the files of the checkpoint.
    let info = resume(&b, &file).await.unwrap();
    assert!(info.memory_restored);
    assert_eq!(info.snapshot_of, id);
    let resumed = info.session_id;
    assert_eq!(read(&b, &resumed, "n.txt").await.unwrap(), "one\n");
    let on_b = count(&b, &resumed).await;
    assert!(
        on_b >= before,
        "counter {on_b} < {before} at the checkpoint"
    );
    assert!(wait_count(&b, &resumed, on_b + 10).await > on_b);

    a.client
        .clone()
        .close_session(CloseSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap();
    assert!(gvisor_sandboxes(a.work_root.path()).await.is_empty());
    a.stop().await;
    b.stop().await;
}

/// The runsc on PATH.
fn system_runsc() -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
        .unwrap()
}

/// `dir/runsc`: a runsc that does `then` (shell) before a `verb` command of `real`.
fn wrapped_runsc(real: &std::path::Path, dir: &std::path::Path, verb: &str, then: &str) -> String {
    let wrapper = dir.join("runsc");
    let script = format!(
        "#!/bin/sh\nREAL={}\nfor a in \"$@\"; do\n  if [ \"$a\" = {verb} ]; then {then}; fi\ndone\nexec $REAL \"$@\"\n",
        real.display()
    );
    std::fs::write(&wrapper, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper.to_string_lossy().into_owned()
}

/// A gvisor runner whose runsc does `then` (shell) instead of, or after, a `verb` command.
async fn runner_whose_runsc(dir: &std::path::Path, verb: &str, then: &str) -> TestRunner {
    let runsc = wrapped_runsc(&system_runsc(), dir, verb, then);
    TestRunner::start_with(GVISOR, |c| c.runsc = runsc).await
}

/// The checkpoint's bytes go out while runsc writes them: with a runsc whose checkpoint
/// command lingers 3 s after its image is written, the first bytes of a session holding
/// 24 MiB arrive long before the checkpoint ends (a runner that sends only after runsc exits
/// sends nothing for 3 s), and the snapshot, its image in parts, resumes on another runner
/// with its counter going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_checkpoint_is_sent_while_runsc_writes_it() {
    if !gvisor_usable("gvisor_checkpoint_streamed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = runner_whose_runsc(
        dir.path(),
        "checkpoint",
        "$REAL \"$@\"; rc=$?; sleep 3; exit $rc",
    )
    .await;
    let b = TestRunner::start_with(GVISOR, |_| {}).await;
    let id = open(&a).await;
    let hold = "python3 -c 'import os,time\nb = os.urandom(24 << 20)\nopen(\"/tmpfs/held\", \"w\").write(\"1\")\nwhile True: time.sleep(1)'";
    exec(&a, &id, hold, true).await;
    exec(&a, &id, COUNTER, true).await;
    let before = wait_count(&a, &id, 5).await;
    assert_eq!(
        text(&exec(&a, &id, "cat /tmpfs/held", false).await.stdout),
        "1"
    );

    let t0 = std::time::Instant::now();
    let mut stream = a
        .client
        .clone()
        .pause_session(PauseSessionRequest {
            session_id: id.clone(),
            files_only: false,
            keep_open: false,
        })
        .await
        .unwrap()
        .into_inner();
    let (mut file, mut first_bytes, mut header) = (Vec::new(), None, None);
    while let Some(part) = stream.message().await.unwrap() {
        match part.msg {
            Some(cairn_proto::snapshot_part::Msg::Header(h)) => {
                file.extend(snapshot::prefix(&h));
                header = Some(h);
            }
            Some(cairn_proto::snapshot_part::Msg::Chunk(c)) => {
                first_bytes.get_or_insert(t0.elapsed());
                file.extend_from_slice(&c);
            }
            Some(cairn_proto::snapshot_part::Msg::End(e)) => {
                file.extend(snapshot::trailer(&e).unwrap());
            }
            None => {}
        }
    }
    let (first_bytes, ended) = (first_bytes.unwrap(), t0.elapsed());
    println!("first bytes after {first_bytes:?}, the snapshot ended after {ended:?}");
    assert!(
        ended >= Duration::from_secs(3),
        "runsc's checkpoint lingers 3 s: {ended:?}"
    );
    assert!(
        first_bytes + Duration::from_millis(1500) < ended,
        "the first bytes came {first_bytes:?} after the pause began, the end {ended:?}: nothing went out while runsc wrote"
    );
    let header = header.unwrap();
    assert!(header.memory);
    assert_eq!(header.format, 2);

    let resumed = resume(&b, &file).await.unwrap();
    let on_b = wait_count(&b, &resumed.session_id, before + 10).await;
    assert!(on_b > before);
    assert_eq!(
        text(
            &exec(&b, &resumed.session_id, "cat /tmpfs/held", false)
                .await
                .stdout
        ),
        "1"
    );
    a.stop().await;
    b.stop().await;
}

/// `gvisor_checkpoint_compression` reaches `runsc checkpoint` when that runsc takes
/// `--compression` (Debian 13's), and a runsc without the flag (Debian 12's) is not given it:
/// its checkpoint still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checkpoint_compression_goes_to_a_runsc_that_takes_it() {
    if !gvisor_usable("gvisor_checkpoint_compression") {
        return;
    }
    let mut cases = vec![system_runsc().to_string_lossy().into_owned()];
    cases.extend(newer_runsc(
        "the_checkpoint_compression_goes_to_a_runsc_that_takes_it",
    ));
    for real in cases {
        let dir = tempfile::tempdir().unwrap();
        let help = std::process::Command::new(&real)
            .args(["checkpoint", "--help"])
            .output()
            .unwrap();
        let takes =
            String::from_utf8_lossy(&[help.stdout, help.stderr].concat()).contains("-compression");
        let log = dir.path().join("checkpoint.args");
        let then = format!("echo \"$*\" >> {}", log.display());
        let runsc = wrapped_runsc(std::path::Path::new(&real), dir.path(), "checkpoint", &then);
        let r = TestRunner::start_with(GVISOR, |c| {
            c.runsc = runsc;
            c.gvisor_checkpoint_compression = "none".into();
        })
        .await;
        let id = open(&r).await;
        exec(&r, &id, "echo kept > /workspace/k.txt", false).await;
        let (_, header) = pause(&r, &id, false).await;
        assert!(header.memory, "{real}");
        let args = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            args.contains("--compression=none"),
            takes,
            "{real} (takes --compression: {takes}) was run as: {args}"
        );
        r.stop().await;
    }
}

/// After a checkpoint that failed and closed session `id`: nothing of it is left on `r`, and
/// the runner goes on.
async fn assert_closed_cleanly(r: &TestRunner, id: &str) {
    assert_eq!(open_sessions(r).await, 0);
    let gone = r
        .client
        .clone()
        .exec(ExecRequest {
            session_id: id.into(),
            command: "true".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
    assert!(gvisor_sandboxes(r.work_root.path()).await.is_empty());
    assert!(task_entries(r).is_empty(), "left: {:?}", task_entries(r));
    let bundles: Vec<_> = std::fs::read_dir(r.work_root.path().join("gvisor/bundles"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(bundles.is_empty(), "bundles left: {bundles:?}");
    let fresh = open(r).await;
    exec(r, &fresh, "true", false).await;
}

/// A memory checkpoint whose restore in place fails (runsc here refuses `restore`): the call
/// fails saying the session is closed, and it is, with nothing left of it on the runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_that_cannot_be_restored_closes_the_session_cleanly() {
    if !gvisor_usable("gvisor_checkpoint_restore_fails") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = runner_whose_runsc(
        dir.path(),
        "restore",
        "echo 'restore refused by the test' >&2; exit 3",
    )
    .await;
    let id = open(&a).await;
    exec(&a, &id, COUNTER, true).await;
    wait_count(&a, &id, 5).await;

    let err = pause_with(&a, &id, false, true).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert!(err.message().contains("closed"), "{}", err.message());
    assert!(
        err.message().contains("restore refused by the test"),
        "{}",
        err.message()
    );
    assert_closed_cleanly(&a, &id).await;
    a.stop().await;
}

/// A `runsc checkpoint` that fails: a session whose sandbox still runs stays open and goes
/// on, with its CPU quota back in place (it is lifted while runsc saves the sandbox); one
/// whose sandbox it stopped is closed, with nothing left of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_checkpoint_closes_the_session_only_when_it_stopped_the_sandbox() {
    if !gvisor_usable("gvisor_checkpoint_fails") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The refusal names the sandbox's CPU quota file (v1 or v2) and what it held meanwhile.
    let refused = runner_whose_runsc(
        dir.path(),
        "checkpoint",
        "for last in \"$@\"; do :; done; \
         f=$(ls /sys/fs/cgroup/cpu/cairn-gvisor-*/\"$last\"/cpu.cfs_quota_us /sys/fs/cgroup/cairn-gvisor-*/\"$last\"/cpu.max 2>/dev/null | head -1); \
         echo \"checkpoint refused by the test [quota file ${f:-none}] [quota $(cat \"$f\" 2>/dev/null)]\" >&2; exit 3",
    )
    .await;
    let id = open(&refused).await;
    exec(&refused, &id, COUNTER, true).await;
    let before = wait_count(&refused, &id, 5).await;
    let err = pause_with(&refused, &id, false, true).await.unwrap_err();
    let message = err.message().to_owned();
    assert!(
        message.contains("checkpoint refused by the test"),
        "{message}"
    );
    assert!(!message.contains("closed"), "{message}");
    assert_eq!(open_sessions(&refused).await, 1);
    assert!(wait_count(&refused, &id, before + 10).await > before);
    let between = |open: &str, close: char| {
        let from = message.find(open).map(|i| i + open.len())?;
        let len = message[from..].find(close)?;
        Some(message[from..from + len].trim().to_owned())
    };
    match between("[quota file ", ']').filter(|f| f != "none") {
        None => println!("SKIP the quota part: runsc puts no sandbox in a cgroup here"),
        Some(file) => {
            let during = between("] [quota ", ']').unwrap_or_default();
            assert!(
                during == "-1" || during.starts_with("max"),
                "the quota was not lifted while runsc checkpointed: {message}"
            );
            let after = std::fs::read_to_string(&file).unwrap();
            assert!(
                after.trim() == "100000" || after.trim() == "100000 100000",
                "the session's one-core quota is not back after the failed checkpoint: {after:?}"
            );
        }
    }
    assert_eq!(task_entries(&refused), vec![id.clone()]);
    refused.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let stopped = runner_whose_runsc(
        dir.path(),
        "checkpoint",
        "$REAL \"$@\" >/dev/null 2>&1; echo 'checkpoint failed after it stopped the sandbox' >&2; exit 3",
    )
    .await;
    let id = open(&stopped).await;
    exec(&stopped, &id, COUNTER, true).await;
    wait_count(&stopped, &id, 5).await;
    let err = pause_with(&stopped, &id, false, true).await.unwrap_err();
    assert!(
        err.message()
            .contains("checkpoint failed after it stopped the sandbox")
            && err.message().contains("closed"),
        "{}",
        err.message()
    );
    assert_closed_cleanly(&stopped, &id).await;
    stopped.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_is_refused_by_a_runner_of_another_backend() {
    if !gvisor_usable("snapshot_other_backend") {
        return;
    }
    let a = runner(GVISOR).await;
    let id = open(&a).await;
    exec(&a, &id, "echo x > /workspace/x", false).await;
    let (file, _) = pause(&a, &id, false).await;
    let mut others = Vec::new();
    if bwrap_ready().is_ok() {
        others.push(LOCAL);
    }
    if docker_only("gvisor_snapshot_on_docker").await {
        others.push(DOCKER);
    }
    for case in others {
        let b = runner(case).await;
        let err = resume(&b, &file).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{case:?}: {err}"
        );
        assert_eq!(reason(&err), "snapshot_mismatch");
        assert!(err.message().contains("gvisor"), "{}", err.message());
        assert_nothing_resumed(&b).await;
        b.stop().await;
    }
    a.stop().await;
}

/// A fleet that mixes backends: the runner client's resume passes over runners of another
/// backend (each refuses, leaving nothing) to the one that takes it; when every runner
/// refuses, that refusal is what the caller gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resume_in_a_mixed_fleet_passes_over_runners_of_another_backend() {
    let test = "snapshot_mixed_fleet";
    if !gvisor_usable(test) {
        return;
    }
    let mut others = Vec::new();
    if bwrap_ready().is_ok() {
        others.push(runner(LOCAL).await);
    }
    if docker_only(test).await {
        others.push(runner(DOCKER).await);
    }
    if others.is_empty() {
        println!("SKIP: {test}: no runner of another backend can run here");
        return;
    }
    let a = runner(GVISOR).await;
    let id = open(&a).await;
    exec(&a, &id, "echo kept > /workspace/x", false).await;
    let (file, _) = pause(&a, &id, false).await;
    let b = runner(GVISOR).await;
    let mut addrs: Vec<String> = others.iter().map(|r| r.addr.clone()).collect();
    addrs.push(b.addr.clone());
    let fleet =
        cairn_runner_client::Runners::start(&addrs, cairn_runner_client::Balancing::default())
            .await
            .unwrap();
    // The runners of another backend first, the gvisor one last.
    let mut rotation = fleet.rotation();
    rotation.sort_by_key(|(addr, _)| *addr == b.addr);
    let file = bytes::Bytes::from(file);
    let resumed = cairn_runner_client::session::RunnerSession::resume(
        rotation.clone(),
        file.clone(),
        "mixed-1".into(),
    )
    .await
    .unwrap();
    assert_eq!(resumed.runner, b.addr);
    assert_eq!(read(&b, resumed.id(), "x").await.unwrap(), "kept\n");
    for r in &others {
        assert_nothing_resumed(r).await;
    }
    resumed.close().await.unwrap();

    rotation.retain(|(addr, _)| *addr != b.addr);
    let err = cairn_runner_client::session::RunnerSession::resume(rotation, file, "mixed-2".into())
        .await
        .err()
        .expect("no runner of the snapshot's backend: refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert_eq!(reason(&err), "snapshot_mismatch");
    for r in others {
        assert_nothing_resumed(&r).await;
        r.stop().await;
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_altered_or_cut_snapshot_is_refused_and_nothing_is_half_resumed() {
    let case = if bwrap_ready().is_ok() {
        LOCAL
    } else if gvisor_usable("snapshot_corrupt") {
        GVISOR
    } else {
        println!("SKIP: snapshot_corrupt: neither bubblewrap nor gvisor");
        return;
    };
    let (a, b) = tokio::join!(runner(case), runner(case));
    let id = open(&a).await;
    exec(
        &a,
        &id,
        "head -c 300000 /dev/urandom > /workspace/blob",
        false,
    )
    .await;
    let (file, _) = pause(&a, &id, true).await;
    let mut flipped = file.clone();
    let at = file.len() - 1000;
    flipped[at] ^= 0x40;
    let cut = &file[..file.len() - 4096];
    for (what, bytes) in [("altered", &flipped[..]), ("cut short", cut)] {
        let err = resume(&b, bytes).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err}");
        assert_eq!(reason(&err), "snapshot_corrupt", "{what}");
        assert_nothing_resumed(&b).await;
    }
    // A header that is not the runner's layout.
    let mut reader = std::io::Cursor::new(file.clone());
    let mut header = snapshot::read_header(&mut reader).await.unwrap();
    header.format = 99;
    let err = b
        .client
        .clone()
        .resume_session(snapshot::parts(header, reader, String::new(), 1))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "snapshot_mismatch");
    // The intact one resumes.
    let s = resume(&b, &file).await.unwrap().session_id;
    let out = exec(&b, &s, "wc -c < /workspace/blob", false).await;
    assert_eq!(text(&out.stdout).trim(), "300000");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_opens_every_copy_or_none() {
    let case = if bwrap_ready().is_ok() {
        LOCAL
    } else if docker_only("fork_all_or_none").await {
        DOCKER
    } else {
        println!("SKIP: fork_all_or_none: neither bubblewrap nor docker");
        return;
    };
    let (a, b) = tokio::join!(
        runner(case),
        TestRunner::start_with(case, |c| {
            c.max_concurrent_runs = 4;
            c.max_sessions = 3;
        })
    );
    let id = open(&a).await;
    exec(&a, &id, "echo kept > /workspace/kept.txt", false).await;
    let (file, _) = pause(&a, &id, true).await;
    // More copies than the runner can ever hold: refused before anything is made.
    let err = resume_copies(&b, &file, 4).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert_eq!(reason(&err), "too_many_sessions");
    assert_nothing_resumed(&b).await;
    // Three would fit an empty runner; with one session open the third copy cannot open, and
    // the two that did are closed again.
    let other = open(&b).await;
    let err = resume_copies(&b, &file, 3).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert_eq!(open_sessions(&b).await, 1);
    assert_eq!(task_entries(&b), vec![other.clone()]);
    // With room, all three open, each with the files.
    b.client
        .clone()
        .close_session(CloseSessionRequest { session_id: other })
        .await
        .unwrap();
    let first = resume_copies(&b, &file, 3).await.unwrap();
    assert_eq!(first.copies.len(), 2);
    for s in std::iter::once(&first).chain(&first.copies) {
        assert_eq!(read(&b, &s.session_id, "kept.txt").await.unwrap(), "kept\n");
        assert_eq!(s.snapshot_of, id);
    }
    assert_eq!(open_sessions(&b).await, 3);
    a.stop().await;
    b.stop().await;
}

/// The runner client's streamed resume reads the snapshot afresh for each runner it offers
/// it to (a runner gone mid-way gets the bytes sent again to the next), and a reader that
/// fails part way is the error the caller gets (DataLoss, naming the reader's cause) while
/// the runner, sent a short snapshot, resumes nothing and no other runner is tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_streamed_resume_reads_again_for_each_runner_and_names_a_failed_read() {
    use cairn_runner_client::session::RunnerSession;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(case) = files_case("streamed_resume").await else {
        return;
    };
    let a = runner(case).await;
    let id = open(&a).await;
    exec(
        &a,
        &id,
        "head -c 3000000 /dev/urandom > /workspace/big.bin; echo kept > /workspace/x",
        false,
    )
    .await;
    let (file, _) = pause(&a, &id, true).await;
    let file = bytes::Bytes::from(file);
    // An address nothing listens at, tried first.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let fleet = cairn_runner_client::Runners::start(
        &[gone.clone(), a.addr.clone()],
        cairn_runner_client::Balancing::default(),
    )
    .await
    .unwrap();
    let mut rotation = fleet.rotation();
    rotation.sort_by_key(|(addr, _)| *addr == a.addr);
    assert_eq!(rotation[0].0, gone);

    let opened = AtomicUsize::new(0);
    let open_file = || {
        opened.fetch_add(1, Ordering::SeqCst);
        let file = file.clone();
        async move { Ok(std::io::Cursor::new(file)) }
    };
    let resumed = RunnerSession::resume_from(rotation.clone(), open_file, "streamed-1".into())
        .await
        .unwrap();
    assert_eq!(resumed.runner, a.addr);
    assert_eq!(
        opened.load(Ordering::SeqCst),
        2,
        "one read per runner offered it"
    );
    assert_eq!(read(&a, resumed.id(), "x").await.unwrap(), "kept\n");
    resumed.close().await.unwrap();

    // A reader that fails after half the file, on the runner that would take it.
    rotation.reverse();
    let opened = AtomicUsize::new(0);
    let half = file.slice(..file.len() / 2);
    let failing = || {
        opened.fetch_add(1, Ordering::SeqCst);
        let half = half.clone();
        async move {
            let failed =
                futures::stream::iter([Ok(half), Err(std::io::Error::other("the disk went away"))]);
            Ok(tokio_util::io::StreamReader::new(failed))
        }
    };
    let err = RunnerSession::resume_from(rotation, failing, "streamed-2".into())
        .await
        .err()
        .expect("a snapshot read half way is not resumed");
    assert_eq!(err.code(), tonic::Code::DataLoss, "{err}");
    assert!(err.message().contains("the disk went away"), "{err}");
    assert_eq!(opened.load(Ordering::SeqCst), 1, "tried on no other runner");
    assert_nothing_resumed(&a).await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn detach_is_refused_on_the_local_backend() {
    if let Err(why) = bwrap_ready() {
        println!("SKIP: detach_local: {why}");
        return;
    }
    let r = runner(LOCAL).await;
    let id = open(&r).await;
    let err = r
        .client
        .clone()
        .exec(ExecRequest {
            session_id: id,
            command: "sleep 100".into(),
            detach: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&err), "detach_unsupported");
    r.stop().await;
}

/// The local backend when bubblewrap works, else docker (SKIP when neither: None).
async fn files_case(name: &str) -> Option<Case> {
    if bwrap_ready().is_ok() {
        Some(LOCAL)
    } else if docker_only(name).await {
        Some(DOCKER)
    } else {
        println!("SKIP: {name}: neither bubblewrap nor docker");
        None
    }
}

/// Files a pause left beside the sessions' task directories (it keeps none).
fn pause_leftovers(r: &TestRunner) -> Vec<String> {
    let tasks = r.work_root.path().join("tasks");
    std::fs::read_dir(&tasks)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".snap"))
                .collect()
        })
        .unwrap_or_default()
}

/// The bytes go out as they are made, so a snapshot over `max_snapshot_bytes` is refused
/// while it streams: the stream ends with the refusal, never with a SnapshotEnd, and the
/// session (files only) stays open and usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_over_the_limit_is_refused_as_it_streams_and_the_session_stays() {
    let Some(case) = files_case("snapshot_over_the_limit").await else {
        return;
    };
    let a = TestRunner::start_with(case, |c| {
        c.max_concurrent_runs = 4;
        c.session.max_snapshot_bytes = 2 << 20;
    })
    .await;
    let id = open(&a).await;
    exec(
        &a,
        &id,
        "head -c 6000000 /dev/urandom > /workspace/big",
        false,
    )
    .await;
    let err = pause_with(&a, &id, true, false).await;
    let err = match err {
        Err(e) => e,
        Ok(_) => panic!("a snapshot over the limit was delivered"),
    };
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert_eq!(reason(&err), "too_large");
    assert!(err.message().contains("max_snapshot_bytes"), "{err}");
    assert_eq!(open_sessions(&a).await, 1, "the session stays open");
    let out = exec(&a, &id, "wc -c < /workspace/big", false).await;
    assert_eq!(text(&out.stdout).trim(), "6000000");
    assert_eq!(pause_leftovers(&a), Vec::<String>::new());
    // Under the limit once the file is gone.
    exec(&a, &id, "rm /workspace/big", false).await;
    pause(&a, &id, true).await;
    a.stop().await;
}

/// A caller that stops reading a pause half way through stops the bytes: no snapshot, the
/// files-only session open and usable, and nothing left behind on the runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_that_leaves_a_pause_half_way_leaves_the_session_open() {
    let Some(case) = files_case("pause_left_half_way").await else {
        return;
    };
    let a = runner(case).await;
    let id = open(&a).await;
    // Files under the session's file size limit, 36 MB in all.
    let fill = "for i in 1 2 3 4; do head -c 9000000 /dev/urandom > /workspace/big$i; done";
    exec(&a, &id, fill, false).await;
    let mut stream = a
        .client
        .clone()
        .pause_session(PauseSessionRequest {
            session_id: id.clone(),
            files_only: true,
            keep_open: false,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        first.msg,
        Some(cairn_proto::snapshot_part::Msg::Header(ref h)) if h.sha256.is_empty() && h.size_bytes == 0
    ));
    let second = stream.message().await.unwrap().unwrap();
    assert!(matches!(
        second.msg,
        Some(cairn_proto::snapshot_part::Msg::Chunk(_))
    ));
    drop(stream);
    // The runner notices when its buffers fill: the session stays open, nothing is kept.
    let t0 = std::time::Instant::now();
    while !pause_leftovers(&a).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?}",
            pause_leftovers(&a)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(open_sessions(&a).await, 1, "the session stays open");
    let out = exec(&a, &id, "cat /workspace/big* | wc -c", false).await;
    assert_eq!(text(&out.stdout).trim(), "36000000");
    // And a whole pause of it still works.
    let (_, header) = pause(&a, &id, true).await;
    assert_eq!(
        header.size_bytes as usize / 1_000_000,
        36,
        "{}",
        header.size_bytes
    );
    a.stop().await;
}

/// A snapshot file made before the bytes were streamed (the sha256 and size in its header, no
/// trailer) still resumes; one with both, or with a trailer that disagrees, does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_with_its_digest_in_the_header_still_resumes() {
    let Some(case) = files_case("digest_in_the_header").await else {
        return;
    };
    let a = runner(case).await;
    let id = open(&a).await;
    exec(&a, &id, "echo old > /workspace/old.txt", false).await;
    let (file, header) = pause(&a, &id, true).await;
    // The file as the runner sent it: the header without a digest, the trailer after.
    let mut reader = std::io::Cursor::new(file.clone());
    let sent = snapshot::read_header(&mut reader).await.unwrap();
    assert!(sent.sha256.is_empty() && sent.size_bytes == 0);
    let at = reader.position() as usize;
    let payload = &file[at..file.len() - snapshot::TRAILER_LEN];
    assert_eq!(payload.len() as u64, header.size_bytes);
    // The earlier layout: the digest in the header, the payload last.
    let mut old = snapshot::prefix(&header);
    old.extend_from_slice(payload);
    let s = resume(&a, &old).await.unwrap().session_id;
    assert_eq!(read(&a, &s, "old.txt").await.unwrap(), "old\n");
    // A digest in the header that says other bytes: refused.
    let mut other = header.clone();
    other.sha256 = "0".repeat(64);
    let mut both = snapshot::prefix(&other);
    both.extend_from_slice(payload);
    let err = resume(&a, &both).await.unwrap_err();
    assert_eq!(reason(&err), "snapshot_corrupt", "{err}");
    // A trailer whose sha256 was altered.
    let mut altered = file.clone();
    let last = altered.len() - 1;
    altered[last] ^= 1;
    let err = resume(&a, &altered).await.unwrap_err();
    assert_eq!(reason(&err), "snapshot_corrupt", "{err}");
    a.stop().await;
}
