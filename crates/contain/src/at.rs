//! The raw calls: open, create and list beneath a directory fd, returning `Errno`.
//!
//! `openat2` with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS makes the kernel refuse any symlink
//! (ELOOP) or escape (EXDEV) on the way, atomically with the lookup, so a directory swapped for
//! a symlink while a write is in flight cannot redirect it. Where openat2 is missing (ENOSYS, or
//! EPERM from an old seccomp profile) the walk falls back to one
//! `openat(O_NOFOLLOW|O_DIRECTORY)` per component, which gives the same guarantee for
//! pathguard-validated paths (no `..`, no empty or `.` components).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{self, AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

// The two calls whose failures a test cannot cause on purpose (openat2's EAGAIN, which needs a
// rename racing the lookup; a skipped fsync): the kernel's own, except in this crate's unit
// tests, which answer them from `tests::sys`.
#[cfg(not(test))]
use rustix::fs::{fsync, openat2};
#[cfg(test)]
use tests::sys::{fsync, openat2};

/// False once openat2 turned out to be unavailable on this kernel/sandbox.
static OPENAT2_WORKS: AtomicBool = AtomicBool::new(true);

/// A directory reached by name, never through a symlink.
pub(crate) const DIR_NOFOLLOW: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Mode of the directories [`ensure_dir`] creates: the owner and its group only (a runner
/// that shares the store's group may read; other local users get nothing).
pub const DIR_MODE: u32 = 0o750;
/// Mode of files created beneath a root (callers pass it to [`open`] with O_CREAT).
pub const FILE_MODE: u32 = 0o640;

/// Opens `rel` ('/'-separated, validated, non-empty) beneath `dir` without following any
/// symlink, including the last component.
pub fn open(dir: BorrowedFd<'_>, rel: &str, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::CLOEXEC;
    // openat2 refuses (EINVAL) a mode without O_CREAT/O_TMPFILE.
    let mode = if flags.intersects(OFlags::CREATE | OFlags::TMPFILE) {
        Mode::from_raw_mode(mode)
    } else {
        Mode::empty()
    };
    if OPENAT2_WORKS.load(Ordering::Relaxed) {
        let mut tries = 0;
        loop {
            match openat2(dir, rel, flags, mode, RESOLVE) {
                // openat2 may ask for a retry when a rename raced with the lookup.
                Err(Errno::AGAIN) if tries < 8 => tries += 1,
                Err(Errno::NOSYS) | Err(Errno::PERM) => {
                    tracing::warn!("openat2 is unavailable; walking paths one component at a time");
                    OPENAT2_WORKS.store(false, Ordering::Relaxed);
                    break;
                }
                other => return other,
            }
        }
    }
    open_by_components(dir, rel, flags, mode)
}

/// The fallback walk: one `openat(O_NOFOLLOW)` per component (also used by tests directly).
pub fn open_by_components(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let mut parts = rel.split('/').peekable();
    let mut held: Option<OwnedFd> = None;
    while let Some(part) = parts.next() {
        if part.is_empty() || part == "." || part == ".." {
            return Err(Errno::INVAL);
        }
        let at = held.as_ref().map_or(dir, |fd| fd.as_fd());
        let last = parts.peek().is_none();
        let (f, m) = if last {
            (flags | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode)
        } else {
            (DIR_NOFOLLOW, Mode::empty())
        };
        match fs::openat(at, part, f, m) {
            Ok(fd) => held = Some(fd),
            // O_NOFOLLOW|O_DIRECTORY on a symlink may say ENOTDIR: tell the two apart.
            Err(Errno::NOTDIR) if is_symlink(at, part) => return Err(Errno::LOOP),
            Err(e) => return Err(e),
        }
    }
    held.ok_or(Errno::INVAL)
}

fn is_symlink(dir: BorrowedFd<'_>, name: &str) -> bool {
    matches!(stat(dir, name), Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
}

/// A new handle on `dir` itself.
pub fn dup_dir(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens the directory `rel` beneath `dir` ("" = `dir` itself).
pub fn open_dir(dir: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, Errno> {
    if rel.is_empty() {
        return dup_dir(dir);
    }
    open(dir, rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)
}

/// Opens the directory `rel` beneath `dir`, creating missing components one at a time with
/// mkdirat (never following a symlink, whoever created it; each new entry fsync'd).
pub fn ensure_dir(dir: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, Errno> {
    match open_dir(dir, rel) {
        Err(Errno::NOENT) => {}
        other => return other,
    }
    let mut held = dup_dir(dir)?;
    for part in rel.split('/') {
        let next = match open_dir(held.as_fd(), part) {
            Err(Errno::NOENT) => {
                match fs::mkdirat(held.as_fd(), part, Mode::from_raw_mode(DIR_MODE)) {
                    // A new directory's entry must be durable before files published in it;
                    // when another writer made it a moment ago, its fsync may not have come
                    // yet, so this one does not wait for it.
                    Ok(()) | Err(Errno::EXIST) => fsync(held.as_fd())?,
                    Err(e) => return Err(e),
                }
                open_dir(held.as_fd(), part)?
            }
            other => other?,
        };
        held = next;
    }
    Ok(held)
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)` of one name in `dir`.
pub fn stat(dir: BorrowedFd<'_>, name: &str) -> Result<Stat, Errno> {
    fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

/// Kind of a stat result.
pub fn kind(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// Names in a directory (without `.`/`..`; names that are not UTF-8 are skipped because no
/// cairn path can address them), with their type when the filesystem reports it.
pub fn read_dir(dir: BorrowedFd<'_>) -> Result<Vec<(String, FileType)>, Errno> {
    let mut out = Vec::new();
    for entry in fs::Dir::read_from(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        out.push((name.to_owned(), entry.file_type()));
    }
    Ok(out)
}

/// fsync of a directory, so a rename or unlink in it is durable.
pub fn sync_dir(dir: BorrowedFd<'_>) -> Result<(), Errno> {
    fsync(dir)
}

/// Splits a validated path into its parent ("" for top-level names) and its last component.
pub fn split_parent(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some((parent, name)) => (parent, name),
        None => ("", path),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// The kernel's openat2 and fsync as `open`, `ensure_dir` and `sync_dir` see them in unit
    /// tests (this thread's calls only): openat2 answers EAGAIN as many times as a test asks
    /// before the real call, and fsync records which directory it synced.
    pub(super) mod sys {
        use std::cell::{Cell, RefCell};
        use std::os::fd::{BorrowedFd, OwnedFd};

        use rustix::fs::{Mode, OFlags, ResolveFlags};
        use rustix::io::Errno;

        thread_local! {
            static EAGAINS: Cell<u32> = const { Cell::new(0) };
            static OPENAT2_CALLS: Cell<u32> = const { Cell::new(0) };
            static SYNCED: RefCell<Vec<(u64, u64)>> = const { RefCell::new(Vec::new()) };
        }

        pub fn openat2(
            dir: BorrowedFd<'_>,
            path: &str,
            flags: OFlags,
            mode: Mode,
            resolve: ResolveFlags,
        ) -> Result<OwnedFd, Errno> {
            OPENAT2_CALLS.set(OPENAT2_CALLS.get() + 1);
            let left = EAGAINS.get();
            if left > 0 {
                EAGAINS.set(left - 1);
                return Err(Errno::AGAIN);
            }
            rustix::fs::openat2(dir, path, flags, mode, resolve)
        }

        pub fn fsync(fd: BorrowedFd<'_>) -> Result<(), Errno> {
            let st = rustix::fs::fstat(fd)?;
            SYNCED.with_borrow_mut(|s| s.push((st.st_dev, st.st_ino)));
            rustix::fs::fsync(fd)
        }

        /// The next `n` openat2 calls answer EAGAIN; the count of calls starts again at 0.
        pub fn eagain_next(n: u32) {
            EAGAINS.set(n);
            OPENAT2_CALLS.set(0);
        }

        pub fn openat2_calls() -> u32 {
            OPENAT2_CALLS.get()
        }

        /// The directories (device, inode) fsync'd since the last call, in order.
        pub fn take_synced() -> Vec<(u64, u64)> {
            SYNCED.take()
        }
    }

    fn root(dir: &std::path::Path) -> OwnedFd {
        fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn both_walks_refuse_symlinks_anywhere_on_the_way() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        std::fs::write(tmp.path().join("a/b/f"), b"x").unwrap();
        symlink(outside.path(), tmp.path().join("a/link")).unwrap();
        symlink(tmp.path().join("a/b/f"), tmp.path().join("a/b/flink")).unwrap();
        let fd = root(tmp.path());
        for walk in [
            |d: BorrowedFd<'_>, p: &str, f: OFlags| open(d, p, f, 0),
            |d: BorrowedFd<'_>, p: &str, f: OFlags| {
                open_by_components(d, p, f | OFlags::CLOEXEC, Mode::empty())
            },
        ] {
            assert!(walk(fd.as_fd(), "a/b/f", OFlags::RDONLY).is_ok());
            assert_eq!(
                walk(fd.as_fd(), "a/link/x", OFlags::RDONLY).unwrap_err(),
                Errno::LOOP
            );
            assert_eq!(
                walk(fd.as_fd(), "a/link", OFlags::RDONLY | OFlags::DIRECTORY).unwrap_err(),
                Errno::LOOP
            );
            assert_eq!(
                walk(fd.as_fd(), "a/b/flink", OFlags::RDONLY).unwrap_err(),
                Errno::LOOP
            );
            assert_eq!(
                walk(fd.as_fd(), "a/b/f/g", OFlags::RDONLY).unwrap_err(),
                Errno::NOTDIR
            );
            assert_eq!(
                walk(fd.as_fd(), "a/missing", OFlags::RDONLY).unwrap_err(),
                Errno::NOENT
            );
        }
        assert_eq!(
            open_by_components(fd.as_fd(), "a/../x", OFlags::RDONLY, Mode::empty()).unwrap_err(),
            Errno::INVAL
        );
    }

    #[test]
    fn ensure_dir_creates_components_and_stops_at_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let fd = root(tmp.path());
        ensure_dir(fd.as_fd(), "x/y/z").unwrap();
        assert!(tmp.path().join("x/y/z").is_dir());
        symlink(outside.path(), tmp.path().join("x/s")).unwrap();
        assert_eq!(ensure_dir(fd.as_fd(), "x/s/new").unwrap_err(), Errno::LOOP);
        assert!(!outside.path().join("new").exists());
    }

    #[test]
    fn every_descriptor_opened_is_close_on_exec() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d/e")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
        let fd = root(tmp.path());
        let cloexec = |fd: &OwnedFd| {
            rustix::io::fcntl_getfd(fd)
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
        };
        // Callers' flags with or without O_CLOEXEC: the descriptor has it either way.
        let with = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let opened = [
            open(fd.as_fd(), "d/f", OFlags::RDONLY, 0).unwrap(),
            open(fd.as_fd(), "d/f", with, 0).unwrap(),
            open_by_components(fd.as_fd(), "d/f", OFlags::RDONLY, Mode::empty()).unwrap(),
            open_by_components(fd.as_fd(), "d/f", with, Mode::empty()).unwrap(),
            open_by_components(fd.as_fd(), "d/e", OFlags::RDONLY, Mode::empty()).unwrap(),
            dup_dir(fd.as_fd()).unwrap(),
            open_dir(fd.as_fd(), "").unwrap(),
            open_dir(fd.as_fd(), "d/e").unwrap(),
            ensure_dir(fd.as_fd(), "d/new").unwrap(),
        ];
        for (i, fd) in opened.iter().enumerate() {
            assert!(cloexec(fd), "descriptor {i} would reach an exec'd program");
        }
        // A created file gets the mode asked for.
        use std::os::unix::fs::PermissionsExt;
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL;
        drop(open(fd.as_fd(), "d/new.txt", flags, FILE_MODE).unwrap());
        let mode = std::fs::metadata(tmp.path().join("d/new.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, FILE_MODE);
    }

    #[test]
    fn listing_stat_and_split_report_what_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("f"), b"abc").unwrap();
        symlink("f", tmp.path().join("l")).unwrap();
        let fd = root(tmp.path());
        let mut names = read_dir(fd.as_fd()).unwrap();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            names,
            [
                ("d".to_owned(), FileType::Directory),
                ("f".to_owned(), FileType::RegularFile),
                ("l".to_owned(), FileType::Symlink),
            ]
        );
        let st = stat(fd.as_fd(), "f").unwrap();
        assert_eq!((kind(&st), st.st_size), (FileType::RegularFile, 3));
        assert_eq!(kind(&stat(fd.as_fd(), "l").unwrap()), FileType::Symlink);
        assert_eq!(kind(&stat(fd.as_fd(), "d").unwrap()), FileType::Directory);
        assert_eq!(stat(fd.as_fd(), "none").unwrap_err(), Errno::NOENT);
        assert_eq!(open_dir(fd.as_fd(), "f").unwrap_err(), Errno::NOTDIR);
        assert_eq!(split_parent("a/b/c.md"), ("a/b", "c.md"));
        assert_eq!(split_parent("c.md"), ("", "c.md"));
    }

    #[test]
    fn the_component_walk_refuses_empty_and_dot_parts_and_a_last_link_with_any_flags() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a")).unwrap();
        std::fs::write(tmp.path().join("a/f"), b"x").unwrap();
        symlink("f", tmp.path().join("a/l")).unwrap();
        let fd = root(tmp.path());
        let walk = |p: &str, f: OFlags| open_by_components(fd.as_fd(), p, f, Mode::empty());
        for bad in ["a//f", "./a/f", "a/./f", "a/", ""] {
            assert_eq!(
                walk(bad, OFlags::RDONLY).unwrap_err(),
                Errno::INVAL,
                "{bad:?}"
            );
        }
        // The caller's own O_NOFOLLOW is kept, not toggled off.
        let nofollow = OFlags::RDONLY | OFlags::NOFOLLOW;
        assert_eq!(walk("a/l", nofollow).unwrap_err(), Errno::LOOP);
        assert!(walk("a/f", nofollow).is_ok());
    }

    #[test]
    fn open_asks_openat2_again_after_eagain_eight_times_at_most() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"x").unwrap();
        let fd = root(tmp.path());
        // Were openat2 found missing by another test of this process, ask it again (a kernel
        // without it says so again at once, and the component walk answers).
        OPENAT2_WORKS.store(true, Ordering::Relaxed);
        for racing in [1, 8] {
            sys::eagain_next(racing);
            assert!(
                open(fd.as_fd(), "d/f", OFlags::RDONLY, 0).is_ok(),
                "{racing}"
            );
            assert_eq!(sys::openat2_calls(), racing + 1, "{racing}");
        }
        // A ninth EAGAIN in a row is the caller's answer: the lookup keeps racing.
        sys::eagain_next(9);
        assert_eq!(
            open(fd.as_fd(), "d/f", OFlags::RDONLY, 0).unwrap_err(),
            Errno::AGAIN
        );
        assert_eq!(sys::openat2_calls(), 9);
        sys::eagain_next(0);
    }

    #[test]
    fn directories_are_fsynced_by_sync_dir_and_for_each_entry_ensure_dir_makes() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("old")).unwrap();
        let fd = root(tmp.path());
        let id = |rel: &str| {
            let st = std::fs::metadata(tmp.path().join(rel)).unwrap();
            use std::os::unix::fs::MetadataExt;
            (st.dev(), st.ino())
        };
        sys::take_synced();
        sync_dir(fd.as_fd()).unwrap();
        assert_eq!(sys::take_synced(), [id(".")]);
        // New entries: each one's parent, once; an existing directory: nothing to make durable.
        drop(ensure_dir(fd.as_fd(), "old/a/b").unwrap());
        assert_eq!(sys::take_synced(), [id("old"), id("old/a")]);
        drop(ensure_dir(fd.as_fd(), "old/a").unwrap());
        assert!(sys::take_synced().is_empty());
    }
}
