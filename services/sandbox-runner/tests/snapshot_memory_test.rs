//! A gvisor snapshot with memory: the pause leaves no checkpoint directory (nor its tmpfs)
//! behind; altered or cut short on its way to another runner, it is refused with nothing left
//! behind: its checkpoint is written where runsc reads it as the bytes arrive, so a refusal
//! must also take that away (and no sandbox may start from it).
#![allow(clippy::unwrap_used)]

mod common;

use cairn_runner_client::snapshot;
use cairn_sandbox_runner::BackendChoice;
use common::snapshots::*;
use common::*;

const GVISOR: Case = Case {
    backend: BackendChoice::Gvisor,
    pool: false,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_altered_or_cut_memory_snapshot_is_refused_and_its_checkpoint_goes() {
    if !gvisor_usable("snapshot_memory_corrupt") {
        return;
    }
    let start = || {
        TestRunner::start_with(GVISOR, |c| {
            c.max_concurrent_runs = 4;
            c.max_sessions = 4;
        })
    };
    let (a, b) = tokio::join!(start(), start());
    let id = open(&a).await;
    exec(&a, &id, "echo kept > /workspace/kept.txt", false).await;
    let (file, header) = pause(&a, &id, false).await;
    assert!(header.memory);
    // The checkpoint's directory (a tmpfs of its own where the runner may mount) is gone,
    // mount and all.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = a.work_root.path().to_string_lossy().into_owned();
    let left: Vec<_> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(left.is_empty(), "mounts left after the pause: {left:?}");
    let scratch: Vec<_> = std::fs::read_dir(a.work_root.path().join("tasks"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".snap-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");

    // Where the payload starts: past the file's prefix.
    let mut at = std::io::Cursor::new(&file[..]);
    snapshot::read_header(&mut at).await.unwrap();
    let head = at.position() as usize;
    // In the memory image's bytes; in the first part's tar header (its name); and cut off
    // inside the image.
    let mut in_image = file.clone();
    in_image[head + 512 + 4096] ^= 0x01;
    let mut in_header = file.clone();
    in_header[head + 20] ^= 0x01;
    let cut = file[..head + 512 + 8192].to_vec();
    for (what, bytes) in [
        ("a byte of the image altered", in_image),
        ("a part's header altered", in_header),
        ("cut inside the image", cut),
    ] {
        let err = resume(&b, &bytes).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err}");
        assert_eq!(reason(&err), "snapshot_corrupt", "{what}: {err}");
        assert_nothing_resumed(&b).await;
    }
    // The intact one resumes, with its files.
    let s = resume(&b, &file).await.unwrap();
    assert!(s.memory_restored);
    let out = exec(&b, &s.session_id, "cat /workspace/kept.txt", false).await;
    assert_eq!(text(&out.stdout), "kept\n");
    a.stop().await;
    b.stop().await;
}
