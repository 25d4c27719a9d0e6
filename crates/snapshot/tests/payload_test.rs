//! A snapshot's payload as the runner unpacks it: the memory image copied out whole beside
//! the checkpoint's other entries, and an image behind a link, or twice, refused.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use cairn_snapshot::payload::{unpack, write, Checkpoint, Take, IMAGE};
use cairn_snapshot::Error;

/// A payload tar of `entries`: (path, Some(bytes)) a file, (path, None) a directory;
/// `link` adds `checkpoint` as a symlink to that target first.
fn payload(dir: &Path, link: Option<&Path>, entries: &[(&str, Option<&[u8]>)]) -> PathBuf {
    let out = dir.join("payload.tar");
    let mut tar = tar::Builder::new(std::fs::File::create(&out).unwrap());
    if let Some(target) = link {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        tar.append_link(&mut h, "checkpoint", target).unwrap();
    }
    for (path, bytes) in entries {
        let mut h = tar::Header::new_gnu();
        match bytes {
            Some(b) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(b.len() as u64);
                h.set_mode(0o644);
                tar.append_data(&mut h, path, *b).unwrap();
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_mode(0o755);
                tar.append_data(&mut h, path, std::io::empty()).unwrap();
            }
        }
    }
    tar.finish().unwrap();
    out
}

#[test]
fn the_memory_image_is_copied_out_whole_beside_the_other_entries() {
    let t = tempfile::tempdir().unwrap();
    let image: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let p = payload(
        t.path(),
        None,
        &[
            ("workspace/", None),
            ("workspace/a.txt", Some(b"a\n")),
            ("checkpoint/", None),
            ("checkpoint/checkpoint.img", Some(&image)),
            ("checkpoint/meta", Some(b"m")),
        ],
    );
    let dir = t.path().join("restore");
    std::fs::create_dir(&dir).unwrap();
    unpack(&p, Take::Checkpoint(&dir)).unwrap();
    assert_eq!(std::fs::read(dir.join(IMAGE)).unwrap(), image);
    assert_eq!(std::fs::read(dir.join("checkpoint/meta")).unwrap(), b"m");
    assert!(!dir.join("workspace").exists(), "files are another pass's");
}

#[test]
fn a_memory_image_behind_a_link_or_twice_is_refused_and_lands_nowhere() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let p = payload(
        t.path(),
        Some(&outside),
        &[("checkpoint/checkpoint.img", Some(b"not yours"))],
    );
    let dir = t.path().join("restore");
    std::fs::create_dir(&dir).unwrap();
    assert!(unpack(&p, Take::Checkpoint(&dir)).is_err());
    assert!(!outside.join("checkpoint.img").exists());

    let p = payload(
        t.path(),
        None,
        &[
            ("checkpoint/checkpoint.img", Some(b"one")),
            ("checkpoint/checkpoint.img", Some(b"two")),
        ],
    );
    let dir = t.path().join("restore2");
    std::fs::create_dir(&dir).unwrap();
    let e = unpack(&p, Take::Checkpoint(&dir)).unwrap_err();
    assert!(matches!(e, Error::Corrupt(_)), "{e}");
    assert_eq!(std::fs::read(dir.join(IMAGE)).unwrap(), b"one");
}

/// Bytes written so far, readable while `write` still runs.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl cairn_snapshot::payload::Out for Shared {}

fn entry_names(tar_bytes: &[u8]) -> Vec<String> {
    let mut a = tar::Archive::new(tar_bytes);
    a.entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// A task directory with a file in its workspace and an empty tmpfs.
fn task(dir: &Path) -> PathBuf {
    let task = dir.join("task");
    std::fs::create_dir_all(task.join("workspace")).unwrap();
    std::fs::create_dir_all(task.join("tmpfs")).unwrap();
    std::fs::write(task.join("workspace/a.txt"), b"a\n").unwrap();
    task
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(seed) % 251) as u8)
        .collect()
}

#[test]
fn a_checkpoint_is_sent_while_runsc_writes_it_and_put_together_on_resume() {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicU8, Ordering};
    let t = tempfile::tempdir().unwrap();
    let task = task(t.path());
    let ckpt = t.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    let state = std::sync::Arc::new(AtomicU8::new(0));
    let out = Shared::default();
    let files_seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (task, ckpt, state, out, files_seen) = (
            task.clone(),
            ckpt.clone(),
            state.clone(),
            out.clone(),
            files_seen.clone(),
        );
        std::thread::spawn(move || {
            let finished = || match state.load(Ordering::Acquire) {
                0 => None,
                1 => Some(true),
                _ => Some(false),
            };
            let c = Checkpoint {
                dir: &ckpt,
                finished: &finished,
            };
            write(&task, Some(c), out, || {
                files_seen.store(true, Ordering::SeqCst)
            })
        })
    };
    // runsc appends: 5 MiB first; a part of them (at least 4 MiB, as much as was there when
    // the writer looked) goes out before the checkpoint is finished.
    // 7 MiB: what is left after the first part (at most 3 MiB) is under a part's least
    // size, so it can only go after the files, once the checkpoint is finished.
    let image = bytes(7 << 20, 7);
    let mut f = std::fs::File::create(ckpt.join("checkpoint.img")).unwrap();
    f.write_all(&image[..5 << 20]).unwrap();
    let t0 = std::time::Instant::now();
    while out.0.lock().unwrap().len() < 4 << 20 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "nothing sent while runsc wrote"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        !files_seen.load(Ordering::SeqCst),
        "the session's files went in before the checkpoint finished"
    );
    f.write_all(&image[5 << 20..]).unwrap();
    std::fs::write(ckpt.join("pages_meta.img"), b"meta").unwrap();
    std::fs::write(ckpt.join("empty.img"), b"").unwrap();
    state.store(1, Ordering::Release);
    let (sha, size) = writer.join().unwrap().unwrap();
    let payload = out.0.lock().unwrap().clone();
    assert_eq!(size, payload.len() as u64);
    assert_eq!(
        sha,
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&payload))
    );
    let names = entry_names(&payload);
    assert_eq!(names[0], "checkpoint/checkpoint.img@0", "{names:?}");
    let ws = names
        .iter()
        .position(|n| n.starts_with("workspace"))
        .unwrap();
    let rest = names
        .iter()
        .rposition(|n| n.starts_with("checkpoint/checkpoint.img@") && !n.ends_with("@0"));
    assert!(
        rest.is_some_and(|r| r > ws),
        "the image's rest after the files: {names:?}"
    );
    assert!(
        names.contains(&"checkpoint/pages_meta.img@0".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"checkpoint/empty.img@0".to_owned()),
        "{names:?}"
    );

    let p = t.path().join("payload.tar");
    std::fs::write(&p, &payload).unwrap();
    let dir = t.path().join("restore");
    std::fs::create_dir(&dir).unwrap();
    unpack(&p, Take::Checkpoint(&dir)).unwrap();
    assert!(
        std::fs::read(dir.join(IMAGE)).unwrap() == image,
        "the image put together differs"
    );
    assert_eq!(
        std::fs::read(dir.join("checkpoint/pages_meta.img")).unwrap(),
        b"meta"
    );
    assert_eq!(
        std::fs::read(dir.join("checkpoint/empty.img")).unwrap(),
        b""
    );
    assert!(!dir.join("workspace").exists());
}

#[test]
fn a_checkpoint_that_fails_ends_the_payload_with_an_error() {
    let t = tempfile::tempdir().unwrap();
    let task = task(t.path());
    let ckpt = t.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::write(ckpt.join("checkpoint.img"), bytes(1000, 3)).unwrap();
    let seen = std::cell::Cell::new(false);
    let finished = || Some(false);
    let c = Checkpoint {
        dir: &ckpt,
        finished: &finished,
    };
    let e = write(&task, Some(c), Shared::default(), || seen.set(true)).unwrap_err();
    assert!(e.to_string().contains("checkpoint"), "{e}");
    assert!(!seen.get(), "files went in after a failed checkpoint");
}

/// A payload entry: a path and a file's bytes, or None for a directory.
type Entry<'a> = (&'a str, Option<&'a [u8]>);

#[test]
fn parts_that_do_not_follow_each_other_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let cases: [&[Entry<'_>]; 4] = [
        // A part that does not start at 0.
        &[("checkpoint/checkpoint.img@3", Some(b"abc"))],
        // A gap.
        &[
            ("checkpoint/checkpoint.img@0", Some(b"abc")),
            ("checkpoint/checkpoint.img@4", Some(b"d")),
        ],
        // An overlap.
        &[
            ("checkpoint/checkpoint.img@0", Some(b"abc")),
            ("checkpoint/checkpoint.img@2", Some(b"d")),
        ],
        // A file sent whole, then again in parts.
        &[
            ("checkpoint/checkpoint.img", Some(b"abc")),
            ("checkpoint/checkpoint.img@0", Some(b"abc")),
        ],
    ];
    for (i, entries) in cases.iter().enumerate() {
        let case = t.path().join(format!("case{i}"));
        std::fs::create_dir(&case).unwrap();
        let p = payload(&case, None, entries);
        let dir = case.join("restore");
        std::fs::create_dir(&dir).unwrap();
        let e = unpack(&p, Take::Checkpoint(&dir)).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "case {i}: {e}");
    }
    // In order, they make the file.
    let p = payload(
        t.path(),
        None,
        &[
            ("checkpoint/pages.img@0", Some(b"ab")),
            ("checkpoint/checkpoint.img@0", Some(b"x")),
            ("checkpoint/pages.img@2", Some(b"cd")),
        ],
    );
    let dir = t.path().join("restore-ok");
    std::fs::create_dir(&dir).unwrap();
    unpack(&p, Take::Checkpoint(&dir)).unwrap();
    assert_eq!(
        std::fs::read(dir.join("checkpoint/pages.img")).unwrap(),
        b"abcd"
    );
    assert_eq!(std::fs::read(dir.join(IMAGE)).unwrap(), b"x");
}
