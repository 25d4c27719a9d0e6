//! A snapshot's payload as the runner unpacks it: the memory image copied out whole beside
//! the checkpoint's other entries, and an image behind a link, or twice, refused.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use cairn_sandbox_runner::snapshot::{unpack, Take, IMAGE};
use cairn_sandbox_runner::Error;

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
    assert!(matches!(e, Error::SnapshotCorrupt(_)), "{e}");
    assert_eq!(std::fs::read(dir.join(IMAGE)).unwrap(), b"one");
}
