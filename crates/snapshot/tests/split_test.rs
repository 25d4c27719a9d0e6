//! A payload with memory split as it arrives: the checkpoint put together where runsc reads
//! it, the same files as a pass over the whole payload gives, and every other entry kept in a
//! tar of the rest; parts out of order, damaged headers and payloads that end inside an entry
//! refused, in chunks of any size.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use cairn_snapshot::payload::{unpack, write, Checkpoint, Out, Take, IMAGE};
use cairn_snapshot::split::Split;
use cairn_snapshot::Error;

struct Buf(Vec<u8>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Out for Buf {}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(seed) % 251) as u8)
        .collect()
}

/// A payload as a pause writes it: a checkpoint of `image` (and two small files) with a
/// session whose workspace holds a short name, a name too long for a plain tar header, a
/// file named like a checkpoint part, and a link.
fn payload(dir: &Path, image: &[u8]) -> Vec<u8> {
    let task = dir.join("task");
    let long = format!("workspace/{}/deep.txt", "d".repeat(120));
    std::fs::create_dir_all(task.join(Path::new(&long).parent().unwrap())).unwrap();
    std::fs::create_dir_all(task.join("workspace/checkpoint")).unwrap();
    std::fs::create_dir_all(task.join("tmpfs")).unwrap();
    std::fs::write(task.join("workspace/a.txt"), b"a\n").unwrap();
    std::fs::write(task.join(&long), b"deep\n").unwrap();
    std::fs::write(task.join("workspace/checkpoint/checkpoint.img@0"), b"mine").unwrap();
    std::os::unix::fs::symlink("a.txt", task.join("workspace/link")).unwrap();
    let ckpt = dir.join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::write(ckpt.join("checkpoint.img"), image).unwrap();
    std::fs::write(ckpt.join("pages_meta.img"), b"meta").unwrap();
    std::fs::write(ckpt.join("empty.img"), b"").unwrap();
    let finished = || Some(true);
    let c = Checkpoint {
        dir: &ckpt,
        finished: &finished,
    };
    let mut out = Buf(Vec::new());
    write(&task, Some(c), &mut out, || {}).unwrap();
    out.0
}

impl Out for &mut Buf {}

/// Feeds `payload` to a splitter in chunks of `sizes` (cycled); the rest's tar bytes.
fn split(payload: &[u8], dir: &Path, sizes: &[usize]) -> Result<Vec<u8>, Error> {
    std::fs::create_dir(dir).unwrap();
    let mut s = Split::new(dir, Vec::new())?;
    let mut at = 0;
    for n in sizes.iter().cycle() {
        if at == payload.len() {
            break;
        }
        let end = (at + n).min(payload.len());
        s.push(&payload[at..end])?;
        at = end;
    }
    s.finish()
}

fn names(tar_bytes: &[u8]) -> Vec<String> {
    tar::Archive::new(tar_bytes)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    all.sort();
    all
}

#[test]
fn a_split_payload_gives_the_checkpoint_a_whole_pass_gives_and_keeps_every_other_entry() {
    let t = tempfile::tempdir().unwrap();
    // 9 MiB: sent in parts (at least 4 MiB each).
    let image = bytes(9 << 20, 13);
    let whole = payload(t.path(), &image);

    // The pass over the whole payload, as before the split.
    let p = t.path().join("payload.tar");
    std::fs::write(&p, &whole).unwrap();
    let before = t.path().join("before");
    std::fs::create_dir(&before).unwrap();
    unpack(&p, Take::Checkpoint(&before)).unwrap();
    let want = files_of(&before.join("checkpoint"));
    assert_eq!(std::fs::read(before.join(IMAGE)).unwrap(), image);

    let not_parts: Vec<String> = names(&whole)
        .into_iter()
        .filter(|n| !n.starts_with("checkpoint/"))
        .collect();
    assert!(
        not_parts.iter().any(|n| n.contains(&"d".repeat(120))),
        "{not_parts:?}"
    );
    let chunkings: [&[usize]; 6] = [
        &[1 << 20],
        &[1],
        &[511, 513],
        &[512],
        &[7, 4096, 1000, 65536],
        &[usize::MAX],
    ];
    for (i, sizes) in chunkings.iter().enumerate() {
        // Byte by byte is slow on 9 MiB: that chunking takes a smaller image.
        let (whole, want) = if sizes == &[1] {
            let small = t.path().join("small");
            std::fs::create_dir(&small).unwrap();
            let img = bytes(5000, 3);
            let w = payload(&small, &img);
            let p = small.join("payload.tar");
            std::fs::write(&p, &w).unwrap();
            let b = small.join("before");
            std::fs::create_dir(&b).unwrap();
            unpack(&p, Take::Checkpoint(&b)).unwrap();
            (w, files_of(&b.join("checkpoint")))
        } else {
            (whole.clone(), want.clone())
        };
        let dir = t.path().join(format!("split{i}"));
        let rest = split(&whole, &dir, sizes).unwrap();
        assert_eq!(
            files_of(&dir.join("checkpoint")),
            want,
            "chunking {sizes:?}"
        );
        let kept = names(&rest);
        let expected: Vec<String> = names(&whole)
            .into_iter()
            .filter(|n| !n.starts_with("checkpoint/"))
            .collect();
        assert_eq!(kept, expected, "chunking {sizes:?}");
        // What is left passes the whole check and adds nothing to the checkpoint.
        let r = dir.join("rest.tar");
        std::fs::write(&r, &rest).unwrap();
        unpack(&r, Take::Checkpoint(&dir)).unwrap();
        assert_eq!(files_of(&dir.join("checkpoint")), want);
    }
}

/// A payload tar of entries: a path and a file's bytes.
fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, b) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(b.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, path, *b).unwrap();
    }
    tar.into_inner().unwrap()
}

#[test]
fn parts_out_of_order_a_damaged_header_and_a_payload_cut_inside_an_entry_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let out_of_order: [&[(&str, &[u8])]; 4] = [
        &[("checkpoint/checkpoint.img@3", b"abc")],
        &[
            ("checkpoint/checkpoint.img@0", b"abc"),
            ("checkpoint/checkpoint.img@4", b"d"),
        ],
        &[
            ("checkpoint/checkpoint.img@0", b"abc"),
            ("checkpoint/checkpoint.img@2", b"d"),
        ],
        &[
            ("checkpoint/checkpoint.img", b"abc"),
            ("checkpoint/checkpoint.img@0", b"abc"),
        ],
    ];
    for (i, entries) in out_of_order.iter().enumerate() {
        let e = split(&tar_of(entries), &t.path().join(format!("o{i}")), &[100]).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "case {i}: {e}");
    }

    let good = tar_of(&[
        ("checkpoint/checkpoint.img@0", &bytes(2000, 5)),
        ("workspace/a.txt", b"a"),
    ]);
    // A flipped byte in the first header's name.
    let mut damaged = good.clone();
    damaged[3] ^= 1;
    let e = split(&damaged, &t.path().join("d"), &[4096]).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");

    // Cut inside the part's data, inside the next header, inside the rest's data.
    for (i, cut) in [1000usize, 512 + 2048 + 100, 512 + 2048 + 512 + 1]
        .iter()
        .enumerate()
    {
        let e = split(&good[..*cut], &t.path().join(format!("c{i}")), &[300]).unwrap_err();
        assert!(matches!(e, Error::Corrupt(_)), "cut {cut}: {e}");
        assert!(e.to_string().contains("ends inside"), "cut {cut}: {e}");
    }
    // Whole, it splits.
    let rest = split(&good, &t.path().join("ok"), &[300]).unwrap();
    assert_eq!(names(&rest), ["workspace/a.txt"]);
    assert_eq!(
        std::fs::read(t.path().join("ok").join(IMAGE)).unwrap(),
        bytes(2000, 5)
    );
}

#[test]
fn a_link_named_checkpoint_in_a_payload_leads_no_part_outside_the_restore_directory() {
    let t = tempfile::tempdir().unwrap();
    let outside: PathBuf = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    tar.append_link(&mut h, "checkpoint", &outside).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(9);
    h.set_mode(0o644);
    tar.append_data(&mut h, "checkpoint/checkpoint.img@0", &b"not yours"[..])
        .unwrap();
    let payload = tar.into_inner().unwrap();
    let dir = t.path().join("restore");
    let rest = split(&payload, &dir, &[64]).unwrap();
    assert!(!outside.join("checkpoint.img").exists());
    // The link is left for the whole check, which refuses it.
    let r = t.path().join("rest.tar");
    std::fs::write(&r, &rest).unwrap();
    assert!(unpack(&r, Take::Checkpoint(&dir)).is_err());
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
}
