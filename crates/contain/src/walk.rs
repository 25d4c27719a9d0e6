//! [`walk`]: depth-first, in name order, beneath a held directory; links are reported (from
//! lstat), never followed, and entries swapped or removed while the walk looks are skipped.

use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::at::DIR_NOFOLLOW;
use crate::root::regular;

/// How deep [`walk`] descends before it stops (deeper trees are reported as truncated).
pub const MAX_DEPTH: usize = 64;

/// What a walk found at one name (from lstat: links are reported, never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Fifo, socket, device.
    Special,
}

/// One entry met by [`walk`].
pub struct Entry<'a> {
    /// Path relative to the walk's start, '/'-joined raw bytes (may be non-UTF-8).
    pub rel: &'a [u8],
    pub kind: Kind,
    pub stat: &'a Stat,
    parent: BorrowedFd<'a>,
    name: &'a CStr,
}

impl Entry<'_> {
    /// The path as UTF-8, if it is.
    pub fn rel_str(&self) -> Option<&str> {
        std::str::from_utf8(self.rel).ok()
    }

    /// Opens this entry as a regular file, without following a link swapped in since the walk
    /// looked at it.
    pub fn open_file(&self) -> io::Result<(File, Stat)> {
        let fd = rustix::fs::openat(
            self.parent,
            self.name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        regular(fd)
    }
}

/// What the visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    Continue,
    /// Do not descend into this directory.
    SkipDir,
    Stop,
}

/// Walks the directory `dir` depth-first in name order, calling `visit` for every entry
/// (directories before their contents). Returns false when stopped early (by the visitor or
/// the depth cap).
pub fn walk(dir: BorrowedFd<'_>, visit: &mut dyn FnMut(&Entry<'_>) -> Visit) -> io::Result<bool> {
    walk_to(dir, MAX_DEPTH, visit)
}

/// [`walk`] with its own depth cap (one descriptor is held per level).
pub fn walk_to(
    dir: BorrowedFd<'_>,
    max_depth: usize,
    visit: &mut dyn FnMut(&Entry<'_>) -> Visit,
) -> io::Result<bool> {
    let mut prefix = Vec::new();
    walk_dir(dir, &mut prefix, 0, max_depth, visit)
}

fn walk_dir(
    dir: BorrowedFd<'_>,
    prefix: &mut Vec<u8>,
    depth: usize,
    max_depth: usize,
    visit: &mut dyn FnMut(&Entry<'_>) -> Visit,
) -> io::Result<bool> {
    if depth > max_depth {
        return Ok(false);
    }
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push(name.to_owned());
    }
    names.sort();
    for name in names {
        let stat = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Removed while we looked (the tree may still be changing): nothing to report.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Special,
        };
        let mark = prefix.len();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name.to_bytes());
        let step = visit(&Entry {
            rel: prefix,
            kind,
            stat: &stat,
            parent: dir,
            name: &name,
        });
        let keep_going = match step {
            Visit::Stop => false,
            Visit::SkipDir => true,
            Visit::Continue if kind == Kind::Dir => {
                match rustix::fs::openat(dir, name.as_c_str(), DIR_NOFOLLOW, Mode::empty()) {
                    Ok(sub) => walk_dir(sub.as_fd(), prefix, depth + 1, max_depth, visit)?,
                    // Swapped for a link or removed since lstat: skip it.
                    Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => true,
                    Err(e) => return Err(e.into()),
                }
            }
            Visit::Continue => true,
        };
        prefix.truncate(mark);
        if !keep_going {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Lossy display of raw path bytes (for reports).
pub fn lossy(bytes: &[u8]) -> String {
    OsStr::from_bytes(bytes).to_string_lossy().into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Root;
    use std::os::unix::fs::symlink;

    fn seen(root: &Root, max_depth: usize) -> (Vec<(String, Kind)>, bool) {
        let mut seen = Vec::new();
        let complete = walk_to(root.fd(), max_depth, &mut |e| {
            seen.push((lossy(e.rel), e.kind));
            match e.rel {
                b"skip" => Visit::SkipDir,
                _ => Visit::Continue,
            }
        })
        .unwrap();
        (seen, complete)
    }

    #[test]
    fn walks_in_name_order_reports_links_without_following_them_and_caps_depth() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"no").unwrap();
        std::fs::create_dir_all(tmp.path().join("b/c")).unwrap();
        std::fs::create_dir_all(tmp.path().join("skip")).unwrap();
        std::fs::write(tmp.path().join("b/c/f"), b"x").unwrap();
        std::fs::write(tmp.path().join("skip/hidden"), b"x").unwrap();
        std::fs::write(tmp.path().join("a"), b"x").unwrap();
        symlink(outside.path(), tmp.path().join("link")).unwrap();
        let root = Root::open(tmp.path()).unwrap();

        let (all, complete) = seen(&root, MAX_DEPTH);
        let want = [
            ("a", Kind::File),
            ("b", Kind::Dir),
            ("b/c", Kind::Dir),
            ("b/c/f", Kind::File),
            ("link", Kind::Symlink),
            ("skip", Kind::Dir),
        ];
        let want: Vec<(String, Kind)> = want.iter().map(|(p, k)| ((*p).to_owned(), *k)).collect();
        assert_eq!((all, complete), (want, true));

        let (shallow, complete) = seen(&root, 1);
        assert!(!complete);
        assert!(!shallow.iter().any(|(p, _)| p == "b/c/f"));

        // A link met by the walk cannot be opened as the file it points at.
        let mut opened = None;
        walk(root.fd(), &mut |e| {
            if e.rel == b"link" {
                opened = Some(e.open_file().map(|_| ()));
                return Visit::Stop;
            }
            Visit::Continue
        })
        .unwrap();
        assert!(matches!(opened, Some(Err(_))));
    }

    #[test]
    fn entries_give_their_path_as_text_when_it_is_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("dir")).unwrap();
        std::fs::write(tmp.path().join("dir/é.md"), b"x").unwrap();
        std::fs::write(tmp.path().join(OsStr::from_bytes(b"bad\xff")), b"x").unwrap();
        let root = Root::open(tmp.path()).unwrap();
        let mut texts = Vec::new();
        walk(root.fd(), &mut |e| {
            texts.push((lossy(e.rel), e.rel_str().map(str::to_owned)));
            Visit::Continue
        })
        .unwrap();
        assert_eq!(
            texts,
            [
                ("bad\u{fffd}".to_owned(), None),
                ("dir".to_owned(), Some("dir".to_owned())),
                ("dir/é.md".to_owned(), Some("dir/é.md".to_owned())),
            ]
        );
        // The depth cap: a tree exactly as deep as the cap is walked whole.
        let (_, complete) = seen(&root, 1);
        assert!(complete);
        let (_, complete) = seen(&root, 0);
        assert!(!complete);
    }

    #[test]
    fn an_entry_opens_only_as_the_regular_file_it_was_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        symlink(tmp.path().join("f"), tmp.path().join("link")).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, tmp.path().join("pipe"), Mode::from(0o600)).unwrap();
        let root = Root::open(tmp.path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = root.fd().try_clone_to_owned().unwrap();
        // In a thread: opening a fifo that waits for a writer would never return.
        std::thread::spawn(move || {
            let mut opened = Vec::new();
            walk(dir.as_fd(), &mut |e| {
                opened.push((lossy(e.rel), e.open_file()));
                Visit::Continue
            })
            .unwrap();
            tx.send(opened).unwrap();
        });
        let opened = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a fifo waited for a writer");
        let [(f, file), (link, to_file), (pipe, fifo)] = &opened[..] else {
            panic!("{opened:?}");
        };
        assert_eq!(
            (f.as_str(), link.as_str(), pipe.as_str()),
            ("f", "link", "pipe")
        );
        let (file, stat) = file.as_ref().unwrap();
        assert_eq!(stat.st_size, 1);
        let fd_flags = rustix::io::fcntl_getfd(file).unwrap();
        assert!(fd_flags.contains(rustix::io::FdFlags::CLOEXEC));
        // A link to a file is not opened through, even though its target is a regular file.
        let errno = |r: &io::Result<(File, Stat)>| {
            Errno::from_io_error(r.as_ref().map(|_| ()).unwrap_err())
        };
        assert_eq!(errno(to_file), Some(Errno::LOOP));
        assert_eq!(
            fifo.as_ref().map(|_| ()).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn an_entry_that_became_a_directory_after_it_was_reported_is_not_descended_into() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("f"), b"x").unwrap();
        symlink("f", tmp.path().join("link")).unwrap();
        let root = Root::open(tmp.path()).unwrap();
        let mut seen = Vec::new();
        let complete = walk(root.fd(), &mut |e| {
            seen.push((lossy(e.rel), e.kind));
            // Swapped for a directory while the walk looks at it (after its lstat).
            if e.kind != Kind::Dir {
                let path = tmp.path().join(lossy(e.rel));
                std::fs::remove_file(&path).unwrap();
                std::fs::create_dir(&path).unwrap();
                std::fs::write(path.join("inside"), b"x").unwrap();
            }
            Visit::Continue
        })
        .unwrap();
        assert!(complete);
        assert_eq!(
            seen,
            [
                ("f".to_owned(), Kind::File),
                ("link".to_owned(), Kind::Symlink)
            ]
        );
    }
}
